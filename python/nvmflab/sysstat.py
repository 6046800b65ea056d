"""Noise measured per point: what else used the CPUs while a point ran (issue 10 item 5).

Around each point's measurement the runner takes a `Snapshot` of every machine the point ran on
(this one for local topologies; SSH hosts through the `Host` interface): /proc/stat per core, the
CPU time of every kernel thread (from /proc/PID/stat), the frequency governor and the thermal
throttle counters of the cores where readable. `window` turns two snapshots into:

- per core: user, system, irq, softirq, idle, iowait and steal seconds (`cpu_cores_json`);
- outside CPU: the process time (user + nice + system, guest included in user) on the cores the
  experiment was pinned to, minus the CPU time of the experiment's own processes (the load
  generators' rusage, the target's CPU seconds, the harness itself on this machine) and minus kernel
  threads (nvmet/nvme-tcp workers, ksoftirqd: the experiment's own kernel-side work, attributed to the
  core they last ran on). irq and softirq time are reported per core but not counted as outside: the
  experiment's own network traffic causes most of it. Clamped at 0: ticks are sampled, rusage is exact.
- steal: time the hypervisor took from those cores;
- noise_pct = 100 × (outside + steal) / (wall seconds × cores involved), cores involved summed over
  machines. A point above `NOISE_LIMIT_PCT`, or with a thermal throttle event, is noisy.

The parsing functions take text, so tests feed them synthetic /proc contents.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A point is noisy above this share of its cores' time used by others (outside CPU + steal).
NOISE_LIMIT_PCT = 10.0
# How many more times a noisy point is measured before it is stored as noisy.
NOISE_RETRIES = 2
# NVMFLAB_NOISE_LIMIT_PCT=<number> changes the limit; "off" records noise but never re-runs or marks.
LIMIT_ENV = "NVMFLAB_NOISE_LIMIT_PCT"

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
PF_KTHREAD = 0x00200000
SYSFS_CPU = "/sys/devices/system/cpu"
# The congestion control every socket gets unless it sets its own (knob tcp_congestion): a pacing
# one (bbr) changes large-I/O results (bench/README.md), so each point records it per machine.
CONGESTION = "/proc/sys/net/ipv4/tcp_congestion_control"
THROTTLE_FILES = ("core_throttle_count", "package_throttle_count")


def noise_limit() -> float | None:
    """The limit in percent, None when switched off (NVMFLAB_NOISE_LIMIT_PCT=off)."""
    text = os.environ.get(LIMIT_ENV, "").strip().lower()
    if not text:
        return NOISE_LIMIT_PCT
    if text in ("off", "none", "no"):
        return None
    try:
        return float(text)
    except ValueError:
        return NOISE_LIMIT_PCT


# -- parsing -------------------------------------------------------------------------------------

def parse_proc_stat(text: str) -> dict[str, dict[str, int]]:
    """/proc/stat's cpu lines: {"cpu": {...}, "cpu0": {...}, ...}, jiffies per field (absent = 0)."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu"):
            continue
        values = [int(v) for v in parts[1:1 + len(CPU_FIELDS)]]
        values += [0] * (len(CPU_FIELDS) - len(values))
        out[parts[0]] = dict(zip(CPU_FIELDS, values))
    return out


def parse_kthreads(text: str) -> dict[int, tuple[int, int]]:
    """Concatenated /proc/PID/stat lines -> {pid: (last cpu, utime + stime ticks)} of kernel threads."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        head, sep, tail = line.rpartition(")")
        if not sep:
            continue
        fields = tail.split()
        try:
            pid = int(head.split("(", 1)[0])
            flags, ticks, cpu = int(fields[6]), int(fields[11]) + int(fields[12]), int(fields[36])
        except (ValueError, IndexError):
            continue
        if flags & PF_KTHREAD:
            out[pid] = (cpu, ticks)
    return out


def parse_per_core(text: str) -> dict[int, str]:
    """Lines `cpuN VALUE` -> {N: VALUE}; lines without a value are left out."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].startswith("cpu") and parts[0][3:].isdigit():
            out[int(parts[0][3:])] = parts[1].strip()
    return out


# -- snapshots -----------------------------------------------------------------------------------

@dataclass
class Snapshot:
    stat: dict[str, dict[str, int]]
    kthreads: dict[int, tuple[int, int]]
    governors: dict[int, str] = field(default_factory=dict)
    throttle: dict[int, int] = field(default_factory=dict)
    clk_tck: int = 100
    at: float = 0.0  # time.monotonic() of this machine's clock, here
    self_cpu_s: float = 0.0  # CPU of the harness itself (this machine only; 0 for remote hosts)
    tcp_congestion: str | None = None  # the machine's default TCP congestion control


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _local_kthread_text() -> str:
    lines = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            text = _read(f"/proc/{entry.name}/stat")
            if text:
                lines.append(text.strip())
    return "\n".join(lines)


def _throttle_value(core: int, read) -> int | None:
    values = [read(f"{SYSFS_CPU}/cpu{core}/thermal_throttle/{name}") for name in THROTTLE_FILES]
    values = [int(v.strip()) for v in values if v and v.strip().isdigit()]
    return sum(values) if values else None


def local_snapshot(cores: list[int] | None) -> Snapshot:
    """This machine; `cores` limits the sysfs reads (None = every core /proc/stat lists)."""
    kthreads = parse_kthreads(_local_kthread_text())
    stat_text = _read("/proc/stat") or ""
    at, self_cpu = time.monotonic(), _self_cpu()
    stat = parse_proc_stat(stat_text)
    wanted = cores if cores is not None else [int(k[3:]) for k in stat if k != "cpu"]
    governors = {c: g.strip() for c in wanted if (g := _read(f"{SYSFS_CPU}/cpu{c}/cpufreq/scaling_governor"))}
    throttle = {c: v for c in wanted if (v := _throttle_value(c, _read)) is not None}
    return Snapshot(stat, kthreads, governors, throttle, os.sysconf("SC_CLK_TCK"), at, self_cpu,
                    (_read(CONGESTION) or "").strip() or None)


def _remote_script(cores: list[int] | None) -> str:
    """One round trip for everything a remote snapshot reads. Shell builtins (`read`, `test`,
    arithmetic) in the per-core loops, not a `$(cat ...)` per file: under emulation (the test bed's
    guests) every process the shell starts costs tens of milliseconds."""
    def per_core(body: str) -> str:
        if cores is not None:
            return f"for c in {' '.join(str(c) for c in cores)}; do {body}; done; "
        return f"for d in {SYSFS_CPU}/cpu[0-9]*; do c=${{d##*/cpu}}; {body}; done; "

    def read_into(var: str, path: str) -> str:
        return f'{var}=; [ -r "{path}" ] && read -r {var} < "{path}"; '

    throttle = "n=; " + "".join(
        read_into("v", f"{SYSFS_CPU}/cpu$c/thermal_throttle/{name}")
        + 'case "$v" in ""|*[!0-9]*) ;; *) n=$((${n:-0} + v)) ;; esac; ' for name in THROTTLE_FILES) + "echo cpu$c $n"
    return ("echo '## tck'; getconf CLK_TCK; echo '## stat'; cat /proc/stat; "
            "echo '## kthreads'; cat /proc/[0-9]*/stat 2>/dev/null; "
            "echo '## governor'; " + per_core(read_into("g", f"{SYSFS_CPU}/cpu$c/cpufreq/scaling_governor") + "echo cpu$c $g")
            + "echo '## throttle'; " + per_core(throttle)
            + f"echo '## tcp_congestion'; cat {CONGESTION} 2>/dev/null")


def sections(text: str) -> dict[str, str]:
    """`## name` headed sections of the remote script's output."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def remote_snapshot(host, cores: list[int] | None) -> Snapshot:
    """An SSH host: everything in one shell command (one round trip)."""
    done = host.run(["sh", "-c", _remote_script(cores)], check=False, timeout=30)
    parts = sections(done.stdout or "")
    stat = parse_proc_stat(parts.get("stat", ""))
    tck = parts.get("tck", "").strip()
    throttle = {c: int(v) for c, v in parse_per_core(parts.get("throttle", "")).items() if v.isdigit()}
    return Snapshot(stat, parse_kthreads(parts.get("kthreads", "")), parse_per_core(parts.get("governor", "")),
                    throttle, int(tck) if tck.isdigit() else 100, time.monotonic(), 0.0,
                    parts.get("tcp_congestion", "").strip() or None)


def snapshot(host, cores: list[int] | None) -> Snapshot:
    return remote_snapshot(host, cores) if getattr(host, "remote", False) else local_snapshot(cores)


def machine_key(host) -> str:
    """Hosts on the same machine (this one, its namespaces) share one /proc/stat."""
    return host.name if getattr(host, "remote", False) else "local"


# -- one window ----------------------------------------------------------------------------------

def core_seconds(before: Snapshot, after: Snapshot) -> dict[int, dict[str, float]]:
    """Per core: user (user + nice), system, irq, softirq, idle, iowait, steal seconds in the window."""
    tck = after.clk_tck or 100
    out = {}
    for name, end in after.stat.items():
        if name == "cpu" or name not in before.stat:
            continue
        start = before.stat[name]
        d = {f: max(0, end[f] - start[f]) / tck for f in CPU_FIELDS}
        out[int(name[3:])] = {"user_s": d["user"] + d["nice"], "system_s": d["system"], "irq_s": d["irq"],
                              "softirq_s": d["softirq"], "idle_s": d["idle"], "iowait_s": d["iowait"],
                              "steal_s": d["steal"]}
    return out


def kthread_seconds(before: Snapshot, after: Snapshot) -> dict[int, float]:
    """Kernel-thread CPU seconds in the window by the core each thread last ran on."""
    tck = after.clk_tck or 100
    out: dict[int, float] = {}
    for pid, (cpu, ticks) in after.kthreads.items():
        start = before.kthreads.get(pid, (cpu, 0))[1]  # a thread born in the window: all its ticks
        if ticks > start:
            out[cpu] = out.get(cpu, 0.0) + (ticks - start) / tck
    return out


@dataclass
class MachineWindow:
    cores: dict[int, dict[str, float]]
    involved: list[int]
    outside_s: float  # on the involved cores
    outside_all_s: float  # on every core of the machine
    steal_s: float
    kernel_threads_s: float
    wall_s: float
    governors: dict[int, str]
    throttle_events: int | None
    tcp_congestion: str | None = None


def window(before: Snapshot, after: Snapshot, involved: list[int] | None, experiment_cpu_s: float) -> MachineWindow:
    """What happened on one machine between two snapshots; experiment_cpu_s = the CPU time of the
    experiment's processes on it (load generators, target; the harness's own is added here)."""
    cores = core_seconds(before, after)
    kthreads = kthread_seconds(before, after)
    mine = sorted(c for c in (involved if involved is not None else cores) if c in cores)
    experiment = experiment_cpu_s + max(0.0, after.self_cpu_s - before.self_cpu_s)

    def outside(which: list[int]) -> float:
        busy = sum(cores[c]["user_s"] + cores[c]["system_s"] for c in which)
        return max(0.0, busy - sum(kthreads.get(c, 0.0) for c in which) - experiment)

    counts = [after.throttle[c] - before.throttle[c] for c in mine if c in after.throttle and c in before.throttle]
    return MachineWindow(
        cores=cores, involved=mine, outside_s=outside(mine), outside_all_s=outside(sorted(cores)),
        steal_s=sum(cores[c]["steal_s"] for c in mine),
        kernel_threads_s=sum(kthreads.get(c, 0.0) for c in mine),
        wall_s=max(0.0, after.at - before.at),
        governors={c: after.governors[c] for c in mine if c in after.governors},
        throttle_events=sum(max(0, n) for n in counts) if counts else None,
        tcp_congestion=after.tcp_congestion)


def governor_text(governors: dict[int, str]) -> str | None:
    """'performance', or 'powersave ×2, performance ×1' when the cores differ; None when unreadable."""
    if not governors:
        return None
    counts: dict[str, int] = {}
    for g in governors.values():
        counts[g] = counts.get(g, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{g} ×{n}" for g, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize(windows: dict[str, MachineWindow], limit_pct: float | None,
              roles: dict[str, dict[str, list[int]]] | None = None,
              perf: dict[str, dict[str, dict[str, float]]] | None = None) -> dict[str, Any]:
    """The measurement columns for one point, from each machine's window; `roles` names the cores
    each process was pinned to per machine ({"local": {"target": [0], "main": [1]}}); `perf` the
    perf stat software counters per machine and core where they were counted (perfstat.py)."""
    outside = sum(w.outside_s for w in windows.values())
    steal = sum(w.steal_s for w in windows.values())
    n_cores = sum(len(w.involved) for w in windows.values())
    wall = max((w.wall_s for w in windows.values()), default=0.0)
    noise = 100.0 * (outside + steal) / (wall * n_cores) if wall > 0 and n_cores else None
    governors = {f"{m}:{c}": g for m, w in windows.items() for c, g in w.governors.items()}
    throttles = [w.throttle_events for w in windows.values() if w.throttle_events is not None]
    throttle = sum(throttles) if throttles else None
    noisy = None
    if limit_pct is not None and noise is not None:
        noisy = noise > limit_pct or bool(throttle)
    detail = {m: {"involved": w.involved, "wall_s": round(w.wall_s, 3), "outside_s": round(w.outside_s, 3),
                  "outside_all_s": round(w.outside_all_s, 3), "kernel_threads_s": round(w.kernel_threads_s, 3),
                  "steal_s": round(w.steal_s, 3), "governor": governor_text(w.governors),
                  "throttle_events": w.throttle_events, "tcp_congestion": w.tcp_congestion,
                  "roles": (roles or {}).get(m, {}),
                  "cores": {str(c): {k: round(v, 3) for k, v in s.items()} for c, s in sorted(w.cores.items())}}
              | ({"perf_stat": (perf or {})[m]} if (perf or {}).get(m) else {})
              for m, w in windows.items()}
    return {"outside_cpu_s": round(outside, 3), "steal_s": round(steal, 3),
            "noise_pct": None if noise is None else round(noise, 2), "noisy": noisy,
            "cpu_governor": governor_text(governors), "throttle_events": throttle,
            "cpu_cores_json": json.dumps(detail, sort_keys=True)}


# -- whole-machine state for `nvmflab env` -------------------------------------------------------

def machine_warnings(host=None, cores_wanted: int | None = None, sample_s: float = 0.5) -> list[str]:
    """What will make results on a machine (this one when host is None) unreliable, one sentence each
    (empty = none found): governor not performance, steal since boot, throttling, other busy processes
    over `sample_s`, fewer cores than the studies want."""
    def take() -> Snapshot:
        return local_snapshot(None) if host is None else snapshot(host, None)

    warnings = []
    first = take()
    stat = first.stat
    governors = governor_text(first.governors)
    if governors and governors != "performance":
        warnings.append(f"CPU frequency governor is {governors}, not performance: clock speed changes with "
                        "load (cpupower frequency-set -g performance)")
    total = stat.get("cpu")
    if total and total["steal"] > 0:
        ticks = sum(total.values()) - total["guest"] - total["guest_nice"]
        warnings.append(f"steal time since boot is {100 * total['steal'] / max(ticks, 1):.2f} % of CPU time: "
                        "this is a VM sharing its physical cores, its points may be marked noisy")
    if (first.tcp_congestion or "").startswith("bbr"):
        warnings.append(f"TCP congestion control is {first.tcp_congestion}: the kernel paces every socket, which "
                        "changes large-I/O results (128 KiB writes ran 1.4x faster under cubic on the development "
                        "VM); each point records it, and knob tcp_congestion sets it per socket on our stack")
    if sum(first.throttle.values()) > 0:
        warnings.append(f"thermal throttling happened {sum(first.throttle.values())} time(s) since boot")
    time.sleep(sample_s)
    second = take()
    win = window(first, second, None, 0.0)
    busy = sorted(((s["user_s"] + s["system_s"], c) for c, s in win.cores.items()), reverse=True)
    if win.wall_s > 0 and win.outside_all_s / win.wall_s > 0.1 * max(len(win.cores), 1):
        top = ", ".join(f"cpu{c} {100 * b / win.wall_s:.0f} %" for b, c in busy[:3])
        warnings.append(f"other processes used {100 * win.outside_all_s / win.wall_s:.0f} % of a core on average "
                        f"over {sample_s:g} s (busiest: {top}): points will be re-run or marked noisy")
    have = len(win.cores)
    if cores_wanted and have < cores_wanted:
        warnings.append(f"{have} cores here; the full studies want {cores_wanted} (separate cores for target, "
                        "load generators and backgrounds): legs that need more are skipped or share cores")
    return warnings
