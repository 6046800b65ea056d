#!/usr/bin/env python3
"""Our target's wire pattern and system calls per I/O under each host, on this machine's loopback
(issue 40 item 3): bench/README.md's table "What spdk_nvme_perf puts on the wire", rerunnable. For
each host and work: a fresh target as the bench starts it (null namespace, in-capsule size 8192,
one polling reactor on --target-core), a tcpdump capture of every connection from before the host
connects (read by nvmfbench/wire.py), `perf trace -s -p` on the target over the host's run, and the
I/O commands the target's /stats counted over the same window. Prints the table's rows and the
IOPS, and writes DIR/report.json.

Needs root (tcpdump on lo, perf trace), tcpdump and perf; spdk_nvme_perf for --hosts spdk
(the bench's SPDK build). One capture per cell: at QD32 and deeper the counts are batch sizes that
move with the two sides' speeds.

Usage: bench/wire_capture.py [--hosts ours,spdk] [--works 4k-randread-qd128,...] [--out DIR]"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from nvmfbench.stacks import MATRIX_WORKS, Bench, BenchError, spdk_missing  # noqa: E402
from nvmfbench.syscalls import SyscallsError, calls_per_io, parse_perf_trace  # noqa: E402
from nvmfbench.wire import WireError, summarize_capture  # noqa: E402
from nvmfbench.wire_row import table_row, work_name  # noqa: E402

HOSTS = {"ours": "nvmf-perf", "spdk": "spdk_nvme_perf"}
PACKETS = 3000  # the capture's length: the connect and the first few hundred to thousands of I/Os
WAIT_S = 30


def io_commands(stats: dict[str, Any] | None) -> int:
    """Reads + writes of every namespace in our target's /stats."""
    return sum(n["reads"] + n["writes"] for r in (stats or {}).get("reactors", []) for n in r.get("namespaces", []))


def wait_for(path: Path, text: str, proc: subprocess.Popen) -> None:
    """Until `text` appears in `path` (a tool's stderr saying it started), at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if text in path.read_text(errors="replace"):
            time.sleep(0.5)  # the line comes a little before the tool takes its first event
            return
        time.sleep(0.1)
    raise BenchError(f"{proc.args[0]} did not start: {path.read_text(errors='replace').strip()[-300:]}")


def interrupt(proc: subprocess.Popen) -> None:
    """SIGINT (both tools write their file on it), then SIGKILL if it is still there after WAIT_S."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def capture_one(bench: Bench, host: str, work_key: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    work = next(w for w in MATRIX_WORKS if w.key == work_key)
    name = f"{host}-{work_key}"
    pcap, trace = out / f"{name}.pcap", out / f"{name}.trace.txt"
    found: dict[str, Any] = {"host": host, "work": work_key}
    with bench.target("ours", [args.target_core], "poll") as target:
        pid = target.proc.proc.pid  # OurTarget's LocalProcess: nvmf-target itself
        logs = [(out / f"{name}.{tool}.txt").open("w") for tool in ("tcpdump", "perf")]
        tcpdump = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-B", "262144", "-c", str(PACKETS), "-w", str(pcap),
                                    f"tcp port {target.port}"], stdout=subprocess.DEVNULL, stderr=logs[0])
        perf = None
        try:
            wait_for(Path(logs[0].name), "listening on", tcpdump)
            perf = subprocess.Popen(["perf", "trace", "-s", "-p", str(pid), "-o", str(trace)],
                                    stdout=subprocess.DEVNULL, stderr=logs[1])
            time.sleep(2.0)  # perf trace attaches to every thread before the host starts
            before = io_commands(target.stats())
            found["run"] = bench.measure(host, target, work, "poll", [args.host_core], args.seconds, args.ramp)
            found["ios"] = io_commands(target.stats()) - before
        finally:
            for proc in (perf, tcpdump):
                if proc is not None:
                    interrupt(proc)
            for f in logs:
                f.close()
    try:
        found["wire"] = summarize_capture(pcap.read_bytes())
        found["calls per I/O"] = calls_per_io(parse_perf_trace(trace.read_text()), max(found["ios"], 1))
    except (OSError, WireError, SyscallsError) as err:
        found["error"] = str(err)
    if pcap.stat().st_size > args.keep_pcap_mb << 20:
        pcap.unlink()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    keys = [w.key for w in MATRIX_WORKS]
    parser.add_argument("--hosts", default="ours,spdk", help="comma-separated: ours (nvmf-perf), spdk (spdk_nvme_perf)")
    parser.add_argument("--works", default=",".join(keys), help="comma-separated, from: " + ", ".join(keys))
    parser.add_argument("--out", type=Path, default=HERE.parent / "target/wire-capture")
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--ramp", type=int, default=1)
    parser.add_argument("--target-core", type=int, default=0)
    parser.add_argument("--host-core", type=int, default=1)
    parser.add_argument("--keep-pcap-mb", type=int, default=16, help="larger captures are deleted once read")
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    works = [w.strip() for w in args.works.split(",") if w.strip()]
    if bad := [h for h in hosts if h not in HOSTS] + [w for w in works if w not in keys]:
        parser.error(f"unknown {', '.join(bad)}; hosts: {', '.join(HOSTS)}; works: {', '.join(keys)}")
    if missing := [t for t in ("tcpdump", "perf") if shutil.which(t) is None]:
        parser.error(f"{' and '.join(missing)} not found (this script needs both, and root)")
    if "spdk" in hosts and (why := spdk_missing()):
        parser.error(why)
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    with tempfile.TemporaryDirectory(prefix="wire-capture-") as tmp:
        bench = Bench(Path(tmp), None)
        for work in works:
            for host in hosts:
                try:
                    r = capture_one(bench, host, work, args, args.out)
                except BenchError as err:
                    r = {"host": host, "work": work, "error": str(err)}
                reports.append(r)
                run = r.get("run", {})
                if "error" in r or "error" in run:
                    print(f"{host} {work}: {r.get('error') or run.get('error')}", file=sys.stderr)
                    continue
                print(table_row(work_name(work), HOSTS[host], r["wire"], r["calls per I/O"])
                      + f"  <!-- {run.get('iops', 0) / 1000:.0f} K IOPS, {r['ios']} I/Os counted -->", flush=True)
    (args.out / "report.json").write_text(json.dumps(reports, indent=1))
    print(f"wire-capture: {args.out / 'report.json'}", file=sys.stderr)
    return 0 if all("error" not in r and "error" not in r.get("run", {}) for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
