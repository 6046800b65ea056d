"""Which layer made the kernel stack's TLS records, read from what the kernel reports rather than
stated (issue 37): /proc/net/tls_stat counts the sockets that took the kernel's TLS (kTLS) in
software (TlsTxSw, TlsRxSw) or on the NIC (TlsTxDevice, TlsRxDevice) since boot, per network
namespace. The difference over a connect (host) or a point (target) says whether kTLS carried the
records; where the file cannot be read, or nothing moved, the record layer is "unknown", never a
guess. The counters are machine-wide: where host and target share a machine, both sides' sockets
are counted together, and the text says the count is the machine's."""

from __future__ import annotations

import re

from ..topology.base import HostError
from .base import StackError

FILE = "proc/net/tls_stat"
UNKNOWN = "unknown"
_LINE = re.compile(r"^(Tls[A-Za-z]+)\s+(\d{1,19})$")
SOFTWARE = ("TlsTxSw", "TlsRxSw")
DEVICE = ("TlsTxDevice", "TlsRxDevice")


def parse(text: str) -> dict[str, int]:
    """tls_stat's `Name value` lines -> {name: value}; other lines are ignored."""
    found = {}
    for line in text.splitlines()[:64]:
        matched = _LINE.match(line.strip())
        if matched:
            found[matched.group(1)] = int(matched.group(2))
    return found


def delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """after - before for the counters both readings have; None where either is missing."""
    if not before or not after:
        return None
    return {name: after[name] - before[name] for name in after if name in before}


def records(moved: dict[str, int] | None, why: str = "") -> str:
    """The record layer a counter difference shows: 'ktls (software: TlsTxSw +2, TlsRxSw +2 …)',
    'ktls (device offload: …)', or 'unknown (why)'."""
    if moved is None:
        return f"{UNKNOWN} ({why or '/proc/net/tls_stat was not read'})"
    kinds = []
    for kind, names in (("software", SOFTWARE), ("device offload", DEVICE)):
        counted = [f"{name} +{moved[name]}" for name in names if moved.get(name, 0) > 0]
        if counted:
            kinds.append(f"{kind}: {', '.join(counted)}")
    if not kinds:
        return f"{UNKNOWN} (/proc/net/tls_stat counted no kTLS socket set up meanwhile)"
    return f"ktls ({'; '.join(kinds)} in this machine's /proc/net/tls_stat)"


def read(run, path: str) -> tuple[dict[str, int] | None, str]:
    """Read tls_stat through `run(argv)` (a CompletedProcess-returning call): (counters, "") or
    (None, why not)."""
    try:
        done = run(["cat", path])
    except (HostError, StackError) as err:  # a host that cannot be asked: the layer is unknown, said why
        return None, f"{path} not read: {' '.join(str(err).split())[:200]}"
    if done.returncode != 0:
        return None, f"{path} not readable (kernel without TLS support, or the tls module not loaded)"
    found = parse(done.stdout or "")
    return (found, "") if found else (None, f"{path} had no counters")


def snapshot(found: dict[str, int] | None, why: str) -> dict:
    """What a kernel target's stats() carries: the counters and a read count of 1, so a point's
    difference holds tls_stat_read 0 exactly when both ends were read (counters.diff keeps an
    unmatched value as it is, which would pass the totals since boot for a difference)."""
    return {"tls_stat": found, "tls_stat_read": 1} if found is not None else {"tls_stat_unread": why}


def target_records(point_delta: dict) -> str:
    """The kernel target's record layer from a point's stats difference (snapshot's layout)."""
    if "tls_stat" in point_delta and point_delta.get("tls_stat_read") == 0:
        return records(point_delta["tls_stat"] if isinstance(point_delta["tls_stat"], dict) else None)
    if point_delta.get("tls_stat_unread"):
        return records(None, str(point_delta["tls_stat_unread"]))
    if "tls_stat" in point_delta:
        return records(None, "the target's /proc/net/tls_stat was read at only one end of the point")
    return records(None, "the target's /proc/net/tls_stat was not read")
