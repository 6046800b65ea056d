#!/usr/bin/env python3
"""NVMe over RDMA in the trixie guest (Soft-RoCE, rdma_rxe): the kernel host against nvmet-rdma
(the control) and against our target, each with discover, connect, identify and fio
write+verify at 4k, 128k and 1m (and, on our target, a namespace added and removed through
nvmf-target-ctl while connected, which the host must see); our host (nvmf-perf -t rdma) against
both, with discover, identify and run --verify at the same sizes (tests/rdma/guest-check.sh
does the work inside the guest). With "spdk" among the checks, SPDK's target and hosts over
RDMA too (spdk-check.sh).

    python3 tests/rdma/check.py [--bin DIR] [--checks "control ours perf spdk"] [--keep DIR]

Our target and nvmf-perf must be built with the `rdma` feature; by default build() builds them
and copies them to target/release/rdma (the TCP-only target/release binaries stay as they are).
SPDK comes from NVMFLAB_SPDK_DIR or ~/.cache/nvmflab/spdk-24.01 and must be built with RDMA.
Exit status 0 when every step passed, 1 when one failed, 77 when the guest cannot be built (no
network) or SPDK was asked for and cannot run. The results (results.txt, fio and target logs,
dmesg) are kept under --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests/guest"))
import trixie  # noqa: E402

SKIP = 77


# The RDMA builds of our binaries, copied out of cargo's output (see build()).
RDMA_BIN = ROOT / "target/release/rdma"
FEATURES = "nvmf-target/rdma,nvmf-host/rdma"
# nvmf-target-ctl adds and removes a namespace while the kernel host is connected (guest-check.sh).
BINARIES = ("nvmf-target", "nvmf-perf", "nvmf-target-ctl")


def build() -> Path:
    """nvmf-target and nvmf-perf with RDMA, and nvmf-target-ctl, in RDMA_BIN; the directory holding them.

    They are built in the workspace's own target dir, so every dependency `make build` compiled is
    reused: only nvmf-rdma (its C shim), nvmf-host and nvmf-target compile again, under their own
    feature hash beside the TCP-only ones. Cargo then links the RDMA binaries at
    target/release/nvmf-target, nvmf-perf and nvmf-target-ctl; they are copied aside (without debug
    info: the guest's initrd would otherwise pack ~30 MB per binary) and the TCP-only build is put
    back, which cargo does by linking its fresh outputs again."""
    release = ROOT / "target/release"
    cargo = ["cargo", "build", "--release"]
    subprocess.run(cargo + ["-p", "nvmf-target", "-p", "nvmf-host"] + [a for b in BINARIES for a in ("--bin", b)]
                   + ["--features", FEATURES], cwd=ROOT, check=True, timeout=1800)
    try:
        RDMA_BIN.mkdir(parents=True, exist_ok=True)
        for name in BINARIES:
            copy_without_debug_info(release / name, RDMA_BIN / name)
    finally:
        subprocess.run(cargo + ["--workspace", "--bins"], cwd=ROOT, check=True, timeout=1800)
    return RDMA_BIN


def copy_without_debug_info(binary: Path, dest: Path) -> None:
    """`binary` at `dest` with its debug info stripped; a plain copy where strip is missing or fails."""
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        subprocess.run(["strip", "--strip-debug", "-o", str(tmp), str(binary)], check=True, timeout=60, capture_output=True)
    except (OSError, subprocess.SubprocessError):
        shutil.copy2(binary, tmp)
    tmp.replace(dest)


def veth_module() -> dict[str, Path]:
    """The guest's module tree has no drivers/net (build-guest.sh copies only what blktests
    needs); veth comes from the same kernel package in the cache and is loaded with insmod."""
    kernel, _ = trixie.build()
    kver = kernel.name.removeprefix("vmlinuz-")
    ko = trixie.CACHE / f"kernel-{kver}/usr/lib/modules/{kver}/kernel/drivers/net/veth.ko.xz"
    return {"/root/veth.ko.xz": ko} if ko.is_file() else {}


SPDK_DIR = Path(os.environ.get("NVMFLAB_SPDK_DIR", Path.home() / ".cache/nvmflab/spdk-24.01"))
# What the guest runs of SPDK's build: its target, its identify tool, bdevperf (verifies) and perf.
SPDK_TOOLS = ("build/bin/nvmf_tgt", "build/bin/spdk_nvme_identify", "build/bin/spdk_nvme_perf", "build/examples/bdevperf")


class SpdkUnavailable(RuntimeError):
    """SPDK cannot run over RDMA in the guest; the message says why."""


def needed_libs(binary: Path) -> dict[str, Path]:
    """{soname: path on this machine} of what `binary` links, from ldd."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
    libs = {}
    for line in out.splitlines():
        name, sep, rest = line.strip().partition(" => ")
        path = rest.split(" (")[0].strip()
        if sep and path.startswith("/"):
            libs[name] = Path(path)
    return libs


def spdk_files(spdk_dir: Path = SPDK_DIR, dest: Path = ROOT / "target/release/rdma/spdk") -> dict[str, Path]:
    """The guest's copies of SPDK's tools (debug info stripped, as ours) and of bookworm's
    libaio.so.1, which trixie renamed libaio.so.1t64 (every other library SPDK links is in the
    guest, rdma-core's among them). Raises SpdkUnavailable when SPDK is not built, or built
    without RDMA (not linked against librdmacm)."""
    missing = [t for t in SPDK_TOOLS if not (spdk_dir / t).is_file()]
    if missing:
        raise SpdkUnavailable(f"no SPDK build with {', '.join(missing)} in {spdk_dir} (make spdk builds it)")
    libs = needed_libs(spdk_dir / SPDK_TOOLS[0])
    if "librdmacm.so.1" not in libs:
        raise SpdkUnavailable(f"{spdk_dir / SPDK_TOOLS[0]} is not linked against librdmacm: SPDK was built --without-rdma")
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for tool in SPDK_TOOLS:
        name = Path(tool).name
        copy_without_debug_info(spdk_dir / tool, dest / name)
        files[f"/usr/local/spdk/bin/{name}"] = dest / name
    if "libaio.so.1" in libs:
        files["/usr/local/spdk/lib/libaio.so.1"] = libs["libaio.so.1"]
    files["/etc/nvmflab/spdk-check.sh"] = HERE / "spdk-check.sh"
    return files


def stats_json(path: Path) -> dict:
    """Our target's /stats as guest-check.sh's fetch_stats saved it (the HTTP response, header first)."""
    _, body = path.read_bytes().split(b"\r\n\r\n", 1)
    return json.loads(body)


def run(bindir: Path, checks: str, keep: Path | None, timeout_s: float) -> tuple[trixie.GuestRun, list[str]]:
    """Boots the guest once for `checks`; with "spdk" among them, SPDK's build must have RDMA
    (spdk_files raises SpdkUnavailable otherwise)."""
    script = f"export RDMA_CHECKS='{checks}'\n" + (HERE / "guest-check.sh").read_text()
    files: dict[str, Path] = {f"/usr/local/bin/{b}": bindir / b for b in BINARIES}
    if "spdk" in checks.split():
        files.update(spdk_files())
    files.update(veth_module())
    # SPDK takes 1200 MiB of hugepages in the guest (spdk-check.sh).
    memory = 3072 if "spdk" in checks.split() else 2048
    run = trixie.run_script(script, files, timeout_s=timeout_s, keep=keep, memory_mb=memory)
    results = (run.out / "results.txt").read_text().splitlines() if (run.out / "results.txt").is_file() else []
    return run, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, help="a directory with nvmf-target and nvmf-perf built with the rdma feature, and nvmf-target-ctl (default: build them)")
    ap.add_argument("--checks", default="control ours perf", help='which checks: any of "control" (kernel host -> nvmet), "ours" (kernel host -> our target), "perf" (nvmf-perf -> each target that runs), "spdk" (the target and hosts of SPDK, built with RDMA)')
    ap.add_argument("--keep", type=Path, help="directory for the console log and the guest's $OUT")
    ap.add_argument("--timeout", type=float, default=420, help="seconds before the guest is stopped")
    a = ap.parse_args()
    bindir = a.bin or build()
    try:
        guest, results = run(bindir, a.checks, a.keep, a.timeout)
    except (trixie.GuestUnavailable, SpdkUnavailable) as e:
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
