#!/usr/bin/env python3
"""TCP's instructions per I/O, base revision against new (issue 38 item 7): nvmf-target and
nvmf-perf both run under valgrind's callgrind on loopback (null namespace, event mode on both
sides, so no idle spinning is counted), on one core under SCHED_FIFO (see Sched), and the Ir
count of each is divided by the I/Os done.
Instruction counts hardly move on a loaded machine, which is why they are the gate here and not
IOPS.

nvmf-perf stops after a time, not after a count, so each workload runs twice per version, for
--seconds and three times as long; the I/Os come from nvmf-perf's JSON, and
Ir per I/O = (Ir(long) - Ir(short)) / (I/Os(long) - I/Os(short)), which leaves out start-up,
connect and exit.

A revision is built once into --cache/<sha>/ (git archive, then cargo build --release) and reused;
the working tree (the default --new) is built with cargo in place and its binaries copied aside,
so a rebuild by someone else during the run does not change what is measured.

A workload key ending in -tls (128k-randwrite-qd32-tls) runs over TLS 1.3 with userspace records
(one random PSK per run), so the record layer's instructions are counted too.

Exit status: 0 when every new/base is at most --max-ratio, 1 when one is above it, 2 when nothing
could be compared (bad argument, valgrind missing, unknown revision, failed build or run).

Usage: bench/callgrind.py [--base 786b8ae] [--new REV] [--works 4k-randread-qd1,128k-randwrite-qd32-tls,...] [--seconds 2]
                          [--max-ratio 1.02] [--out callgrind.json] [--cache DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

from nvmflab.tlskey import random_key  # noqa: E402
from nvmfbench.tls_args import tls_args as pair_tls_args  # noqa: E402

VALGRIND = "/usr/bin/valgrind"
NQN = "nqn.2024-01.io.nvmflab:callgrind"
TLS_HOSTNQN = "nqn.2024-01.io.nvmflab:callgrind:host"
BINARIES = ("nvmf-target", "nvmf-perf")
DEFAULT_BASE = "786b8ae"  # the code before issue 38's transport work
DEFAULT_WORKS = "4k-randread-qd1,128k-randread-qd32,4k-randwrite-qd1,128k-randwrite-qd32"
LONG_FACTOR = 3  # the long run is this many times the short one
MIN_GROWTH = 1.5  # the long run must do at least this many times the short run's I/Os
BUILD_TIMEOUT_S = 3600
READY_TIMEOUT_S = 120  # the target's start-up under callgrind, on a loaded machine
EXIT_TIMEOUT_S = 60  # callgrind writes its counts on SIGTERM
HOST_JOB_FN = "nvmf_host::perf::job::run_job"  # a job thread's whole life: connect, I/O, disconnect


class CallgrindError(Exception):
    """Why nothing could be compared; main prints it and exits 2."""


@dataclass(frozen=True)
class Work:
    key: str
    bs: int
    rw: str
    iodepth: int
    tls: bool = False


def parse_work(key: str) -> Work:
    """'128k-randread-qd32' (or '...-tls') -> a Work."""
    parts = key.split("-")
    tls = len(parts) == 4 and parts[3] == "tls"
    ok = (len(parts) == 3 + tls and parts[0][:-1].isdigit() and parts[0].endswith("k")
          and parts[1] in ("randread", "randwrite") and parts[2].startswith("qd") and parts[2][2:].isdigit())
    if not ok:
        raise CallgrindError(f"workload {key!r}: expected SIZEk-randread|randwrite-qdN[-tls], e.g. 4k-randread-qd1")
    return Work(key, int(parts[0][:-1]) * 1024, parts[1], int(parts[2][2:]), tls)


def tls_args(work: Work) -> tuple[list[str], list[str]]:
    """The target's and nvmf-perf's extra arguments: TLS required, one fresh PSK for TLS_HOSTNQN."""
    return pair_tls_args(random_key(), TLS_HOSTNQN) if work.tls else ([], [])


def callgrind_ir(text: str) -> int:
    """The Ir total of one callgrind output file: its 'totals:' line (or 'summary:', which older
    versions write alone), in the column its 'events:' line gives Ir."""
    events, found = None, {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == "events":
            events = rest.split()
        elif key in ("totals", "summary"):
            found[key] = rest.split()
    values = found.get("totals") or found.get("summary")
    if events is None or "Ir" not in events or values is None:
        raise CallgrindError("callgrind output without an events: line naming Ir and a totals: or summary: line")
    column = events.index("Ir")
    if column >= len(values) or not values[column].isdigit():
        raise CallgrindError(f"callgrind output: no Ir total in {' '.join(values)!r}")
    return int(values[column])


def perf_ios(report: dict) -> int:
    """I/Os nvmf-perf completed, reads and writes of every job (its fio-layout JSON)."""
    try:
        return sum(int(job[side]["total_ios"]) for job in report["jobs"] for side in ("read", "write"))
    except (KeyError, TypeError, ValueError) as e:
        raise CallgrindError(f"nvmf-perf's JSON has no total_ios per job and side ({e})") from None


def per_io(short: dict, long: dict) -> dict[str, float]:
    """Ir per I/O of the target and the host from a short and a long run of one workload: the
    difference cancels what both runs pay once (start-up, connect, exit)."""
    ios = long["ios"] - short["ios"]
    if short["ios"] <= 0 or long["ios"] < MIN_GROWTH * short["ios"]:
        raise CallgrindError(f"the long run did {long['ios']} I/Os, the short one {short['ios']}: "
                             f"need at least {MIN_GROWTH}x as many to subtract start-up (machine stalled?)")
    return {side: (long[side] - short[side]) / ios for side in ("target", "host")}


def compare(base: dict, new: dict, max_ratio: float) -> tuple[list[dict], int]:
    """Rows of side, work, base and new Ir per I/O and new/base, and the exit status: 1 when a
    ratio exceeds max_ratio, else 0. base and new map work -> side -> Ir per I/O."""
    rows, status = [], 0
    for side in ("target", "host"):
        for work in base:
            b, n = base[work][side], new[work][side]
            ratio = n / b if b > 0 else float("inf")
            over = ratio > max_ratio
            status = 1 if over else status
            rows.append({"side": side, "work": work, "base_ir_per_io": b, "new_ir_per_io": n,
                         "ratio": ratio, "over": over})
    return rows, status


def table(rows: list[dict], max_ratio: float) -> str:
    """The rows as a Markdown table."""
    out = ["| side | work | base Ir/I/O | new Ir/I/O | new/base |", "|---|---|---:|---:|---:|"]
    for r in rows:
        mark = f" (> {max_ratio})" if r["over"] else ""
        out.append(f"| {'nvmf-' + r['side'] if r['side'] == 'target' else 'nvmf-perf (host)'} | {r['work']} "
                   f"| {r['base_ir_per_io']:,.0f} | {r['new_ir_per_io']:,.0f} | {r['ratio']:.3f}{mark} |")
    return "\n".join(out)


def git(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise CallgrindError(f"git {' '.join(args)}: {proc.stderr.strip() or 'failed'}")
    return proc.stdout.strip()


def resolve(rev: str) -> str:
    """The full commit id of `rev`."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except CallgrindError:
        raise CallgrindError(f"revision unknown: {rev!r} names no commit in {REPO}") from None


def cargo_build(src: Path, log: Path) -> None:
    """cargo build --release of the two binaries in `src`, its output in `log`."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo/bin/cargo")
    argv = [cargo, "build", "--release", *(f"--bin={b}" for b in BINARIES)]
    print(f"callgrind: building in {src} (log: {log})", file=sys.stderr, flush=True)
    try:
        with log.open("w") as out:
            proc = subprocess.run(argv, cwd=src, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CallgrindError(f"build failed: cargo took over {BUILD_TIMEOUT_S} s in {src} (log: {log})") from None
    except OSError as e:
        raise CallgrindError(f"build failed: cargo did not start ({e})") from None
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise CallgrindError(f"build failed in {src} (log: {log}):\n  " + "\n  ".join(tail))


def built_revision(sha: str, cache: Path) -> Path:
    """The release directory of `sha`, built once under cache/<sha>/ and reused after."""
    home = cache / sha
    release = home / "src/target/release"
    if (home / "built").exists() and all((release / b).exists() for b in BINARIES):
        return release
    src = home / "src"
    src.mkdir(parents=True, exist_ok=True)
    # git archive, not a worktree: nothing is left registered in the shared repository.
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", sha], stdout=subprocess.PIPE)
    try:
        subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True, timeout=300)
        archive.stdout.close()
        if archive.wait(60) != 0:
            raise CallgrindError(f"git archive {sha} failed")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        archive.kill()
        archive.wait()
        raise CallgrindError(f"unpacking {sha} into {src} failed ({e})") from None
    cargo_build(src, home / "build.log")
    (home / "built").write_text(f"{sha}\n")
    return release


def built_tree(copy_to: Path) -> Path:
    """The working tree's binaries, built in place and copied into `copy_to`."""
    cargo_build(REPO, copy_to / "build.log")
    for b in BINARIES:
        shutil.copy2(REPO / "target/release" / b, copy_to / b)
    return copy_to


@dataclass
class Version:
    label: str  # "base" or "new"
    rev: str | None  # None: the working tree
    sha: str
    bins: Path = Path()

    def describe(self) -> str:
        if self.rev is not None:
            return f"{self.rev} ({self.sha[:10]})"
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return f"working tree (HEAD {self.sha[:10]}{', with uncommitted changes' if dirty else ''})"


@dataclass(frozen=True)
class Sched:
    """Where target and host run: both on one core, each until it waits for the other, so how
    their PDUs batch (and with it the instructions per I/O at QD32) does not depend on when the
    other side happened to be scheduled. SCHED_FIFO (root) gives that exactly: same-priority
    FIFO tasks are never preempted by each other or by ordinary tasks. Without it, SCHED_BATCH
    (never preempts on wake-up, but time slices still cut in: QD32 rows move by a few %)."""
    core: int
    policy: str  # "fifo" or "batch"

    def prefix(self, cpu_seconds: int) -> list[str]:
        # prlimit: a FIFO process that outlives its timeout would hold its core.
        chrt = ["prlimit", f"--cpu={cpu_seconds}", "chrt", "--fifo", "1"] if self.policy == "fifo" else ["chrt", "--batch", "0"]
        return ["taskset", "-c", str(self.core), *chrt]


def choose_sched(core: int) -> Sched:
    """SCHED_FIFO where this process may use it, else SCHED_BATCH."""
    try:
        ok = subprocess.run(["chrt", "--fifo", "1", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return Sched(core, "fifo" if ok else "batch")


def valgrind(out_file: Path, sched: Sched, cpu_seconds: int, *options: str) -> list[str]:
    return [*sched.prefix(cpu_seconds), VALGRIND, "--tool=callgrind", f"--callgrind-out-file={out_file}", *options]


def wait_ready(proc: subprocess.Popen, timeout: float) -> str:
    """The port from the target's 'ready listen=127.0.0.1:PORT ...' line."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            port = next((w.rsplit(":", 1)[1] for w in line.split() if w.startswith("listen=")), None)
            if port:
                return port
    finally:
        sel.close()
    raise CallgrindError(f"nvmf-target under callgrind gave no ready line within {timeout:.0f} s "
                         f"(exit status {proc.poll()})")


class Target:
    """nvmf-target under callgrind on 127.0.0.1, null namespace, one event-mode reactor; stopped
    with SIGTERM on exit (callgrind then writes its counts), killed if that takes too long."""

    def __init__(self, bins: Path, out_file: Path, log: Path, sched: Sched, cpu_seconds: int, extra: list[str]):
        argv = [*valgrind(out_file, sched, cpu_seconds), str(bins / "nvmf-target"), "--listen", "127.0.0.1:0",
                "--nqn", NQN, "--ns", "null:1GiB", "--cores", str(sched.core), "--mode", "event", *extra]
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after EXIT_TIMEOUT_S; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


def run_once(bins: Path, work: Work, seconds: int, tmp: Path, tag: str, sched: Sched) -> dict:
    """One run of `work` for `seconds`, target and host both under callgrind on one core: their Ir
    and the I/Os done. The host counts only inside its job thread (HOST_JOB_FN), which leaves out
    the report it builds at the end, and its per-interval log is off (--log_avg_msec 0): both cost
    by the run's length, not its I/Os."""
    target_out, host_out = tmp / f"{tag}.target.cg", tmp / f"{tag}.host.cg"
    timeout = seconds * 10 + 120  # start-up and connect under callgrind on a loaded machine
    target_tls, host_tls = tls_args(work)
    with Target(bins, target_out, tmp / f"{tag}.target.log", sched, READY_TIMEOUT_S + timeout, target_tls) as target:
        port = wait_ready(target.proc, READY_TIMEOUT_S)
        argv = [*valgrind(host_out, sched, timeout, "--collect-atstart=no", f"--toggle-collect={HOST_JOB_FN}"),
                str(bins / "nvmf-perf"), "run", "-a", "127.0.0.1", "-s", port, "-n", NQN,
                "--rw", work.rw, "--bs", str(work.bs), "--iodepth", str(work.iodepth), "--runtime", f"{seconds}s",
                "--completion", "event", "--cpus_allowed", str(sched.core), "--log_avg_msec", "0", "-o", "json", *host_tls]
        try:
            host = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CallgrindError(f"{work.key}: nvmf-perf under callgrind ran over {timeout} s") from None
        if host.returncode != 0:
            last = [ln for ln in host.stderr.splitlines() if not ln.startswith("==")][-1:] or ["?"]
            raise CallgrindError(f"{work.key}: nvmf-perf exited {host.returncode}: {last[0]}")
        status = target.stop()
    if not target_out.exists():
        raise CallgrindError(f"{work.key}: nvmf-target under callgrind wrote no counts (exit status {status})")
    try:
        report = json.loads(host.stdout)
    except json.JSONDecodeError as e:
        raise CallgrindError(f"{work.key}: nvmf-perf's output is not JSON ({e})") from None
    counts = {"target": callgrind_ir(target_out.read_text(errors="replace")),
              "host": callgrind_ir(host_out.read_text(errors="replace")),
              "ios": perf_ios(report), "seconds": seconds}
    if counts["host"] == 0:
        raise CallgrindError(f"{work.key}: no host instructions counted inside {HOST_JOB_FN} (renamed?)")
    return counts


def measure(version: Version, works: list[Work], seconds: int, tmp: Path, sched: Sched) -> tuple[dict, list[dict]]:
    """work -> side -> Ir per I/O for one version, and its raw runs; callgrind's files in `tmp`."""
    result, runs = {}, []
    for work in works:
        pair = []
        for secs in (seconds, seconds * LONG_FACTOR):
            run = run_once(version.bins, work, secs, tmp, f"{version.label}-{work.key}-{secs}s", sched)
            print(f"callgrind: {version.label} {work.key} {secs} s: {run['ios']} I/Os, target {run['target']:,} Ir, "
                  f"host {run['host']:,} Ir", file=sys.stderr, flush=True)
            runs.append(run | {"version": version.label, "work": work.key})
            pair.append(run)
        result[work.key] = per_io(*pair)
    return result, runs


def valgrind_version() -> str:
    if not os.access(VALGRIND, os.X_OK):
        raise CallgrindError(f"valgrind not found at {VALGRIND}: install it (apt-get install valgrind)")
    return subprocess.run([VALGRIND, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=DEFAULT_BASE, help=f"baseline revision (default {DEFAULT_BASE})")
    ap.add_argument("--new", help="revision measured against it (default: the working tree)")
    ap.add_argument("--works", default=DEFAULT_WORKS, help=f"comma-separated workloads (default {DEFAULT_WORKS})")
    ap.add_argument("--seconds", type=int, default=2, help="the short run's length; the long run is 3x (default 2)")
    ap.add_argument("--core", type=int, default=0, help="the one core target and host share (default 0)")
    ap.add_argument("--max-ratio", type=float, default=1.02, help="largest new/base that passes (default 1.02)")
    ap.add_argument("--out", type=Path, help="write the rows, raw runs and versions here as JSON")
    ap.add_argument("--profiles", type=Path,
                    help="keep every run's callgrind files here (for callgrind_annotate), not in a temporary folder")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/nvmflab/callgrind",
                    help="where built revisions are kept (default ~/.cache/nvmflab/callgrind)")
    a = ap.parse_args(argv)
    if a.seconds < 1 or a.max_ratio <= 0:
        ap.error("--seconds must be at least 1 and --max-ratio above 0")
    if a.core not in os.sched_getaffinity(0):
        ap.error(f"--core {a.core}: not among this process's CPUs {sorted(os.sched_getaffinity(0))}")
    return a


def run(a: argparse.Namespace) -> int:
    works = [parse_work(k.strip()) for k in a.works.split(",") if k.strip()]
    if not works:
        raise CallgrindError("--works names no workload")
    tool = valgrind_version()
    sched = choose_sched(a.core)
    versions = [Version("base", a.base, resolve(a.base)),
                Version("new", a.new, resolve(a.new or "HEAD"))]
    described = {v.label: v.describe() for v in versions}  # before the build: the tree as measured
    with tempfile.TemporaryDirectory(prefix="nvmflab-callgrind-") as tmp_name:
        tmp = Path(tmp_name)
        for v in versions:
            v.bins = built_revision(v.sha, a.cache) if v.rev is not None else built_tree(tmp)
        measured, runs = {}, []
        profiles = a.profiles or tmp
        profiles.mkdir(parents=True, exist_ok=True)
        for v in versions:
            measured[v.label], version_runs = measure(v, works, a.seconds, profiles, sched)
            runs += version_runs
    rows, status = compare(measured["base"], measured["new"], a.max_ratio)
    print(f"Instructions per I/O (callgrind Ir), base {described['base']}, new {described['new']}, "
          f"{datetime.date.today()}, {tool}, SCHED_{sched.policy.upper()} on core {sched.core}\n")
    print(table(rows, a.max_ratio))
    if a.out:
        a.out.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "valgrind": tool, "sched": sched.policy, "core": sched.core, "max_ratio": a.max_ratio,
            "seconds": a.seconds, "long_factor": LONG_FACTOR,
            "versions": {v.label: {"rev": v.rev, "sha": v.sha, "described": described[v.label]} for v in versions},
            "rows": rows, "runs": runs}, indent=1))
    return status


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        return run(a)
    except CallgrindError as e:
        print(f"callgrind: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("callgrind: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so every target under callgrind is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    sys.exit(main())
