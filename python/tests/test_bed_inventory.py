"""The two-guest bed's inventories (tests/bed/bed.py): the TOML and the Ansible variant describe the
same two hosts to the harness, down to the ssh options; no guest is booted here."""

from __future__ import annotations

import sys

from conftest import REPO

from nvmflab.topology.inventory import load_inventory

sys.path.insert(0, str(REPO / "tests/bed"))
import bed as bed_module  # noqa: E402


def test_toml_and_ansible_inventories_give_the_same_hosts(tmp_path):
    bed = bed_module.Bed(tmp_path)
    toml, yml = bed.write_inventories()
    from_toml, from_yml = load_inventory(toml), load_inventory(yml)
    assert set(from_toml) == set(from_yml) == {"bed1", "bed2"}
    for guest in bed.guests:
        a, b = from_toml[guest.name], from_yml[guest.name]
        assert (a.ssh, a.user, a.port, a.data_ip) == (b.ssh, b.user, b.port, b.data_ip) == \
            ("127.0.0.1", "root", guest.ssh_port, guest.link_ip)
        assert a.ssh_options == b.ssh_options == bed.ssh_options()
    assert from_toml["bed1"].port != from_toml["bed2"].port
    assert {e.data_ip for e in from_toml.values()} == {"192.168.77.1", "192.168.77.2"}
