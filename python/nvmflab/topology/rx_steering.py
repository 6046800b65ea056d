"""Where receive processing runs on a veth pair: RPS and RFS steering (issue 22 item 9, the thesis's
Table 3.3 second axis).

A veth has no interrupt: a packet sent into one end is received on the sending CPU (its softirq,
or the veth's NAPI when GRO is on). So on a veth, with no steering, the target's receive work for
the host's commands runs on the host's core and the other way round. Modes, applied to the receive
queue of both ends (`rx-0`):
- `off`: rps_cpus 0, rps_flow_cnt 0: receive work stays on the sending core;
- `rps`: rps_cpus = the given cores: every packet's protocol processing is handed to them (a fixed
  core, as RPS on a NIC spreads work away from the interrupted core);
- `rfs`: RPS over all the machine's cores plus flow tables (rps_flow_cnt, and the host-wide
  net.core.rps_sock_flow_entries), so each packet is processed on the core where the socket's
  reader last ran: the application's core (what aRFS does in a NIC, in software).
What it cannot emulate: a NIC's interrupt and its queue placement (aRFS programs the NIC; here
the first hop is always the sender's core), several hardware queues, or interrupt moderation.
Everything changed is read first and written back by `restore`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MODES = ("off", "rps", "rfs")
FLOW_ENTRIES = 32768  # net.core.rps_sock_flow_entries for rfs (the kernel docs' suggestion)
FLOW_CNT = 32768  # rps_flow_cnt of the one receive queue
SOCK_FLOW = Path("/proc/sys/net/core/rps_sock_flow_entries")


class SteeringError(Exception):
    pass


def mask(cores: list[int]) -> str:
    """rps_cpus's hex bitmap, 32-bit words comma-separated as sysfs writes it: [0, 33] -> '2,00000001'."""
    if any(c < 0 or c > 4095 for c in cores):
        raise SteeringError(f"core out of range in {cores}")
    value = 0
    for core in cores:
        value |= 1 << core
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    return ",".join([f"{words[-1]:x}"] + [f"{w:08x}" for w in reversed(words[:-1])])


class RxSteering:
    """Sets one mode on the receive queues of a veth pair's two ends (`host_if` here, `target_if`
    in namespace `netns`) and puts back what was there. `run` executes argv and returns stdout
    (a stand-in in tests)."""

    def __init__(self, host_if: str, target_if: str, netns: str, all_cores: list[int], run=None):
        self.ends = [(None, host_if), (netns, target_if)]
        self.all_cores = all_cores
        self._run = run or _run
        self._saved: dict[tuple[str | None, str], str] = {}
        self.mode = "off"

    def _path(self, interface: str, name: str) -> str:
        return f"/sys/class/net/{interface}/queues/rx-0/{name}"

    def _read(self, netns: str | None, path: str) -> str:
        return self._run(_in(netns, ["cat", path])).strip()

    def _write(self, netns: str | None, path: str, value: str) -> None:
        key = (netns, path)
        if key not in self._saved:
            self._saved[key] = self._read(netns, path)
        self._run(_in(netns, ["sh", "-c", 'printf %s "$1" > "$2"', "sh", value, path]))

    def set(self, mode: str, rps_cores: list[int]) -> None:
        if mode not in MODES:
            raise SteeringError(f"rx_steering {mode!r}: expected one of {', '.join(MODES)}")
        cpus = {"off": "0", "rps": mask(rps_cores) if rps_cores else "0", "rfs": mask(self.all_cores)}[mode]
        flows = str(FLOW_CNT) if mode == "rfs" else "0"
        for netns, interface in self.ends:
            self._write(netns, self._path(interface, "rps_cpus"), cpus)
            self._write(netns, self._path(interface, "rps_flow_cnt"), flows)
        if mode == "rfs" or (None, str(SOCK_FLOW)) in self._saved:
            self._write(None, str(SOCK_FLOW), str(FLOW_ENTRIES) if mode == "rfs" else "0")
        self.mode = mode

    def read(self) -> dict[str, str]:
        """What the queues hold now ('host rps_cpus' -> value ...), for the point's record."""
        out = {}
        for (netns, interface), side in zip(self.ends, ("host", "target")):
            for name in ("rps_cpus", "rps_flow_cnt"):
                value = self._read(netns, self._path(interface, name))
                if name == "rps_cpus":  # sysfs pads to the machine's CPU count: '00000002' -> '2'
                    digits = value.replace(",", "")
                    value = f"{int(digits, 16):x}" if digits and all(c in "0123456789abcdefABCDEF" for c in digits) \
                        else value
                out[f"{side} {name}"] = value
        return out

    def restore(self) -> None:
        """Writes back every value changed (the sock flow table last, after the queues)."""
        for (netns, path), value in sorted(self._saved.items(), key=lambda kv: kv[0][1] == str(SOCK_FLOW)):
            try:
                self._run(_in(netns, ["sh", "-c", 'printf %s "$1" > "$2"', "sh", value, path]))
            except SteeringError:
                continue  # the veth may be gone already; the host-wide value is restored regardless
        self._saved.clear()


def _in(netns: str | None, argv: list[str]) -> list[str]:
    return (["ip", "netns", "exec", netns] if netns else []) + argv


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise SteeringError(f"`{' '.join(argv)}` failed: {done.stderr.strip()[:200]}")
    return done.stdout
