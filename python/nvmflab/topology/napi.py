"""Whether busy polling has anything to poll on a run's data path: the NAPI id of its connections.

Socket busy polling (SO_BUSY_POLL, net.core.busy_poll/busy_read) polls the device queue a socket's
packets arrived on, named by the socket's NAPI id (SO_INCOMING_NAPI_ID). Loopback has no NAPI, and
a veth has one only with GRO or an XDP program on it: there a socket's NAPI id is 0 and busy
polling is inert, whatever it is set to.

Our target reports its NVMe/TCP connections' own NAPI ids (`/stats` `ports[].napi_ids`; the
busy-poll analysis reads them from each point's counters). For a target that reports none, and for
the run record, the harness measures the data path itself: a probe connection made the way NVMe/TCP
connects (a listener on the target host's data address, a
client on the initiator host) whose accepted socket reads SO_INCOMING_NAPI_ID after data arrived.
The probe runs through the `Host` interface (this machine, a namespace, a server over SSH), with
python3 there, bounded in time; anything it cannot do is a reason, never an exception.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .base import Host, HostError

PROBE_WAIT_S = 5.0
SO_INCOMING_NAPI_ID = 56  # Linux's value where Python's socket module lacks the name

_LISTEN = r"""
import socket, sys
addr, port, wait, opt = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(1); s.settimeout(wait)
c, _ = s.accept(); c.settimeout(wait)
if c.recv(1) != b"x": sys.exit("probe: no data arrived")
try:
    print("napi_id", c.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_INCOMING_NAPI_ID", opt)))
except OSError as err:
    print("unsupported", err.errno)
"""
_CONNECT = r"""
import socket, sys, time
addr, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + wait
while True:
    try:
        c = socket.create_connection((addr, port), timeout=wait); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
c.sendall(b"x"); c.settimeout(wait)
c.recv(1)  # the listener closes after reading its NAPI id
"""


@dataclass(frozen=True)
class DataPath:
    """What a probe connection on the data path found: its NAPI id (None: not measured, `why`
    says so) and the busy-poll sysctls of both ends (None where unreadable)."""

    address: str
    napi_id: int | None
    why: str = ""
    busy_poll: dict[str, int | None] | None = None  # host name -> net.core.busy_poll
    busy_read: dict[str, int | None] | None = None  # host name -> net.core.busy_read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_probe(text: str) -> tuple[int | None, str]:
    """The listener's one line: (NAPI id, '') or (None, why)."""
    words = text.strip().split()
    if len(words) == 2 and words[0] == "napi_id" and words[1].isdigit() and len(words[1]) <= 10:
        return int(words[1]), ""
    if len(words) == 2 and words[0] == "unsupported":
        return None, f"SO_INCOMING_NAPI_ID unsupported here (errno {words[1][:6]}; a kernel without busy polling)"
    return None, f"the probe printed {text.strip()[:80]!r}"


SYSCTLS = ("busy_poll", "busy_read")
# Both sysctls in one round trip, a NAME=VALUE line each (VALUE empty where unreadable).
_READ_SYSCTLS = 'for n in "$@"; do printf "%s=%s\\n" "$n" "$(cat "/proc/sys/net/core/$n" 2>/dev/null)"; done'


def sysctls(host: Host) -> dict[str, int | None]:
    """net.core.busy_poll and busy_read of `host` (None where unreadable). Read each time, never
    kept: the busy-poll study sets them."""
    try:
        text = host.run(["sh", "-c", _READ_SYSCTLS, "sh", *SYSCTLS], check=False, timeout=20).stdout or ""
    except HostError:
        text = ""
    return parse_sysctls(text)


def parse_sysctls(text: str) -> dict[str, int | None]:
    values: dict[str, int | None] = dict.fromkeys(SYSCTLS)
    for line in text.splitlines()[:len(SYSCTLS)]:
        name, _, value = line.strip().partition("=")
        if name in values and value.isdigit() and len(value) <= 10:
            values[name] = int(value)
    return values


def probe(target: Host, initiator: Host, address: str, wait: float = PROBE_WAIT_S) -> DataPath:
    """One probe connection from `initiator` to `address` on `target`; never raises."""
    hosts = {target.name: target, initiator.name: initiator}
    read = {n: sysctls(h) for n, h in hosts.items()}
    sysctls_found = {name: {n: values[name] for n, values in read.items()} for name in SYSCTLS}
    try:
        port = target.free_port()
    except HostError as err:
        return DataPath(address, None, f"no free port on {target.name}: {err}", **sysctls_found)
    client_error: list[str] = []
    # -I -S: the probes need only the standard library; skipping site (.pth files, dist-packages)
    # shortens python's start, seconds on an emulated guest, where both sides wait for the slower
    python = ["python3", "-I", "-S", "-c"]

    def connect() -> None:
        try:
            done = initiator.run([*python, _CONNECT, address, str(port), str(wait)], timeout=wait + 5,
                                 check=False)
            if done.returncode != 0:
                client_error.append(" ".join((done.stderr or "").split())[-120:] or f"exit {done.returncode}")
        except HostError as err:
            client_error.append(str(err))

    client = threading.Thread(target=connect, daemon=True)
    client.start()
    try:
        done = target.run([*python, _LISTEN, address, str(port), str(wait), str(SO_INCOMING_NAPI_ID)],
                          timeout=wait + 5, check=False)
    except HostError as err:
        client.join(wait + 6)
        return DataPath(address, None, f"probe listener on {target.name}: {err}", **sysctls_found)
    client.join(wait + 6)
    if done.returncode != 0:
        why = " ".join((done.stderr or "").split())[-120:] or (client_error[0] if client_error else "")
        return DataPath(address, None, f"probe connection failed: {why or f'exit {done.returncode}'}", **sysctls_found)
    napi_id, why = parse_probe(done.stdout or "")
    return DataPath(address, napi_id, why, **sysctls_found)


def inert_text(path: dict[str, Any] | None) -> str:
    """A sentence for a report: busy polling inert (NAPI id 0), possible (its id), or not measured."""
    if not path:
        return "The NAPI id of the data path was not measured (a run recorded before it was)."
    napi_id, address = path.get("napi_id"), path.get("address", "?")
    def per_host(values: Any) -> str:
        return ", ".join(f"{v} on {h}" for h, v in values.items()) if isinstance(values, dict) and values else "?"

    sysctls = path.get("sysctls") or (f"net.core.busy_poll {per_host(path.get('busy_poll'))}; "
                                      f"busy_read {per_host(path.get('busy_read'))}")
    if napi_id is None:
        return f"The NAPI id of the data path ({address}) could not be measured: {path.get('why') or 'no reason'}."
    if napi_id == 0:
        return (f"Busy polling inert (no NAPI id): a connection on the data path ({address}) reports "
                "SO_INCOMING_NAPI_ID 0 (loopback has no NAPI; a veth has one only with GRO or XDP), so busy "
                "polling had no device queue to poll and any difference it shows comes from queue placement "
                f"and the busy-wait loop itself ({sysctls}).")
    return (f"A connection on the data path ({address}) reports NAPI id {napi_id}: busy polling can poll its "
            f"device queue ({sysctls}).")


class BusyPollSysctls:
    """net.core.busy_poll and busy_read of this machine (one value for every namespace), set for
    each point and put back by `restore` (the study calls it in a finally).

    Runs at the same time on one machine share the two values: a small state file (under a lock)
    keeps the values found before the first of them and the processes holding them; the last one
    to restore puts those back, and a run that died holding them is undone by the next one."""

    NAMES = ("busy_poll", "busy_read")

    def __init__(self, root: str = "/proc/sys/net/core", state: str = "/run/nvmflab-busy-poll.json"):
        self.root, self.state = root, Path(state)
        self.holding = False

    def set(self, value: int) -> None:
        with self._locked() as state:
            holders = [p for p in state.get("holders", []) if _alive(p)]
            if state and not holders:  # a run that died holding them: put its originals back first
                self._write(state.get("original", {}))
                state = {}
            if not state:
                state = {"original": {n: self._read(n) for n in self.NAMES}, "holders": []}
            state["holders"] = sorted(set(holders) | {os.getpid()})
            self._save(state)
            self.holding = True
            self._write({n: str(int(value)) for n in self.NAMES})

    def restore(self) -> None:
        if not self.holding:
            return
        with self._locked() as state:
            others = [p for p in state.get("holders", []) if p != os.getpid() and _alive(p)]
            if others:
                self._save(state | {"holders": others})
            else:
                self._write(state.get("original", {}))
                self.state.unlink(missing_ok=True)
        self.holding = False

    @contextlib.contextmanager
    def _locked(self):
        with open(f"{self.state}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                text = self.state.read_text() if self.state.exists() else ""
                try:
                    state = json.loads(text) if text else {}
                except json.JSONDecodeError:
                    state = {}
                yield state if isinstance(state, dict) else {}
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self, state: dict) -> None:
        self.state.write_text(json.dumps(state))

    def _read(self, name: str) -> str:
        with open(f"{self.root}/{name}") as f:
            return f.read().strip()

    def _write(self, values: dict) -> None:
        for name, value in values.items():
            if name in self.NAMES and str(value).isdigit():
                with open(f"{self.root}/{name}", "w") as f:
                    f.write(str(value))


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
