"""RAPL energy around a point (issue 24 item 5): package and DRAM joules from /sys/class/powercap.

Linux exposes Intel's (and, through the same driver, recent AMD's) Running Average Power Limit
counters as powercap zones: `/sys/class/powercap/intel-rapl:N/` is package N (`name` =
`package-N`), its subzones `intel-rapl:N:M` are `core`, `uncore` and `dram`; `psys` where the
platform has it; `intel-rapl-mmio:N` repeats a package through MMIO. Each zone's `energy_uj` is a
counter in µJ that wraps at `max_energy_range_uj`.

`snapshot(host)` reads every zone (a local file read, or one shell command on an SSH host);
`window(before, after)` gives joules per zone over the point, wrap-around handled, and sums
package and DRAM (mmio duplicates and core/uncore subzones, which package already includes, are
not added again). Where the machine exposes no zone (most VMs, these included) or `energy_uj` is
not readable (root only since Linux 5.10), the snapshot says "not available" with the reason and the
point stores NULL energy; nothing fails.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

POWERCAP = "/sys/class/powercap"
NOT_AVAILABLE = "not available"


def _root() -> Path:
    """The powercap directory; NVMFLAB_POWERCAP_ROOT points elsewhere (tests use a fake tree)."""
    return Path(os.environ.get("NVMFLAB_POWERCAP_ROOT", POWERCAP))


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def local_snapshot(root: Path | None = None) -> dict[str, Any]:
    """{"zones": {zone: {"name", "energy_uj", "max_uj"}}, "unavailable": reason or None}."""
    root = Path(root) if root is not None else _root()
    zones: dict[str, dict[str, Any]] = {}
    unreadable = []
    try:
        entries = sorted(p for p in root.iterdir() if (p / "energy_uj").exists())
    except OSError:
        entries = []
    for zone in entries:
        try:
            energy = _int((zone / "energy_uj").read_text())
        except OSError:
            unreadable.append(zone.name)
            continue
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            name = zone.name
        try:
            max_uj = _int((zone / "max_energy_range_uj").read_text())
        except OSError:
            max_uj = None
        if energy is not None:
            zones[zone.name] = {"name": name, "energy_uj": energy, "max_uj": max_uj}
    return {"zones": zones, "unavailable": _reason(zones, unreadable, root)}


def _reason(zones: dict, unreadable: list[str], root: Path | str) -> str | None:
    if zones:
        return None
    if unreadable:
        return f"{NOT_AVAILABLE}: {root}/*/energy_uj not readable (root only since Linux 5.10)"
    return f"{NOT_AVAILABLE}: no RAPL zones under {root} (as on most VMs)"


REMOTE_SCRIPT = (
    'for d in {root}/*; do [ -e "$d/energy_uj" ] || continue; '
    'if [ -r "$d/energy_uj" ] && e=$(cat "$d/energy_uj" 2>/dev/null); then '
    'echo "zone ${{d##*/}} $e $(cat "$d/max_energy_range_uj" 2>/dev/null || echo -) $(cat "$d/name" 2>/dev/null)"; '
    'else echo "unreadable ${{d##*/}}"; fi; done'
)


def parse_remote(text: str, root: str = POWERCAP) -> dict[str, Any]:
    """The REMOTE_SCRIPT's output as a snapshot."""
    zones: dict[str, dict[str, Any]] = {}
    unreadable = []
    for line in text.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 4 and parts[0] == "zone":
            energy = _int(parts[2])
            if energy is None:
                continue
            zones[parts[1]] = {"name": parts[4].strip() if len(parts) > 4 else parts[1],
                               "energy_uj": energy, "max_uj": _int(parts[3])}
        elif len(parts) >= 2 and parts[0] == "unreadable":
            unreadable.append(parts[1])
    return {"zones": zones, "unavailable": _reason(zones, unreadable, root)}


def snapshot(host: Any = None) -> dict[str, Any]:
    """Energy counters of the machine `host` runs on (this one when host is None or local)."""
    if host is not None and getattr(host, "remote", False):
        try:
            done = host.run(["sh", "-c", REMOTE_SCRIPT.format(root=POWERCAP)], check=False, timeout=15)
        except Exception as error:  # an unreachable host costs the energy, never the point
            return {"zones": {}, "unavailable": f"{NOT_AVAILABLE}: cannot read {POWERCAP} ({error})"}
        return parse_remote(done.stdout or "")
    return local_snapshot()


def _kind(zone: str, name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("package"):
        return "package"
    if lowered == "dram":
        return "dram"
    if lowered == "psys":
        return "psys"
    return lowered or zone


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Joules per zone between two snapshots, and the package + DRAM sums (None when not available)."""
    reason = after.get("unavailable") or before.get("unavailable")
    zones = {}
    for zone, end in (after.get("zones") or {}).items():
        start = (before.get("zones") or {}).get(zone)
        if not start:
            continue
        delta = end["energy_uj"] - start["energy_uj"]
        if delta < 0:  # the counter wrapped (at max_energy_range_uj)
            if not end.get("max_uj"):
                continue
            delta += end["max_uj"] + 1
        zones[zone] = {"name": end["name"], "kind": _kind(zone, end["name"]), "joules": delta / 1e6}
    if not zones:
        return {"available": False, "reason": reason or f"{NOT_AVAILABLE}: no zone read before and after",
                "package_j": None, "dram_j": None, "zones": {}}
    # One value per (kind, name): intel-rapl:N wins over its intel-rapl-mmio:N copy.
    chosen: dict[tuple[str, str], tuple[str, float]] = {}
    for zone, z in sorted(zones.items(), key=lambda kv: ("mmio" in kv[0], kv[0])):
        chosen.setdefault((z["kind"], z["name"]), (zone, z["joules"]))
    package = sum(j for (kind, _), (_, j) in chosen.items() if kind == "package")
    dram = sum(j for (kind, _), (_, j) in chosen.items() if kind == "dram")
    has_package = any(kind == "package" for kind, _ in chosen)
    has_dram = any(kind == "dram" for kind, _ in chosen)
    return {"available": has_package or has_dram, "reason": None if (has_package or has_dram) else
            f"{NOT_AVAILABLE}: no package or DRAM zone", "package_j": package if has_package else None,
            "dram_j": dram if has_dram else None, "zones": zones}


def summarize(windows: dict[str, dict[str, Any]], total_ios: float | None) -> dict[str, Any]:
    """Columns of a point from the windows of every machine it ran on: energy_pkg_j, energy_dram_j,
    joules_per_io (package + DRAM over the point's completed I/Os) and energy_json. The sums are
    NULL unless every machine exposed its energy (a partial sum would understate the cost)."""
    if not windows:
        return {}
    every = all(w.get("available") for w in windows.values())
    pkg = sum(w["package_j"] or 0.0 for w in windows.values()) if every else None
    dram = (sum(w["dram_j"] or 0.0 for w in windows.values())
            if every and any(w.get("dram_j") is not None for w in windows.values()) else None)
    total = None if pkg is None else pkg + (dram or 0.0)
    per_io = total / total_ios if total is not None and total_ios else None
    import json

    return {"energy_pkg_j": pkg, "energy_dram_j": dram, "joules_per_io": per_io,
            "energy_json": json.dumps({k: w for k, w in sorted(windows.items())}, sort_keys=True)}


def availability(energy_json: Any) -> str:
    """'available' or the reason a point's energy was not available (for the report)."""
    import json

    if energy_json is None or (isinstance(energy_json, float)) or not str(energy_json).strip():
        return "not recorded"
    try:
        windows = json.loads(energy_json)
    except ValueError:
        return "unreadable record"
    missing = [f"{machine}: {str(w.get('reason')).replace(NOT_AVAILABLE + ': ', '')}"
               for machine, w in windows.items() if not w.get("available")]
    return "available" if not missing else "; ".join(missing)
