"""bench/nvmfbench/cipher.py and bound.py: the AES-GCM rates from `openssl speed` and `nvmf-bench aead`
(fake output, a fake openssl and nvmf-bench), the faster of the two with slow-phase measurements left
out, and each TLS row's cipher-bound limit, per-round interval and goal (issue 40 item 1)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from nvmfbench import bound, cipher, goals, report, stacks, stats  # noqa: E402

SPEED_MR = """Doing AES-128-GCM for 1s on 4096 size blocks: +DT:AES-128-GCM:1:4096
+R:515587:AES-128-GCM:0.740000
+H:4096
+F:25:AES-128-GCM:2853843718.92
"""


def test_the_rate_is_read_from_openssl_speeds_machine_readable_line():
    assert cipher.parse_speed(SPEED_MR) == pytest.approx(2853843718.92)
    with pytest.raises(cipher.CipherError, match=r"no rate line .*unknown option"):
        cipher.parse_speed("speed: unknown option '-aead'\nspeed: Use -help for summary.\n")
    with pytest.raises(cipher.CipherError, match="rate of 0"):
        cipher.parse_speed("+F:25:AES-128-GCM:0.00\n")


def test_the_measurement_is_pinned_to_the_core_in_a_tls_like_sequence():
    cmd = cipher.speed_command(3, 16384, "decrypt", 2)
    assert cmd[:3] == ["taskset", "-c", "3"]
    assert cmd[3:] == ["openssl", "speed", "-mr", "-aead", "-decrypt", "-evp", "aes-128-gcm", "-bytes", "16384",
                       "-seconds", "2"]
    assert "-decrypt" not in cipher.speed_command(0, 4096, "encrypt", 1)
    with pytest.raises(ValueError, match="sideways"):
        cipher.speed_command(0, 4096, "sideways", 1)


def _fake_tools(tmp_path: Path, openssl_body: str, aead_body: str | None = None) -> str:
    """A PATH whose taskset runs its command unpinned and whose openssl is `openssl_body`; with
    `aead_body`, a fake nvmf-bench there too (NVMFLAB_BIN_DIR must point at tmp_path)."""
    tools = [("taskset", 'shift 2; exec "$@"'), ("openssl", openssl_body)]
    for name, body in tools + ([("nvmf-bench", aead_body)] if aead_body is not None else []):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


# the fakes' rate is the buffer size in MB/s, doubled for encryption, and nvmf-bench's tripled: the
# records must match their size, op and implementation
OPENSSL_FAKE = ('size=""; enc=2; while [ $# -gt 0 ]; do [ "$1" = -bytes ] && size=$2; [ "$1" = -decrypt ] && enc=1; '
                'shift; done; echo "+F:25:AES-128-GCM:$((size * 1000000 * enc))"')
AEAD_FAKE = ('size=""; enc=2; while [ $# -gt 0 ]; do [ "$1" = --bytes ] && size=$2; [ "$1" = --decrypt ] && enc=1; '
             'shift; done; echo "{\\"impl\\": \\"nvmf-tls\\", \\"rate_bps\\": $((size * 3000000 * enc))}"')


class FakeBracket:
    """speed.Bracket's interface: fields set on exit, counted."""
    entered = 0

    def __enter__(self):
        FakeBracket.entered += 1
        return self

    def __exit__(self, *exc):
        self.fields = {"probe_ns": [9000.0, 9100.0 * FakeBracket.entered]}


def test_a_round_measures_both_implementations_bracketed_and_records_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, OPENSSL_FAKE, AEAD_FAKE))
    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(tmp_path))
    FakeBracket.entered = 0
    found = cipher.measure_round(0, 4, bracket=FakeBracket)
    want = [(s, op, impl) for s in cipher.SIZES for op in cipher.OPS for impl in cipher.impls_at(s)]
    assert [(r["size"], r["op"], r["impl"]) for r in found] == want
    assert ("nvmf-tls" in cipher.impls_at(16384)) and cipher.impls_at(131072) == ("openssl-evp",)
    for r in found:
        factor = (2 if r["op"] == "encrypt" else 1) * (3 if r["impl"] == "nvmf-tls" else 1)
        assert r["round"] == 4 and r["rate_bps"] == r["size"] * 1e6 * factor
    # one bracket per size and direction, its probes on both implementations' records
    assert FakeBracket.entered == len(cipher.SIZES) * len(cipher.OPS)
    assert found[0]["probe_ns"] == found[1]["probe_ns"] == [9000.0, 9100.0]
    assert found[2]["probe_ns"] == [9000.0, 18200.0]
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, 'echo "Error setting cipher" >&2; exit 1', "exit 3"))
    failed = cipher.measure_round(0, 0)
    assert all("rate_bps" not in r and "probe_ns" not in r for r in failed)
    assert all("exited 1: Error setting cipher" in r["error"] for r in failed if r["impl"] == "openssl-evp")
    assert all("exited 3" in r["error"] for r in failed if r["impl"] == "nvmf-tls")


def test_a_missing_nvmf_bench_is_an_error_record_and_openssl_still_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, OPENSSL_FAKE))
    def missing(name):
        raise stacks.BenchError(f"{name} not found")

    monkeypatch.setattr(cipher, "bench_binary", missing)
    found = cipher.measure_round(0, 1)
    ours = [r for r in found if r["impl"] == "nvmf-tls"]
    assert ours and all(r["error"] == "nvmf-bench not found" and "rate_bps" not in r for r in ours)
    assert cipher.rates(found, 4096) == {"encrypt": 4096 * 2e6, "decrypt": 4096 * 1e6,
                                         "impl": {"encrypt": "openssl-evp", "decrypt": "openssl-evp"}, "all_slow": []}


def test_the_aead_rate_is_read_from_nvmf_benchs_json_line():
    line = '{"impl":"nvmf-tls","bytes":4096,"op":"encrypt","rate_bps":2853843718.5,"records":9,"cpu_s":0.2}\n'
    assert cipher.parse_aead(line) == pytest.approx(2853843718.5)
    for bad in ("", "nvmf-bench: --bytes 0 is outside 1..=16384\n", '{"impl":"nvmf-tls","rate_bps":0}',
                '{"impl":"openssl-evp","rate_bps":5}', '{"impl":"nvmf-tls","rate_bps":"fast"}', "[1]"):
        with pytest.raises(cipher.CipherError, match="no positive rate_bps"):
            cipher.parse_aead(bad)
    cmd = cipher.aead_command(2, 4096, "decrypt", 1)
    assert cmd[:3] == ["taskset", "-c", "2"] and cmd[3].endswith("nvmf-bench")
    assert cmd[4:] == ["aead", "--bytes", "4096", "--seconds", "1", "--decrypt"]


def test_the_limit_is_the_plain_time_per_io_plus_the_cipher_time():
    # issue 40's Intel figures: 927 K plain at QD32, 3.9 GB/s at 4 KiB -> about 470 K
    rate4k = {"encrypt": 3.9e9, "decrypt": 3.9e9}
    assert cipher.limit_iops(927e3, cipher.cipher_seconds(4096, 32, rate4k)) == pytest.approx(470e3, rel=0.01)
    # at QD1 the sealing and the opening side take turns: 97 K plain -> about 81 K
    assert cipher.limit_iops(97e3, cipher.cipher_seconds(4096, 1, rate4k)) == pytest.approx(80.6e3, rel=0.01)
    # with many in flight the slower direction alone bounds it
    assert cipher.cipher_seconds(4096, 32, {"encrypt": 4e9, "decrypt": 2e9}) == pytest.approx(4096 / 2e9)
    # 128 KiB: 16 KiB records at 5.5 GB/s, 4.6 GiB/s plain -> about 2.5 GiB/s
    plain = 4.6 * (1 << 30) / 131072
    limit = cipher.limit_iops(plain, cipher.cipher_seconds(131072, 32, {"encrypt": 5.5e9, "decrypt": 5.5e9}))
    assert limit * 131072 / (1 << 30) == pytest.approx(2.43, abs=0.02)
    with pytest.raises(ValueError):
        cipher.limit_iops(0, 1e-6)


def _rates(rnd, r4k, r16k, r128k=9e9, impl="openssl-evp", probe=None):
    return [{"round": rnd, "core": 0, "size": size, "op": op, "impl": impl, "rate_bps": rate}
            | ({"probe_ns": [probe, probe]} if probe else {})
            for size, rate in ((4096, r4k), (16384, r16k), (131072, r128k)) if impl in cipher.impls_at(size)
            for op in cipher.OPS]


def _limit(rate, impl="openssl-evp", all_slow=()):
    return {"encrypt": rate, "decrypt": rate, "impl": {op: impl for op in cipher.OPS}, "all_slow": list(all_slow)}


def test_a_large_io_takes_the_rate_of_its_16_kib_records_as_the_median_over_rounds():
    records = _rates(0, 2e9, 4e9) + _rates(1, 3e9, 5e9) + _rates(2, 4e9, 6e9)
    records.append({"round": 2, "core": 0, "size": 4096, "op": "decrypt", "impl": "openssl-evp", "error": "killed"})
    assert cipher.rates(records, 131072) == _limit(5e9)  # not the 9 GB/s of 128 KiB buffers
    assert cipher.rates(records, 4096) == _limit(3e9)
    assert cipher.rates([r for r in records if r["op"] == "encrypt"], 4096) is None
    assert cipher.rates(records, 512) is None  # no size measured at or below its record
    del records[0]["impl"]  # records from before the second implementation were OpenSSL's
    assert cipher.rates(records, 4096) == _limit(3e9)


def test_the_limit_takes_the_faster_implementation_per_direction():
    records = _rates(0, 2e9, 4e9) + _rates(1, 3e9, 5e9) + _rates(0, 3.5e9, 3e9, impl="nvmf-tls")
    records += _rates(1, 4.5e9, 3e9, impl="nvmf-tls")
    ours_1 = next(r for r in records if (r["round"], r["size"], r["op"], r["impl"]) == (1, 4096, "encrypt", "nvmf-tls"))
    ours_1["rate_bps"] = 1e9  # its median drops to 2.25 GB/s, below OpenSSL's 2.5
    assert cipher.rates(records, 4096) == {"encrypt": 2.5e9, "decrypt": 4e9, "all_slow": [],
                                           "impl": {"encrypt": "openssl-evp", "decrypt": "nvmf-tls"}}
    assert cipher.rates(records, 131072) == _limit(4.5e9)  # OpenSSL's 16 KiB records
    summary = report.cipher_summary(records)
    assert summary["rates_bps"]["4096"] == {"encrypt": 2.5e9, "decrypt": 4e9}
    assert summary["by_impl_bps"]["4096"]["encrypt"] == {"openssl-evp": 2.5e9, "nvmf-tls": 2.25e9}
    assert summary["limit_impl"]["4096"] == {"encrypt": "openssl-evp", "decrypt": "nvmf-tls"}
    assert summary["limit_impl"]["131072"] == {"encrypt": "openssl-evp", "decrypt": "openssl-evp"}


def test_issue_40s_bound_takes_openssls_evp_alone_where_ring_is_faster():
    records = [r for rnd in range(2) for r in _rates(rnd, 2e9, 4e9) + _rates(rnd, 4e9, 6e9, impl="nvmf-tls")]
    assert cipher.rates(records, 4096) == _limit(4e9, "nvmf-tls")
    assert cipher.rates(records, 4096, bound.OPENSSL_ONLY) == _limit(2e9)
    assert cipher.rates(records, 131072, bound.OPENSSL_ONLY) == _limit(4e9)  # its 16 KiB records
    assert cipher.rates(_rates(0, 4e9, 6e9, impl="nvmf-tls"), 4096, bound.OPENSSL_ONLY) is None
    write = "4k randwrite QD32"
    runs = [run("ours", "ours", write, 1e6, rnd) for rnd in range(2)]
    runs += [run("ours-tls", "ours-tls", write, tls, rnd) for rnd, tls in enumerate((390e3, 410e3))]
    (row,) = bound.bound_rows(stats.cells(runs), runs, records)
    # 1 us plain; ring 1.024 us, EVP 2.048 us per 4 KiB I/O; the median TLS run 400 K
    assert row["limit_iops"] == pytest.approx(1 / 2.024e-6) and row["value"] == pytest.approx(0.8096)
    assert row["evp_limit_iops"] == pytest.approx(1 / 3.048e-6) and row["evp_value"] == pytest.approx(1.2192)
    geo = (390e3 * 410e3) ** 0.5
    assert row["evp_per_round"][0] == pytest.approx(geo * 3.048e-6) and row["per_round"][0] == pytest.approx(geo * 2.024e-6)


def test_cipher_measurements_from_a_slow_phase_are_left_out_relative_to_the_whole_bench():
    # the runs' fastest probe is 10 us; cipher records probed at 20 us are slow (> 1.25 x), at 12 us not
    runs = [{"probe_ns": [10e3, 11e3]}, {"probe_ns": [30e3]}]
    fast, slow = _rates(0, 2e9, 4e9, probe=12e3), _rates(1, 8e9, 8e9, impl="nvmf-tls", probe=20e3)
    records = fast + slow
    assert cipher.mark_slow(records, runs) == len(slow)
    assert all(r["slow_machine"] == 2.0 for r in slow) and not any("slow_machine" in r for r in fast)
    assert not any("slow_machine" in r or "noisy" in r for r in runs)  # the runs are the matrix's to judge
    assert cipher.rates(records, 4096) == _limit(2e9)  # not the slow 8 GB/s
    # without the runs the fastest probe is the records' own 12 us: 20 us is still slow
    assert cipher.mark_slow(records, []) == len(slow)
    summary = report.cipher_summary(records)
    assert summary["slow"] == 4 and summary["all_slow"] == []
    assert summary["limit_impl"]["4096"]["encrypt"] == "openssl-evp"
    # records without probes (the noise limit off) are never slow
    assert cipher.mark_slow(_rates(0, 1e9, 1e9), runs) == 0


def test_when_every_cipher_measurement_is_slow_all_are_used_and_the_report_says_so():
    runs = [{"probe_ns": [10e3, 10e3]}]
    records = _rates(0, 2e9, 4e9, probe=20e3) + _rates(1, 3e9, 5e9, impl="nvmf-tls", probe=30e3)
    assert cipher.mark_slow(records, runs) == len(records)
    assert cipher.rates(records, 4096) == _limit(3e9, "nvmf-tls", all_slow=cipher.OPS)
    summary = report.cipher_summary(records)
    assert summary["slow"] == 0 and summary["all_slow"] == ["4 KiB encrypt", "4 KiB decrypt", "16 KiB encrypt",
                                                            "16 KiB decrypt", "128 KiB encrypt", "128 KiB decrypt"]
    assert "Every measurement slow, all used: 4 KiB encrypt" in report._cipher_slow(summary)


def run(target, host, work, iops, rnd, noisy=False):
    return {"target": target, "host": host, "work": work, "iops": iops, "bw_bytes": iops * 4096,
            "lat_mean_ns": 1000.0, "lat_p99_99_ns": None, "noisy": noisy, "noise_pct": 1.0, "round": rnd}


def test_tls_rows_against_their_limit_per_round_and_as_goals():
    write = "4k randwrite QD32"
    # cipher at 4.096 GB/s: 1 us per 4 KiB I/O; plain at 1 M IOPS (1 us): limit 500 K in every round
    records = [r for rnd in range(3) for r in _rates(rnd, 4.096e9, 8e9)]
    runs = []
    for rnd, tls in enumerate((470e3, 475e3, 465e3)):
        runs += [run("ours", "ours", write, 1e6, rnd), run("ours-tls", "ours-tls", write, tls, rnd)]
    runs += [run("ours", "ours", goals.QD32, 1e6, 0), run("ours-tls", "ours-tls", goals.QD32, 200e3, 0)]
    runs.append(run("ours-tls", "ours-tls", write, 10e3, 3, noisy=True))  # left out with its round
    table = stats.cells(runs)
    rows = {(b["pair"], b["work"]): b for b in bound.bound_rows(table, runs, records)}
    w = rows[("ours x ours", write)]
    assert w["limit_iops"] == pytest.approx(500e3) and w["value"] == pytest.approx(0.94)
    mean, low, high, n = w["per_round"]
    assert n == 3 and mean == pytest.approx((0.94 * 0.95 * 0.93) ** (1 / 3), abs=1e-4) and 0.9 < low < high < 1.0
    assert rows[("ours x ours", goals.QD32)]["per_round"] is None  # one round: no interval
    found = {g["goal"]: g for g in goals.goal_rows(table, {}, None, "", runs, list(rows.values()))}
    met = found[f"TLS: {write}, ours x ours / cipher-bound limit >= 0.9"]
    assert met["status"] == "met" and met["per_round"]["decided"] == "met"
    assert found[f"TLS: {goals.QD32}, ours x ours / cipher-bound limit >= 0.9"]["status"] == "missed by 55.6 %"
    # without a rate the row says why, and so does the goal
    bare = {b["work"]: b for b in bound.bound_rows(table, runs, [])}
    assert bare[write]["value"] is None and bare[write]["why_missing"] == bound.NO_RATE
    unmeasured = goals.goal_rows(table, {}, None, "", runs, list(bare.values()))
    assert next(g for g in unmeasured if g["goal"].startswith(f"TLS: {write}"))["status"] == \
        f"not measured ({bound.NO_RATE})"
    # spdk_nvme_perf's TLS writes go through SPDK's 4 KiB send buffer, and its reads in flight wait on
    # its fixed receive buffer: the rows and their goals say so; a lone read (QD1) does not
    qd1 = goals.QD1
    runs += [run("ours", "spdk", write, 1e6, 0), run("ours-tls", "spdk-tls", write, 5e3, 0),
             run("ours", "spdk", goals.QD32, 1e6, 0), run("ours-tls", "spdk-tls", goals.QD32, 400e3, 0),
             run("ours", "spdk", qd1, 80e3, 0), run("ours-tls", "spdk-tls", qd1, 60e3, 0)]
    table = stats.cells(runs)
    spdk = {b["work"]: b for b in bound.bound_rows(table, runs, records) if b["pair"] == "our target x spdk_nvme_perf"}
    assert spdk[write]["why_missing"] == bound.SPDK_HOST_SEND and spdk[goals.QD32]["why_missing"] == bound.SPDK_HOST_RECV
    assert spdk[qd1]["why_missing"] == ""
    marked = {g["goal"]: g for g in goals.goal_rows(table, {}, None, "", runs, list(spdk.values()))}
    assert marked[f"TLS: {write}, our target x spdk_nvme_perf / cipher-bound limit >= 0.9"]["status"] == \
        f"missed by 98.9 % ({bound.SPDK_HOST_SEND})"
    assert marked[f"TLS: {goals.QD32}, our target x spdk_nvme_perf / cipher-bound limit >= 0.9"]["status"].endswith(
        f"({bound.SPDK_HOST_RECV})")
    assert "(" not in marked[f"TLS: {qd1}, our target x spdk_nvme_perf / cipher-bound limit >= 0.9"]["status"]
    # Runs with the bench's socket buffer shim measured TLS, not those stalls: no caveat, unless one
    # of a row's runs went without it.
    shimmed = [r | {"host_sockbuf": 2 << 20} if r["host"] == "spdk-tls" else r for r in runs]
    table = stats.cells(shimmed)
    fixed = {b["work"]: b for b in bound.bound_rows(table, shimmed, records) if b["pair"] == "our target x spdk_nvme_perf"}
    assert fixed[write]["why_missing"] == fixed[goals.QD32]["why_missing"] == fixed[qd1]["why_missing"] == ""
    mixed = shimmed + [run("ours-tls", "spdk-tls", write, 5e3, 1), run("ours", "spdk", write, 1e6, 1)]
    table = stats.cells(mixed)
    rows = {b["work"]: b for b in bound.bound_rows(table, mixed, records) if b["pair"] == "our target x spdk_nvme_perf"}
    assert rows[write]["why_missing"] == bound.SPDK_HOST_SEND and rows[goals.QD32]["why_missing"] == ""


def test_the_report_shows_the_rates_and_each_tls_row_against_its_limit():
    large = "128k randwrite QD32"
    runs = [run("ours", "ours", large, 40e3, rnd) for rnd in range(2)]
    runs += [run("ours-tls", "ours-tls", large, 12e3, rnd) for rnd in range(2)]
    config = {"seconds": 3, "ramp": 1, "rounds": 2, "target_core": 0, "host_core": 1, "works": [large]}
    records = _rates(0, 3e9, 5e9) + _rates(1, 3e9, 5.2e9) + _rates(0, 4e9, 4e9, impl="nvmf-tls")
    records += _rates(1, 4e9, 4e9, impl="nvmf-tls")
    results = report.assemble(runs, [], [large], config, None, [], [], 10.0, records)
    assert results["cipher"]["rates_bps"]["16384"] == {"encrypt": 5.1e9, "decrypt": 5.1e9}
    (row,) = results["tls_bound"]
    assert row["pair"] == "ours x ours" and 0 < row["limit_iops"] < 40e3
    text = report.markdown(results)
    assert "Cipher bound: TLS_AES_128_GCM_SHA256" in text
    assert "16 KiB encrypt 5.10 GB/s (openssl-evp; nvmf-tls 4.00 GB/s)" in text
    assert "4 KiB encrypt 4.00 GB/s (nvmf-tls; openssl-evp 3.00 GB/s)" in text
    assert "128 KiB encrypt 9.00 GB/s (openssl-evp)," in text and "from a slow phase" not in text
    assert f"| ours x ours | {large} | 5.24 GB/s | 1.57 GB/s |" in text
    assert "TLS: 128k randwrite QD32, ours x ours / cipher-bound limit >= 0.9" in text
    # beside it, issue 40's own bound: OpenSSL's EVP alone (its 16 KiB rate, 5.1 GB/s, here the faster)
    assert row["evp_limit_iops"] == pytest.approx(row["limit_iops"]) and row["evp_per_round"][3] == 2
    assert "| limit, OpenSSL's EVP alone | TLS / it; per round (95 %) |" in text
    evp_cells = next(line for line in text.splitlines() if line.startswith(f"| ours x ours | {large} |")).split(" | ")[-2:]
    assert evp_cells[0] == report._io(row["evp_limit_iops"], 131072) and evp_cells[1].startswith(
        f"{report._x(row['evp_value'])}; {row['evp_per_round'][0]:.2f}×"), evp_cells
    plain = report.assemble(runs[:2], [], [large], config, None, [], [], 10.0)
    assert "Cipher bound" not in report.markdown(plain)
    # spdk_nvme_perf's TLS runs with the socket buffer shim: the caption says so, and only then
    assert "preloaded shim" not in text
    shimmed = runs + [run("ours", "spdk", large, 40e3, 0), run("ours-tls", "spdk-tls", large, 9e3, 0) | {"host_sockbuf": 2 << 20}]
    with_shim = report.markdown(report.assemble(shimmed, [], [large], config, None, [], [], 10.0, records))
    assert "spdk_nvme_perf over TLS ran with its ssl socket's buffers raised to 2 MiB" in with_shim
