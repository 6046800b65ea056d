"""The kernel stack through the harness, on Debian's kernel booted under qemu as an SSH host.

One guest boot (initramfs.build(ssh=True), guest/init-sshd) serves every test: a small server
with sshd for root, nvme-cli, fio, kmod and the nvmet/null_blk modules. The harness reaches it
as an inventory host (topology/ssh.py) and drives it with the kernel stack, both ways:
1. the guest as target host: nvmet through configfs, our nvmf-perf as host in the namespace;
2. the guest as initiator host: nvme connect + fio against our nvmf-target, and against SPDK's
   nvmf_tgt when the SPDK build is present, in the namespace.

The test process joins the bed's network namespace while the harness runs (setns on its main
thread), as a controlling machine on the data network would be: ssh and our target's /stats
endpoint are reached from there, and traffic never leaves the namespace. Checks are functional
only (the point is stored "ok", IOPS > 0, nothing left behind); no timing is reported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import initramfs
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.runner import Runner
from nvmflab.spec import Knobs, Topology, Workload
from nvmflab.stacks.kernel import KernelStack
from nvmflab.stacks.ours import OurStack
from nvmflab.stacks.spdk import SpdkStack
from nvmflab.store import ResultsStore
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost
from nvmflab.topology.ssh import open_hosts
from vm import GUEST_IP, HOST_IP, BedError, TestBed

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("NVMFLAB_BIN_DIR", REPO / "target/release"))
CLONE_NEWNET = 0x40000000
NVMET = "/sys/kernel/config/nvmet"
# Made by hand, so not under nvmflab's NQN prefix (whose entries a run removes as a killed run's
# leftovers: stacks/kernel_leftovers.py); the stack must not touch it.
KEEP_NQN = "nqn.2014-08.org.example:someone-elses"
KEEP_PORT = "1"
TARGET_NQN = "nqn.2024-01.io.nvmflab:ssh-kernel-target"
POINT_RUNTIME_S = 2.0
STEP_LIMIT_S = 150  # one test, boot or teardown; the suite stays bounded whatever hangs


@contextlib.contextmanager
def deadline(seconds: float, what: str):
    """Raises TimeoutError in the main thread when `what` takes longer than `seconds`."""
    def expired(signum, frame):
        raise TimeoutError(f"{what} took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def joined(netns: str):
    """The calling thread (and what it starts) in network namespace `netns`, then back."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {netns}")
        finally:
            os.close(there)
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the root namespace")
    finally:
        os.close(home)


@dataclass
class Guest:
    bed: TestBed
    key: Path
    inventory: Path
    work: Path

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"root@{GUEST_IP}"]

    def ssh(self, command: str, timeout: float = 60) -> str:
        """Runs `command` on the guest with plain ssh; its stdout, or a failed test."""
        done = self.bed.run_in_ns(self.ssh_argv() + [command], timeout=timeout)
        assert done.returncode == 0, f"ssh guest {command!r} exited {done.returncode}: {done.stderr}"
        return done.stdout


def _inventory(key: Path) -> str:
    options = ["-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]
    quoted = ", ".join(f'"{o}"' for o in options)
    return (f'[hosts.guest]\nssh = "root@{GUEST_IP}"\ndata_ip = "{GUEST_IP}"\ncores = [0, 1]\n'
            f"ssh_options = [{quoted}]\n")


@pytest.fixture(scope="module")
def guest(tmp_path_factory) -> Guest:
    try:
        boot = initramfs.build(REPO / ".cache/interop", ssh=True)
    except initramfs.BuildError as e:
        pytest.fail(f"cannot build the SSH guest: {e}")
    log_dir = Path(os.environ.get("NVMFLAB_INTEROP_LOGS") or tmp_path_factory.mktemp("interop-ssh")) / "ssh-guest"
    log_dir.mkdir(parents=True, exist_ok=True)
    key = log_dir / "id_ed25519"
    key.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmflab-interop", "-f", str(key)],
                   check=True, timeout=30)
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    inventory = log_dir / "inventory.toml"
    inventory.write_text(_inventory(key))
    bed = TestBed(boot, log_dir)
    try:
        with deadline(STEP_LIMIT_S, "booting the SSH guest"):
            bed.create_netns()
            bed.boot_guest({"authkey": f"{kind}:{blob}"})
            bed.expect("@@SSHD-READY", timeout=120)
        with joined(bed.netns):
            yield Guest(bed, key, inventory, log_dir / "work")
    except (BedError, TimeoutError) as e:
        pytest.fail(f"SSH guest failed (logs in {log_dir}): {e}")
    finally:
        with contextlib.suppress(BedError, OSError, ValueError), deadline(40, "powering the guest off"):
            bed.tell_guest("poweroff")
            bed.wait_guest_exit(30)
        bed.close()


def test_guest_answers_plain_ssh(guest: Guest):
    with deadline(STEP_LIMIT_S, "ssh uname"):
        assert guest.ssh("uname -r").strip() == guest.bed.boot.kernel_version


# ---- through the harness ----

# What the kernel stack may change on a target host, as text: configfs, loaded modules, nvmet_tcp's
# parameters, /dev/shm, and the values of every port's address and subsystem's host policy.
STATE = r"""find /sys/kernel/config | sort
cut -d' ' -f1 /proc/modules | sort
grep -H . /sys/module/nvmet_tcp/parameters/* 2>/dev/null
ls -a /dev/shm
grep -H . /sys/kernel/config/nvmet/ports/*/addr_* /sys/kernel/config/nvmet/subsystems/*/attr_allow_any_host
"""
# Someone else's nvmet configuration: a subsystem on a port of its own, serving.
HAND_MADE = f"""set -e
modprobe -a nvmet nvmet_tcp
cd {NVMET}
mkdir subsystems/{KEEP_NQN}
echo 1 > subsystems/{KEEP_NQN}/attr_allow_any_host
mkdir ports/{KEEP_PORT}
echo tcp > ports/{KEEP_PORT}/addr_trtype
echo ipv4 > ports/{KEEP_PORT}/addr_adrfam
echo {GUEST_IP} > ports/{KEEP_PORT}/addr_traddr
echo 4420 > ports/{KEEP_PORT}/addr_trsvcid
ln -s {NVMET}/subsystems/{KEEP_NQN} ports/{KEEP_PORT}/subsystems/{KEEP_NQN}
"""
REMOVE_HAND_MADE = f"""cd {NVMET}
rm -f ports/{KEEP_PORT}/subsystems/{KEEP_NQN}
rmdir ports/{KEEP_PORT} subsystems/{KEEP_NQN}
modprobe -r nvmet_tcp nvmet
true
"""


@contextlib.contextmanager
def _guest_host(guest: Guest):
    """The guest as the harness sees it: the SshHost its inventory names; closed afterwards."""
    topology = Topology(kind="ssh", inventory=guest.inventory.name, target="guest", initiators=["guest"])
    hosts = open_hosts(topology, guest.inventory.parent)
    try:
        yield hosts.target
    finally:
        hosts.close()


def _netns_host(guest: Guest):
    return LocalHost(name="bed-netns", data_ip=HOST_IP, netns=guest.bed.netns, workdir=guest.work)


def _point(leg: str, setup, host: str | None):
    knobs = Workload().model_dump() | Knobs().model_dump() | {"rw": "randrw", "iodepth": 4, "size": 16 << 20}
    job = PerfJob(role="main", knobs=knobs, cpus=(1,), nqn=TARGET_NQN, host=host)
    return Point(study="interop-ssh", leg=leg, knobs=Knobs().model_dump(), repeat=0, jobs=[job],
                 runtime=POINT_RUNTIME_S, ramp_time=0, target=setup)


def _setup(listen_ip: str, backend: str, mode: str = "event", netns: str | None = None):
    return TargetSetup(cores=(0,), mode=mode, idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                       busy_poll_us=0, subsystems=(Subsystem(TARGET_NQN, backend, 64 << 20),), netns=netns,
                       listen_ip=listen_ip)


def _run_point(results: Path, target_stack, host_stack, hosts, point) -> dict:
    """One point through the Runner; its single measurement row as a dict (status, error, iops...)."""
    store = ResultsStore(results)
    try:
        runner = Runner(store, store.start_run("interop-ssh", "", {}), target_stack, host_stack, hosts)
        try:
            runner.run_point(point)
        finally:
            runner.close()  # stops the target and every load generator
        rows = store.measurements().to_dict("records")
    finally:
        store.close()
    assert len(rows) == 1, rows
    return rows[0]


# ram: a file in /dev/shm; null: a null_blk device made in configfs. `make test` keeps null here and
# reaches the ram path through the bed's TLS point (tests/bed/specs/quick-tls.toml); ram's
# leaves-nothing check runs in `make interop-all` (about 30-40 s under TCG).
@pytest.mark.parametrize("backend", [pytest.param("ram", marks=pytest.mark.long), "null"])
def test_kernel_target_on_the_ssh_guest_serves_our_host_and_leaves_nothing(guest: Guest, tmp_path: Path, backend: str):
    with deadline(STEP_LIMIT_S, "the kernel target point"):
        guest.ssh(HAND_MADE)
        try:
            before = guest.ssh(STATE)
            assert KEEP_NQN in before and f"ports/{KEEP_PORT}/addr_trsvcid:4420" in before, before
            with _guest_host(guest) as host:
                stack = KernelStack()
                assert stack.unavailable(host, "target") is None
                row = _run_point(tmp_path / "results", stack, OurStack(), Hosts(host, [_netns_host(guest)]),
                                 _point(f"kernel-target-{backend}", _setup(GUEST_IP, backend), None))
            assert row["status"] == "ok", row["error"]
            assert row["iops"] > 0 and row["read_iops"] > 0 and row["write_iops"] > 0, row
            assert guest.bed.boot.kernel_version in (row["target_stack_version"] or ""), row
            after = guest.ssh(STATE)
            assert after == before, "the kernel stack left something behind or changed what it did not create"
            # The hand-made subsystem still serves on its port.
            discover = guest.bed.run_in_ns([str(BIN_DIR / "nvmf-perf"), "discover", "-t", "tcp", "-a", GUEST_IP,
                                            "-s", "4420", "--output-format", "json"], timeout=60)
            assert discover.returncode == 0 and KEEP_NQN in discover.stdout, discover.stderr
        finally:
            guest.ssh(REMOVE_HAND_MADE)


def _initiator_point(guest: Guest, tmp_path: Path, target_stack, mode: str):
    setup = _setup(HOST_IP, "ram", mode=mode, netns=guest.bed.netns)
    with _guest_host(guest) as host:
        stack = KernelStack()
        assert stack.unavailable(host, "host") is None
        row = _run_point(tmp_path / "results", target_stack, stack, Hosts(_netns_host(guest), [host]),
                         _point(f"kernel-host-{target_stack.name}", setup, "guest"))
    assert row["status"] == "ok", row["error"]
    assert row["iops"] > 0 and row["read_iops"] > 0 and row["write_iops"] > 0, row
    assert guest.bed.boot.kernel_version in (row["host_stack_version"] or ""), row
    # Disconnected: no controller in sysfs, no subsystem in nvme-cli's view.
    assert guest.ssh("ls /sys/class/nvme/").strip() == ""
    subsystems = guest.ssh("nvme list-subsys -o json")
    assert TARGET_NQN not in subsystems, subsystems


def test_kernel_host_on_the_ssh_guest_against_our_target(guest: Guest, tmp_path: Path):
    with deadline(STEP_LIMIT_S, "the kernel host point against our target"):
        _initiator_point(guest, tmp_path, OurStack(), "event")


def test_kernel_host_on_the_ssh_guest_against_spdk(guest: Guest, tmp_path: Path):
    stack = SpdkStack()
    missing = stack.unavailable(_netns_host(guest), "target")
    if missing:
        pytest.skip(f"SPDK's nvmf_tgt is not built here: {missing}")
    with deadline(STEP_LIMIT_S, "the kernel host point against SPDK"):
        _initiator_point(guest, tmp_path, stack, "poll")


# ---- whole studies with the kernel stack on both sides, in the guest ----

# legs the kernel stack cannot run here, and the words their reason must contain
KERNEL_SKIPS = {"busy-poll": {"on": "busy_poll_us", "busy_only": "busy_poll_us"}, "dimensions": {}, "parallelism": {}}


# make test runs busy-poll (skipped legs and measured ones); the other two (about 50 s each on the
# loaded CI machine) are `long`, run by `make interop-all`.
@pytest.mark.parametrize("study", [s if s == "busy-poll" else pytest.param(s, marks=pytest.mark.long) for s in KERNEL_SKIPS])
def test_newer_study_with_kernel_target_and_host_on_the_guest(guest: Guest, tmp_path: Path, study: str):
    """A study's tiny variant through `nvmflab run` with nvmet and nvme-cli + fio both on the guest:
    every leg measured or skipped with the kernel stack's reason, and nothing left behind."""
    import sys

    sys.path.insert(0, str(REPO / "python" / "tests"))
    from tiny_specs import LEGS, SPECS

    topology = (f'[topology]\nkind = "ssh"\ninventory = "{guest.inventory}"\ntarget = "guest"\n'
                'initiators = ["guest"]\ntarget_cores = [0]\nhost_cores = [1]\n')
    text = (SPECS[study].replace("\nrepeats", '\nstack = "kernel"\nrepeats', 1).replace("runtime = 0.3", "runtime = 1")
            .replace("[topology]\ntarget_cores = [0]\nhost_cores = [1]\n", topology))
    assert 'kind = "ssh"' in text
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(BIN_DIR), NVMFLAB_NOISE_LIMIT_PCT="off")
    # configfs, shared memory files and controllers (modules nvme connect loads may stay loaded)
    state = "find /sys/kernel/config | sort; ls -a /dev/shm; ls /sys/class/nvme/ 2>/dev/null; true"
    before = guest.ssh(state)
    with deadline(STEP_LIMIT_S, f"the {study} study with the kernel stack"):
        done = subprocess.run([str(REPO / ".venv/bin/nvmflab"), "run", str(spec), "--results", str(tmp_path / "r")],
                              env=env, capture_output=True, text=True, timeout=STEP_LIMIT_S - 5, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["leg"]) == LEGS[study]
    assert set(frame["target_stack"]) == {"kernel"} and set(frame["host_stack"]) == {"kernel"}
    for leg, rows in frame.groupby("leg"):
        if leg in KERNEL_SKIPS[study]:
            assert (rows["status"] == "skipped").all() and rows["error"].str.contains(KERNEL_SKIPS[study][leg]).all()
        else:
            assert (rows["status"] == "ok").all() and (rows["iops"] > 0).all(), rows[["leg", "status", "error"]]
    assert guest.ssh(state) == before, "the study left something behind on the guest"
