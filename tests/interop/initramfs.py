"""Builds the guest's boot files from the Debian packages installed on this machine.

The guest is the stock Debian kernel plus an initramfs holding busybox, the NVMe modules with
their dependencies (resolved by `modprobe --show-depends`), nvme-cli and fio with the shared
libraries `ldd` names, and the scenario script. Nothing is downloaded and nothing is committed:
the result is cached under `.cache/interop/`, keyed on a hash of every input, and rebuilt when a
package or the script changes.

`build(cache, ssh=True)` makes a second image, cached beside the first: the SSH guest, a host the
harness drives over SSH like a real server. It carries OpenSSH's sshd and sftp-server, kmod with
a module tree indexed by `depmod` (so `modprobe nvmet-tcp` works as on a server), nvmet and
null_blk besides the modules above, nvme-cli and fio at their installed paths, and boots
`guest/init-sshd`. The authorized key comes on the kernel command line, so one image serves
every run.

The kernel is also unpacked from its bzImage into an ELF `vmlinux`: under software emulation
decompressing xz at every boot costs seconds, and qemu boots the ELF directly (PVH entry).

`build(cache, ssh=True, kernel=Kernel(...))` (the SSH guest only) uses a kernel that is not
installed (one unpacked from a .deb by `kernels.py`, e.g. Debian's backports kernel with NVMe
authentication) instead of the newest installed one: its vmlinuz and its module tree under
`Kernel.root` (`lib/modules/VERSION`, indexed by depmod). Give such a build a cache directory of its own: a build removes the other
kernels and images of its kind from its cache. A bzImage that is not xz-compressed (Debian's 6.12
uses zstd) is booted as it is.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Modules the scenarios load, in the order given; dependencies come first automatically.
MODULES = [
    "configfs",
    "virtio_pci",
    "virtio_net",
    "crc32c_generic",
    "crc32c-intel",  # optional: absent CPU features make insmod fail, which the guest ignores
    "nvme-tcp",
    "nvmet-tcp",
    "brd",
]
# Module arguments: one brd RAM disk of 64 MiB for the kernel target; no native multipath, so
# /dev/nvmeXn1 belongs to controller nvmeX.
MODULE_ARGS = {"brd.ko": "rd_nr=1 rd_size=65536", "nvme-core.ko": "multipath=N"}
PROGRAMS = ["nvme", "fio"]
# The SSH guest: modules the kernel stack loads itself (modprobe over SSH); programs keep their
# installed paths (sshd re-executes itself by its absolute path); kmod's multi-call links. The
# harness's SSH host asks `ss` for listening ports and `getconf` for clock ticks (not in busybox).
# /bin/sh is dash, as on Debian: busybox-static's shell would run its own applets (modprobe,
# rmmod...) in preference to the real programs on PATH.
SSH_MODULES = MODULES + ["nvmet", "null_blk"]
SSH_PROGRAMS = ["dash", "nvme", "fio", "kmod", "sshd", "/usr/lib/openssh/sftp-server", "ss", "getconf"]
KMOD_LINKS = ["modprobe", "insmod", "rmmod", "lsmod", "modinfo"]
MODULE_INDEXES = ["modules.order", "modules.builtin", "modules.builtin.modinfo"]
SSHD_CONFIG = """\
ListenAddress 0.0.0.0
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
AuthorizedKeysFile /root/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PidFile /run/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
"""
GUEST_DIR = Path(__file__).parent / "guest"
XZ_MAGIC = b"\xfd7zXZ\x00"
ELF_MAGIC = b"\x7fELF"


class BuildError(RuntimeError):
    """The boot files cannot be made from what is installed; the message says what is missing."""


@dataclass(frozen=True)
class Kernel:
    """A kernel given explicitly: its version, its bzImage, and the directory holding its
    `lib/modules/<version>` tree (with modules.dep)."""

    version: str
    vmlinuz: Path
    root: Path


@dataclass(frozen=True)
class BootFiles:
    kernel: Path
    initrd: Path
    kernel_version: str


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError as e:
        raise BuildError(f"{cmd[0]} is not installed (scripts/install-deps.sh installs it)") from e
    except subprocess.CalledProcessError as e:
        raise BuildError(f"{' '.join(cmd)} failed: {e.stderr.strip()}") from e


def find_kernel() -> tuple[str, Path]:
    """The newest installed Debian kernel: (version, path of its vmlinuz)."""
    boot = Path("/boot")
    kernels = sorted(boot.glob("vmlinuz-*"), key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p.name)])
    for vmlinuz in reversed(kernels):
        version = vmlinuz.name.removeprefix("vmlinuz-")
        if (Path("/lib/modules") / version / "modules.dep").exists():
            return version, vmlinuz
    raise BuildError("no kernel with modules in /boot and /lib/modules: install linux-image-amd64")


def module_files(version: str, names: list[str] = MODULES, root: Path | None = None) -> list[Path]:
    """Every module file `names` need, dependencies first, each once (from the module tree under
    `root` when given, else the installed one)."""
    seen: dict[Path, None] = {}
    base = ["-d", str(root)] if root is not None else []
    for name in names:
        out = _run(["modprobe", *base, "-S", version, "--show-depends", name])
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod":
                seen.setdefault(Path(parts[1]), None)
    return list(seen)


def shared_libraries(program: Path) -> list[Path]:
    """The shared objects `program` loads, the dynamic loader included."""
    libs = []
    for line in _run(["ldd", str(program)]).splitlines():
        match = re.search(r"(/\S+)", line.split("=>")[-1])
        if match:
            libs.append(Path(match.group(1)))
    return libs


def unpack_kernel(vmlinuz: Path) -> bytes:
    """The ELF kernel inside a bzImage compressed with xz (Debian's choice)."""
    image = vmlinuz.read_bytes()
    start = image.find(XZ_MAGIC)
    while start >= 0:
        try:
            elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(image[start:])
        except lzma.LZMAError:
            start = image.find(XZ_MAGIC, start + 1)
            continue
        if elf.startswith(ELF_MAGIC):
            return elf
        start = image.find(XZ_MAGIC, start + 1)
    raise BuildError(f"{vmlinuz}: no xz-compressed ELF kernel inside")


def _inputs(version: str, vmlinuz: Path, files: list[Path], init: Path) -> str:
    h = hashlib.sha256()
    for p in [vmlinuz, *files, init]:
        if p.is_file():
            st = p.stat()
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(version.encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def _cpio_from_tree(tree: Path, out: Path) -> None:
    """newc cpio of `tree` compressed with lz4 -l (the legacy frame the kernel unpacks)."""
    names = subprocess.run(["find", ".", "-mindepth", "1"], cwd=tree, check=True, capture_output=True).stdout
    cpio = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"], cwd=tree, input=names, check=True, capture_output=True).stdout
    try:
        packed = subprocess.run(["lz4", "-l", "-9", "-q", "-c"], input=cpio, check=True, capture_output=True).stdout
    except FileNotFoundError as e:
        raise BuildError("lz4 is not installed (scripts/install-deps.sh installs it)") from e
    out.write_bytes(packed)


def _populate(tree: Path, modules: list[Path], programs: dict[str, Path]) -> None:
    for d in ["bin", "sbin", "dev", "proc", "sys", "tmp", "etc/nvme", "lib/modules", "run", "mnt"]:
        (tree / d).mkdir(parents=True, exist_ok=True)
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise BuildError("/bin/busybox missing: install busybox-static")
    if subprocess.run(["ldd", str(busybox)], capture_output=True).returncode == 0:
        raise BuildError("/bin/busybox is dynamically linked: install busybox-static")
    shutil.copy2(busybox, tree / "bin/busybox")
    os.symlink("busybox", tree / "bin/sh")  # the rest of the applets are linked by /init
    # Modules flat in one directory, loaded in dependency order by the guest.
    order = []
    for path in modules:
        shutil.copy2(path, tree / "lib/modules" / path.name)
        order.append(f"{path.name} {MODULE_ARGS.get(path.name, '')}".strip())
    (tree / "lib/modules/order").write_text("\n".join(order) + "\n")
    for name, path in programs.items():
        shutil.copy2(path, tree / "bin" / name)
        for lib in shared_libraries(path):
            dest = tree / lib.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(lib.resolve(), dest)
    shutil.copy2(GUEST_DIR / "init", tree / "init")
    (tree / "init").chmod(0o755)


def _populate_ssh(tree: Path, version: str, modules: list[Path], programs: list[Path], root: Path = Path("/")) -> None:
    """The SSH guest's tree: a small server with the layout the kernel stack expects (modules
    taken from the tree under `root`)."""
    for d in ["bin", "sbin", "usr/sbin", "dev", "proc", "sys", "tmp", "run/sshd", "mnt", "root/.ssh", "etc/ssh"]:
        (tree / d).mkdir(parents=True, exist_ok=True)
    if subprocess.run(["ldd", "/bin/busybox"], capture_output=True).returncode == 0:
        raise BuildError("/bin/busybox is dynamically linked: install busybox-static")
    shutil.copy2("/bin/busybox", tree / "bin/busybox")
    os.symlink("/usr/bin/dash", tree / "bin/sh")  # the other applets are linked by /init
    moddir = root / "lib/modules" / version
    for path in modules + [moddir / name for name in MODULE_INDEXES]:
        dest = tree / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    _run(["depmod", "-b", str(tree), version])
    for path in programs:
        for f in [path, *shared_libraries(path)]:
            dest = tree / f.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(f.resolve(), dest)
    for name in KMOD_LINKS:
        os.symlink("/usr/bin/kmod", tree / "usr/sbin" / name)
    (tree / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n")
    (tree / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (tree / "etc/ssh/sshd_config").write_text(SSHD_CONFIG)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmflab-ssh-guest",
          "-f", str(tree / "etc/ssh/ssh_host_ed25519_key")])
    shutil.copy2(GUEST_DIR / "init-sshd", tree / "init")
    (tree / "init").chmod(0o755)


def _program(name: str) -> Path:
    """An installed program by name (searching the sbin folders too) or absolute path."""
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if not found:
        raise BuildError(f"{name} is not installed (scripts/install-deps.sh installs it)")
    return Path(found)


def build(cache: Path, ssh: bool = False, kernel: Kernel | None = None) -> BootFiles:
    """Makes (or reuses) the ELF kernel and the initramfs under `cache`: the scenario guest, or
    with `ssh` the SSH guest (`initramfs-*` and `sshguest-*`, each kept when the other is built).
    With `kernel`, that kernel and its modules instead of the newest installed ones."""
    if kernel is None:
        version, vmlinuz = find_kernel()
        root = None
    else:
        if not ssh:
            # The scenario guest loads modules with busybox's insmod, untried on compressed
            # (.ko.xz) modules; kmod in the SSH guest loads them.
            raise BuildError("an explicit kernel is supported for the SSH guest only (ssh=True)")
        version, vmlinuz, root = kernel.version, kernel.vmlinuz, kernel.root
    modules = module_files(version, SSH_MODULES if ssh else MODULES, root)
    programs = {name: _program(name) for name in (SSH_PROGRAMS if ssh else PROGRAMS)}
    libs = [lib for p in programs.values() for lib in shared_libraries(p)]
    init = GUEST_DIR / ("init-sshd" if ssh else "init")
    key = _inputs(version, vmlinuz, modules + list(programs.values()) + libs, init)
    st = vmlinuz.stat()
    elf = cache / f"vmlinux-{version}-{st.st_size}-{st.st_mtime_ns}"
    prefix = "sshguest" if ssh else "initramfs"
    initrd = cache / f"{prefix}-{key}.cpio.lz4"
    cache.mkdir(parents=True, exist_ok=True)
    if not elf.exists():
        for old in cache.glob("vmlinux-*"):
            old.unlink()
        tmp = cache / f"{elf.name}.tmp"
        try:
            image = unpack_kernel(vmlinuz)
        except BuildError:
            if kernel is None:
                raise
            image = vmlinuz.read_bytes()  # not xz inside: qemu boots the bzImage itself
        tmp.write_bytes(image)
        tmp.rename(elf)
    if not initrd.exists():
        for old in cache.glob(f"{prefix}-*.cpio.lz4"):
            old.unlink()
        tree = cache / f"tree-{prefix}"
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        if ssh:
            _populate_ssh(tree, version, modules, list(programs.values()), root or Path("/"))
        else:
            _populate(tree, modules, programs)
        tmp = initrd.with_suffix(".tmp")
        _cpio_from_tree(tree, tmp)
        tmp.rename(initrd)
        shutil.rmtree(tree, ignore_errors=True)
    return BootFiles(kernel=elf, initrd=initrd, kernel_version=version)
