"""SshHost.forward: our target's /stats endpoint on a host's data address is read through the
host's SSH connection, so a data network with no route from the controlling machine (the
two-guest bed of tests/bed, a lab's private link) still gives the target's counters. Found on the
bed: every `ours` point failed reading /stats over an address this machine cannot reach."""

from __future__ import annotations

import secrets
import socket
import time
import urllib.error
import urllib.request

import pytest
import sshbed

from nvmflab.topology.inventory import HostEntry, load_inventory
from nvmflab.topology.ssh import SshHost

# An ssh that logs its argv; as a control master (-N) it makes the control socket's path and waits.
FAKE_SSH = """#!/bin/sh
echo "$*" >>"$FAKE_SSH_LOG"
case " $* " in *" -N "*)
  for a in "$@"; do case "$a" in ControlPath=*) : >"${a#ControlPath=}";; esac; done
  exec sleep 60;;
esac
"""


def test_forward_and_cancel_go_to_the_control_master_with_ipv6_in_brackets(tmp_path, monkeypatch):
    (tmp_path / "ssh").write_text(FAKE_SSH)
    (tmp_path / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    host = SshHost(HostEntry(name="server1", ssh="server1", data_ip="192.168.50.1", port=2222))
    try:
        address, local = host.forward("192.168.50.1", 9100)
        assert address == "127.0.0.1" and host.forward("192.168.50.1", 9100) == (address, local)
        _, local6 = host.forward("fd00::1", 9101)
        host.unforward("192.168.50.1", 9100)
        host.unforward("192.168.50.1", 9100)  # twice: nothing more is asked of ssh
        lines = log.read_text().splitlines()
        mux = [line for line in lines if " -O " in line]
        assert len(mux) == 3, lines
        assert f"-O forward -L 127.0.0.1:{local}:192.168.50.1:9100 -- server1" in mux[0]
        assert f"-O forward -L 127.0.0.1:{local6}:[fd00::1]:9101 -- server1" in mux[1]
        assert f"-O cancel -L 127.0.0.1:{local}:192.168.50.1:9100 -- server1" in mux[2]
        assert all("ControlMaster=no" in line and "-p 2222" in line for line in mux)
    finally:
        host.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if sshbed.unavailable():
        pytest.skip(sshbed.unavailable())
    folder = tmp_path_factory.mktemp("sshbed")
    with sshbed.SshBed(folder, count=1) as bed:
        inventory = folder / "lab.toml"
        inventory.write_text(bed.inventory_toml())
        made = SshHost(load_inventory(inventory)["lab-0"])
        yield made
        made.close()


@pytest.mark.long
def test_a_port_only_the_host_reaches_is_read_through_the_forward_and_closed_after(host, tmp_path):
    # A server on the host's own loopback: this machine's 127.0.0.1 is another one, so only the
    # tunnel reaches it.
    port = host.free_port()
    token = secrets.token_hex(8)
    host.run(["sh", "-c", f"echo {token} >{host.workdir()}/stats"])
    server = host.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory",
                         host.workdir()], None, log=tmp_path / "server.log")
    try:
        address, local = host.forward("127.0.0.1", port)
        assert address == "127.0.0.1"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}:{local}/stats", timeout=5) as response:
                    body = response.read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the forwarded server never answered"
                time.sleep(0.2)
        assert body.strip() == token
        assert host.forward("127.0.0.1", port) == (address, local)  # one forward per endpoint
        host.unforward("127.0.0.1", port)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, local), timeout=5).close()
    finally:
        server.stop()
