"""procs.wait_rusage: exit code and CPU time of a child, its timeout, and waking at the exit."""

import subprocess
import sys
import time

from nvmflab import procs


def _spawn(code: str) -> subprocess.Popen:
    return procs.spawn([sys.executable, "-c", code], None, subprocess.DEVNULL, subprocess.DEVNULL)


def test_wait_returns_the_exit_code_and_the_childs_cpu_seconds():
    proc = _spawn("import time, sys\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
                  "sys.exit(3)")
    code, user, system = procs.wait_rusage(proc, 30)
    assert code == 3 and proc.returncode == 3
    assert user + system >= 0.2, (user, system)


def test_a_child_still_running_at_the_timeout_gives_none_and_can_be_stopped():
    proc = _spawn("import time; time.sleep(30)")
    try:
        started = time.monotonic()
        assert procs.wait_rusage(proc, 0.2) == (None, 0.0, 0.0)
        assert time.monotonic() - started < 5
        assert proc.poll() is None
    finally:
        procs.stop(proc, grace=1)
    assert proc.returncode is not None


def test_the_exit_waiter_wakes_when_the_child_exits_not_at_its_timeout():
    proc = _spawn("import time; time.sleep(0.2)")
    waiter = procs._exit_waiter(proc.pid)
    assert waiter is not None, "this kernel has pidfds (Linux 5.3 and later)"
    try:
        started = time.monotonic()
        waiter.poll(20_000)
        assert time.monotonic() - started < 10, "poll on the pidfd slept to its timeout"
    finally:
        waiter.close()
    assert procs.wait_rusage(proc, 5)[0] == 0
