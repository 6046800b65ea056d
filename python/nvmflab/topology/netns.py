"""A network namespace joined to this one by a veth pair with `tc netem` on both ends (a rate
alone: `tc tbf`, the rate shaper, which kernels without sch_netem still have).

The target runs inside the namespace at the link's `target_ip`; the host stays outside at its
`host_ip` (a /24 per process, so links of runs at the same time do not collide). Needs root
and `ip`/`tc`; `unavailable()` says why not when it cannot work here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

HOST_IP, TARGET_IP = "10.249.0.1", "10.249.0.2"  # the addresses a plan shows (a link's own differ)


def addresses(pid: int) -> tuple[str, str]:
    """(host, target) addresses of a link made by process `pid`: a /24 of 10.200-249.x per process,
    so the links of runs going on at once on one machine do not take each other's addresses."""
    slot = pid % (50 * 256)
    return f"10.{200 + slot // 256}.{slot % 256}.1", f"10.{200 + slot // 256}.{slot % 256}.2"


class NetnsError(Exception):
    pass


def unavailable() -> str | None:
    """None when a namespace can be built here, else the reason."""
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (install iproute2)"
    return None


# Legacy ethtool ioctls (no ethtool binary needed): ETHTOOL_SGRO and ETHTOOL_STSO take an
# ethtool_value {cmd, data}. GRO is switched off and on so that it is *asked for* (veth starts
# its NAPI only then), and TSO off makes the TCP packets eligible for that NAPI path.
_NAPI_SCRIPT = r"""
import ctypes, fcntl, socket, struct, sys
def set_value(dev, cmd, data):
    value = ctypes.create_string_buffer(struct.pack("II", cmd, data), 8)
    request = struct.pack("16sP", dev.encode()[:15], ctypes.addressof(value)) + bytes(16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), 0x8946, request)
for cmd, data in ((0x2c, 0), (0x2c, 1), (0x1f, 0)):
    set_value(sys.argv[1], cmd, data)
"""


class EmulatedLink:
    """Context manager: namespace + veth + netem; removed again on exit, even after errors.

    With `napi`, both veth ends get GRO asked for and TSO off, so their receive path runs in NAPI
    and sockets on it have a NAPI id (busy polling has a queue to poll); `self.napi` says whether
    that worked and `self.emulation` names it."""

    def __init__(self, delay_us: int, rate: str | None, napi: bool = False, mtu: int | None = None):
        suffix = str(os.getpid())
        self.netns = f"nvmflab-{suffix}"
        self.host_if, self.target_if = f"nvfh{suffix}"[:15], f"nvft{suffix}"[:15]
        self.host_ip, self.target_ip = addresses(os.getpid())
        self.delay_us, self.rate, self.want_napi, self.mtu = delay_us, rate, napi, mtu
        self.emulation = "none"  # what the link really does, stored with every point
        self.napi: bool = False
        self.napi_error: str = ""

    def __enter__(self) -> "EmulatedLink":
        try:
            _ip("netns", "add", self.netns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.target_if)
            if self.mtu:  # both ends, before the target's moves into the namespace
                _ip("link", "set", self.host_if, "mtu", str(self.mtu))
                _ip("link", "set", self.target_if, "mtu", str(self.mtu))
            _ip("link", "set", self.target_if, "netns", self.netns)
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.netns, "addr", "add", f"{self.target_ip}/24", "dev", self.target_if)
            _ip("-n", self.netns, "link", "set", self.target_if, "up")
            _ip("-n", self.netns, "link", "set", "lo", "up")
            if self.want_napi:
                self._enable_napi()
            if not self.delay_us and not self.rate:
                # Nothing to emulate: no qdisc at all, so the hop costs what a veth pair costs.
                self.emulation = "plain veth (no delay or rate asked)" + (" with NAPI" if self.napi else "")
                return self
            if not self.delay_us and tbf_burst(self.rate) is not None:
                # A rate alone is tbf's job (netem is not built into every kernel: this one's lacks it).
                try:
                    self._tbf([], self.host_if)
                    self._tbf(["ip", "netns", "exec", self.netns], self.target_if)
                    self.emulation = f"tbf rate {self.rate}"
                    return self
                except NetnsError:
                    _run(["tc", "qdisc", "del", "dev", self.host_if, "root"], check=False)
            try:
                self._netem([], self.host_if)
                self._netem(["ip", "netns", "exec", self.netns], self.target_if)
                self.emulation = f"netem delay {self.delay_us}us" + (f" rate {self.rate}" if self.rate else "")
            except NetnsError as err:
                # Without sch_netem the veth pair still puts a real network device in the path.
                self.emulation = f"none (netem unavailable: {err})"
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _enable_napi(self) -> None:
        try:
            _run([sys.executable, "-c", _NAPI_SCRIPT, self.host_if])
            _run(["ip", "netns", "exec", self.netns, sys.executable, "-c", _NAPI_SCRIPT, self.target_if])
            self.napi = True
        except NetnsError as err:
            self.napi_error = str(err)[:200]

    def _tbf(self, prefix: list[str], dev: str) -> None:
        # The bucket holds 4 ms at the rate (a 250 Hz kernel refills it every 4 ms); 10 ms of queue.
        burst = tbf_burst(self.rate)
        _run(prefix + ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", str(self.rate), "burst",
                       str(burst), "latency", "10ms"])

    def _netem(self, prefix: list[str], dev: str) -> None:
        # Half the round-trip delay on each side, so ping shows delay_us.
        args = ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{self.delay_us / 2:g}us"]
        if self.rate:
            args += ["rate", self.rate]
        _run(prefix + args)

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


_RATE = re.compile(r"^(\d{1,6}(?:\.\d{1,3})?)([kmgt]?)(bit|bps)$")


def tbf_burst(rate: str | None) -> int | None:
    """tbf's bucket in bytes for a tc rate (`10gbit`, `500mbit`, `1gbps`): 4 ms of traffic, at
    least 64 KiB; None for a rate this does not read (netem gets it as given)."""
    match = _RATE.match((rate or "").strip().lower())
    if not match:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[match.group(2)]
    bytes_per_s = float(match.group(1)) * scale / (8 if match.group(3) == "bit" else 1)
    return max(64 << 10, int(bytes_per_s * 0.004))


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str], check: bool = True) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0 and check:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
