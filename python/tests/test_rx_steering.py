"""RPS/RFS steering on a veth pair (issue 22 item 9): the bitmap, the values written to both ends'
receive queue, and that everything is put back."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmflab.topology import netns
from nvmflab.topology.rx_steering import SOCK_FLOW, RxSteering, SteeringError, mask


def test_mask_is_sysfs_hex_words():
    assert mask([0]) == "1" and mask([1, 3]) == "a" and mask([0, 33]) == "2,00000001"
    with pytest.raises(SteeringError):
        mask([-1])


def test_each_mode_writes_both_ends_and_restore_puts_back_what_was_there():
    state = {("ns", "/sys/class/net/t/queues/rx-0/rps_cpus"): "0", ("ns", "/sys/class/net/t/queues/rx-0/rps_flow_cnt"): "0",
             (None, "/sys/class/net/h/queues/rx-0/rps_cpus"): "0", (None, "/sys/class/net/h/queues/rx-0/rps_flow_cnt"): "0",
             (None, str(SOCK_FLOW)): "0"}

    def run(argv):
        netns_name = argv[3] if argv[:3] == ["ip", "netns", "exec"] else None
        argv = argv[4:] if netns_name else argv
        if argv[0] == "cat":
            return state[(netns_name, argv[1])] + "\n"
        state[(netns_name, argv[-1])] = argv[-2]
        return ""

    steering = RxSteering("h", "t", "ns", [0, 1, 2, 3], run=run)
    steering.set("rps", [2])
    assert steering.read() == {"host rps_cpus": "4", "host rps_flow_cnt": "0", "target rps_cpus": "4",
                               "target rps_flow_cnt": "0"}
    assert state[(None, str(SOCK_FLOW))] == "0"  # rps alone leaves the host-wide flow table alone
    steering.set("rfs", [2])
    assert steering.read()["target rps_cpus"] == "f" and steering.read()["target rps_flow_cnt"] == "32768"
    assert state[(None, str(SOCK_FLOW))] == "32768"
    steering.set("off", [2])
    assert set(steering.read().values()) == {"0"} and state[(None, str(SOCK_FLOW))] == "0"
    steering.set("rfs", [])
    steering.restore()
    assert set(state.values()) == {"0"}
    with pytest.raises(SteeringError, match="expected one of off, rps, rfs"):
        steering.set("aRFS", [])


@pytest.mark.skipif(netns.unavailable() is not None, reason="needs root, ip and tc")
def test_on_a_real_veth_pair():
    before = Path(SOCK_FLOW).read_text().strip()
    with netns.EmulatedLink(0, None) as link:
        steering = RxSteering(link.host_if, link.target_if, link.netns, [0, 1])
        try:
            steering.set("rps", [1])
            assert steering.read() == {"host rps_cpus": "2", "host rps_flow_cnt": "0", "target rps_cpus": "2",
                                       "target rps_flow_cnt": "0"}
            steering.set("rfs", [1])
            assert steering.read()["target rps_flow_cnt"] == "32768"
            assert Path(SOCK_FLOW).read_text().strip() == "32768"
        finally:
            steering.restore()
        assert set(steering.read().values()) == {"0"}
    assert Path(SOCK_FLOW).read_text().strip() == before
