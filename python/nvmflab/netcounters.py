"""The network's own counters around a point, on every machine it ran on (issue 24 item 4).

Read before and after the load generators, like /proc/stat for the noise (sysstat.py):

- `/proc/net/dev`: bytes, packets, drops and errors per interface, each direction;
- `/proc/net/softnet_stat`: per core, packets processed by the receive path, packets dropped
  (backlog full) and `time_squeeze` (the softirq ran out of budget with work left); the core is the
  row's CPU column where the kernel prints it (5.10 and later), else the row's position;
- `/proc/interrupts`: per core, the interrupts of the data interface's device (its MSI vectors,
  `/sys/class/net/IF/device/msi_irqs`, else the lines naming the interface);
- TCP retransmitted segments: `RetransSegs` of `/proc/net/snmp`, the counter `nstat` reports as
  `TcpRetransSegs`;
- `ethtool -S` of the data interface where ethtool and the driver answer (the counters that moved);
- the link's speed (`/sys/class/net/IF/speed`, Mb/s; virtual links have none) and from it the link
  utilisation of the data interface: the busier direction's bits over speed × seconds.

The data interface is the one the point's traffic takes (`link`, issue 37 item 8): on the machine
of a load generator the interface `ip route get TARGET` names (loopback: `lo`; a netns leg: the
leg's own veth; SSH hosts: the NIC toward the data address), on a machine that only serves the
target the interface holding the target's address. It is recorded per machine with its kind
(loopback, veth or nic) and where it came from; a veth or `lo` has no line rate (a veth reports a
nominal 10 Gb/s), so no link utilisation is given for them. Only where the route cannot be read is
the busiest interface taken, and then named as such: on a shared machine that may be another
tenant's traffic. A locally read machine reads the files; an SSH host answers one shell command per
snapshot (COUNTERS_SCRIPT), and once per run another for what its interfaces are (FACTS_SCRIPT).
NVMFLAB_NET_ROOT prefixes /proc and /sys (tests use a fake tree).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

SECTIONS = ("dev", "softnet", "interrupts", "snmp")
FILES = {"dev": "proc/net/dev", "softnet": "proc/net/softnet_stat", "interrupts": "proc/interrupts",
         "snmp": "proc/net/snmp"}

# What an interface is and which MSI vectors its device has cannot change during a run: read once per
# host and run (Host.ask) by FACTS_SCRIPT; the counters and each link's speed (a link can go down) by
# COUNTERS_SCRIPT at every snapshot. Every process an emulated guest's shell starts costs tens of
# milliseconds, so both use only the shell's builtins per interface (read, cd -P, globs, case).

# facts IF: "=== irqs IF V..." (its MSI vectors) and "=== kind IF type driver DEVTYPE tun ifindex iflink"
# (interface_kind's arguments, "-" where absent; driver "?": a device, its driver unread).
_FACTS_FUNCTION = (
    'facts() { p=/sys/class/net/${1##*/}; [ -e "$p" ] || return 0; '
    'q=; for w in "$p"/device/msi_irqs/*; do [ -e "$w" ] && q="$q ${w##*/}"; done; echo "=== irqs ${p##*/}$q"; '
    'd=-; if [ -e "$p/device" ]; then d=?; cd -P "$p/device/driver" 2>/dev/null && d=${PWD##*/}; cd /; fi; '
    't=; x=; f=; read -r t 2>/dev/null < "$p/type"; read -r x 2>/dev/null < "$p/ifindex"; '
    'read -r f 2>/dev/null < "$p/iflink"; '
    'e=; while IFS= read -r w; do case $w in DEVTYPE=*) e=${w#DEVTYPE=}; break;; esac; done 2>/dev/null < "$p/uevent"; '
    'u=-; [ -e "$p/tun_flags" ] && u=tun; echo "=== kind ${p##*/} ${t:--} ${d:-?} ${e:--} $u ${x:--} ${f:--}"; }; '
)

# The facts of the interfaces named as arguments (else of all), then where ethtool is ("=== tool ethtool PATH").
FACTS_SCRIPT = _FACTS_FUNCTION + (
    '[ $# -gt 0 ] || set -- /sys/class/net/*; for i; do facts "$i"; done; '
    'printf "=== tool ethtool "; command -v ethtool || echo'
)

# $1: the path FACTS_SCRIPT found for ethtool ("" for none); then the interfaces whose facts are kept.
# The four /proc files in one process (tail's "==> FILE <==" headers split them), each interface's
# speed, the facts of an interface made since (not among the kept), `ethtool -S` of each device's.
COUNTERS_SCRIPT = _FACTS_FUNCTION + (
    'tail -n +1 /proc/net/dev /proc/net/softnet_stat /proc/interrupts /proc/net/snmp 2>/dev/null; '
    'tool=$1; shift; kept=" $* "; '
    'for i in /sys/class/net/*; do n=${i##*/}; s=; read -r s 2>/dev/null < "$i/speed"; echo "=== speed $n ${s:--}"; '
    'case $kept in *" $n "*) ;; *) facts "$i";; esac; done; '
    '[ -n "$tool" ] && for i in /sys/class/net/*; do [ -e "$i/device" ] || continue; '
    'echo "=== ethtool ${i##*/}"; "$tool" -S "${i##*/}" 2>/dev/null; done; true'
)


def _root() -> Path:
    return Path(os.environ.get("NVMFLAB_NET_ROOT", "/"))


def _speed(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def collect_local(root: Path | None = None) -> dict[str, Any]:
    """The raw texts and per-interface facts of this machine (or of a fake tree under root)."""
    root = Path(root) if root is not None else _root()
    out: dict[str, Any] = {"t": time.monotonic(), "speed": {}, "irqs": {}, "ethtool": {}, "kind": {}}
    for section, rel in FILES.items():
        try:
            out[section] = (root / rel).read_text()
        except OSError:
            out[section] = ""
    net = root / "sys/class/net"
    try:
        interfaces = sorted(p.name for p in net.iterdir())
    except OSError:
        interfaces = []
    for name in interfaces:
        try:
            out["speed"][name] = _speed((net / name / "speed").read_text())
        except OSError:
            out["speed"][name] = None
        try:
            out["irqs"][name] = sorted(p.name for p in (net / name / "device" / "msi_irqs").iterdir())
        except OSError:
            out["irqs"][name] = []
        out["kind"][name] = interface_kind(_sysfs_facts(net / name))
        if (net / name / "device").exists() and str(root) == "/":
            out["ethtool"][name] = _ethtool(name)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _sysfs_facts(path: Path) -> dict[str, str | None]:
    """What /sys/class/net/IF says of the interface's kind (interface_kind's arguments)."""
    driver = None
    if (path / "device").exists():
        try:
            driver = os.path.basename(os.readlink(path / "device" / "driver")) or "-"
        except OSError:
            driver = "-"
    uevent = _read(path / "uevent") or ""
    devtype = next((line.split("=", 1)[1] for line in uevent.splitlines() if line.startswith("DEVTYPE=")), None)
    return {"type": _read(path / "type"), "driver": driver, "devtype": devtype,
            "tun": "tun" if (path / "tun_flags").exists() else None,
            "ifindex": _read(path / "ifindex"), "iflink": _read(path / "iflink")}


def interface_kind(facts: dict[str, str | None]) -> str:
    """The interface's kind from sysfs: loopback (type 772), the DEVTYPE the kernel gives (bridge,
    vlan, bond, wlan, …), tun/tap, physical with its driver (a device link: on a VM a virtual NIC such
    as virtio_net counts here, its driver says so), a virtual pair (its iflink names another
    interface: a veth or similar), virtual, or unknown where sysfs did not answer. A driver of "-" is
    a device link without a readable driver."""
    kind_type = facts.get("type")
    if kind_type is None or kind_type == "-":
        return "unknown"
    if kind_type == "772":
        return "loopback"
    if facts.get("devtype") not in (None, "-"):
        return str(facts["devtype"])
    if facts.get("tun") not in (None, "-"):
        return "tun/tap"
    driver = facts.get("driver")
    if driver not in (None, ""):
        return "physical" if driver == "-" else f"physical: {driver}"
    index, peer = facts.get("ifindex"), facts.get("iflink")
    if index not in (None, "-") and peer not in (None, "-") and index != peer:
        return "virtual pair (veth or similar)"
    return "virtual"


def _ethtool(name: str) -> dict[str, int]:
    """`ethtool -S` of a device's interface where ethtool exists and the driver answers; {} otherwise."""
    import shutil
    import subprocess

    tool = shutil.which("ethtool") or shutil.which("ethtool", path="/usr/sbin:/sbin")
    if not tool:
        return {}
    try:
        done = subprocess.run([tool, "-S", name], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_ethtool(done.stdout) if done.returncode == 0 else {}


def parse_ethtool(text: str) -> dict[str, int]:
    """`ethtool -S` output ('     rx_packets: 123') as counter → value."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        if sep and name and value.strip().lstrip("-").isdigit():
            out[name.strip()] = int(value)
    return out


def _tail_section(line: str) -> str | None:
    """The section of a tail header ('==> /proc/net/dev <=='), None for another line."""
    if not (line.startswith("==> ") and line.endswith(" <==")):
        return None
    path = line[4:-4]
    return next((s for s, rel in FILES.items() if path.endswith("/" + rel)), "")


def parse_remote(text: str) -> dict[str, Any]:
    """FACTS_SCRIPT's or COUNTERS_SCRIPT's output (or both) in collect_local's form: the /proc files
    as tail's sections, the rest as "=== WHAT IF ..." lines ("=== ethtool IF" opens a section)."""
    out: dict[str, Any] = {"t": time.monotonic(), "speed": {}, "irqs": {}, "ethtool": {}, "kind": {},
                           **{s: "" for s in SECTIONS}}
    current = None
    tools: dict[str, str] = {}
    lines: dict[str, list[str]] = {s: [] for s in SECTIONS}
    for line in text.splitlines():
        section = _tail_section(line)
        if section is not None:
            if current in lines and lines[current] and lines[current][-1] == "":
                lines[current].pop()  # the blank line tail writes before the next file's header
            current = section or None
            continue
        if line.startswith("=== "):
            parts = line[4:].split()
            current = None
            if len(parts) >= 2 and parts[0] == "ethtool":
                current = "ethtool:" + parts[1]
                lines[current] = []
            elif len(parts) >= 2 and parts[0] == "speed":
                out["speed"][parts[1]] = _speed(parts[2] if len(parts) > 2 else None)
            elif len(parts) >= 2 and parts[0] == "tool":  # FACTS_SCRIPT's path of a tool ("": none)
                tools[parts[1]] = parts[2] if len(parts) > 2 else ""
            elif len(parts) >= 2 and parts[0] == "irqs":
                out["irqs"][parts[1]] = sorted(parts[2:])
            elif len(parts) == 8 and parts[0] == "kind":
                names = ("type", "driver", "devtype", "tun", "ifindex", "iflink")
                facts = {k: (None if v == "-" else v) for k, v in zip(names, parts[2:])}
                facts["driver"] = "-" if parts[3] == "?" else facts["driver"]  # a device, its driver unread
                out["kind"][parts[1]] = interface_kind(facts)
            continue
        if current:
            lines[current].append(line)
    for section in SECTIONS:
        out[section] = "\n".join(lines[section])
    for section, body in lines.items():
        if section.startswith("ethtool:"):
            out["ethtool"][section.split(":", 1)[1]] = parse_ethtool("\n".join(body))
    if tools:
        out["tools"] = tools
    return out


# -- the interface a point's traffic takes ---------------------------------------------------------

LINK_KINDS = ("loopback", "veth", "nic")


def link(host: Any, address: str, serves_only: bool, netns_leg: bool) -> dict[str, str] | None:
    """{"interface", "kind", "from"} of the machine `host` for traffic to the target's `address`:
    the route's device (`ip -o route get`), or on a machine that only serves the target the device
    holding the address (`ip -o addr show to`); None when `ip` cannot say."""
    argv = ["ip", "-o", "addr", "show", "to", address] if serves_only else ["ip", "-o", "route", "get", address]
    try:
        done = host.run(argv, check=False, timeout=10)
    except Exception:  # a host that cannot answer costs the interface, never the point
        return None
    name = parse_addr_dev(done.stdout) if serves_only else parse_route_dev(done.stdout)
    if not name:
        return None
    kind = "loopback" if name == "lo" else "veth" if netns_leg else "nic"
    return {"interface": name, "kind": kind, "from": " ".join(argv[1:])}


def parse_route_dev(text: str) -> str | None:
    """The device of `ip -o route get ADDR` ('local 127.0.0.1 dev lo src ...')."""
    words = (text or "").split()
    return words[words.index("dev") + 1] if "dev" in words[:-1] else None


def parse_addr_dev(text: str) -> str | None:
    """The device of the first line of `ip -o addr show to ADDR` ('3: eth1    inet 10.0.0.2/24 ...');
    a VLAN or veth peer suffix ('eth1@if5') is not part of the name /proc/net/dev shows."""
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].endswith(":"):
            return fields[1].split("@", 1)[0]
    return None


# A point without a target (a local job on a file) sends nothing over the network.
NO_NETWORK = {"interface": None, "kind": "none", "from": "no target: the point uses no network"}


def with_link(snap: dict[str, Any] | None, found: dict[str, str] | None) -> dict[str, Any] | None:
    """The snapshot carrying the interface the point's traffic took on its machine (read by window)."""
    if snap is not None and found is not None:
        snap["link"] = found
    return snap


def snapshot(host: Any = None) -> dict[str, Any] | None:
    """Counters of the machine `host` runs on; None when they cannot be read (never fails a point)."""
    if host is not None and getattr(host, "remote", False):
        try:
            facts = parse_remote(host.ask(["sh", "-c", FACTS_SCRIPT], timeout=15).stdout or "")
            ethtool = facts.get("tools", {}).get("ethtool", "")
            done = host.run(["sh", "-c", COUNTERS_SCRIPT, "sh", ethtool, *sorted(facts["kind"])], check=False,
                            timeout=15)
        except Exception:  # an unreachable host costs the counters, not the point
            return None
        snap = parse_remote(done.stdout or "")
        # as collect_local: the interfaces present now (each has a speed line), kept facts or new ones
        snap["kind"] = {n: snap["kind"].get(n, facts["kind"].get(n, "unknown")) for n in snap["speed"]}
        snap["irqs"] = {n: snap["irqs"].get(n, facts["irqs"].get(n, [])) for n in snap["speed"]}
        return snap
    return collect_local()


# -- parsers ---------------------------------------------------------------------------------------

DEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame", "rx_compressed",
              "rx_multicast", "tx_bytes", "tx_packets", "tx_errs", "tx_drop", "tx_fifo", "tx_colls",
              "tx_carrier", "tx_compressed")


def parse_dev(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        if ":" not in line or "|" in line:
            continue
        name, _, rest = line.partition(":")
        values = rest.split()
        if len(values) < len(DEV_FIELDS):
            continue
        try:
            out[name.strip()] = {f: int(v) for f, v in zip(DEV_FIELDS, values)}
        except ValueError:
            continue
    return out


def parse_softnet(text: str) -> dict[int, dict[str, int]]:
    out = {}
    for index, line in enumerate(l for l in text.splitlines() if l.strip()):
        cols = line.split()
        try:
            values = [int(c, 16) for c in cols]
        except ValueError:
            continue
        if len(values) < 3:
            continue
        cpu = values[12] if len(values) >= 13 else index
        out[cpu] = {"processed": values[0], "dropped": values[1], "time_squeeze": values[2]}
    return out


def parse_interrupts(text: str) -> tuple[list[int], dict[str, dict[str, Any]]]:
    """(cpu numbers, irq → {"counts": [per cpu], "desc": text})."""
    lines = text.splitlines()
    if not lines:
        return [], {}
    cpus = [int(c[3:]) for c in lines[0].split() if c.startswith("CPU") and c[3:].isdigit()]
    out = {}
    for line in lines[1:]:
        irq, _, rest = line.partition(":")
        fields = rest.split()
        counts = []
        for f in fields[:len(cpus)]:
            if not f.isdigit():
                break
            counts.append(int(f))
        if not counts:
            continue
        out[irq.strip()] = {"counts": counts, "desc": " ".join(fields[len(counts):])}
    return cpus, out


def parse_retrans(text: str) -> int | None:
    """Tcp RetransSegs of /proc/net/snmp (nstat's TcpRetransSegs)."""
    header = None
    for line in text.splitlines():
        if not line.startswith("Tcp:"):
            continue
        fields = line.split()[1:]
        if header is None:
            header = fields
            continue
        values = dict(zip(header, fields))
        try:
            return int(values["RetransSegs"])
        except (KeyError, ValueError):
            return None
    return None


def _irqs_of(interface: str, snap: dict[str, Any], table: dict[str, dict[str, Any]]) -> list[str]:
    msi = [i for i in snap.get("irqs", {}).get(interface, []) if i in table]
    if msi:
        return msi
    return [irq for irq, row in table.items() if interface and interface in row["desc"].split()
            or any(word.startswith(interface + "-") for word in row["desc"].split())]


def window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the network did on one machine between two snapshots."""
    if not before or not after:
        return None
    wall = max(1e-9, float(after["t"]) - float(before["t"]))
    dev_b, dev_a = parse_dev(before["dev"]), parse_dev(after["dev"])
    interfaces = {}
    for name, end in dev_a.items():
        start = dev_b.get(name)
        if not start:
            continue
        d = {f: end[f] - start[f] for f in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_drop",
                                            "tx_drop", "rx_errs", "tx_errs")}
        speed = after.get("speed", {}).get(name)
        d["speed_mbps"] = speed
        d["kind"] = (after.get("kind") or {}).get(name)  # from sysfs (interface_kind); None in older snapshots
        d["util_pct"] = (100.0 * max(d["rx_bytes"], d["tx_bytes"]) * 8 / (speed * 1e6 * wall)
                         if speed else None)
        interfaces[name] = d
    found = after.get("link") or before.get("link")
    if found and found["interface"] is None:  # NO_NETWORK
        data, data_from, data_kind = None, found["from"], found["kind"]
    elif found:  # the interface the point's traffic took (link); lo and a veth have no line rate
        data, data_from, data_kind = found["interface"], found.get("from", "route"), found.get("kind")
        if data in interfaces and data_kind in ("loopback", "veth"):
            interfaces[data]["util_pct"] = None
    else:
        data = max(interfaces, key=lambda n: interfaces[n]["rx_bytes"] + interfaces[n]["tx_bytes"]) \
            if interfaces else None
        data_from, data_kind = "busiest interface (route unknown)", None
    sn_b, sn_a = parse_softnet(before["softnet"]), parse_softnet(after["softnet"])
    softnet = {cpu: {k: end[k] - sn_b[cpu][k] for k in end} for cpu, end in sn_a.items() if cpu in sn_b}
    cpus, irq_b = parse_interrupts(before["interrupts"])
    cpus_a, irq_a = parse_interrupts(after["interrupts"])
    interrupts: dict[int, int] = {}
    irqs = _irqs_of(data, after, irq_a) if data else []
    for irq in irqs:
        if irq not in irq_b:
            continue
        for cpu, end, start in zip(cpus_a, irq_a[irq]["counts"], irq_b[irq]["counts"]):
            interrupts[cpu] = interrupts.get(cpu, 0) + end - start
    rb, ra = parse_retrans(before["snmp"]), parse_retrans(after["snmp"])
    eb, ea = (before.get("ethtool") or {}).get(data, {}), (after.get("ethtool") or {}).get(data, {})
    ethtool = {k: v - eb[k] for k, v in ea.items() if k in eb and v != eb[k]}
    return {
        "ethtool": ethtool if ea else None,  # the data interface's `ethtool -S` counters that moved
        "wall_s": wall, "interfaces": interfaces, "data_interface": data, "data_interface_kind": data_kind,
        "data_interface_from": data_from,
        "softnet": {str(c): v for c, v in sorted(softnet.items())},
        "data_irqs": irqs, "interrupts": {str(c): v for c, v in sorted(interrupts.items())},
        "tcp_retrans": None if rb is None or ra is None else ra - rb,
    }


COLUMNS = ["net_rx_bytes", "net_tx_bytes", "net_drops", "net_errors", "tcp_retrans", "softnet_dropped",
           "softnet_squeeze", "net_irqs", "link_util_pct", "net_json"]


def summarize(windows: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """A point's columns from every machine's window: bytes of the data interfaces, drops and errors
    of every interface, TCP retransmits, softnet drops and squeezes, the data interfaces' interrupts,
    the highest link utilisation where a speed is known; net_json keeps the detail per machine."""
    read = {k: w for k, w in windows.items() if w}
    if not read:
        return {}

    def total(get) -> int:
        return sum(get(w) for w in read.values())

    def data_if(w):
        return w["interfaces"].get(w["data_interface"], {}) if w["data_interface"] else {}

    utils = [data_if(w).get("util_pct") for w in read.values() if data_if(w).get("util_pct") is not None]
    retrans = [w["tcp_retrans"] for w in read.values()]
    return {
        "net_rx_bytes": total(lambda w: data_if(w).get("rx_bytes", 0)),
        "net_tx_bytes": total(lambda w: data_if(w).get("tx_bytes", 0)),
        "net_drops": total(lambda w: sum(i["rx_drop"] + i["tx_drop"] for i in w["interfaces"].values())),
        "net_errors": total(lambda w: sum(i["rx_errs"] + i["tx_errs"] for i in w["interfaces"].values())),
        "tcp_retrans": None if any(r is None for r in retrans) else sum(retrans),
        "softnet_dropped": total(lambda w: sum(c["dropped"] for c in w["softnet"].values())),
        "softnet_squeeze": total(lambda w: sum(c["time_squeeze"] for c in w["softnet"].values())),
        "net_irqs": total(lambda w: sum(w["interrupts"].values())),
        "link_util_pct": max(utils) if utils else None,
        "net_json": json.dumps(read, sort_keys=True),
    }
