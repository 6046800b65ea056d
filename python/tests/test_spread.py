"""Load from many initiators at once (spread.py): which hosts, the start barrier, the merge, and a
real run with three initiators on the netns sshd bed (sshbed.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sshbed
from conftest import REPO

from nvmflab import spread
from nvmflab.metrics import summarize
from nvmflab.spec import Topology

BIN_DIR = REPO / "target" / "release"
# Bound on the start skew of three initiators (latest release minus earliest). On the bed the
# parts share this machine's clock, so the skew is the barrier's own: a sleep's wake-up on a
# loaded 2-core machine. Measured 0.2-3 ms here; 50 ms leaves room for a busy CI runner and is
# still far below a point's ramp and runtime.
SKEW_BOUND_MS = 50.0
# The shell barrier (fio, spdk_nvme_perf) forks date and sleep after the wait: 7-20 ms of skew
# measured here under a load of 11-13 on 2 cores, 181 ms once at 7-8, so its test spawns the
# parts SHELL_SPAWN_GAP_S apart and bounds the skew by half that: released together, not as spawned.
SHELL_SPAWN_GAP_S = 1.0
SHELL_SKEW_BOUND_MS = 1000.0  # half of the 2 s from the first spawn to the third


# -- which hosts -------------------------------------------------------------------------------


class Topo:
    def __init__(self, spread=None):
        self.spread = spread


@pytest.mark.parametrize("choice, study, expected", [
    (None, "saturation", ("a", "b", "c")),
    (None, "stacks", ("a", "b", "c")),
    (None, "polling", ()),  # other studies keep their load on the first initiator
    ("first", "saturation", ()),
    ("all", "polling", ("a", "b", "c")),
    (["c", "b"], "overhead", ("c", "b")),
    (["a"], "saturation", ()),  # the first initiator alone is no spread: same point, same key
    (["b"], "saturation", ("b",)),
])
def test_spread_hosts(choice, study, expected):
    assert spread.spread_hosts(Topo(choice), study, ["a", "b", "c"]) == expected


def test_a_single_initiator_never_spreads():
    assert spread.spread_hosts(Topo(None), "saturation", ["local"]) == ()
    assert spread.spread_hosts(Topo("all"), "stacks", ["lab-1"]) == ()


def test_spec_spread_is_checked_against_the_initiators():
    ssh = dict(kind="ssh", inventory="lab.toml", target="t", initiators=["a", "b"])
    assert Topology(**ssh, spread=["b", "a"]).spread == ["b", "a"]
    assert Topology(**ssh, spread="all").spread == "all"
    for bad, error in ((["a", "x"], "'x' is not one of the initiators (a, b)"), (["a", "a"], "listed twice"),
                       ([], "at least 1"), ("some", "Input should be 'all' or 'first'")):
        with pytest.raises(ValueError, match=error if "(" not in error else None) as info:
            Topology(**ssh, spread=bad)
        assert error in str(info.value)
    with pytest.raises(ValueError, match="none: a local topology has one"):
        Topology(spread=["lab-1"])


def test_unspread_points_keep_their_keys():
    from nvmflab.plan import PerfJob, Point

    def key(**extra):
        job = PerfJob(role="main", knobs={"iodepth": 1}, cpus=(1,), nqn="n", **extra)
        return Point(study="s", leg="l", knobs={"iodepth": 1}, repeat=0, jobs=[job], runtime=1, ramp_time=0).key

    assert key() == key(spread=())
    assert key(spread=("a", "b")) != key() and key(spread=("a", "b")) != key(spread=("a", "c"))


def test_part_cpus_keep_their_positions_on_each_host():
    assert spread.part_cpus((4, 5), [4, 5, 6], [0, 1]) == (0, 1)
    assert spread.part_cpus((6,), [4, 5, 6], [0, 1]) == (0,)  # wraps on a smaller host
    assert spread.part_cpus((1,), None, [0, 1]) == (1,)


# -- the barrier -------------------------------------------------------------------------------


def test_barrier_argv_per_load_generator():
    at = 1764216000.123456
    assert spread.barrier_argv(["/x/nvmf-perf", "run", "-a", "1.2.3.4"], at)[-2:] == ["--start-at", "1764216000.123456"]
    wrapped = spread.barrier_argv(["fio", "--name=x"], at)
    assert wrapped[:2] == ["sh", "-c"] and wrapped[-2:] == ["fio", "--name=x"] and wrapped[4] == "1764216000123456000"


def test_shell_barrier_waits_until_the_moment_then_runs_the_command(tmp_path):
    # 2 s ahead: a loaded machine may take a while to start the shell, which must still see the
    # moment ahead of it for the test to time its sleep rather than its start.
    at = time.time() + 2.0
    done = subprocess.run(spread.barrier_argv(["sh", "-c", 'date +%s%N > "$0"', str(tmp_path / "ran")], at),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    released = spread.released_ns({}, done.stderr)
    ran = int((tmp_path / "ran").read_text())
    assert released is not None and released >= int(at * 1e9)
    # woke within 500 ms of the moment (a quiet machine: a few ms; the rest is a loaded machine's
    # wake-up and the fork of `date`), not late by a misread fraction of a second
    assert released - int(at * 1e9) < 500e6
    assert ran >= released
    past = subprocess.run(spread.barrier_argv(["true"], time.time() - 5), capture_output=True, text=True, timeout=10)
    assert past.returncode == 0 and spread.released_ns({}, past.stderr) is not None  # a past moment: at once


def test_released_prefers_the_generators_own_record():
    assert spread.released_ns({"nvmflab": {"start": {"at_ns": 1, "released_ns": 7}}}, "") == 7
    assert spread.released_ns({}, "noise\nnvmflab-start released_ns=42\n") == 42
    assert spread.released_ns({"nvmflab": {"start": {"released_ns": "x"}}}, "garbage") is None


# -- the merge ---------------------------------------------------------------------------------


def report(iops: float, ios: int, histogram: list[list[int]], mean: float, usr: float = 1.0) -> dict:
    side = {"total_ios": ios, "iops": iops, "bw_bytes": iops * 4096, "clat_ns": {"mean": mean, "max": histogram[-1][0]}}
    return {"fio version": "nvmf-perf-x", "jobs": [{"read": side, "write": {"total_ios": 0}, "job_runtime": 2000,
                                                   "usr_cpu": usr, "sys_cpu": 2.0, "ctx": 3}],
            "nvmflab": {"engine": "tcp", "voluntary_ctx": 2, "involuntary_ctx": 1,
                        "histogram": {"read": histogram, "write": []},
                        "intervals": [{"t_ms": 1000, "iops": iops, "read_iops": iops, "write_iops": 0,
                                       "lat_p99_ns": histogram[-1][0]}],
                        "outages": []}}


def test_merged_report_adds_throughput_and_merges_histograms():
    parts = [report(1000, 2000, [[10_000, 1500], [50_000, 500]], 20_000),
             report(3000, 6000, [[10_000, 5900], [90_000, 100]], 11_333),
             report(500, 1000, [[20_000, 1000]], 20_000)]
    merged = summarize(spread.merge_reports(parts))
    alone = [summarize(p) for p in parts]
    for column in ("iops", "bw_bytes", "read_iops", "total_ios", "ctx", "voluntary_ctx", "involuntary_ctx"):
        assert merged[column] == sum(a[column] for a in alone), column
    assert json.loads(merged["histogram_json"]) == [[10_000, 7400], [20_000, 1000], [50_000, 500], [90_000, 100]]
    # the mean is over every I/O (weighted), not the mean of the three means
    assert merged["lat_mean_ns"] == pytest.approx((2000 * 20_000 + 6000 * 11_333 + 1000 * 20_000) / 9000)
    # p90 of all 9000 I/Os (rank 8100: 8400 lie at or below 20 us), neither the parts' mean p90
    # (26.7 us) nor their worst (50 us)
    assert [a["lat_p90_ns"] for a in alone] == [50_000, 10_000, 20_000]
    assert merged["lat_p90_ns"] == 20_000 and merged["lat_p99_ns"] == 90_000 and merged["lat_max_ns"] == 90_000
    interval = json.loads(merged["intervals_json"])[0]
    assert interval["iops"] == 4500 and interval["lat_p99_ns"] == 90_000


def test_merge_of_one_part_is_that_part():
    only = report(1, 1, [[1, 1]], 1)
    assert spread.merge_reports([only]) is only


def test_start_record_measures_the_skew():
    record = spread.start_record(10.0, {"a": 10_000_000_000, "b": 10_002_000_000, "c": 10_000_500_000})
    assert record["skew_ms"] == 2.0 and record["latest_after_at_ms"] == 2.0
    assert spread.start_record(10.0, {"a": 10_000_000_000, "b": None})["skew_ms"] is None  # unknown: not claimed


# -- for real: three initiators on the sshd bed ---------------------------------------------------

needs_bed = pytest.mark.skipif(sshbed.unavailable() is not None, reason=f"ssh test bed: {sshbed.unavailable()}")
needs_binaries = pytest.mark.skipif(not (BIN_DIR / "nvmf-target").exists() or not (BIN_DIR / "nvmf-perf").exists(),
                                    reason="needs target/release/nvmf-target and nvmf-perf (cargo build --release)")

SPEC = """
name = "spread"
study = "{study}"
repeats = 1
ramp_time = 0
runtime = 1.5
[workload]
rw = "randread"
[backend]
kind = "null"
[topology]
kind = "ssh"
inventory = "lab.toml"
target = "lab-0"
initiators = ["lab-1", "lab-2", "lab-3"]
target_cores = [0]
host_cores = [1]
{extra}
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if sshbed.unavailable():
        pytest.skip(sshbed.unavailable())
    with sshbed.SshBed(tmp_path_factory.mktemp("spreadbed"), count=4) as made:
        yield made


@needs_bed
@needs_binaries
def test_three_initiators_start_together_and_add_up(bed, tmp_path, monkeypatch):
    """A point whose load generator is spread over lab-1, lab-2 and lab-3 against one target on
    lab-0, run by the runner as a study runs it (which studies spread: the planning test below):
    every part ran on its host, all started within SKEW_BOUND_MS of each other, and the stored row
    is the sum of the parts."""
    from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
    from nvmflab.runner import Runner
    from nvmflab.stacks import get_stack
    from nvmflab.store import ResultsStore
    from nvmflab.topology.ssh import open_hosts

    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(BIN_DIR))
    (tmp_path / "lab.toml").write_text(bed.inventory_toml())
    hosts = open_hosts(Topology(kind="ssh", inventory="lab.toml", target="lab-0",
                                initiators=["lab-1", "lab-2", "lab-3"]), tmp_path)
    nqn = "nqn.2024-01.io.nvmflab:spread"
    setup = TargetSetup(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(Subsystem(nqn=nqn, backend="null", size=1 << 30),),
                        listen_ip=hosts.target.data_ip)
    knobs = dict(rw="randread", bs=4096, iodepth=4, numjobs=1, rwmixread=100, rate_iops=0, completion="event",
                 so_priority=0, tos=0, busy_poll_us=0, hdr_digest=False, data_digest=False)
    job = PerfJob(role="main", knobs=knobs, cpus=(1,), nqn=nqn, spread=("lab-1", "lab-2", "lab-3"))
    point = Point(study="spread", leg="three", knobs={"iodepth": 4}, repeat=0, jobs=[job], runtime=1.5,
                  ramp_time=0, target=setup)
    store = ResultsStore(tmp_path / "r")
    runner = Runner(store, store.start_run("spread", "", {}), get_stack("ours"), get_stack("ours"), hosts)
    started = time.monotonic()
    try:
        (outcome,) = runner.run([point], "spread")
    finally:
        runner.close()
        hosts.close()
    print(f"run: {time.monotonic() - started:.1f} s")
    assert outcome.status == "ok", outcome.error
    measured = store.measurements()
    assert len(measured) == 1  # one row: the role's, merged
    skews = []
    for _, row in measured.iterrows():
        raw = json.loads((tmp_path / "r" / "raw" / f"{row['point_key']}.json").read_text())
        record = raw["spread"]["main"]
        assert record["hosts"] == ["lab-1", "lab-2", "lab-3"]
        # each part ran on its own host: the load generator's copy there, the target's address
        assert sorted(raw["argv"]["main"]) == ["lab-1", "lab-2", "lab-3"]
        for argv in raw["argv"]["main"].values():
            assert argv[0].endswith("/nvmf-perf") and bed.ips[0] in argv
        start = record["start"]
        released = list(start["released_ns"].values())
        assert len(released) == 3 and all(ns is not None for ns in released)
        assert min(released) >= start["at_ns"] - 1_000_000  # nobody went before the moment
        assert start["skew_ms"] == (max(released) - min(released)) / 1e6 < SKEW_BOUND_MS, start
        skews.append(start["skew_ms"])
        parts = [summarize(p) for p in record["parts"].values()]
        assert all(p["iops"] > 0 for p in parts)
        for column in ("iops", "bw_bytes", "total_ios"):
            assert row[column] == pytest.approx(sum(p[column] for p in parts), rel=1e-9), column
        histogram = json.loads(row["histogram_json"])
        assert sum(c for _, c in histogram) == sum(p["total_ios"] for p in parts) == row["total_ios"]
        assert row["lat_p99_ns"] <= max(p["lat_p99_ns"] for p in parts)
        assert row["perf_usr_s"] > 0
        # the network's counters were read over SSH on every host of the point (issue 24 item 4):
        # each one's data interface is its veth on the bed, and it carried this point's traffic
        net = json.loads(row["net_json"])
        assert sorted(net) == ["lab-0", "lab-1", "lab-2", "lab-3"]
        for i, host in enumerate(["lab-0", "lab-1", "lab-2", "lab-3"]):
            assert net[host]["data_interface"] == f"nv{bed.tag}h{i}", net[host]
            veth = net[host]["interfaces"][net[host]["data_interface"]]
            assert veth["rx_bytes"] > 0 and veth["tx_bytes"] > 0
        # reads: each initiator received about its part's bytes, the target sent their sum
        for host, part in zip(["lab-1", "lab-2", "lab-3"], parts):
            assert net[host]["interfaces"][f"nv{bed.tag}h{host[-1]}"]["rx_bytes"] >= part["bw_bytes"] * 1.0
        assert net["lab-0"]["interfaces"][f"nv{bed.tag}h0"]["tx_bytes"] >= row["bw_bytes"] * 1.0
    print(f"start skew of three initiators: {', '.join(f'{s:.2f}' for s in skews)} ms")
    assert not [c for ns in bed.namespaces for c in bed.commands(ns) if c.startswith("nvmf-")]


@pytest.mark.parametrize("study, topology, spread_over", [
    ("stacks", "", ["lab-1", "lab-2", "lab-3"]),
    ("saturation", "", ["lab-1", "lab-2", "lab-3"]),
    ("stacks", 'spread = "first"', ["lab-1"]),
    ("polling", "", ["lab-1"]),
    ("polling", 'spread = ["lab-3", "lab-2"]', ["lab-3", "lab-2"]),
])
def test_studies_plan_their_load_on_the_initiators_they_spread_over(tmp_path, study, topology, spread_over):
    """The planning pass with three initiators (stand-ins on this machine; nothing runs): saturation
    and stacks put every load generator on all of them, other studies only when told."""
    from nvmflab.runner import PlanningRunner
    from nvmflab.session import _study, render_plan
    from nvmflab.spec import load_spec
    from nvmflab.stacks import get_stack
    from nvmflab.store import ResultsStore
    from nvmflab.studies.common import Context
    from nvmflab.studies import study_params
    from nvmflab.topology.base import Hosts
    from nvmflab.topology.local import LocalHost

    params = {"stacks": 'targets = ["ours"]\nhosts = ["ours"]\nbaseline = "ours/ours"\niodepth = [4]\n',
              "saturation": 'resources = ["initiator"]\nnumjobs = [1]\niodepth = [4]\ntarget_core_counts = []\n',
              "polling": ""}[study]
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(study=study, extra=topology + "\n[params]\n" + params))
    spec = load_spec(path)
    hosts = Hosts(LocalHost(name="lab-0", workdir=tmp_path), [LocalHost(name=f"lab-{i}", workdir=tmp_path)
                                                            for i in (1, 2, 3)])
    with ResultsStore(tmp_path / "r") as store:
        planner = PlanningRunner(store, get_stack("ours"), get_stack("ours"), hosts)
        _study(Context(spec=spec, study=study, runner=planner, store=store), study_params(study, spec.params))
        plan = render_plan(planner)
    tcp = [job for _, point in planner.planned if not point.skip_reason for job in point.jobs if job.nqn]
    assert tcp, plan
    for job in tcp:
        assert [part.host or "lab-1" for part in planner.parts(job)] == spread_over
    lines = [line for line in plan.splitlines() if "nvmf-perf run" in line]
    assert {line.split("]")[0].strip(" [") for line in lines} == set(spread_over)
    assert ("hosts at once" in plan) == (len(spread_over) > 1)


@needs_bed
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed")
def test_shell_barrier_starts_fio_on_three_hosts_together(bed, tmp_path):
    """The barrier the kernel host's fio (and spdk_nvme_perf) gets, over SSH on three hosts: fio
    with the null engine, spawned SHELL_SPAWN_GAP_S apart (2 s from first to last), released within
    SHELL_SKEW_BOUND_MS (half of that) of each other."""
    from nvmflab.topology.inventory import load_inventory
    from nvmflab.topology.ssh import SshHost

    (tmp_path / "lab.toml").write_text(bed.inventory_toml())
    hosts = [SshHost(entry) for name, entry in sorted(load_inventory(tmp_path / "lab.toml").items())
             if name != "lab-0"]
    fio = ["fio", "--name=spread", "--ioengine=null", "--size=1m", "--rw=randread", "--runtime=0.3",
           "--time_based", "--output-format=json"]
    try:
        for host in hosts:
            host.connect()
        at = spread.start_moment(len(hosts)) + SHELL_SPAWN_GAP_S * (len(hosts) - 1)
        running = []
        for i, host in enumerate(hosts):
            if i:
                time.sleep(SHELL_SPAWN_GAP_S)
            running.append((host, host.spawn(spread.barrier_argv(fio, at), None, tmp_path / f"{host.name}.log",
                                             tmp_path / f"{host.name}.json")))
        for host, proc in running:
            code, *_ = proc.wait(30)
            assert code == 0, (tmp_path / f"{host.name}.log").read_text()
            assert json.loads((tmp_path / f"{host.name}.json").read_text())["jobs"][0]["read"]["total_ios"] > 0
    finally:
        for host in hosts:
            host.close()
    released = [spread.released_ns({}, (tmp_path / f"{host.name}.log").read_text()) for host in hosts]
    record = spread.start_record(at, dict(zip([h.name for h in hosts], released)))
    print(f"shell barrier, three hosts: skew {record['skew_ms']:.2f} ms, "
          f"latest {record['latest_after_at_ms']:.2f} ms after the moment")
    assert min(released) >= record["at_ns"]
    assert record["skew_ms"] < SHELL_SKEW_BOUND_MS
