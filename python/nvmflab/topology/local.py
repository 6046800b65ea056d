"""This machine as a host, optionally inside a network namespace (`ip netns exec`)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import procs
from ..tools import ToolMissing, require_tool
from .base import Host, HostError, HostProcess, checked


class LocalProcess(HostProcess):
    def __init__(self, proc: subprocess.Popen, files: list):
        self.proc = proc
        self._files = files

    def wait(self, timeout: float) -> tuple[int | None, float, float]:
        result = procs.wait_rusage(self.proc, timeout)
        if result[0] is not None:
            self._close_files()
        return result

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        procs.stop(self.proc)
        self._close_files()

    def cpu_seconds(self) -> tuple[float, float]:
        try:
            return procs.cpu_seconds(self.proc.pid)
        except (OSError, ValueError, IndexError):
            return 0.0, 0.0

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []


class LocalHost(Host):
    def __init__(self, name: str = "local", data_ip: str = "127.0.0.1", cores: list[int] | None = None,
                 netns: str | None = None, workdir: Path | None = None):
        self.name, self.data_ip, self.cores, self.netns = name, data_ip, cores, netns
        self._workdir = workdir

    def _prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(self._prefix() + argv, capture_output=True, text=True, timeout=timeout,
                                  input=input, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: `{' '.join(argv)}` still running after {timeout:.0f} s") from None
        except OSError as err:
            raise HostError(f"{self.name}: cannot run {argv[0]} ({err.strerror})") from None
        return checked(done, self.name, argv) if check else done

    def spawn(self, argv: list[str], cpus, log: Path, stdout: Path | None = None) -> LocalProcess:
        log_file = open(log, "ab")
        out_file = open(stdout, "wb") if stdout else log_file
        files = [log_file] + ([out_file] if stdout else [])
        try:
            proc = procs.spawn(argv, cpus, stdout=out_file, stderr=log_file, prefix=self._prefix() or None)
        except OSError as err:
            for f in files:
                f.close()
            raise HostError(f"{self.name}: cannot start {argv[0]} ({err.strerror})") from None
        return LocalProcess(proc, files)

    def free_port(self) -> int:
        return procs.free_port("127.0.0.1" if self.netns else self.data_ip)

    def binary(self, name: str) -> str:
        try:
            return str(require_tool(name))
        except ToolMissing as err:
            raise HostError(f"{self.name}: {err}") from None

    def workdir(self) -> str:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="nvmflab-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        return str(self._workdir)

    def put(self, local: Path, remote: str) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            shutil.copyfile(local, remote)

    def read_text(self, path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as err:
            raise HostError(f"{self.name}: cannot read {path} ({err.strerror})") from None
