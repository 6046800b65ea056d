"""`perf stat` software counters per core around a point (issue 22 item 7), where perf is available.

While the load generators run, `perf stat -A -C CORES` counts, per core of this machine that the
point is pinned to, the kernel's software events: task-clock (ms of CPU time on the core, every
process and kernel thread included), context switches, CPU migrations and page faults. They land in
the point's per-core window (`cpu_cores_json`, machine "local", key "perf_stat"), beside the
/proc/stat seconds. Remote machines and hosts without perf (or without permission,
kernel.perf_event_paranoid) simply have none: the point is measured as before.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from . import procs

EVENTS = ("task-clock", "context-switches", "cpu-migrations", "page-faults")
STOP_TIMEOUT_S = 5.0


class Counting:
    """One running `perf stat` over some cores, writing CSV to `path`."""

    def __init__(self, proc: subprocess.Popen, path: Path):
        self.proc, self.path = proc, path

    def stop(self) -> dict[str, dict[str, float]] | None:
        """Stop counting (SIGINT makes perf print its counts) and return them per core; None when
        perf ended early, hung or wrote nothing readable."""
        try:
            if self.proc.poll() is not None:
                return None  # it exited on its own: no permission, unknown event
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        finally:
            procs.untrack(self.proc)
        try:
            return parse(self.path.read_text(errors="replace")) or None
        except OSError:
            return None


def start(cores: list[int] | None, path: Path) -> Counting | None:
    """Start counting on these cores of this machine; None when perf is missing or no cores given."""
    perf = shutil.which("perf")
    if perf is None or not cores:
        return None
    path.unlink(missing_ok=True)
    argv = [perf, "stat", "-x", ",", "-A", "-C", ",".join(str(c) for c in sorted(set(cores))),
            "-e", ",".join(EVENTS), "-o", str(path)]
    try:
        # As every child of the harness: it dies with the harness, even a SIGKILLed one (perf stat
        # without a command counts until it is told to stop, so an orphan would count forever).
        proc = procs.spawn(argv, None, subprocess.DEVNULL, subprocess.DEVNULL)
    except OSError:
        return None
    return Counting(proc, path)


def parse(text: str) -> dict[str, dict[str, float]]:
    """perf stat -x, -A output -> {"0": {"task-clock": ms, "context-switches": n, ...}} per core.
    Comment lines, events not counted or not supported and malformed lines are left out."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        if len(fields) < 4 or not fields[0].startswith("CPU") or not fields[0][3:].isdigit():
            continue
        event = fields[3].split(":")[0]
        if event not in EVENTS:
            continue
        try:
            value = float(fields[1])
        except ValueError:  # "<not counted>", "<not supported>"
            continue
        out.setdefault(fields[0][3:], {})[event] = value
    return out
