"""RDMA devices of a host (docs/rdma.md): what `nvmflab env --topology` lists and what planning
checks before a `transport = "rdma"` point.

Three sources, each optional: sysfs (/sys/class/infiniband: every device the kernel has, with each
port's link layer and whether the device is virtual, i.e. software: rxe or siw), `rdma link`
(iproute2: each port's state and the netdev it runs over) and `ibv_devices` (rdma-core: the devices
userspace verbs can open, so a provider library is installed). A device counts when sysfs or
`rdma link` shows it. Every input is parsed with bounds; a line that does not fit is skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..knobs import transport_refusal
from .base import Host, HostError

# One line per port: NAME|PORT|LINK_LAYER|STATE|REAL_PATH|DRIVER|NODE_TYPE. $1 is a root to read
# under ("" on a real host, a fake tree in the tests).
_SYSFS = r"""for d in "$1"/sys/class/infiniband/*; do
  [ -e "$d" ] || continue
  real=$(readlink -f "$d"); drv=$(readlink "$d/device/driver" 2>/dev/null); node=$(cat "$d/node_type" 2>/dev/null)
  for p in "$d"/ports/*; do
    [ -e "$p" ] || continue
    echo "${d##*/}|${p##*/}|$(cat "$p/link_layer" 2>/dev/null)|$(cat "$p/state" 2>/dev/null)|$real|${drv##*/}|$node"
  done
done"""
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_LINK = re.compile(r"^link\s+([A-Za-z0-9_.:-]{1,64})/(\d{1,3})\b(.*)$")
MAX_LINES = 4096


@dataclass
class Port:
    port: int
    link_layer: str | None = None  # Ethernet (RoCE, iWARP) | InfiniBand
    state: str | None = None  # ACTIVE, DOWN, ...
    netdev: str | None = None  # the Ethernet device it runs over (rdma link)


@dataclass
class Device:
    name: str
    ports: list[Port] = field(default_factory=list)
    virtual: bool | None = None  # sysfs puts software devices (rxe, siw) under /sys/devices/virtual
    driver: str | None = None  # the PCI driver of a NIC
    node_type: str | None = None  # "1: CA" (InfiniBand, RoCE) or "4: RNIC" (iWARP)
    verbs: bool | None = None  # listed by ibv_devices; None: ibv_devices did not run

    @property
    def kind(self) -> str:
        """`software (rxe)`, `software (siw)` or `NIC (driver ...)`: Soft-RoCE figures describe a
        software device, not RoCE hardware, and the report says which one measured."""
        software = self.virtual or (self.virtual is None and self.name.startswith(("rxe", "siw")))
        if software:
            iwarp = "RNIC" in (self.node_type or "") or self.name.startswith("siw")
            return f"software ({'siw' if iwarp else 'rxe'})"
        return f"NIC (driver {self.driver})" if self.driver else "NIC"

    def port(self, number: int) -> Port:
        for port in self.ports:
            if port.port == number:
                return port
        self.ports.append(Port(number))
        return self.ports[-1]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "verbs": self.verbs,
                "ports": [dict(vars(p)) for p in sorted(self.ports, key=lambda p: p.port)]}


def parse_sysfs(text: str) -> dict[str, Device]:
    """The sysfs script's lines as devices by name."""
    devices: dict[str, Device] = {}
    for line in text.splitlines()[:MAX_LINES]:
        fields = line.split("|")
        if len(fields) != 7 or not _NAME.match(fields[0]) or not fields[1].isdigit() or len(fields[1]) > 3:
            continue
        name, port, layer, state, real, driver, node = (f.strip()[:200] for f in fields)
        device = devices.setdefault(name, Device(name))
        device.virtual = "/devices/virtual/" in real
        device.driver = driver if _NAME.match(driver or "") else None
        device.node_type = node or None
        entry = device.port(int(port))
        entry.link_layer = layer or None
        # sysfs says "4: ACTIVE"; rdma link says "ACTIVE"
        entry.state = state.split(":", 1)[-1].strip() or None
    return devices


def parse_rdma_link(text: str) -> list[tuple[str, int, dict[str, str]]]:
    """`rdma link show` lines (`link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0`) as
    (device, port, {key: value})."""
    out = []
    for line in text.splitlines()[:MAX_LINES]:
        match = _LINK.match(line.strip())
        if not match:
            continue
        words = match.group(3).split()
        pairs = {k: v[:64] for k, v in zip(words[::2], words[1::2])}
        out.append((match.group(1), int(match.group(2)), pairs))
    return out


def parse_ibv_devices(text: str) -> list[str]:
    """Device names from `ibv_devices` (a header, a dashed line, then `NAME GUID` rows)."""
    names = []
    for line in text.splitlines()[:MAX_LINES]:
        words = line.split()
        if len(words) == 2 and _NAME.match(words[0]) and re.fullmatch(r"[0-9a-fA-F]{16}", words[1]):
            names.append(words[0])
    return names


def merge(sysfs: str, rdma_link: str | None, ibv: str | None) -> list[Device]:
    """One list from the three sources (None: that tool did not run)."""
    devices = parse_sysfs(sysfs)
    for name, port, pairs in parse_rdma_link(rdma_link or ""):
        if not _NAME.match(name):
            continue
        entry = devices.setdefault(name, Device(name)).port(port)
        entry.state = pairs.get("state") or entry.state
        entry.netdev = pairs.get("netdev") if _NAME.match(pairs.get("netdev", "")) else entry.netdev
    if ibv is not None:
        seen = set(parse_ibv_devices(ibv))
        for device in devices.values():
            device.verbs = device.name in seen
    return sorted(devices.values(), key=lambda d: d.name)


# The three sources in one round trip; each section after a marker line, each tool's exit code on
# one (127: not installed). Device names never start with the marker.
_MARK = "@@nvmflab-rdma"
_PROBE = _SYSFS + f"""
echo "{_MARK} rdma"
if command -v rdma >/dev/null; then rdma link show 2>/dev/null; echo "{_MARK} rc $?"; else echo "{_MARK} rc 127"; fi
echo "{_MARK} ibv"
if command -v ibv_devices >/dev/null; then ibv_devices 2>/dev/null; echo "{_MARK} rc $?"; else echo "{_MARK} rc 127"; fi
"""


def split_probe(text: str) -> tuple[str, dict[str, tuple[int | None, str]]]:
    """The probe's output as (sysfs lines, {"rdma" | "ibv": (exit code or None if cut short, output)})."""
    sections: dict[str, list[str]] = {"sysfs": []}
    codes: dict[str, int | None] = {}
    current = "sysfs"
    for line in text.splitlines()[:3 * MAX_LINES]:
        if not line.startswith(_MARK + " "):
            sections[current].append(line)
            continue
        words = line.split()
        if len(words) == 2 and words[1] in ("rdma", "ibv"):
            current = words[1]
            sections[current] = []
        elif len(words) == 3 and words[1] == "rc" and words[2].isdigit() and len(words[2]) <= 3:
            codes[current] = int(words[2])
    return "\n".join(sections["sysfs"]), {name: (codes.get(name), "\n".join(sections[name]))
                                         for name in ("rdma", "ibv") if name in sections}


def probe(host: Host, root: str = "") -> tuple[list[Device], list[str]]:
    """The host's RDMA devices and a note per source that could not be read. One round trip, kept
    for the run (`Host.ask`): the harness changes no RDMA device, and a host it reconnects to is
    asked again."""
    try:
        done = host.ask(["sh", "-c", _PROBE, "sh", root])
    except HostError as err:
        return [], [f"sysfs, rdma link, ibv_devices: {err}"]
    sysfs, tools = split_probe(done.stdout or "")
    notes: list[str] = []
    outputs: dict[str, str | None] = {}
    for name, what in (("rdma", "rdma link"), ("ibv", "ibv_devices")):
        code, text = tools.get(name, (None, ""))
        if code == 127:
            notes.append(f"{what}: not installed")
            outputs[name] = None
        elif code != 0:
            # ibv_devices exits 1 with "No IB devices found" where libibverbs sees none
            outputs[name] = "" if name == "ibv" and code is not None else None
        else:
            outputs[name] = text
    return merge(sysfs, outputs["rdma"], outputs["ibv"]), notes


def summary(devices: list[Device]) -> str:
    """One line: each device with its kind, and each port's link layer, state and netdev."""
    if not devices:
        return "none"
    parts = []
    for device in devices:
        ports = ", ".join(f"port {p.port} {p.link_layer or '?'} {p.state or '?'}" + (f" over {p.netdev}" if p.netdev else "")
                          for p in sorted(device.ports, key=lambda p: p.port))
        verbs = "" if device.verbs is None else ("" if device.verbs else "; not seen by ibv_devices")
        parts.append(f"{device.name}: {device.kind}" + (f" ({ports})" if ports else "") + verbs)
    return "; ".join(parts)


def usable(devices: list[Device]) -> list[Device]:
    """Devices with a port that is up (a software device on a downed netdev carries nothing)."""
    return [d for d in devices if any((p.state or "").upper() == "ACTIVE" for p in d.ports)]


class TransportCheck:
    """Why a point's transport cannot run on its hosts, or None: a knob or target setup that does
    not hold over the transport (the knob registry, `knobs.transport_refusal`, asked first), a host
    with no RDMA device whose port is up, or a stack side without RDMA (`Stack.rdma_unavailable`: a
    build without it, a missing kernel module). Each host and stack side is asked once per check."""

    def __init__(self, runner: Any):
        self.runner = runner  # its hosts are looked at only for a point that is not all tcp
        self._devices: dict[int, str | None] = {}
        self._sides: dict[tuple[int, str, str], str | None] = {}

    def refusal(self, point: Any, target_stack: Any, host_stack: Any) -> str | None:
        wanted = {point.knobs.get("transport", "tcp")} | {j.knobs.get("transport", "tcp") for j in point.jobs}
        if wanted == {"tcp"}:
            return None
        if len(wanted) > 1:
            return f"the target and the load generators name different transports ({', '.join(sorted(wanted))})"
        # knobs and target setup the knob registry says do not hold over this transport (knobs.py:
        # TLS, digests, socket options on every stack; what a stack side ignores), before any probe
        limited = transport_refusal(point, target_stack, host_stack)
        if limited:
            return limited
        hosts = self.runner.hosts
        sides = [(target_stack, "target", hosts.target)] if point.target is not None else []
        sides += [(host_stack, "host", hosts.initiator(job.host)) for job in point.jobs]
        for stack, side, host in sides:
            reason = self._device(host) or self._side(stack, side, host)
            if reason:
                return reason
        return None

    def _device(self, host: Any) -> str | None:
        if id(host) not in self._devices:
            devices, notes = probe(host)
            reason = None
            if not usable(devices):
                seen = f"only {summary(devices)}, no port up" if devices else "none found"
                why = f" ({'; '.join(notes)})" if notes and not devices else ""
                reason = f"{host.name} has no RDMA device: {seen}{why}; see docs/rdma.md for Soft-RoCE"
            self._devices[id(host)] = reason
        return self._devices[id(host)]

    def _side(self, stack: Any, side: str, host: Any) -> str | None:
        key = (id(host), stack.name, side)
        if key not in self._sides:
            self._sides[key] = stack.rdma_unavailable(host, side)
        return self._sides[key]
