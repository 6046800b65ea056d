"""bench/ab.py --tls: the target requires TLS with the run's PSK for one host NQN and nvmf-perf
offers that key as that host (fake binaries record their command lines); without it, neither does.
bench/ab.py --host spdk_nvme_perf: SPDK's host polling on the host core, its text report read."""

from __future__ import annotations

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
    with pytest.raises(SystemExit):
        ab.main(["--a", target, "--b", target, "--host", "spdk_nvme_perf", "--tls"])
    assert "--tls with --host spdk_nvme_perf" in capsys.readouterr().err
