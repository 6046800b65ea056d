"""Noise per point (sysstat.py): /proc parsing and the outside-CPU arithmetic on synthetic /proc
contents, the runner re-running a point a pinned busy loop made noisy, the report's mark, the
overhead study's softirq note, and `nvmflab env`'s warnings."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import nvmflab
from test_analysis_fixtures import overhead_measurements, runs_frame

from nvmflab import sysstat
from nvmflab.analysis import overhead
from nvmflab.cores import available_cores
from nvmflab.store import SCHEMA, ResultsStore

PROC_STAT = """cpu  {all}
cpu0 {c0}
cpu1 {c1}
intr 12345 0 0
ctxt 999
btime 1700000000
"""


def stat_text(c0: list[int], c1: list[int]) -> str:
    total = [a + b for a, b in zip(c0, c1)]
    return PROC_STAT.format(all=" ".join(map(str, total)), c0=" ".join(map(str, c0)), c1=" ".join(map(str, c1)))


def kthread_line(pid: int, comm: str, flags: int, utime: int, stime: int, cpu: int) -> str:
    # fields 3.. of /proc/PID/stat: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss rsslim ... processor (39)
    rest = ["S", "2", "0", "0", "0", "-1", str(flags), "0", "0", "0", "0", str(utime), str(stime)]
    rest += ["0"] * (36 - len(rest)) + [str(cpu), "0", "0"]
    return f"{pid} ({comm}) " + " ".join(rest)


def test_parse_proc_stat_per_core_and_short_lines():
    parsed = sysstat.parse_proc_stat(stat_text([10, 1, 5, 100, 2, 0, 3, 4, 0, 0], [20, 0, 6, 90, 0, 1, 7, 0, 0, 0]))
    assert set(parsed) == {"cpu", "cpu0", "cpu1"}
    assert parsed["cpu0"]["user"] == 10 and parsed["cpu0"]["softirq"] == 3 and parsed["cpu0"]["steal"] == 4
    assert parsed["cpu"]["system"] == 11 and parsed["cpu1"]["irq"] == 1
    # old kernels list fewer fields: the missing ones read 0
    assert sysstat.parse_proc_stat("cpu0 1 2 3 4\n")["cpu0"] == dict(zip(sysstat.CPU_FIELDS, [1, 2, 3, 4] + [0] * 6))


def test_parse_kthreads_keeps_kernel_threads_only_and_survives_odd_names():
    text = "\n".join([
        kthread_line(15, "ksoftirqd/1", sysstat.PF_KTHREAD | 0x40, 3, 40, 1),
        kthread_line(300, "my (odd) prog", 0x400000, 500, 20, 1),  # a user process: left out
        kthread_line(77, "kworker/u4:2-nvmet_tcp_wq", sysstat.PF_KTHREAD, 0, 12, 0),
        "garbage line",
    ])
    assert sysstat.parse_kthreads(text) == {15: (1, 43), 77: (0, 12)}


def snap(c0, c1, kthreads=None, at=0.0, self_cpu=0.0, governors=None, throttle=None,
         congestion=None) -> sysstat.Snapshot:
    return sysstat.Snapshot(sysstat.parse_proc_stat(stat_text(c0, c1)), kthreads or {}, governors or {},
                            throttle or {}, 100, at, self_cpu, congestion)


Z = [0] * 10


def test_outside_cpu_is_busy_time_minus_experiment_minus_kernel_threads():
    # 1 s window. core 1 (the experiment's): user+nice 70 + 10, system 50, softirq 30 (not counted),
    # steal 5; kernel threads on it 20 ticks; the experiment's processes 0.7 s, the harness 0.05 s.
    before = snap(Z, Z, kthreads={15: (1, 100)}, at=10.0, self_cpu=1.0)
    after = snap([90, 0, 10, 0, 0, 0, 0, 0, 0, 0], [70, 10, 50, 0, 0, 0, 30, 5, 0, 0],
                 kthreads={15: (1, 110), 99: (1, 10), 5: (0, 7)}, at=11.0, self_cpu=1.05)
    win = sysstat.window(before, after, [1], experiment_cpu_s=0.7)
    # (0.8 + 0.5) busy − 0.2 kernel threads − (0.7 + 0.05) experiment = 0.35 s outside
    assert win.outside_s == pytest.approx(0.35)
    assert win.kernel_threads_s == pytest.approx(0.2)
    assert win.steal_s == pytest.approx(0.05) and win.wall_s == pytest.approx(1.0)
    assert win.cores[1] == pytest.approx({"user_s": 0.8, "system_s": 0.5, "irq_s": 0.0, "softirq_s": 0.3,
                                          "idle_s": 0.0, "iowait_s": 0.0, "steal_s": 0.05})
    # machine-wide: core 0 adds 1.0 busy and 0.07 of kernel threads
    assert win.outside_all_s == pytest.approx(0.35 + 1.0 - 0.07)
    row = sysstat.summarize({"local": win}, limit_pct=10.0, roles={"local": {"main": [1]}})
    # (0.35 outside + 0.05 steal) / (1 s × 1 core) = 40 %
    assert row["noise_pct"] == pytest.approx(40.0) and row["noisy"] is True
    assert row["outside_cpu_s"] == pytest.approx(0.35) and row["steal_s"] == pytest.approx(0.05)
    detail = json.loads(row["cpu_cores_json"])["local"]
    assert detail["roles"] == {"main": [1]} and detail["cores"]["1"]["softirq_s"] == pytest.approx(0.3)


def test_outside_cpu_never_negative_and_quiet_points_are_not_noisy():
    before, after = snap(Z, Z, at=0.0), snap(Z, [20, 0, 10, 70, 0, 0, 0, 0, 0, 0], at=1.0)
    win = sysstat.window(before, after, [1], experiment_cpu_s=0.45)  # rusage is exact, ticks are sampled
    assert win.outside_s == 0.0
    row = sysstat.summarize({"local": win}, limit_pct=10.0)
    assert row["noise_pct"] == 0.0 and row["noisy"] is False and row["throttle_events"] is None
    assert sysstat.summarize({"local": win}, limit_pct=None)["noisy"] is None  # limit off: recorded, unjudged


def test_noise_is_shared_over_the_cores_of_every_machine_and_throttling_is_noisy():
    quiet_b, quiet_a = snap(Z, Z, at=0.0, throttle={0: 5}), snap(Z, Z, at=2.0, throttle={0: 6})
    busy_b, busy_a = snap(Z, Z, at=0.0), snap([100, 0, 0, 0, 0, 0, 0, 0, 0, 0], Z, at=2.0)
    windows = {"a": sysstat.window(quiet_b, quiet_a, [0, 1], 0.0), "b": sysstat.window(busy_b, busy_a, [0], 0.0)}
    row = sysstat.summarize(windows, limit_pct=50.0)
    # 1 s outside over 2 s × 3 cores
    assert row["noise_pct"] == pytest.approx(100 / 6, abs=0.01)
    assert row["throttle_events"] == 1 and row["noisy"] is True


def test_governor_text_and_limit_from_the_environment(monkeypatch):
    assert sysstat.governor_text({}) is None
    assert sysstat.governor_text({0: "performance", 1: "performance"}) == "performance"
    assert sysstat.governor_text({0: "powersave", 1: "performance", 2: "powersave"}) == "powersave ×2, performance ×1"
    monkeypatch.setenv(sysstat.LIMIT_ENV, "off")
    assert sysstat.noise_limit() is None
    monkeypatch.setenv(sysstat.LIMIT_ENV, "12.5")
    assert sysstat.noise_limit() == 12.5
    monkeypatch.delenv(sysstat.LIMIT_ENV)
    assert sysstat.noise_limit() == sysstat.NOISE_LIMIT_PCT


class FakeRemote:
    """A remote host answering every command with `script_out`; it counts the round trips."""
    name, remote = "web1", True

    def __init__(self, script_out: str):
        self.script_out, self.argv, self.calls = script_out, None, 0

    def run(self, argv, timeout=60.0, check=True, input=None):
        self.argv, self.calls = argv, self.calls + 1
        return subprocess.CompletedProcess(argv, 0, self.script_out, "")


def test_remote_snapshot_reads_through_the_host_interface():
    out = "\n".join(["## tck", "250", "## stat", stat_text([1] * 10, [2] * 10),
                     "## kthreads", kthread_line(15, "ksoftirqd/1", sysstat.PF_KTHREAD, 1, 2, 1),
                     "## governor", "cpu0 schedutil", "cpu1", "## throttle", "cpu0 3", "cpu1",
                     "## tcp_congestion", "cubic"])
    host = FakeRemote(out)
    shot = sysstat.snapshot(host, [0, 1])
    assert host.calls == 1  # one round trip: /proc/stat comes with the rest
    assert shot.clk_tck == 250 and shot.kthreads == {15: (1, 3)}
    assert shot.governors == {0: "schedutil"} and shot.throttle == {0: 3} and shot.tcp_congestion == "cubic"
    assert shot.stat["cpu1"]["user"] == 2 and "for c in 0 1" in host.argv[-1]
    assert sysstat.machine_key(host) == "web1"


def test_each_point_records_every_machines_congestion_control():
    here = sysstat.local_snapshot([0])
    assert here.tcp_congestion == Path(sysstat.CONGESTION).read_text().strip()
    windows = {"local": sysstat.window(snap(Z, Z, congestion="bbr"), snap(Z, Z, at=1.0, congestion="bbr"), [0], 0.0),
               "web1": sysstat.window(snap(Z, Z), snap(Z, Z, at=1.0, congestion="cubic"), [0], 0.0)}
    detail = json.loads(sysstat.summarize(windows, limit_pct=None)["cpu_cores_json"])
    assert (detail["local"]["tcp_congestion"], detail["web1"]["tcp_congestion"]) == ("bbr", "cubic")


def test_a_pacing_congestion_control_is_named_in_the_env_warnings(monkeypatch):
    for congestion, warned in (("bbr", True), ("cubic", False), (None, False)):
        shots = iter([snap(Z, Z, at=0.0, congestion=congestion), snap(Z, Z, at=0.5, congestion=congestion)])
        monkeypatch.setattr(sysstat, "local_snapshot", lambda cores, shots=shots: next(shots))
        text = " ".join(sysstat.machine_warnings(sample_s=0))
        assert ("TCP congestion control is bbr: the kernel paces every socket" in text) == warned, congestion


def test_env_warnings_from_synthetic_snapshots(monkeypatch):
    shots = iter([snap([0] * 7 + [50, 0, 0], Z, at=0.0, governors={0: "powersave", 1: "powersave"}),
                  snap([40, 0, 10, 0, 0, 0, 0, 50, 0, 0], Z, at=0.5, governors={0: "powersave", 1: "powersave"})])
    monkeypatch.setattr(sysstat, "local_snapshot", lambda cores: next(shots))
    warnings = sysstat.machine_warnings(cores_wanted=4, sample_s=0)
    text = " ".join(warnings)
    assert "governor is powersave, not performance" in text
    assert "steal time since boot is 100.00 %" in text
    assert "other processes used 100 % of a core" in text and "cpu0 100 %" in text
    assert "2 cores here; the full studies want 4" in text


def test_a_store_made_before_the_noise_columns_gains_them(tmp_path):
    old = SCHEMA.replace("    intervals_json TEXT,\n    outside_cpu_s REAL, steal_s REAL, noise_pct REAL, noisy INTEGER, "
                         "noise_tries INTEGER,\n    cpu_governor TEXT, throttle_events INTEGER, cpu_cores_json TEXT\n",
                         "    intervals_json TEXT\n")
    assert old != SCHEMA
    db = sqlite3.connect(tmp_path / "results.sqlite")
    db.executescript(old)
    db.close()
    with ResultsStore(tmp_path) as store:
        run_id = store.start_run("s", "", {})
        store.save_point(run_id, "k", "s", "sweep", {}, 0, "ok", None,
                         [{"role": "main", "iops": 1.0, "noisy": True, "noise_pct": 12.0}])
        frame = store.measurements()
    assert frame.at[0, "noisy"] is True and frame.at[0, "noise_pct"] == 12.0
    start = list(frame.columns).index("outside_cpu_s")  # later columns (energy, network) come after them
    assert list(frame.columns[start - 1:start + 8]) == ["intervals_json", "outside_cpu_s", "steal_s", "noise_pct",
                                                        "noisy", "noise_tries", "cpu_governor", "throttle_events",
                                                        "cpu_cores_json"]


# -- the runner ----------------------------------------------------------------------------------

ONE_CORE_SPEC = """
repeats = 1
ramp_time = 0
runtime = 0.3
[topology]
target_cores = [0]
host_cores = [0]
"""


def busy_loop(core: int) -> subprocess.Popen:
    """A spinning process pinned to `core`, outside the experiment; the caller kills it."""
    return subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_runs(tmp_path) -> int:
    log = tmp_path / "perf.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_busy_loop_beside_the_point_makes_it_noisy_rerun_and_marked(tmp_path, fake_env):
    spec = tmp_path / "one.toml"
    spec.write_text(ONE_CORE_SPEC)
    core = available_cores()[0]  # where topology core 0 lands on this machine
    loop = busy_loop(core)
    try:
        done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"),
                       env=fake_env | {sysstat.LIMIT_ENV: "5"}, timeout=120)
    finally:
        loop.send_signal(signal.SIGKILL)
        loop.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    row = frame.iloc[0]
    assert row["status"] == "ok" and row["noisy"] is True
    assert row["noise_tries"] == 1 + sysstat.NOISE_RETRIES and perf_runs(tmp_path) == 1 + sysstat.NOISE_RETRIES
    assert row["outside_cpu_s"] > 0 and row["noise_pct"] > 5
    detail = json.loads(row["cpu_cores_json"])["local"]
    assert detail["involved"] == [core] and detail["roles"] == {"main": [core], "target": [core]}
    raw = json.loads((tmp_path / "r" / "raw" / f"{row['point_key']}.json").read_text())
    assert len(raw["noisy_tries"]) == sysstat.NOISE_RETRIES and raw["noise"]["noisy"] is True
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert "marked noisy (kept in the analysis" in html and "stayed noisy after their re-runs" in html


def test_a_point_under_the_limit_runs_once_with_its_noise_recorded(tmp_path, fake_env):
    spec = tmp_path / "one.toml"
    spec.write_text(ONE_CORE_SPEC)
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=fake_env | {sysstat.LIMIT_ENV: "1000"})
    assert done.returncode == 0, done.stderr
    row = ResultsStore(tmp_path / "r").measurements().iloc[0]
    assert row["noisy"] is False and row["noise_tries"] == 1 and perf_runs(tmp_path) == 1
    local = json.loads(row["cpu_cores_json"])["local"]
    cores = local["cores"]
    assert {"user_s", "system_s", "softirq_s", "idle_s"} <= set(next(iter(cores.values())))
    # noise_pct is the documented formula over the stored window: 100 × (outside + steal) / (wall × cores)
    involved = [str(c) for c in local["involved"]]
    assert involved and local["wall_s"] > 0
    assert row["outside_cpu_s"] == pytest.approx(local["outside_s"], abs=1e-3)
    assert row["steal_s"] == pytest.approx(sum(cores[c]["steal_s"] for c in involved), abs=1e-3 * len(involved))
    rounding = 100 * 2e-3 / (local["wall_s"] * len(involved)) + 0.01
    assert row["noise_pct"] == pytest.approx(
        100 * (row["outside_cpu_s"] + row["steal_s"]) / (local["wall_s"] * len(involved)), abs=rounding)
    # what ran outside the experiment is part of what the involved cores spent, never more
    assert row["outside_cpu_s"] <= sum(cores[c]["user_s"] + cores[c]["system_s"] for c in involved) + 1e-3


# -- the overhead study's softirq note ----------------------------------------------------------

def cores_json(lg_softirq: float, target_softirq: float, other_softirq: float = 0.0) -> str:
    """One point's cpu_cores_json over a 2 s window: load generator on cpu1, target on cpu0."""
    def core(softirq: float) -> dict:
        return {"user_s": 0.5, "system_s": 0.8, "softirq_s": softirq, "irq_s": 0.0, "idle_s": 0.1,
                "iowait_s": 0.0, "steal_s": 0.0}
    return json.dumps({"local": {"wall_s": 2.0, "roles": {"main": [1], "target": [0]},
                                 "cores": {"0": core(target_softirq), "1": core(lg_softirq), "2": core(other_softirq)}}})


def test_overhead_notes_receive_processing_on_the_sending_core():
    data = overhead_measurements()
    before = overhead.analyze(data, runs_frame(["overhead"]))
    data["cpu_cores_json"] = None
    data.loc[data["leg"] == "loopback", "cpu_cores_json"] = cores_json(0.4, 0.3)
    data.loc[data["leg"] == "netns", "cpu_cores_json"] = cores_json(0.01, 0.01, other_softirq=0.6)
    result = overhead.analyze(data, runs_frame(["overhead"]))
    # the existing findings and tables stay as they were (the peak's conditions now name the cores);
    # the softirq ones come after
    def same(findings):
        return [f.split(", cores ")[0] for f in findings]

    assert same(result.findings[:len(before.findings)]) == same(before.findings)
    assert "cores host cpu1 · target cpu0, link netns" in next(f for f in result.findings if "peak IOPS" in f)
    assert [t.title for t in result.tables][:len(before.tables)] == [t.title for t in before.tables]
    table = next(t.frame for t in result.tables if "softirq" in t.title).set_index(["leg", "cores"])
    assert table.at[("loopback", "load generator"), "softirq (% of core)"] == pytest.approx(20.0)
    assert table.at[("loopback", "target"), "softirq (% of core)"] == pytest.approx(15.0)
    assert table.at[("netns", "other"), "softirq (% of core)"] == pytest.approx(30.0)
    loopback = next(f for f in result.findings if f.startswith("loopback: softirq"))
    assert "20.0 % of the load generator's core (cpu1) and 15.0 % of the target's (cpu0)" in loopback
    assert "Loopback delivers each packet on the core that sent it" in loopback
    netns = next(f for f in result.findings if f.startswith("netns"))
    assert "softirq stayed under 1 %" in netns and "no receive processing charged to the sending core" in netns


def test_overhead_softirq_on_a_shared_core_is_not_assigned_and_absent_data_adds_nothing():
    data = overhead_measurements(("local", "loopback"))
    plain = overhead.analyze(data, runs_frame(["overhead"]))
    assert not any("softirq" in f for f in plain.findings)
    shared = json.dumps({"local": {"wall_s": 1.0, "roles": {"main": [0], "target": [0]},
                                   "cores": {"0": {"softirq_s": 0.25, "system_s": 0.5, "user_s": 0.2}}}})
    data["cpu_cores_json"] = [shared if leg == "loopback" else None for leg in data["leg"]]
    result = overhead.analyze(data, runs_frame(["overhead"]))
    assert any("shared cpu0, so softirq time (25.0 % of it) cannot be assigned" in f for f in result.findings)


def test_env_command_prints_its_warnings(fake_env):
    from nvmflab import env

    with open("/proc/stat") as f:
        steal_before = int(f.readline().split()[8])
    done = nvmflab("env", "--json", env=fake_env)
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["warnings"]
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    have = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    steal_after = int(lines[0].split()[8])
    # the core count warning appears exactly when this machine has fewer cores than the studies want
    few = [w for w in warnings if "cores here; the full studies want" in w]
    assert bool(few) == (have < env.CORES_WANTED), (have, warnings)
    if few:
        assert few[0].startswith(f"{have} cores here; the full studies want {env.CORES_WANTED}")
    # steal time since boot only grows: none now means the command cannot have seen any
    if steal_after == 0:
        assert not any(w.startswith("steal time since boot") for w in warnings), warnings
    if steal_before > 0:
        assert any(w.startswith("steal time since boot") for w in warnings), warnings


@pytest.mark.parametrize("cores", [[0], None])
def test_the_remote_script_reads_what_the_local_snapshot_reads(cores):
    # The script for real under this machine's sh (dash on Debian, as on the guests), parsed as a
    # remote snapshot, against the local read of the same machine.
    from test_netcounters_remote import ShellHost

    remote, local = sysstat.snapshot(ShellHost(), cores), sysstat.local_snapshot(cores)
    assert remote.clk_tck == local.clk_tck and remote.tcp_congestion == local.tcp_congestion
    assert set(remote.stat) == set(local.stat) and remote.stat["cpu0"]["user"] > 0
    assert remote.governors == local.governors and remote.throttle == local.throttle
    # kernel threads (kworkers) come and go between the two reads: most are in both
    assert local.kthreads and len(set(remote.kthreads) & set(local.kthreads)) >= len(local.kthreads) // 2
