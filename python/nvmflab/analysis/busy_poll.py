"""The `busy-poll` study (ADQ brief): p99.99, mean latency and IOPS vs number of target cores with
busy polling and queue-to-core placement on and off, and how many target cores each needs to
reach its highest throughput.

Decisions: at each core count, busy polling only, placement only and both (`on`) are each compared
with `off` on IOPS, mean latency and p99.99 (Welch; Holm per metric over every configuration and
core count), so the two changes are told apart. The cores to reach the highest throughput are
`decide.fewest_not_below_summary`'s: the fewest cores whose IOPS is not clearly below the best core
count's (Holm over the comparisons with the best). Whether busy polling had a device queue to poll
is read from the NVMe/TCP connections' own sockets (their NAPI ids in the target's /stats) where
the target reports them, else from the study's probe connection."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .. import plots_extra
from ..topology import napi
from .common import claim, compare_frames, corrected, descriptive, excluded_points, missing_leg, repeat_values, stated, study_rows
from .decide import fewest_not_below_summary
from .cores_used import shared as shared_core, used_text, with_cores
from .extra import means, r1, ratio, with_knobs
from .result import Figure, StudyResult, Table
from .stats import merge_generators, usable
from .text import kiops, pct, us

STUDY = "busy-poll"
LABEL = {"off": "busy polling and placement off", "on": "busy polling and placement on",
         "busy_only": "busy polling only", "placement_only": "placement only"}
CONTRASTS = ("busy_only", "placement_only", "on")  # each against off
METRICS = (("iops", "IOPS", kiops), ("lat_mean_ns", "mean latency", us), ("lat_p99_99_ns", "p99.99", us))


def cores_to_best(data: pd.DataFrame, config: str) -> tuple[int | None, int | None, list[int]]:
    """(fewest target cores not clearly below the best, the core count with the best mean IOPS,
    the core counts in order) of one configuration: `decide.fewest_not_below_summary` over the
    per-repeat IOPS (the load generators of a point summed)."""
    mine = data[data["config"] == config]
    counts = sorted({int(n) for n in mine["target_cpus"]})
    if not counts:
        return None, None, []
    summaries = [_summary(repeat_values(mine[mine["target_cpus"] == n], "iops")) for n in counts]
    arrays = tuple(np.array([s[i] for s in summaries], dtype=float) for i in range(3))
    pick = int(fewest_not_below_summary(arrays, higher_is_better=True))
    top = int(np.nanargmax(np.where(np.isnan(arrays[0]), -np.inf, arrays[0])))
    return counts[pick], counts[top], counts


def _summary(values: list[float]) -> tuple[float, float, int]:
    data = np.array(values, dtype=float)
    n = len(data)
    return (float(data.mean()) if n else math.nan, float(data.std(ddof=1)) if n > 1 else math.nan, n)


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Busy polling and queue placement vs target cores (ADQ-style)")
    out.excluded = excluded_points(rows)
    # placed points run one load generator per target core: together they are the point's T-app
    data = merge_generators(with_cores(with_knobs(usable(rows), ["config", "target_cpus", "conns",
                                                                  "shares_host_cores", "link", "napi_id"])))
    if data.empty:
        out.findings.append("The busy-poll study has no usable measurements"
                            + (f": {missing_leg(rows, 'off', 'nothing can be compared')}" if not rows.empty else "."))
        return out
    data = data.assign(target_cpus=pd.to_numeric(data["target_cpus"]))
    med = means(data, ["config", "target_cpus"])  # the load generators of one point summed
    configs = [c for c in LABEL if c in set(med["config"])]
    records = []
    for _, row in med.iterrows():
        records.append({"configuration": LABEL.get(row["config"], row["config"]),
                        "target cores": int(row["target_cpus"]),
                        "cores used": used_text(data[(data["config"] == row["config"])
                                                     & (data["target_cpus"] == row["target_cpus"])]) or "—",
                        "KIOPS": r1(row["iops"], 1e3),
                        "mean (µs)": r1(row["lat_mean_ns"], 1e3), "p99 (µs)": r1(row["lat_p99_ns"], 1e3),
                        "p99.99 (µs)": r1(row["lat_p99_99_ns"], 1e3), "repeats": int(row["repeats"])})
    out.tables.append(Table("Configurations × target cores (4 KiB random read)", pd.DataFrame(records),
                            "Means over repeats; the load generators of a point add up (IOPS) and the worst of "
                            "them counts (latency)."))
    for metric, name, scale, ylabel in (("iops", "busy_poll_iops", 1e3, "KIOPS"),
                                         ("lat_p99_99_ns", "busy_poll_p9999", 1e3, "p99.99 latency (µs)"),
                                         ("lat_mean_ns", "busy_poll_mean", 1e3, "mean latency (µs)")):
        series = {LABEL[c]: (list(g["target_cpus"]), list(g[metric] / scale))
                  for c, g in med.groupby("config") if c in LABEL}
        out.figures.append(Figure(name, plots_extra.lines(series, title=f"{ylabel} vs target cores",
                                                          xlabel="Target cores (reactors)", ylabel=ylabel),
                                  "3 connections per target core by default; QD32 per connection."))
    summary = []
    for config in configs:
        cores, top, counts = cores_to_best(data, config)
        mine = med[med["config"] == config].set_index("target_cpus")
        summary.append({"configuration": LABEL[config],
                        "highest mean KIOPS": r1(mine.at[top, "iops"], 1e3) if top is not None else math.nan,
                        "with target cores": top,
                        "fewest target cores not clearly below it": cores})
        out.findings.append(_near_best(data, mine, config, cores, top, counts))
    out.tables.append(Table("Target cores needed for the highest throughput", pd.DataFrame(summary),
                            "Fewest target cores whose IOPS is not clearly below the best core count's (Welch, Holm "
                            "over the comparisons with the best: decide.fewest_not_below)."))
    _compare(data, med, out)
    overlap = data[data["shares_host_cores"].map(lambda v: v is True or v == 1) | shared_core(data)]
    shared = sorted({int(n) for n in overlap["target_cpus"]})
    if shared:
        out.findings.append(f"With {', '.join(map(str, shared))} target cores the target shared cores with the load "
                            f"generators on this machine ({used_text(overlap)}), so those points measure contention "
                            "as well as scaling.")
    for config in ("off", "on"):
        if config not in configs:
            out.findings.append(missing_leg(rows, config, "the on/off comparison is incomplete"))
    if set(configs) & {"on", "busy_only"}:
        polled = usable(rows)
        ids = connection_napi_ids(polled[polled["leg"].isin(["on", "busy_only"])])  # a leg per configuration
        out.findings.append(connections_text(ids, _link(data)) if ids
                            else napi.inert_text(point_path(data) or data_path(runs)))
    return out


def connection_napi_ids(rows: pd.DataFrame) -> dict[int, int]:
    """NVMe/TCP connections per NAPI id of their own target-side sockets, over the given points:
    the `napi_ids` of each port in the point's /stats difference (`target_counters_json`; our
    target counts a connection there once its Connect arrived). Empty where no point has them (a
    target that does not report them, or a run recorded before it did)."""
    counts: dict[int, int] = {}
    if rows.empty or "target_counters_json" not in rows:
        return counts
    keys = ["run_id", "point_key"] if {"run_id", "point_key"} <= set(rows.columns) else None
    points = rows.drop_duplicates(keys) if keys else rows
    for text in points["target_counters_json"]:
        try:
            stats = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            continue
        for port in stats.get("ports", []) if isinstance(stats, dict) else []:
            for key, n in ((port or {}).get("napi_ids") or {}).items():
                if str(key).isdigit() and isinstance(n, (int, float)) and n > 0:
                    counts[int(key)] = counts.get(int(key), 0) + int(n)
    return counts


def _link(data: pd.DataFrame) -> str:
    links = data["link"].dropna().unique() if "link" in data else []
    return ", ".join(str(v) for v in links) or "the topology's data path"


def connections_text(ids: dict[int, int], link: str) -> str:
    """Whether busy polling had a device queue to poll, from the NVMe/TCP connections' own sockets."""
    total = sum(ids.values())
    if set(ids) == {0}:
        return (f"Busy polling inert (no NAPI id): all {total} NVMe/TCP connections of the busy-polling points report "
                f"SO_INCOMING_NAPI_ID 0 on the target's sockets (target /stats; {link}), so busy polling had no device "
                "queue to poll and any difference it shows comes from queue placement and the busy-wait loop itself.")
    named = ", ".join(f"{i} ({n})" for i, n in sorted(ids.items()) if i)
    zero = f"; {ids[0]} with none (0)" if ids.get(0) else ""
    return (f"The NVMe/TCP connections of the busy-polling points report NAPI ids {named} on the target's sockets "
            f"(target /stats; connections in parentheses{zero}; {link}): busy polling can poll their device queue.")


def point_path(data: pd.DataFrame) -> dict | None:
    """The data path the points themselves recorded (knobs `link`, `napi_id`; a run on a veth with
    NAPI sets the busy-poll sysctls per point), or None for points that recorded none."""
    found = data[data["napi_id"].notna()] if "napi_id" in data else data.iloc[0:0]
    if found.empty:
        return None
    ids = sorted({int(v) for v in found["napi_id"]})
    return {"address": str(found["link"].iloc[0]), "napi_id": 0 if ids == [0] else max(ids),
            "sysctls": "net.core.busy_poll and busy_read set to each point's busy_poll_us, 0 when off"}


def data_path(runs: pd.DataFrame) -> dict | None:
    """The data path (NAPI id, busy-poll sysctls) the latest busy-poll run recorded, or None."""
    if runs is None or runs.empty or "env_json" not in runs:
        return None
    for text in reversed(list(runs.loc[runs["study"] == STUDY, "env_json"])):
        try:
            found = json.loads(text or "{}").get("data_path")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(found, dict):
            return found
    return None


def _near_best(data: pd.DataFrame, mine: pd.DataFrame, config: str, cores: int | None, top: int | None,
               counts: list[int]) -> str:
    """The fewest target cores not clearly below the best core count, with the interval of the
    difference that decided it (Holm over the comparisons with the best)."""
    label = LABEL[config]
    if cores is None or top is None:
        return f"With {label}, no core count has IOPS to compare."
    if len(counts) < 2:
        return descriptive(f"With {label}, only {counts[0]} target core{'s' if counts[0] != 1 else ''} was measured "
                           f"({kiops(mine.at[counts[0], 'iops'])}), so no core count is picked") + "."
    rows = data[data["config"] == config]
    others = [n for n in counts if n != top]
    diffs = dict(zip(others, corrected([compare_frames(rows[rows["target_cpus"] == top],
                                                       rows[rows["target_cpus"] == n], "iops") for n in others])))
    family = f"Holm over the {len(others)} comparison{'s' if len(others) != 1 else ''} with the best"
    plural = "s" if cores != 1 else ""
    if cores == top:
        fewer = [n for n in others if n < top]
        if not fewer:
            return descriptive(f"With {label}, the fewest target cores measured ({top}) gave the highest mean "
                               f"throughput ({kiops(mine.at[top, 'iops'])})") + "."
        shown = fewer[-1]
        return claim(diffs[shown], kiops,
                     f"With {label}, {top} target core{plural} were needed for its highest throughput "
                     f"({kiops(mine.at[top, 'iops'])}): fewer were clearly below it",
                     f"IOPS between {shown} and {top} target cores with {label}", f"{family}; {shown} vs {top}: {kiops(mine.at[shown, 'iops'])} vs "
                         f"{kiops(mine.at[top, 'iops'])}") + "."
    d = diffs[cores]
    enough = f", so {cores} target core{plural} were enough for its highest throughput" if d.decidable else ""
    return claim(d, kiops,
                 f"With {label}, {cores} target core{plural} fell clearly below its highest throughput",
                 f"IOPS between {cores} and {top} target cores with {label}",
                 f"{family}; {kiops(mine.at[cores, 'iops'])} vs {kiops(mine.at[top, 'iops'])} with {top}") + enough + "."


def _compare(data: pd.DataFrame, med: pd.DataFrame, out: StudyResult) -> None:
    """Busy polling only, placement only and both against off at every core count, on IOPS, mean
    latency and p99.99: one family per metric over every configuration and core count (Holm)."""
    def rows_of(config, n):
        return data[(data["config"] == config) & (data["target_cpus"] == n)]

    def mean_of(config, n, metric):
        row = med[(med["config"] == config) & (med["target_cpus"] == n)]
        return float(row[metric].iloc[0]) if len(row) else math.nan

    counts = sorted(set(med.loc[med["config"] == "off", "target_cpus"]))
    pairs = [(config, n) for n in counts for config in CONTRASTS if len(rows_of(config, n))]
    if not pairs:
        return
    family = {metric: corrected([compare_frames(rows_of("off", n), rows_of(config, n), metric) for config, n in pairs])
              for metric, _, _ in METRICS}
    for index, (config, n) in enumerate(pairs):
        parts = []
        for metric, name, fmt in METRICS:
            a, b = mean_of(config, n, metric), mean_of("off", n, metric)
            parts.append(f"{name} " + stated(family[metric][index], fmt, pct(100 * (ratio(a, b) - 1)),
                                             f"{fmt(a)} vs {fmt(b)}; Holm over {len(pairs)}", "no clear difference"))
        out.findings.append(f"{int(n)} target core{'s' if n != 1 else ''}, {LABEL[config]} vs off: "
                            + ", ".join(parts) + ".")
