"""Faults the two-guest bed provokes for real (tests/bed/test_bed_faults.py), here on fakes in a
second: what a SIGKILLed run left on the kernel stack's machine is removed by the next run (only
nvmflab's marked entries; a user's stay), a host that stops answering ends the run naming it, and
the SSH login allowance follows the inventory's ConnectTimeout."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from types import SimpleNamespace

import pytest

from nvmflab.dhchapkey import random_secret
from nvmflab.plan import Subsystem
from nvmflab.runner import HostLost, Runner
from nvmflab.stacks import kernel_leftovers as leftovers
from nvmflab.stacks.base import StackError
from nvmflab.stacks.kernel import KernelStack
from nvmflab.stacks.ours import TLS_HOSTNQN
from nvmflab.studies.common import NQN_PREFIX
from nvmflab.topology.base import HostError, Hosts
from nvmflab.topology.ssh import login_limit_s
from test_stack_kernel import NQN, FakeKernel, _attrs, fake, setup_for, snapshot  # noqa: F401 (fake: a fixture)

USER_SUB, USER_HOST = "nqn.2026-01.example:mine", "nqn.2026-01.example:host"


def killed_runs_setup():
    """Two subsystems (a /dev/shm file and a null_blk device), DH-HMAC-CHAP: a keyed host entry."""
    return replace(setup_for(Subsystem(NQN, "ram", 1 << 20), Subsystem(NQN + "-2", "null", 64 << 20)),
                   dhchap="ffdhe2048", dhchap_key=random_secret())


def users_own_entries(root) -> None:
    """A subsystem, host entry and port of the user's; the port also serves a marked subsystem."""
    nvmet = root / "sys/kernel/config/nvmet"
    _attrs(nvmet / "subsystems" / USER_SUB, {"attr_allow_any_host": "1"}, ["namespaces", "allowed_hosts"])
    _attrs(nvmet / "hosts" / USER_HOST, {"dhchap_key": "theirs"}, [])
    (nvmet / "subsystems" / USER_SUB / "allowed_hosts" / USER_HOST).symlink_to(nvmet / "hosts" / USER_HOST)
    _attrs(nvmet / "ports/7", {"addr_trsvcid": "4420"}, ["subsystems", "referrals"])
    (nvmet / "ports/7/subsystems" / USER_SUB).symlink_to(nvmet / "subsystems" / USER_SUB)


def without_modules(tree: dict[str, str]) -> dict[str, str]:
    return {path: v for path, v in tree.items() if not path.startswith("sys/module")}  # modules stay loaded


def test_a_killed_runs_target_is_removed_by_the_next_run_and_the_users_entries_stay(fake, tmp_path, capsys,
                                                                                    monkeypatch):
    host, stack = fake
    nvmet = host.root / "sys/kernel/config/nvmet"
    users_own_entries(host.root)
    before = without_modules(snapshot(host.root))
    killed = stack.start_target(killed_runs_setup(), host, tmp_path)  # never stopped: SIGKILL
    (nvmet / f"ports/7/subsystems/{NQN}").symlink_to(nvmet / "subsystems" / NQN)  # a marked link on their port
    assert (nvmet / "hosts" / TLS_HOSTNQN / "dhchap_key").exists() and killed.port_dir
    # The next run: another process (a new stack and host object) on the same machine.
    nxt, nxt_host = KernelStack(root=stack.root, sudo=[]), FakeKernel(host.root)
    monkeypatch.setattr(KernelStack, "clean_leftovers", lambda self, h: [])
    with pytest.raises(StackError, match="exists already"):  # what a run did before the cleanup
        nxt.start_target(killed_runs_setup(), nxt_host, tmp_path)
    monkeypatch.undo()
    target = nxt.start_target(killed_runs_setup(), FakeKernel(host.root), tmp_path)
    said = capsys.readouterr().err
    for name in (f"subsystem {NQN}", f"host entry {TLS_HOSTNQN}", "null_blk nvmflab-", "/dev/shm/nvmflab-"):
        assert name in said, said
    assert USER_SUB not in said and USER_HOST not in said and "port 7" in said  # its marked link, not the port
    target.stop()
    assert target.teardown_errors == []
    assert without_modules(snapshot(host.root)) == before  # the user's entries exactly as they were


def test_leftovers_are_removed_once_per_machine_so_this_runs_own_target_stays(fake, tmp_path):
    host, stack = fake  # the local topology: the target's and the host's KernelStack are two instances
    target = stack.start_target(killed_runs_setup(), host, tmp_path)
    assert KernelStack(root=stack.root, sudo=[]).clean_leftovers(host) == []
    assert target.alive() and (host.root / "sys/kernel/config/nvmet/subsystems" / NQN).is_dir()
    target.stop()


class KeyringKernel(FakeKernel):
    """FakeKernel with a `.nvme` keyring: SCAN_KEYS answers `keys`, keyctl unlink is recorded."""

    keys = ""

    def run(self, argv, timeout=60.0, check=True, input=None):
        if argv[:3] == ["sh", "-c", leftovers.SCAN_KEYS] or argv[0] == "keyctl":
            self.commands.append(list(argv))
            return self._done(argv, 0, self.keys if argv[0] == "sh" else "")
        return super().run(argv, timeout, check, input)


def test_only_keys_that_name_a_marked_nqn_are_unlinked(fake):
    host, stack = fake
    keyring = KeyringKernel(host.root)
    keyring.keys = "\n".join([
        f"key\t101\tpsk;0;0;3f010000;NVMe0R01 {TLS_HOSTNQN} {NQN}",
        f"key\t102\tpsk;0;0;3f010000;NVMe1R01 {USER_HOST} {NQN} digest",  # their host, our subsystem: ours
        f"key\t103\tpsk;0;0;3f010000;NVMe0R01 {USER_HOST} {USER_SUB}",  # the user's own PSK
        f"key\t104\tuser;0;0;3f010000;{NQN}",  # not a PSK
        "key\tx1\tpsk;0;0;3f010000;NVMe0R01 nonsense",
    ])
    assert stack.clean_leftovers(keyring) == ["key 101", "key 102"]
    assert [c for c in keyring.commands if c[0] == "keyctl"] == [
        ["keyctl", "unlink", "101", "%:.nvme"], ["keyctl", "unlink", "102", "%:.nvme"]]


def test_ports_lose_only_marked_links_and_only_ports_of_marked_subsystems_go():
    found = leftovers.parse("\n".join([
        f"port\t1\t{NQN} ", f"port\t2\t{NQN} {USER_SUB} ", f"port\t3\t{USER_SUB} ", "port\t4\t",
        f"sub\t{NQN}\t1 \t{TLS_HOSTNQN} ", f"sub\t{USER_SUB}\t1 \t", f"host\t{USER_HOST}",
        "nullb\tnullb0", "nullb\tnvmflab-4420-0", "shm\tother.img", "shm\tnvmflab-4420-1.img",
    ]))
    nvmet = "/sys/kernel/config/nvmet"
    assert found.steps("/") == [
        ["rm", f"{nvmet}/ports/1/subsystems/{NQN}"], ["rmdir", f"{nvmet}/ports/1"],
        ["rm", f"{nvmet}/ports/2/subsystems/{NQN}"],  # port 2 also serves the user's subsystem: it stays
        leftovers.write("0", f"{nvmet}/subsystems/{NQN}/namespaces/1/enable"),
        ["rmdir", f"{nvmet}/subsystems/{NQN}/namespaces/1"],
        ["rm", f"{nvmet}/subsystems/{NQN}/allowed_hosts/{TLS_HOSTNQN}"], ["rmdir", f"{nvmet}/subsystems/{NQN}"],
        leftovers.write("0", "/sys/kernel/config/nullb/nvmflab-4420-0/power"),
        ["rmdir", "/sys/kernel/config/nullb/nvmflab-4420-0"], ["rm", "-f", "/dev/shm/nvmflab-4420-1.img"],
    ]


def test_the_marks_are_the_ones_the_harness_names_its_things_with():
    assert leftovers.MARK == f"{NQN_PREFIX}:" and leftovers.marked(TLS_HOSTNQN) and leftovers.marked(NQN)


class Remote:
    """A remote host whose `true` fails `fails` times (None: always)."""

    remote, data_ip = True, "10.0.0.2"

    def __init__(self, name: str, fails: int | None):
        self.name, self.fails, self.asked = name, fails, 0

    def run(self, argv, timeout=60.0, check=True, input=None):
        self.asked += 1
        if self.fails is None or self.asked <= self.fails:
            raise HostError(f"{self.name}: cannot log in with `ssh 127.0.0.1`: Connection refused")
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_a_host_that_stops_answering_ends_the_run_naming_it_and_saying_how_to_resume():
    gone, fine = Remote("bed1", None), Remote("bed2", 1)  # bed2 misses one answer: a loaded machine
    runner = SimpleNamespace(hosts=Hosts(fine, [fine]))
    Runner._hosts_answer(runner)
    assert fine.asked == 2
    runner = SimpleNamespace(hosts=Hosts(gone, [fine]))
    with pytest.raises(HostLost, match=r"^bed1 stopped answering during the run \(bed1: cannot log in .*refused\);"
                                       r".*run the same command again to resume"):
        Runner._hosts_answer(runner)
    assert gone.asked == 2 and isinstance(HostLost("x"), HostError)  # the session names the inventory with it


def test_the_login_allowance_follows_the_inventorys_connect_timeout():
    assert login_limit_s([]) == 25  # ssh's ConnectTimeout 10: the connect and the handshake, 5 s to log in
    assert login_limit_s(["-o", "ConnectTimeout=60"]) == 125
    assert login_limit_s(["-oConnectTimeout 30", "-o", "ConnectTimeout=99"]) == 65  # ssh keeps the first
    assert login_limit_s(["-o", "ConnectTimeout=soon"]) == 25


def test_a_target_whose_host_cannot_be_asked_counts_as_gone_not_as_a_crash():
    class Unanswered:
        def alive(self):
            raise StackError("bed1: `test -e /sys/kernel/config/nvmet/ports/1` exited 255: Connection refused")

    assert Runner._target_alive(SimpleNamespace(_target=Unanswered())) is False


def test_a_host_allowed_a_slow_login_gets_as_long_for_a_short_command(monkeypatch, tmp_path):
    from nvmflab.topology import ssh
    from nvmflab.topology.inventory import HostEntry

    asked = []
    monkeypatch.setattr(ssh.subprocess, "run", lambda argv, **kw: asked.append(kw["timeout"]) or
                        subprocess.CompletedProcess(argv, 0, "", ""))
    for options, want in (([], [10, 30]), (["-o", "ConnectTimeout=60"], [60, 60])):
        host = ssh.SshHost(HostEntry(name="bed1", ssh="127.0.0.1", data_ip="192.168.77.1", ssh_options=options))
        host._control_dir = tmp_path
        monkeypatch.setattr(host, "connect", lambda: None)
        asked.clear()
        host.run(["cat", "/proc/1/stat"], timeout=10)  # SshProcess.cpu_seconds' allowance
        host.run(["true"], timeout=30)
        assert asked == want
