"""The network counters of each leg come from the interface that leg's traffic takes (issue 37 item
8): loopback → lo, netns → the leg's own veth, a remote target → the NIC holding its data address,
a local job → no network; never the host's busiest interface, which on a shared machine carries
other tenants' traffic."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from tiny_specs import head

from nvmflab import sysstat
from nvmflab.plan import PerfJob, Point, TargetSetup
from nvmflab.runner import Runner
from nvmflab.session import run_spec
from nvmflab.stacks import get_stack
from nvmflab.store import ResultsStore
from nvmflab.study_spec import load_study_spec
from nvmflab.topology import netns
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost

SPEC = ('study = "overhead"\n' + head(repeats=1)
        + '[params]\niodepth = [1]\nbs = ["4k"]\nbapp_iodepth = [1]\nlegs = [LEGS]\n')


def _interfaces(tmp_path, legs: list[str]) -> dict[str, set[tuple]]:
    """{leg: {(machine, data interface, kind)}} of a tiny overhead run in this process."""
    path = tmp_path / "overhead.toml"
    path.write_text(SPEC.replace("LEGS", ", ".join(f'"{leg}"' for leg in legs)))
    summary = run_spec(load_study_spec(path), path, "overhead", tmp_path / "r", quick=False)
    assert summary.code == 0, summary.text
    with ResultsStore(tmp_path / "r") as store:
        rows = store.measurements()
    out: dict[str, set[tuple]] = {}
    for leg, text in zip(rows["leg"], rows["net_json"]):
        for machine, w in json.loads(text).items():
            out.setdefault(leg, set()).add((machine, w["data_interface"], w["data_interface_kind"]))
    return out


def test_loopback_reads_lo_and_a_local_job_no_interface(tmp_path, fake_env):
    found = _interfaces(tmp_path, ["local", "loopback"])
    assert found["loopback"] == {("local", "lo", "loopback")}
    assert found["local"] == {("local", None, "none")}


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"netns: {netns.unavailable()}")
def test_a_netns_leg_reads_its_own_veth(tmp_path, fake_env):
    found = _interfaces(tmp_path, ["netns"])
    veth = f"nvfh{os.getpid()}"[:15]  # the link this process builds (netns.EmulatedLink)
    assert found["netns"] == {("local", veth, "veth")}, found


class _RemoteTarget(LocalHost):
    """A target machine reached over SSH, whose data NIC eth1 holds 10.0.0.2."""

    remote = True

    def run(self, argv, timeout=60.0, check=True, input=None):
        answer = "3: eth1    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth1\\       valid_lft forever\n" \
            if argv[:3] == ["ip", "-o", "addr"] and argv[-1] == "10.0.0.2" else ""
        return subprocess.CompletedProcess(argv, 0, answer, "")


def test_a_remote_target_reads_the_nic_of_its_data_address(tmp_path):
    target = _RemoteTarget(name="t1", data_ip="10.0.0.2")
    store = ResultsStore(tmp_path / "r")
    runner = Runner(store, 0, get_stack("ours"), hosts=Hosts(target, [LocalHost()]))
    setup = TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=0, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(), listen_ip="10.0.0.2")
    point = Point(study="s", leg="remote", knobs={}, repeat=0, jobs=[PerfJob(role="main", knobs={}, cpus=(1,))],
                  runtime=1, ramp_time=0, target=setup)
    machines = runner._machines(point)
    assert set(machines) == {"local", sysstat.machine_key(target)}
    links = runner._links(point, machines)
    assert links[sysstat.machine_key(target)] == {"interface": "eth1", "kind": "nic",
                                                  "from": "-o addr show to 10.0.0.2"}
    # this machine, loading it, reads the interface its route to 10.0.0.2 leaves by
    route = subprocess.run(["ip", "-o", "route", "get", "10.0.0.2"], capture_output=True, text=True).stdout.split()
    expected = route[route.index("dev") + 1] if "dev" in route else None
    assert (links["local"] or {}).get("interface") == expected
    store.close()
