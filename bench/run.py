#!/usr/bin/env python3
"""nvmflab benchmark: our NVMe/TCP stack side by side with SPDK's, as ratios measured in one run.

Suites (--suites, default matrix,scaling,memory):
  matrix    every target x host pair of {SPDK nvmf_tgt, nvmf-target} x {spdk_nvme_perf, nvmf-perf}
            on 4 KiB randread QD1/QD32/QD128, 4 KiB randwrite QD32 and 128 KiB randread and
            randwrite QD32 (null namespace, target busy-polling on one core, host polling on
            another), in interleaved rounds, plus TLS rows (--tls, default on: ours and SPDK with TLS
            1.3 as targets and hosts at 4 KiB randread QD1/QD32, 4 KiB randwrite QD32 and 128 KiB
            randread and randwrite, each against the limit AES-GCM puts on it, from its plain row and
            the cipher's rate measured each round on the target's core); each round adds our stack in
            event mode at QD1 and at 128 KiB, and the busy and blocking TCP ping-pong floors. Prints ratios of medians,
            each side's user and system CPU per GiB at 128 KiB (polling and event mode), and
            issue 9's goals; the report names the CPU model, and a full run (not --quick) keeps
            its tables in bench/README.md as the latest for its CPU vendor. With SPDK
            built, SPDK's target also runs as spdk-spec: C2HData SUCCESS only where the
            specification allows it (as ours), to show what SPDK's shortcut is worth.
  scaling   our target's IOPS with 1..N reactors (N = half the cores), enough host jobs.
  memory    the target's RSS with 1, 100 and 1000 I/O queues connected at QD128 (SPDK's up to 100).
  classic   the older comparisons of our own configurations and fio (nvmfbench/classic.py).

Every run records the CPU time other processes used on its cores meanwhile (nvmflab.sysstat);
runs above the noise limit (NVMFLAB_NOISE_LIMIT_PCT, default 10 %) are left out of the medians,
and the output says so. SPDK comes from `make spdk` (NVMFLAB_SPDK_DIR or ~/.cache/nvmflab); without
a build its pairs are skipped with the reason.

Usage: bench/run.py [--quick] [--seconds 3] [--ramp 1] [--rounds 3] [--stacks ours,spdk,spdk-spec]
                    [--works all] [--suites matrix,scaling,memory] [--out bench/results.json]
                    [--readme | --no-readme] [--tls | --no-tls] [--tcp-congestion NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvmflab import cores as core_lists  # noqa: E402
from nvmflab import sysstat  # noqa: E402
from nvmfbench import congestion, floor, matrix, memory, report, scaling, speed  # noqa: E402
from nvmfbench.stacks import (MATRIX_WORKS, SPDK_SPEC, TLS_WORKS, Bench, BenchError, bench_binary,  # noqa: E402
                               spdk_missing)

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("matrix", "scaling", "memory", "classic")
DEFAULT_SUITES = "matrix,scaling,memory"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round of 1 s, no ramp, memory with 1 and 10 queues")
    ap.add_argument("--seconds", type=int, help="measured seconds per run (whole seconds: spdk_nvme_perf); default 3")
    ap.add_argument("--ramp", type=int, help="unmeasured warm-up seconds per run; default 1")
    ap.add_argument("--rounds", type=int, help="interleaved rounds; default 3")
    ap.add_argument("--wait-for-fast", type=float, dest="wait_for_fast",
                    help="seconds in all the matrix may wait for the machine's fast phase before runs "
                         "(nvmfbench/speed.py); default 600, 0 with --quick")
    ap.add_argument("--stacks", default=f"ours,spdk,{SPDK_SPEC}",
                    help=f"stacks in the matrix, as targets and as hosts; {SPDK_SPEC} is a target only: SPDK's "
                         "with C2HData SUCCESS only as the specification allows it")
    ap.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                    help="TLS rows: ours and SPDK with TLS 1.3 (one PSK) as targets and hosts, on "
                         + ", ".join(TLS_WORKS) + " (those of --works); default on")
    ap.add_argument("--works", default="all",
                    help="comma list of the matrix's workloads, or all: " + ", ".join(w.key for w in MATRIX_WORKS))
    ap.add_argument("--suites", default=DEFAULT_SUITES, help=f"comma list of {', '.join(SUITES)}, or all")
    ap.add_argument("--memory-counts", help="I/O queue counts for the memory suite; default 1,100,1000")
    ap.add_argument("--target-core", type=int, default=0)
    ap.add_argument("--host-core", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    ap.add_argument("--readme", action=argparse.BooleanOptionalAction, default=None,
                    help="put the tables in bench/README.md as the latest figures for this CPU vendor (one block "
                         "per vendor); default on, off with --quick")
    ap.add_argument("--tcp-congestion", dest="tcp_congestion", metavar="NAME",
                    help="set the machine's TCP congestion control (net.ipv4.tcp_congestion_control; root) to NAME "
                         "for the run and put the old one back after it, so that every stack, SPDK's too, runs under "
                         "it; default: system, the machine's own. The report names it; bench/README.md is left alone "
                         "unless --readme is given")
    a = ap.parse_args(argv)
    a.seconds = a.seconds if a.seconds is not None else (1 if a.quick else 3)
    a.ramp = a.ramp if a.ramp is not None else (0 if a.quick else 1)
    a.rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    a.wait_for_fast = a.wait_for_fast if a.wait_for_fast is not None else (0.0 if a.quick else 600.0)
    counts = a.memory_counts or ("1,10" if a.quick else ",".join(str(c) for c in memory.COUNTS))
    suites = SUITES if a.suites == "all" else tuple(s.strip() for s in a.suites.split(",") if s.strip())
    stacks = [s.strip() for s in a.stacks.split(",") if s.strip()]
    problems = [f"unknown suite {s!r}" for s in suites if s not in SUITES]
    problems += [f"unknown stack {s!r} (ours, spdk, {SPDK_SPEC})" for s in stacks if s not in ("ours", "spdk", SPDK_SPEC)]
    if stacks and all(s == SPDK_SPEC for s in stacks):
        problems.append(f"--stacks {SPDK_SPEC} needs a host: add ours or spdk")
    keys = [k.strip() for k in a.works.split(",") if k.strip()] if a.works != "all" else [w.key for w in MATRIX_WORKS]
    known = {w.key: w for w in MATRIX_WORKS}
    problems += [f"unknown workload {k!r} ({', '.join(known)})" for k in keys if k not in known]
    if not keys:
        problems.append("--works names no workload")
    if not 1 <= a.seconds <= 600 or not 0 <= a.ramp <= 60 or not 1 <= a.rounds <= 50:
        problems.append("--seconds must be 1..600, --ramp 0..60, --rounds 1..50")
    if not 0 <= a.wait_for_fast <= 86400:
        problems.append("--wait-for-fast must be 0..86400 seconds")
    try:
        a.memory_counts = [int(c) for c in counts.split(",")]
        if any(not 1 <= c <= 10000 for c in a.memory_counts):
            raise ValueError
    except ValueError:
        problems.append(f"--memory-counts {counts!r}: comma list of 1..10000")
    if a.tcp_congestion is not None:
        try:
            a.tcp_congestion = congestion.check_name(a.tcp_congestion)  # None for system
        except congestion.CongestionError as err:
            problems.append(str(err))
    a.readme = a.readme if a.readme is not None else not a.quick and a.tcp_congestion is None
    if problems:
        ap.error("; ".join(problems))
    a.suites, a.stacks = suites, stacks
    a.works = tuple(w for w in MATRIX_WORKS if w.key in keys)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        with congestion.set_for_run(a.tcp_congestion) as machine_congestion:
            return bench_run(a, machine_congestion)
    except congestion.CongestionError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2


def bench_run(a: argparse.Namespace, machine_congestion: str) -> int:
    """The suites, the report and its files; the congestion control is set by then."""
    for tool in ("nvmf-target", "nvmf-perf", "nvmf-bench"):
        try:
            bench_binary(tool)
        except BenchError as err:
            print(f"bench: {err}", file=sys.stderr)
            return 2
    available = core_lists.available_cores()
    if a.target_core not in available or a.host_core not in available or a.target_core == a.host_core:
        print(f"bench: --target-core {a.target_core} and --host-core {a.host_core} must be two different cores of "
              f"{available}", file=sys.stderr)
        return 2
    stacks = list(a.stacks)
    wants_spdk = "spdk" in stacks or SPDK_SPEC in stacks
    missing = spdk_missing() if wants_spdk else "left out by --stacks"
    if wants_spdk and missing:
        print(f"bench: SPDK skipped: {missing}", file=sys.stderr)
        stacks = [s for s in stacks if s not in ("spdk", SPDK_SPEC)]
    hosts = [s for s in stacks if s != SPDK_SPEC]
    limit = sysstat.noise_limit()
    for warning in sysstat.machine_warnings(sample_s=0.5):
        print(f"bench: note: {warning}", file=sys.stderr)

    cfg = matrix.Config(seconds=a.seconds, ramp=a.ramp, rounds=a.rounds, target_core=a.target_core,
                        host_core=a.host_core, targets=stacks, hosts=hosts, works=a.works,
                        wait_budget_s=a.wait_for_fast, tls=a.tls)
    floor_missing = floor.available()
    cfg.floor = floor_missing is None
    target_pool, host_pool = scaling.split_cores(available)
    total = (matrix.planned_runs(cfg) if "matrix" in a.suites else 0) \
        + (len(target_pool) * a.rounds if "scaling" in a.suites else 0) \
        + (sum(len(memory.counts_for(s, a.memory_counts)) for s in hosts) if "memory" in a.suites else 0)
    progress = matrix.Progress(total)
    runs, floors, scaled, mem, classic, ciphers = [], [], [], [], [], []
    waited = 0.0
    with tempfile.TemporaryDirectory(prefix="nvmflab-bench-") as tmp:
        bench = Bench(Path(tmp), limit)
        if "matrix" in a.suites:
            found = matrix.run_matrix(bench, cfg, progress)
            runs, floors, ciphers, waited = found["runs"], found["floor"], found["cipher"], found["waited_s"]
        if "scaling" in a.suites:
            probing = bench.noise_limit_pct is not None
            gate = speed.Gate(max(0.0, a.wait_for_fast - waited)) if probing else None
            for probe_ns in (p for r in runs + floors for p in r.get("probe_ns") or []):
                gate.seen(probe_ns)  # the matrix's fastest phase sets the pace
            for r in range(a.rounds):
                for n in range(1, len(target_pool) + 1):
                    run = safely(lambda: scaling.measure(bench, n, target_pool, host_pool, a.seconds, a.ramp, gate))
                    scaled.append(run | {"reactors": n, "round": r})
                    progress.step(f"round {r + 1} scaling, {n} reactor(s)", run)
            if probing:
                # Slow relative to the fastest phase any run of the bench saw.
                speed.mark_slow_phases(runs + floors + scaled)
                waited += gate.waited
        if "memory" in a.suites:
            for stack in hosts:
                for count in memory.counts_for(stack, a.memory_counts):
                    point = safely(lambda: memory.measure(bench, stack, count, [a.target_core], a.host_core))
                    mem.append(point | {"stack": stack, "queues_wanted": count})
                    print(f"[{progress.done + 1}/{progress.total}] memory, {stack} target, {count} I/O queues: "
                          + (f"FAILED: {point['error']}" if point.get("error") else
                             f"RSS {point['rss_bytes'] / (1 << 20):.1f} MiB "
                             f"(idle {point['rss_idle_bytes'] / (1 << 20):.1f})"), file=sys.stderr, flush=True)
                    progress.done += 1
    if "classic" in a.suites:
        from nvmfbench.classic import run_classic

        classic = run_classic(a.seconds, a.rounds)

    config = {"seconds": a.seconds, "ramp": a.ramp, "rounds": a.rounds, "target_core": a.target_core,
              "host_core": a.host_core, "stacks": stacks, "suites": list(a.suites), "tls": a.tls,
              "works": [w.name for w in cfg.works], "floor": floor_missing or "nvmf-bench pingpong",
              "waited_for_fast_phase_s": round(waited, 1), "tcp_congestion_set": a.tcp_congestion,
              "tcp_congestion_machine": machine_congestion}
    results = report.assemble(runs, floors, config["works"], config, missing, scaled, mem, limit, ciphers)
    if classic:
        results["classic"] = classic
    text = report.markdown(results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2))
    a.out.with_suffix(".md").write_text(text)
    vendor = results["machine"]["vendor"]
    if a.readme and results["matrix"]:
        readme = ROOT / "bench" / "README.md"
        readme.write_text(report.readme_with_latest(readme.read_text(), vendor, text))
        print(f"bench: bench/README.md now holds these figures as the latest on {vendor}", file=sys.stderr)
    print(text)
    print(f"bench: details in {a.out}, tables in {a.out.with_suffix('.md')}", file=sys.stderr)
    return 0


def safely(measure) -> dict:
    """A measurement that failed becomes a record with "error", so the others still run."""
    try:
        return measure()
    except (BenchError, OSError, ValueError) as err:
        return {"error": str(err)}


if __name__ == "__main__":
    sys.exit(main())
