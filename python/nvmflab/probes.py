"""Energy (energy.py) and network counters (netcounters.py) read around each point on every machine
it ran on, their store columns, and the report's tables of them (issue 24 items 4 and 5).

The runner calls `take(machines)` before and after the load generators and adds
`columns(before, after, total_ios)` to every measurement row of the point (the same values on each
row of a point, like the noise columns). Nothing here may fail a point: a machine that cannot be
read leaves its columns NULL.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from . import energy, netcounters

# Store columns ("name TYPE"), appended to measurements (store.py adds them to older stores on open).
PROBE_COLUMNS = [
    "energy_pkg_j REAL", "energy_dram_j REAL", "joules_per_io REAL", "energy_json TEXT",
    "net_rx_bytes REAL", "net_tx_bytes REAL", "net_drops INTEGER", "net_errors INTEGER", "tcp_retrans INTEGER",
    "softnet_dropped INTEGER", "softnet_squeeze INTEGER", "net_irqs INTEGER", "link_util_pct REAL",
    "net_json TEXT",
]
PROBE_NAMES = [c.split()[0] for c in PROBE_COLUMNS]
# Studies whose questions involve the network: the report shows their network counters.
NETWORK_STUDIES = {"overhead", "contention", "busy-poll", "dimensions", "stacks", "interference", "transports"}


def take(machines: dict[str, tuple[Any, Any]]) -> dict[str, dict[str, Any]]:
    """{machine: {"energy": snapshot, "net": snapshot}} for the runner's machines (key → (host, cores))."""
    out = {}
    for key, (host, _cores) in machines.items():
        try:
            out[key] = {"energy": energy.snapshot(host), "net": netcounters.snapshot(host)}
        except Exception:  # counters are a bonus: never the reason a point fails
            continue
    return out


def columns(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
            total_ios: float | None) -> dict[str, Any]:
    """The probe columns of a point from two take()s."""
    try:
        keys = [k for k in after if k in before]
        e = energy.summarize({k: energy.window(before[k]["energy"], after[k]["energy"]) for k in keys}, total_ios)
        n = netcounters.summarize({k: netcounters.window(before[k]["net"], after[k]["net"]) for k in keys})
        return {**e, **n}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {}


# -- report ----------------------------------------------------------------------------------------

def _point_totals(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per point (repeat) of usable rows: the probe columns (equal on each row of a point)
    and the point's completed I/Os and CPU seconds summed over its load generators."""
    from .analysis.stats import usable

    good = usable(rows)
    if good.empty or "point_id" not in good:
        return good.iloc[0:0]
    agg = {c: "first" for c in PROBE_NAMES if c in good}
    agg.update({c: "sum" for c in ("total_ios", "perf_usr_s", "perf_sys_s") if c in good})
    agg.update({c: "first" for c in ("leg", "knobs_json", "target_usr_s", "target_sys_s") if c in good})
    return good.groupby(["run_id", "point_id"], sort=True).agg(agg).reset_index()


def _label(knobs_json: str, varying: list[str]) -> str:
    try:
        knobs = json.loads(knobs_json)
    except (TypeError, ValueError):
        return "?"
    return ", ".join(f"{k}={knobs.get(k)}" for k in varying) or "(one point)"


def _configs(points: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """Points grouped by leg and knobs (repeats together), labelled by the knobs that vary in a leg."""
    out = []
    for leg, group in points.groupby("leg", sort=True):
        knob_sets = [json.loads(k) for k in group["knobs_json"]]
        names = sorted({n for k in knob_sets for n in k})
        varying = [n for n in names if len({json.dumps(k.get(n), sort_keys=True) for k in knob_sets}) > 1]
        for knobs, rows in group.groupby("knobs_json", sort=False):
            out.append((leg, _label(knobs, varying), rows))
    return out


def _mean(series: pd.Series | None) -> float:
    if series is None:
        return math.nan
    values = pd.to_numeric(series, errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def energy_table(study: str, rows: pd.DataFrame):
    """(Table or None, finding): joules per I/O beside CPU seconds per I/O, or 'not available'."""
    from .analysis.result import Table

    points = _point_totals(rows)
    if points.empty or "energy_json" not in points or points["energy_json"].dropna().empty:
        return None, None  # not recorded (stores made before energy was read): nothing to say
    reasons = sorted({energy.availability(v) for v in points["energy_json"]} - {"available"})
    measured = points[pd.to_numeric(points.get("joules_per_io"), errors="coerce").notna()]
    if measured.empty:
        why = "; ".join(reasons) if reasons else "not recorded"
        return None, f"Energy per I/O: {energy.NOT_AVAILABLE} ({why})."
    lines = []
    for leg, label, group in _configs(measured):
        ios = _mean(group["total_ios"])
        cpu = (pd.to_numeric(group.get("perf_usr_s"), errors="coerce").fillna(0)
               + pd.to_numeric(group.get("perf_sys_s"), errors="coerce").fillna(0)
               + pd.to_numeric(group.get("target_usr_s"), errors="coerce").fillna(0)
               + pd.to_numeric(group.get("target_sys_s"), errors="coerce").fillna(0))
        cpu_per_io = _mean(cpu / pd.to_numeric(group["total_ios"], errors="coerce"))
        lines.append({"leg": leg, "point": label, "repeats": len(group),
                      "µJ per I/O": _mean(group["joules_per_io"]) * 1e6,
                      "CPU µs per I/O": cpu_per_io * 1e6,
                      "package J": _mean(group["energy_pkg_j"]), "DRAM J": _mean(group["energy_dram_j"]),
                      "I/Os": ios})
    note = f" Points without energy ({energy.NOT_AVAILABLE}): {'; '.join(reasons)}." if reasons else ""
    table = Table("Energy per I/O (RAPL)", pd.DataFrame(lines).round(3),
                  "Package + DRAM energy of every machine the point ran on (/sys/class/powercap), over the "
                  "point's completed I/Os, beside the CPU seconds (load generators + target) per I/O; mean over "
                  "repeats. The machines' idle power is included." + note)
    return table, None


def _kind_text(window: dict) -> str:
    """' (kind)' of a window's data interface: as sysfs named it, else as the route implied, else ''."""
    found = (window.get("interfaces") or {}).get(window["data_interface"], {}).get("kind") \
        or window.get("data_interface_kind")
    return f" ({found})" if found else ""


def network_table(study: str, rows: pd.DataFrame):
    """(Table or None, finding) of the network counters for a network study."""
    from .analysis.result import Table

    if study not in NETWORK_STUDIES:
        return None, None
    points = _point_totals(rows)
    if points.empty or "net_json" not in points or points["net_json"].dropna().empty:
        return None, None
    lines = []
    for leg, label, group in _configs(points[points["net_json"].notna()]):
        interfaces = set()
        for text in group["net_json"]:
            for machine, w in json.loads(text).items():
                if w.get("data_interface"):
                    interfaces.add(f"{machine}:{w['data_interface']}" + _kind_text(w))
        lines.append({
            "leg": leg, "point": label, "repeats": len(group), "data interface": ", ".join(sorted(interfaces)),
            "rx MB": _mean(group["net_rx_bytes"]) / 1e6, "tx MB": _mean(group["net_tx_bytes"]) / 1e6,
            "drops": _mean(group["net_drops"]), "errors": _mean(group["net_errors"]),
            "TCP retrans": _mean(group["tcp_retrans"]), "softnet dropped": _mean(group["softnet_dropped"]),
            "time_squeeze": _mean(group["softnet_squeeze"]), "NIC irqs": _mean(group["net_irqs"]),
            "link util %": _mean(group["link_util_pct"]),
        })
    frame = pd.DataFrame(lines).round(2)
    caption = ("Per point, mean over repeats: bytes of the data interface (the one the point's traffic took, with "
               "its kind as /sys/class/net reports it: loopback, physical with its driver, a virtual pair such as "
               "a veth, …) on every machine, drops and errors of all interfaces (/proc/net/dev), TCP retransmitted segments "
               "(/proc/net/snmp RetransSegs, nstat's TcpRetransSegs), softnet drops and time_squeeze summed over "
               "cores (/proc/net/softnet_stat), the data interface's device interrupts (/proc/interrupts), and the "
               "link utilisation where the link's speed is known (—: a virtual link without speed).")
    finding = None
    squeezed = frame[frame["time_squeeze"].fillna(0) > 0]
    if not squeezed.empty or frame["TCP retrans"].fillna(0).gt(0).any() or frame["drops"].fillna(0).gt(0).any():
        finding = ("Network counters: " + "; ".join(
            f"{r['leg']} [{r['point']}] {r['TCP retrans']:.0f} TCP retransmits, {r['drops']:.0f} drops, "
            f"{r['time_squeeze']:.0f} softnet squeezes" for _, r in frame.iterrows()
            if (r["TCP retrans"] or 0) > 0 or (r["drops"] or 0) > 0 or (r["time_squeeze"] or 0) > 0) + ".")
    return Table("Network counters", frame, caption), finding


def add_to_report(result, rows: pd.DataFrame) -> None:
    """Append the energy and network tables (and their findings) to a study's result."""
    for make in (energy_table, network_table):
        try:
            table, finding = make(result.study, rows)
        except (KeyError, TypeError, ValueError):
            continue
        if table is not None:
            result.tables.append(table)
        if finding:
            result.findings.append(finding)
