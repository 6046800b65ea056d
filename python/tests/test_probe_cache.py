"""Read-only facts of a host asked once per run (Host.ask), asked again after a reconnect, and the
SSH logins of a run made at once: each question over SSH is a round trip (0.2-1 s on an emulated
guest). The SshHost tests use a fake `ssh` on PATH that runs commands here and logs each call."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from nvmflab.stacks.kernel import KernelStack
from nvmflab.topology import napi, rdma, tls
from nvmflab.topology.base import Host, HostError, Hosts
from nvmflab.topology.inventory import HostEntry
from nvmflab.topology.ssh import SshHost, login_all


class CountingHost(Host):
    """Answers every command with `answers[argv[0]]` (exit 0, else 1) and counts what it ran."""

    name, data_ip, cores = "h", "10.0.0.1", None

    def __init__(self, answers: dict[str, str] | None = None):
        self.ran: list[list[str]] = []
        self.answers = answers or {}

    def run(self, argv, timeout=60.0, check=True, input=None):
        self.ran.append(list(argv))
        out = self.answers.get(argv[0])
        return subprocess.CompletedProcess(argv, 0 if out is not None else 1, out or "", "")

    def count(self, word: str) -> int:
        return sum(word in " ".join(argv) for argv in self.ran)

    spawn = workdir = put = read_text = free_port = None  # not used here


TLS_OUTPUT = ("kernel=6.12.0\nconfig_source=/boot/config-6.12.0\nCONFIG_NVME_TCP_TLS=y\nCONFIG_TLS=m\n"
              "tls_module=available\ntlshd=/usr/sbin/tlshd\nnvme_version=nvme version 2.13\n"
              "nvme_connect_tls=yes\nnvme_tls_keys=yes\n")


def test_the_tls_facts_are_asked_once_until_the_host_forgets():
    host = CountingHost({"sh": TLS_OUTPUT})
    first, second = tls.probe(host), tls.probe(host)
    assert first.kernel == second.kernel == "6.12.0" and tls.kernel_unavailable(second, "host") is None
    assert host.count("uname -r") == 1
    host.forget_answers()  # what a reconnect does
    tls.probe(host)
    assert host.count("uname -r") == 2


RDMA_OUTPUT = ("rxe0|1|Ethernet|4: ACTIVE|/sys/devices/virtual/infiniband/rxe0||1: CA\n"
               "@@nvmflab-rdma rdma\nlink rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0\n"
               "@@nvmflab-rdma rc 0\n@@nvmflab-rdma ibv\n    device          \t   node GUID\n"
               "    ------          \t----------------\n    rxe0            \t5054fffe123456ab\n@@nvmflab-rdma rc 0\n")


def test_the_rdma_facts_are_one_round_trip_asked_once_per_run():
    host = CountingHost({"sh": RDMA_OUTPUT})
    for _ in range(3):  # env's snapshot, the planning check, the study's device column
        devices, notes = rdma.probe(host)
        assert notes == [] and [d.name for d in rdma.usable(devices)] == ["rxe0"]
        assert devices[0].verbs is True and devices[0].ports[0].netdev == "eth0"
    assert len(host.ran) == 1


@pytest.mark.parametrize("tail, link, ibv, notes", [
    ("@@nvmflab-rdma rdma\n@@nvmflab-rdma rc 127\n@@nvmflab-rdma ibv\n@@nvmflab-rdma rc 127\n", None, None,
     ["rdma link: not installed", "ibv_devices: not installed"]),
    ("@@nvmflab-rdma rdma\n@@nvmflab-rdma rc 1\n@@nvmflab-rdma ibv\nNo IB devices found\n@@nvmflab-rdma rc 1\n",
     None, False, []),
    # cut short (no exit code line): what the tool printed is not taken
    ("@@nvmflab-rdma rdma\nlink rxe0/1 state DOWN netdev eth0\n", None, None, []),
])
def test_the_rdma_probe_sections_say_which_tool_is_missing_or_failed(tail, link, ibv, notes):
    sysfs = "rxe0|1|Ethernet|4: ACTIVE|/sys/devices/virtual/infiniband/rxe0||1: CA\n"
    devices, got = rdma.probe(CountingHost({"sh": sysfs + tail}))
    assert got == notes
    assert devices[0].ports[0].state == (link or "ACTIVE") and devices[0].verbs is ibv


def test_the_kernel_stack_asks_installed_modules_and_versions_once_and_loaded_ones_each_time():
    host = CountingHost({"id": "0\n", "true": "", "modinfo": "filename: x\n", "uname": "6.12.0\n",
                         "fio": "fio-3.38\n", "nvme": "nvme version 2.13\n"})
    stack = KernelStack(root="/fake")
    for _ in range(2):
        assert stack.rdma_unavailable(host, "host") is None
        assert stack.versions(host) == {"kernel": "6.12.0", "nvme-cli": "nvme version 2.13", "fio": "fio-3.38"}
    assert host.count("modinfo nvme_rdma") == 1 and host.count("uname -r") == 1 and host.count("id -u") == 1
    host.answers.pop("modinfo")  # not installed: whether it is loaded is asked, each time
    host.forget_answers()
    stack.rdma_unavailable(host, "host")
    stack.rdma_unavailable(host, "host")
    assert host.count("test -e /fake/sys/module/nvme_rdma") == 2 and host.count("modinfo nvme_rdma") == 2


def test_a_host_error_is_not_kept():
    class Flaky(CountingHost):
        def run(self, argv, timeout=60.0, check=True, input=None):
            if not self.ran:
                self.ran.append(list(argv))
                raise HostError("h: lost")
            return super().run(argv, timeout, check, input)

    host = Flaky({"uname": "6.12.0\n"})
    with pytest.raises(HostError):
        host.ask(["uname", "-r"])
    assert host.ask(["uname", "-r"]).stdout == "6.12.0\n" and len(host.ran) == 2


def test_busy_poll_sysctls_are_one_round_trip_and_read_fresh():
    assert napi.parse_sysctls("busy_poll=50\nbusy_read=\n") == {"busy_poll": 50, "busy_read": None}
    assert napi.parse_sysctls("busy_poll=x\nnoise=1\n") == {"busy_poll": None, "busy_read": None}
    host = CountingHost({"sh": "busy_poll=0\nbusy_read=7\n"})
    assert napi.sysctls(host) == napi.sysctls(host) == {"busy_poll": 0, "busy_read": 7}
    assert len(host.ran) == 2  # the busy-poll study sets them: never kept


# -- SshHost with a fake ssh ---------------------------------------------------------------------

FAKE_SSH = r"""#!/bin/bash
# A master (-N) makes its ControlPath and waits; any other call runs its last word here.
echo "$*" >> "$FAKE_SSH_LOG"
for a in "$@"; do case "$a" in ControlPath=*) path=${a#ControlPath=};; esac; done
if [[ " $* " == *" -N "* ]]; then
    [ -n "$FAKE_SSH_DENY" ] && { echo "Permission denied (publickey)." >&2; exit 255; }
    # with FAKE_SSH_TOGETHER=N: logged in only once N masters have started (a login barrier)
    for _ in $(seq 100); do
        [ "$(grep -c -- ' -N ' "$FAKE_SSH_LOG")" -ge "${FAKE_SSH_TOGETHER:-1}" ] && { : > "$path"; exec sleep 60; }
        sleep 0.05
    done
    echo "the other logins never started" >&2; exit 255
fi
exec sh -c "${@: -1}"
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "ssh").write_text(FAKE_SSH)
    (folder / "ssh").chmod(0o755 | stat.S_IXUSR)
    log = tmp_path / "ssh.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return log


def calls(log: Path, word: str) -> int:
    return sum(word in line for line in log.read_text().splitlines())


def test_an_ssh_hosts_answers_are_kept_until_it_reconnects(fake_ssh):
    host = SshHost(HostEntry(name="a", ssh="a", data_ip="10.0.0.1"))
    try:
        assert host.ask(["uname", "-s"]).stdout.strip() == "Linux"
        assert host.which("sh") == host.which("sh") is not None
        host.ask(["uname", "-s"])
        assert calls(fake_ssh, "uname -s") == 1 and calls(fake_ssh, "command -v sh") == 1
        host.run(["echo", "fresh"])
        host.run(["echo", "fresh"])
        assert calls(fake_ssh, "echo fresh") == 2  # run() is never kept
        host._master.kill()  # the connection is lost: the next command logs in again
        host._master.wait(10)
        host.ask(["uname", "-s"])
        assert calls(fake_ssh, " -N ") == 2 and calls(fake_ssh, "uname -s") == 2
    finally:
        host.close()


def test_the_hosts_of_a_run_log_in_at_once(fake_ssh, monkeypatch):
    monkeypatch.setenv("FAKE_SSH_TOGETHER", "3")  # one after another, the first login would fail
    hosts = [SshHost(HostEntry(name=n, ssh=n, data_ip="10.0.0.1")) for n in ("t", "i1", "i2")]
    try:
        login_all(Hosts(hosts[0], hosts[1:]))
        assert [h._master.poll() for h in hosts] == [None] * 3
        assert hosts[1].ask(["echo", "up"]).stdout == "up\n" and calls(fake_ssh, " -N ") == 3
    finally:
        for host in hosts:
            host.close()


def test_a_failed_login_names_the_first_host_of_the_run(fake_ssh, monkeypatch):
    monkeypatch.setenv("FAKE_SSH_DENY", "1")
    hosts = [SshHost(HostEntry(name=n, ssh=n, data_ip="10.0.0.1")) for n in ("target", "init")]
    try:
        with pytest.raises(HostError, match=r"^target: cannot log in with `ssh target`: Permission denied"):
            login_all(Hosts(hosts[0], hosts[1:]))
        assert calls(fake_ssh, " -N ") == 2  # both were tried
    finally:
        for host in hosts:
            host.close()
