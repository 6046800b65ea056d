"""Load from many initiators at once: one load-generator role spread over several hosts.

A spread role runs one process per initiator host (a *part*). Each part runs the role's whole
workload (the knobs are per host: three initiators at iodepth 32 offer three times the load of
one), and all parts start their first I/O at one agreed wall-clock moment:
- nvmf-perf gets `--start-at`: it connects and sets up its queues first, then waits;
- any other load generator (fio for the kernel host, spdk_nvme_perf) is started by a shell that
  sleeps until the moment and then execs it. The kernel host is connected (`nvme connect`) before
  that, so fio only opens the device after the wait. (fio's `--client` mode would also start
  several hosts together, but needs a `fio --server` on each; one barrier for every stack is
  simpler, and its skew is measured the same way.)
Each part reports when it was released (nvmf-perf: `nvmflab.start.released_ns`; the shell: a
`nvmflab-start released_ns=` line in its log). The spread of those times is the point's start
skew, kept in its raw record.

The parts' reports are merged into one report of the role, the way the jobs of one process are
merged (metrics.summarize): their jobs are concatenated, so IOPS and bytes add up and the mean
latency is weighted by I/Os, and their latency histograms are merged (metrics.merge_histograms),
so percentiles come from every I/O of every host. Nothing is averaged.

Which hosts: `[topology] spread` (spec.Topology). The saturation and stacks studies spread their
load generator over every initiator when the topology has more than one, unless `spread = "first"`.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from .metrics import merge_histograms

# Studies whose load generator goes to every initiator by default (spread unset).
SPREADING_STUDIES = frozenset({"saturation", "stacks"})
# Seconds from spawning the first part to the agreed moment: every part must be started over SSH
# (one command on an open master connection) and connected by then. A part that is late starts
# at once, and the skew shows it.
START_LEAD_S = 1.5
START_LEAD_PER_PART_S = 0.25
# The shell barrier: sleep until $1 (ns since the epoch), say when, then run the load generator.
# Integer arithmetic in ns (64-bit in dash and bash); GNU sleep takes fractional seconds.
WAIT_SCRIPT = ('at=$1; shift; left=$((at - $(date +%s%N))); '
               'if [ "$left" -gt 0 ]; then sleep "$((left / 1000000000)).$(printf %09d $((left % 1000000000)))"; fi; '
               'echo "nvmflab-start released_ns=$(date +%s%N)" >&2; exec "$@"')
_RELEASED = re.compile(r"^nvmflab-start released_ns=(\d{1,20})$", re.MULTILINE)


def spread_hosts(topology: Any, study: str, initiators: list[str]) -> tuple[str, ...]:
    """The hosts a study's load generator is spread over; () = just the first initiator.

    `topology.spread`: "all" every initiator, "first" only the first, a list those hosts, unset
    every initiator for SPREADING_STUDIES and only the first for the others."""
    choice = getattr(topology, "spread", None)
    if choice is None:
        choice = "all" if study in SPREADING_STUDIES else "first"
    if choice == "first":
        return ()
    hosts = tuple(initiators) if choice == "all" else tuple(choice)
    if len(hosts) == 1 and initiators and hosts[0] == initiators[0]:
        return ()  # one host, the default one: the same point as without spreading
    return hosts


def start_moment(parts: int, now: float | None = None) -> float:
    """The agreed start (Unix epoch seconds) for `parts` processes spawned from now."""
    return (time.time() if now is None else now) + START_LEAD_S + START_LEAD_PER_PART_S * parts


def lead_s(parts: int) -> float:
    """How long before the moment the parts are spawned (added to a part's time limit)."""
    return START_LEAD_S + START_LEAD_PER_PART_S * parts


def barrier_argv(argv: list[str], at: float) -> list[str]:
    """The load generator's command made to start its I/O at `at` (Unix epoch seconds)."""
    if argv and Path(argv[0]).name == "nvmf-perf" and argv[1:2] == ["run"]:
        return [*argv, "--start-at", f"{at:.6f}"]
    return ["sh", "-c", WAIT_SCRIPT, "nvmflab-start", str(int(at * 1e9)), *argv]


def released_ns(report: dict[str, Any], log_text: str) -> int | None:
    """When a part was let go: nvmf-perf's own record, else the shell barrier's log line."""
    start = (report.get("nvmflab") or {}).get("start")
    if isinstance(start, dict) and isinstance(start.get("released_ns"), int):
        return start["released_ns"]
    found = _RELEASED.findall(log_text or "")
    return int(found[-1]) if found else None


def part_cpus(cpus: tuple[int, ...], first_cores: list[int] | None, cores: list[int] | None) -> tuple[int, ...]:
    """A part's cores on its host: the same positions among that host's usable cores as `cpus`
    hold among the first initiator's (the same cores when either list is unknown)."""
    if not first_cores or not cores or first_cores == cores:
        return tuple(cpus)
    return tuple(cores[first_cores.index(c) % len(cores)] if c in first_cores else c for c in cpus)


def merge_reports(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One report of the role from its parts' reports (fio layout plus nvmflab): jobs concatenated,
    histograms merged, context switches added, intervals added position by position."""
    if len(parts) == 1:
        return parts[0]
    merged = {k: v for k, v in parts[0].items() if k not in ("jobs", "nvmflab")}
    merged["jobs"] = [job for part in parts for job in part.get("jobs", [])]
    sides = [part.get("nvmflab") or {} for part in parts]
    nvmflab: dict[str, Any] = {"engine": sides[0].get("engine")}
    for name in ("voluntary_ctx", "involuntary_ctx"):
        values = [side.get(name) for side in sides]
        nvmflab[name] = None if any(v is None for v in values) else sum(values)
    histograms = [side.get("histogram") or {} for side in sides]
    if any(histograms):
        nvmflab["histogram"] = {d: merge_histograms(h.get(d, []) for h in histograms) for d in ("read", "write")}
    intervals = _merged_intervals([side.get("intervals") for side in sides])
    if intervals is not None:
        nvmflab["intervals"] = intervals
    nvmflab["outages"] = [o for side in sides for o in side.get("outages") or []]
    merged["nvmflab"] = nvmflab
    return merged


def _merged_intervals(series: list[Any]) -> list[dict[str, Any]] | None:
    """Interval i of the role: IOPS added over the parts; latencies the worst part's (a part's
    percentile cannot be merged without its histogram); t_ms the latest part's. The parts started
    together, so their intervals line up; only intervals every part has are kept."""
    if any(not isinstance(s, list) or not s for s in series):
        return None
    ordered = [sorted((r for r in s if isinstance(r, dict) and r.get("t_ms") is not None), key=lambda r: r["t_ms"])
               for s in series]
    out = []
    for records in zip(*ordered):
        row: dict[str, Any] = {"t_ms": max(r["t_ms"] for r in records)}
        for name in ("iops", "read_iops", "write_iops"):
            values = [r.get(name) for r in records]
            row[name] = None if any(v is None for v in values) else sum(values)
        for name in ("lat_mean_ns", "lat_p50_ns", "lat_p99_ns", "lat_p99_9_ns"):
            values = [r.get(name) for r in records]
            row[name] = None if any(v is None for v in values) else max(values)
        out.append(row)
    return out or None


def start_record(at: float, released: dict[str, int | None]) -> dict[str, Any]:
    """The raw record of a spread start: the moment, each host's release, and the skew (ms)."""
    known = [ns for ns in released.values() if ns is not None]
    at_ns = int(at * 1e9)
    return {"at_ns": at_ns, "released_ns": released,
            "skew_ms": (max(known) - min(known)) / 1e6 if len(known) == len(released) and known else None,
            "latest_after_at_ms": (max(known) - at_ns) / 1e6 if known else None}
