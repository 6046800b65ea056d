"""The Debian trixie test guest: qemu (TCG) with trixie's 6.12 kernel and a root filesystem of
trixie packages, booted to run one bash script as root and give back what it wrote.

The guest has no network device: everything runs inside it (its own loopback, veth pairs or rxe
devices it makes itself), so no traffic leaves it. Its packages (tests/blktests/build-guest.sh)
include nvme-cli 2.13, fio, keyutils, tlshd (ktls-utils), rdma-core's libraries with the rxe
provider, ibverbs-utils and rdmacm-utils; its modules include nvme-tcp/-rdma, nvmet-tcp/-rdma,
rdma_rxe and tls.

    from trixie import run_script, GuestUnavailable
    run = run_script("nvme version >$OUT/v.txt", {"/usr/local/bin/nvmf-target": Path("target/release/nvmf-target")},
                     timeout_s=300)
    run.finished, run.rc, run.console, (run.out / "v.txt").read_text()

Inside the guest the script finds proc, sys, devtmpfs, configfs, debugfs and a tmpfs /tmp mounted,
`lo` up, udev running, /etc/nvme/hostnqn and hostid written (HOSTNQN and HOSTID in its
environment), and OUT=/tmp/out, a directory whose contents come back (as a tar stream on a second
virtio disk). Lines it prints that start with "@@ " are echoed here as progress. `files` maps guest
paths to local files (copied with their mode) or to bytes.

`build()` raises GuestUnavailable when the packages cannot be downloaded (no network); callers skip
with that reason unless they were told the guest is required.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD_SCRIPT = ROOT / "tests/blktests/build-guest.sh"
CACHE = Path(os.environ.get("NVMFLAB_BLKTESTS_CACHE", Path.home() / ".cache/nvmflab/blktests"))
INIT = HERE / "init"
BOOT_COMMON = HERE / "boot-common.sh"  # sourced by every guest /init
PR_SET_PDEATHSIG = 1
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349"


class GuestUnavailable(RuntimeError):
    """The guest could not be built; the message says why."""


@dataclass
class GuestRun:
    finished: bool  # the init ran to its end and powered off (the script may still have failed)
    why: str  # how the guest ended
    rc: int | None  # the script's exit status; None when it never ended
    console: str  # everything on the guest's serial console
    out: Path  # what the script wrote under $OUT (empty when nothing came back)


def build() -> tuple[Path, Path]:
    """(kernel, base cpio), built into the cache on first use (minutes), then reused."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, timeout=1800)
    if r.returncode == 3:
        raise GuestUnavailable("the guest's Debian packages could not be downloaded (no network?)")
    if r.returncode != 0:
        raise RuntimeError(f"building the guest failed ({BUILD_SCRIPT.name} exit {r.returncode}, output above)")
    kernel, base = r.stdout.strip().splitlines()[-1].split()
    return Path(kernel), Path(base)


def pack_cpio(tree: Path, out: Path) -> Path:
    """`tree` as a newc cpio owned by root: the kernel unpacks it over the base."""
    names = subprocess.run(["find", ".", "-mindepth", "1"], cwd=tree, check=True, capture_output=True).stdout
    with open(out, "wb") as f:
        subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"], cwd=tree, input=names, stdout=f, check=True)
    return out


def concat(parts: list[Path], out: Path) -> Path:
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    return out


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# Booting to the init's GUEST-UP line takes about 20 s here, a few times that on a loaded machine.
BOOT_LIMIT_S = 180


def boot(work: Path, kernel: Path, initrd: Path, disk: Path, timeout: float, memory_mb: int,
         progress: Callable[[str], None], smp: int = 2) -> tuple[bool, str]:
    """Boots the guest, passes its "@@ " lines to `progress`, kills it at `timeout`.
    (whether the init printed GUEST-DONE, how the guest ended); the console is work/console.log.
    Trixie's kernel under TCG now and then oopses while it boots on a loaded machine (seen: int3
    in sched_clock_cpu while patching static keys): a guest that never printed GUEST-UP is booted
    once more, never one whose init ran."""
    for attempt in (1, 2):
        finished, why, came_up = _boot_once(work, kernel, initrd, disk, timeout, memory_mb, progress, smp)
        if came_up or attempt == 2:
            return finished, why
        tail = (work / "console.log").read_text(errors="replace").splitlines()[-3:] if (work / "console.log").exists() else []
        progress(f"the guest did not come up ({why}); booting it once more. Console tail: {' | '.join(tail)}")
    raise AssertionError("unreachable")


def _boot_once(work: Path, kernel: Path, initrd: Path, disk: Path, timeout: float, memory_mb: int,
               progress: Callable[[str], None], smp: int) -> tuple[bool, str, bool]:
    console = work / "console.log"
    argv = [
        "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-cpu", "max", "-smp", str(smp), "-m", str(memory_mb),
        "-nodefaults", "-no-reboot", "-display", "none", "-monitor", "none", "-nic", "none",
        "-serial", f"file:{console}", "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", "console=ttyS0 rdinit=/init panic=-1 loglevel=4 nvme_core.multipath=Y",
        "-drive", f"file={disk},format=raw,if=virtio,cache=unsafe",
    ]  # fmt: skip
    qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    start = time.monotonic()
    seen = 0
    came_up = False
    why = "the guest powered off"
    try:
        while qemu.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                why = f"the guest ran past {timeout:.0f} s and was stopped"
                break
            if not came_up and elapsed > min(BOOT_LIMIT_S, timeout):
                why = f"the guest did not come up in {BOOT_LIMIT_S} s"
                break
            time.sleep(1)
            if console.exists():
                lines = console.read_text(errors="replace").splitlines()
                for line in lines[seen:]:
                    if line.startswith("@@ "):
                        came_up = came_up or line.startswith("@@ GUEST-UP")
                        progress(line[3:])
                seen = len(lines)
    finally:
        if qemu.poll() is None:
            qemu.terminate()
            try:
                qemu.wait(10)
            except subprocess.TimeoutExpired:
                qemu.kill()
                qemu.wait()
    text = console.read_text(errors="replace") if console.exists() else ""
    return "@@ GUEST-DONE" in text, why, came_up or "@@ GUEST-UP" in text


def _place(tree: Path, files: Mapping[str, Path | bytes]) -> None:
    for guest_path, content in files.items():
        dst = tree / guest_path.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            dst.write_bytes(content)
        else:
            shutil.copy2(content, dst)


def run_script(script: str, files: Mapping[str, Path | bytes] | None = None, *, timeout_s: float,
               memory_mb: int = 2048, results_mb: int = 64, smp: int = 2, keep: Path | None = None,
               progress: Callable[[str], None] = lambda line: print(f"guest: {line}", flush=True)) -> GuestRun:
    """Runs `script` (bash) as root in a fresh guest; see the module docstring. `keep`: a directory
    that receives the console log and $OUT (else a temporary one, removed with the process)."""
    kernel, base = build()
    dest = keep or Path(tempfile.mkdtemp(prefix="guest-out-"))
    dest.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="guest-", dir=CACHE) as tmp:
        work = Path(tmp)
        tree = work / "overlay"
        tree.mkdir()
        _place(tree, dict(files or {}))
        _place(tree, {"/init": INIT, "/etc/nvmflab/boot-common.sh": BOOT_COMMON, "/etc/nvmflab/script.sh": script.encode()})
        (tree / "init").chmod(0o755)
        initrd = concat([base, pack_cpio(tree, work / "overlay.cpio")], work / "initrd.cpio")
        disk = work / "results.img"
        with open(disk, "wb") as f:
            f.truncate(results_mb << 20)
        finished, why = boot(work, kernel, initrd, disk, timeout_s, memory_mb, progress, smp)
        console = (work / "console.log").read_text(errors="replace") if (work / "console.log").exists() else ""
        (dest / "console.log").write_text(console)
        out = dest / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        try:
            with tarfile.open(disk) as tf:
                tf.extractall(out, filter="data")
        except tarfile.TarError:
            pass  # nothing came back: the console says why
    rc_file = out / ".rc"
    rc = int(rc_file.read_text().strip()) if rc_file.is_file() and rc_file.read_text().strip().isdigit() else None
    return GuestRun(finished=finished, why=why, rc=rc, console=console, out=out)
