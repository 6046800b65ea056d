"""Debian's bookworm-backports kernel for the guest, fetched and unpacked without installing it.

Debian 12's stock 6.1 kernel is built without CONFIG_NVME_AUTH and CONFIG_NVME_TARGET_AUTH; the
backports 6.12 kernel has both (CONFIG_NVME_AUTH=m, CONFIG_NVME_HOST_AUTH=y,
CONFIG_NVME_TARGET_AUTH=y). `backports_kernel(cache)` returns it as an `initramfs.Kernel`:

1. a `linux-image-6.12.*+deb12-amd64_*.deb` already in `cache` is used as it is (offline);
2. else apt-get, with a sources list, package lists and caches of its own under `cache/apt`
   (the system's apt configuration is neither read for sources nor changed), finds the newest
   6.12 `linux-image-*-amd64` in bookworm-backports and downloads its .deb into `cache`;
3. `dpkg-deb -x` unpacks it into `cache/<version>/` and `depmod -b` indexes its modules.

Everything stays under `cache` (the repository's ignored `.cache/interop/kernels/`).
`KernelUnavailable` says why when none can be had (no network, no apt).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import initramfs

SOURCE = "deb http://deb.debian.org/debian bookworm-backports main"
PACKAGE = re.compile(r"^linux-image-(6\.12\.[0-9.]+\+deb12-amd64)$")
DEB = re.compile(r"^linux-image-(6\.12\.[0-9.]+\+deb12-amd64)_.*_amd64\.deb$")
UPDATE_TIMEOUT_S = 180
DOWNLOAD_TIMEOUT_S = 600


class KernelUnavailable(RuntimeError):
    """No backports kernel could be had; the message says why."""


def _natural(text: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", text)]


def _apt(cache: Path, *args: str, timeout: float, cwd: Path | None = None) -> tuple[str, str]:
    """stdout and stderr of apt-get or apt-cache run on the lists under `cache/apt`."""
    d = cache / "apt"
    argv = ["apt-get" if args[0] in ("update", "download") else "apt-cache",
            "-o", f"Dir::Etc::sourcelist={d / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={d / 'lists'}", "-o", f"Dir::Cache={d / 'cache'}",
            "-o", "APT::Get::List-Cleanup=0", *args]  # fmt: skip
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError as e:
        raise KernelUnavailable("apt-get is not installed") from e
    except subprocess.TimeoutExpired as e:
        raise KernelUnavailable(f"{' '.join(argv[:1] + list(args))} took more than {timeout:.0f} s") from e
    if r.returncode != 0:
        raise KernelUnavailable(f"{argv[0]} {' '.join(args)} failed (no network?): {r.stderr.strip()[-500:]}")
    return r.stdout, r.stderr


def _download(cache: Path) -> Path:
    d = cache / "apt"
    (d / "lists/partial").mkdir(parents=True, exist_ok=True)
    (d / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
    (d / "sources.list").write_text(SOURCE + "\n")
    _, update_errors = _apt(cache, "update", timeout=UPDATE_TIMEOUT_S)
    out, _ = _apt(cache, "search", "--names-only", r"^linux-image-6\.12\.[0-9.]+\+deb12-amd64$", timeout=60)
    versions = sorted((m.group(1) for line in out.splitlines() if (m := PACKAGE.match(line.split(" ")[0]))), key=_natural)
    if not versions:
        why = update_errors.strip()[-500:] or out[-500:]
        raise KernelUnavailable(f"bookworm-backports lists no linux-image-6.12.*+deb12-amd64 (no network?): {why}")
    _apt(cache, "download", f"linux-image-{versions[-1]}", timeout=DOWNLOAD_TIMEOUT_S, cwd=cache)
    return _cached_deb(cache) or _fail(f"apt-get download linux-image-{versions[-1]} left no .deb in {cache}")


def _fail(message: str):
    raise KernelUnavailable(message)


def _cached_deb(cache: Path) -> Path | None:
    debs = sorted((p for p in cache.glob("linux-image-*.deb") if DEB.match(p.name)), key=lambda p: _natural(p.name))
    return debs[-1] if debs else None


def backports_kernel(cache: Path) -> initramfs.Kernel:
    """The newest 6.12 backports kernel, unpacked under `cache` (downloaded once)."""
    cache.mkdir(parents=True, exist_ok=True)
    deb = _cached_deb(cache) or _download(cache)
    m = DEB.match(deb.name)
    assert m
    version = m.group(1)
    root = cache / version
    kernel = initramfs.Kernel(version=version, vmlinuz=root / f"boot/vmlinuz-{version}", root=root)
    if (root / "lib/modules" / version / "modules.dep").exists() and kernel.vmlinuz.exists():
        return kernel
    tmp = cache / f"{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True, capture_output=True, timeout=300)
        subprocess.run(["depmod", "-b", str(tmp), version], check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, FileNotFoundError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KernelUnavailable(f"cannot unpack {deb}: {e}") from e
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return kernel


def config_has(kernel: initramfs.Kernel, *options: str) -> list[str]:
    """Those of `options` the kernel's config does not set to y or m."""
    text = (kernel.root / f"boot/config-{kernel.version}").read_text()
    return [opt for opt in options if not re.search(rf"^{opt}=[ym]$", text, re.M)]
