"""The two-guest bed's inventories (tests/bed/bed.py): the TOML and the Ansible variant describe the
same two hosts to the harness, down to the ssh options; no guest is booted here."""

from __future__ import annotations

import sys

import pytest

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


OOPS_CONSOLE = ("[    1.769673] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n"
                "[    1.776765] Kernel panic - not syncing: Fatal exception in interrupt\n")


def a_bed_with_scripted_boots(tmp_path, monkeypatch, consoles: dict[str, list[str]]):
    """A Bed whose guests "boot" by writing the next console of CONSOLES[name] and ending, as qemu
    does after a panic (panic=-1, -no-reboot), or staying up once the console says SSHD-READY, or
    when it ends with an oops the kernel lived through ("... (lived)")."""
    import subprocess

    bed = bed_module.Bed(tmp_path)
    bed._booted_from = (tmp_path / "vmlinuz", tmp_path / "initrd", (1, 2))
    started = {g.name: 0 for g in bed.guests}

    def start(guest, kernel, initrd, link_ports):
        guest.console = tmp_path / f"{guest.name}.console.log"
        text = consoles[guest.name][started[guest.name]]
        started[guest.name] += 1
        guest.console.write_text(text)
        stays = "SSHD-READY" in text or text.endswith("(lived)\n")
        guest.qemu = subprocess.Popen(["sleep", "30" if stays else "0"])

    monkeypatch.setattr(bed, "_start", start)
    monkeypatch.setattr(bed, "_wait_ssh", lambda guest: None)
    return bed, started


def boot(bed):
    said = []
    try:
        for guest in bed.guests:
            bed._start(guest, *bed._booted_from)
        bed._wait_up(bed.guests, said.append)
    finally:
        bed.close()
    return said


def test_a_guest_whose_kernel_oopses_while_booting_is_booted_once_more(tmp_path, monkeypatch):
    bed, started = a_bed_with_scripted_boots(tmp_path, monkeypatch, {
        "bed1": [OOPS_CONSOLE, "@@ SSHD-READY bed1\n"], "bed2": ["@@ SSHD-READY bed2\n"]})
    said = boot(bed)
    assert started == {"bed1": 2, "bed2": 1}
    assert any("bed1's kernel oopsed while booting (Oops: int3" in line and "once more" in line for line in said), said
    assert "Kernel panic" in (tmp_path / "bed1.console.boot1.log").read_text()


def test_a_guest_that_lives_through_an_oops_while_booting_is_stopped_and_booted_once_more(tmp_path, monkeypatch):
    lived = "[    2.1] Oops: general protection fault, probably for non-canonical address (lived)\n"
    bed, started = a_bed_with_scripted_boots(tmp_path, monkeypatch, {
        "bed1": ["@@ SSHD-READY bed1\n"], "bed2": [lived, "@@ SSHD-READY bed2\n"]})
    first = []
    real_start = bed._start

    def start(guest, *args):
        real_start(guest, *args)
        first.append(guest.qemu)

    monkeypatch.setattr(bed, "_start", start)
    said = boot(bed)
    assert started == {"bed1": 1, "bed2": 2}
    assert first[1].returncode is not None and first[1].returncode != 0, "the oopsed guest's qemu was killed"
    assert any("bed2's kernel oopsed while booting (Oops: general protection fault" in line for line in said), said


def test_a_second_oops_or_a_failing_init_ends_the_bed(tmp_path, monkeypatch):
    bed, started = a_bed_with_scripted_boots(tmp_path / "twice", monkeypatch, {
        "bed1": [OOPS_CONSOLE, OOPS_CONSOLE, "@@ SSHD-READY bed1\n"], "bed2": ["@@ SSHD-READY bed2\n"]})
    with pytest.raises(bed_module.BedError, match="bed1 did not come up: .*Kernel panic"):
        boot(bed)
    assert started["bed1"] == 2

    bed, started = a_bed_with_scripted_boots(tmp_path / "init", monkeypatch, {
        "bed1": ["@@ FAIL sshd did not start\n", "@@ SSHD-READY bed1\n"], "bed2": ["@@ SSHD-READY bed2\n"]})
    with pytest.raises(bed_module.BedError, match="bed1 did not come up: @@ FAIL sshd"):
        boot(bed)
    assert started["bed1"] == 1
