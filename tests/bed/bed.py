"""The two-server test bed: two Debian trixie guests (Linux 6.12) under qemu (TCG), each a server
the harness reaches over SSH through an inventory, as it would reach real ones (docs/topologies.md).

    this machine, 127.0.0.1                 guest bed1                      guest bed2
    ssh -p PORT1  --(user net, hostfwd)-->  mgmt 10.0.2.15                  mgmt 10.0.2.15  <-- ssh -p PORT2
                                            link 192.168.77.1  <-- UDP -->  link 192.168.77.2
                                            rxe0 on link                    rxe0 on link

Each guest: the trixie guest's base (tests/guest/trixie.py: nvme-cli 2.13, fio, keyutils, tlshd,
rdma-core with the rxe provider), the bed's layer (build-layer.sh: OpenSSH, virtio_net), and an
overlay with /init (tests/bed/init), sshd's configuration and keys, and our binaries in
/usr/local/bin (the RDMA build, when there is one, in /usr/local/lib/nvmflab/rdma; none with
ours=False, a bed for the kernel stack alone). The link is
qemu's UDP socket netdev between the two qemus on 127.0.0.1; the management NIC is qemu user
networking with restrict=on (no route out of the guest) and one port forwarded from 127.0.0.1 to
sshd. So no traffic leaves the guests and this machine's loopback.

    python3 tests/bed/bed.py up DIR     boots both, writes DIR/bed.toml and DIR/bed.yml, then
                                        holds them until SIGINT/SIGTERM (both qemus are killed);
                                        a guest that stopped (powered off) is booted
                                        again when DIR/NAME.boot appears (Bed.back_up)

While it holds them, NVMFLAB_BED_ATTACH=DIR runs the bed's tests against those guests (Bed.attach)
instead of booting two more: a test at a time, without a boot each time.

Timings from guests under emulation are functional, never performance.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests/guest"))
sys.path.insert(0, str(ROOT / "tests/interop"))
import trixie  # noqa: E402
from initramfs import SSHD_CONFIG  # noqa: E402

BIN_DIR = Path(os.environ.get("NVMFLAB_BIN_DIR", ROOT / "target/release"))
# The RDMA build (tests/rdma/check.py builds it there); NVMFLAB_BED_RDMA_BIN names another.
RDMA_BIN_DIR = Path(os.environ.get("NVMFLAB_BED_RDMA_BIN", ROOT / "target/release/rdma"))
OUR_BINARIES = ("nvmf-target", "nvmf-perf")
LINK_NET = "192.168.77"
MEMORY_MB = 1536
# Under TCG on a loaded two-core machine one guest boots in 20 s to a few minutes; both at once
# take longer. A guest that has not printed SSHD-READY by then is a failed bed.
BOOT_LIMIT_S = 600
SSH_LIMIT_S = 300
# Trixie's kernel under TCG now and then oopses while it boots (seen in CI: int3 in
# run_timer_softirq while static keys are patched; tests/guest/trixie.py saw it in
# sched_clock_cpu), and panic=-1 with -no-reboot ends its qemu: such a guest is booted once more
# (one that lived through its oops is stopped first).
BOOT_TRIES = 2
# In the inventories too: the harness allows a login 2 x this + 5 s (topology/ssh.login_limit_s).
# A loaded machine's TCG guest once took more than the 15 s nvmflab allowed by default ("cannot
# log in with ssh" at load 9); a refused connection or key still fails at once.
SSH_CONNECT_TIMEOUT_S = 60


class BedError(RuntimeError):
    """The bed could not be built or booted; the message says which guest and why."""


@dataclass
class Guest:
    name: str
    index: int  # 1, 2: the link address's last byte and the MACs
    ssh_port: int
    rxe: bool = True
    console: Path = Path()
    qemu: subprocess.Popen | None = None

    @property
    def link_ip(self) -> str:
        return f"{LINK_NET}.{self.index}"

    def mac(self, nic: int) -> str:
        return f"52:54:00:b0:{self.index:02x}:{nic:02x}"


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], timeout: float = 120) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise BedError(f"{' '.join(argv[:3])}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout


@dataclass
class Bed:
    """Two guests and what they were booted from; `close()` kills both qemus."""

    work: Path
    guests: list[Guest] = field(default_factory=list)
    key: Path = Path()
    _booted_from: tuple = ()  # (kernel, initrd, link ports): what restart() boots a guest from
    attached: bool = False  # the qemus are `bed.py up`'s (attach): it boots a stopped guest again
    # Our binaries in the guests' overlay; a bed for the kernel stack alone (make test-bed-quick)
    # leaves them out: nothing to strip and pack, and nothing read from target/release while a
    # build beside it (tests/rdma's) may be linking there.
    ours: bool = True

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.key = self.work / "id_ed25519"
        self.guests = [Guest("bed1", 1, free_port()), Guest("bed2", 2, free_port())]

    # -- the image -------------------------------------------------------------------------------

    def initrd(self) -> tuple[Path, Path]:
        """(kernel, initrd): the trixie base, the bed's layer and this bed's overlay."""
        try:
            kernel, base = trixie.build()
        except trixie.GuestUnavailable as e:
            raise BedError(str(e)) from None
        kver = kernel.name.removeprefix("vmlinuz-")
        done = subprocess.run(["bash", str(HERE / "build-layer.sh"), kver], stdout=subprocess.PIPE, text=True,
                              timeout=900)
        if done.returncode == 3:  # as trixie.GuestUnavailable: the bed's tests skip with it
            raise BedError("the bed's OpenSSH packages could not be downloaded (no network?)")
        if done.returncode != 0:
            raise BedError(f"building the bed's layer failed (build-layer.sh exit {done.returncode})")
        layer = Path(done.stdout.strip().splitlines()[-1])
        tree = self.work / "overlay"
        shutil.rmtree(tree, ignore_errors=True)
        self._overlay(tree)
        overlay = trixie.pack_cpio(tree, self.work / "overlay.cpio")
        return kernel, trixie.concat([base, layer, overlay], self.work / "initrd.cpio")

    def _overlay(self, tree: Path) -> None:
        for d in ("etc/ssh", "etc/nvmflab", "root/.ssh", "usr/local/bin", "usr/local/lib/nvmflab/rdma"):
            (tree / d).mkdir(parents=True, exist_ok=True)
        if not self.key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmflab-bed", "-f", str(self.key)])
        host_key = tree / "etc/ssh/ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmflab-bed-host", "-f", str(host_key)])
        shutil.copy2(self.key.with_suffix(".pub"), tree / "root/.ssh/authorized_keys")
        (tree / "etc/ssh/sshd_config").write_text(SSHD_CONFIG)
        (tree / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                         "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n"
                                         "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (tree / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        shutil.copy2(HERE / "init", tree / "init")
        (tree / "init").chmod(0o755)
        shutil.copy2(ROOT / "tests/guest/boot-common.sh", tree / "etc/nvmflab/boot-common.sh")
        for name in OUR_BINARIES if self.ours else ():
            _strip_copy(BIN_DIR / name, tree / "usr/local/bin" / name)
            if (RDMA_BIN_DIR / name).is_file():
                _strip_copy(RDMA_BIN_DIR / name, tree / "usr/local/lib/nvmflab/rdma" / name)

    @classmethod
    def attach(cls, work: Path) -> "Bed":
        """The bed `bed.py up DIR` holds: its guests' SSH ports read back from DIR/bed.toml. Its
        qemus are not ours, so close() leaves them to the `up` that started them."""
        made = cls(work)
        made.attached = True
        try:
            text = (work / "bed.toml").read_text()
        except OSError as e:
            raise BedError(f"no bed to attach to in {work}: {e}") from None
        for guest in made.guests:
            section = text.split(f"[hosts.{guest.name}]", 1)[-1].split("[hosts.", 1)[0]
            ports = [line.split("=", 1)[1].strip() for line in section.splitlines() if line.startswith("port = ")]
            if len(ports) != 1 or not ports[0].isdigit():
                raise BedError(f"{work}/bed.toml names no SSH port for {guest.name}")
            guest.ssh_port = int(ports[0])
            made._wait_ssh(guest)
        made.write_inventories()  # this checkout's SSH options, on the same ports
        return made

    # -- booting ---------------------------------------------------------------------------------

    def up(self, progress=lambda line: print(f"bed: {line}", flush=True)) -> None:
        kernel, initrd = self.initrd()
        link_ports = (free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM))
        self._booted_from = (kernel, initrd, link_ports)
        for guest in self.guests:
            self._start(guest, kernel, initrd, link_ports)
        self._wait_up(self.guests, progress)
        self.write_inventories()

    def restart(self, name: str, progress=lambda line: print(f"bed: {line}", flush=True)) -> None:
        """Boot NAME again after it stopped (powered off by a fault test), on the same SSH port and
        link, so the inventories still hold."""
        guest = self.guest(name)
        if guest.qemu is not None and guest.qemu.poll() is None:
            raise BedError(f"{name} is still running")
        self._start(guest, *self._booted_from)
        self._wait_up([guest], progress)

    def back_up(self, name: str) -> None:
        """NAME, powered off by a test, running and answering SSH again: booted here, or by the
        `bed.py up` an attached bed belongs to, asked through boot_request."""
        guest = self.guest(name)
        if not self.attached:
            guest.qemu.wait(30)
            self.restart(name)
            return
        self.boot_request(name).touch()  # up's loop boots it within 2 s
        deadline = time.monotonic() + 60
        while self.boot_request(name).exists() and time.monotonic() < deadline:
            time.sleep(1)
        self._wait_ssh(guest)

    def boot_request(self, name: str) -> Path:
        """The file that asks `bed.py up` to boot NAME again once it has stopped: not at once, so a
        test sees the guest gone for as long as it needs (a run must notice, and end, first)."""
        return self.work / f"{name}.boot"

    def _wait_up(self, guests: list[Guest], progress) -> None:
        start = time.monotonic()
        deadline = {g.name: start + BOOT_LIMIT_S for g in guests}
        boots = {g.name: 1 for g in guests}
        waiting = list(guests)
        while waiting:
            time.sleep(1)
            for guest in list(waiting):
                text = guest.console.read_text(errors="replace") if guest.console.exists() else ""
                oops = _oopsed(text)
                if "@@ SSHD-READY" in text:
                    progress(f"{guest.name} up in {time.monotonic() - start:.0f} s (ssh -p {guest.ssh_port})")
                    waiting.remove(guest)
                elif "@@ FAIL" not in text and oops and boots[guest.name] < BOOT_TRIES:
                    if guest.qemu.poll() is None:  # an oops it lived through: no bed to trust
                        guest.qemu.kill()
                        guest.qemu.wait()
                    kept = guest.console.with_suffix(f".boot{boots[guest.name]}.log")
                    guest.console.replace(kept)
                    progress(f"{guest.name}'s kernel oopsed while booting ({oops}; console kept in "
                             f"{kept.name}); booting it once more")
                    self._start(guest, *self._booted_from)
                    boots[guest.name] += 1
                    deadline[guest.name] = time.monotonic() + BOOT_LIMIT_S
                elif "@@ FAIL" in text or guest.qemu.poll() is not None:
                    raise BedError(f"{guest.name} did not come up: {_tail(text)}")
            late = [g for g in waiting if time.monotonic() > deadline[g.name]]
            if late:
                raise BedError(f"{', '.join(g.name for g in late)} not up in {BOOT_LIMIT_S} s: "
                               f"{_tail(late[0].console.read_text(errors='replace'))}")
        for guest in guests:
            self._wait_ssh(guest)

    def _start(self, guest: Guest, kernel: Path, initrd: Path, link_ports: tuple[int, int]) -> None:
        guest.console = self.work / f"{guest.name}.console.log"
        local, remote = link_ports if guest.index == 1 else link_ports[::-1]
        cmdline = (f"console=ttyS0 rdinit=/init panic=-1 loglevel=4 nvme_core.multipath=Y "
                   f"GUEST_HOSTNAME={guest.name} nvmflab.link_ip={guest.link_ip} nvmflab.mgmt_mac={guest.mac(1)} "
                   f"nvmflab.link_mac={guest.mac(2)} nvmflab.rxe={int(guest.rxe)}")
        argv = [
            "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-cpu", "max", "-smp", "2", "-m", str(MEMORY_MB),
            "-nodefaults", "-no-reboot", "-display", "none",
            "-monitor", f"unix:{self.monitor_path(guest)},server=on,wait=off",
            "-serial", f"file:{guest.console}", "-kernel", str(kernel), "-initrd", str(initrd), "-append", cmdline,
            "-netdev", f"user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:{guest.ssh_port}-:22",
            "-device", f"virtio-net-pci,netdev=mgmt,mac={guest.mac(1)}",
            "-netdev", f"socket,id=link,udp=127.0.0.1:{remote},localaddr=127.0.0.1:{local}",
            "-device", f"virtio-net-pci,netdev=link,mac={guest.mac(2)}",
        ]  # fmt: skip
        guest.qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=open(self.work / f"{guest.name}.qemu.log", "wb"),
                                      preexec_fn=trixie._die_with_parent)

    # -- faults (tests/bed/test_bed_faults.py) ----------------------------------------------------

    def monitor_path(self, guest: Guest) -> Path:
        return self.work / f"{guest.name}.monitor"

    def monitor(self, name: str, command: str) -> str:
        """One command to NAME's qemu human monitor (its unix socket in the bed's directory, so an
        attached bed has it too); returns what the monitor printed. The guest sees nothing of it."""
        guest = self.guest(name)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(self.monitor_path(guest)))
            out = self._read_prompt(s)
            s.sendall(command.encode() + b"\n")
            out = self._read_prompt(s, quit=command == "quit")
        return out

    @staticmethod
    def _read_prompt(s: socket.socket, quit: bool = False) -> str:
        got = b""
        while not got.endswith(b"(qemu) "):
            try:
                chunk = s.recv(4096)
            except OSError:  # `quit` closes the socket under us
                break
            if not chunk:
                break
            got += chunk
        return got.decode(errors="replace")

    def set_link(self, up: bool) -> None:
        """Cut or restore the link between the guests (qemu's set_link on both ends' netdev): the
        guests' NICs stay, their carrier goes, as if a cable were pulled."""
        for guest in self.guests:
            self.monitor(guest.name, f"set_link link {'on' if up else 'off'}")

    def guest(self, name: str) -> Guest:
        return next(g for g in self.guests if g.name == name)

    def ssh_argv(self, guest: Guest) -> list[str]:
        return ["ssh", *self.ssh_options(), "-p", str(guest.ssh_port), "root@127.0.0.1"]

    def ssh_options(self) -> list[str]:
        return ["-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", "-o", "LogLevel=ERROR"]

    def ssh(self, name: str, command: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        guest = self.guest(name)
        done = subprocess.run(self.ssh_argv(guest) + [command], capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise BedError(f"{name}: `{command}` exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return done

    def _wait_ssh(self, guest: Guest) -> None:
        deadline = time.monotonic() + SSH_LIMIT_S
        while True:
            try:
                done = subprocess.run(self.ssh_argv(guest) + ["true"], capture_output=True, text=True,
                                      timeout=2 * SSH_CONNECT_TIMEOUT_S + 10)
                if done.returncode == 0:
                    return
                why = done.stderr.strip()[-200:]
            except subprocess.TimeoutExpired:
                why = "no answer"
            if time.monotonic() > deadline:
                raise BedError(f"{guest.name}: ssh -p {guest.ssh_port} did not answer in {SSH_LIMIT_S} s: {why}")
            time.sleep(2)

    # -- the inventories -------------------------------------------------------------------------

    def write_inventories(self) -> tuple[Path, Path]:
        """bed.toml (nvmflab's format) and bed.yml (Ansible's), the same two hosts."""
        options = self.ssh_options()
        toml = "".join(
            f'[hosts.{g.name}]\nssh = "127.0.0.1"\nuser = "root"\nport = {g.ssh_port}\ndata_ip = "{g.link_ip}"\n'
            f"ssh_options = [{', '.join(repr(o).replace(chr(39), chr(34)) for o in options)}]\n\n"
            for g in self.guests)
        extra = " ".join(o for o in options if o != "-i" and o != str(self.key))
        yml = "all:\n  vars:\n    ansible_host: 127.0.0.1\n    ansible_user: root\n" \
              f"    ansible_ssh_private_key_file: {self.key}\n    ansible_ssh_common_args: \"{extra}\"\n  hosts:\n" + \
              "".join(f"    {g.name}:\n      ansible_port: {g.ssh_port}\n      nvmflab_data_ip: {g.link_ip}\n"
                      for g in self.guests)
        (self.work / "bed.toml").write_text(toml)
        (self.work / "bed.yml").write_text(yml)
        return self.work / "bed.toml", self.work / "bed.yml"

    def close(self) -> None:
        for guest in self.guests:
            if guest.qemu is not None and guest.qemu.poll() is None:
                guest.qemu.terminate()
        for guest in self.guests:
            if guest.qemu is None:
                continue
            try:
                guest.qemu.wait(10)
            except subprocess.TimeoutExpired:
                guest.qemu.kill()
                guest.qemu.wait()


def _strip_copy(binary: Path, dest: Path) -> None:
    if not binary.is_file():
        raise BedError(f"{binary} is missing: build it first (make build)")
    done = subprocess.run(["strip", "--strip-debug", "-o", str(dest), str(binary)], capture_output=True, timeout=60)
    if done.returncode != 0:
        shutil.copy2(binary, dest)


def _oopsed(console: str) -> str:
    """The line where the guest's kernel died ("Oops: ...", "Kernel panic ..."), or "" if it did
    not: the init failing, or qemu itself, is a failed bed and is not booted again."""
    return next((line.split("] ", 1)[-1].strip() for line in console.splitlines()
                 if "Oops:" in line or "Kernel panic" in line), "")


def _tail(console: str, n: int = 4) -> str:
    return " | ".join(console.strip().splitlines()[-n:]) or "nothing on the console"


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up"])
    parser.add_argument("dir", type=Path, nargs="?",
                        help="where the inventories and logs go (default: a new temporary one)")
    args = parser.parse_args()
    bed = Bed(args.dir or Path(tempfile.mkdtemp(prefix="nvmflab-bed-")))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        bed.up()
        print(f"bed: ready; inventories {bed.work}/bed.toml and {bed.work}/bed.yml; Ctrl-C stops both guests",
              flush=True)
        while True:  # a guest that stopped (a fault test powered it off) is booted again when asked
            time.sleep(2)
            for guest in bed.guests:
                ask = bed.boot_request(guest.name)
                if guest.qemu.poll() is not None and ask.exists():
                    ask.unlink()
                    print(f"bed: {guest.name} stopped; booting it again", flush=True)
                    bed.restart(guest.name)
    except BedError as e:
        print(f"bed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        bed.close()


if __name__ == "__main__":
    sys.exit(main())
