"""The contention study's `many_apps` leg: several storage apps of one kind together, without and
with one network app that shares the first app's (role `main`) host and target cores.

As in the source (figures 3, 5, 9 and 10): the throughput of the T-app sharing its core with the
network app and of the T-apps on other cores, the L-apps' latency, and the network app's
throughput, each against the number of storage apps."""

from __future__ import annotations

import math

import pandas as pd

from .. import plots_extra
from .common import claim, corrected, compare_values, missing_leg, stated
from .extra import r1, ratio
from .result import Figure, StudyResult, Table
from .text import mbps, times, us

LEG = "many_apps"


def per_point(storage: pd.DataFrame) -> pd.DataFrame:
    """One row per measured point: the shared-core app's throughput, the mean throughput of the
    apps on other cores, and the latency every app saw (mean of means, worst p99)."""
    records = []
    for point_id, group in storage.groupby("point_id"):
        main = group[group["role"] == "main"]
        others = group[group["role"] != "main"]
        first = group.iloc[0]
        records.append({
            "point_id": point_id, "app": first["app"], "storage_apps": int(first["storage_apps"]),
            "net_flows": int(first["net_flows"]),
            "shared_bw": float(main["bw_bytes"].sum()) if len(main) else math.nan,
            "others_bw": float(others["bw_bytes"].mean()) if len(others) else math.nan,
            "lat_mean_ns": float(pd.to_numeric(group["lat_mean_ns"]).mean()),
            "lat_p99_ns": float(pd.to_numeric(group["lat_p99_ns"]).max())})
    return pd.DataFrame(records)


def analyze_many_apps(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    mine = rows[rows["leg"] == LEG] if not rows.empty else rows
    if mine.empty:
        return  # the leg was not asked for
    storage = data[(data["leg"] == LEG) & (data["part"] == "storage")]
    if storage.empty:
        out.findings.append(missing_leg(mine, LEG, "several storage apps beside a network app are not shown"))
        return
    storage = storage.assign(storage_apps=pd.to_numeric(storage["storage_apps"]))
    points = per_point(storage)
    groups = points.groupby(["app", "storage_apps", "net_flows"])
    med = groups[["shared_bw", "others_bw", "lat_mean_ns", "lat_p99_ns"]].mean()
    med["repeats"] = groups.size()
    med = med.reset_index()
    records = [{"storage app": r["app"], "storage apps": int(r["storage_apps"]),
                "network app": "yes" if r["net_flows"] else "no",
                "shared-core app MB/s": r1(r["shared_bw"], 1e6), "other apps MB/s each": r1(r["others_bw"], 1e6),
                "mean (µs)": r1(r["lat_mean_ns"], 1e3), "p99 (µs)": r1(r["lat_p99_ns"], 1e3),
                "repeats": int(r["repeats"])} for _, r in med.iterrows()]
    out.tables.append(Table("Several storage apps, without and with one network app", pd.DataFrame(records),
                            "The shared-core app (role main) shares its host core and target core with the network "
                            "app; T-apps run one per host core, L-apps all on the first host core. Latency: mean "
                            "of the apps' means, worst app's p99."))
    _throughput(points, med, out)
    _latency(points, med, out)
    _network(data, out)


def _values(points: pd.DataFrame, app: str, count: int, flows: int, column: str) -> list[float]:
    sel = points[(points["app"] == app) & (points["storage_apps"] == count) & (points["net_flows"] == flows)]
    return [float(v) for v in sel[column].dropna()]


def _throughput(points: pd.DataFrame, med: pd.DataFrame, out: StudyResult) -> None:
    tapps = med[med["app"] == "T-app"]
    if tapps.empty:
        return
    series = {}
    for flows, label in ((0, "without network app"), (1, "with a network app")):
        mine = tapps[tapps["net_flows"] == flows].sort_values("storage_apps")
        if mine.empty:
            continue
        series[f"shared-core T-app, {label}"] = (list(mine["storage_apps"]), list(mine["shared_bw"] / 1e6))
        others = mine.dropna(subset=["others_bw"])
        if len(others):
            series[f"T-apps on other cores, {label}"] = (list(others["storage_apps"]), list(others["others_bw"] / 1e6))
    out.figures.append(Figure("contention_many_tapps", plots_extra.lines(
        series, title="Throughput of each T-app vs number of T-apps", xlabel="storage T-apps",
        ylabel="MB/s per app"), "Means over repeats."))
    counts = [c for c in sorted(set(tapps["storage_apps"]))
              if {0, 1} <= set(tapps[tapps["storage_apps"] == c]["net_flows"])]
    # one comparison per T-app count and group (the shared-core app, the others): Holm over the counts
    shared_d = corrected([compare_values(_values(points, "T-app", c, 0, "shared_bw"),
                                         _values(points, "T-app", c, 1, "shared_bw")) for c in counts])
    others_d = dict(zip([c for c in counts if c > 1], corrected(
        [compare_values(_values(points, "T-app", c, 0, "others_bw"), _values(points, "T-app", c, 1, "others_bw"))
         for c in counts if c > 1])))
    held = f"; Holm over the {len(counts)} counts" if len(counts) > 1 else ""
    for count, shared in zip(counts, shared_d):
        row = tapps[tapps["storage_apps"] == count].set_index("net_flows")
        kept = 100 * ratio(row.at[1, "shared_bw"], row.at[0, "shared_bw"])
        apps = f"{count} T-app{'s' if count > 1 else ''}"
        text = claim(shared, mbps, f"With {apps}, the T-app sharing its core with a network app kept {kept:.0f} % of "
                     "its throughput without it", f"throughput with {apps} for the T-app sharing its core with a "
                     "network app", f"{mbps(row.at[1, 'shared_bw'])} vs {mbps(row.at[0, 'shared_bw'])}{held}")
        if count in others_d:
            kept_o = 100 * ratio(row.at[1, "others_bw"], row.at[0, "others_bw"])
            other = claim(others_d[count], mbps, f"the T-apps on other cores kept {kept_o:.0f} %",
                          "throughput for the T-apps on other cores",
                          f"{mbps(row.at[1, 'others_bw'])} vs {mbps(row.at[0, 'others_bw'])}{held}")
            text += "; " + other
        out.findings.append(text + ".")


def _latency(points: pd.DataFrame, med: pd.DataFrame, out: StudyResult) -> None:
    lapps = med[med["app"] == "L-app"].sort_values(["net_flows", "storage_apps"])
    if lapps.empty:
        return
    one_alone = lapps[(lapps["storage_apps"] == lapps["storage_apps"].min()) & (lapps["net_flows"] == 0)]
    groups = [f"{int(r['storage_apps'])} L-app{'s' if r['storage_apps'] > 1 else ''}\n"
              f"{'+ network app' if r['net_flows'] else 'alone'}" for _, r in lapps.iterrows()]
    out.figures.append(Figure("contention_many_lapps_latency", plots_extra.grouped_bars(groups, {
        "mean": list(lapps["lat_mean_ns"] / 1e3), "p99": list(lapps["lat_p99_ns"] / 1e3)},
        title="L-app latency vs number of L-apps on one core, with and without a network app",
        ylabel="latency (µs)"), "Means over repeats; p99 of the worst L-app."))
    if one_alone.empty:
        return
    base = one_alone.iloc[0]
    n0 = int(base["storage_apps"])
    shared = [r for _, r in lapps[lapps["net_flows"] == 1].iterrows()]
    # One comparison per L-app count and metric: Holm over the counts, per metric.
    means_d = corrected([compare_values(_values(points, "L-app", n0, 0, "lat_mean_ns"),
                                        _values(points, "L-app", int(r["storage_apps"]), 1, "lat_mean_ns"))
                         for r in shared])
    p99s_d = corrected([compare_values(_values(points, "L-app", n0, 0, "lat_p99_ns"),
                                       _values(points, "L-app", int(r["storage_apps"]), 1, "lat_p99_ns"))
                        for r in shared])
    held = f"; Holm over the {len(shared)} counts" if len(shared) > 1 else ""
    for r, mean, p99 in zip(shared, means_d, p99s_d):
        count = int(r["storage_apps"])
        alone = f"{n0} L-app alone" if n0 == 1 else f"{n0} L-apps alone"
        out.findings.append(
            f"{count} L-app{'s' if count > 1 else ''} sharing a core with a network app: mean latency "
            + stated(mean, us, f"{times(ratio(r['lat_mean_ns'], base['lat_mean_ns']))} that of {alone}",
                     f"{us(r['lat_mean_ns'])} vs {us(base['lat_mean_ns'])}{held}", "no clear difference")
            + "; p99 " + stated(p99, us, f"{times(ratio(r['lat_p99_ns'], base['lat_p99_ns']))}",
                                 f"{us(r['lat_p99_ns'])} vs {us(base['lat_p99_ns'])}{held}", "no clear difference")
            + ".")


def _network(data: pd.DataFrame, out: StudyResult) -> None:
    """The network app's throughput beside 1..N storage apps, against the flow alone measured in the
    same rounds (leg many_apps, storage_apps = 0); a store from before that baseline existed falls
    back to the isolated leg's one flow, and the finding says so."""
    flows = data[(data["part"] == "network") & (data["engine"] == "iperf3")]
    beside = flows[flows["leg"] == LEG]
    if beside.empty:
        return
    beside = beside.assign(storage_apps=pd.to_numeric(beside["storage_apps"]))
    alone = beside[beside["storage_apps"] == 0]
    beside = beside[beside["storage_apps"] > 0]
    where = "the flow alone measured in the same rounds"
    if alone.empty:
        alone = flows[(flows["leg"] == "isolated") & (pd.to_numeric(flows["net_flows"]) == 1)]
        if "placement" in alone:  # the one flow alone in the network app's own layout: on the first cores
            alone = alone[alone["placement"].isin(["same", "none"]) | alone["placement"].isna()]
        where = "the flow alone measured in the isolated leg's block, not in these rounds"
    if beside.empty:
        return
    base = float(alone["bw_bytes"].mean()) if len(alone) else math.nan
    series = {}
    apps = list(beside.groupby("app"))
    tops = [group["storage_apps"].max() for _, group in apps]
    # one comparison per kind of storage app, each at its largest count: Holm over the kinds
    diffs = corrected([compare_values([float(v) for v in alone["bw_bytes"]],
                                      [float(v) for v in group[group["storage_apps"] == top]["bw_bytes"]])
                       for (_, group), top in zip(apps, tops)])
    for (app, group), top, diff in zip(apps, tops, diffs):
        med = group.groupby("storage_apps")["bw_bytes"].mean().sort_index()
        series[f"beside {app}s"] = ([0] + list(med.index), [base * 8 / 1e9] + list(med * 8 / 1e9))
        if not math.isnan(base):
            out.findings.append(claim(
                diff, _gbit, f"The network app sharing a core with {app}s ({int(top)} in all) kept "
                f"{100 * ratio(med[top], base):.0f} % of its throughput alone",
                f"the network app's throughput beside {int(top)} {app}s and alone",
                f"{med[top] * 8 / 1e9:.2f} vs {base * 8 / 1e9:.2f} Gbit/s; {where}"
                + (f"; Holm over the {len(apps)} kinds of storage app" if len(apps) > 1 else "")) + ".")
    out.figures.append(Figure("contention_network_vs_storage_apps", plots_extra.lines(
        series, title="Network app throughput vs number of storage apps", xlabel="storage apps (0 = flow alone)",
        ylabel="Gbit/s"), f"Means over repeats; {where}."))


def _gbit(bytes_per_s: float) -> str:
    """The network app's throughput and its interval in the unit its values are given in."""
    return "n/a" if bytes_per_s is None or math.isnan(bytes_per_s) else f"{bytes_per_s * 8 / 1e9:.2f} Gbit/s"
