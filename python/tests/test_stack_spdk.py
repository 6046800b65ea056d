"""The spdk stack without SPDK: report parsing (real captured spdk_nvme_perf output), the histogram
conversion, knob mapping and refusals, command lines, RPC calls and the stats conversion."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from nvmflab.metrics import summarize
from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.spec import Knobs
from nvmflab.stacks import StackError, get_stack
from nvmflab.stacks.base import KNOB_SIDES
from nvmflab.stacks.spdk import (HOST_KNOBS, TARGET_KNOBS, TIMES_MARK, memory_args, parse_json_stream,
                                 parse_perf_text, perf_args, rpc_error, stats_from_rpc, target_rpcs, wrap_output)
from nvmflab.topology.local import LocalHost

DATA = Path(__file__).resolve().parent / "data"
# Captured from SPDK v24.01 on loopback against nvmf_tgt, through SpdkSession.perf_argv (so with the
# `times` trailer): randrw 70 % reads, QD 8, 4 KiB, one core, digests on; randread on two cores, -P 2.
RANDRW = (DATA / "spdk_nvme_perf_randrw_1core.txt").read_text()
RANDREAD2 = (DATA / "spdk_nvme_perf_randread_2cores.txt").read_text()
DEFAULTS = Knobs().model_dump()
NQN = "nqn.2024-01.io.nvmflab:s0"


def job(**knobs) -> PerfJob:
    base = dict(rw="randread", bs=4096, iodepth=8, numjobs=1, rwmixread=50, rate_iops=0, size=None,
                completion="poll", hdr_digest=False, data_digest=False, so_priority=0, tos=0, busy_poll_us=0,
                io_queues=None)
    cpus, nqn = knobs.pop("cpus", (1,)), knobs.pop("nqn", NQN)
    return PerfJob(role="main", knobs=base | knobs, cpus=cpus, nqn=nqn)


def setup(**fields) -> TargetSetup:
    base = dict(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                busy_poll_us=0, subsystems=(Subsystem(NQN, "null", 64 << 20),))
    return TargetSetup(**(base | fields))


def spdk_summary(text: str) -> dict[float, int]:
    """SPDK's own percentile lines ("50.00000% : 24.911us") of the first core, in ns."""
    block = text.split("Summary latency data", 1)[1].split("Latency histogram", 1)[0]
    return {float(p): round(float(us) * 1000) for p, us in re.findall(r"([\d.]+)% :\s+([\d.]+)us", block)}


# -- parsing ----------------------------------------------------------------------------------------

def test_randrw_report_totals_split_and_cpu():
    perf = parse_perf_text(RANDRW, "randrw", 70, 4096, runtime=2, ramp_time=1)
    row = summarize(perf)
    assert row["iops"] == pytest.approx(145524.0)
    assert row["read_iops"] == pytest.approx(0.7 * 145524.0)
    assert row["write_iops"] == pytest.approx(0.3 * 145524.0)
    assert row["lat_mean_ns"] == pytest.approx(54950.0)
    assert row["lat_max_ns"] == pytest.approx(46975210.0)
    assert row["bw_bytes"] == pytest.approx(568.45 * (1 << 20), rel=1e-3)
    assert perf["nvmflab"]["direction_split"] == "rwmixread"
    # `times` trailer: children's user and system seconds over runtime + ramp.
    usr, sys = perf["nvmflab"]["cpu_seconds"]
    assert perf["jobs"][0]["usr_cpu"] == pytest.approx(100 * usr / 3)
    assert perf["jobs"][0]["sys_cpu"] == pytest.approx(100 * sys / 3)
    assert usr > 0 and sys > 0


def test_histogram_percentiles_match_spdk_own_summary():
    perf = parse_perf_text(RANDRW, "randrw", 70, 4096, runtime=2)
    row = summarize(perf)
    theirs = spdk_summary(RANDRW)
    assert len(theirs) >= 10
    ours = {50.0: row["lat_p50_ns"], 90.0: row["lat_p90_ns"], 99.0: row["lat_p99_ns"], 99.9: row["lat_p99_9_ns"],
            99.99: row["lat_p99_99_ns"]}
    for pct, value in ours.items():
        assert value == pytest.approx(theirs[pct], abs=1), pct
    fio = perf["jobs"][0]["read"]["clat_ns"]["percentile"]
    assert fio["50.000000"] == pytest.approx(theirs[50.0], abs=1)
    assert fio["99.900000"] == pytest.approx(theirs[99.9], abs=1)


def test_histogram_counts_every_io():
    perf = parse_perf_text(RANDRW, "randrw", 70, 4096, runtime=2)
    hist = perf["nvmflab"]["histogram"]["read"]
    counts = sum(int(c) for c in re.findall(r"\(\s*(\d+)\)\s*$", RANDRW, re.M))
    assert sum(c for _, c in hist) == counts
    assert [v for v, _ in hist] == sorted({v for v, _ in hist})  # sorted, no duplicates
    assert abs(counts - 145524 * 2) / (145524 * 2) < 0.01  # the histogram covers the measured time


def test_two_cores_rows_merge():
    perf = parse_perf_text(RANDREAD2, "randread", 50, 4096, runtime=2)
    assert [d["iops"] for d in perf["nvmflab"]["devices"]] == [669.50, 39716.32]
    row = summarize(perf)
    assert row["iops"] == pytest.approx(40385.82) and row["write_iops"] == 0
    assert perf["nvmflab"]["direction_split"] == "exact"
    counts = sum(int(c) for c in re.findall(r"\(\s*(\d+)\)\s*$", RANDREAD2, re.M))
    assert row["total_ios"] == counts  # both cores' histograms added, not averaged
    assert perf["jobs"][0]["write"]["total_ios"] == 0


@pytest.mark.parametrize("text, message", [
    ("", "no result table"),
    ("Initializing NVMe Controllers\nspdk_nvme_perf: connect failed\n", "no result table"),
    ("Device Information : IOPS\nTCP core 1: lots of IOPS\nTotal : 1 2 3 4 5\n", "unreadable result row"),
    ("Device Information\nTCP core 1:  10.0  1.0  5.0  1.0  9.0\nTotal :  10.0  1.0  5.0  1.0  9.0\n",
     "no latency histogram"),
])
def test_bad_reports_are_one_line_errors(text, message):
    with pytest.raises(StackError, match=message) as err:
        parse_perf_text(text, "randread", 50, 4096, runtime=1)
    assert "\n" not in str(err.value)


def test_truncated_and_oversized_reports():
    with pytest.raises(StackError, match="no result table"):
        parse_perf_text(RANDRW[: RANDRW.index("Total")], "randrw", 70, 4096, runtime=2)
    with pytest.raises(StackError, match="more than"):
        parse_perf_text("x" * (9 << 20), "randread", 50, 4096, runtime=1)


def test_rpc_output_helpers():
    assert parse_json_stream('{"a": 1}\n[2]\n{"b": {}}', 3) == [{"a": 1}, [2], {"b": {}}]
    with pytest.raises(StackError, match="answer 2 of 2"):
        parse_json_stream('{"a": 1}\nNull0\n', 2)
    stderr = 'request:\n{"method": "x"}\nGot JSON-RPC error response\nresponse:\n{"code": -17, "message": "File exists"}'
    assert rpc_error(stderr) == "File exists"
    assert rpc_error("") == "(no output)"


# -- knobs ------------------------------------------------------------------------------------------

def test_every_knob_is_mapped_or_deliberately_missing():
    target_side = {k for k, sides in KNOB_SIDES.items() if "target" in sides}
    host_side = {k for k, sides in KNOB_SIDES.items() if "host" in sides}
    assert target_side - set(TARGET_KNOBS) == {"tos", "idle_poll_us", "dhchap", "tcp_congestion"}
    assert host_side - set(HOST_KNOBS) == {"so_priority", "tos", "busy_poll_us", "dhchap", "sqflow", "tcp_congestion"}


@pytest.mark.parametrize("side, knobs, message", [
    ("target", {"target_mode": "event"}, "always busy-poll"),
    ("target", {"tos": 16}, "no such setting"),
    ("target", {"idle_poll_us": 50}, "no such setting"),
    ("host", {"completion": "event"}, "always polls"),
    ("host", {"so_priority": 3}, "no such setting"),
    ("host", {"busy_poll_us": 50}, "no such setting"),
    ("host", {"sqflow": "off"}, "no such setting"),
    ("target", {"tcp_congestion": "cubic"}, "no such setting"),
    ("host", {"tcp_congestion": "cubic"}, "no such setting"),
])
def test_refusals_name_knob_and_stack(side, knobs, message):
    with pytest.raises(StackError, match=message) as err:
        get_stack("spdk").check_knobs(knobs, side, DEFAULTS)
    assert list(knobs)[0] in str(err.value) and "spdk" in str(err.value)


def test_accepted_knobs():
    stack = get_stack("spdk")
    stack.check_knobs({"target_mode": "poll", "so_priority": 3, "busy_poll_us": 50, "in_capsule_data_size": 4096,
                       "hdr_digest": True, "data_digest": True, "tos": 0}, "target", DEFAULTS)
    stack.check_knobs({"completion": "poll", "io_queues": 4, "hdr_digest": True, "data_digest": True}, "host",
                      DEFAULTS)
    assert stack.fixed_defaults("target") == {"target_mode": "poll"}
    assert stack.fixed_defaults("host") == {"completion": "poll"}


# -- command lines and RPC calls --------------------------------------------------------------------

def test_perf_args():
    argv = perf_args(job(rw="randrw", rwmixread=70, numjobs=2, io_queues=4, hdr_digest=True, data_digest=True,
                         cpus=(2, 3, 5)), "127.0.0.1", 4420, 10, 2)
    assert argv[:2] == ["-r", f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:{NQN}"]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["-c"] == "0xc" and pairs["-q"] == "8" and pairs["-o"] == "4096" and pairs["-w"] == "randrw"
    assert pairs["-t"] == "10" and argv[argv.index("-P") + 1] == "2"  # the registry's setters add -P, -H, -I
    assert argv[argv.index("-a") + 1] == "2" and argv[argv.index("-M") + 1] == "70"
    assert {"-H", "-I", "-LL"} <= set(argv)
    plain = perf_args(job(), "10.0.0.1", 4421, 5, 0)
    assert "-M" not in plain and "-a" not in plain and "-H" not in plain and plain[plain.index("-P") + 1] == "1"


@pytest.mark.parametrize("kw, runtime, message", [
    ({"rate_iops": 1000}, 5, "no rate limit"),
    ({"size": 1 << 20}, 5, "whole namespace"),
    ({"verify": True}, 5, "does not verify"),
    ({"numjobs": 2, "cpus": (1,)}, 5, "one job per core"),
    ({"numjobs": 2, "io_queues": 3, "cpus": (0, 1)}, 5, "same number of queue pairs"),
    ({}, 0.5, "whole seconds"),
])
def test_perf_args_refusals(kw, runtime, message):
    with pytest.raises(StackError, match=message):
        perf_args(job(**kw), "127.0.0.1", 4420, runtime, 0)


def test_local_jobs_are_refused(tmp_path):
    local = PerfJob(role="main", knobs=job().knobs, cpus=(0,), local_path="/dev/null")
    with pytest.raises(StackError, match="cannot drive a file"):
        get_stack("spdk").open_host(local, None, LocalHost(workdir=tmp_path), tmp_path)


def test_wrap_output_writes_report_and_times(tmp_path):
    out = tmp_path / "report.txt"
    done = subprocess.run(wrap_output(["sh", "-c", "echo hello; exit 3"], str(out)), timeout=20)
    assert done.returncode == 3  # the tool's exit status survives the wrapper
    lines = out.read_text().splitlines()
    assert lines[0] == "hello" and lines[1] == TIMES_MARK and len(lines) == 4


def test_target_rpcs():
    subs = (Subsystem(NQN, "null", 64 << 20, block_size=4096), Subsystem("nqn.x:ram", "ram", 32 << 20),
            Subsystem("nqn.x:file", "file", 0, path="/tmp/disk.img"))
    calls = target_rpcs(setup(subsystems=subs, in_capsule_data_size=4096, so_priority=2, busy_poll_us=50), 4420)
    assert calls[0] == ["sock_impl_set_options", "-i", "posix", "--enable-placement-id", "1"]
    assert calls[1:3] == [["framework_start_init"], ["framework_wait_init"]]
    transport = calls[3]  # the registry's setters add -y and -c
    assert transport[:3] == ["nvmf_create_transport", "-t", "tcp"]
    assert dict(zip(transport[3::2], transport[4::2])) == {"-u": "131072", "-c": "4096", "-y": "2"}
    assert ["bdev_null_create", "nvmflab0", "64", "4096"] in calls
    assert ["bdev_malloc_create", "-b", "nvmflab1", "32", "512"] in calls
    assert ["bdev_aio_create", "/tmp/disk.img", "nvmflab2", "512"] in calls
    assert ["nvmf_subsystem_add_listener", NQN, "-t", "tcp", "-f", "ipv4", "-a", "127.0.0.1", "-s", "4420"] in calls
    assert target_rpcs(setup(), 4420)[0] == ["framework_start_init"]  # no placement id without busy polling


@pytest.mark.parametrize("fields, message", [
    ({"subsystems": (Subsystem(NQN, "null", 1000),)}, "whole MiB"),
    ({"in_capsule_data_size": 100}, "multiple of 16"),
    ({"in_capsule_data_size": 1 << 20}, "multiple of 16"),
])
def test_target_rpcs_refusals(fields, message):
    with pytest.raises(StackError, match=message):
        target_rpcs(setup(**fields), 4420)


class MeminfoHost(LocalHost):
    def __init__(self, meminfo: str, tmp: Path):
        super().__init__(workdir=tmp)
        self.meminfo = meminfo

    def read_text(self, path: str) -> str:
        assert path == "/proc/meminfo"
        return self.meminfo


def test_memory_args_follow_free_hugepages(tmp_path):
    none = MeminfoHost("HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n", tmp_path)
    plenty = MeminfoHost("HugePages_Free:     1024\nHugepagesize:       2048 kB\n", tmp_path)
    assert memory_args(none, 1024) == ["--no-huge", "-s", "1024"]
    assert memory_args(plenty, 1024) == ["-s", "1024"]
    assert memory_args(plenty, 4096) == ["--no-huge", "-s", "4096"]


def test_plan_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(tmp_path / "nowhere"))
    stack, host = get_stack("spdk"), LocalHost(workdir=tmp_path)
    lines = stack.plan_target(setup(cores=(1, 2)), host)
    assert "nvmf_tgt -m 0x6" in lines[0] and "--wait-for-rpc" in lines[0]
    assert any("nvmf_subsystem_add_ns" in line for line in lines)
    [perf] = stack.plan_host(job(), "127.0.0.1", 4420, host)
    assert "spdk_nvme_perf" in perf and "-LL" in perf


def test_unavailable_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(tmp_path))
    reason = get_stack("spdk").unavailable(LocalHost(workdir=tmp_path), "target")
    assert reason and "make spdk" in reason and "NVMFLAB_SPDK_DIR" in reason


# -- stats ------------------------------------------------------------------------------------------

def test_stats_conversion():
    reactors = {"tick_rate": 2_000_000_000, "reactors": [
        {"lcore": 3, "busy": 4_000_000_000, "idle": 2_000_000_000,
         "lw_threads": [{"name": "app_thread", "id": 1}, {"name": "nvmf_tgt_poll_group_0", "id": 2}]},
        {"lcore": 5, "busy": 10, "idle": 20, "lw_threads": [{"name": "nvmf_tgt_poll_group_1", "id": 3}]}]}
    threads = {"tick_rate": 2_000_000_000, "threads": [
        {"name": "app_thread", "id": 1, "busy": 1, "idle": 1},
        {"name": "nvmf_tgt_poll_group_0", "id": 2, "busy": 2_000_000_000, "idle": 0},
        {"name": "nvmf_tgt_poll_group_1", "id": 3, "busy": 0, "idle": 0}]}
    nvmf = {"tick_rate": 2_000_000_000, "poll_groups": [
        {"name": "nvmf_tgt_poll_group_0", "completed_nvme_io": 120, "io_qpairs": 1},
        {"name": "nvmf_tgt_poll_group_1", "completed_nvme_io": 7, "io_qpairs": 1}]}
    iostat = {"channels": [{"thread_id": 2, "num_read_ops": 100, "num_write_ops": 20, "bytes_read": 409600,
                            "bytes_written": 81920}, {"thread_id": 3, "num_read_ops": 7}]}
    stats = stats_from_rpc(reactors, threads, nvmf, [(NQN, iostat)])
    first, second = stats["reactors"]
    assert (first["index"], first["core"], first["busy_ns"], first["idle_ns"]) == (0, 3, 2_000_000_000, 1_000_000_000)
    assert first["commands"] == 120 and first["bytes_read"] == 409600 and first["bytes_written"] == 81920
    assert first["namespaces"] == [{"subnqn": NQN, "nsid": 1, "commands": 120, "reads": 100, "writes": 20, "other": 0,
                                    "bytes_read": 409600, "bytes_written": 81920}]
    assert second["core"] == 5 and second["namespaces"][0]["commands"] == 7
    assert [g["name"] for g in stats["poll_groups"]] == ["nvmf_tgt_poll_group_0", "nvmf_tgt_poll_group_1"]
    assert stats["poll_groups"][0]["busy_ns"] == 1_000_000_000
    with pytest.raises(StackError, match="tick"):
        stats_from_rpc({"reactors": [{"busy": 1}]}, {}, {}, [])
