#!/usr/bin/env python3
"""What Linux 6.12's nvme-tcp host puts on the wire against our target, and the target's system
calls per I/O under it (issue 40 item 3): one trixie guest boot (tests/guest/trixie.py) runs
bench/kernel-wire-guest.sh, which connects the kernel's host to our nvmf-target on the guest's
loopback and runs fio for each work, capturing each run with tcpdump and counting the target's
successful system calls with a hist trigger. Prints bench/README.md's table rows for the kernel host
and writes DIR/report.json.

The guest runs under TCG: its timings are not performance, only the pattern (PDUs, sizes, calls per
I/O) is evidence. The guest image has no tcpdump: trixie's tcpdump and libpcap .debs are fetched once
into ~/.cache/nvmflab/kernel-wire with apt-get download (the guest's own apt lists) and put in the
guest's overlay. qemu is killed at --timeout and when this process dies.

Usage: bench/kernel_wire.py [--out DIR] [--works 4k-randread-qd1,4k-randread-qd32+digest,...]
       bench/kernel_wire.py --report DIR     (the rows again from a finished run's files)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests/guest"))

import trixie  # noqa: E402
from nvmfbench.syscalls import SyscallsError, calls_per_io, parse_hist, parse_ios, threads_calls  # noqa: E402
from nvmfbench.wire_row import VARIANTS, table_row, work_name  # noqa: E402

WORKS = ("4k-randread-qd1", "4k-randread-qd32", "4k-randread-qd128", "4k-randwrite-qd32",
         "128k-randread-qd32", "128k-randwrite-qd32")
TOOLS = ("tcpdump", "libpcap0.8t64")
TOOL_FILES = ("usr/bin/tcpdump", "usr/lib/x86_64-linux-gnu/libpcap.so.0.8")
CACHE = trixie.CACHE.parent / "kernel-wire"
BIN = Path(os.environ.get("NVMFLAB_BIN_DIR", ROOT / "target/release"))
HOST = "Linux 6.12 nvme-tcp (fio libaio)"


def fetch_tools() -> dict[str, Path]:
    """Guest path -> local file of tcpdump and libpcap, from trixie's .debs (fetched once)."""
    tree = CACHE / "tree"
    if not all((tree / f).exists() for f in TOOL_FILES):
        apt = trixie.CACHE / "apt"  # the lists tests/blktests/build-guest.sh keeps
        debs = CACHE / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        opts = [f"-oDir::Etc::sourcelist={apt}/sources.list", "-oDir::Etc::sourceparts=-", f"-oDir::State={apt}/state",
                f"-oDir::State::Lists={apt}/lists", f"-oDir::State::status={apt}/state/status",
                f"-oDir::Cache={CACHE}/apt-cache", "-oAPT::Architecture=amd64", "-oDebug::NoLocking=1",
                "-oAPT::Sandbox::User=root"]
        got = subprocess.run(["apt-get", *opts, "download", *TOOLS], cwd=debs, capture_output=True, text=True,
                             timeout=300)
        if got.returncode != 0:
            raise trixie.GuestUnavailable(f"apt-get download {' '.join(TOOLS)} failed: {got.stderr.strip()[-300:]}")
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=60)
    return {"/" + f: tree / f for f in TOOL_FILES}  # the .so.0.8 link is copied as the file it names


def work_report(out: Path, work: str) -> dict[str, Any]:
    """A work's capture summary and the target's calls per I/O, from the guest's files."""
    found: dict[str, Any] = {"work": work}
    summary_file = out / f"{work}.summary.json"
    try:
        found["wire"] = json.loads(summary_file.read_text())
    except (OSError, ValueError) as err:
        err_file = out / f"{work}.summary.err"
        found["error"] = f"no capture summary ({err}; {err_file.read_text()[-300:] if err_file.exists() else ''})"
        return found
    try:
        ios = parse_ios((out / f"{work}.ios.txt").read_text())
        tids = {int(t) for t in (out / f"{work}.tids.txt").read_text().split()}
        found["ios"] = ios
        hist = parse_hist((out / f"{work}.hist.txt").read_text())
        found["calls per I/O"] = calls_per_io(threads_calls(hist, tids), ios)
    except (OSError, ValueError, SyscallsError) as err:
        found["calls error"] = str(err)
    return found


def report(out: Path, works: list[str]) -> int:
    reports = [work_report(out, w) for w in works]
    (out / "report.json").write_text(json.dumps(reports, indent=1))
    for r in reports:
        if "error" in r:
            print(f"{r['work']}: {r['error']}", file=sys.stderr)
            continue
        print(table_row(work_name(r["work"]), HOST, r["wire"], r.get("calls per I/O")))
        if "calls error" in r:
            print(f"  ({r['work']}: system calls not counted: {r['calls error']})", file=sys.stderr)
    print(f"kernel-wire: {out / 'report.json'}", file=sys.stderr)
    return 0 if all("error" not in r for r in reports) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "target/kernel-wire", help="where the guest's files go")
    parser.add_argument("--works", default=",".join(WORKS),
                        help="comma-separated, from: " + ", ".join(WORKS) + "; +digest and +batch add variants")
    parser.add_argument("--timeout", type=int, default=1500, help="seconds before qemu is killed")
    parser.add_argument("--report", type=Path, metavar="DIR", help="read a finished run's files; boot nothing")
    args = parser.parse_args(argv)
    works = [w.strip() for w in args.works.split(",") if w.strip()]
    if unknown := [w for w in works if w.split("+")[0] not in WORKS or not set(w.split("+")[1:]) <= set(VARIANTS)]:
        parser.error(f"unknown work {', '.join(unknown)}; known: {', '.join(WORKS)}, each with optional "
                     f"{' '.join('+' + v for v in VARIANTS)}")
    if args.report:
        if not args.report.is_dir():
            parser.error(f"--report {args.report}: not a directory (give --out of a finished run)")
        return report(args.report / "out" if (args.report / "out").is_dir() else args.report, works)
    target = BIN / "nvmf-target"
    if not target.is_file():
        parser.error(f"{target} is missing: cargo build --release --workspace --bins (or set NVMFLAB_BIN_DIR)")
    try:
        trixie.build()  # the guest's apt lists, which fetch_tools reads
        files: dict[str, Path | bytes] = {"/usr/local/bin/nvmf-target": target,
                                          "/usr/local/lib/nvmflab/wire.py": HERE / "nvmfbench/wire.py"}
        files.update(fetch_tools())
    except (trixie.GuestUnavailable, subprocess.SubprocessError, OSError) as err:
        print(f"kernel-wire: {err}", file=sys.stderr)
        return 1
    script = f"export WORKS='{' '.join(works)}'\n" + (HERE / "kernel-wire-guest.sh").read_text()
    run = trixie.run_script(script, files, timeout_s=args.timeout, memory_mb=3072, results_mb=256, keep=args.out,
                            progress=lambda line: print(f"kernel-wire guest: {line}", flush=True))
    if not run.finished or run.rc != 0:
        print(f"kernel-wire: the guest run did not finish cleanly ({run.why}, script rc {run.rc}); "
              f"console: {args.out / 'console.log'}", file=sys.stderr)
    return report(run.out, works)


if __name__ == "__main__":
    sys.exit(main())
