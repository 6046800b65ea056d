"""The `dimensions` study (commodity-networks paper): pattern × size at QD128, scaling with cores,
latency CDF per core count, and concurrency = IOPS(transport, QD) / IOPS(local, QD1).

The load generator's user/system % is its own share (its usr_cpu and sys_cpu over the measured
phase) per host core it ran on. The host cores' idle % is the cores' own: idle + iowait seconds of
the host's cores in the point's per-core /proc/stat window over the window's length (not 100 minus
the load generator's share, which would count softirq and other processes as idle). The CPU per I/O
the kernel counted over each side's cores (user + system + softirq, `cores_used`) stands beside it,
and the cores axis names the distinct cores each side used; a point whose roles shared a core is
flagged and left out of the scaling finding.

Decisions: the highest bandwidth is `decide.pick_best_summary`'s (clearly above every other pattern
and size, Holm), else "no clear highest"; "matched local QD1 from QDn on" holds when the Fieller
interval of IOPS(TCP, QD) / IOPS(local, QD1) lies at or above 1 at QDn and every deeper queue
depth (an intersection-union test, `decide.safe_upto` read from the deepest queue depth down).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .. import plots, plots_extra
from .common import (Difference, claim, compare_frames, corrected, descriptive, excluded_points, missing_leg,
                     repeat_values, stated, study_rows)
from .decide import fieller_summary, pick_best_summary, safe_upto
from .cores_used import shared, used_text, with_cores
from .extra import means, r1, ratio, with_knobs
from .formulas import concurrency
from ..findings_data import Finding
from .result import Figure, StudyResult, Table
from .stats import merge_histograms, usable
from .text import kiops, mbps, size, times, us

STUDY = "dimensions"


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Four dimensions: transport × I/O pattern × I/O size × cores")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    data = with_cores(data)
    data = with_knobs(data[data["role"] == "main"] if not data.empty else data, ["transport", "cores", "host_cpus"])
    if data.empty:
        out.findings.append("The dimensions study has no usable measurements"
                            + (f": {missing_leg(rows, 'pattern', 'no table can be drawn')}" if not rows.empty else "."))
        return out
    _transports(rows, out)
    _pattern(rows, data[data["leg"] == "pattern"], out)
    _cores(rows, data[data["leg"] == "cores"], out)
    _concurrency(rows, data[data["leg"] == "local"], data[data["leg"] == "concurrency"], out)
    return out


def _transports(rows: pd.DataFrame, out: StudyResult) -> None:
    others = sorted({leg.split("_", 1)[1] for leg in rows["leg"] if "_" in leg})
    for transport in others:
        out.findings.append(missing_leg(rows, f"pattern_{transport}",
                                        f"{transport.upper()} is not compared with TCP"))
    if not others:
        out.findings.append("Transport: NVMe/TCP only (no RDMA leg was asked for: `transports = [\"tcp\", \"rdma\"]` "
                            "adds one; the transports study compares TCP, RDMA and TLS in full).")


def _cpu(row: pd.Series, cores: float) -> tuple[float, float]:
    """The load generator's user and system % per host core it ran on."""
    cores = cores if cores and not math.isnan(cores) else 1.0
    return row["usr_cpu"] / cores, row["sys_cpu"] / cores


def host_idle_pct(text) -> float:
    """Idle + iowait % of the host's cores (a load generator's cores that the target did not use)
    over one point's per-core /proc/stat window (cpu_cores_json); NaN where none was recorded."""
    try:
        detail = json.loads(text) if isinstance(text, str) and text else None
    except ValueError:
        return math.nan
    idle = wall = 0.0
    for window in (detail or {}).values() if isinstance(detail, dict) else []:
        roles, cores = (window or {}).get("roles") or {}, (window or {}).get("cores") or {}
        target = {str(c) for c in roles.get("target", [])}
        host = {str(c) for role, cs in roles.items() if role != "target" for c in cs} - target
        seconds = float((window or {}).get("wall_s") or 0.0)
        for core in host & set(cores):
            idle += float(cores[core].get("idle_s", 0.0)) + float(cores[core].get("iowait_s", 0.0))
            wall += seconds
    return 100 * idle / wall if wall > 0 else math.nan


def _of(data: pd.DataFrame, row: pd.Series, keys: tuple[str, ...]) -> pd.DataFrame:
    """The rows of `data` whose `keys` equal those of one means() row."""
    mask = pd.Series(True, index=data.index)
    for key in keys:
        mask &= data[key] == row[key]
    return data[mask]


def _summaries(frames: list[pd.DataFrame], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, std, n) arrays of `metric`'s per-repeat values in each frame, for decide.py."""
    out = []
    for frame in frames:
        v = np.array(repeat_values(frame, metric), dtype=float)
        out.append((v.mean() if len(v) else math.nan, v.std(ddof=1) if len(v) > 1 else math.nan, len(v)))
    return tuple(np.array([o[i] for o in out], dtype=float) for i in range(3))


def _idle(frame: pd.DataFrame) -> float:
    if "cpu_cores_json" not in frame:
        return math.nan
    values = [v for v in (host_idle_pct(t) for t in frame["cpu_cores_json"]) if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _pattern(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        out.findings.append(missing_leg(rows, "pattern", "there is no pattern × size table"))
        return
    med = means(data, ["rw", "bs", "iodepth"], ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns",
                                                "lat_p99_99_ns", "usr_cpu", "sys_cpu", "host_cpu_us_per_io",
                                                "target_cpu_us_per_io"])
    records = []
    for _, row in med.iterrows():
        usr, sys = _cpu(row, 1)
        idle = _idle(_of(data, row, ("rw", "bs", "iodepth")))
        records.append({"pattern": row["rw"], "I/O size": size(row["bs"]), "QD": int(row["iodepth"]),
                        "MB/s": r1(row["bw_bytes"], 1e6, 0), "KIOPS": r1(row["iops"], 1e3),
                        "mean (µs)": r1(row["lat_mean_ns"], 1e3), "p90 (µs)": r1(row["lat_p90_ns"], 1e3),
                        "p99 (µs)": r1(row["lat_p99_ns"], 1e3), "p99.99 (µs)": r1(row["lat_p99_99_ns"], 1e3),
                        "load generator usr %": r1(usr), "load generator sys %": r1(sys),
                        "host cores idle %": r1(idle),
                        "host cores µs/IO": r1(row["host_cpu_us_per_io"], 1, 2),
                        "target cores µs/IO": r1(row["target_cpu_us_per_io"], 1, 2),
                        "repeats": int(row["repeats"])})
    out.tables.append(Table("Pattern × I/O size (NVMe/TCP, one host core, one target core)", pd.DataFrame(records),
                            "Means over repeats; rw and randrw mix reads and writes as the spec's rwmixread says "
                            "(70 % reads by default). Load generator usr/sys: its own share of its core; host cores idle: "
                            "the cores' idle + iowait time (per-core /proc/stat). µs/IO: "
                            "user + system + softirq of each side's cores per I/O (per-core /proc/stat), "
                            f"cores used: {used_text(data) or 'not recorded'}."))
    series = {rw: (list(g["bs"]), list(g["bw_bytes"] / 1e6)) for rw, g in med.groupby("rw")}
    if len(set(med["bs"])) > 1:
        out.figures.append(Figure("dimensions_bandwidth_vs_size", plots_extra.lines(
            series, title="Bandwidth vs I/O size per pattern (NVMe/TCP)", xlabel="I/O size (bytes, log2)",
            ylabel="Bandwidth (MB/s)", log2_x=True, xticklabels={float(b): size(b) for b in med["bs"]}),
            "Mean bandwidth per pattern and I/O size at the study's queue depth."))
    out.findings.append(highest_bandwidth(data, med))
    small = med[med["bs"] == med["bs"].min()]
    if len(small) > 1:
        top, low = small.loc[small["iops"].idxmax()], small.loc[small["iops"].idxmin()]

        def pick(r: pd.Series) -> pd.DataFrame:
            return data[(data["rw"] == r["rw"]) & (data["bs"] == r["bs"]) & (data["iodepth"] == r["iodepth"])]

        # The highest and lowest of several patterns are picked from the data: every pair of the
        # patterns is compared, Holm over the pairs, and the top-vs-low pair is read from that.
        labels = list(small.index)
        pairs = [(i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))]
        family = corrected([compare_frames(pick(small.loc[labels[i]]), pick(small.loc[labels[j]]), "iops")
                            for i, j in pairs])
        i_low, i_top = labels.index(small["iops"].idxmin()), labels.index(small["iops"].idxmax())
        if i_low == i_top:  # every pattern at the same IOPS (or none known): any other one will do
            i_top = next(i for i in range(len(labels)) if i != i_low)
        d = family[pairs.index((min(i_low, i_top), max(i_low, i_top)))]
        diff = d if i_low < i_top else Difference(-d.diff, d.half, d.n, d.p, d.family, d.holm)
        out.findings.append(f"At {size(top['bs'])}, {top['rw']} reached {kiops(top['iops'])} and {low['rw']} "
                            f"{kiops(low['iops'])}: "
                            + stated(diff, kiops, f"{times(ratio(top['iops'], low['iops']))} the IOPS",
                                     f"Holm over {len(pairs)} pair{'s' if len(pairs) > 1 else ''}",
                                     same="no clear difference in IOPS") + ".")


def highest_bandwidth(data: pd.DataFrame, med: pd.DataFrame) -> str:
    """The pattern and size with the highest bandwidth when it is clearly above every other
    (`decide.pick_best_summary`, Holm over the k − 1 comparisons with it), with its interval against
    the runner-up; else no clear highest, shown by the comparison that stopped it."""
    keys = ("rw", "bs", "iodepth")
    frames = [_of(data, row, keys) for _, row in med.iterrows()]
    names = [f"{row['rw']} at {size(row['bs'])}" for _, row in med.iterrows()]
    k = len(frames)
    if k < 2:
        row = med.iloc[0]
        return descriptive(f"Only one pattern and size was measured ({names[0]}: {mbps(row['bw_bytes'])})") + "."
    summary = _summaries(frames, "bw_bytes")
    pick = int(pick_best_summary(summary, higher_is_better=True))
    top = pick if pick >= 0 else int(np.nanargmax(np.where(np.isnan(summary[0]), -np.inf, summary[0])))
    others = [i for i in range(k) if i != top]
    diffs = corrected([compare_frames(frames[top], frames[i], "bw_bytes") for i in others])
    family = f"Holm over the {k - 1} comparison{'s' if k > 2 else ''} with it"
    if pick >= 0:
        j = max(range(len(others)), key=lambda j: summary[0][others[j]])
        return claim(diffs[j], mbps, f"Highest bandwidth: {names[top]} with {mbps(summary[0][top])}, clearly above every "
                                     f"other of the {k} patterns and sizes", "",
                     f"{family}; against the runner-up, {names[others[j]]} ({mbps(summary[0][others[j]])}): "
                     "other − best") + "."
    j = max(range(len(others)), key=lambda j: diffs[j].p if not math.isnan(diffs[j].p) else math.inf)
    return (claim(diffs[j], mbps, "", f"bandwidth between {names[top]} (the highest mean, {mbps(summary[0][top])}) and "
                                      f"{names[others[j]]} ({mbps(summary[0][others[j]])})", f"{family}: other − best")
            + f", so no highest is picked among the {k} patterns and sizes.")


def _cores(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        out.findings.append(missing_leg(rows, "cores", "scaling with cores and the per-core CDF are not shown"))
        return
    data = data.assign(cores=pd.to_numeric(data["cores"]), host_cpus=pd.to_numeric(data["host_cpus"]))
    med = means(data, ["cores", "host_cpus"], ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns",
                                               "lat_p99_99_ns", "usr_cpu", "sys_cpu", "host_cpu_us_per_io",
                                               "target_cpu_us_per_io", "cpu_us_per_io"])
    records = []
    for _, row in med.iterrows():
        usr, sys = _cpu(row, row["host_cpus"])
        mine = data[(data["cores"] == row["cores"]) & (data["host_cpus"] == row["host_cpus"])]
        idle = _idle(mine)
        records.append({"cores asked (host = target)": int(row["cores"]), "cores used": used_text(mine) or "—",
                        "roles shared a core": "yes" if shared(mine).any() else "no",
                        "KIOPS": r1(row["iops"], 1e3),
                        "MB/s": r1(row["bw_bytes"], 1e6, 0), "mean (µs)": r1(row["lat_mean_ns"], 1e3),
                        "p99 (µs)": r1(row["lat_p99_ns"], 1e3), "p99.99 (µs)": r1(row["lat_p99_99_ns"], 1e3),
                        "load generator usr %": r1(usr), "load generator sys %": r1(sys),
                        "host cores idle %": r1(idle),
                        "host cores µs/IO": r1(row["host_cpu_us_per_io"], 1, 2),
                        "target cores µs/IO": r1(row["target_cpu_us_per_io"], 1, 2),
                        "all cores µs/IO": r1(row["cpu_us_per_io"], 1, 2),
                        "repeats": int(row["repeats"])})
    out.tables.append(Table("Scaling with cores (4 KiB random read)", pd.DataFrame(records),
                            "N host cores (one job each) against N target reactors; where the machine has fewer "
                            "distinct cores than asked, fewer are used (load generator usr/sys: its own share per host core "
                            "used; host cores idle: those cores' idle + iowait time, per-core /proc/stat). "
                            "Cores used: the distinct cores each side was pinned to. µs/IO: user + system + softirq "
                            "of those cores per I/O (per-core /proc/stat; not split where the sides shared a core)."))
    hists = {f"{int(n)} core{'s' if n > 1 else ''}": merge_histograms(g["histogram_json"])
             for n, g in data.groupby("cores")}
    out.figures.append(Figure("dimensions_latency_cdf_per_cores", plots.latency_cdf(
        hists, title="Latency CDF per core count (4 KiB random read)"),
        "Histograms merged over repeats, one line per core count."))
    flagged = shared(data)
    if flagged.any():
        counts = sorted({int(n) for n in data.loc[flagged, "cores"]})
        out.findings.append(f"At {', '.join(map(str, counts))} core(s) asked, roles shared a core "
                            f"({used_text(data[flagged])}): those points are flagged in the table and left out of "
                            "the scaling finding, which is about host and target on cores of their own.")
        data = data[~flagged]
        med = med[med["cores"].isin(set(data["cores"]))].reset_index(drop=True)
    if len(med) > 1:
        first, last = med.iloc[0], med.iloc[-1]

        def pick(r: pd.Series) -> pd.DataFrame:
            return data[(data["cores"] == r["cores"]) & (data["host_cpus"] == r["host_cpus"])]

        # two tests in one finding: Holm over them
        gain, tail = corrected([compare_frames(pick(first), pick(last), "iops"),
                                compare_frames(pick(first), pick(last), "lat_p99_ns")])
        verb = stated(gain, kiops, f"gave {times(ratio(last['iops'], first['iops']))} the IOPS of {int(first['cores'])}",
                      f"{kiops(last['iops'])} vs {kiops(first['iops'])}; Holm over 2",
                      f"gave no clear difference in IOPS from {int(first['cores'])}")
        if not gain.decidable:
            verb = f"against {int(first['cores'])}, IOPS: {verb}"
        p99 = stated(tail, us, "higher" if tail.diff > 0 else "lower",
                     f"{us(last['lat_p99_ns'])} vs {us(first['lat_p99_ns'])}; Holm over 2")
        used = [(int(r["cores"]), used_text(pick(r))) for r in (first, last)]
        named = "; ".join(f"{n} → {text}" for n, text in used if text)
        out.findings.append(f"{int(last['cores'])} cores {verb}; p99 {p99}."
                            + (f" Cores used: {named}." if named else ""))


def _concurrency(rows: pd.DataFrame, local: pd.DataFrame, remote: pd.DataFrame, out: StudyResult) -> None:
    if local.empty or remote.empty:
        leg = "local" if local.empty else "concurrency"
        out.findings.append(missing_leg(rows, leg, "concurrency (IOPS at QD over local IOPS at QD1) is not computed"))
        return
    local = local[local["iodepth"] == local["iodepth"].min()]
    base = float(means(local, ["iodepth"])["iops"].iloc[0])
    med = means(remote, ["iodepth"])
    med["concurrency"] = [concurrency(v, base) for v in med["iops"]]
    qds = [int(q) for q in med["iodepth"]]
    b_mean, b_std, b_n = (float(v[0]) for v in _summaries([local], "iops"))
    r_mean, r_std, r_n = _summaries([remote[remote["iodepth"] == q] for q in qds], "iops")
    ratios, lows, highs = fieller_summary(b_mean, b_std, b_n, r_mean, r_std, r_n)
    out.tables.append(Table("Concurrency: IOPS(NVMe/TCP, QD) / IOPS(local, QD1)", pd.DataFrame({
        "QD": qds, "KIOPS": [r1(v, 1e3) for v in med["iops"]],
        "p99 (µs)": [r1(v, 1e3) for v in med["lat_p99_ns"]],
        "concurrency": [r1(v, 1, 2) for v in med["concurrency"]],
        "95 % interval (Fieller)": [_range(lo, hi) for lo, hi in zip(lows, highs)]}),
        f"Local QD1 (same kind of file, no network stack): {kiops(base)}. The interval of each ratio includes the "
        "local baseline's own spread (Fieller); none with fewer than two repeats a side."))
    out.figures.append(Figure("dimensions_concurrency", plots_extra.lines(
        {"NVMe/TCP": (list(med["iodepth"]), list(med["concurrency"]))},
        title="Concurrency vs queue depth: IOPS(TCP, QD) / IOPS(local, QD1)", xlabel="Queue depth", ylabel="concurrency",
        log2_x=True), "Above 1, the transport with that many I/Os in flight outruns local storage at QD1."))
    out.findings.append(matched_from(qds, ratios, lows, highs, base))


def _range(low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    return f"{low:.2f} to {high:.2f}" if math.isfinite(high) else "unbounded"


def matched_from(qds: list[int], ratios, lows, highs, base: float) -> str:
    """From which queue depth NVMe/TCP matched local QD1 throughput, as a decision: the first queue
    depth from which every deeper one's Fieller interval of the ratio lies at or above 1 (each tested
    at 2.5 % one-sided, an intersection-union test: `decide.safe_upto` from the deepest down);
    'stayed below' when every interval lies below 1; else it cannot be told."""
    deepest = len(qds) - 1
    last = f"at QD{qds[deepest]} concurrency is {ratios[deepest]:.2f} ({_range(lows[deepest], highs[deepest])})"
    run = int(safe_upto(np.asarray(lows, dtype=float)[::-1], 1.0, higher_is_worse=False))
    if run >= 0:
        i = deepest - run
        return Finding(f"NVMe/TCP matched local QD1 throughput ({kiops(base)}) from QD{qds[i]} on: there and at every "
                       f"deeper queue depth the 95 % interval of IOPS(TCP, QD) / IOPS(local, QD1) lies at or above 1 "
                       f"(QD{qds[i]}: {ratios[i]:.2f}, {_range(lows[i], highs[i])}; each depth tested at 2.5 % one-sided, "
                       f"all must hold); {last}.", STUDY, decided=True)
    formed = [i for i in range(len(qds)) if not math.isnan(lows[i])]
    best = int(np.nanargmax(np.where(np.isnan(ratios), -np.inf, ratios)))
    if formed and len(formed) == len(qds) and all(highs[i] < 1 for i in formed):
        return Finding(f"NVMe/TCP stayed below local QD1 throughput ({kiops(base)}) at every queue depth: every 95 % "
                       f"interval of IOPS(TCP, QD) / IOPS(local, QD1) lies below 1 (the highest, QD{qds[best]}: "
                       f"{ratios[best]:.2f}, {_range(lows[best], highs[best])}).", STUDY, decided=True)
    why = ("fewer than two repeats a side or no spread: no interval" if not formed else
           f"at QD{qds[deepest]} the 95 % interval of the ratio does not lie at or above 1")
    return (f"Cannot tell whether NVMe/TCP matched local QD1 throughput ({kiops(base)}) at any queue depth ({why}); "
            f"{last}.")
