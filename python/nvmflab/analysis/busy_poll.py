"""The `busy-poll` study (ADQ brief): p99.99, mean latency and IOPS vs number of target cores with
busy polling and queue-to-core placement on and off, and how many target cores each needs to
reach its highest throughput (the first core count within 5 % of its best)."""

from __future__ import annotations

import json
import math

import pandas as pd

from .. import plots_extra
from ..topology import napi
from .common import corrected, compare_frames, excluded_points, missing_leg, stated, study_rows
from .cores_used import shared as shared_core, used_text, with_cores
from .extra import means, r1, ratio, spread, with_knobs
from .result import Figure, StudyResult, Table
from .stats import merge_generators, usable
from .text import kiops, pct, us

STUDY = "busy-poll"
LABEL = {"off": "busy polling and placement off", "on": "busy polling and placement on",
         "busy_only": "busy polling only", "placement_only": "placement only"}
NEAR_BEST = 0.95


def cores_to_best(frame: pd.DataFrame) -> tuple[int | None, float]:
    """Fewest target cores whose IOPS is within 5 % of the configuration's best, and that best."""
    if frame.empty:
        return None, math.nan
    best = frame["iops"].max()
    enough = frame[frame["iops"] >= NEAR_BEST * best].sort_values("target_cpus")
    return int(enough["target_cpus"].iloc[0]), float(best)


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
        cores, best = cores_to_best(med[med["config"] == config])
        summary.append({"configuration": LABEL[config], "highest KIOPS": r1(best, 1e3),
                        "target cores to reach it (within 5 %)": cores})
        out.findings.append(_near_best(data, med, config, cores, best))
    out.tables.append(Table("Target cores needed for the highest throughput", pd.DataFrame(summary)))
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
        out.findings.append(napi.inert_text(point_path(data) or data_path(runs)))
    return out


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


def _near_best(data: pd.DataFrame, med: pd.DataFrame, config: str, cores: int, best: float) -> str:
    """The fewest target cores within 5 % of the best, with the interval of the two throughputs' difference."""
    mine = med[med["config"] == config]
    top = int(mine.loc[mine["iops"].idxmax(), "target_cpus"])
    plural = "s" if cores != 1 else ""
    if top == cores:
        return f"With {LABEL[config]}, {cores} target core{plural} reached {kiops(best)}, its highest throughput."
    reached = float(mine.loc[mine["target_cpus"] == cores, "iops"].iloc[0])
    rows = data[data["config"] == config]
    diff = compare_frames(rows[rows["target_cpus"] == top], rows[rows["target_cpus"] == cores], "iops")
    return (f"With {LABEL[config]}, {cores} target core{plural} reached {kiops(reached)}, within 5 % of its highest "
            f"throughput ({kiops(best)} with {top}): "
            + stated(diff, kiops, f"{100 * (1 - ratio(reached, best)):.1f} % below it",
                     same="no significant difference from it") + ".")


def _compare(data: pd.DataFrame, med: pd.DataFrame, out: StudyResult) -> None:
    on, off = med[med["config"] == "on"], med[med["config"] == "off"]
    common = sorted(set(on["target_cpus"]) & set(off["target_cpus"]))

    def rows_of(config, n):
        return data[(data["config"] == config) & (data["target_cpus"] == n)]

    # One comparison per core count and metric: Holm over the core counts, per metric.
    iops_d = corrected([compare_frames(rows_of("off", n), rows_of("on", n), "iops") for n in common])
    mean_d = corrected([compare_frames(rows_of("off", n), rows_of("on", n), "lat_mean_ns") for n in common])
    for n, d_iops, d_mean in zip(common, iops_d, mean_d):
        a, b = on[on["target_cpus"] == n].iloc[0], off[off["target_cpus"] == n].iloc[0]
        gain = 100 * (ratio(a["iops"], b["iops"]) - 1)
        lat = 100 * (ratio(a["lat_mean_ns"], b["lat_mean_ns"]) - 1)
        iops = stated(d_iops, kiops, f"IOPS {pct(gain)}",
                      f"{kiops(a['iops'])} vs {kiops(b['iops'])}",
                      "no significant difference in IOPS")
        mean = stated(d_mean, us, f"mean latency {pct(lat)}",
                      f"{us(a['lat_mean_ns'])} vs {us(b['lat_mean_ns'])}",
                      "no significant difference in mean latency")
        out.findings.append(f"{int(n)} target core{'s' if n != 1 else ''}: on vs off: {iops}, {mean}, "
                            f"p99.99 {us(a['lat_p99_99_ns'])} vs {us(b['lat_p99_99_ns'])}.")
