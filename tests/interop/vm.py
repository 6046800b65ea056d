"""The interop test bed: a network namespace of our own, a tap link into it, and the guest VM.

    root namespace  |  netns nvmflab-interop-PID
                    |    tap0 10.200.0.1/24  <-- virtio-net -->  guest eth0 10.200.0.2/24
                    |    nvmf-target / nvmf-perf run here (ip netns exec)

Traffic stays inside the namespace this module creates. qemu dies with its parent
(PR_SET_PDEATHSIG) and `TestBed.close()` kills every process and deletes the namespace, so a
failed or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from initramfs import BootFiles

HOST_IP = "10.200.0.1"
GUEST_IP = "10.200.0.2"
PR_SET_PDEATHSIG = 1
SECTION_BEGIN = re.compile(r"^@@BEGIN (\S+)\s*$")
SECTION_END = re.compile(r"^@@END (\S+) (\d+)\s*$")


class BedError(RuntimeError):
    """The test bed could not be set up or the guest misbehaved; the message says how."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise BedError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def remove_stale_namespaces() -> None:
    """Deletes namespaces of earlier runs whose process is gone (killed before it cleaned up)."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(r"nvmflab-interop-(\d+)", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@dataclass
class Section:
    name: str
    rc: int
    output: str


@dataclass
class Console:
    """The guest's serial console, read line by line on a thread."""

    lines: "queue.Queue[str | None]" = field(default_factory=queue.Queue)
    transcript: list[str] = field(default_factory=list)

    def pump(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").replace("\r", "").rstrip("\n")
            self.transcript.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.transcript[-n:])


class TestBed:
    """Owns the namespace, the processes started in it, and the guest."""

    __test__ = False  # not a pytest class

    def __init__(self, boot: BootFiles, log_dir: Path):
        self.boot = boot
        self.log_dir = log_dir
        self.netns = f"nvmflab-interop-{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        self.qemu: subprocess.Popen | None = None
        self.console = Console()
        self.sections: dict[str, Section] = {}
        self._netns_made = False

    # ---- namespace ----

    def create_netns(self) -> None:
        if os.geteuid() != 0:
            raise BedError("the interop bed needs root (network namespace and tap device)")
        remove_stale_namespaces()
        _ip("netns", "add", self.netns)
        self._netns_made = True
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("-n", self.netns, "tuntap", "add", "dev", "tap0", "mode", "tap")
        _ip("-n", self.netns, "addr", "add", f"{HOST_IP}/24", "dev", "tap0")
        _ip("-n", self.netns, "link", "set", "tap0", "up")

    def ns_cmd(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run_in_ns(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.ns_cmd(argv), capture_output=True, text=True, timeout=timeout)

    def spawn_in_ns(self, argv: list[str], log_name: str, **kw) -> subprocess.Popen:
        log = open(self.log_dir / log_name, "wb")
        p = subprocess.Popen(self.ns_cmd(argv), stdout=kw.pop("stdout", log), stderr=log, preexec_fn=_die_with_parent, **kw)
        self.procs.append(p)
        return p

    # ---- guest ----

    def boot_guest(self, params: dict[str, str]) -> None:
        cmdline = " ".join(
            ["console=ttyS0", "quiet", "loglevel=1", "panic=-1", "rdinit=/init"]
            + [f"nvmflab.{k}={v}" for k, v in params.items()]
            + [f"nvmflab.guest_ip={GUEST_IP}", f"nvmflab.host_ip={HOST_IP}"]
        )
        argv = [
            "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-cpu", "max", "-smp", "2", "-m", "1024",
            "-nodefaults", "-no-reboot", "-display", "none", "-monitor", "none", "-serial", "stdio",
            "-kernel", str(self.boot.kernel), "-initrd", str(self.boot.initrd), "-append", cmdline,
            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
            "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:4e:56:4d",
        ]  # fmt: skip
        self.qemu = subprocess.Popen(
            self.ns_cmd(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.procs.append(self.qemu)
        threading.Thread(target=self.console.pump, args=(self.qemu.stdout,), daemon=True).start()

    def expect(self, marker: str, timeout: float) -> None:
        """Reads the console until `marker` alone on a line, collecting sections on the way."""
        deadline = time.monotonic() + timeout
        current: tuple[str, list[str]] | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BedError(f"guest did not reach {marker} within {timeout:.0f} s; console:\n{self.console.tail()}")
            try:
                line = self.console.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise BedError(f"guest stopped before {marker}; console:\n{self.console.tail()}")
            if line.strip() == marker:
                return
            if m := SECTION_BEGIN.match(line):
                current = (m.group(1), [])
            elif (m := SECTION_END.match(line)) and current and current[0] == m.group(1):
                self.sections[current[0]] = Section(current[0], int(m.group(2)), "\n".join(current[1]))
                current = None
            elif current:
                current[1].append(line)

    def tell_guest(self, line: str) -> None:
        assert self.qemu and self.qemu.stdin
        self.qemu.stdin.write(line.encode() + b"\n")
        self.qemu.stdin.flush()

    def wait_guest_exit(self, timeout: float) -> None:
        assert self.qemu
        try:
            self.qemu.wait(timeout)
        except subprocess.TimeoutExpired:
            raise BedError(f"guest did not power off within {timeout:.0f} s") from None

    # ---- teardown ----

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        (self.log_dir / "console.log").write_text("\n".join(self.console.transcript) + "\n")
        if self._netns_made:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
            self._netns_made = False
