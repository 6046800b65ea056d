"""The overhead study's netns link: a plain veth pair when no delay or rate is asked, netem otherwise."""

import os
import subprocess

import pytest

from nvmflab.topology import netns

pytestmark = pytest.mark.skipif(netns.unavailable() is not None, reason=f"netns: {netns.unavailable()}")


def qdiscs(dev: str) -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", dev], capture_output=True, text=True, timeout=10).stdout


def test_no_delay_and_no_rate_is_a_plain_veth_without_a_qdisc():
    with netns.EmulatedLink(0, None) as link:
        assert link.emulation.startswith("plain veth")
        assert "netem" not in qdiscs(link.host_if)
        shown = subprocess.run(["ip", "-br", "addr", "show", "dev", link.host_if], capture_output=True, text=True,
                               timeout=10).stdout
        assert f"{link.host_ip}/24" in shown and link.host_ip != netns.addresses(os.getpid() + 1)[0]
    assert link.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_delay_puts_netem_on_both_ends_where_the_kernel_has_it():
    with netns.EmulatedLink(200, None) as link:
        if link.emulation.startswith("none"):
            pytest.skip(f"sch_netem not available here: {link.emulation}")
        assert link.emulation == "netem delay 200us" and "netem" in qdiscs(link.host_if)
