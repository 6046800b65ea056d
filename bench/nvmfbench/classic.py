"""The classic comparisons (`--suites classic`): ratios of our own configurations and tools,
each baseline and subject alternated in the same run.

  generator   nvmf-perf --local vs fio (io_uring) on the same file and workload:
              is our load generator as cheap per I/O as the tool people trust?
  transport   NVMe/TCP over loopback (RAM namespace) vs nvmf-perf --local on a tmpfs file:
              what the software stack costs (the thesis's "software overhead").
  polling     host completion poll vs event, target reactor poll vs event (QD1 p99 and IOPS).
  fio engine  fio + our external ioengine (libnvmf_fio.so) vs nvmf-perf, same target and workload:
              what driving our host from fio costs per I/O (`overhead_us_per_io`); skipped
              without fio or the engine (`make fio-engine`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("NVMFLAB_BIN_DIR", ROOT / "target" / "release"))
NQN = "nqn.2024-01.io.nvmflab:bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    """An nvmf-target with one RAM namespace, started and stopped around a comparison."""

    def __init__(self, mode: str, size: str = "256MiB"):
        self.port = free_port()
        cmd = [str(BIN / "nvmf-target"), "--listen", f"127.0.0.1:{self.port}", "--nqn", NQN,
               "--ns", f"ram:{size}", "--mode", mode, "--cores", "0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        deadline = time.monotonic() + 10
        line = self.proc.stdout.readline()
        if not line.startswith("ready") or time.monotonic() > deadline:
            self.stop()
            raise RuntimeError(f"nvmf-target did not start: {line!r} {self.proc.stderr.read()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def perf(args: list[str], seconds: float) -> dict:
    cmd = [str(BIN / "nvmf-perf"), "run", *args, "--runtime", str(seconds), "--ramp_time", "0.5",
           "--output-format", "json", "--cpus_allowed", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return summarize_fio_json(json.loads(out.stdout))


def fio(path: str, rw: str, bs: str, iodepth: int, seconds: float) -> dict:
    cmd = ["fio", "--name=bench", f"--filename={path}", "--ioengine=io_uring", f"--rw={rw}",
           f"--bs={bs}", f"--iodepth={iodepth}", "--direct=0", "--time_based", f"--runtime={seconds}",
           "--ramp_time=0.5", "--cpus_allowed=1", "--output-format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {out.stderr.strip()}")
    return summarize_fio_json(json.loads(out.stdout))


def summarize_fio_json(doc: dict) -> dict:
    """IOPS and p99 (µs) summed/maxed over jobs and directions, from fio's JSON layout."""
    iops, p99 = 0.0, 0.0
    for job in doc["jobs"]:
        for d in ("read", "write"):
            side = job.get(d) or {}
            if side.get("total_ios", side.get("io_bytes", 0)):
                iops += side["iops"]
                pct = side.get("clat_ns", {}).get("percentile", {})
                p99 = max(p99, pct.get("99.000000", 0) / 1000)
    return {"iops": iops, "p99_us": p99}


def compare(name: str, baseline, subject, rounds: int) -> dict:
    """Alternates baseline and subject `rounds` times; ratio of medians subject/baseline."""
    base, subj = [], []
    for _ in range(rounds):
        base.append(baseline())
        subj.append(subject())
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    row = {"comparison": name}
    for k in ("iops", "p99_us"):
        b, s = med(base, k), med(subj, k)
        row[f"{k}_baseline"], row[f"{k}_subject"] = round(b, 1), round(s, 1)
        row[f"{k}_ratio"] = round(s / b, 3) if b else None
    return row


# -- fio engine: fio + libnvmf_fio.so vs nvmf-perf on the same target (docs/fio-engine.md) ---------

FIO_ENGINE = Path(os.environ.get("NVMFLAB_FIO_ENGINE", BIN / "libnvmf_fio.so"))


def fio_engine(port: int, rw: str, bs: str, iodepth: int, seconds: float, extra: tuple[str, ...] = ()) -> dict:
    """fio driving our host through the external ioengine, pinned like `perf` (one job, CPU 1)."""
    cmd = ["fio", "--name=bench", f"--ioengine=external:{FIO_ENGINE}", "--traddr=127.0.0.1", f"--trsvcid={port}",
           f"--subnqn={NQN}", "--filename=ns1", "--thread=1", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
           "--time_based", f"--runtime={seconds}", "--ramp_time=0.5", "--cpus_allowed=1", "--completion=event",
           "--output-format=json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"fio (nvmf engine) failed: {out.stderr.strip()}")
    text = out.stdout
    return summarize_fio_json(json.loads(text[text.find("{"):]))


def fio_engine_rows(seconds: float, rounds: int) -> list[dict]:
    """The engine's per-I/O cost: nvmf-perf (baseline) and fio + engine (subject), same target,
    same workload (4 KiB randread, QD1 and QD32, host completion event), interleaved. Adds
    `overhead_us_per_io` = 1e6/IOPS(subject) - 1e6/IOPS(baseline): the extra time each I/O costs.
    fio commits (one send) per I/O by default; nvmf-perf batches, so QD32 is also measured with
    fio's own batching (iodepth_batch_submit/iodepth_batch_complete_max)."""
    if not shutil.which("fio"):
        print("bench: fio not installed, skipping the fio engine comparison", file=sys.stderr)
        return []
    help_text = subprocess.run(["fio", f"--enghelp={FIO_ENGINE}"], capture_output=True, text=True, timeout=30)
    if "traddr" not in help_text.stdout:
        print(f"bench: {FIO_ENGINE} missing or without fio support (`make fio-engine`), skipping the fio engine "
              "comparison", file=sys.stderr)
        return []
    rows = []
    target = Target("event")
    try:
        batch = ("--iodepth_batch_submit=16", "--iodepth_batch_complete_max=32")
        for qd, extra in ((1, ()), (32, ()), (32, batch)):
            remote = lambda qd=qd: perf(["-t", "tcp", "-a", "127.0.0.1", "-s", str(target.port), "-n", NQN,  # noqa: E731
                                         "--rw", "randread", "--bs", "4k", "--iodepth", str(qd),
                                         "--completion", "event"], seconds)
            engine = lambda qd=qd, extra=extra: fio_engine(target.port, "randread", "4k", qd, seconds, extra)  # noqa: E731
            name = f"fio engine: fio+libnvmf_fio / nvmf-perf, randread 4k QD{qd}" + (", fio batch 16" if extra else "")
            row = compare(name, remote, engine, rounds)
            if row["iops_baseline"] and row["iops_subject"]:
                row["overhead_us_per_io"] = round(1e6 / row["iops_subject"] - 1e6 / row["iops_baseline"], 3)
            rows.append(row)
    finally:
        target.stop()
    return rows


def run_classic(seconds: float, rounds: int) -> list[dict]:
    """Every classic comparison; rows of compare()."""
    rows = []
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        path = str(Path(tmp) / "bench.img")
        with open(path, "wb") as f:
            f.truncate(256 << 20)
        local = lambda qd: perf(["--local", path, "--rw", "randread", "--bs", "4k", "--iodepth", str(qd)], seconds)  # noqa: E731
        if shutil.which("fio"):
            for qd in (1, 32):
                rows.append(compare(f"generator: nvmf-perf --local / fio, randread 4k QD{qd}",
                                    lambda: fio(path, "randread", "4k", qd, seconds), lambda: local(qd), rounds))
        else:
            print("bench: fio not installed, skipping the generator comparison", file=sys.stderr)

        for mode in ("event", "poll"):
            target = Target(mode)
            try:
                remote = lambda qd, comp="event": perf(  # noqa: E731
                    ["-t", "tcp", "-a", "127.0.0.1", "-s", str(target.port), "-n", NQN, "--rw", "randread",
                     "--bs", "4k", "--iodepth", str(qd), "--completion", comp], seconds)
                for qd in (1, 32):
                    rows.append(compare(f"transport: tcp loopback (target {mode}) / local, randread 4k QD{qd}",
                                        lambda: local(qd), lambda: remote(qd), rounds))
                rows.append(compare(f"polling: host poll / host event, target {mode}, QD1",
                                    lambda: remote(1, "event"), lambda: remote(1, "poll"), rounds))
            finally:
                target.stop()

    rows += fio_engine_rows(seconds, rounds)
    return rows
