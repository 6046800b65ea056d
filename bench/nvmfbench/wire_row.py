"""A row of bench/README.md's table "What spdk_nvme_perf puts on the wire" (issue 40 item 3) from a
capture's summary (nvmfbench/wire.py) and the target's calls per I/O (nvmfbench/syscalls.py)."""

from __future__ import annotations

from typing import Any

C2H_LAST, C2H_SUCCESS = 0x04, 0x08
TABLE_CALLS = ("recvfrom", "readv", "writev")  # the table's last column, in its order


def write_data(summary: dict[str, Any]) -> str:
    """How write data went: in the capsule, or after R2Ts in H2CData PDUs ('-' without writes)."""
    sizes, per = summary.get("sizes", {}), summary.get("per command", {})
    if "write" not in summary.get("commands", {}):
        return "-"
    parts = []
    in_capsule = {int(k): v for k, v in sizes.get("in-capsule", {}).items() if int(k)}
    if in_capsule:
        parts.append(" or ".join(str(k) for k in sorted(in_capsule)) + " in the capsule")
    if r2t := sizes.get("R2T"):
        parts.append(f"R2T (R2TL {'/'.join(map(str, r2t))}) {per.get('target R2T', 0):g} per command, "
                     f"H2CData {'/'.join(map(str, sizes.get('H2CData', {})))} {per.get('host H2CData', 0):g} per command")
    return "; ".join(parts) or "none"


def read_pdus(summary: dict[str, Any]) -> str:
    """What the target sent per read: C2HData sizes and flags, and whether a CapsuleResp followed."""
    if "read" not in summary.get("commands", {}):
        return "-"
    sizes = "/".join(map(str, summary.get("sizes", {}).get("C2HData", {}))) or "none"
    flags = summary.get("flags", {}).get("C2HData", {})
    names = sorted({"LAST" * bool(int(f) & C2H_LAST) + "|SUCCESS" * bool(int(f) & C2H_SUCCESS) for f in flags})
    resp = summary.get("per command", {}).get("target CapsuleResp", 0)
    return f"C2HData {sizes} ({', '.join(n.strip('|') or 'none' for n in names)}) + CapsuleResp {resp:g} per command"


def table_row(work: str, host: str, summary: dict[str, Any], calls: dict[str, float] | None) -> str:
    """One row of bench/README.md's table: work, host, write data, PDUs per read, host segments per
    command (mean bytes), the target's recvfrom, readv, writev per I/O ('?' when not counted)."""
    seg = summary.get("host segments", {})
    counted = ", ".join(f"{calls.get(c, 0):g}" for c in TABLE_CALLS) if calls is not None else "?"
    cells = [work, host, write_data(summary), read_pdus(summary),
             f"{seg.get('per command', 0):g} ({seg.get('mean bytes', 0)})", counted]
    return "| " + " | ".join(cells) + " |"


VARIANTS = {"digest": "header and data digests", "batch": "fio submits in batches"}


def work_name(key: str) -> str:
    """'4k-randread-qd32' -> '4k randread QD32', the table's spelling; variants after a '+'
    (bench/kernel-wire-guest.sh's) are said in words."""
    base, *variants = key.split("+")
    size, rw, qd = base.split("-")
    return ", ".join([f"{size} {rw} QD{qd.removeprefix('qd')}", *(VARIANTS[v] for v in variants)])
