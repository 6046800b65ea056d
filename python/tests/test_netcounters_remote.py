"""An SSH host's network counters: what its interfaces are (FACTS_SCRIPT) asked once per run, the
counters (COUNTERS_SCRIPT) at every snapshot; both run here under `sh` (dash on Debian), through a
host that runs its commands on this machine, optionally against a fake /proc and /sys tree."""

from __future__ import annotations

import os
import shutil
import subprocess

from test_netcounters import write
from test_netcounters_kind import EXPECTED, fake_sysfs
from test_probe_cache import calls, fake_ssh  # noqa: F401 (a fixture)

from nvmflab import netcounters as nc
from nvmflab.topology.base import Host
from nvmflab.topology.inventory import HostEntry
from nvmflab.topology.ssh import SshHost


class ShellHost(Host):
    """A remote host that runs each command here (its paths under `root`, if given) and logs them."""

    name, data_ip, cores, remote = "guest", "127.0.0.1", None, True

    def __init__(self, root=None, path=None):
        self.root, self.path, self.ran = root, path, []

    def run(self, argv, timeout=60.0, check=True, input=None):
        self.ran.append(list(argv))
        argv = list(argv)
        if self.root is not None:
            argv[2] = argv[2].replace("/proc/", f"{self.root}/proc/").replace("/sys/class/net/",
                                                                             f"{self.root}/sys/class/net/")
        env = {**os.environ, "PATH": self.path or os.environ["PATH"]}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)

    def asked(self, script: str) -> int:
        return sum(argv[:3] == ["sh", "-c", script] for argv in self.ran)

    spawn = workdir = put = read_text = free_port = None  # not used here


def test_the_scripts_read_this_machine_as_collect_local_does(fake_ssh):
    # through SshHost's quoting to a fake `ssh` that runs the command here
    host = SshHost(HostEntry(name="a", ssh="a", data_ip="127.0.0.1"))
    try:
        snaps = [nc.snapshot(host), nc.snapshot(host)]
    finally:
        host.close()
    local = nc.collect_local()
    assert calls(fake_ssh, "=== tool ethtool") == 1 and calls(fake_ssh, "=== speed") == 2  # facts once
    for snap in snaps:
        assert "lo" in snap["kind"] and snap["kind"] == local["kind"] and snap["irqs"] == local["irqs"]
        assert snap["speed"] == local["speed"]
        assert "lo" in nc.parse_dev(snap["dev"]) and nc.parse_retrans(snap["snmp"]) is not None
        assert nc.parse_softnet(snap["softnet"]) and nc.parse_interrupts(snap["interrupts"])[0]
        for section in nc.SECTIONS:  # each section alone: no tail header nor another file's lines
            first, here = snap[section].splitlines()[0], local[section].splitlines()[0]
            assert "==>" not in snap[section] and len(first.split()) == len(here.split())
            if section != "softnet":  # softnet_stat has no header: its first line is counters, which move
                assert first == here


def test_the_facts_are_asked_once_per_run_and_a_new_interface_read_with_the_counters(tmp_path):
    write(tmp_path, rx=0)
    fake_sysfs(tmp_path)
    tool = tmp_path / "bin/ethtool"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\necho 'NIC statistics:'\necho \"     rx_packets: $(cat {tmp_path}/rx)\"\n")
    tool.chmod(0o755)
    (tmp_path / "rx").write_text("10\n")
    host = ShellHost(tmp_path, path=f"{tool.parent}:/usr/bin:/bin")
    before = nc.snapshot(host)
    assert before["kind"] == EXPECTED and before["irqs"]["eth0"] == ["24", "25"]
    assert before["ethtool"] == {"eth0": {"rx_packets": 10}}  # eth0 alone has a device
    write(tmp_path, rx=4096)  # (makes lo again: removed below)
    (tmp_path / "rx").write_text("60\n")
    # a veth made during the run, lo gone: its kind comes with the counters, no facts asked again
    veth = tmp_path / "sys/class/net/veth9"
    veth.mkdir()
    for name, value in (("type", "1"), ("ifindex", "9"), ("iflink", "8"), ("uevent", "INTERFACE=veth9")):
        (veth / name).write_text(value + "\n")
    shutil.rmtree(tmp_path / "sys/class/net/lo")
    after = nc.snapshot(host)
    assert host.asked(nc.FACTS_SCRIPT) == 1 and host.asked(nc.COUNTERS_SCRIPT) == 2
    assert after["kind"] == {**{n: k for n, k in EXPECTED.items() if n != "lo"},
                             "veth9": "virtual pair (veth or similar)"}
    assert set(after["irqs"]) == set(after["speed"]) == set(after["kind"])
    w = nc.window(before, after)
    assert w["interfaces"]["eth0"]["rx_bytes"] == 4096 and w["ethtool"] == {"rx_packets": 50}


def test_a_host_that_forgets_asks_for_the_facts_again(tmp_path):
    write(tmp_path)
    fake_sysfs(tmp_path)
    host = ShellHost(tmp_path)
    nc.snapshot(host)
    host.forget_answers()  # a new connection: the host may have changed
    nc.snapshot(host)
    assert host.asked(nc.FACTS_SCRIPT) == 2
