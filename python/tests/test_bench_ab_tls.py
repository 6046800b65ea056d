"""bench/ab.py --tls: the target requires TLS with the run's PSK for one host NQN and nvmf-perf
offers that key as that host (fake binaries record their command lines); without it, neither does.
bench/ab.py --host spdk_nvme_perf: SPDK's host polling on the host core, its text report read.
bench/ab.py --a spdk: SPDK's target as a side, where it can run (tests/spdk/test_spdk_ab.py runs it)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import pytest
import stat
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _ab():
    spec = importlib.util.spec_from_file_location("bench_ab", BENCH / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    return ab


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_ab_with_tls_gives_target_and_host_the_same_key(tmp_path):
    ab = _ab()
    target_log, perf_log = tmp_path / "target.argv", tmp_path / "perf.argv"
    target = _script(tmp_path / "target", f'echo "$@" > {target_log}; echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    report = json.dumps({"jobs": [{"write": {"iops": 1000.0, "bw_bytes": 4096000.0}}]})
    perf = _script(tmp_path / "perf", f"echo \"$@\" > {perf_log}; echo '{report}'")
    work = ab.parse_work("4k-randwrite-qd32-poll")
    key = "NVMeTLSkey-1:01:qivkDoZCwHs3NyQ2JvdGvvyAUvFPISBIMcGlMTMfdI7vmDN2:"
    with ab.Target(target, 0, "poll", key) as t:
        run = ab.measure(perf, t, work, 1, 1, 0)
    assert run["iops"] == 1000.0
    assert f"--tls required --tls-key {ab.TLS_HOSTNQN}={key}" in target_log.read_text()
    assert f"--tls-key {key} -q {ab.TLS_HOSTNQN}" in perf_log.read_text()
    with ab.Target(target, 0, "poll") as t:
        ab.measure(perf, t, work, 1, 1, 0)
    assert "--tls" not in target_log.read_text() and "--tls" not in perf_log.read_text()


def test_ab_with_spdks_host_runs_spdk_nvme_perf_polling_and_reads_its_text_report(tmp_path, capsys):
    ab = _ab()
    perf_log = tmp_path / "perf.argv"
    target = _script(tmp_path / "target", 'echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    report = Path(__file__).parent / "data" / "spdk_nvme_perf_randread_2cores.txt"
    perf = _script(tmp_path / "spdk_nvme_perf", f'echo "$@" > {perf_log}; cat {report}')
    work = ab.parse_work("4k-randread-qd32-event")
    with ab.Target(target, 0, "event") as t:
        run = ab.measure(perf, t, work, 1, 2, 1, host="spdk_nvme_perf")
    assert run["iops"] == 40385.82  # the report's Total row
    argv = perf_log.read_text()
    assert "--no-huge -s 1024 -r trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:" + ab.NQN in argv
    assert "-c 0x2 -q 32 -o 4096 -w randread -t 2 -LL -a 1" in argv
    with ab.Target(target, 0, "poll") as t:
        missing = ab.measure(str(tmp_path / "absent"), t, work, 1, 2, 1, host="spdk_nvme_perf")
    assert missing["error"].startswith("spdk_nvme_perf did not start:")


def test_ab_bound_under_spdks_host_gives_its_tls_runs_the_psk_and_the_socket_buffer_shim(tmp_path, monkeypatch):
    ab = _ab()
    target = _script(tmp_path / "target", 'echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    report = Path(__file__).parent / "data" / "spdk_nvme_perf_randread_2cores.txt"
    # Each run logs its arguments, the PSK file's contents and the shim's environment.
    perf = _script(tmp_path / "spdk_nvme_perf",
                   f'log={tmp_path}/perf.log; echo "ARGS $*" >> $log; '
                   'prev=; for a; do [ "$prev" = --psk-path ] && echo "PSK $(cat "$a")" >> $log; prev=$a; done; '
                   f'echo "ENV ${{LD_PRELOAD:-none}} ${{NVMFLAB_SOCKBUF_MIN:-none}}" >> $log; cat {report}')
    monkeypatch.setattr(ab.cipher, "measure_round", lambda core, r: _cipher_records(r, 4096e6, 8192e6))
    monkeypatch.setattr(ab.tempfile, "tempdir", str(tmp_path))  # where the PSK file and the shim go
    out = tmp_path / "ab.json"
    assert ab.main(["--a", target, "--perf", perf, "--host", "spdk_nvme_perf", "--bound", "--no-probe", "--rounds", "1",
                    "--seconds", "1", "--ramp", "0", "--works", "4k-randread-qd32-poll", "--out", str(out)]) == 0
    lines = (tmp_path / "perf.log").read_text().splitlines()
    plain, tls = lines[:2], lines[2:]  # round 1 runs A (plain: no PSK line), then B
    assert "-S ssl" not in plain[0] and "hostnqn:" not in plain[0] and plain[1] == "ENV none none"
    assert f"hostnqn:{ab.TLS_HOSTNQN} -c 0x2" in tls[0] and "-S ssl --psk-path " in tls[0]
    assert len(tls) == 3 and tls[1].startswith("PSK NVMeTLSkey-1:01:"), "the file holds the target's key"
    library, floor = tls[2].split()[1:]
    assert library.endswith(ab.spdk_sockbuf.LIBRARY) and floor == str(ab.spdk_sockbuf.FLOOR_BYTES)
    runs = {r["side"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["B"]["host_sockbuf"] == ab.spdk_sockbuf.FLOOR_BYTES and "host_sockbuf" not in runs["A"]
    assert library.startswith(str(tmp_path)) and not list(tmp_path.glob("nvmflab-ab*")), "nothing is left behind"


def _cipher_records(round_index: int, enc: float, dec: float) -> list[dict]:
    return [{"round": round_index, "core": 0, "size": 4096, "op": op, "impl": "nvmf-tls", "rate_bps": rate}
            for op, rate in (("encrypt", enc), ("decrypt", dec))]


def test_bound_sets_each_rounds_tls_run_against_its_plain_run_and_cipher_rate():
    ab = _ab()
    work = ab.parse_work("4k-randwrite-qd32-event")
    # 1 us to seal 4 KiB, 0.5 us to open it: at QD32 the slower direction bounds, 1 us per I/O.
    records = _cipher_records(0, 4096e6, 8192e6) + _cipher_records(1, 4096e6, 8192e6)
    runs = [{"side": "A", "work": work["key"], "round": 0, "iops": 500e3},  # 2 us: limit 1 / 3 us
            {"side": "B", "work": work["key"], "round": 0, "iops": 300e3},
            {"side": "A", "work": work["key"], "round": 1, "iops": 400e3},  # 2.5 us: limit 1 / 3.5 us
            {"side": "B", "work": work["key"], "round": 1, "iops": 270e3},
            {"side": "B", "work": work["key"], "round": 2, "iops": 900e3}]  # no plain run, no cipher: left out
    b = ab.bound_of(runs, records, work)
    per_round = [300e3 * 3e-6, 270e3 * 3.5e-6]
    mean, low, high, rounds = b["per_round"]
    assert rounds == 2 and mean == pytest.approx((per_round[0] * per_round[1]) ** 0.5)
    assert low < mean < high
    assert b["limit_iops"] == pytest.approx(1 / (1 / 450e3 + 1e-6))  # the medians' plain IOPS
    assert b["median"] == pytest.approx(300e3 / b["limit_iops"])
    # At QD1 the sealing and the opening side take turns: both directions count.
    qd1 = ab.parse_work("4k-randread-qd1-event")
    one = [dict(r, work=qd1["key"]) for r in runs[:2]]
    assert ab.bound_of(one, records, qd1)["limit_iops"] == pytest.approx(1 / (2e-6 + 1.5e-6))
    assert ab.bound_of(one, records, qd1)["per_round"] is None  # one round: no interval
    assert ab.bound_of(runs, [], work) == {"limit_iops": None, "median": None, "per_round": None}


def test_bound_prints_the_limit_of_openssls_evp_alone_beside_the_faster_cipher(capsys):
    ab = _ab()
    work = ab.parse_work("4k-randwrite-qd32-event")
    # ring seals 4 KiB in 1 us, OpenSSL's EVP in 2 us: issue 40's bound (EVP alone) is the looser
    evp = [dict(r, impl="openssl-evp", rate_bps=r["rate_bps"] / 2) for r in _cipher_records(0, 4096e6, 8192e6)]
    records = _cipher_records(0, 4096e6, 8192e6) + evp
    runs = [{"side": "A", "work": work["key"], "round": r, "iops": 500e3} for r in range(2)]
    runs += [{"side": "B", "work": work["key"], "round": r, "iops": 300e3} for r in range(2)]
    fastest = ab.bound_of(runs, records, work)
    alone = ab.bound_of(runs, records, work, ab.bound.OPENSSL_ONLY)
    assert fastest["limit_iops"] == pytest.approx(1 / 3e-6) and alone["limit_iops"] == pytest.approx(1 / 4e-6)
    assert alone["median"] == pytest.approx(300e3 * 4e-6) and fastest["median"] == pytest.approx(300e3 * 3e-6)
    assert ab.bound_of(runs, [r for r in records if r["impl"] == "nvmf-tls"], work, ab.bound.OPENSSL_ONLY)[
        "limit_iops"] is None  # no EVP rate measured: no EVP limit, never ring's in its place
    ab.print_bound([work], runs, records)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(work["key"]))
    assert line.split()[1:4] == ["333.3", "K", "0.900"] and "250.0 K" in line, line


def test_ab_bound_runs_plain_against_tls_and_measures_the_cipher_each_round(tmp_path, monkeypatch, capsys):
    ab = _ab()
    target_log = tmp_path / "target.argv"
    target = _script(tmp_path / "target", f'echo "$@" >> {target_log}; echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    report = json.dumps({"jobs": [{"write": {"iops": 1000.0, "bw_bytes": 4096000.0}}]})
    perf = _script(tmp_path / "perf", f"echo '{report}'")
    measured = []
    monkeypatch.setattr(ab.cipher, "measure_round",
                        lambda core, r: measured.append((core, r)) or _cipher_records(r, 4096e6, 8192e6))
    out = tmp_path / "ab.json"
    assert ab.main(["--a", target, "--perf", perf, "--bound", "--no-probe", "--rounds", "2", "--seconds", "1",
                    "--ramp", "0", "--works", "4k-randwrite-qd32-event", "--out", str(out)]) == 0
    assert measured == [(0, 0), (0, 1)]
    starts = target_log.read_text().splitlines()
    assert len(starts) == 4 and sum("--tls required" in s for s in starts) == 2  # B alone, once a round
    printed = capsys.readouterr().out
    assert "TLS / limit" in printed and "4k-randwrite-qd32-event" in printed.split("TLS / limit")[1]
    saved = json.loads(out.read_text())
    assert len(saved["cipher"]) == 4 and {r["side"] for r in saved["runs"]} == {"A", "B"}
    for bad in (["--bound", "--tls"], [], ["--bound", "--works", "4k-read-qd1"],
                ["--b", target, "--perf", perf, "--fifo", "--host", "spdk_nvme_perf", "--works", "4k-randread-qd1-poll"]):
        with pytest.raises(SystemExit):
            ab.main(["--a", target, *bad])
    assert "spdk_nvme_perf does not finish" in capsys.readouterr().err


def test_ab_serves_the_namespace_asked_for_and_refuses_others(tmp_path, capsys):
    ab = _ab()
    target_log = tmp_path / "target.argv"
    target = _script(tmp_path / "target", f'echo "$@" > {target_log}; echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    with ab.Target(target, 0, "event"):
        pass
    assert "--ns null:1GiB " in target_log.read_text()
    with ab.Target(target, 0, "event", ns=ab.parse_ns("ram:512MiB")):
        pass
    assert "--ns ram:512MiB " in target_log.read_text()
    for bad in ("file:/tmp/x", "ram:", "ram:big", "null"):
        with pytest.raises(SystemExit):
            ab.main(["--a", target, "--b", target, "--ns", bad])
        assert "expected null:SIZE or ram:SIZE" in capsys.readouterr().err


def test_ab_refuses_spdk_sides_where_spdks_target_cannot_run(tmp_path, monkeypatch, capsys):
    ab = _ab()
    monkeypatch.setattr(ab.bench_stacks, "spdk_missing", lambda: None)
    target = _script(tmp_path / "target", 'echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    cases = {"SPDK's target always polls": ["--works", "4k-randread-qd1-event"],
             "not with --fifo": ["--fifo", "--works", "4k-randread-qd1-poll"],
             "null namespace only": ["--ns", "ram:512MiB", "--works", "4k-randread-qd1-poll"]}
    for side in ("--a", "--b"):
        other = "--b" if side == "--a" else "--a"
        for why, more in cases.items():
            with pytest.raises(SystemExit):
                ab.main([side, "spdk-spec", other, target, *more])
            assert why in capsys.readouterr().err
    monkeypatch.setattr(ab.bench_stacks, "spdk_missing", lambda: "no SPDK build found; make spdk")
    with pytest.raises(SystemExit):
        ab.main(["--a", "spdk", "--b", target, "--works", "4k-randread-qd1-poll"])
    assert "no SPDK build found" in capsys.readouterr().err


class _FakeRunning:
    port = 4421

    def __init__(self, proc):
        self.proc = proc

    def cpu_seconds(self):
        return (1.5, 2.5)


def test_ab_spdk_side_is_the_benchs_spdk_target_on_the_target_core(tmp_path, monkeypatch):
    ab = _ab()
    started, perf_log = [], tmp_path / "perf.argv"

    @contextlib.contextmanager
    def fake_target(bench, label, cores, mode):
        started.append((label, cores, mode))
        yield _FakeRunning(proc=None)
        started.append("stopped")

    monkeypatch.setattr(ab.bench_stacks.Bench, "target", fake_target)
    report = json.dumps({"jobs": [{"read": {"iops": 1000.0, "bw_bytes": 4096000.0}}]})
    perf = _script(tmp_path / "perf", f"echo \"$@\" > {perf_log}; echo '{report}'")
    bench = ab.bench_stacks.Bench(tmp_path, None)
    with ab.start_target("spdk-spec", 0, "poll", None, (), ab.DEFAULT_NS, bench) as t:
        assert started == [("spdk-spec", [0], "poll")] and t.port == "4421" and t.cpu() == (1.5, 2.5)
        run = ab.measure(perf, t, ab.parse_work("4k-randread-qd1-poll"), 1, 1, 0)
    assert started[-1] == "stopped" and run["iops"] == 1000.0
    # nvmf-perf connects to the bench's subsystem on SPDK's port.
    assert f"-s 4421 -n {ab.bench_stacks.NQN} " in perf_log.read_text() and "--tls" not in perf_log.read_text()
    # Over TLS: the bench's TLS target, and nvmf-perf with the bench's key and host NQN and a
    # version 0 identity (SPDK 24.01 takes no other).
    with ab.start_target("spdk", 0, "poll", "ab's own key", (), ab.DEFAULT_NS, bench) as t:
        assert started[-1] == ("spdk-tls", [0], "poll") and t.psk_path == bench.psk_path
        ab.measure(perf, t, ab.parse_work("4k-randread-qd1-poll"), 1, 1, 0)
    assert f"--tls-key {bench.tls_key} -q {ab.bench_stacks.TLS_HOSTNQN} --tls-key-identity 0" in perf_log.read_text()


def test_ab_says_which_side_did_not_start_and_keeps_what_it_measured(tmp_path, capsys):
    ab = _ab()
    good = _script(tmp_path / "good", 'echo "ready listen=127.0.0.1:4420"; exec sleep 30')
    bad = _script(tmp_path / "bad", "echo 'error: no such core'")
    report = json.dumps({"jobs": [{"read": {"iops": 1000.0, "bw_bytes": 4096000.0}}]})
    perf = _script(tmp_path / "perf", f"echo '{report}'")
    out = tmp_path / "ab.json"
    assert ab.main(["--a", good, "--b", bad, "--perf", perf, "--no-probe", "--rounds", "1", "--seconds", "1",
                    "--ramp", "0", "--works", "4k-randread-qd1-event", "--out", str(out)]) == 1
    assert "no ready line" in capsys.readouterr().err
    assert [r["side"] for r in json.loads(out.read_text())["runs"]] == ["A"]
