"""The kernel stack without kernel support: a temporary directory stands in for configfs, sysfs,
/proc and /dev; a host wrapper plays the parts of the kernel that a plain directory cannot
(configfs default groups and rmdir, modprobe, nvme connect/disconnect)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvmflab import metrics
from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.spec import Knobs
from nvmflab.stacks import get_stack
from nvmflab.stacks.base import StackError
from nvmflab.stacks import kernel
from nvmflab.stacks.fio import fio_argv, fio_intervals, parse_fio
from nvmflab.stacks.kernel import KernelStack, connect_argv, find_controllers
from nvmflab.topology.base import checked
from nvmflab.topology.local import LocalHost

DATA = Path(__file__).parent / "data"
NQN = "nqn.2024-01.io.nvmflab:kernel-test"


class FakeKernel(LocalHost):
    """LocalHost whose kernel is a directory: configfs items get their default groups and
    attributes on mkdir and lose them on rmdir; modules, nvme connect and nvme disconnect act on
    the fake sysfs. Every command is recorded."""

    def __init__(self, root: Path):
        super().__init__(workdir=root / "work")
        self.root, self.commands, self.next_nullb = root, [], 0
        self.connect_fails = False

    def _done(self, argv, rc=0, out="", check=False):
        done = subprocess.CompletedProcess(argv, rc, out, "" if rc == 0 else "fake failure")
        return checked(done, self.name, argv) if check else done

    def run(self, argv, timeout=60.0, check=True, input=None):
        self.commands.append(list(argv))
        cfg = self.root / "sys/kernel/config"
        if argv[:3] == ["sh", "-c", kernel.leftovers.SCAN_KEYS]:  # this machine's own keyring stays out of it
            return self._done(argv)
        if argv[:2] == ["sh", "-c"] and "modprobe -r" in argv[2]:  # unload only when loaded
            argv = ["modprobe", "-r", argv[5]] if (self.root / "sys/module" / argv[5]).exists() else ["true"]
            self.commands.append(argv)
        if argv[0] == "modprobe":
            module = argv[2] if argv[1] == "-r" else argv[1]
            params = {"idle_poll_period_usecs": "0", "so_priority": "0"} if module == "nvmet_tcp" else {}
            _attrs(self.root / "sys/module" / module / "parameters", params, [])
            if argv[1] == "-r":
                _rmtree(self.root / "sys/module" / module)
            return self._done(argv)
        if argv[0] == "modinfo":
            return self._done(argv, 1)
        if argv[:2] == ["nvme", "connect"]:
            return self._connect(argv)
        if argv[:3] == ["nvme", "disconnect", "-d"]:
            _rmtree(self.root / "sys/class/nvme" / argv[3])
            return self._done(argv)
        if argv[0] == "mkdir" and Path(argv[1]).is_relative_to(cfg):
            path = Path(argv[1])
            done = super().run(argv, timeout, check, input)
            self._populate(path)
            return done
        if argv[0] == "rmdir" and Path(argv[1]).is_relative_to(cfg):
            path = Path(argv[1])
            try:
                for child in path.iterdir():  # attributes vanish; default groups must be empty
                    child.unlink() if child.is_file() and not child.is_symlink() else child.rmdir()
                path.rmdir()
            except OSError:
                return self._done(argv, 1, check=check)
            return self._done(argv)
        return super().run(argv, timeout, check, input)

    def _populate(self, path: Path) -> None:
        parent = path.parent.name
        if parent == "subsystems" and path.parent.parent.name == "nvmet":
            _attrs(path, {"attr_allow_any_host": "0"}, ["namespaces", "allowed_hosts"])
        elif parent == "namespaces":
            _attrs(path, {"device_path": "", "enable": "0"}, [])
        elif parent == "ports":
            _attrs(path, {"addr_trtype": "", "addr_adrfam": "", "addr_traddr": "", "addr_trsvcid": "",
                          "param_inline_data_size": "-1"}, ["subsystems", "referrals"])
        elif parent == "nullb":
            _attrs(path, {"size": "100", "blocksize": "512", "power": "0", "index": str(self.next_nullb)}, [])
            self.next_nullb += 1

    def _connect(self, argv):
        if self.connect_fails:
            return self._done(argv, 1, check=True)
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        n = 3 + sum(1 for _ in (self.root / "sys/class/nvme").glob("nvme[3-9]"))
        ctrl = self.root / f"sys/class/nvme/nvme{n}"
        _attrs(ctrl, {"subsysnqn": argv[argv.index("-n") + 1], "hostnqn": opts["--hostnqn"], "state": "live"},
               [f"nvme{n}n1", "power"])
        (self.root / f"dev/nvme{n}n1").write_text("")
        return self._done(argv)


def _attrs(path: Path, files: dict[str, str], dirs: list[str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (path / name).write_text(value)
    for name in dirs:
        (path / name).mkdir()


def _rmtree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
    if path.exists():
        path.rmdir()


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root with its content (files) or target (links)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.startswith("work"):
            continue
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else (p.read_text() if p.is_file() else "/")
    return out


@pytest.fixture
def fake(tmp_path):
    root = tmp_path / "root"
    for module, params in (("nvmet", {}), ("nvmet_tcp", {"idle_poll_period_usecs": "0", "so_priority": "0"}),
                           ("nvme_tcp", {"so_priority": "0"})):
        _attrs(root / "sys/module" / module / "parameters", params, [])
    _attrs(root / "sys/kernel/config/nvmet", {}, ["subsystems", "ports", "hosts"])
    _attrs(root / "sys/kernel/config/nullb", {}, [])
    _attrs(root / "proc/sys/net/core", {"busy_read": "0"}, [])
    _attrs(root / "proc/sys/kernel", {"io_uring_disabled": "0"}, [])
    _attrs(root / "sys/class/nvme", {}, [])
    _attrs(root / "dev/shm", {}, [])
    return FakeKernel(root), KernelStack(root=str(root), sudo=[])


def setup_for(*subs: Subsystem, idle=0, prio=0, icd=8192) -> TargetSetup:
    return TargetSetup(cores=(0,), mode="event", idle_poll_us=idle, in_capsule_data_size=icd, so_priority=prio,
                       tos=0, busy_poll_us=0, subsystems=subs, listen_ip="127.0.0.1")


def knobs(**over) -> dict:
    base = {"rw": "randread", "bs": 4096, "iodepth": 8, "numjobs": 2, "rwmixread": 50, "rate_iops": 0,
            "size": None} | Knobs().model_dump()
    return base | over


def job(**over) -> PerfJob:
    return PerfJob("main", knobs(**over), cpus=(2, 5), nqn=NQN)


def other_stack_objects(root: Path) -> None:
    """Someone else's subsystem, linked on port 1, with its own null_blk device."""
    nvmet = root / "sys/kernel/config/nvmet"
    _attrs(nvmet / "subsystems/nqn.other", {"attr_allow_any_host": "1"}, ["namespaces", "allowed_hosts"])
    _attrs(nvmet / "ports/1", {"addr_trsvcid": "4420"}, ["subsystems", "referrals"])
    (nvmet / "ports/1/subsystems/nqn.other").symlink_to(nvmet / "subsystems/nqn.other")
    _attrs(root / "sys/kernel/config/nullb/theirs", {"power": "1", "index": "0"}, [])


# -- target: configfs ---------------------------------------------------------------------------

def test_target_writes_configfs_and_teardown_removes_only_its_own(fake, tmp_path):
    host, stack = fake
    root = host.root
    other_stack_objects(root)
    host.next_nullb = 1
    before = snapshot(root)
    target = stack.start_target(setup_for(Subsystem(NQN, "null", 64 << 20, block_size=4096),
                                          Subsystem(NQN + "-ram", "ram", 1 << 20), idle=50, prio=3, icd=16384),
                                host, tmp_path)
    nvmet = root / "sys/kernel/config/nvmet"
    sub, port = nvmet / "subsystems" / NQN, nvmet / "ports/2"  # port 1 is taken
    assert (sub / "attr_allow_any_host").read_text() == "1"
    assert (sub / "namespaces/1/device_path").read_text() == f"{root}/dev/nullb1"
    assert (sub / "namespaces/1/enable").read_text() == "1"
    nullb = root / f"sys/kernel/config/nullb/nvmflab-{target.port}-0"
    assert [(nullb / a).read_text() for a in ("size", "blocksize", "power")] == ["64", "4096", "1"]
    ram = root / f"dev/shm/nvmflab-{target.port}-1.img"
    assert (nvmet / f"subsystems/{NQN}-ram/namespaces/1/device_path").read_text() == str(ram)
    assert ram.stat().st_size == 1 << 20
    assert {a: (port / a).read_text() for a in ("addr_trtype", "addr_adrfam", "addr_traddr", "addr_trsvcid",
                                                "param_inline_data_size")} == {
        "addr_trtype": "tcp", "addr_adrfam": "ipv4", "addr_traddr": "127.0.0.1",
        "addr_trsvcid": str(target.port), "param_inline_data_size": "16384"}
    assert os.readlink(port / "subsystems" / NQN) == str(sub)
    params = root / "sys/module/nvmet_tcp/parameters"
    assert (params / "idle_poll_period_usecs").read_text() == "50" and (params / "so_priority").read_text() == "3"
    assert ["modprobe", "null_blk", "nr_devices=0"] in host.commands  # null_blk was not loaded
    assert not any(c[:2] == ["modprobe", "nvmet"] for c in host.commands)  # nvmet was
    assert target.alive() and target.stats() is None and target.cpu_seconds() is None

    target.stop()
    assert not target.alive() and target.teardown_errors == []
    assert snapshot(root) == before  # ours gone, theirs untouched, parameters restored, null_blk unloaded
    assert ["modprobe", "-r", "null_blk"] in host.commands


def test_target_refuses_an_existing_subsystem_and_rolls_back(fake, tmp_path):
    host, stack = fake
    other_stack_objects(host.root)
    before = snapshot(host.root)
    with pytest.raises(StackError, match="subsystem nqn.other exists already"):
        stack.start_target(setup_for(Subsystem(NQN, "ram", 1 << 20), Subsystem("nqn.other", "null", 1 << 20),
                                     idle=10), host, tmp_path)
    assert ["mkdir", f"{host.root}/sys/kernel/config/nvmet/subsystems/{NQN}"] in host.commands  # got that far
    assert snapshot(host.root) == before


def test_target_refuses_a_name_that_is_not_one_path_component(fake, tmp_path):
    host, stack = fake
    before = snapshot(host.root)
    with pytest.raises(StackError, match="cannot name a configfs directory"):
        stack.start_target(setup_for(Subsystem("../ports", "ram", 1 << 20)), host, tmp_path)
    assert snapshot(host.root) == before


def test_target_loads_missing_modules_and_unloads_only_those(fake, tmp_path):
    host, stack = fake
    _rmtree(host.root / "sys/module/nvmet_tcp")
    before = snapshot(host.root)
    target = stack.start_target(setup_for(Subsystem(NQN, "ram", 1 << 20), prio=2), host, tmp_path)
    assert ["modprobe", "nvmet_tcp"] in host.commands and ["modprobe", "nvmet"] not in host.commands
    target.stop()
    assert target.teardown_errors == [] and ["modprobe", "-r", "nvmet_tcp"] in host.commands
    assert snapshot(host.root) == before and (host.root / "sys/module/nvmet").exists()


def test_target_plan_lists_the_commands(fake):
    host, stack = fake
    lines = stack.plan_target(setup_for(Subsystem(NQN, "null", 1 << 20), idle=20), host)
    text = "\n".join(lines)
    assert "modprobe nvmet_tcp" in text and "nvmet_tcp/parameters/idle_poll_period_usecs" in text
    assert f"ln -s {host.root}/sys/kernel/config/nvmet/subsystems/{NQN}" in text
    assert all(line.startswith("[local] ") or line.startswith("(") for line in lines)


# -- host: nvme connect, the block device, fio ---------------------------------------------------------

@pytest.mark.parametrize("over, present, absent", [
    ({}, ["--nr-io-queues=2"], ["--nr-poll-queues=2", "--hdr-digest", "--data-digest", "--tos=0",
                                 "--disable-sqflow"]),
    ({"completion": "poll"}, ["--nr-io-queues=2", "--nr-poll-queues=2"], []),
    ({"io_queues": 4}, ["--nr-io-queues=4"], []),
    ({"hdr_digest": True, "data_digest": True}, ["--hdr-digest", "--data-digest"], []),
    ({"tos": 32}, ["--tos=32"], []),
    ({"sqflow": "off"}, ["--disable-sqflow"], []),
])
def test_connect_argv_per_knob(over, present, absent):
    argv = connect_argv(job(**over), "10.0.0.2", 4420, "nqn.h", "u")
    assert argv[:11] == ["nvme", "connect", "-t", "tcp", "-a", "10.0.0.2", "-s", "4420", "-n", NQN,
                         "--hostnqn=nqn.h"]
    assert all(a in argv for a in present) and not any(a in argv for a in absent)


def test_block_device_found_by_nqn_and_host_nqn():
    scan = "\n".join([
        f"nvme0\t{NQN}\tnqn.someone-else\tlive\tnvme0n1 ",  # same subsystem, another host NQN
        f"nvme1\t{NQN}\tnqn.me\tconnecting\tnvme1n1 ",
        f"nvme2\t{NQN}\tnqn.me\tlive\tnvme4c2n1 nvme4c2n3 ",  # multipath: path devices of head nvme4
        "nvme9\tgarbage",
        "../x\t" + NQN + "\tnqn.me\tlive\tnvme1n1",
    ])
    assert find_controllers(scan, NQN, "nqn.me", live=True) == [("nvme2", ["nvme4n1", "nvme4n3"])]
    assert [c for c, _ in find_controllers(scan, NQN, "nqn.me", live=False)] == ["nvme1", "nvme2"]


def test_open_host_connects_finds_device_and_close_restores(fake, tmp_path, monkeypatch):
    host, stack = fake
    root = host.root
    # Another host identity's controller of the same subsystem must be left connected.
    _attrs(root / "sys/class/nvme/nvme0", {"subsysnqn": NQN, "hostnqn": "nqn.theirs", "state": "live"}, ["nvme0n1"])
    target = type("T", (), {"address": "10.0.0.2", "port": 4420})()
    session = stack.open_host(job(completion="poll", so_priority=5, busy_poll_us=50), target, host, tmp_path)
    assert session.filename == f"{root}/dev/nvme3n1"
    connect = next(c for c in host.commands if c[:2] == ["nvme", "connect"])
    assert "--nr-poll-queues=2" in connect and session.hostnqn in " ".join(connect)
    assert (root / "proc/sys/net/core/busy_read").read_text() == "50"
    assert (root / "sys/module/nvme_tcp/parameters/so_priority").read_text() == "5"
    argv = session.perf_argv(1, 0.5, "out.json")
    assert f"--filename={root}/dev/nvme3n1" in argv and "--hipri" in argv and "--ioengine=io_uring" in argv
    session.close()
    assert ["nvme", "disconnect", "-d", "nvme3"] in host.commands
    assert not any(c[:3] == ["nvme", "disconnect", "-n"] or c[-1:] == ["nvme0"] for c in host.commands)
    assert (root / "sys/class/nvme/nvme0").exists() and not (root / "sys/class/nvme/nvme3").exists()
    assert (root / "proc/sys/net/core/busy_read").read_text() == "0"
    assert (root / "sys/module/nvme_tcp/parameters/so_priority").read_text() == "0"
    assert session.close_errors == []


def test_open_host_failure_restores_settings(fake, tmp_path):
    host, stack = fake
    host.connect_fails = True
    target = type("T", (), {"address": "10.0.0.2", "port": 4420})()
    with pytest.raises(StackError, match="`nvme connect .*` exited 1: fake failure"):
        stack.open_host(job(busy_poll_us=50), target, host, tmp_path)
    assert (host.root / "proc/sys/net/core/busy_read").read_text() == "0"
    assert stack._held == {}


def test_device_wait_is_bounded(fake, tmp_path, monkeypatch):
    host, stack = fake
    monkeypatch.setattr(kernel, "DEVICE_WAIT_S", 0.3)
    host._connect = lambda argv: host._done(argv)  # connects, but no namespace ever appears
    target = type("T", (), {"address": "10.0.0.2", "port": 4420})()
    with pytest.raises(StackError, match="no live controller"):
        stack.open_host(job(), target, host, tmp_path)


def test_sessions_on_one_host_share_a_setting_and_must_agree(fake, tmp_path):
    host, stack = fake
    target = type("T", (), {"address": "10.0.0.2", "port": 4420})()
    first = stack.open_host(job(busy_poll_us=50), target, host, tmp_path)
    with pytest.raises(StackError, match="another job holds 50"):
        stack.open_host(job(busy_poll_us=10), target, host, tmp_path)
    second = stack.open_host(job(busy_poll_us=50), target, host, tmp_path)
    first.close()
    assert (host.root / "proc/sys/net/core/busy_read").read_text() == "50"  # second still runs
    second.close()
    assert (host.root / "proc/sys/net/core/busy_read").read_text() == "0"


@pytest.mark.parametrize("over, present, absent", [
    ({}, ["--rw=randread", "--bs=4096", "--iodepth=8", "--numjobs=2"], ["--hipri", "--rwmixread=50"]),
    ({"completion": "poll"}, ["--hipri"], []),
    ({"rw": "randrw", "rwmixread": 70}, ["--rwmixread=70"], []),
    ({"rate_iops": 1000, "size": 1 << 20}, ["--rate_iops=1000", "--size=1048576"], []),
])
def test_fio_argv_per_knob(over, present, absent):
    argv = fio_argv("fio", job(**over), "/dev/nvme3n1", "io_uring", 10, 2.5, "/w/out.json")
    for fixed in ("--filename=/dev/nvme3n1", "--direct=1", "--ioengine=io_uring", "--cpus_allowed=2,5",
                  "--cpus_allowed_policy=split", "--time_based", "--runtime=10000ms", "--ramp_time=2500ms",
                  "--output-format=json+", "--output=/w/out.json", "--percentile_list=50:90:99:99.9:99.99"):
        assert fixed in argv
    assert all(a in argv for a in present) and not any(a in argv for a in absent)


def test_local_job_runs_fio_on_the_file_without_connect(fake, tmp_path):
    host, stack = fake
    local = PerfJob("main", knobs(), cpus=(0,), local_path=str(tmp_path / "f.img"))
    session = stack.open_host(local, None, host, tmp_path)
    assert f"--filename={tmp_path / 'f.img'}" in session.perf_argv(1, 0, "o.json")
    session.close()
    assert not any(c[0] == "nvme" for c in host.commands)


def test_libaio_fallback_refuses_polling(fake, tmp_path):
    host, stack = fake
    (host.root / "proc/sys/kernel/io_uring_disabled").write_text("2")
    target = type("T", (), {"address": "10.0.0.2", "port": 4420})()
    with pytest.raises(StackError, match="io_uring"):
        stack.open_host(job(completion="poll"), target, host, tmp_path)
    local = PerfJob("main", knobs(), cpus=(0,), local_path="/x")
    assert "--ioengine=libaio" in stack.open_host(local, None, host, tmp_path).perf_argv(1, 0, "o")


# -- fio's report --------------------------------------------------------------------------------

def test_real_fio_json_goes_through_summarize():
    # Made here by fio 3.33 with fio_argv's command line (randrw 70 %, 2 jobs, json+) on a file.
    report = parse_fio((DATA / "fio-randrw-kernel.json").read_text())
    row = metrics.summarize(report)
    jobs = report["jobs"]
    assert len(jobs) == 2 and row["total_ios"] > 0
    assert row["iops"] == pytest.approx(sum(j[d]["iops"] for j in jobs for d in ("read", "write")))
    assert row["usr_cpu"] == pytest.approx(sum(j["usr_cpu"] for j in jobs))
    # json+ bins of both jobs and directions are added into one histogram: every completion counted
    histogram = json.loads(row["histogram_json"])
    assert sum(c for _, c in histogram) == sum(j[d]["clat_ns"]["N"] for j in jobs for d in ("read", "write"))
    assert report["nvmflab"]["engine"] == "fio" and row["engine"] == "fio"
    # the merged p50 lies between the jobs' own read p50s (fio's bins are the same buckets)
    p50s = [float(j["read"]["clat_ns"]["percentile"]["50.000000"]) for j in jobs]
    merged_read = metrics.histogram_percentile(report["nvmflab"]["histogram"]["read"], 50.0)
    assert min(p50s) <= merged_read <= max(p50s)
    assert row["lat_p50_ns"] <= row["lat_p99_ns"] <= row["lat_p99_99_ns"]


def test_bad_fio_bins_are_one_line_errors():
    report = {"jobs": [{"read": {"clat_ns": {"bins": {"12x": 3}}}, "write": {}}]}
    with pytest.raises(StackError, match="latency bin '12x' is not a number"):
        parse_fio(json.dumps(report))


@pytest.mark.parametrize("text, message", [
    ("fio: pid=12, err=5/file:io_u.c:1889, func=io_u error", "not JSON"),
    ("{\"jobs\": [", "not JSON"),
    ("[1, 2]", "jobs list"),
    ("{\"jobs\": [{\"read\": 3}]}", "read/write"),
    ("{\"jobs\": [{\"jobname\": \"main\", \"error\": 5}]}", "error 5"),
    ("[" * 100000, "not JSON"),
])
def test_bad_fio_reports_are_one_line_errors(text, message):
    with pytest.raises(StackError, match=message) as caught:
        parse_fio(text)
    assert "\n" not in str(caught.value)


def test_fio_notes_before_the_json_are_skipped():
    text = "note: both iodepth >= 1 and synchronous I/O engine are selected\n" + json.dumps({"jobs": []})
    assert parse_fio(text) == {"jobs": []}


# -- knobs, availability, versions -----------------------------------------------------------------

def test_knob_refusals_name_knob_and_stack():
    stack, defaults = get_stack("kernel"), Knobs().model_dump()
    assert isinstance(stack, KernelStack)
    with pytest.raises(StackError, match=r"target_mode = 'poll': the kernel target cannot do it \(nvmet_tcp"):
        stack.check_knobs({"target_mode": "poll"}, "target", defaults)
    with pytest.raises(StackError, match="busy_poll_us = 20: the kernel target has no such setting"):
        stack.check_knobs({"busy_poll_us": 20}, "target", defaults)
    for side in ("target", "host"):  # nvme-tcp and nvmet-tcp use the machine's congestion control
        with pytest.raises(StackError, match=f"tcp_congestion = 'cubic': the kernel {side} has no such setting"):
            stack.check_knobs({"tcp_congestion": "cubic"}, side, defaults)
    for side in ("target", "host"):  # every other knob maps to a kernel setting
        stack.check_knobs({"idle_poll_us": 50, "so_priority": 6, "tos": 32, "hdr_digest": True, "data_digest": True,
                           "in_capsule_data_size": 4096, "completion": "poll", "io_queues": 4,
                           "busy_poll_us": 20 if side == "host" else 0}, side, defaults)
    assert stack.fixed_defaults("target") == {"target_mode": "event"}


def test_unavailable_names_the_missing_piece(fake, monkeypatch):
    host, stack = fake
    assert stack.unavailable(host, "target") is None
    _rmtree(host.root / "sys/module/nvmet_tcp")
    assert stack.unavailable(host, "target") == "local: kernel module nvmet_tcp is neither loaded nor installed"
    monkeypatch.setattr(host, "which", lambda name: None if name == "nvme" else "/usr/bin/" + name)
    assert "nvme not found (nvme-cli is needed)" in stack.unavailable(host, "host")
    assert "needs root" in KernelStack(root=str(host.root), sudo=["false"]).unavailable(host, "host")


def test_versions_name_kernel_nvme_cli_and_fio(fake):
    host, stack = fake
    found = stack.versions(host)
    assert set(found) == {"kernel", "nvme-cli", "fio"} and found["kernel"] == os.uname().release
    if found["fio"]:
        assert found["fio"].startswith("fio-")


def test_allowed_hosts_are_linked_and_a_shared_host_entry_stays(fake, tmp_path):
    host, stack = fake
    root = host.root
    nvmet = root / "sys/kernel/config/nvmet"
    _attrs(nvmet / "hosts/nqn.theirs", {}, [])  # another subsystem's host entry, shared by all
    before = snapshot(root)
    setup = TargetSetup(**{**setup_for(Subsystem(NQN, "ram", 1 << 20)).__dict__,
                           "allowed_hosts": ("nqn.theirs", "nqn.mine")})
    target = stack.start_target(setup, host, tmp_path)
    sub = nvmet / "subsystems" / NQN
    assert (sub / "attr_allow_any_host").read_text() == "0"
    assert {p.name: os.readlink(p) for p in (sub / "allowed_hosts").iterdir()} == {
        "nqn.theirs": str(nvmet / "hosts/nqn.theirs"), "nqn.mine": str(nvmet / "hosts/nqn.mine")}
    target.stop()
    assert target.teardown_errors == [] and snapshot(root) == before  # nqn.mine gone, nqn.theirs kept


def test_a_given_host_nqn_connects_and_leaves_earlier_controllers_alone(fake, tmp_path):
    host, stack = fake
    root = host.root
    _attrs(root / "sys/class/nvme/nvme0", {"subsysnqn": NQN, "hostnqn": "nqn.lab", "state": "live"},
           ["nvme0n1"])  # the user's own connection with the same host NQN
    (root / "dev/nvme0n1").write_text("")
    target = SimpleNamespace(address="10.0.0.1", port=4420)
    session = stack.open_host(PerfJob("main", knobs(), cpus=(1,), nqn=NQN, hostnqn="nqn.lab"), target, host,
                              tmp_path)
    connect = next(c for c in host.commands if c[:2] == ["nvme", "connect"])
    assert "--hostnqn=nqn.lab" in connect and session.filename != f"{root}/dev/nvme0n1"
    session.close()
    assert (root / "sys/class/nvme/nvme0").exists() and session.close_errors == []
    assert ["nvme", "disconnect", "-d", "nvme0"] not in host.commands


def test_fio_interval_logs_become_nvmflab_intervals():
    # fio's averaged logs: "time_ms, value, direction, bs, offset"; two jobs, reads (0) and writes (1)
    logs = {("iops", 1): "499, 100, 0, 0, 0\n499, 50, 1, 0, 0\n1001, 300, 0, 0, 0\n",
            ("iops", 2): "500, 100, 0, 0, 0\n1000, 100, 0, 0, 0\n",
            ("clat", 1): "500, 1000, 0, 0, 0\n500, 4000, 1, 0, 0\n1000, 2000, 0, 0, 0\n1500, 9, 0, 0, 0\n",
            ("clat", 2): "500, 1000, 0, 0, 0\n1000, 6000, 0, 0, 0\n"}
    found = fio_intervals(logs, 500)
    assert [r["t_ms"] for r in found] == [500, 1000]  # the clat line past the last IOPS window is dropped
    assert found[0] | {"lat_p99_ns": 0} == {"t_ms": 500, "iops": 250.0, "read_iops": 200.0, "write_iops": 50.0,
                                           "lat_mean_ns": (100 * 1000 + 50 * 4000 + 100 * 1000) / 250,
                                           "lat_p50_ns": None, "lat_p99_ns": 0, "lat_p99_9_ns": None}
    assert found[1]["lat_mean_ns"] == (300 * 2000 + 100 * 6000) / 400
    with pytest.raises(StackError, match="iops log of job 1: unreadable line"):
        fio_intervals({("iops", 1): "x, y\n"}, 500)


def test_real_fio_logs_reach_the_report(fake, tmp_path):
    import shutil

    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    host, stack = fake
    path = tmp_path / "data.img"
    path.write_bytes(b"\0" * (8 << 20))
    local = PerfJob("main", knobs(numjobs=1, iodepth=2), cpus=(0,), local_path=str(path))
    session = stack.open_host(local, None, host, tmp_path)
    output = str(tmp_path / "p-main.json")
    argv = session.perf_argv(2.2, 0, output)
    subprocess.run(argv, check=True, timeout=60, capture_output=True)
    report = session.parse_output(Path(output).read_text())
    intervals = metrics.intervals(report)
    assert intervals and [r["t_ms"] for r in intervals][:2] == [1000.0, 2000.0]
    assert all(r["iops"] > 0 and r["lat_mean_ns"] > 0 and r["lat_p99_ns"] is None for r in intervals[:2])
    assert json.loads(metrics.summarize(report)["intervals_json"])[0]["t_ms"] == 1000.0
