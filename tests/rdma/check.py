#!/usr/bin/env python3
"""NVMe over RDMA in the trixie guest (Soft-RoCE, rdma_rxe): the kernel host against nvmet-rdma
(the control) and against our target, each with discover, connect, identify and fio
write+verify at 4k, 128k and 1m; our host (nvmf-perf -t rdma) against both, with discover,
identify and run --verify at the same sizes (tests/rdma/guest-check.sh does the work inside the
guest).

    python3 tests/rdma/check.py [--bin DIR] [--checks "control ours perf"] [--keep DIR]

Our target and nvmf-perf must be built with the `rdma` feature; by default this builds them into
target/rdma (its own target dir, so the TCP-only target/release binaries stay as they are). Exit
status 0 when
every step passed, 1 when one failed, 77 when the guest cannot be built (no network). The
results (results.txt, fio and target logs, dmesg) are kept under --keep.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests/guest"))
import trixie  # noqa: E402

SKIP = 77


def build() -> Path:
    """Our target and nvmf-perf with RDMA, in their own target dir (one cargo run); the
    directory holding both."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target/rdma"))
    subprocess.run(["cargo", "build", "--release", "-p", "nvmf-target", "-p", "nvmf-host", "--bin", "nvmf-target", "--bin", "nvmf-perf",
                    "--features", "nvmf-target/rdma,nvmf-host/rdma"], cwd=ROOT, env=env, check=True, timeout=1800)
    return ROOT / "target/rdma/release"


def stripped(binary: Path) -> Path:
    """A copy of `binary` without debug info, in target/rdma/stripped (release builds carry it:
    ~30 MB each, which the guest's initrd would pack and the TCG kernel unpack at every boot);
    the binary itself when strip is missing or fails."""
    dest = ROOT / "target/rdma/stripped" / binary.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["strip", "--strip-debug", "-o", str(dest), str(binary)], check=True, timeout=60,
                       capture_output=True)
        return dest
    except (OSError, subprocess.SubprocessError):
        return binary


def veth_module() -> dict[str, Path]:
    """The guest's module tree has no drivers/net (build-guest.sh copies only what blktests
    needs); veth comes from the same kernel package in the cache and is loaded with insmod."""
    kernel, _ = trixie.build()
    kver = kernel.name.removeprefix("vmlinuz-")
    ko = trixie.CACHE / f"kernel-{kver}/usr/lib/modules/{kver}/kernel/drivers/net/veth.ko.xz"
    return {"/root/veth.ko.xz": ko} if ko.is_file() else {}


def run(bindir: Path, checks: str, keep: Path | None, timeout_s: float) -> tuple[trixie.GuestRun, list[str]]:
    script = f"export RDMA_CHECKS='{checks}'\n" + (HERE / "guest-check.sh").read_text()
    files = {f"/usr/local/bin/{b}": stripped(bindir / b) for b in ("nvmf-target", "nvmf-perf")}
    files.update(veth_module())
    run = trixie.run_script(script, files, timeout_s=timeout_s, keep=keep, memory_mb=2048)
    results = (run.out / "results.txt").read_text().splitlines() if (run.out / "results.txt").is_file() else []
    return run, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, help="a directory with nvmf-target and nvmf-perf built with the rdma feature (default: build them)")
    ap.add_argument("--checks", default="control ours perf", help='which checks: any of "control" (kernel host -> nvmet), "ours" (kernel host -> our target), "perf" (nvmf-perf -> each target that runs)')
    ap.add_argument("--keep", type=Path, help="directory for the console log and the guest's $OUT")
    ap.add_argument("--timeout", type=float, default=420, help="seconds before the guest is stopped")
    a = ap.parse_args()
    bindir = a.bin or build()
    try:
        guest, results = run(bindir, a.checks, a.keep, a.timeout)
    except trixie.GuestUnavailable as e:
        print(f"rdma check: SKIPPED: {e}")
        return SKIP
    for line in results:
        print(line)
    failed = [r for r in results if not r.startswith("PASS")]
    if not guest.finished or guest.rc != 0 or failed or not results:
        print(f"rdma check: FAILED ({guest.why}; script exit {guest.rc}; results in {a.keep or guest.out})")
        return 1
    print(f"rdma check: {len(results)} steps passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
