"""Network counters per point (issue 24 item 4) against a fake /proc and /sys tree."""

import json

import pytest

from nvmflab import netcounters as nc
from nvmflab import probes

DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: {lo} 100 0 0 0 0 0 0 {lo} 100 0 0 0 0 0 0
  eth0: {rx} 1000 {errs} {drop} 0 0 0 0 {tx} 900 0 0 0 0 0 0
"""
SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 10 10 0 0 1 500 600 {retrans} 0 0 0
"""
INTERRUPTS = """           CPU0       CPU1
  24:   {a}   {b}   PCI-MSI 524288-edge      eth0-TxRx-0
  25:   {c}   0   PCI-MSI 524289-edge      eth0-TxRx-1
  30:   7   7   PCI-MSI 1-edge      nvme0q0
"""


def softnet(rows):
    # 15 columns as Linux 6.x prints them: processed, dropped, time_squeeze, ..., cpu at index 12
    return "".join(" ".join([f"{p:08x}", f"{d:08x}", f"{s:08x}"] + ["00000000"] * 9 + [f"{cpu:08x}", "00000000", "00000000"]) + "\n"
                   for cpu, (p, d, s) in rows.items())


def write(root, lo=0, rx=0, tx=0, errs=0, drop=0, retrans=0, irq=(0, 0, 0), sn=None, speed="10000", msi=True):
    (root / "proc/net").mkdir(parents=True, exist_ok=True)
    (root / "proc/net/dev").write_text(DEV.format(lo=lo, rx=rx, tx=tx, errs=errs, drop=drop))
    (root / "proc/net/snmp").write_text(SNMP.format(retrans=retrans))
    (root / "proc/interrupts").write_text(INTERRUPTS.format(a=irq[0], b=irq[1], c=irq[2]))
    (root / "proc/net/softnet_stat").write_text(softnet(sn or {0: (0, 0, 0), 2: (0, 0, 0)}))
    for name, sp in (("lo", None), ("eth0", speed)):
        d = root / "sys/class/net" / name
        d.mkdir(parents=True, exist_ok=True)
        if sp is not None:
            (d / "speed").write_text(sp + "\n")
    if msi:
        m = root / "sys/class/net/eth0/device/msi_irqs"
        m.mkdir(parents=True, exist_ok=True)
        for irq in ("24", "25"):
            (m / irq).write_text("msi\n")


def test_window_counts_what_the_network_did(tmp_path):
    write(tmp_path, lo=1000, rx=10_000, tx=20_000, irq=(5, 1, 2), retrans=40,
          sn={0: (100, 1, 2), 2: (50, 0, 0)})
    before = nc.collect_local(tmp_path)
    write(tmp_path, lo=1500, rx=10_000 + 1_250_000_000, tx=20_000 + 10_000, errs=2, drop=3, irq=(105, 1, 52),
          retrans=47, sn={0: (1100, 4, 12), 2: (150, 0, 1)})
    after = nc.collect_local(tmp_path)
    after["t"] = before["t"] + 2.0  # a two-second point
    w = nc.window(before, after)
    assert w["data_interface"] == "eth0"
    eth = w["interfaces"]["eth0"]
    assert eth["rx_bytes"] == 1_250_000_000 and eth["tx_bytes"] == 10_000
    assert eth["rx_errs"] == 2 and eth["rx_drop"] == 3 and eth["speed_mbps"] == 10000
    # 1.25 GB in 2 s = 5 Gbit/s on a 10 Gbit/s link.
    assert eth["util_pct"] == pytest.approx(50.0)
    assert w["interfaces"]["lo"]["util_pct"] is None  # no speed: no utilisation
    assert w["softnet"] == {"0": {"processed": 1000, "dropped": 3, "time_squeeze": 10},
                            "2": {"processed": 100, "dropped": 0, "time_squeeze": 1}}
    assert w["interrupts"] == {"0": 150, "1": 0} and sorted(w["data_irqs"]) == ["24", "25"]
    assert w["tcp_retrans"] == 7
    cols = nc.summarize({"local": w})
    assert cols["net_rx_bytes"] == 1_250_000_000 and cols["net_drops"] == 3 and cols["net_errors"] == 2
    assert cols["tcp_retrans"] == 7 and cols["softnet_squeeze"] == 11 and cols["softnet_dropped"] == 3
    assert cols["net_irqs"] == 150 and cols["link_util_pct"] == pytest.approx(50.0)
    assert json.loads(cols["net_json"])["local"]["data_interface"] == "eth0"


def test_irqs_found_by_name_without_msi_and_old_softnet_rows(tmp_path):
    write(tmp_path, rx=0, irq=(0, 0, 0), msi=False, speed="-1")
    (tmp_path / "proc/net/softnet_stat").write_text("00000010 00000000 00000001\n00000020 00000000 00000000\n")
    before = nc.collect_local(tmp_path)
    write(tmp_path, rx=1000, irq=(3, 4, 0), msi=False, speed="-1")
    (tmp_path / "proc/net/softnet_stat").write_text("00000011 00000000 00000002\n00000030 00000000 00000000\n")
    w = nc.window(before, nc.collect_local(tmp_path))
    assert w["data_irqs"] == ["24", "25"] and w["interrupts"] == {"0": 3, "1": 4}
    assert w["softnet"]["0"]["time_squeeze"] == 1 and w["softnet"]["1"]["processed"] == 16
    assert w["interfaces"]["eth0"]["util_pct"] is None  # speed -1: unknown
    assert nc.summarize({"local": w})["link_util_pct"] is None


def tail_text(snap):
    """The four /proc files as COUNTERS_SCRIPT's `tail -n +1` prints them."""
    return "\n".join(f"==> /{nc.FILES[s]} <==\n{snap[s]}" for s in nc.SECTIONS)


def test_remote_script_output_parses_like_the_local_read(tmp_path):
    write(tmp_path, lo=7, rx=9, tx=11, retrans=3)
    local = nc.collect_local(tmp_path)
    text = tail_text(local) + "=== speed eth0 10000\n=== irqs eth0 24 25 \n=== speed lo -\n=== irqs lo \n"
    remote = nc.parse_remote(text)
    assert remote["speed"] == {"eth0": 10000, "lo": None} and remote["irqs"] == {"eth0": ["24", "25"], "lo": []}
    for section in nc.SECTIONS:  # tail's blank line between two files is not part of either
        assert remote[section] == local[section].rstrip("\n"), section
    assert nc.parse_dev(remote["dev"]) == nc.parse_dev(local["dev"])
    assert nc.parse_retrans(remote["snmp"]) == 3
    assert nc.parse_softnet(remote["softnet"]) == nc.parse_softnet(local["softnet"])


def test_unreadable_machine_gives_no_columns():
    assert nc.summarize({"local": None}) == {}
    assert nc.window(None, {"t": 0}) is None


def test_probes_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NVMFLAB_NET_ROOT", str(tmp_path))
    monkeypatch.setenv("NVMFLAB_POWERCAP_ROOT", str(tmp_path / "no-powercap"))
    write(tmp_path, rx=0, retrans=1)
    before = probes.take({"local": (None, None)})
    write(tmp_path, rx=4096, retrans=4)
    cols = probes.columns(before, probes.take({"local": (None, None)}), 10)
    assert cols["net_rx_bytes"] == 4096 and cols["tcp_retrans"] == 3
    assert cols["energy_pkg_j"] is None and cols["joules_per_io"] is None


def test_report_table_for_network_studies_only(tmp_path):
    from synth_results import repeats, write_results

    from nvmflab.store import ResultsStore

    def with_net(values, retrans):
        net = {"local": {"data_interface": "eth0"}}
        return [{**v, "net_rx_bytes": 2e9, "net_tx_bytes": 1e6, "net_drops": 0, "net_errors": 0,
                 "tcp_retrans": retrans, "softnet_dropped": 0, "softnet_squeeze": 2, "net_irqs": 10,
                 "link_util_pct": 40.0, "net_json": json.dumps(net)} for v in values]

    for study in ("overhead", "transports", "saturation"):  # the issue names transports too
        path = write_results(tmp_path / study, [
            {"knobs": {"iodepth": 1}, "repeats": with_net(repeats([1e3, 1e3]), 5)},
            {"knobs": {"iodepth": 8}, "repeats": with_net(repeats([2e3, 2e3]), 0)}], study=study)
        with ResultsStore(path) as store:
            rows = store.measurements()
        table, finding = probes.network_table(study, rows)
        if study == "saturation":
            assert table is None and finding is None
            continue
        frame = table.frame
        assert list(frame["point"]) == ["iodepth=1", "iodepth=8"]
        assert list(frame["TCP retrans"]) == [5, 0] and list(frame["link util %"]) == [40.0, 40.0]
        assert (frame["rx MB"] == 2000).all() and set(frame["data interface"]) == {"local:eth0"}
        assert "iodepth=1" in finding and "5 TCP retransmits" in finding


def test_results_schema_lists_every_frame_column_in_order():
    from pathlib import Path

    from nvmflab.store import FRAME_COLUMNS

    doc = (Path(__file__).resolve().parents[2] / "docs/results-schema.md").read_text()
    block = doc.split("## `measurements()` DataFrame columns")[1].split("`")[1]
    assert [c.strip() for c in block.replace("\n", " ").split(",")] == FRAME_COLUMNS
    for column in probes.PROBE_NAMES:
        assert f"| {column}" in doc or f", {column}" in doc.split("## `measurements()`")[0], column


def test_ethtool_counters_of_the_data_interface_that_moved(tmp_path):
    write(tmp_path, rx=0)
    local = nc.collect_local(tmp_path)

    def remote_text(snap, stats):
        return tail_text(snap) + "=== speed eth0 10000\n=== irqs eth0 24 25\n=== ethtool eth0\nNIC statistics:\n" + "".join(
            f"     {k}: {v}\n" for k, v in stats.items())

    before = nc.parse_remote(remote_text(local, {"rx_packets": 10, "rx_missed_errors": 0, "tx_queue_0_restart": 1}))
    write(tmp_path, rx=5000)
    after = nc.parse_remote(remote_text(nc.collect_local(tmp_path),
                                        {"rx_packets": 60, "rx_missed_errors": 4, "tx_queue_0_restart": 1}))
    assert before["ethtool"]["eth0"]["rx_packets"] == 10
    w = nc.window(before, after)
    assert w["data_interface"] == "eth0" and w["ethtool"] == {"rx_packets": 50, "rx_missed_errors": 4}
    assert nc.window(nc.collect_local(tmp_path), nc.collect_local(tmp_path))["ethtool"] is None  # no ethtool read
    assert nc.parse_ethtool("NIC statistics:\n     a: 1\n     b.c: 22\n  bad line\n") == {"a": 1, "b.c": 22}


# -- the interface of the leg (issue 37 item 8) ------------------------------------------------------

class _Answers:
    """A host that answers `ip` as a machine with a data NIC eth1 at 10.0.0.2 would."""

    remote = True

    def __init__(self):
        self.asked = []

    def run(self, argv, check=True, timeout=60):
        import subprocess

        self.asked.append(argv)
        out = {"route": "10.0.0.2 dev eth1 src 10.0.0.1 uid 0 \\    cache \n",
               "addr": "3: eth1@if7    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth1\\       valid_lft forever\n"}
        return subprocess.CompletedProcess(argv, 0, out["addr" if "addr" in argv else "route"], "")


def test_link_names_the_interface_each_leg_kind_takes():
    host = _Answers()
    assert nc.link(host, "10.0.0.2", serves_only=False, netns_leg=False) == {
        "interface": "eth1", "kind": "nic", "from": "-o route get 10.0.0.2"}  # a load generator's machine
    assert nc.link(host, "10.0.0.2", serves_only=True, netns_leg=False)["interface"] == "eth1"  # the target's
    assert host.asked[-1] == ["ip", "-o", "addr", "show", "to", "10.0.0.2"]
    assert nc.parse_route_dev("local 127.0.0.1 dev lo src 127.0.0.1 uid 0") == "lo"
    assert nc.parse_route_dev("10.200.1.2 dev nvfh4242 src 10.200.1.1 uid 0") == "nvfh4242"
    assert nc.parse_route_dev("RTNETLINK answers: Network is unreachable") is None
    assert nc.parse_addr_dev("") is None

    class Silent(_Answers):
        def run(self, argv, check=True, timeout=60):
            raise OSError("no ip here")

    assert nc.link(Silent(), "10.0.0.2", serves_only=False, netns_leg=False) is None


def test_window_reads_the_leg_interface_not_the_busiest(tmp_path):
    # another tenant moves 1 GB over eth0 while the leg's own traffic takes lo: lo is the data interface
    write(tmp_path, lo=0, rx=0)
    before = nc.collect_local(tmp_path)
    write(tmp_path, lo=5000, rx=1_000_000_000)
    after = nc.with_link(nc.collect_local(tmp_path), {"interface": "lo", "kind": "loopback",
                                                      "from": "-o route get 127.0.0.1"})
    w = nc.window(before, after)
    assert (w["data_interface"], w["data_interface_kind"]) == ("lo", "loopback")
    cols = nc.summarize({"local": w})
    assert cols["net_rx_bytes"] == 5000 and cols["link_util_pct"] is None
    # a veth reports a nominal speed: no utilisation is made of it
    (tmp_path / "sys/class/net/eth0/speed").write_text("10000\n")
    after = nc.with_link(nc.collect_local(tmp_path), {"interface": "eth0", "kind": "veth", "from": "route"})
    assert nc.window(before, after)["interfaces"]["eth0"]["util_pct"] is None
    # without a route the busiest is taken, and said to be
    w = nc.window(before, nc.collect_local(tmp_path))
    assert w["data_interface"] == "eth0" and w["data_interface_from"].startswith("busiest")
