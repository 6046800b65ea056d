"""The target's successful system calls per I/O command, counted two ways (issue 40 item 3): perf
trace's summary (`perf trace -s -p PID`, on this machine) and a hist trigger on
raw_syscalls:sys_exit keyed by thread (in the trixie guest, which has no perf or strace; see
bench/kernel-wire-guest.sh). Pure functions on their text."""

from __future__ import annotations

import re
from collections import Counter

# One entry of `cat events/raw_syscalls/sys_exit/hist` with keys=common_pid,id.syscall, e.g.
# "{ common_pid:        211, id: sys_recvfrom                  [ 45] } hitcount:         12"
# (common_pid.execname would print "name [ 211]"; both are read).
HIST_LINE = re.compile(r"\{\s*common_pid:\s*(?:\S+\s*\[\s*)?(\d+)\]?\s*,\s*id:\s*(\S+)\s*\[\s*\d+\]\s*\}"
                       r"\s*hitcount:\s*(\d+)")
# A row of `perf trace -s`: "   recvfrom   12345   10000   12.3 ..." (name, calls, errors, times).
PERF_TRACE_LINE = re.compile(r"^\s+([a-z_0-9]+)\s+(\d+)\s+(\d+)\s+\d")


class SyscallsError(Exception):
    """A count cannot be read; one line."""


def parse_hist(text: str) -> Counter[tuple[int, str]]:
    """(thread id, system call without its sys_ prefix) -> successful calls, from a hist file."""
    found: Counter[tuple[int, str]] = Counter()
    for line in text.splitlines():
        if m := HIST_LINE.search(line):
            found[(int(m[1]), m[2].removeprefix("sys_"))] += int(m[3])
    if not found and "hitcount" not in text:
        raise SyscallsError("no histogram entries (was the hist trigger accepted? see the guest's script.log)")
    if (m := re.search(r"Dropped:\s*(\d+)", text)) and int(m[1]):
        raise SyscallsError(f"the histogram dropped {m[1]} entries (its table was full): the counts are short")
    return found


def parse_ios(text: str) -> int:
    """I/O commands the target counted over the window: 'BEFORE AFTER' from W.ios.txt."""
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise SyscallsError(f"expected 'BEFORE AFTER' I/O counts, got {text.strip()!r}")
    ios = int(parts[1]) - int(parts[0])
    if ios <= 0:
        raise SyscallsError(f"the target counted no I/O commands in the window ({text.strip()})")
    return ios


def parse_perf_trace(text: str) -> Counter[str]:
    """System call -> successful calls (calls - errors), summed over every thread of a `perf trace
    -s` summary."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if m := PERF_TRACE_LINE.match(line):
            found[m[1]] += int(m[2]) - int(m[3])
    if "Summary of events" not in text:
        raise SyscallsError("not a perf trace -s summary (no 'Summary of events')")
    return found


def threads_calls(hist: Counter[tuple[int, str]], tids: set[int]) -> Counter[str]:
    """System call -> successful calls of the threads `tids` (a process's), from parse_hist."""
    calls: Counter[str] = Counter()
    for (tid, name), n in hist.items():
        if tid in tids:
            calls[name] += n
    return calls


def calls_per_io(calls: Counter[str], ios: int) -> dict[str, float]:
    """Each system call per I/O command, busiest first."""
    return {name: round(n / ios, 3) for name, n in calls.most_common() if n}
