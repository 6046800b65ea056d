"""A few SSH hosts made of network namespaces, for testing the ssh topology for real.

Layout: a "switch" namespace holds a bridge; every host namespace and this (root) namespace get a
veth pair into it, all in one private /24. The bridge lives in its own namespace so no firewall
rule of this machine applies and no forwarding has to be switched on here. Each host namespace
runs its own sshd on its veth address with host keys made here; the client uses a private
ssh_config with aliases (lab-0, lab-1, ...) and a private known_hosts, never ~/.ssh.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in (SSHD, "ssh", "ssh-keygen", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} not found (install openssh-server, openssh-client and iproute2)"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


class SshBed:
    def __init__(self, folder: Path, count: int = 3):
        pid = os.getpid()
        self.folder, self.count = folder, count
        self.tag = f"{pid % 10_000_000}"
        self.subnet = f"10.{100 + pid % 150}.{77 + (pid // 150) % 100}"
        self.switch = f"nvmflab-sshsw-{self.tag}"
        self.namespaces = [f"nvmflab-ssh-{self.tag}-{i}" for i in range(count)]
        self.aliases = [f"lab-{i}" for i in range(count)]
        self.ips = [f"{self.subnet}.{11 + i}" for i in range(count)]
        self.root_if = f"nv{self.tag}r"
        self.ssh_config = folder / "ssh_config"
        self._sshd: list[subprocess.Popen] = []

    # -- life ----------------------------------------------------------------------------------

    def __enter__(self) -> "SshBed":
        try:
            self._keys()
            self._network()
            self._servers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for proc in self._sshd:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.namespaces + [self.switch]:
            for pid in self.pids(ns):  # whatever a test left running there
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.root_if, check=False)
        # /run/sshd stays: another bed (a parallel test worker) may have an sshd that needs it.

    def _keys(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.folder / "client_key"))
        (self.folder / "authorized_keys").write_text((self.folder / "client_key.pub").read_text())
        known = []
        for i, ip in enumerate(self.ips):
            key = self.folder / f"host_key_{i}"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
            known.append(f"{ip} {key.with_suffix('.pub').read_text().split(' ')[0]} "
                         f"{key.with_suffix('.pub').read_text().split(' ')[1]}")
        (self.folder / "known_hosts").write_text("\n".join(known) + "\n")
        aliases = "".join(f"Host {alias}\n  HostName {ip}\n" for alias, ip in zip(self.aliases, self.ips))
        self.ssh_config.write_text(aliases + f"""Host *
  User root
  IdentityFile {self.folder / 'client_key'}
  IdentitiesOnly yes
  UserKnownHostsFile {self.folder / 'known_hosts'}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
""")

    def _network(self) -> None:
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        pairs = [(self.root_if, f"nv{self.tag}s", None)] + [
            (f"nv{self.tag}h{i}", f"nv{self.tag}p{i}", ns) for i, ns in enumerate(self.namespaces)]
        for near, far, ns in pairs:
            if ns:
                _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", near, "type", "veth", "peer", "name", far)
            _run("ip", "link", "set", far, "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", far, "master", "br0", "up")
            if ns:
                _run("ip", "link", "set", near, "netns", ns)
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.root_if)
        _run("ip", "link", "set", self.root_if, "up")
        for ns, ip, i in zip(self.namespaces, self.ips, range(self.count)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", f"nv{self.tag}h{i}")
            _run("ip", "-n", ns, "link", "set", f"nv{self.tag}h{i}", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _servers(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for i, (ns, ip) in enumerate(zip(self.namespaces, self.ips)):
            config = self.folder / f"sshd_config_{i}"
            config.write_text(f"""ListenAddress {ip}
Port 22
HostKey {self.folder / f'host_key_{i}'}
AuthorizedKeysFile {self.folder / 'authorized_keys'}
PidFile none
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
""")
            log = open(self.folder / f"sshd_{i}.log", "wb")
            self._sshd.append(subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)],
                                               stdout=log, stderr=log, stdin=subprocess.DEVNULL))
            log.close()
        deadline = time.monotonic() + 20
        for i, ip in enumerate(self.ips):
            while True:
                try:
                    socket.create_connection((ip, 22), timeout=1).close()
                    break
                except OSError:
                    if self._sshd[i].poll() is not None or time.monotonic() > deadline:
                        log = (self.folder / f"sshd_{i}.log").read_text(errors="replace").strip()
                        raise RuntimeError(f"sshd in {self.namespaces[i]} did not start: {log[-300:]}")
                    time.sleep(0.05)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def pids(ns: str) -> list[int]:
        done = _run("ip", "netns", "pids", ns, check=False)
        return [int(p) for p in done.stdout.split()]

    def commands(self, ns: str) -> list[str]:
        """Command names of the processes in a namespace, sshd's own excluded."""
        names = []
        for pid in self.pids(ns):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                pass
        return [n for n in names if not n.startswith("sshd")]

    def inventory_toml(self, cores: list[int] | None = None) -> str:
        text = ""
        for alias, ip in zip(self.aliases, self.ips):
            text += (f'[hosts.{alias}]\nssh = "{alias}"\ndata_ip = "{ip}"\n'
                     f'ssh_options = ["-F", "{self.ssh_config}"]\n')
            if cores:
                text += f"cores = {cores}\n"
        return text
