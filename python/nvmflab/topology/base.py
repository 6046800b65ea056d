"""What a topology hands the runner: hosts that run commands, wherever they are.

A `Host` is a machine (or a namespace on this one) that can run a short command, start a long
one pinned to cores, and move files. The stacks and the runner use only this interface, so our
stack, the kernel's and SPDK's run the same way on this machine, in a namespace or over SSH.
"""

from __future__ import annotations

import shlex
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path


class HostError(Exception):
    """A host could not do what was asked; the message is one line naming the host."""


class HostProcess(ABC):
    """A long-running command started by `Host.spawn`."""

    @abstractmethod
    def wait(self, timeout: float) -> tuple[int | None, float, float]:
        """(exit code or None on timeout, user CPU s, system CPU s of the command and its children)."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def stop(self) -> None:
        """TERM, then KILL after a grace period; the command and its children are gone afterwards."""

    @abstractmethod
    def cpu_seconds(self) -> tuple[float, float]:
        """(user, system) CPU seconds the live command has used so far (0, 0 where not readable)."""


class Host(ABC):
    """One place commands run. `name` is the inventory name ("local" for this machine)."""

    name: str
    data_ip: str  # the address NVMe/TCP traffic to and from this host uses
    cores: list[int] | None  # usable cores; None = all
    remote: bool = False  # True when files must be copied to and from it

    @abstractmethod
    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a short command to completion; with `check`, a non-zero exit raises HostError."""

    @abstractmethod
    def spawn(self, argv: list[str], cpus: tuple[int, ...] | list[int] | None, log: Path,
              stdout: Path | None = None) -> HostProcess:
        """Start a long command pinned to cpus; stderr (and stdout unless given) go to `log` here."""

    @abstractmethod
    def workdir(self) -> str:
        """A directory on the host for this run's files (made on first use)."""

    @abstractmethod
    def put(self, local: Path, remote: str) -> None: ...

    @abstractmethod
    def read_text(self, path: str) -> str:
        """A file's content on the host; HostError when it cannot be read."""

    @abstractmethod
    def free_port(self) -> int:
        """A TCP port on `data_ip` that nothing listens on now."""

    def forward(self, address: str, port: int) -> tuple[str, int]:
        """Where this machine connects to reach TCP `address:port` on the host (our target's /stats
        on the data address): the same address here; SshHost tunnels it, since the data network
        need not be routed to the controlling machine."""
        return address, port

    def unforward(self, address: str, port: int) -> None:
        """Undo forward() for `address:port` (the service is gone)."""

    def binary(self, name: str) -> str:
        """Path on the host of a program a stack runs. Our binaries (nvmf-target, nvmf-perf) are
        copied to remote hosts; others must be installed there. HostError when absent."""
        path = self.which(name)
        if path is None:
            raise HostError(f"{self.name}: {name} not found")
        return path

    def which(self, name: str) -> str | None:
        """Path of a command on the host's PATH (plus the sbin folders), or None."""
        done = self.ask(["sh", "-c", f"PATH=$PATH:/usr/sbin:/sbin command -v {shlex.quote(name)}"])
        path = done.stdout.strip().splitlines()
        return path[0] if done.returncode == 0 and path else None

    def ask(self, argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """`run(argv, check=False)` for a read-only question whose answer nothing the harness does
        changes (a tool's path or version, the kernel and its config, an installed module): asked
        once per connection to the host, i.e. once per run over SSH, where each question is a round
        trip. A HostError is raised each time, never kept. Not for state the harness changes
        (loaded modules, sysctls it sets, configfs) nor for counters."""
        key = tuple(argv)
        kept = self.__dict__.get("_answers", {}).get(key)  # subclasses need not call our __init__
        if kept is None:
            kept = self.run(list(argv), timeout=timeout, check=False)
            # stored after run(): a run that had to reconnect first has just forgotten the rest
            self.__dict__.setdefault("_answers", {})[key] = kept
        return kept

    def forget_answers(self) -> None:
        """Drop what `ask` kept: the host may have changed (a new connection to it, a reboot)."""
        self.__dict__.pop("_answers", None)

    def describe(self, argv: list[str]) -> str:
        """The command as a person would type it on this host (for `--plan`)."""
        return f"[{self.name}] {shlex.join(argv)}"

    def close(self) -> None:
        """Release connections; the host itself stays as it was."""


def checked(done: subprocess.CompletedProcess[str], host: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip().splitlines()
        raise HostError(f"{host}: `{shlex.join(argv)}` exited {done.returncode}: "
                        f"{detail[-1] if detail else '(no output)'}")
    return done


class Hosts:
    """The hosts of one run: where targets run and where load generators run (first = default)."""

    def __init__(self, target: Host, initiators: list[Host]):
        if not initiators:
            raise HostError("a topology needs at least one initiator host")
        self.target, self.initiators = target, initiators

    def initiator(self, name: str | None) -> Host:
        if name is None:
            return self.initiators[0]
        for host in self.initiators:
            if host.name == name:
                return host
        raise HostError(f"no initiator host named {name!r}; have: {', '.join(h.name for h in self.initiators)}")

    def all(self) -> list[Host]:
        seen: dict[str, Host] = {}
        for host in [self.target, *self.initiators]:
            seen.setdefault(host.name, host)
        return list(seen.values())

    def close(self) -> None:
        for host in self.all():
            host.close()
