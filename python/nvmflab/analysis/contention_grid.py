"""The contention study's `lapps_flows` leg: the grid of the source's figures 11-12, N L-apps on
one core beside M network apps one per core (the first network app on the L-apps' cores).

Figure 11: the L-apps' latency against M, one line per N; each cell (N, M) against the same N
L-apps without network apps. Figure 12: the network apps' throughput per flow beside N L-apps
against the same M flows alone in the same layout. Every comparison is Welch's interval over the
repeats (all members run in the same rounds), with Holm over the cells of each metric. Cells whose
flows wrapped onto cores meant to be apart (a small machine) are flagged and left out."""

from __future__ import annotations

import math

import pandas as pd

from .. import plots_extra
from .common import claim, compare_values, corrected, missing_leg, stated
from .contention_many import per_point
from .extra import r1, ratio
from .result import Figure, StudyResult, Table
from .text import times, us

LEG = "lapps_flows"


def _flagged(frame: pd.DataFrame) -> pd.Series:
    if frame.empty or "net_shares_storage_core" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["net_shares_storage_core"].map(lambda v: v is True or v == 1 or v == "True")


def flow_totals(flows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per point with flows: total and per-flow throughput (bytes/s) over the storage window."""
    keys = [c for c in by if c in flows]
    frame = flows.assign(**{c: flows[c].map(lambda v: bool(v is True or v == 1 or v == "True"))
                            for c in keys if c == "net_shares_storage_core"})
    totals = frame.groupby(["point_id"] + keys, as_index=False, dropna=False)["bw_bytes"].sum()
    return totals.assign(per_flow=totals["bw_bytes"] / pd.to_numeric(totals["net_flows"]))


def analyze_grid(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    mine = rows[rows["leg"] == LEG] if not rows.empty else rows
    if mine.empty:
        return  # the leg was not asked for
    storage = data[(data["leg"] == LEG) & (data["part"] == "storage")]
    if storage.empty:
        out.findings.append(missing_leg(mine, LEG, "L-apps beside network apps one per core are not shown"))
        return
    wrapped = storage[_flagged(storage)]
    if len(wrapped):
        cells = sorted({(int(n), int(m)) for n, m in zip(wrapped["storage_apps"], wrapped["net_flows"])})
        out.findings.append(
            "L-apps beside network apps one per core: on this machine the network apps wrapped onto cores meant "
            "to be apart for " + ", ".join(f"{n} L-app(s) with {m} network app(s)" for n, m in cells)
            + ": flagged (net_shares_storage_core) and left out of the findings below.")
    points = per_point(storage.assign(storage_apps=pd.to_numeric(storage["storage_apps"])))
    shared = set(storage.loc[_flagged(storage), "point_id"])
    points = points.assign(shared=points["point_id"].isin(shared))
    _latency(points, out)
    _network(data, out)


def _values(points: pd.DataFrame, n: int, m: int, column: str) -> list[float]:
    sel = points[(points["storage_apps"] == n) & (points["net_flows"] == m) & ~points["shared"]]
    return [float(v) for v in sel[column].dropna()]


def _latency(points: pd.DataFrame, out: StudyResult) -> None:
    groups = points.groupby(["storage_apps", "net_flows"])
    med = groups[["lat_mean_ns", "lat_p99_ns"]].mean()
    med["repeats"] = groups.size()
    med["shared"] = groups["shared"].any()
    med = med.reset_index().sort_values(["storage_apps", "net_flows"])
    cells = [r for _, r in med.iterrows() if r["net_flows"] > 0 and not r["shared"]]
    diffs = {metric: corrected([compare_values(_values(points, int(r["storage_apps"]), 0, metric),
                                               _values(points, int(r["storage_apps"]), int(r["net_flows"]), metric))
                                for r in cells])
             for metric in ("lat_mean_ns", "lat_p99_ns")}
    base = med[med["net_flows"] == 0].set_index("storage_apps")
    records = []
    for r in (r for _, r in med.iterrows()):
        n, m = int(r["storage_apps"]), int(r["net_flows"])
        b = base.loc[n] if n in base.index else None
        records.append({"L-apps": n, "network apps": m, "mean (µs)": r1(r["lat_mean_ns"], 1e3),
                        "mean × no network": r1(ratio(r["lat_mean_ns"], b["lat_mean_ns"]), 1, 2) if b is not None else None,
                        "p99 (µs)": r1(r["lat_p99_ns"], 1e3),
                        "p99 × no network": r1(ratio(r["lat_p99_ns"], b["lat_p99_ns"]), 1, 2) if b is not None else None,
                        "repeats": int(r["repeats"]), "cores shared": "yes (flagged)" if r["shared"] else "no"})
    out.tables.append(Table("L-apps beside network apps one per core (figures 11-12)", pd.DataFrame(records),
                            "N L-apps on the first host core; M network apps (iperf3 flows) on host and target cores "
                            "0..M-1 of the study's lists, so the first shares the L-apps' cores. Latency: mean of "
                            "the L-apps' means, worst L-app's p99; × no network: against the same N L-apps with "
                            "no network app, in the same rounds. Cores shared: the network apps wrapped onto cores "
                            "meant to be apart; such cells make no finding."))
    series, left_out = {}, {}
    for (n, shared), group in med.groupby(["storage_apps", "shared"]):
        into = left_out if shared else series  # cells with shared cores make no finding: crosses
        for stat, column in (("mean", "lat_mean_ns"), ("p99", "lat_p99_ns")):
            into[f"{int(n)} L-app{'s' if n > 1 else ''}, {stat}"] = (list(group["net_flows"]),
                                                                       list(group[column] / 1e3))
    out.figures.append(Figure("contention_lapps_vs_network_apps", plots_extra.lines(
        series, title="L-app latency vs network apps one per core", xlabel="network apps (0 = none)",
        ylabel="latency (µs)", left_out=left_out, left_out_label="left out: network apps wrapped onto shared cores"),
        "Means over repeats (the source's figure 11)."))
    for r, mean, p99 in zip(cells, diffs["lat_mean_ns"], diffs["lat_p99_ns"]):
        n, m = int(r["storage_apps"]), int(r["net_flows"])
        if n not in base.index:
            continue
        b = base.loc[n]
        out.findings.append(
            f"{n} L-app{'s' if n > 1 else ''} beside {m} network app{'s' if m > 1 else ''} one per core: mean "
            "latency " + stated(mean, us, f"{times(ratio(r['lat_mean_ns'], b['lat_mean_ns']))} that without them",
                                f"{us(r['lat_mean_ns'])} vs {us(b['lat_mean_ns'])}", "no clear difference")
            + "; p99 " + stated(p99, us, times(ratio(r["lat_p99_ns"], b["lat_p99_ns"])),
                                f"{us(r['lat_p99_ns'])} vs {us(b['lat_p99_ns'])}", "no clear difference") + ".")


def _network(data: pd.DataFrame, out: StudyResult) -> None:
    """Per-flow throughput of M network apps beside N L-apps against the same M flows alone."""
    flows = data[(data["leg"] == LEG) & (data["part"] == "network") & (data["engine"] == "iperf3")]
    if flows.empty:
        return
    totals = flow_totals(flows.assign(storage_apps=pd.to_numeric(flows["storage_apps"]).fillna(0)),
                         ["storage_apps", "net_flows", "net_shares_storage_core"])
    apart = totals[~totals["net_shares_storage_core"]]
    cells = [(int(n), int(m)) for n, m in sorted(set(zip(apart["storage_apps"], apart["net_flows"]))) if n > 0]

    def values(n: int, m: int, frame: pd.DataFrame = apart) -> list[float]:
        sel = frame[(frame["storage_apps"] == n) & (frame["net_flows"] == m)]
        return [float(v) for v in sel["per_flow"]]

    diffs = corrected([compare_values(values(0, m), values(n, m)) for n, m in cells])
    series, left_out = {}, {}
    for n in sorted(set(totals["storage_apps"])):
        label = "alone" if n == 0 else f"beside {int(n)} L-app{'s' if n > 1 else ''}"
        for frame, into in ((apart, series), (totals[totals["net_shares_storage_core"]], left_out)):
            ms = sorted(set(frame[frame["storage_apps"] == n]["net_flows"]))
            means = [values(int(n), int(m), frame) for m in ms]  # cells with shared cores: crosses
            if ms:
                into[label] = (ms, [sum(v) / len(v) * 8 / 1e9 if v else math.nan for v in means])
    out.figures.append(Figure("contention_network_apps_beside_lapps", plots_extra.lines(
        series, title="Throughput per network app beside L-apps", xlabel="network apps (one per core)",
        ylabel="Gbit/s per flow", left_out=left_out,
        left_out_label="left out: flows wrapped onto shared cores"),
        "Means over repeats, over the L-apps' window (the source's figure 12)."))
    for (n, m), diff in zip(cells, diffs):
        alone, beside = values(0, m), values(n, m)
        if not alone or not beside:
            continue
        a, b = sum(alone) / len(alone), sum(beside) / len(beside)
        who = f"{m} network app{'s' if m > 1 else ''} one per core beside {n} L-app{'s' if n > 1 else ''}"
        out.findings.append(claim(diff, _gbit, f"{who}: per-flow throughput kept {100 * ratio(b, a):.0f} % of the same "
                                  "flows alone", f"per-flow throughput between {who} and the same flows alone",
                                  f"{_gbit(b)} vs {_gbit(a)}; Holm over the {len(cells)} cells") + ".")


def _gbit(bytes_per_s: float) -> str:
    return "n/a" if bytes_per_s is None or math.isnan(bytes_per_s) else f"{bytes_per_s * 8 / 1e9:.2f} Gbit/s"
