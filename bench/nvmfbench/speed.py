"""The machine's own speed, probed around every run.

A shared VM does not run at one speed: on the 2-core machine this bench was written on, a
busy 4 KiB ping-pong took about 9 us for minutes, then about 15 us for minutes (other tenants
of the physical cores), with no CPU time of other processes visible inside the VM. A ratio
of medians that mixes runs from both phases compares the phases, not the stacks. So every
run is bracketed by a short busy ping-pong on the same two cores (the target paused with
SIGSTOP meanwhile, so it does not spin on one of them), and a run whose probes show the
machine slower than its fastest phase by more than SLOW_LIMIT is marked noisy and left out
of the medians like a run that other processes disturbed. The phases lasted tens of seconds,
so before each run the bench also waits a little for a fast phase (Gate)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Iterator

from nvmflab import procs

from . import floor
from .stacks import Bench, BenchError

PROBE_S = 0.3
PROBE_WARMUP_S = 0.05
# Run-to-run spread of the probe within one phase was about 5 % (1 s runs, 20 in a row); the
# two phases were 1.6-1.7x apart.
SLOW_LIMIT = 1.25


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, T, ...), None when the process is gone."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def paused(pid: int | None, settle_s: float = 1.0) -> Iterator[None]:
    """SIGSTOP `pid` (a busy-polling target) for the duration, SIGCONT after. A signal is
    delivered asynchronously, so this waits (up to `settle_s`) until the process is stopped."""
    if pid is None:
        yield
        return
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pid = None
    deadline = time.monotonic() + settle_s
    while pid is not None and process_state(pid) not in ("T", None) and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        yield
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def probe(bench: Bench, server_cpu: int, client_cpu: int, pause_pid: int | None = None) -> float | None:
    """Mean round trip (ns) of a short busy ping-pong on the two cores; None when it failed."""
    argv = floor.pingpong_argv("busy", server_cpu, client_cpu, PROBE_S, warmup=PROBE_WARMUP_S)
    with paused(pause_pid):
        proc = procs.spawn(argv, None, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            out, _ = proc.communicate(timeout=PROBE_S + 20)
        except subprocess.TimeoutExpired:
            return None
        finally:
            procs.stop(proc)
    if proc.returncode != 0:
        return None
    try:
        mean = json.loads(out).get("mean_ns")
    except ValueError:
        return None
    return float(mean) if isinstance(mean, (int, float)) and mean > 0 else None


def target_pid(target: Any) -> int | None:
    """The target process of a locally started RunningTarget (SPDK's start script execs
    nvmf_tgt in place, so its Popen pid is nvmf_tgt's), or of anything holding its Popen in
    `.proc` (bench/ab.py's Target)."""
    proc = getattr(target, "proc", None)
    proc = proc if isinstance(proc, subprocess.Popen) else getattr(proc, "proc", None)
    return getattr(proc, "pid", None)


class Gate:
    """Holds runs back while the machine is in a slow phase: before a run, a probe slower than
    SLOW_LIMIT x the fastest probe so far is repeated every WAIT_STEP_S for up to WAIT_PER_RUN_S,
    out of a budget of WAIT_BUDGET_S for the whole bench (a machine that stays slow is then
    measured as it is, and mark_slow_phases still says which runs were slow)."""

    WAIT_STEP_S = 2.0
    WAIT_PER_RUN_S = 60.0
    WAIT_BUDGET_S = 600.0

    def __init__(self, budget_s: float = WAIT_BUDGET_S, sleep: Callable[[float], None] = time.sleep,
                 say: Callable[[str], None] = _stderr):
        self.fastest: float | None = None
        self.budget = budget_s
        self.waited = 0.0
        self._sleep, self._say = sleep, say

    def seen(self, probe_ns: float | None) -> None:
        if probe_ns is not None and (self.fastest is None or probe_ns < self.fastest):
            self.fastest = probe_ns

    def is_slow(self, probe_ns: float | None) -> bool:
        return probe_ns is not None and self.fastest is not None and probe_ns > SLOW_LIMIT * self.fastest

    def wait_for_fast(self, probe_ns: float | None, again: Callable[[], float | None]) -> float | None:
        """Re-probes with `again` while the machine looks slow and the budgets allow."""
        self.seen(probe_ns)
        if not self.is_slow(probe_ns) or self.budget < self.WAIT_STEP_S:
            return probe_ns
        self._say(f"bench: machine in a slow phase (probe {probe_ns / 1000:.1f} us, fastest "
                  f"{self.fastest / 1000:.1f} us): waiting up to {min(self.WAIT_PER_RUN_S, self.budget):.0f} s")
        waited = 0.0
        while self.is_slow(probe_ns) and waited + self.WAIT_STEP_S <= min(self.WAIT_PER_RUN_S, self.budget):
            self._sleep(self.WAIT_STEP_S)
            waited += self.WAIT_STEP_S
            probe_ns = again()
            self.seen(probe_ns)
        self.budget -= waited
        self.waited += waited
        return probe_ns


class Bracket:
    """Probes before and after a run: `with Bracket(...) as b: run = ...; run |= b.fields`.
    With a Gate, the run waits (within the gate's budgets) for the machine's fast phase."""

    def __init__(self, bench: Bench, server_cpu: int, client_cpu: int, target: Any = None, gate: Gate | None = None):
        self.args = (bench, server_cpu, client_cpu)
        self.pid = target_pid(target) if target is not None else None
        self.gate = gate
        self.fields: dict[str, Any] = {}

    def __enter__(self) -> "Bracket":
        self.before = self._probe()
        if self.gate is not None:
            self.before = self.gate.wait_for_fast(self.before, self._probe)
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._probe()
        if self.gate is not None:
            self.gate.seen(after)
        self.fields = {"probe_ns": [p for p in (self.before, after) if p is not None]}

    def _probe(self) -> float | None:
        try:
            return probe(*self.args, pause_pid=self.pid)
        except (BenchError, OSError):
            return None


def fastest_probe(items: Iterable[dict[str, Any]]) -> float | None:
    """The fastest probe (ns) any of `items` (runs, cipher records) carries; None without probes."""
    probes = [p for r in items for p in r.get("probe_ns") or []]
    return min(probes) if probes else None


def slowness(item: dict[str, Any], fastest: float, limit: float = SLOW_LIMIT) -> float | None:
    """How many times `fastest` the slower probe around `item` took, when that is above `limit`
    (a slow phase of the machine); None when it is not, or `item` has no probes."""
    mine = item.get("probe_ns") or []
    return round(max(mine) / fastest, 2) if mine and max(mine) > limit * fastest else None


def mark_slow_phases(runs: list[dict[str, Any]], limit: float = SLOW_LIMIT) -> float | None:
    """Marks every run whose slower probe exceeds `limit` x the fastest probe of the whole bench
    as noisy (`slow_machine`); returns that fastest probe (ns), None without probes."""
    fastest = fastest_probe(runs)
    if fastest is None:
        return None
    for r in runs:
        slow = slowness(r, fastest, limit)
        if slow is not None:
            r["slow_machine"] = slow
            r["noisy"] = True
    return fastest
