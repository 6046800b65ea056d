"""The network-counter table names the data interface's kind as sysfs reports it (issue 37):
loopback, physical with its driver, a veth-like pair, a bridge, tun/tap; tested on a fake
/sys/class/net tree, through the remote shell script's output, and into the report table."""

import json
import os
import subprocess

import pytest
from test_netcounters import write

from nvmflab import netcounters as nc
from nvmflab import probes


def fake_sysfs(root):
    """lo, a virtio NIC, a veth (its iflink is its peer's index), a bridge and a tun device."""
    net = root / "sys/class/net"
    driver = root / "sys/bus/virtio/drivers/virtio_net"
    driver.mkdir(parents=True)
    for name, (kind, index, link) in {"lo": ("772", 1, 1), "eth0": ("1", 2, 2), "veth7": ("1", 5, 6),
                                      "br0": ("1", 3, 3), "tun0": ("65534", 4, 4)}.items():
        d = net / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "type").write_text(kind + "\n")
        (d / "ifindex").write_text(f"{index}\n")
        (d / "iflink").write_text(f"{link}\n")
        (d / "uevent").write_text(f"INTERFACE={name}\nIFINDEX={index}\n" + ("DEVTYPE=bridge\n" if name == "br0" else ""))
    (net / "eth0/device").mkdir(exist_ok=True)  # write() may have made it for msi_irqs
    (net / "eth0/device/driver").symlink_to(driver)
    (net / "tun0/tun_flags").write_text("0x1002\n")


EXPECTED = {"lo": "loopback", "eth0": "physical: virtio_net", "veth7": "virtual pair (veth or similar)",
            "br0": "bridge", "tun0": "tun/tap"}


def test_the_kind_of_each_interface_is_read_from_sysfs(tmp_path):
    write(tmp_path)  # /proc files and lo, eth0
    fake_sysfs(tmp_path)
    snap = nc.collect_local(tmp_path)
    assert snap["kind"] == EXPECTED
    (tmp_path / "sys/class/net/eth0/type").unlink()
    assert nc.collect_local(tmp_path)["kind"]["eth0"] == "unknown"  # not read: not guessed


@pytest.mark.parametrize("script, args", [(nc.FACTS_SCRIPT, []),  # once per run
                                          (nc.COUNTERS_SCRIPT, [""])])  # interfaces made since: none kept
def test_the_remote_scripts_report_the_same_kinds(tmp_path, script, args):
    fake_sysfs(tmp_path)
    script = script.replace("/sys/class/net/", f"{tmp_path}/sys/class/net/")
    done = subprocess.run(["sh", "-c", script, "sh", *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert nc.parse_remote(done.stdout)["kind"] == EXPECTED


def test_the_window_and_the_report_table_show_the_data_interface_kind(tmp_path):
    write(tmp_path, rx=0)
    fake_sysfs(tmp_path)
    before = nc.collect_local(tmp_path)
    write(tmp_path, rx=4096)
    w = nc.window(before, nc.collect_local(tmp_path))
    assert w["interfaces"]["eth0"]["kind"] == "physical: virtio_net" and w["interfaces"]["lo"]["kind"] == "loopback"
    from synth_results import repeats, write_results

    from nvmflab.store import ResultsStore

    def with_net(values, window):
        return [{**v, "net_rx_bytes": 1.0, "net_tx_bytes": 1.0, "net_drops": 0, "net_errors": 0, "tcp_retrans": 0,
                 "softnet_dropped": 0, "softnet_squeeze": 0, "net_irqs": 0, "link_util_pct": None,
                 "net_json": json.dumps({"local": window})} for v in values]

    routed = {"data_interface": "nvfh12", "data_interface_kind": "veth", "interfaces": {"nvfh12": {}}}
    path = write_results(tmp_path / "r", [{"knobs": {"iodepth": 1}, "repeats": with_net(repeats([1e3, 1e3]), w)},
                                          {"knobs": {"iodepth": 8}, "repeats": with_net(repeats([1e3, 1e3]), routed)}],
                         study="overhead")
    with ResultsStore(path) as store:
        table, _ = probes.network_table("overhead", store.measurements())
    assert list(table.frame["data interface"]) == ["local:eth0 (physical: virtio_net)", "local:nvfh12 (veth)"]
    assert "kind as /sys/class/net reports it" in table.caption
