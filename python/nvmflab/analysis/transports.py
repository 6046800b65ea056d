"""The `transports` study (the commodity-networks paper of Kashyap et al.: Table 3; Fig. 3
bandwidth per I/O size, Fig. 4 throughput per core count, Figs. 6-7 latency CDFs, Fig. 8 client
CPU, Figs. 9-10 IOPS over queue depth as concurrency): per stack and link, NVMe/TCP against NVMe
over RDMA and against NVMe/TCP with TLS.

Every comparison is a configuration against `tcp` of the same stack on the same link, from points
measured in the same interleaved rounds, with the 95 % interval of the difference. Where one
finding tests several cells (the L-app's mean and p99, the T-app's queue depths, the B-app's sizes,
CPU per I/O on each side) Holm's correction runs over them. The cores needed to saturate are
saturation's rule (decide.fewest_not_below_summary): the fewest cores whose IOPS is not clearly
below the best count's, over points whose host and target had cores of their own (a point where
they shared a core measures the sharing, not the count).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import plots, plots_extra
from ..findings_data import Finding
from .common import (Difference, compare_frames, corrected, excluded_points, missing_leg, repeat_values, stated,
                     study_rows)
from .cores_used import shared, with_cores
from .decide import fewest_not_below_summary
from .extra import means, r1, ratio, with_knobs
from .result import Figure, StudyResult, Table
from .security import records_text
from .stats import merge_histograms, usable
from .text import kiops, mbps, pct, size, us

STUDY = "transports"
LABEL = {"tcp": "TCP", "tls": "TCP+TLS", "rdma": "RDMA"}
KNOBS = ["stack", "config", "app", "link", "rate", "mtu", "cores", "emulation", "rdma_device"]
CPU = ["host_cpu_us_per_io", "target_cpu_us_per_io"]


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = with_knobs(study_rows(measurements, STUDY), KNOBS)
    out = StudyResult(STUDY, "Transports: NVMe/TCP vs NVMe over RDMA vs NVMe/TCP with TLS")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    data = with_cores(data[data["role"] == "main"]) if not data.empty else data
    data = with_knobs(data, KNOBS) if not data.empty else data
    if data.empty:
        out.findings.append("The transports study has no usable measurements"
                            + (f": {_why_missing(rows)}" if not rows.empty else "."))
        return out
    _rdma_note(rows, data, out)
    for link, at_link in data.groupby("link", sort=False):
        _table(at_link, link, out)
        _figures(at_link, link, out)
        for stack, mine in at_link.groupby("stack", sort=False):
            for config in ("rdma", "tls"):
                if config in set(mine["config"]) and "tcp" in set(mine["config"]):
                    _compare(mine, stack, config, link, out)
    _cores(data[data["app"] == "cores"], out)
    _link_axis(data, out)
    return out


def _why_missing(rows: pd.DataFrame) -> str:
    legs = list(dict.fromkeys(rows["leg"]))
    return " ".join(missing_leg(rows, leg, "it is not compared") for leg in legs[:4])


def _rdma_note(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    """Which RDMA device measured (software or a NIC), or why RDMA was not measured."""
    measured = data[data["config"] == "rdma"]
    if not measured.empty:
        devices = sorted({str(d) for d in measured["rdma_device"].dropna()})
        text = "; ".join(devices) or "not recorded"
        software = " These figures describe a software device (Soft-RoCE/siw), not RDMA hardware." \
            if "software" in text else ""
        out.findings.append(f"RDMA device: {text}.{software}")
        return
    asked = rows[rows["config"] == "rdma"] if "config" in rows else rows.iloc[0:0]
    if asked.empty:
        out.findings.append("RDMA was not asked for: the comparison is TCP against TCP+TLS.")
        return
    reasons = asked["error"].dropna()
    why = reasons.iloc[0] if len(reasons) else "no usable RDMA point"
    out.findings.append(f"RDMA was not measured ({why}): the study fell back to TCP against TCP+TLS.")


def _label(stack: str, config: str) -> str:
    return f"{stack} {LABEL.get(config, config)}"


def _table(data: pd.DataFrame, link: str, out: StudyResult) -> None:
    """Table 3's shape: per stack and configuration, the L-app's latency, the T-app's and B-app's
    peaks, and CPU per I/O on each side at the T-app's deepest queue."""
    records = []
    for (stack, config), mine in data.groupby(["stack", "config"], sort=False):
        lapp = means(mine[mine["app"] == "L-app"], ["app"], ["lat_mean_ns", "lat_p99_ns", *CPU])
        tapp = means(mine[mine["app"] == "T-app"], ["iodepth"], ["iops", *CPU])
        bapp = means(mine[mine["app"] == "B-app"], ["bs"], ["bw_bytes"])
        deep = tapp.iloc[-1] if len(tapp) else None
        records.append({
            "stack": stack, "transport": LABEL.get(config, config),
            "L-app mean (µs)": r1(_get(lapp, "lat_mean_ns"), 1e3), "L-app p99 (µs)": r1(_get(lapp, "lat_p99_ns"), 1e3),
            "T-app peak KIOPS": r1(tapp["iops"].max(), 1e3) if len(tapp) else math.nan,
            "B-app peak MB/s": r1(bapp["bw_bytes"].max(), 1e6, 0) if len(bapp) else math.nan,
            "host µs/IO (T-app deepest QD)": r1(deep["host_cpu_us_per_io"], 1, 2) if deep is not None else math.nan,
            "target µs/IO (T-app deepest QD)": r1(deep["target_cpu_us_per_io"], 1, 2) if deep is not None else math.nan,
            "repeats": max((int(m["repeats"].max()) for m in (lapp, tapp, bapp) if len(m)), default=0)})
    out.tables.append(Table(f"Per stack and transport ({link})", pd.DataFrame(records),
                            "Means over repeats. µs/IO: user + system + softirq of each side's cores per I/O "
                            "(per-core /proc/stat), not split where the sides shared a core."))


def _get(frame: pd.DataFrame, column: str) -> float:
    return float(frame[column].iloc[0]) if len(frame) and column in frame else math.nan


def _figures(data: pd.DataFrame, link: str, out: StudyResult) -> None:
    tag = "".join(c if c.isalnum() else "_" for c in link)
    lapp = data[data["app"] == "L-app"]
    if not lapp.empty:
        hists = {_label(s, c): merge_histograms(g["histogram_json"]) for (s, c), g in lapp.groupby(["stack", "config"])}
        out.figures.append(Figure(f"transports_lapp_cdf_{tag}", plots.latency_cdf(
            hists, title=f"L-app latency CDF (4 KiB random read, QD1; {link})"),
            "The shape of the paper's Figs. 6-7 (latency CDFs): histograms merged over repeats, one line per "
            "stack and transport."))
    for app, x, metric, scale, ylabel, name in (("T-app", "iodepth", "iops", 1e3, "KIOPS", "tapp_iops"),
                                                ("B-app", "bs", "bw_bytes", 1e6, "MB/s", "bapp_bandwidth")):
        mine = data[data["app"] == app]
        if mine.empty:
            continue
        series = {}
        for (stack, config), g in mine.groupby(["stack", "config"]):
            m = means(g, [x], [metric])
            series[_label(stack, config)] = (list(m[x]), list(m[metric] / scale))
        ticks = {float(b): size(b) for b in mine["bs"]} if x == "bs" else None
        out.figures.append(Figure(f"transports_{name}_{tag}", plots_extra.lines(
            series, title=f"{app}: {ylabel} vs {'queue depth' if x == 'iodepth' else 'I/O size'} ({link})",
            xlabel="Queue depth" if x == "iodepth" else "I/O size", ylabel=ylabel, log2_x=True, xticklabels=ticks),
            ("The shape of the paper's Figs. 9-10 (there as concurrency: IOPS over local QD1)" if x == "iodepth"
             else "The shape of the paper's Fig. 3 (bandwidth per I/O size)") + ": means over repeats."))
    tapp = data[data["app"] == "T-app"]
    if not tapp.empty:
        deepest = tapp[tapp["iodepth"] == tapp["iodepth"].max()]
        groups, host, target = [], [], []
        for (stack, config), g in deepest.groupby(["stack", "config"]):
            m = means(g, ["app"], CPU)
            groups.append(_label(stack, config))
            host.append(_get(m, "host_cpu_us_per_io"))
            target.append(_get(m, "target_cpu_us_per_io"))
        out.figures.append(Figure(f"transports_cpu_per_io_{tag}", plots_extra.grouped_bars(
            groups, {"host cores": host, "target cores": target},
            title=f"CPU per I/O at QD{int(tapp['iodepth'].max())} ({link})", ylabel="µs of CPU per I/O"),
            "After the paper's Fig. 8 (client CPU utilization at 1 MB random reads); here user + system + softirq "
            "of each side's cores per I/O at the T-app's deepest queue."))


def _compare(data: pd.DataFrame, stack: str, config: str, link: str, out: StudyResult) -> None:
    """`config` against tcp for one stack on one link: L-app mean and p99, T-app IOPS per QD and
    B-app bandwidth per size (Holm over the cells of each), CPU per I/O on each side."""
    base, other = data[data["config"] == "tcp"], data[data["config"] == config]
    name = f"{stack} on {link}: {LABEL[config]} vs TCP"
    tail = f" TLS {records_text(other)}." if config == "tls" else ""  # who made the records, on each side
    lapp_a, lapp_b = base[base["app"] == "L-app"], other[other["app"] == "L-app"]
    if not lapp_a.empty and not lapp_b.empty:
        metrics = (("lat_mean_ns", "mean"), ("lat_p99_ns", "p99"))
        family = corrected([compare_frames(lapp_a, lapp_b, metric) for metric, _ in metrics])  # Holm over both
        parts = []
        for (metric, what), d in zip(metrics, family):
            a, b = _mean(lapp_a, metric), _mean(lapp_b, metric)
            parts.append(f"{what} " + stated(d, us, f"{pct(100 * (ratio(b, a) - 1))}", f"{us(b)} vs {us(a)}"))
        out.findings.append(f"{name}: L-app latency {'; '.join(parts)} (Holm over the {len(metrics)})." + tail)
    for app, column, metric, fmt, what in (("T-app", "iodepth", "iops", kiops, "IOPS"),
                                           ("B-app", "bs", "bw_bytes", mbps, "bandwidth")):
        a_rows, b_rows = base[base["app"] == app], other[other["app"] == app]
        cells = sorted(set(a_rows[column]) & set(b_rows[column]))
        if not cells:
            continue
        family = corrected([compare_frames(a_rows[a_rows[column] == c], b_rows[b_rows[column] == c], metric)
                            for c in cells])
        out.findings.append(f"{name}: {app} {what} " + _cells(a_rows, b_rows, column, metric, cells, family, fmt) + "."
                            + tail)
    tapp_a, tapp_b = base[base["app"] == "T-app"], other[other["app"] == "T-app"]
    deep = sorted(set(tapp_a["iodepth"]) & set(tapp_b["iodepth"]))
    if deep:
        qd = deep[-1]
        a, b = tapp_a[tapp_a["iodepth"] == qd], tapp_b[tapp_b["iodepth"] == qd]
        sides = [(metric, side) for metric, side in (("host_cpu_us_per_io", "host"), ("target_cpu_us_per_io", "target"))
                 if repeat_values(a, metric) and repeat_values(b, metric)]
        family = dict(zip(sides, corrected([compare_frames(a, b, metric) for metric, _ in sides])))  # Holm over sides
        parts = []
        for metric, side in (("host_cpu_us_per_io", "host"), ("target_cpu_us_per_io", "target")):
            if (metric, side) not in family:
                parts.append(f"{side} cores: no figure (not recorded, or the sides shared a core)")
                continue
            ma, mb = _mean(a, metric), _mean(b, metric)
            parts.append(f"{side} cores " + stated(family[(metric, side)], _cpu, pct(100 * (ratio(mb, ma) - 1)),
                                                   f"{_cpu(mb)} vs {_cpu(ma)}"))
        held = f" (Holm over the {len(family)} sides)" if len(family) > 1 else ""
        out.findings.append(f"{name}: CPU per I/O at QD{int(qd)}: {'; '.join(parts)}{held}." + tail)


def _cpu(value: float) -> str:
    return f"{value:.2f} µs/IO"


def _mean(frame: pd.DataFrame, metric: str) -> float:
    values = repeat_values(frame, metric)
    return sum(values) / len(values) if values else math.nan


def _cells(a_rows: pd.DataFrame, b_rows: pd.DataFrame, column: str, metric: str, cells: list, family: list[Difference],
           fmt) -> str:
    """Each cell as `QD4 +12 % (interval)`; the family is Holm-corrected."""
    out = []
    for cell, d in zip(cells, family):
        a, b = _mean(a_rows[a_rows[column] == cell], metric), _mean(b_rows[b_rows[column] == cell], metric)
        label = f"QD{int(cell)}" if column == "iodepth" else size(cell)
        out.append(f"{label} " + stated(d, fmt, f"{pct(100 * (ratio(b, a) - 1))}", f"{fmt(b)} vs {fmt(a)}",
                                        same="no significant difference"))
    return "; ".join(out)


def _cores(data: pd.DataFrame, out: StudyResult) -> None:
    """The fewest cores whose IOPS is not clearly below the best count's, per stack and transport."""
    if data.empty:
        return
    data = data.assign(cores=pd.to_numeric(data["cores"]))
    flagged = data[shared(data)]
    if len(flagged):
        points = flagged.drop_duplicates("point_key") if "point_key" in flagged else flagged
        counts = ", ".join(str(int(n)) for n in sorted(set(points["cores"])))
        out.findings.append(f"Cores to saturate: {len(points)} point(s) where the host and the target shared a core "
                            f"(core counts {counts}) are left out of the pick: they measure the sharing, not the "
                            "count.")
        data = data[~shared(data)]
        if data.empty:
            return
    records = []
    for (stack, config), mine in data.groupby(["stack", "config"], sort=False):
        counts = sorted(set(mine["cores"]))
        samples = [repeat_values(mine[mine["cores"] == n], "iops") for n in counts]
        stats = tuple(np.array(v) for v in zip(*[_summary(s) for s in samples]))
        pick = int(fewest_not_below_summary(stats)) if len(counts) > 1 else 0
        best = max(range(len(counts)), key=lambda i: stats[0][i] if not math.isnan(stats[0][i]) else -1)
        records.append({"stack": stack, "transport": LABEL.get(config, config),
                        **{f"KIOPS with {int(n)} core{'s' if n > 1 else ''}": r1(stats[0][i], 1e3)
                           for i, n in enumerate(counts)},
                        "cores to saturate": int(counts[pick])})
        if len(counts) > 1:
            plural = "s" if counts[pick] != 1 else ""
            out.findings.append(Finding(  # decided by fewest_not_below_summary
                f"{_label(stack, config)}: {int(counts[pick])} core{plural} to saturate (of "
                f"{', '.join(str(int(n)) for n in counts)} tried): the fewest whose IOPS is not clearly "
                f"below the best count's ({kiops(stats[0][best])} with {int(counts[best])}; Welch "
                "against the best, Holm over the counts).", STUDY, decided=True))
    out.tables.append(Table("Cores to saturate (4 KiB random read, N host jobs against N target reactors)",
                            pd.DataFrame(records), "Means over repeats of the points whose host and target had "
                            "cores of their own (the paper's Fig. 4 varies the cores the same way)."))


def _summary(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    mean = sum(values) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, float(n)


def _link_axis(data: pd.DataFrame, out: StudyResult) -> None:
    """B-app bandwidth and L-app p99 per link (rate × MTU): links ran one after the other, so this
    is descriptive; the comparisons above are within a link."""
    shaped = data[data["rate"].notna()]
    if shaped.empty:
        return
    records = []
    for (link, stack, config), mine in data.groupby(["link", "stack", "config"], sort=False):
        lapp = means(mine[mine["app"] == "L-app"], ["app"], ["lat_p99_ns"])
        bapp = means(mine[mine["app"] == "B-app"], ["bs"], ["bw_bytes"])
        emulation = mine["emulation"].dropna()
        records.append({"link": link, "emulation": emulation.iloc[0] if len(emulation) else "—", "stack": stack,
                        "transport": LABEL.get(config, config), "L-app p99 (µs)": r1(_get(lapp, "lat_p99_ns"), 1e3),
                        "B-app peak MB/s": r1(bapp["bw_bytes"].max(), 1e6, 0) if len(bapp) else math.nan})
    out.tables.append(Table("Link speed and MTU (the netns veth shaped by tc)", pd.DataFrame(records),
                            "Each link was measured in its own block of interleaved rounds, so across links this "
                            "table describes; the findings compare configurations within one link."))
