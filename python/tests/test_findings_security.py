"""security's findings (issue 37): every TLS point stores who made its records and every TLS finding
names it (ours' --ktls auto included, so a fallback is not silent); an SPDK side's CPU per I/O is
called busy-loop time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import nvmflab
from test_tls_knob import BINARIES, SPEC

from nvmflab.analysis import security
from nvmflab.stacks import get_stack
from nvmflab.stacks.ours import records_of_log
from nvmflab.store import ResultsStore


def test_each_stack_says_who_made_the_host_records():
    line = "nvmf-perf: TLS records: ktls on {} connection(s), userspace on {}\n"
    assert records_of_log("run output\n" + line.format(2, 0)) == "ktls"
    assert records_of_log(line.format(0, 2)) == "userspace"
    assert records_of_log(line.format(1, 1)) == "mixed (ktls on 1 connections, userspace on 1)"
    assert records_of_log("no tls here") is None
    assert get_stack("ours").host_tls_records(line.format(0, 3)) == "userspace"
    assert get_stack("kernel").host_tls_records("").startswith("unknown (")  # read per session: kernel_tls
    assert get_stack("spdk").host_tls_records("") == "userspace (SPDK ssl sock)"


def _store(tmp_path, target: str, target_records: str, host_records: str | None):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("security", 'study = "security"\n', {})
    counters = json.dumps({"ports": [{"tls": "required", "tls_records": target_records, "ktls_connections": 0,
                                      "ktls_fallbacks": 0}]})
    cores = json.dumps({"local": {"roles": {"main": [1], "target": [0]}, "wall_s": 10.0,
                                  "cores": {"0": {"user_s": 9.0, "system_s": 1.0, "softirq_s": 0.0},
                                            "1": {"user_s": 2.0, "system_s": 2.0, "softirq_s": 0.0}}}})
    for tls, iops in (("off", [100_000, 101_000, 99_000]), ("on", [60_000, 61_000, 59_000])):
        for repeat, value in enumerate(iops):
            knobs = {"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": 32, "numjobs": 1, "tls": tls,
                     "dhchap": "off", "target_stack": target, "host_stack": "ours"}
            row = {"role": "main", "iops": value, "bw_bytes": value * 4096, "total_ios": value * 10,
                   "lat_mean_ns": 1e9 / value, "lat_p99_ns": 2e9 / value, "knobs": knobs,
                   "target_counters_json": counters, "cpu_cores_json": cores}
            if tls == "on":
                row["host_tls_records"] = host_records
            store.save_point(run, f"{tls}-{repeat}", "security", f"{target}/ours", knobs, repeat, "ok", None, [row])
    return store


def _tls_finding(store) -> str:
    result = security.analyze(store.measurements(), store.runs())
    return next(f for f in result.findings if "tls vs plain" in f)


def test_every_tls_finding_names_the_record_layer_and_what_auto_chose(tmp_path):
    tls = _tls_finding(_store(tmp_path, "ours", "userspace", "userspace"))
    assert ("tls vs plain (records: target userspace, host userspace; ours' --ktls auto chose this on the target "
            "and host)") in tls, tls
    assert "busy-loop" not in tls


def test_an_spdk_side_s_cpu_per_io_is_called_busy_loop_time(tmp_path):
    tls = _tls_finding(_store(tmp_path, "spdk", "ignored", "ktls"))
    assert "records: target userspace (SPDK ssl sock), host ktls; ours' --ktls auto chose this on the host" in tls
    assert "On the SPDK target side CPU per I/O is busy-loop time" in tls, tls


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="nvmf-target/nvmf-perf not built")
def test_a_real_tls_point_stores_its_host_record_layer(tmp_path):
    spec = tmp_path / "tls.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    frame = ResultsStore(tmp_path / "r").measurements()  # the report after it is not what this checks
    assert len(frame) and (frame["status"] == "ok").all(), done.stderr
    on = frame[frame["knobs_json"].str.contains('"tls": "on"')]
    off = frame[~frame["knobs_json"].str.contains('"tls": "on"')]
    # auto: kTLS where this kernel's sockets take the TLS ULP, else userspace; stored either way
    assert set(on["host_tls_records"]) <= {"ktls", "userspace"} and len(on), on["host_tls_records"]
    assert off["host_tls_records"].isna().all()
    # and the target's side from its /stats, as the findings name it
    records = security.records_text(on)
    host = on["host_tls_records"].iloc[0]
    assert records.startswith(f"records: target {host}, host {host}"), records  # one kernel, one choice
