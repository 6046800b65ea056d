"""The target's memory per connected I/O queue: RSS (VmRSS of /proc/PID/status) of a fresh
target with 1, 100 and 1000 I/O queues connected at QD128 by `nvmf-bench queues`, each queue
driven through one full-depth round of 4 KiB reads before the reading. SPDK's nvmf_tgt is
measured the same way up to SPDK_MAX_QUEUES: its DPDK heap (`-s 1024` MiB under --no-huge) runs
out near 250 queues of 256 entries, and it resets the connections that do not fit."""

from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from nvmflab import procs

from .stacks import NQN, Bench, BenchError, bench_binary

COUNTS = (1, 100, 1000)
SPDK_MAX_QUEUES = 100
READY_TIMEOUT_S = 120.0


def parse_vmrss(status_text: str) -> int | None:
    """Bytes of VmRSS in a /proc/PID/status text, None when the line is absent."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = parts[2].lower() if len(parts) > 2 else "kb"
                return int(parts[1]) * (1024 if unit == "kb" else 1)
    return None


def bytes_per_queue(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of RSS bytes over connected queues; None with fewer than two counts."""
    if len({q for q, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(q for q, _ in points) / n
    my = sum(r for _, r in points) / n
    sxx = sum((q - mx) ** 2 for q, _ in points)
    return sum((q - mx) * (r - my) for q, r in points) / sxx


def target_rss(pid: int) -> int | None:
    try:
        return parse_vmrss(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None


def counts_for(stack: str, counts: list[int]) -> list[int]:
    return [c for c in counts if stack != "spdk" or c <= SPDK_MAX_QUEUES]


def measure(bench: Bench, stack: str, count: int, target_cores: list[int], host_cpu: int,
            iodepth: int = 128) -> dict[str, Any]:
    """RSS of a fresh poll-mode target before any connection and with `count` queues held."""
    with bench.target(stack, target_cores, "poll") as target:
        # LocalProcess -> Popen: the target itself (SPDK's start script execs nvmf_tgt in place).
        pid = target.proc.proc.pid
        idle = target_rss(pid)
        argv = [str(bench_binary("nvmf-bench")), "queues", "-a", target.address, "-s", str(target.port),
                "-n", NQN, "--count", str(count), "--iodepth", str(iodepth), "--hold", str(READY_TIMEOUT_S)]
        log = open(bench.workdir / f"queues-{count}.log", "ab")
        proc = procs.spawn(argv, [host_cpu], stdout=subprocess.PIPE, stderr=log)
        try:
            line = read_line(proc, READY_TIMEOUT_S)
            if not line:
                raise BenchError(f"nvmf-bench queues --count {count} printed nothing: see {log.name}")
            ready = json.loads(line)
            time.sleep(0.2)  # let the reactor finish what the last completions started
            held = target_rss(pid)
        finally:
            procs.stop(proc)
            log.close()
    return {"stack": stack, "queues": ready.get("queues"), "controllers": ready.get("controllers"), "iodepth": iodepth,
            "connect_s": round(float(ready.get("connect_s", 0.0)), 2), "rss_idle_bytes": idle, "rss_bytes": held}


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, '' if it exits or stays silent for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = proc.stdout.read1(4096)
            if not chunk:
                return ""
            buf += chunk
            if b"\n" in buf:
                return buf.split(b"\n", 1)[0].decode(errors="replace")
        elif proc.poll() is not None:
            return ""
    return ""
