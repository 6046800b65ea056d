"""Child processes the runner owns: own process group, pinned, stopped with TERM then KILL.

Every child is registered until it is reaped, so `stop_all()` (called on Ctrl-C, on errors and at
exit) leaves no orphan behind.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

_live: dict[int, subprocess.Popen] = {}
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def spawn(argv: list[str], cpus: tuple[int, ...] | list[int] | None, stdout, stderr,
          prefix: list[str] | None = None) -> subprocess.Popen:
    """Start argv in a new session (its own process group), restricted to cpus."""
    affinity = set(cpus) if cpus else None

    def _pin() -> None:
        # If the harness itself is killed (even SIGKILL), the kernel kills the child too.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if affinity:
            os.sched_setaffinity(0, affinity)

    proc = subprocess.Popen((prefix or []) + argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            start_new_session=True, preexec_fn=_pin)
    _live[proc.pid] = proc
    return proc


def track(proc: subprocess.Popen) -> None:
    """Register a child started elsewhere (an ssh client) so that `stop_all()` ends it too."""
    _live[proc.pid] = proc


def untrack(proc: subprocess.Popen) -> None:
    _live.pop(proc.pid, None)


def wait_rusage(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float, float]:
    """Wait for proc; returns (exit code or None on timeout, user s, sys s) from wait4's rusage."""
    deadline = time.monotonic() + timeout
    exited = _exit_waiter(proc.pid)
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                _live.pop(proc.pid, None)
                return proc.returncode, usage.ru_utime, usage.ru_stime
            left = deadline - time.monotonic()
            if left < 0:
                return None, 0.0, 0.0
            # A point's measurement ends when its load generator does: wake at its exit, not
            # up to a polling period later (hundreds of short points add those up).
            if exited is None:
                time.sleep(min(0.02, left))
            else:
                exited.poll(min(left, 1.0) * 1000)
    finally:
        if exited is not None:
            exited.close()


class _ExitWaiter:
    """poll(2) on a pidfd: readable once the process has exited (Linux 5.3 and later)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def poll(self, timeout_ms: float) -> None:
        self._poll.poll(max(0, int(timeout_ms)))

    def close(self) -> None:
        os.close(self.fd)


def _exit_waiter(pid: int) -> _ExitWaiter | None:
    """A pidfd waiter for pid, or None where pidfds are missing (then wait_rusage polls)."""
    try:
        return _ExitWaiter(os.pidfd_open(pid))
    except (AttributeError, OSError):
        return None


def stop(proc: subprocess.Popen, grace: float = 5.0) -> int | None:
    """SIGTERM the process group, then SIGKILL it after `grace` seconds; reaps the child."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    # Children of the child (e.g. under `ip netns exec`) share its group: make sure none linger.
    _signal_group(proc, signal.SIGKILL)
    _live.pop(proc.pid, None)
    return proc.returncode


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    for proc in list(_live.values()):
        stop(proc, grace=2.0)


atexit.register(stop_all)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a live process in seconds, from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
