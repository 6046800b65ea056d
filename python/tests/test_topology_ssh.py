"""The ssh topology: inventories, and SshHost for real against sshd servers in namespaces (sshbed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sshbed
from conftest import REPO

from nvmflab.spec import Topology
from nvmflab.topology.base import HostError
from nvmflab.topology.inventory import InventoryError, load_inventory
from nvmflab.topology.ssh import SshHost, open_hosts, parse_cpulist

BIN_DIR = REPO / "target" / "release"

# -- inventories (no root needed) ------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_toml_inventory(tmp_path):
    hosts = load_inventory(write(tmp_path, "lab.toml", """
        [hosts.server1]
        ssh = "server1"
        data_ip = "192.168.50.1"
        cores = [2, 3]
        [hosts.server2]
        ssh = "admin@10.0.0.2"
        data_ip = "192.168.50.2"
        ssh_options = ["-o", "ProxyJump=bastion"]
        user = "lab"
        port = 2222
    """))
    assert hosts["server1"].ssh == "server1" and hosts["server1"].cores == [2, 3]
    assert hosts["server1"].user is None and hosts["server1"].ssh_options == []
    two = hosts["server2"]
    assert (two.ssh, two.user, two.port, two.ssh_options, two.cores) == (
        "admin@10.0.0.2", "lab", 2222, ["-o", "ProxyJump=bastion"], None)


def test_ansible_inventory_groups_vars_and_defaults(tmp_path):
    hosts = load_inventory(write(tmp_path, "hosts.yml", """
        all:
          vars:
            nvmflab_cores: [0, 1]
            ansible_user: lab
          hosts:
            target1:
              ansible_host: 10.1.0.1
              ansible_port: 2222
          children:
            initiators:
              vars:
                ansible_user: bench
              hosts:
                init1:
                  ansible_host: init1.lab.example
                  nvmflab_data_ip: 10.2.0.2
                  nvmflab_cores: [4]
                  ansible_ssh_private_key_file: /keys/lab
                  ansible_ssh_common_args: "-o ProxyJump=bastion"
                init2:
                  ansible_host: 10.1.0.3
        spares:
          hosts:
            init2:
              ansible_user: own
    """))
    assert set(hosts) == {"target1", "init1", "init2"}
    target = hosts["target1"]
    assert (target.ssh, target.data_ip, target.port, target.user, target.cores) == ("10.1.0.1", "10.1.0.1", 2222,
                                                                                    "lab", [0, 1])
    init1 = hosts["init1"]
    assert (init1.ssh, init1.data_ip, init1.user, init1.cores) == ("init1.lab.example", "10.2.0.2", "bench", [4])
    assert init1.ssh_options == ["-i", "/keys/lab", "-o", "ProxyJump=bastion"]
    assert hosts["init2"].user == "own"  # its own var beats every group's


@pytest.mark.parametrize("name, text, error", [
    ("a.toml", '[hosts.a]\nssh = "a"\n', "a.toml: host a: data_ip: Field required"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "fast"\n', "a.toml: host a: data_ip: 'fast' is not an IP address"),
    ("a.toml", '[hosts.a]\nssh = "-oProxyCommand=touch /tmp/x"\ndata_ip = "10.0.0.1"\n',
     "host a: ssh: '-oProxyCommand=touch /tmp/x' is not an ssh destination"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\ncores = [1, 1]\n', "host a: cores: a core is listed twice"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\ncores = [-1]\n', "host a: cores.0: Input should be"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\nport = 70000\n', "host a: port: Input should be"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\nuser = "-l"\n', "host a: user: '-l' is not a user"),
    ("a.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\ncolor = 1\n', "host a: color: unknown field"),
    ("a.toml", '[hosts."web[1:3]"]\nssh = "a"\ndata_ip = "10.0.0.1"\n', "host web[1:3]: name: a host name is"),
    ("a.toml", "[hosts]\n", "a.toml: no hosts"),
    ("a.toml", "[servers.a]\n", "unknown table 'servers'"),
    ("a.toml", "hosts = [", "a.toml: not valid TOML"),
    ("a.yml", "all:\n  hosts:\n    t: {ansible_host: t.lab}\n",
     "a.yml: host t: nvmflab_data_ip: needed, since ansible_host 't.lab' is not an address"),
    ("a.yml", "all:\n  hosts: [a, b]\n", "a.yml: group all: `hosts` must be a mapping"),
    ("a.yml", "all:\n  hostz: {}\n", "a.yml: group all: unknown key 'hostz'"),
    ("a.yml", "- just a list\n", "a.yml: an Ansible inventory is a mapping"),
    ("a.yml", "all: {hosts: {t: {ansible_host: 10.0.0.1, ansible_ssh_common_args: \"-o 'x\"}}}\n",
     "a.yml: host t: ansible_ssh_common_args: No closing quotation"),
    ("a.yml", "all: [\n", "a.yml: not valid YAML"),
])
def test_inventory_errors_are_one_line_naming_file_host_and_field(tmp_path, name, text, error):
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, name, text))
    message = str(caught.value)
    assert error in message and "\n" not in message and message.startswith(str(tmp_path))


def test_missing_inventory_and_unknown_host(tmp_path):
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "absent.toml")
    write(tmp_path, "lab.toml", '[hosts.a]\nssh = "a"\ndata_ip = "10.0.0.1"\n')
    topology = Topology(kind="ssh", inventory="lab.toml", target="a", initiators=["a", "b"])
    with pytest.raises(HostError, match=r"lab.toml: no host named 'b' \(it has: a\)"):
        open_hosts(topology, tmp_path)
    hosts = open_hosts(Topology(kind="ssh", inventory="lab.toml", target="a", initiators=["a"]), tmp_path)
    assert hosts.target is hosts.initiators[0] and hosts.target.data_ip == "10.0.0.1"


def test_parse_cpulist():
    assert parse_cpulist("0-3,6") == [0, 1, 2, 3, 6]
    for bad in ("", "3-1", "a", "0-"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


# -- real hosts: sshd servers in network namespaces -------------------------------------------------

needs_bed = pytest.mark.skipif(sshbed.unavailable() is not None, reason=f"ssh test bed: {sshbed.unavailable()}")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if sshbed.unavailable():
        pytest.skip(sshbed.unavailable())
    with sshbed.SshBed(tmp_path_factory.mktemp("sshbed"), count=3) as made:
        yield made


@pytest.fixture
def inventory(bed, tmp_path) -> Path:
    path = tmp_path / "lab.toml"
    path.write_text(bed.inventory_toml())
    return path


@pytest.fixture
def hosts(inventory):
    made = {name: SshHost(entry) for name, entry in load_inventory(inventory).items()}
    yield made
    for host in made.values():
        host.close()


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@needs_bed
def test_run_put_read_through_aliases(bed, hosts, tmp_path):
    host = hosts["lab-1"]
    assert host.run(["hostname", "-I"]).stdout.split() == [bed.ips[1]]  # the alias led to lab-1's sshd
    assert host.cores == [int(c) for c in parse_cpulist(Path("/sys/devices/system/cpu/online").read_text().strip())]
    with pytest.raises(HostError, match=r"^lab-1: `sh -c 'echo no >&2; exit 4'` exited 4: no$"):
        host.run(["sh", "-c", "echo no >&2; exit 4"])
    assert host.run(["cat"], input="über\n").stdout == "über\n"
    source = tmp_path / "payload"
    source.write_bytes(bytes(range(256)) * 64)
    remote = f"{host.workdir()}/it's here"  # quoting survives the remote shell
    host.put(source, remote)
    assert host.run(["sha256sum", remote]).stdout.split()[0] == \
        subprocess.run(["sha256sum", str(source)], capture_output=True, text=True).stdout.split()[0]
    with pytest.raises(HostError, match=r"^lab-1: cannot read /nonexistent: .*No such file"):
        host.read_text("/nonexistent")
    assert host.which("sh") and host.which("no-such-tool-here") is None


@needs_bed
def test_spdk_sockbuf_shim_is_compiled_on_the_remote_host(hosts):
    # The source goes over ssh's stdin and the host's cc builds it in the host's working directory:
    # what spdk_nvme_perf over TLS preloads there (nvmflab.stacks.spdk_sockbuf).
    from nvmflab.stacks import spdk_sockbuf

    host = hosts["lab-2"]
    library = spdk_sockbuf.build(host)
    assert library == f"{host.workdir()}/{spdk_sockbuf.LIBRARY}"
    assert "setsockopt" in host.run(["sh", "-c", 'nm -D "$1" || strings "$1"', "sh", library]).stdout
    assert spdk_sockbuf.build(host) == library


@needs_bed
def test_spawn_pins_streams_and_reports_exit_and_cpu(bed, hosts, tmp_path):
    host = hosts["lab-0"]
    busy = "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"
    proc = host.spawn(["sh", "-c", f"taskset -pc $$; echo to-stderr >&2; {busy}; exit 3"], [1],
                      log=tmp_path / "log", stdout=tmp_path / "out")
    code, user, system = proc.wait(60)
    assert code == 3 and not proc.alive()
    assert (tmp_path / "out").read_text().strip().endswith("list: 1")  # pinned to core 1
    assert (tmp_path / "log").read_text() == "to-stderr\n"  # the wrapper's own lines are not there
    assert 0.05 < user < 30 and 0 <= system < 30
    assert proc.wait(1)[0] == 3  # waiting again is harmless


@needs_bed
def test_cpu_seconds_and_stop_kill_the_whole_remote_group(bed, hosts, tmp_path):
    host = hosts["lab-2"]
    proc = host.spawn(["sh", "-c", "sleep 300 & while :; do :; done"], None, log=tmp_path / "log")
    wait_for(lambda: "sleep" in bed.commands(bed.namespaces[2]), 10, "the command never started")
    wait_for(lambda: proc.cpu_seconds()[0] > 0.05, 10, "cpu_seconds never grew")
    assert proc.wait(0.2)[0] is None and proc.alive()
    started = time.monotonic()
    proc.stop()
    assert time.monotonic() - started < 10 and not proc.alive()
    wait_for(lambda: not {"sleep", "sh", "cat"} & set(bed.commands(bed.namespaces[2])), 10,
             f"left behind: {bed.commands(bed.namespaces[2])}")


@needs_bed
def test_binaries_are_copied_and_checked(bed, hosts, tmp_path, monkeypatch):
    host = hosts["lab-0"]
    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(BIN_DIR))
    path = host.binary("nvmf-perf")
    assert path == f"{host.workdir()}/nvmf-perf" and host.binary("nvmf-perf") == path
    assert "nvmf-perf" in host.run([path, "--version"]).stdout
    with pytest.raises(HostError, match="^lab-0: no-such-tool not found$"):
        host.binary("no-such-tool")
    # A binary this host cannot execute (another architecture looks the same: exec fails).
    other = hosts["lab-1"]
    (tmp_path / "nvmf-target").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(60))
    (tmp_path / "nvmf-target").chmod(0o755)
    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(tmp_path))
    with pytest.raises(HostError, match=r"^lab-1: nvmf-target \(copied from .*\) does not run there: .*built for"):
        other.binary("nvmf-target")


@needs_bed
def test_free_port_skips_listening_ports(bed, hosts, tmp_path, monkeypatch):
    host = hosts["lab-1"]
    listener = host.spawn(["python3", "-c", "import socket, time; s = socket.socket(); "
                           "s.bind(('0.0.0.0', 23456)); s.listen(); print('up', flush=True); time.sleep(60)"],
                          None, log=tmp_path / "log", stdout=tmp_path / "out")
    try:
        wait_for(lambda: (tmp_path / "out").read_text() == "up\n", 10, "listener never came up")
        picks = iter([23456, 23457, 23457, 23458])
        monkeypatch.setattr("nvmflab.topology.ssh.random.randint", lambda a, b: next(picks))
        assert host.free_port() == 23457  # 23456 is taken on the host
        assert host.free_port() == 23458  # 23457 was handed out already
    finally:
        listener.stop()


@needs_bed
def test_login_failure_is_one_line_naming_the_host(bed, tmp_path):
    (tmp_path / "bad.toml").write_text(f'[hosts.ghost]\nssh = "no-such-alias.invalid"\ndata_ip = "10.0.0.9"\n'
                                       f'ssh_options = ["-F", "{bed.ssh_config}"]\n')
    host = SshHost(load_inventory(tmp_path / "bad.toml")["ghost"])
    try:
        with pytest.raises(HostError, match=r"^ghost: cannot log in with `ssh no-such-alias.invalid`: .+"):
            host.run(["true"], timeout=30)
    finally:
        host.close()


@needs_bed
def test_close_removes_workdir_and_master(bed, hosts):
    host = hosts["lab-2"]
    workdir = host.workdir()
    master = host._master
    assert master is not None and Path(workdir).is_dir()  # the namespaces share this machine's /tmp
    host.close()
    assert not Path(workdir).exists() and master.poll() is not None
    assert host.run(["true"]).returncode == 0  # usable again: reconnects


# -- a study point of our stack across the namespaces, and teardown after a killed run ---------------

RUN_SCRIPT = """
import json, signal, sys
from pathlib import Path
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.runner import Runner
from nvmflab.spec import Topology
from nvmflab.stacks import get_stack
from nvmflab.store import ResultsStore
from nvmflab.topology.ssh import open_hosts

inventory, results, runtime = sys.argv[1], sys.argv[2], float(sys.argv[3])
hosts = open_hosts(Topology(kind="ssh", inventory=inventory, target="lab-0", initiators=["lab-1"]), Path("."))
setup = TargetSetup(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                    busy_poll_us=0, subsystems=(Subsystem(nqn="nqn.2024-01.io.nvmflab:ssh", backend="null",
                                                          size=1 << 30),), listen_ip=hosts.target.data_ip)
knobs = dict(rw="randread", bs=4096, numjobs=1, rwmixread=100, rate_iops=0, completion="event", so_priority=0,
             tos=0, busy_poll_us=0, hdr_digest=False, data_digest=False)
def interrupt(signum, frame):  # as the session does: SIGTERM takes Ctrl-C's path
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, interrupt)
store = ResultsStore(results)
runner = Runner(store, store.start_run("ssh", "", {}), get_stack("ours"), get_stack("ours"), hosts)
try:
    for iodepth in (1, 4):
        job = PerfJob(role="main", knobs=knobs | {"iodepth": iodepth}, cpus=(1,), nqn=setup.subsystems[0].nqn)
        point = Point(study="ssh", leg="across", knobs={"iodepth": iodepth}, repeat=0, jobs=[job],
                      runtime=runtime, ramp_time=0, target=setup)
        (outcome,) = runner.run([point], "ssh")
        print(json.dumps({"iodepth": iodepth, "status": outcome.status, "error": outcome.error}), flush=True)
finally:
    runner.close()
    hosts.close()
"""


def run_script(tmp_path: Path, inventory: Path, results: Path, runtime: float) -> subprocess.Popen:
    script = tmp_path / "run_ssh.py"
    script.write_text(RUN_SCRIPT)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(BIN_DIR))
    return subprocess.Popen([sys.executable, str(script), str(inventory), str(results), str(runtime)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ours_left(bed) -> list[str]:
    return [c for ns in bed.namespaces for c in bed.commands(ns) if c.startswith("nvmf-")]


needs_binaries = pytest.mark.skipif(not (BIN_DIR / "nvmf-target").exists() or not (BIN_DIR / "nvmf-perf").exists(),
                                    reason="needs target/release/nvmf-target and nvmf-perf (cargo build --release)")


@needs_bed
@needs_binaries
def test_study_point_of_our_stack_across_hosts(bed, inventory, tmp_path):
    from nvmflab.store import ResultsStore

    proc = run_script(tmp_path, inventory, tmp_path / "r", runtime=1)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    outcomes = [json.loads(line) for line in stdout.splitlines()]
    assert [(o["iodepth"], o["status"]) for o in outcomes] == [(1, "ok"), (4, "ok")], outcomes
    frame = ResultsStore(tmp_path / "r").measurements()
    assert len(frame) == 2 and (frame["iops"] > 0).all() and (frame["perf_usr_s"] > 0).all()
    assert (frame["target_usr_s"] + frame["target_sys_s"] > 0).all()  # /proc of the remote target
    assert frame["target_counters_json"].notna().all()  # /stats fetched at the target's data address
    # the load generator ran from its copy on lab-1, against lab-0's data address
    raw = json.loads(next((tmp_path / "r" / "raw").glob("*.json")).read_text())
    argv = raw["argv"]["main"]
    assert argv[0].startswith("/tmp/nvmflab-run.") and argv[0].endswith("/nvmf-perf") and bed.ips[0] in argv
    assert ours_left(bed) == []


@needs_bed
@needs_binaries
# SIGKILL (the hosts' watchdogs clean up) runs in `make test`; SIGTERM (the harness stops each
# remote group itself, as test_cpu_seconds_and_stop_kill_the_whole_remote_group checks) in
# `make test-long`: 30 s each on the CI machine.
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.long), signal.SIGKILL],
                         ids=["SIGTERM", "SIGKILL"])
def test_killed_run_leaves_nothing_on_any_host_and_resumes(bed, inventory, tmp_path, sig):
    results = tmp_path / "r"
    workdirs_before = set(Path("/tmp").glob("nvmflab-run.*"))  # the namespaces share this /tmp
    proc = run_script(tmp_path, inventory, results, runtime=3)
    try:
        # Kill it while the second point runs: the first is stored by then.
        wait_for(lambda: proc.poll() is not None or _stored(results) >= 1 and "nvmf-perf" in ours_left(bed), 60,
                 "the second point never started")
        assert proc.poll() is None, proc.communicate()[1]
        assert "nvmf-target" in ours_left(bed)
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode != 0
    wait_for(lambda: not ours_left(bed), 15, f"left running after {sig.name}: {ours_left(bed)}")
    wait_for(lambda: not set(Path("/tmp").glob("nvmflab-run.*")) - workdirs_before, 15,
             "the run's directories on the hosts were not removed")
    again = run_script(tmp_path, inventory, results, runtime=3)
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr
    statuses = [(o["iodepth"], o["status"]) for o in map(json.loads, stdout.splitlines())]
    assert statuses == [(1, "stored"), (4, "ok")]
    assert ours_left(bed) == []
    for folder in Path("/tmp").glob("nvmflab-ssh-*"):  # a SIGKILLed harness's control dir is swept
        try:
            owner = (folder / "owner").read_text()
        except OSError:
            continue
        assert Path(f"/proc/{owner}").exists(), f"stale {folder}"


def _stored(results: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(results / "results.sqlite", timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    except sqlite3.Error:
        return 0


@needs_bed
@needs_binaries
def test_nvmflab_run_with_an_ssh_topology(bed, inventory, tmp_path):
    from conftest import nvmflab

    from nvmflab.store import ResultsStore

    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent("""
        name = "sshcli"
        repeats = 1
        ramp_time = 0
        runtime = 1
        [sweep]
        iodepth = [1, 8]
        [topology]
        kind = "ssh"
        inventory = "lab.toml"
        target = "lab-0"
        initiators = ["lab-1"]
        target_cores = [0]
        host_cores = [1]
    """))
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(BIN_DIR))
    plan = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), "--plan", env=env)
    assert plan.returncode == 0, plan.stderr
    assert "[lab-0: ssh lab-0] nvmf-target --config" in plan.stdout and "[lab-1: ssh lab-1] nvmf-perf run" in plan.stdout
    assert ours_left(bed) == []  # --plan runs nothing
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert len(frame) == 2 and set(frame["status"]) == {"ok"} and (frame["iops"] > 0).all()
    assert ours_left(bed) == []


@needs_bed
@needs_binaries
def test_env_describes_every_host_of_an_inventory(bed, inventory, tmp_path):
    import platform

    from conftest import nvmflab

    before = set(Path("/tmp").glob("nvmflab-run.*"))  # the namespaces share this /tmp
    done = nvmflab("env", "--topology", str(inventory), "--json", env=dict(os.environ, NVMFLAB_BIN_DIR=str(BIN_DIR)))
    assert done.returncode == 0, done.stderr
    reports = {r["host"]: r for r in json.loads(done.stdout)}
    assert set(reports) == set(bed.aliases)
    for i, alias in enumerate(bed.aliases):
        r = reports[alias]
        assert r["data_ip"] == bed.ips[i] and r["kernel"] == platform.release()
        assert r["nic"] == f"nv{bed.tag}h{i}"  # the veth holding the data address, inside that namespace
        assert r["stacks"]["ours"] == {"target": None, "host": None}  # the copied binaries run there
        assert set(r["stacks"]) == {"ours", "kernel", "spdk"}
        assert all(v is None or isinstance(v, str) for sides in r["stacks"].values() for v in sides.values())
    assert not set(Path("/tmp").glob("nvmflab-run.*")) - before  # the copies are gone again
    broken = tmp_path / "bad.toml"
    broken.write_text('[hosts.x]\nssh = "x"\ndata_ip = "nope"\n')
    failed = nvmflab("env", "--topology", str(broken), env=dict(os.environ))
    assert failed.returncode != 0 and "bad.toml: host x: data_ip: 'nope' is not an IP address" in failed.stderr


@needs_bed
@needs_binaries
# contention and dimensions across SSH take one to four minutes each, busy-poll 20 s: `make
# test-long` runs them, `make test` parallelism (the same SSH paths: binaries copied, roles placed,
# cleanup checked).
@pytest.mark.parametrize("study", [pytest.param("contention", marks=pytest.mark.long),
                                   pytest.param("dimensions", marks=pytest.mark.long),
                                   pytest.param("busy-poll", marks=pytest.mark.long), "parallelism"])
def test_the_newer_studies_run_across_ssh_hosts(bed, inventory, tmp_path, study):
    """Each study's tiny variant with its target on lab-0 and its load generators (and iperf3
    clients) on lab-1: the same legs as on loopback, every storage point measured."""
    from conftest import nvmflab
    from tiny_specs import LEGS, SPECS

    from nvmflab.store import ResultsStore

    ssh = textwrap.dedent("""
        [topology]
        kind = "ssh"
        inventory = "lab.toml"
        target = "lab-0"
        initiators = ["lab-1"]
        target_cores = [0]
        host_cores = [1]
    """)
    text = SPECS[study].replace("[topology]\ntarget_cores = [0]\nhost_cores = [1]\n", ssh)
    assert 'kind = "ssh"' in text
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(BIN_DIR))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["leg"]) == LEGS[study]
    storage = frame[frame["engine"].isin(["tcp", "local"])]
    assert len(storage) and (storage["status"] == "ok").all(), frame[["leg", "status", "error"]].to_string()
    assert (storage["iops"] > 0).all()
    if study == "contention":  # iperf3 ran from lab-1 to lab-0's data address
        flows = frame[frame["engine"] == "iperf3"]
        # one flow alone (isolated), one beside the L-app (same_core), and in many_apps one beside
        # the two storage apps and one alone, its baseline in the same rounds (storage_apps = 0)
        per_leg = flows.groupby("leg").size().to_dict()
        assert per_leg == {"isolated": 1, "same_core": 1, "many_apps": 2}, frame[["leg", "engine", "status"]].to_string()
        assert (flows["bw_bytes"] > 0).all(), frame[["leg", "status", "error"]].to_string()
    assert ours_left(bed) == []
