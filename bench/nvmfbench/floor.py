"""The latency floor: `nvmf-bench pingpong` (bench/nvmf-bench) on the bench's two cores, busy
(both threads spin on non-blocking sockets) and blocking (both sleep in recv), each run with
its noise window like a load-generator run."""

from __future__ import annotations

import json
from typing import Any

from nvmflab import procs, sysstat

from .stacks import Bench, BenchError, bench_binary

MODES = ("busy", "blocking")


def pingpong_argv(mode: str, server_cpu: int, client_cpu: int, seconds: float,
                  warmup: float | None = None) -> list[str]:
    """`nvmf-bench pingpong` on the two cores; its own warm-up unless `warmup` is given."""
    argv = [str(bench_binary("nvmf-bench")), "pingpong", "--mode", mode, "--seconds", str(seconds),
            "--server-cpu", str(server_cpu), "--client-cpu", str(client_cpu)]
    return argv if warmup is None else argv + ["--warmup", str(warmup)]


def pingpong(bench: Bench, mode: str, server_cpu: int, client_cpu: int, seconds: float) -> dict[str, Any]:
    """One ping-pong run: its JSON report (mean_ns, p99_99_ns, ...) plus noise, or "error"."""
    argv = pingpong_argv(mode, server_cpu, client_cpu, seconds)
    cores = sorted({server_cpu, client_cpu})
    out = bench.workdir / f"pingpong-{mode}.json"
    before = sysstat.local_snapshot(cores)
    with open(out, "wb") as stdout, open(bench.workdir / "pingpong.log", "ab") as stderr:
        proc = procs.spawn(argv, None, stdout=stdout, stderr=stderr)
        try:
            code, usr, sys_ = procs.wait_rusage(proc, seconds + 30)
        finally:
            procs.stop(proc)
    after = sysstat.local_snapshot(cores)
    if code != 0:
        return {"error": f"nvmf-bench pingpong --mode {mode} exited {code}"}
    try:
        report = json.loads(out.read_text())
    except (OSError, ValueError) as err:
        return {"error": f"ping-pong report unreadable: {err}"}
    noise = bench.noise(before, after, cores, usr + sys_, {"server": [server_cpu], "client": [client_cpu]})
    return {k: report.get(k) for k in ("mean_ns", "p50_ns", "p99_ns", "p99_99_ns", "round_trips")} | noise


def available() -> str | None:
    """None when nvmf-bench is built, else why not."""
    try:
        bench_binary("nvmf-bench")
    except BenchError as err:
        return str(err)
    return None

