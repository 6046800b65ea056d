"""The overhead study's B-app against an SSD-like device (issue 22 item 9, thesis fig. 5.3): the
`device` option's points run in the same rounds as the local and file legs, the analysis finds the
block size from which NVMe/TCP reaches local access on the device (or says that the gap stays open,
or that the intervals cannot decide), and a real tiny run against our model backend lands in the
results with its bandwidth held to the model's link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import nvmflab
from test_analysis_fixtures import frame, rows, runs_frame

from nvmflab.analysis import overhead
from nvmflab.analysis.device_model import CONVERGED_SHARE, DeviceModel
from nvmflab.findings_data import summary
from nvmflab.runner import PlanningRunner
from nvmflab.spec import load_spec
from nvmflab.stacks import get_stack
from nvmflab.store import ResultsStore
from nvmflab.studies import study_module, study_params
from nvmflab.studies.common import Context
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
MODEL = "lat=80us,par=32,bw=1GiB"
SIZES = (4096, 16384, 65536, 262144)
QD = 32


def test_the_model_arithmetic_is_the_backends():
    default = DeviceModel.parse(None)
    assert (default.latency_s, default.parallelism, default.bandwidth) == (80e-6, 32, 3 << 30)
    lone = DeviceModel.parse("lat=100us,par=4,bw=none")
    assert lone.ceiling(4096, 1) == pytest.approx(4096 / 100e-6)  # one command at a time: 1 / lat
    assert lone.ceiling(4096, 64) == pytest.approx(4 * 4096 / 100e-6)  # four units busy
    assert lone.limit(4096, 64) == "media units" and lone.limit(4096, 1) == "queue depth"
    linked = DeviceModel.parse(MODEL)
    assert linked.ceiling(1 << 20, QD) == pytest.approx(1 << 30) and linked.limit(1 << 20, QD) == "link"
    for bad in ("lat=fast", "par=0", "speed=3"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            DeviceModel.parse(bad)


def _measurements(remote_bw: dict[int, float], local_bw: float | dict[int, float] = 4e9,
                  only_repeat: int | None = None) -> pd.DataFrame:
    """B-app rows: the local path on the file and NVMe/TCP loopback on the device, per block size."""
    knobs = json.dumps({"app": "B-app", "backend": "model", "backend_model": MODEL})
    local = [{"bs": bs, "iodepth": QD, "engine": "local", "iops": (local_bw if isinstance(local_bw, float)
                                                                    else local_bw[bs]) / bs,
              "knobs_json": json.dumps({"app": "B-app"})} for bs in SIZES]
    remote = [{"bs": bs, "iodepth": QD, "iops": remote_bw[bs] / bs, "knobs_json": knobs} for bs in SIZES]
    data = frame(rows("overhead", "local", local), rows("overhead", "device_loopback", remote))
    return data[data["repeat"] == only_repeat] if only_repeat is not None else data


def _device(result) -> tuple[list[str], pd.DataFrame]:
    findings = [f for f in result.findings if "against the device" in f]
    table = next(t.frame for t in result.tables if t.title == "B-app against the device model")
    return findings, table


CEILING = DeviceModel.parse(MODEL).ceiling(4096, QD)  # the 1 GiB/s link at every size here


def test_a_gap_that_closes_is_found_where_nvme_tcp_reaches_the_device():
    remote = {4096: 0.3e9, 16384: 0.6e9, 65536: 0.99 * CEILING, 262144: 0.995 * CEILING}
    result = overhead.analyze(_measurements(remote), runs_frame(["overhead"]))
    findings, table = _device(result)
    assert "from 64k on" in findings[0] and "device's ceiling" in findings[0]
    assert "at 16k it is clearly below" in findings[0] and "64k on its SSD" in findings[0]
    assert table[f"converged (≥ {CONVERGED_SHARE:g})"].tolist() == [False, False, True, True]
    assert set(table["compared with"]) == {"device"}  # the local path's 4 GB/s is above the device
    assert "overhead_device_bandwidth_vs_bs" in {f.name for f in result.figures}
    # decided by its ratio intervals, not a two-sample comparison: still on the summary's decided list
    assert findings[0] in [d["text"] for d in summary([result])["decided"]]


def test_a_gap_that_stays_open_is_said_so():
    remote = {bs: 0.5 * CEILING for bs in SIZES}
    findings, table = _device(overhead.analyze(_measurements(remote), runs_frame(["overhead"])))
    assert "the gap does not close up to 256k" in findings[0]
    assert not table[f"converged (≥ {CONVERGED_SHARE:g})"].any()
    result = overhead.analyze(_measurements(remote), runs_frame(["overhead"]))
    assert findings[0] in [d["text"] for d in summary([result])["decided"]]


def test_one_repeat_cannot_decide():
    remote = {bs: CEILING for bs in SIZES}
    findings, _ = _device(overhead.analyze(_measurements(remote, only_repeat=0), runs_frame(["overhead"])))
    assert "cannot decide" in findings[0] and "no interval" in findings[0]
    result = overhead.analyze(_measurements(remote, only_repeat=0), runs_frame(["overhead"]))
    page = summary([result])
    assert findings[0] not in [d["text"] for d in page["decided"]]
    assert findings[0] in [d["text"] for d in page["undecided"]]


def test_an_interval_on_both_sides_of_the_share_cannot_decide_and_says_why():
    remote = {bs: CONVERGED_SHARE * CEILING for bs in SIZES}  # repeats at ±1 %: the interval straddles it
    findings, _ = _device(overhead.analyze(_measurements(remote), runs_frame(["overhead"])))
    assert "cannot decide (at the largest size, 256k, the interval reaches both sides of 90 %" in findings[0]


def _counted(data: pd.DataFrame, equal: dict[int, float], window_ms: int = 1000, repeats: int = 3) -> pd.DataFrame:
    """Rows as nvmf-perf stores them (bandwidth over a `window_ms` window), with the device leg's
    bandwidth at the sizes of `equal` the same whole number of I/Os in every repeat, as a path held
    exactly to the model's link counts them."""
    data = data[data["repeat"] < repeats].copy()
    data["runtime_ms"] = window_ms
    for bs, bw in equal.items():
        step = bs * 1000 / window_ms
        at = (data["leg"] == "device_loopback") & (data["bs"] == bs)
        data.loc[at, "bw_bytes"] = round(bw / step) * step
        data.loc[at, "iops"] = data.loc[at, "bw_bytes"] / bs
    return data


def test_equal_repeats_at_the_link_are_judged_by_the_counts_resolution_and_decide():
    # NVMe/TCP held exactly to the 1 GiB/s link from 64k on: the same count in all three repeats,
    # known to 1 + 32 I/Os (the step and the commands in flight at the window's ends) per second
    remote = {4096: 0.3e9, 16384: 0.6e9, 65536: CEILING, 262144: CEILING}
    data = _counted(_measurements(remote), {65536: CEILING, 262144: CEILING})
    result = overhead.analyze(data, runs_frame(["overhead"]))
    findings, table = _device(result)
    assert ("from 64k on (ratio 1.000, every repeat the same count, so 95 % interval 0.998 to 1.002 (the count's "
            "resolution either side: one I/O and the commands in flight at the window's ends) against the device's "
            "ceiling" in findings[0])
    assert "the interval includes 1" in findings[0] and "at 16k it is clearly below" in findings[0]
    assert table[f"converged (≥ {CONVERGED_SHARE:g})"].tolist() == [False, False, True, True]
    assert table["95 % interval"].iloc[-1] == "0.992 to 1.008"  # 33 × 256 KiB per second over 1 GiB/s
    assert findings[0] in [d["text"] for d in summary([result])["decided"]]


def test_equal_repeats_below_the_share_decide_that_the_gap_does_not_close():
    equal = {bs: 0.5 * CEILING for bs in SIZES}
    result = overhead.analyze(_counted(_measurements(equal), equal), runs_frame(["overhead"]))
    findings, table = _device(result)
    assert "the gap does not close up to 256k" in findings[0]
    assert "ratio 0.500, every repeat the same count" in findings[0]
    assert not table[f"converged (≥ {CONVERGED_SHARE:g})"].any()
    assert findings[0] in [d["text"] for d in summary([result])["decided"]]


def test_equal_repeats_within_the_resolution_of_the_share_cannot_decide():
    # at 0.9 × the link, or just under it: equal counts never make it "converged"
    for share in (CONVERGED_SHARE, CONVERGED_SHARE - 1e-4, CONVERGED_SHARE - 0.005):
        equal = {bs: share * CEILING for bs in SIZES}
        findings, table = _device(overhead.analyze(_counted(_measurements(equal), equal), runs_frame(["overhead"])))
        assert "cannot decide (at the largest size, 256k, the interval reaches both sides of 90 %" in findings[0]
        assert not table[f"converged (≥ {CONVERGED_SHARE:g})"].any()


def test_two_equal_repeats_or_no_window_stay_without_an_interval():
    equal = {bs: CEILING for bs in SIZES}
    two = _counted(_measurements(equal), equal, repeats=2)
    no_window = _counted(_measurements(equal), equal).drop(columns="runtime_ms")
    for data in (two, no_window):
        findings, _ = _device(overhead.analyze(data, runs_frame(["overhead"])))
        assert "cannot decide (the largest size, 256k, has ratio 1.00, no interval" in findings[0]


def test_repeats_with_spread_decide_the_same_with_or_without_the_window():
    # noisy repeats (±1 %): the resolution widens each interval by 33 I/Os per second and changes
    # no decision
    remote = {4096: 0.3e9, 16384: 0.6e9, 65536: 0.99 * CEILING, 262144: 0.995 * CEILING}
    cases = (remote, {bs: 0.95 * CEILING for bs in SIZES}, {bs: 0.5 * CEILING for bs in SIZES},
             {bs: CONVERGED_SHARE * CEILING for bs in SIZES})
    verdicts = ("from 64k on", "from 4k on", "the gap does not close up to 256k", "cannot decide")
    converged = f"converged (≥ {CONVERGED_SHARE:g})"
    for case, verdict in zip(cases, verdicts):
        plain, plain_table = _device(overhead.analyze(_measurements(case), runs_frame(["overhead"])))
        windowed, table = _device(overhead.analyze(_counted(_measurements(case), {}), runs_frame(["overhead"])))
        assert verdict in plain[0] and verdict in windowed[0]
        assert table[converged].tolist() == plain_table[converged].tolist()
        widened = [float(t.split(" to ")[1]) - float(p.split(" to ")[1])
                   for t, p in zip(table["95 % interval"], plain_table["95 % interval"])]
        steps = [33 * bs / CEILING for bs in SIZES]
        assert all(0 <= w <= step + 0.001 for w, step in zip(widened, steps)), widened


def test_a_converged_size_must_be_followed_by_converged_larger_ones():
    # 64k reaches the device but 256k falls back: the run from the largest size down is empty.
    remote = {4096: 0.3e9, 16384: 0.6e9, 65536: CEILING, 262144: 0.5 * CEILING}
    findings, table = _device(overhead.analyze(_measurements(remote), runs_frame(["overhead"])))
    assert "the gap does not close up to 256k" in findings[0]
    assert not table[f"converged (≥ {CONVERGED_SHARE:g})"].any()


def test_a_local_path_slower_than_the_device_is_the_reference():
    local = {bs: 0.5e9 for bs in SIZES}  # local access could not reach the 1 GiB/s device either
    remote = {4096: 0.2e9, 16384: 0.3e9, 65536: 0.5e9, 262144: 0.5e9}
    findings, table = _device(overhead.analyze(_measurements(remote, local), runs_frame(["overhead"])))
    assert set(table["compared with"]) == {"local"}
    assert "from 64k on" in findings[0] and "against the local path" in findings[0]
    assert any("not clearly faster than the device" in f for f in findings)


def test_without_the_device_option_the_section_is_absent():
    result = overhead.analyze(_measurements({bs: CEILING for bs in SIZES}).query("leg == 'local'"),
                              runs_frame(["overhead"]))
    assert not [f for f in result.findings if "against the device" in f]
    assert "B-app against the device model" not in {t.title for t in result.tables}


SPEC = """study = "overhead"
repeats = {repeats}
ramp_time = 0
runtime = {runtime}
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "file"
size = "16MiB"
[params]
iodepth = [1]
bs = ["4k", "128k"]
bapp_iodepth = [8]
legs = {legs}
device = "lat=50us,par=4,bw=256MiB"
device_legs = ["loopback"]
"""


def _plan(tmp_path, target: str) -> list:
    spec_file = tmp_path / "o.toml"
    spec_file.write_text(SPEC.format(repeats=2, runtime=1, legs='["local", "loopback"]')
                         + f'[stack]\ntarget = "{target}"\n')
    spec = load_spec(spec_file)
    local = LocalHost(workdir=tmp_path)
    planner = PlanningRunner(ResultsStore(tmp_path / "r"), get_stack(target), get_stack("ours"), Hosts(local, [local]))
    study_module("overhead").execute(Context(spec=spec, study="overhead", runner=planner, store=planner.store),
                                     study_params("overhead", spec.params))
    return [p for _, p in planner.planned]


def test_a_device_without_a_leg_to_run_on_is_refused_naming_both_fields():
    with pytest.raises(ValueError, match=r"device_legs \['netns'\] names no leg of legs \['local', 'loopback'\]"):
        study_params("overhead", {"device": MODEL, "device_legs": ["netns"], "legs": ["local", "loopback"]})
    assert study_params("overhead", {"device_legs": ["netns"], "legs": ["local"]}).device is None  # off: no check


def test_device_points_run_in_the_same_rounds_as_the_local_leg(tmp_path):
    points = _plan(tmp_path, "ours")
    device = [p for p in points if p.leg == "device_loopback"]
    assert len(device) == 2 * 2  # repeats × block sizes; B-app only
    assert {p.knobs["backend"] for p in device} == {"model"}
    assert {p.knobs["backend_model"] for p in device} == {"lat=50us,par=4,bw=256MiB"}
    assert {s.backend for p in device for s in p.target.subsystems} == {"model"}
    assert [p.repeat for p in points] == sorted(p.repeat for p in points)  # repeat outermost
    for r in range(2):  # each round holds every leg's B-app points
        legs = {p.leg for p in points if p.repeat == r and p.knobs["app"] == "B-app"}
        assert legs == {"local", "loopback", "device_loopback"}


def test_a_target_without_the_model_skips_the_device_points_with_the_reason(tmp_path):
    device = [p for p in _plan(tmp_path, "kernel") if p.leg == "device_loopback"]
    assert device and all("no model backend" in (p.skip_reason or "") for p in device)


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="nvmf-target/nvmf-perf not built")
def test_a_real_run_stores_device_points_held_to_the_models_link(tmp_path):
    spec = tmp_path / "o.toml"
    spec.write_text(SPEC.format(repeats=2, runtime=0.3, legs='["loopback"]'))
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("study", "overhead", "--spec", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = ResultsStore(tmp_path / "r").measurements()
    device = data[data["leg"] == "device_loopback"]
    assert len(device) == 4 and set(device["status"]) == {"ok"}
    assert {json.loads(k)["backend_model"] for k in device["knobs_json"]} == {"lat=50us,par=4,bw=256MiB"}
    # The model's 256 MiB/s link holds 128 KiB reads to it (nvmf-perf's window may add a little).
    big = device[device["bs"] == 131072]["bw_bytes"]
    assert (big <= 1.05 * (256 << 20)).all() and (big > 0).all()
    result = overhead.analyze(data, ResultsStore(tmp_path / "r").runs())
    assert "B-app against the device model" in {t.title for t in result.tables}
    assert any("B-app against the device" in f for f in result.findings)
