#!/usr/bin/env python3
"""Interleaved A/B of two nvmf-target binaries under one nvmf-perf: each round runs every
workload against A then B (B then A on odd rounds), so a shared machine's drift falls on both.
Target on one core, host on another, null namespace (--ns ram:SIZE for one whose reads fill their
buffers, as a real namespace's do). Prints per-workload medians, B/A ratios of the
medians, the ratio of the means with its 95 % interval (Fieller) and Welch's p, the geometric mean of the
per-round B/A ratios with its 95 % interval (the rounds pair A and B run back to back, so a drift
of the machine between rounds cancels out of it), and each side's user and system CPU seconds per GiB moved (from /proc/<pid>/stat and the host's
rusage; a polling process spins its core, so event-mode rows are the ones that show the work).

With --perf-a (and --perf-b) each side gets its own nvmf-perf too: the whole stack before against
after, for changes to both sides. With --tls every run is over TLS 1.3 (one random PSK).
With --host spdk_nvme_perf the load comes from SPDK's host (its build as the bench finds it,
polling on the host core, `--no-huge`), so a change to the target is measured as a host we did
not write sees it (issue 40 item 3). With --tls or --bound it connects over its `ssl` socket
with the PSK, that socket's buffers raised to its posix socket's 2 MiB as the bench does
(nvmflab.stacks.spdk_sockbuf: SPDK 24.01 fixes them at 4 and 64 KiB, which stalled its TLS runs).

--a and --b also take `spdk` or `spdk-spec` for SPDK's target as the bench starts it
(nvmfbench.stacks: nvmf_tgt over rpc.py, --no-huge, one 1 GiB null namespace, in-capsule 8192,
queues of 256; `spdk-spec` without its C2HData SUCCESS shortcut): our target against SPDK's
under either host, side by side with intervals (issue 40 item 3). SPDK's target always polls,
so only -poll works, the default namespace and no --fifo. With --tls or --bound it listens as the
bench's TLS rows run it (a secure channel, the bench's PSK and host NQN, nvmf-perf offering a
version 0 identity, the only one SPDK 24.01 takes).

Every run is bracketed by the bench's speed probe (nvmfbench/speed.py: a short busy ping-pong on
the two cores, the target paused) and waits, within --wait-for-fast seconds in all, for the VM's
fast phase. A run whose probes show the machine more than 1.25x slower than its fastest probe is
left out of every statistic, and with it its round's pair: the VM's phases are 1.5-2x apart and
change within a round, which otherwise decides the intervals. --no-probe turns this off.

With --bound the two sides are one build without TLS (A) and with it (B, --b defaulting to --a),
and each round also measures the AES-GCM rate on the target's core (nvmfbench.cipher, both
implementations, CPU time): each TLS run is set against the limit the cipher puts on it, from its
round's plain run, 1 / (1/plain_IOPS + per-I/O cipher time) (docs/tls.md, The cipher bound), as
measured / limit per round with its 95 % interval. Issue 40's goal is 0.90. The limit takes the
faster implementation per direction; two more columns take OpenSSL's EVP alone, the bound as
issue 40 states it.

With --fifo the target and nvmf-perf run under SCHED_FIFO (`chrt -f 10`), so on a machine that
other work loads they get their cores whenever they can run and the scheduler stops deciding the
result (the kernel still leaves others 5 % of each core); each has a CPU-time limit. It implies
--no-probe (the probe measures the contention that --fifo takes away). Event-mode works suit it
best: a polling FIFO target holds its core between runs too.

Usage: bench/ab.py --a OLD_TARGET --b NEW_TARGET [--perf nvmf-perf] [--perf-a OLD_PERF] [--perf-b NEW_PERF]
                   [--rounds 5] [--seconds 3] [--works 4k-randwrite-qd1-poll,...] [--out ab.json]
                   [--no-probe] [--wait-for-fast 120] [--tls | --bound] [--fifo] [--host spdk_nvme_perf]
                   [--ns null:1GiB | ram:SIZE]
       bench/ab.py --a spdk|spdk-spec --b OUR_TARGET [--host spdk_nvme_perf] [--works 4k-randread-qd32-poll,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvmflab.analysis.decide import fieller, welch  # noqa: E402
from nvmflab.plan import PerfJob  # noqa: E402
from nvmflab.spec import Knobs, Workload  # noqa: E402
from nvmflab.stacks import StackError  # noqa: E402
from nvmflab.stacks import spdk as spdk_stack  # noqa: E402
from nvmflab.stacks import spdk_sockbuf  # noqa: E402
from nvmflab.topology.local import LocalHost  # noqa: E402
from nvmflab.tlskey import random_key  # noqa: E402
from nvmfbench import bound, cipher, speed, stats  # noqa: E402
from nvmfbench import stacks as bench_stacks  # noqa: E402
from nvmfbench.tls_args import tls_args  # noqa: E402

NQN = "nqn.2024-01.io.nvmflab:ab"
TLS_HOSTNQN = "nqn.2024-01.io.nvmflab:ab:host"
TICK = os.sysconf("SC_CLK_TCK")
GIB = 1 << 30
DEFAULT_WORKS = ("4k-randwrite-qd1-poll,4k-randwrite-qd32-poll,128k-randwrite-qd32-poll,128k-randread-qd32-poll,"
                 "128k-randwrite-qd32-event,128k-randread-qd32-event")


def parse_work(key: str) -> dict:
    """'128k-randwrite-qd32-poll' -> bs, rw, iodepth, mode."""
    bs, rw, qd, mode = key.split("-")
    if not (bs.endswith("k") and qd.startswith("qd") and mode in ("poll", "event") and rw in ("randread", "randwrite")):
        raise ValueError(f"workload {key!r}: SIZEk-randread|randwrite-qdN-poll|event")
    return {"key": key, "bs": int(bs[:-1]) * 1024, "rw": rw, "iodepth": int(qd[2:]), "mode": mode}


def fifo_prefix(on: bool, cpu_seconds: int) -> tuple[str, ...]:
    """What --fifo puts before a command: SCHED_FIFO priority 10, and a CPU-time limit, since a
    FIFO process that outlives this script would hold its core. prlimit and chrt exec, so the
    process keeps its pid (cpu_of reads the program's own times)."""
    return ("prlimit", f"--cpu={cpu_seconds}", "chrt", "-f", "10") if on else ()


def cpu_of(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


DEFAULT_NS = "null:1GiB"


def parse_ns(text: str) -> str:
    """The --ns argument: null:SIZE or ram:SIZE (SIZE as nvmf-target takes it: 512MiB, 1GiB, ...)."""
    kind, _, size = text.partition(":")
    if kind not in ("null", "ram") or not size or not size[0].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected null:SIZE or ram:SIZE, e.g. ram:512MiB")
    return text


class Target:
    """One target process on `core`, in `mode`, stopped on exit."""

    nqn = NQN
    hostnqn = TLS_HOSTNQN  # the host it admits over TLS

    def __init__(self, binary: str, core: int, mode: str, tls_key: str | None = None, prefix: tuple[str, ...] = (),
                 ns: str = DEFAULT_NS):
        # With a key: TLS 1.3 required, that PSK for TLS_HOSTNQN (userspace records here: no kTLS module),
        # also in a file only we can read, for spdk_nvme_perf's --psk-path.
        self.tls_key = tls_key
        self.psk_dir = tempfile.mkdtemp(prefix="nvmflab-ab-psk-") if tls_key else None
        self.psk_path = Path(self.psk_dir, "psk.txt") if self.psk_dir else None
        if self.psk_path:
            self.psk_path.write_text(tls_key)
            self.psk_path.chmod(0o600)
        tls = tls_args(tls_key, TLS_HOSTNQN)[0] if tls_key else []
        self.proc = subprocess.Popen([*prefix, binary, "--listen", "127.0.0.1:0", "--nqn", NQN, "--ns", ns,
                                      "--cores", str(core), "--mode", mode, *tls],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        # "ready listen=127.0.0.1:PORT stats=... tls=..."
        self.port = next((w.rsplit(":", 1)[1] for w in line.split() if w.startswith("listen=")), None)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"{binary}: no ready line with an address ({line.strip()!r})")

    def cpu(self) -> tuple[float, float]:
        return cpu_of(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.psk_dir:
            shutil.rmtree(self.psk_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# Side names that stand for SPDK's target instead of a binary (nvmfbench.stacks.SPDK, SPDK_SPEC).
SPDK_SIDES = (bench_stacks.SPDK, bench_stacks.SPDK_SPEC)


class SpdkTarget:
    """SPDK's target (`spdk` or `spdk-spec`) on `core`, polling, started and stopped as the bench
    does it; the same face as Target (port, nqn, cpu(), and the process in .proc for the speed
    probe to pause). With `tls` its listener requires TLS 1.3 with the bench's PSK for the bench's
    host NQN, which SPDK 24.01 takes with version 0 identities only."""

    nqn = bench_stacks.NQN
    hostnqn = bench_stacks.TLS_HOSTNQN

    def __init__(self, label: str, core: int, bench: bench_stacks.Bench, tls: bool = False):
        self._stack = contextlib.ExitStack()
        self.tls_key = bench.tls_key if tls else None
        self.psk_path = bench.psk_path if tls else None
        try:
            self.running = self._stack.enter_context(bench.target(label + (bench_stacks.TLS_SUFFIX if tls else ""),
                                                                  [core], "poll"))
        except bench_stacks.BenchError as e:
            raise RuntimeError(str(e)) from None
        self.port = str(self.running.port)
        self.proc = self.running.proc

    def cpu(self) -> tuple[float, float]:
        return self.running.cpu_seconds() or (0.0, 0.0)

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def spdk_side_refusal(a: argparse.Namespace, works: list[dict]) -> str | None:
    """Why the asked-for A/B cannot have SPDK's target as a side, or None when it can (or has none)."""
    sides = [s for s in (a.a, a.b) if s in SPDK_SIDES]
    if not sides:
        return None
    what = f"--a/--b {sides[0]}"
    if a.fifo:
        return f"{what}: not with --fifo (SPDK's target polls, and a SCHED_FIFO poller on each core starves the rest)"
    if a.ns != DEFAULT_NS:
        return f"{what}: serves the bench's null namespace only (--ns {DEFAULT_NS})"
    if any(w["mode"] != "poll" for w in works):
        return f"{what}: SPDK's target always polls; use -poll works"
    return bench_stacks.spdk_missing()


HOSTS = ("nvmf-perf", "spdk_nvme_perf")


def spdk_perf_binary() -> str:
    """SPDK's spdk_nvme_perf from the build the bench uses (NVMFLAB_SPDK_DIR or ~/.cache/nvmflab)."""
    root = spdk_stack.spdk_dir(LocalHost())
    if root is None:
        raise StackError(f"--host spdk_nvme_perf: no SPDK build found; {spdk_stack.BUILD_HINT}")
    return f"{root}/build/bin/spdk_nvme_perf"


def host_argv(host: str, perf: str, target: Target | SpdkTarget, work: dict, host_core: int, seconds: int, ramp: int) -> list[str]:
    """The load generator's command line, its JSON (nvmf-perf) or text report (spdk_nvme_perf,
    which always polls: the work's mode is the target's only) on stdout."""
    if host == "spdk_nvme_perf":
        tls = target.tls_key is not None  # its PSK file: the target's psk_path
        knobs = (Workload(rw=work["rw"], bs=work["bs"], iodepth=work["iodepth"]).model_dump()
                 | Knobs(completion="poll", tls="on" if tls else "off").model_dump())
        job = PerfJob(role="main", knobs=knobs, cpus=(host_core,), nqn=target.nqn, hostnqn=target.hostnqn if tls else None)
        more = {"psk_path": str(target.psk_path)} if tls else {}
        return [perf, "--no-huge", "-s", str(spdk_stack.BASE_MEM_MB),
                *spdk_stack.perf_args(job, "127.0.0.1", int(target.port), seconds, ramp, **more)]
    argv = [perf, "run", "-a", "127.0.0.1", "-s", target.port, "-n", target.nqn, "--rw", work["rw"], "--bs", str(work["bs"]),
            "--iodepth", str(work["iodepth"]), "--runtime", f"{seconds}s", "--ramp_time", f"{ramp}s",
            "--completion", work["mode"], "--cpus_allowed", str(host_core), "-o", "json"]
    if target.tls_key:
        argv += tls_args(target.tls_key, target.hostnqn)[1]
        if isinstance(target, SpdkTarget):
            argv += ["--tls-key-identity", "0"]
    return argv


def report_of(host: str, out: str, work: dict, seconds: int, ramp: int) -> dict:
    """The host's report in fio's layout."""
    if host == "spdk_nvme_perf":
        return spdk_stack.parse_perf_text(out, work["rw"], 50, work["bs"], seconds, ramp)
    return json.loads(out)


def measure(perf: str, target: Target | SpdkTarget, work: dict, host_core: int, seconds: int, ramp: int,
            prefix: tuple[str, ...] = (), host: str = "nvmf-perf") -> dict:
    """One load-generator run: IOPS, bandwidth and the target's CPU per GiB (the caller adds the
    host's, from the children's rusage)."""
    argv = [*prefix, *host_argv(host, perf, target, work, host_core, seconds, ramp)]
    before = target.cpu()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return {"error": f"{host} did not start: {e}"}
    try:
        out, err = proc.communicate(timeout=seconds + ramp + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"error": f"{host} did not finish"}
    finally:
        shutil.rmtree(f"/var/run/dpdk/spdk_pid{proc.pid}", ignore_errors=True)  # what DPDK leaves behind
    after = target.cpu()
    if proc.returncode != 0:
        return {"error": (err.strip().splitlines() or ["?"])[-1]}
    try:
        doc = report_of(host, out, work, seconds, ramp)
    except (StackError, ValueError) as e:
        return {"error": f"{host} report unreadable: {e}"}
    side = "write" if "write" in work["rw"] else "read"
    bw = sum(j[side]["bw_bytes"] for j in doc["jobs"])
    iops = sum(j[side]["iops"] for j in doc["jobs"])
    return {"iops": iops, "bw_bytes": bw, "target_usr_s_per_gib": per_gib(after[0] - before[0], bw, seconds + ramp),
            "target_sys_s_per_gib": per_gib(after[1] - before[1], bw, seconds + ramp)}


def per_gib(cpu_s: float, bw_bytes: float, seconds: float) -> float | None:
    """CPU seconds per GiB moved; None for a run that moved nothing (a stalled machine can
    give one: it still counts as a run, with 0 IOPS)."""
    gib = bw_bytes * seconds / GIB
    return cpu_s / gib if gib > 0 else None


def median_of(runs: list[dict], key: str) -> float | None:
    """The median of `key` over the runs that have a value for it."""
    vals = [x[key] for x in runs if x.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio_interval(runs: list[dict], key: str) -> str:
    """B/A of the mean IOPS over the rounds, its 95 % interval (Fieller: A's variance included)
    and Welch's two-sided p of the difference, as one column; '—' with fewer than two runs a side."""
    side = {s: [x["iops"] for x in runs if x["side"] == s and x["work"] == key and "iops" in x] for s in "AB"}
    if min(len(v) for v in side.values()) < 2:
        return f"{'—':>22} {'—':>6}"
    r, lo, hi = (float(v) for v in fieller(side["A"], side["B"]))
    p = float(welch(side["A"], side["B"])[2])
    return f"{r:.3f} ({lo:.2f}–{hi:.2f})".rjust(22) + f" {p:6.3f}"


def paired_interval(runs: list[dict], key: str) -> str:
    """The geometric mean of the per-round B/A IOPS ratios and its 95 % t interval (on their
    logarithms: one stalled round's 6x must not outweigh many 0.9x), over the rounds where both
    sides moved data; '—' with fewer than two such rounds."""
    by_round: dict[int, dict[str, float]] = {}
    for x in runs:
        if x["work"] == key and "iops" in x:
            by_round.setdefault(x.get("round", 0), {})[x["side"]] = x["iops"]
    found = stats.paired_ratio_interval([r["B"] / r["A"] for r in by_round.values() if r.get("A") and r.get("B")])
    if found is None:
        return f"{'—':>22}"
    m, lo, hi = found
    return f"{m:.3f} ({lo:.2f}–{hi:.2f})".rjust(22)


def bound_of(runs: list[dict], records: list[dict], work: dict, impls: tuple[str, ...] = cipher.IMPLS) -> dict:
    """--bound: TLS (side B) against the limit the cipher (the faster of `impls`) puts on it. Per
    round, B's IOPS over the limit from A's (plain) IOPS and that round's cipher records; "median":
    the median TLS IOPS over the limit from the median plain IOPS and every round's records;
    "per_round": the geometric mean of the rounds' ratios, its 95 % interval and how many rounds,
    or None below two."""
    def limit(plain: float | None, recs: list[dict]) -> float | None:
        return bound.limit_at(plain, work["bs"], work["iodepth"], recs, impls)

    by_round: dict[int, dict[str, float]] = {}
    for x in runs:
        if x["work"] == work["key"] and x.get("iops"):
            by_round.setdefault(x.get("round", 0), {})[x["side"]] = x["iops"]
    ratios = []
    for r, sides in sorted(by_round.items()):
        cap = limit(sides.get("A"), [c for c in records if c.get("round") == r]) if "B" in sides else None
        if cap:
            ratios.append(sides["B"] / cap)
    med = {side: median_of([x for x in runs if x["work"] == work["key"] and x["side"] == side], "iops") for side in "AB"}
    cap = limit(med["A"], records)
    found = stats.paired_ratio_interval(ratios)
    return {"limit_iops": cap, "median": med["B"] / cap if cap and med["B"] else None,
            "per_round": None if found is None else (*found, len(ratios))}


def in_fast_phase(runs: list[dict]) -> list[dict]:
    """The runs the statistics use: every run the speed probe found in a slow phase of the
    machine (speed.mark_slow_phases, which marks them) is left out; runs without probes stay."""
    speed.mark_slow_phases(runs)
    return [x for x in runs if not x.get("slow_machine")]


def host_cpu(before: os.times_result, after: os.times_result) -> tuple[float, float]:
    return after.children_user - before.children_user, after.children_system - before.children_system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True,
                    help="the baseline nvmf-target binary, or spdk / spdk-spec for SPDK's target")
    ap.add_argument("--b", help="the nvmf-target binary (or spdk / spdk-spec) measured against it "
                                "(with --bound: default --a)")
    ap.add_argument("--host", choices=HOSTS, default="nvmf-perf",
                    help="the load generator: nvmf-perf, or SPDK's spdk_nvme_perf (polling; over TLS with its "
                         "socket buffers raised, as the bench runs it)")
    ap.add_argument("--perf", help="the load generator's binary (default: target/release/nvmf-perf, or SPDK's build)")
    ap.add_argument("--perf-a", help="nvmf-perf for side A (default --perf)")
    ap.add_argument("--perf-b", help="nvmf-perf for side B (default --perf)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--ramp", type=int, default=1)
    ap.add_argument("--target-core", type=int, default=0)
    ap.add_argument("--host-core", type=int, default=1)
    ap.add_argument("--works", default=DEFAULT_WORKS)
    ap.add_argument("--tls", action="store_true",
                    help="TLS 1.3 on every run: each target requires it, with one random PSK for nvmf-perf's host NQN")
    ap.add_argument("--bound", action="store_true",
                    help="A without TLS, B with TLS 1.3 (the same build unless --b), and each round the AES-GCM rate on "
                         "the target's core: each TLS run against the limit the cipher puts on it")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                    help="bracket runs with the speed probe and leave out slow-phase runs (default on)")
    ap.add_argument("--wait-for-fast", type=float, default=120.0,
                    help="seconds in all that runs may wait for the machine's fast phase (default 120)")
    ap.add_argument("--ns", type=parse_ns, default=DEFAULT_NS,
                    help="the namespace each target serves: null:SIZE (default null:1GiB; its reads never fill their "
                         "buffers) or ram:SIZE (reads copy into them, as a real namespace's do)")
    ap.add_argument("--fifo", action="store_true",
                    help="run the target and nvmf-perf under SCHED_FIFO (chrt -f 10), each killed after a bound; implies --no-probe")
    a = ap.parse_args(argv)
    if a.tls and a.bound:
        ap.error("--bound runs A without TLS and B with it: leave out --tls")
    if a.b is None and not a.bound:
        ap.error("--b is required (only --bound defaults it to --a)")
    a.b = a.b or a.a
    try:
        a.perf = a.perf or (spdk_perf_binary() if a.host == "spdk_nvme_perf"
                            else str(Path(__file__).resolve().parent.parent / "target/release/nvmf-perf"))
    except StackError as e:
        print(f"ab: {e}", file=sys.stderr)
        return 2
    gate = speed.Gate(budget_s=a.wait_for_fast) if a.probe and not a.fifo else None
    try:
        works = [parse_work(k.strip()) for k in a.works.split(",") if k.strip()]
    except ValueError as e:
        ap.error(str(e))
    refusal = spdk_side_refusal(a, works)
    if refusal:
        ap.error(refusal)
    if a.fifo and a.host == "spdk_nvme_perf" and any(w["mode"] == "poll" for w in works):
        # Seen 2026-12-07: every such run timed out, with both cores held by SCHED_FIFO pollers.
        ap.error("--fifo with --host spdk_nvme_perf and a polling target: spdk_nvme_perf does not finish "
                 "(both cores held by SCHED_FIFO pollers); use -event works")
    perf = {"A": a.perf_a or a.perf, "B": a.perf_b or a.perf}
    tls_key = random_key() if a.tls or a.bound else None
    runs, records = [], []
    try:
        rounds(a, works, perf, tls_key, gate, runs, records)
    except (RuntimeError, StackError) as e:  # a side that did not start (or no shim): what was measured is kept in --out
        print(f"ab: {e}", file=sys.stderr)
        return 1
    report(a, works, perf, gate, runs, records)
    return 0


def start_target(binary: str, core: int, mode: str, key: str | None, prefix: tuple[str, ...], ns: str,
                 bench: bench_stacks.Bench | None) -> Target | SpdkTarget:
    """A side's target: SPDK's for `spdk`/`spdk-spec` (through `bench`), else the nvmf-target binary."""
    if binary in SPDK_SIDES:
        return SpdkTarget(binary, core, bench, tls=key is not None)
    return Target(binary, core, mode, key, prefix, ns)


def rounds(a: argparse.Namespace, works: list[dict], perf: dict[str, str], tls_key: str | None,
           gate: speed.Gate | None, runs: list[dict], records: list[dict]) -> None:
    """Every round's runs, appended to `runs` (and the cipher's to `records`) as they come, and
    written to --out after each."""
    workdir = Path(tempfile.mkdtemp(prefix="nvmflab-ab-"))
    # One bench (its scratch directory and host) for every SPDK target the A/B starts.
    bench = bench_stacks.Bench(workdir, None) if {a.a, a.b} & set(SPDK_SIDES) else None
    try:
        # spdk_nvme_perf's TLS runs: its ssl socket with the buffers of its posix one.
        a.shim = (spdk_sockbuf.build(LocalHost(workdir=workdir)) if a.host == "spdk_nvme_perf" and (a.tls or a.bound)
                  else None)
        for r in range(a.rounds):
            one_round(a, r, works, perf, tls_key, gate, runs, records, bench)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def one_round(a: argparse.Namespace, r: int, works: list[dict], perf: dict[str, str], tls_key: str | None,
              gate: speed.Gate | None, runs: list[dict], records: list[dict],
              bench: bench_stacks.Bench | None) -> None:
    """Round `r`: each side's target started once per mode, every work against it."""
    if a.bound:  # before the round's targets start, on the target's core
        found = cipher.measure_round(a.target_core, r)
        records.extend(found)
        for err in sorted({c["error"] for c in found if c.get("error")}):
            print(f"round {r + 1} cipher: {err}", file=sys.stderr, flush=True)
    order = [("A", a.a), ("B", a.b)] if r % 2 == 0 else [("B", a.b), ("A", a.a)]
    for label, binary in order:
        key = tls_key if a.tls or (a.bound and label == "B") else None
        for mode in ("poll", "event"):
            todo = [w for w in works if w["mode"] == mode]
            if not todo:
                continue
            cpu_limit = len(todo) * (a.seconds + a.ramp + 40)
            prefix = fifo_prefix(a.fifo, cpu_limit)
            with start_target(binary, a.target_core, mode, key, prefix, a.ns, bench) as target:
                for w in todo:
                    # The speed probe around the run (target paused), waiting for a fast phase.
                    bracket = speed.Bracket(None, a.target_core, a.host_core, target, gate) if gate else None
                    with bracket or contextlib.nullcontext():
                        t0 = os.times()
                        shim = tuple(spdk_sockbuf.prefix(a.shim)) if key and a.shim else ()
                        run = measure(perf[label], target, w, a.host_core, a.seconds, a.ramp,
                                      fifo_prefix(a.fifo, a.seconds + a.ramp + 30) + shim, a.host)
                        if shim:
                            run["host_sockbuf"] = spdk_sockbuf.FLOOR_BYTES
                        usr, sys_ = host_cpu(t0, os.times())
                    if bracket:
                        run |= bracket.fields
                    if "bw_bytes" in run:
                        run |= {"host_usr_s_per_gib": per_gib(usr, run["bw_bytes"], a.seconds + a.ramp),
                                "host_sys_s_per_gib": per_gib(sys_, run["bw_bytes"], a.seconds + a.ramp)}
                    runs.append(run | {"side": label, "work": w["key"], "round": r})
                    if a.out:  # after every run: an interrupted A/B keeps what it measured
                        a.out.write_text(json.dumps({"a": a.a, "b": a.b, "ns": a.ns, "perf": perf, "runs": runs,
                                                     "cipher": records}, indent=1))
                    print(f"round {r + 1} {label} {w['key']}: "
                          + (run.get("error") or f"{run['iops'] / 1000:.0f} K IOPS, {run['bw_bytes'] / 1e9:.2f} GB/s"),
                          file=sys.stderr, flush=True)


def report(a: argparse.Namespace, works: list[dict], perf: dict[str, str], gate: speed.Gate | None,
           runs: list[dict], records: list[dict]) -> None:
    """The table of medians and intervals (and --bound's), and the whole record in --out."""
    all_runs, runs = runs, in_fast_phase(runs)
    if gate:
        print(f"speed probe: {len(all_runs) - len(runs)} of {len(all_runs)} runs in a slow phase of the machine, "
              f"left out with their pairs; waited {gate.waited:.0f} s for fast phases")
    print(f"{'workload':28} {'A':>12} {'B':>12} {'B/A':>6} {'means, 95 % interval':>22} {'p':>6} {'per round, 95 %':>22}   "
          "CPU s/GiB host usr+sys, target usr+sys: A | B")
    for w in works:
        med = {}
        for side in ("A", "B"):
            ok = [x for x in runs if x["side"] == side and x["work"] == w["key"] and "iops" in x]
            med[side] = {k: median_of(ok, k)
                         for k in ("iops", "bw_bytes", "host_usr_s_per_gib", "host_sys_s_per_gib",
                                   "target_usr_s_per_gib", "target_sys_s_per_gib")}
        a_, b_ = med["A"]["iops"], med["B"]["iops"]
        ratio = f"{b_ / a_:.3f}" if a_ and b_ else "—"
        interval = ratio_interval(runs, w["key"]) + " " + paired_interval(runs, w["key"])
        fmt = lambda m: f"{m['iops'] / 1000:.1f} K" if w["bs"] < 65536 else f"{m['bw_bytes'] / 1e9:.2f} GB/s"  # noqa: E731
        cpu = " | ".join(f"{m['host_usr_s_per_gib']:.3f}+{m['host_sys_s_per_gib']:.3f}, "
                         f"{m['target_usr_s_per_gib']:.3f}+{m['target_sys_s_per_gib']:.3f}"
                         if m["iops"] and m["host_usr_s_per_gib"] is not None else "—"
                         for m in (med["A"], med["B"]))
        print(f"{w['key']:28} {fmt(med['A']) if a_ else '—':>12} {fmt(med['B']) if b_ else '—':>12} {ratio:>6} "
              f"{interval}   {cpu}")
    if a.bound:
        print_bound(works, runs, records)
    if a.out:
        a.out.write_text(json.dumps({"a": a.a, "b": a.b, "ns": a.ns, "perf": perf, "runs": all_runs, "cipher": records}, indent=1))


def print_bound(works: list[dict], runs: list[dict], records: list[dict]) -> None:
    """--bound's table: each work's TLS IOPS against its cipher-bound limit."""
    print("\nTLS (B) against the limit AES-GCM puts on it, from the plain run (A) and the cipher's rate on the "
          "target's core (goal 0.90):")
    print("(the last two columns: against OpenSSL's EVP rate alone, the bound as issue 40 states it)")
    print(f"{'workload':28} {'limit':>10} {'TLS / limit':>12} {'per round, 95 %':>26} {'EVP limit':>10} "
          f"{'per round, 95 %':>26}")
    def limit(b: dict) -> str:
        return f"{b['limit_iops'] / 1000:.1f} K" if b["limit_iops"] else "—"

    def per_round(b: dict) -> str:
        pr = b["per_round"]
        return f"{pr[0]:.3f} ({pr[1]:.2f}–{pr[2]:.2f}, {pr[3]})" if pr else "— (fewer than 2 rounds)"

    for w in works:
        strict, evp = bound_of(runs, records, w), bound_of(runs, records, w, bound.OPENSSL_ONLY)
        median = f"{strict['median']:.3f}" if strict["median"] else "—"
        print(f"{w['key']:28} {limit(strict):>10} {median:>12} {per_round(strict):>26} {limit(evp):>10} "
              f"{per_round(evp):>26}")


if __name__ == "__main__":
    sys.exit(main())
