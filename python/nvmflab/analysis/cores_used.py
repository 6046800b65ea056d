"""Cores as they were, and the CPU they spent (issue 22 items 8 and 7).

Every point stores, per machine, the cores each role was pinned to and the per-core /proc/stat
seconds of its window (`cpu_cores_json`, sysstat.py). From that, per point:

- the distinct cores each side actually used (`host_cores_used`, `target_cores_used`: "cpu1,cpu2";
  a remote machine's as "name:cpu1") and `distinct_cores`, the number of distinct cores in all;
- `roles_share_core`: the load generators and the target, or two load generators meant for
  different cores, landed on one core (a small machine wraps logical cores). Such points are kept
  in the tables, flagged, and left out of any finding about roles on different cores;
- CPU per I/O counted by the kernel over each side's core set: user + system + softirq seconds of
  the host's cores (`host_cpu_us_per_io`), of the target's cores (`target_cpu_us_per_io`) and of
  both (`cpu_us_per_io`), divided by the point's I/Os. Unlike the load generator's own rusage this
  counts softirq and kworker time, and on loopback or a veth the receive path runs on the sending
  side's core, so each side's figure holds part of the other's receive work (`softirq_us_per_io`
  per side says how much). Cores both sides share cannot be split: there the per-side figures are
  NaN and only the total stands. Other processes on those cores count too (the noise columns say
  how much that was);
- where `perf stat` counted on the point's cores (perfstat.py: this machine, perf installed), the
  context switches per I/O on each side's cores (`host_cswitch_per_io`, `target_cswitch_per_io`)
  and the CPU migrations on all of them (`cpu_migrations`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

FIELDS = ("user_s", "system_s", "softirq_s")
COLUMNS = ["host_cores_used", "target_cores_used", "distinct_cores", "roles_share_core", "host_cpu_us_per_io",
           "target_cpu_us_per_io", "cpu_us_per_io", "host_softirq_us_per_io", "target_softirq_us_per_io",
           "host_cswitch_per_io", "target_cswitch_per_io", "cpu_migrations"]


def _name(machine: str, core: Any) -> str:
    return f"cpu{core}" if machine == "local" else f"{machine}:cpu{core}"


def _sort_key(name: str) -> tuple[str, int]:
    prefix, _, number = name.rpartition("cpu")
    return prefix, int(number) if number.isdigit() else -1


def point_cores(text: Any) -> dict[str, Any] | None:
    """One point's cpu_cores_json -> the cores each side used, whether roles shared a core, and
    the user + system + softirq (and softirq alone) seconds of each side's cores; None when the
    point has no readable per-core window or no roles."""
    if not isinstance(text, str) or not text:
        return None
    try:
        detail = json.loads(text)
    except ValueError:
        return None
    if not isinstance(detail, dict):
        return None
    host, target, shared_within = set(), set(), False
    seconds = {"host": 0.0, "target": 0.0, "shared": 0.0}
    softirq = {"host": 0.0, "target": 0.0, "shared": 0.0}
    switches: dict[str, float] = {}  # perf stat context switches per side, where counted
    migrations: float | None = None
    found = False
    for machine, window in detail.items():
        roles = (window or {}).get("roles") or {}
        cores = (window or {}).get("cores") or {}
        if not roles:
            continue
        found = True
        mine_t = {str(c) for c in roles.get("target", [])}
        generators = [{str(c) for c in cs} for role, cs in roles.items() if role != "target"]
        mine_h = set().union(*generators) if generators else set()
        # two load generators on one core, where each had cores of its own to begin with
        seen: set[str] = set()
        for cs in generators:
            if cs & seen:
                shared_within = True
            seen |= cs
        for side, members in (("host", mine_h - mine_t), ("target", mine_t - mine_h), ("shared", mine_h & mine_t)):
            for core in members:
                values = cores.get(core) or {}
                seconds[side] += sum(float(values.get(f, 0.0) or 0.0) for f in FIELDS)
                softirq[side] += float(values.get("softirq_s", 0.0) or 0.0)
                counted = ((window or {}).get("perf_stat") or {}).get(core) or {}
                if "context-switches" in counted:
                    switches[side] = switches.get(side, 0.0) + float(counted["context-switches"])
                if "cpu-migrations" in counted:
                    migrations = (migrations or 0.0) + float(counted["cpu-migrations"])
        host |= {_name(machine, c) for c in mine_h}
        target |= {_name(machine, c) for c in mine_t}
    if not found:
        return None
    return {"host": sorted(host, key=_sort_key), "target": sorted(target, key=_sort_key),
            "distinct": len(host | target), "shared": bool(host & target) or shared_within,
            "seconds": seconds, "softirq": softirq, "switches": switches, "migrations": migrations}


def with_cores(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the COLUMNS added (per point, from cpu_cores_json and the point's I/Os summed
    over its rows); NaN / None where a point has no per-core window."""
    if rows.empty:
        return rows.assign(**{c: pd.Series(dtype=object) for c in COLUMNS})
    ios = (pd.to_numeric(rows["total_ios"], errors="coerce").groupby(rows["point_key"]).sum()
           if "total_ios" in rows and "point_key" in rows else pd.Series(dtype=float))
    out = {c: [] for c in COLUMNS}
    for _, row in rows.iterrows():
        cores = point_cores(row.get("cpu_cores_json"))
        n = float(ios.get(row.get("point_key"), math.nan)) if len(ios) else math.nan
        if cores is None:
            for c in COLUMNS:
                out[c].append(None if c in ("host_cores_used", "target_cores_used", "roles_share_core") else math.nan)
            continue
        per_io = (lambda s: s / n * 1e6) if n and n > 0 and not math.isnan(n) else (lambda s: math.nan)
        split = not set(cores["host"]) & set(cores["target"])  # a core both sides used cannot be split
        out["host_cores_used"].append(",".join(cores["host"]) or None)
        out["target_cores_used"].append(",".join(cores["target"]) or None)
        out["distinct_cores"].append(cores["distinct"])
        out["roles_share_core"].append(cores["shared"])
        out["host_cpu_us_per_io"].append(per_io(cores["seconds"]["host"]) if split else math.nan)
        out["target_cpu_us_per_io"].append(per_io(cores["seconds"]["target"]) if split and cores["target"]
                                           else math.nan)
        out["cpu_us_per_io"].append(per_io(sum(cores["seconds"].values())))
        out["host_softirq_us_per_io"].append(per_io(cores["softirq"]["host"]) if split else math.nan)
        out["target_softirq_us_per_io"].append(per_io(cores["softirq"]["target"]) if split and cores["target"]
                                               else math.nan)
        per_io_count = (lambda c: c / n) if n and n > 0 and not math.isnan(n) else (lambda c: math.nan)
        switches = cores["switches"]
        out["host_cswitch_per_io"].append(per_io_count(switches["host"]) if split and "host" in switches
                                          else math.nan)
        out["target_cswitch_per_io"].append(per_io_count(switches["target"]) if split and "target" in switches
                                            else math.nan)
        out["cpu_migrations"].append(math.nan if cores["migrations"] is None else cores["migrations"])
    return rows.assign(**out)


def used_text(rows: pd.DataFrame) -> str:
    """The distinct cores the rows' points used, as an axis or a finding names them:
    "host cpu1 · target cpu0" (several layouts joined by " | "); "" when unknown."""
    if rows.empty or "host_cores_used" not in rows:
        return ""
    seen = []
    for host, target in zip(rows["host_cores_used"], rows["target_cores_used"]):
        parts = [f"host {host}" if isinstance(host, str) else "", f"target {target}" if isinstance(target, str) else ""]
        text = " · ".join(p for p in parts if p)
        if text and text not in seen:
            seen.append(text)
    return " | ".join(seen)


def cores_text(rows: pd.DataFrame) -> str:
    """used_text over the rows' points (each point once), or "—" when no point recorded its cores:
    the "cores used" column of a table whose rows are groups of points."""
    if rows.empty or "cpu_cores_json" not in rows:
        return "—"
    points = rows.drop_duplicates("point_key") if "point_key" in rows else rows
    text = used_text(with_cores(points[points["cpu_cores_json"].notna()]))
    flagged = shared(with_cores(points[points["cpu_cores_json"].notna()])).any() if len(points) else False
    return (text + (" (roles shared a core)" if flagged else "")) if text else "—"


def shared(rows: pd.DataFrame) -> pd.Series:
    """True for rows whose point had roles on one core (unknown counts as not shared)."""
    if rows.empty or "roles_share_core" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["roles_share_core"].map(lambda v: v is True or v == 1)


def cores_note(rows: pd.DataFrame) -> str | None:
    """One statement per study: the distinct cores each leg's points used, legs with the same cores
    named together, and how many points had roles on one core; None without per-core windows."""
    if rows.empty or "cpu_cores_json" not in rows or "leg" not in rows:
        return None
    points = rows.drop_duplicates("point_key") if "point_key" in rows else rows
    points = with_cores(points[points["cpu_cores_json"].notna()])
    if points.empty:
        return None
    by_text: dict[str, list[str]] = {}
    for leg, group in points.groupby("leg", sort=False):
        text = used_text(group)
        if text:
            by_text.setdefault(text, []).append(str(leg))
    if not by_text:
        return None
    named = "; ".join(f"{', '.join(legs)}: {text}" for text, legs in by_text.items())
    note = f"Cores used (the distinct cores each side was pinned to, per leg): {named}."
    flagged = points[shared(points)]
    if len(flagged):
        legs = ", ".join(dict.fromkeys(str(v) for v in flagged["leg"]))
        note += (f" {len(flagged)} point(s) ({legs}) had roles on one core: flagged (roles_share_core) and not "
                 "counted as roles on cores of their own.")
    return note
