"""The `transport` knob (issue 21 item 3): how each stack applies rdma, how planning refuses it
where a host has no RDMA device or a stack side has no RDMA, and the RDMA devices `env` lists
(read from a fake sysfs tree and fake `rdma`/`ibv_devices` output)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nvmflab.env import rdma_report, topology_tables
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.spec import validate_knobs
from nvmflab.stacks import StackError
from nvmflab.stacks.kernel import KernelStack, connect_argv, target_settings
from nvmflab.stacks.ours import OurStack, render_config
from nvmflab.stacks.spdk import perf_args, target_rpcs
from nvmflab.topology import rdma
from nvmflab.topology.local import LocalHost

NQN = "nqn.2024-01.io.nvmflab:s1"


def setup_with(**over) -> TargetSetup:
    base = dict(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                busy_poll_us=0, subsystems=(Subsystem(nqn=NQN, backend="null", size=1 << 20),))
    return TargetSetup(**(base | over))


def job_with(**knobs) -> PerfJob:
    return PerfJob(role="main", knobs=validate_knobs({"numjobs": 1} | knobs), cpus=(1,), nqn=NQN)


class _Plain:
    name = "plain"

    def describe(self, argv):
        return " ".join(argv)


# -- how each stack applies it ------------------------------------------------------------------

def test_ours_target_port_and_nvmf_perf_take_the_transport():
    assert 'trtype = "rdma"' in render_config(setup_with(transport="rdma"), 4420, 9100)
    assert "trtype" not in render_config(setup_with(), 4420, 9100)  # tcp ports stay as before
    with pytest.raises(StackError, match="TLS is an NVMe/TCP feature"):
        render_config(setup_with(transport="rdma", tls="on", tls_key="k"), 4420, 9100)
    assert " -t rdma " in OurStack().plan_host(job_with(transport="rdma"), "10.0.0.2", 4420, _Plain())[0]
    assert " -t tcp " in OurStack().plan_host(job_with(), "10.0.0.2", 4420, _Plain())[0]


def test_kernel_port_trtype_module_and_connect_take_the_transport():
    lines = "\n".join(KernelStack(root="/fake").plan_target(setup_with(transport="rdma"), _Plain()))
    assert "modprobe nvmet_rdma" in lines and "nvmet_tcp" not in lines
    assert "rdma /fake/sys/kernel/config/nvmet/ports/1/addr_trtype" in lines
    argv = connect_argv(job_with(transport="rdma"), "10.0.0.2", 4420, "nqn.h", "id")
    assert argv[:4] == ["nvme", "connect", "-t", "rdma"]
    # nvmet_tcp's module parameters do not apply to an RDMA port: a value for one is refused
    assert target_settings(setup_with(transport="rdma"))[0] == []
    with pytest.raises(StackError, match="so_priority = 3: nvmet_tcp module parameters"):
        target_settings(setup_with(transport="rdma", so_priority=3))


def test_spdk_transport_and_perf_trid_take_the_transport():
    calls = target_rpcs(setup_with(transport="rdma"), 4420)
    create = next(c for c in calls if c[0] == "nvmf_create_transport")
    listener = next(c for c in calls if c[0] == "nvmf_subsystem_add_listener")
    assert create[1:3] == ["-t", "rdma"] and listener[listener.index("-t") + 1] == "rdma"
    assert "trtype:RDMA " in perf_args(job_with(transport="rdma"), "10.0.0.2", 4420, 1, 0)[1]
    assert "trtype:TCP " in perf_args(job_with(), "10.0.0.2", 4420, 1, 0)[1]


def test_the_point_identity_of_tcp_points_is_unchanged():
    """Points stored before the knob existed keep their keys: `transport = tcp` is left out."""
    def point(setup):
        return Point(study="s", leg="l", knobs={}, repeat=0, jobs=[], runtime=1, ramp_time=0, target=setup)

    assert "transport" not in point(setup_with()).definition()["target"]
    assert point(setup_with(transport="rdma")).definition()["target"]["transport"] == "rdma"


# -- RDMA devices: a fake sysfs tree and fake tools -----------------------------------------------

def fake_sysfs(root: Path) -> None:
    """rxe0 (Soft-RoCE, a virtual device over eth0) and mlx5_0 (a PCI NIC, port down)."""
    def put(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    rxe = root / "sys/devices/virtual/infiniband/rxe0"
    put(rxe / "node_type", "1: CA")
    put(rxe / "ports/1/link_layer", "Ethernet")
    put(rxe / "ports/1/state", "4: ACTIVE")
    pci = root / "sys/devices/pci0000:00/0000:00:03.0"
    nic = pci / "infiniband/mlx5_0"
    put(nic / "node_type", "1: CA")
    put(nic / "ports/1/link_layer", "InfiniBand")
    put(nic / "ports/1/state", "1: DOWN")
    (root / "sys/bus/pci/drivers/mlx5_core").mkdir(parents=True)
    (pci / "driver").symlink_to(root / "sys/bus/pci/drivers/mlx5_core")
    (nic / "device").symlink_to(pci)
    (root / "sys/class/infiniband").mkdir(parents=True)
    (root / "sys/class/infiniband/rxe0").symlink_to(rxe)
    (root / "sys/class/infiniband/mlx5_0").symlink_to(nic)


def fake_tool(folder: Path, name: str, output: str, rc: int = 0) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


RDMA_LINK = ("link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0\n"
             "link mlx5_0/1 state DOWN physical_state DISABLED\n"
             "link ../../etc/1 state ACTIVE netdev x\n"  # hostile lines are skipped
             "garbage " + "x" * 5000)
IBV = "    device          \t   node GUID\n    ------          \t----------------\n    rxe0            \t505400fffe123456\n"


@pytest.fixture
def tools(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def test_devices_from_sysfs_rdma_link_and_ibv_devices(tmp_path, tools):
    fake_sysfs(tmp_path / "root")
    fake_tool(tools, "rdma", RDMA_LINK)
    fake_tool(tools, "ibv_devices", IBV)
    devices, notes = rdma.probe(LocalHost(), str(tmp_path / "root"))
    assert notes == []
    by_name = {d.name: d for d in devices}
    assert set(by_name) == {"mlx5_0", "rxe0"}
    rxe, nic = by_name["rxe0"], by_name["mlx5_0"]
    assert rxe.kind == "software (rxe)" and nic.kind == "NIC (driver mlx5_core)"
    assert (rxe.ports[0].link_layer, rxe.ports[0].state, rxe.ports[0].netdev) == ("Ethernet", "ACTIVE", "eth0")
    assert (nic.ports[0].link_layer, nic.ports[0].state) == ("InfiniBand", "DOWN")
    assert rxe.verbs is True and nic.verbs is False
    assert [d.name for d in rdma.usable(devices)] == ["rxe0"]
    assert "rxe0: software (rxe) (port 1 Ethernet ACTIVE over eth0)" in rdma.summary(devices)


def test_no_device_and_no_tools_say_so(tmp_path, tools):
    fake_tool(tools, "ibv_devices", "No IB devices found", rc=1)
    devices, notes = rdma.probe(LocalHost(), str(tmp_path / "empty"))
    assert devices == [] and rdma.summary(devices) == "none"
    assert notes == [] or all("rdma link" in n for n in notes)  # iproute2's rdma may be missing here


def test_siw_is_software_iwarp():
    devices = rdma.merge("siw0|1|Ethernet|4: ACTIVE|/sys/devices/virtual/infiniband/siw0||4: RNIC\n"
                         "bad|line\n" + "a|b|c|d|e|f|g\n", None, None)
    assert [(d.name, d.kind, d.verbs) for d in devices] == [("siw0", "software (siw)", None)]


def test_env_lists_devices_and_which_stacks_can_use_them(tmp_path, tools, monkeypatch):
    fake_sysfs(tmp_path / "root")
    fake_tool(tools, "rdma", RDMA_LINK)
    fake_tool(tools, "ibv_devices", IBV)
    ours = tmp_path / "ours"
    ours.mkdir()
    fake_tool(ours, "nvmf-target", "needs librdmacm.so.1")  # the bytes a linked binary holds
    fake_tool(ours, "nvmf-perf", "plain")
    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(ours))
    spdk = tmp_path / "spdk"  # an SPDK build whose target has no RDMA and whose perf has it
    (spdk / "build" / "bin").mkdir(parents=True)
    (spdk / "scripts").mkdir()
    (spdk / "scripts" / "rpc.py").write_text("")
    fake_tool(spdk / "build" / "bin", "nvmf_tgt", "plain")
    fake_tool(spdk / "build" / "bin", "spdk_nvme_perf", "needs librdmacm.so.1")
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(spdk))
    # hugepages enough for SPDK over RDMA, whatever this machine has (test_spdk_refusals.py)
    monkeypatch.setattr("nvmflab.stacks.spdk.free_hugepages_mb", lambda host: 4096)
    report = rdma_report(LocalHost(), str(tmp_path / "root"))
    assert [d["name"] for d in report["devices"]] == ["mlx5_0", "rxe0"]
    assert report["stacks"]["ours"]["target"] is None
    assert "built without RDMA" in report["stacks"]["ours"]["host"]
    assert "this SPDK build has no RDMA" in report["stacks"]["spdk"]["target"]
    assert report["stacks"]["spdk"]["host"] is None
    fake_tool(tools, "rdma", "")
    fake_tool(tools, "ibv_devices", "No IB devices found", rc=1)
    empty = rdma_report(LocalHost(), str(tmp_path / "nothing"))
    assert empty["summary"] == "none" and empty["devices"] == []
    assert all(why == "no RDMA device with a port up" for sides in empty["stacks"].values() for why in sides.values())
    base = {"host": "h", "data_ip": "1.2.3.4", "cpu_model": "c", "cores": 2, "cores_usable": [0, 1],
            "kernel": "k", "nic": None, "nic_driver": None, "stacks": {}, "tools": {}, "rdma": report}
    from rich.console import Console

    console = Console(width=200, record=True)
    for table in topology_tables([base]):
        console.print(table)
    text = console.export_text()
    assert "rxe0: software (rxe)" in text and "rdma ours target" in text and "usable" in text


# -- planning refuses what cannot run ----------------------------------------------------------

class _Hosts:
    def __init__(self, host):
        self.target = host

    def initiator(self, _name):
        return self.target


class _Runner:
    def __init__(self, host):
        self.hosts = _Hosts(host)


class _Stack:
    def __init__(self, why=None, name="fake"):
        self.why, self.asked, self.name = why, 0, name

    def rdma_unavailable(self, host, side):
        self.asked += 1
        return self.why

    def knob_map(self, side):
        return {}  # sets nothing, limits nothing (knobs.transport_refusal asks for it)


def rdma_point(**knobs):
    k = validate_knobs({"transport": "rdma"} | knobs)
    return Point(study="s", leg="l", knobs=k, repeat=0, jobs=[PerfJob("main", k, (1,), nqn=NQN)], runtime=1,
                 ramp_time=0, target=setup_with(transport="rdma"))


def test_transport_check_refuses_with_the_reason(monkeypatch):
    monkeypatch.setattr(rdma, "probe", lambda host, root="": ([rdma.Device("mlx5_0", [rdma.Port(1, "Ethernet", "DOWN")])],
                                                               []))
    check = rdma.TransportCheck(_Runner(LocalHost(name="lab-0")))
    tcp = Point(study="s", leg="l", knobs=validate_knobs({}), repeat=0, jobs=[], runtime=1, ramp_time=0)
    assert check.refusal(tcp, _Stack("never asked"), _Stack("never asked")) is None
    assert check.refusal(rdma_point(), _Stack(), _Stack()) == (
        "lab-0 has no RDMA device: only mlx5_0: NIC (port 1 Ethernet DOWN), no port up; see docs/rdma.md for Soft-RoCE")
    assert "TLS is an NVMe/TCP feature" in check.refusal(rdma_point(tls="on"), _Stack(), _Stack())
    assert check.refusal(rdma_point(hdr_digest=True), _Stack(), _Stack()) == (
        'hdr_digest = true with transport = "rdma": it holds over tcp only (digests are NVMe/TCP PDU fields)')


def test_transport_check_asks_each_stack_side_once(monkeypatch):
    monkeypatch.setattr(rdma, "probe", lambda host, root="": ([rdma.Device("rxe0", [rdma.Port(1, "Ethernet", "ACTIVE")])],
                                                               []))
    check = rdma.TransportCheck(_Runner(LocalHost()))
    target, host = _Stack(), _Stack("no RDMA queue pair in nvmf-perf")
    assert check.refusal(rdma_point(), target, host) == "no RDMA queue pair in nvmf-perf"
    assert check.refusal(rdma_point(), target, host) == "no RDMA queue pair in nvmf-perf"
    assert (target.asked, host.asked) == (1, 1)
    assert check.refusal(rdma_point(), _Stack(name="a"), _Stack(name="b")) is None


def test_a_sweep_asking_for_rdma_here_says_why_and_runs_nothing(tmp_path, fake_env):
    from conftest import nvmflab

    if rdma.usable(rdma.probe(LocalHost())[0]):
        pytest.skip("this machine has an RDMA device")
    spec = tmp_path / "rd.toml"
    spec.write_text('name = "rd"\nruntime = 0.2\nramp_time = 0\n[topology]\nkind = "local"\ntarget_cores = [0]\n'
                    'host_cores = [1]\n[backend]\nkind = "null"\nsize = "64MiB"\n[knobs]\ntransport = "rdma"\n')
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=fake_env)
    assert done.returncode == 2, done.stderr
    assert "local has no RDMA device" in done.stdout + done.stderr
    assert not (tmp_path / "perf.log").exists()  # no load generator ran
