"""`nvmflab env --topology` on the two guests (issue 39 item 2): what it reports per host, through
the TOML and the Ansible inventory alike, against what the guests say over plain ssh; then one
host without kernel TLS and one without its rxe device, each named as the reason there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVMFLAB = ROOT / ".venv/bin/nvmflab"
ENV_LIMIT_S = 600  # a few dozen ssh round trips per host, slow on emulated guests


def env_topology(inventory: Path) -> dict[str, dict]:
    done = subprocess.run([str(NVMFLAB), "env", "--topology", str(inventory), "--json"], capture_output=True,
                          text=True, timeout=ENV_LIMIT_S, env=os.environ | {"NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return {r["host"]: r for r in json.loads(done.stdout)}


def truth(bed, name: str) -> dict[str, str]:
    """The guest's own answers, over plain ssh."""
    script = ("echo kernel=$(uname -r); echo nvme=$(nvme version | head -1); "
              "echo tls=$(test -d /sys/module/tls && echo loaded || echo available); "
              "echo tlshd=$(pgrep -x tlshd >/dev/null && echo yes || echo no); echo keyctl=$(command -v keyctl); "
              "echo rdma=$(rdma link show | awk '{print $2, $4}' | tr '\\n' ' ')")
    out = bed.ssh(name, script).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("inventory", ["bed.toml", "bed.yml"])
def test_env_reports_what_the_guests_have(bed, inventory):
    reports = env_topology(bed.work / inventory)
    assert set(reports) == {"bed1", "bed2"}
    for guest in bed.guests:
        r, real = reports[guest.name], truth(bed, guest.name)
        assert "error" not in r, r.get("error")
        assert r["data_ip"] == guest.link_ip and r["nic_driver"] == "virtio_net"
        assert r["kernel"] == real["kernel"] and real["kernel"].startswith("6.12.")
        assert r["tools"]["nvme"]["version"] == real["nvme"] and "2.13" in real["nvme"]
        facts = r["tls"]["facts"]
        assert facts["tls_module"] == real["tls"] and facts["tlshd_running"] == (real["tlshd"] == "yes")
        assert facts["keyctl"] == real["keyctl"] != ""
        assert facts["nvme_tls_keys"] and facts["nvme_connect_tls"]  # 2.13's help exits 1: read its text
        assert r["tls"]["stacks"]["kernel"] == {"target": None, "host": None}
        devices = {d["name"]: d for d in r["rdma"]["devices"]}
        assert list(devices) == ["rxe0"] and real["rdma"].split()[:2] == ["rxe0/1", "ACTIVE"]
        assert "software (rxe)" in r["rdma"]["summary"] and "ACTIVE" in r["rdma"]["summary"]
        assert r["rdma"]["stacks"]["kernel"] == {"target": None, "host": None}


def test_a_host_without_kernel_tls_and_one_without_rxe_are_named(bed):
    # bed1 loses its tls module (unloaded and moved away), bed2 its rxe device; both come back.
    hide_tls = ("m=$(modinfo -F filename tls) && rmmod tls 2>/dev/null; mv \"$m\" /root/tls.ko.away && "
                "echo \"$m\" >/root/tls.path && depmod")
    bed.ssh("bed1", hide_tls)
    bed.ssh("bed2", "rdma link delete rxe0")
    try:
        reports = env_topology(bed.work / "bed.toml")
        tls_kernel = reports["bed1"]["tls"]["stacks"]["kernel"]
        for side in ("target", "host"):
            assert "bed1: no kernel TLS (the tls module is missing" in tls_kernel[side]
        assert reports["bed1"]["tls"]["facts"]["tls_module"] == "missing"
        assert reports["bed2"]["tls"]["stacks"]["kernel"] == {"target": None, "host": None}
        assert reports["bed2"]["rdma"]["devices"] == []
        for stack in ("kernel", "ours"):
            for side in ("target", "host"):
                assert reports["bed2"]["rdma"]["stacks"][stack][side] == "no RDMA device with a port up"
        assert reports["bed1"]["rdma"]["stacks"]["kernel"] == {"target": None, "host": None}
    finally:
        bed.ssh("bed1", "mv /root/tls.ko.away \"$(cat /root/tls.path)\" && depmod", check=False)
        link = bed.ssh("bed2", "ip -br addr | awk '/192.168.77/ {print $1}'").stdout.strip()
        bed.ssh("bed2", f"rdma link add rxe0 type rxe netdev {link}", check=False)
    assert "rxe0" in bed.ssh("bed2", "rdma link show").stdout
