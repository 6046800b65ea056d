"""The `contention` study (end-host contention report): storage T-apps and L-apps beside iperf3
network apps on the same core and on different cores; each app's throughput and latency against
the app running alone, and CPU utilization per core on the sender (storage host) and receiver
(target)."""

from __future__ import annotations

import math

import pandas as pd

from .. import plots_extra
from .common import (claim, compare_frames, compare_values, corrected, descriptive, excluded_points, missing_leg,
                     stated, study_rows)
from .contention_grid import LEG as GRID, analyze_grid, flow_totals
from .contention_many import LEG as MANY, analyze_many_apps
from .cores_used import used_text, with_cores
from .extra import means, r1, ratio, with_knobs
from .result import Figure, StudyResult, Table
from .stats import usable
from .text import mbps, times, us

STUDY = "contention"
KNOBS = ["app", "net_flows", "placement", "part", "net_shares_storage_core", "storage_apps"]
PLACE = {"same_core": "same core", "different_core": "different cores",
         "one_per_core": "one core per network app (the first on the storage app's)"}
# isolated network points name their layout by placement ("none": stored before one existed, all on the storage core)
PLACEMENT_LEG = {"same": "same_core", "none": "same_core", "different": "different_core", "one_per_core": "one_per_core"}


def gbit(bytes_per_s: float) -> str:
    return "n/a" if bytes_per_s is None or math.isnan(bytes_per_s) else f"{bytes_per_s * 8 / 1e9:.2f} Gbit/s"


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Storage vs network applications on shared and separate cores")
    out.excluded = excluded_points(rows)
    rows = with_knobs(rows, KNOBS)
    data = usable(rows)
    if data.empty:
        out.findings.append("The contention study has no usable measurements"
                            + (f": {missing_leg(rows, 'isolated', 'nothing can be compared')}" if not rows.empty else "."))
        return out
    data = with_cores(data.assign(net_flows=pd.to_numeric(data["net_flows"])))
    storage = data[(data["part"] == "storage") & (data["role"] == "main") & ~data["leg"].isin([MANY, GRID])]
    network = data[data["part"] == "network"]
    _storage(rows, storage, out, network)
    _network(rows, network[~network["leg"].isin([MANY, GRID])], out)
    _cpu(network, out)
    analyze_many_apps(rows, data, out)
    analyze_grid(rows, data, out)
    return out


def flagged(frame: pd.DataFrame) -> pd.Series:
    """Rows whose flows landed on cores their placement meant to keep apart (knob
    net_shares_storage_core, set by the study where a small machine wrapped the cores)."""
    if frame.empty or "net_shares_storage_core" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["net_shares_storage_core"].map(lambda v: v is True or v == 1 or v == "True")


def flow_cores(network: pd.DataFrame) -> str:
    """The cores the flows' iperf3 clients (host) and servers (target) ran on, from the per-core CPU
    rows the flows store ("cpu:host:1"); the storage app's own cores are among them."""
    if network.empty or "engine" not in network:
        return ""
    sides: dict[str, set[int]] = {}
    for engine in network["engine"].dropna():
        parts = str(engine).split(":")
        if len(parts) == 3 and parts[0] == "cpu" and parts[2].isdigit():
            sides.setdefault(parts[1], set()).add(int(parts[2]))
    return " · ".join(f"{side} " + ",".join(f"cpu{c}" for c in sorted(cores)) for side, cores in sorted(sides.items()))


def _storage(rows: pd.DataFrame, storage: pd.DataFrame, out: StudyResult,
             network: pd.DataFrame | None = None) -> None:
    network = network if network is not None else storage.iloc[0:0]
    alone = means(storage[storage["leg"] == "isolated"], ["app"]).set_index("app")
    mixed = storage[storage["leg"].isin(list(PLACE))]
    # "Different cores" that wrapped onto the storage app's cores (a small machine) are flagged and
    # kept out of the comparisons: they would claim a separation that was not there.
    wrapped = flagged(mixed)
    if wrapped.any():
        cells = sorted({(PLACE[leg], a, int(n)) for leg, a, n in
                        zip(mixed.loc[wrapped, "leg"], mixed.loc[wrapped, "app"], mixed.loc[wrapped, "net_flows"])})
        legs = sorted(set(mixed.loc[wrapped, "leg"]))
        out.findings.append(
            "On this machine network apps landed on cores their placement meant to keep apart (the storage "
            "app's, each other's, or on one machine the other side's) for "
            + ", ".join(f"{a} with {n} flow(s) on {place}" for place, a, n in cells)
            + f" ({flow_cores(network[network['leg'].isin(legs)])}): those points are flagged "
              "(net_shares_storage_core) and left out of the findings below.")
        mixed = mixed[~wrapped]
    if alone.empty:
        out.findings.append(missing_leg(rows, "isolated", "no storage app has a baseline to compare against"))
        return
    if mixed.empty:
        if wrapped.any():
            return  # said above: every point with network apps wrapped onto shared cores
        asked = [leg for leg in PLACE if leg in set(rows["leg"])] or list(PLACE)
        for leg in asked:
            out.findings.append(missing_leg(rows, leg, f"storage apps on {PLACE[leg]} with network apps are not shown"))
        return
    med = means(mixed, ["app", "leg", "net_flows"])
    records, series, diffs = [], {}, []
    for _, row in med.iterrows():
        app = row["app"]
        if app not in alone.index:
            continue
        base = alone.loc[app]
        solo = storage[(storage["leg"] == "isolated") & (storage["app"] == app)]
        beside = mixed[(mixed["app"] == app) & (mixed["leg"] == row["leg"]) & (mixed["net_flows"] == row["net_flows"])]
        diffs.append({m: compare_frames(solo, beside, m) for m in ("bw_bytes", "lat_mean_ns", "lat_p99_ns")})
        kept = 100 * ratio(row["bw_bytes"], base["bw_bytes"])
        flows_here = network[(network["leg"] == row["leg"]) & (network["net_flows"] == row["net_flows"])
                             & (network["app"] == app)]
        records.append({"storage app": app, "network apps on": PLACE[row["leg"]], "iperf3 flows": int(row["net_flows"]),
                        "storage cores": used_text(beside) or "—", "flow cores": flow_cores(flows_here) or "—",
                        "MB/s": r1(row["bw_bytes"], 1e6), "throughput kept %": r1(kept),
                        "mean (µs)": r1(row["lat_mean_ns"], 1e3), "mean × alone": r1(ratio(row["lat_mean_ns"], base["lat_mean_ns"]), 1, 2),
                        "p99 (µs)": r1(row["lat_p99_ns"], 1e3), "p99 × alone": r1(ratio(row["lat_p99_ns"], base["lat_p99_ns"]), 1, 2),
                        "repeats": int(row["repeats"])})
        series.setdefault(f"{app}, {PLACE[row['leg']]}", ([0], [100.0]))
        xs, ys = series[f"{app}, {PLACE[row['leg']]}"]
        series[f"{app}, {PLACE[row['leg']]}"] = (xs + [row["net_flows"]], ys + [kept])
    alone_rows = [{"storage app": app, "MB/s": r1(r["bw_bytes"], 1e6), "mean (µs)": r1(r["lat_mean_ns"], 1e3),
                   "p99 (µs)": r1(r["lat_p99_ns"], 1e3), "repeats": int(r["repeats"])} for app, r in alone.iterrows()]
    out.tables.append(Table("Storage apps alone", pd.DataFrame(alone_rows),
                            "T-app: sequential read 128 KiB QD4; L-app: sequential read 4 KiB QD1; one job each."))
    out.tables.append(Table("Storage apps beside iperf3 flows", pd.DataFrame(records),
                            "Same core: the flows' clients on the storage app's host core and their servers on the "
                            "target core serving it. Different cores: each flow on cores of its own. One core per "
                            "network app: flow i on host and target core i, so the first shares the storage app's "
                            "cores (the source's one-to-one mapping). Small machines wrap cores: see the knob "
                            "net_shares_storage_core."))
    out.figures.append(Figure("contention_storage_vs_flows", plots_extra.lines(
        series, title="Storage throughput kept vs number of competing iperf3 flows",
        xlabel="iperf3 flows (network apps)", ylabel="% of the app's throughput alone"),
        "0 flows = the app alone (100 %)."))
    lapp = med[med["app"] == "L-app"]
    if len(lapp) and "L-app" in alone.index:
        groups = ["alone"] + [f"{int(r['net_flows'])} flow{'s' if r['net_flows'] > 1 else ''}\n{PLACE[r['leg']]}"
                              for _, r in lapp.iterrows()]
        out.figures.append(Figure("contention_lapp_latency", plots_extra.grouped_bars(groups, {
            "mean": [alone.at["L-app", "lat_mean_ns"] / 1e3] + list(lapp["lat_mean_ns"] / 1e3),
            "p99": [alone.at["L-app", "lat_p99_ns"] / 1e3] + list(lapp["lat_p99_ns"] / 1e3)},
            title="L-app latency alone and beside iperf3 flows", ylabel="latency (µs)"), "Means over repeats."))
    # Every (app, placement, flows) cell against the app alone is one family per metric: Holm.
    for metric in ("bw_bytes", "lat_mean_ns", "lat_p99_ns"):
        for diff, fixed in zip(diffs, corrected([d[metric] for d in diffs])):
            diff[metric] = fixed
    for rec, diff in zip(records, diffs):
        flows = f"{rec['iperf3 flows']} iperf3 flow{'s' if rec['iperf3 flows'] > 1 else ''} on {rec['network apps on']}"
        if rec["storage app"] == "T-app":
            out.findings.append(claim(
                diff["bw_bytes"], mbps, f"A T-app with {flows} kept {rec['throughput kept %']:.0f} % of its throughput",
                f"throughput between a T-app with {flows} and alone",
                f"{rec['MB/s']:.0f} vs {alone.at['T-app', 'bw_bytes'] / 1e6:.0f} MB/s") + ".")
        else:
            mean = stated(diff["lat_mean_ns"], us, f"{times(rec['mean × alone'])} its latency alone",
                          f"{rec['mean (µs)']} µs vs {alone.at['L-app', 'lat_mean_ns'] / 1e3:.1f} µs",
                          "no clear difference from alone")
            p99 = stated(diff["lat_p99_ns"], us, f"{times(rec['p99 × alone'])} its p99 alone",
                         f"{rec['p99 (µs)']} µs vs {alone.at['L-app', 'lat_p99_ns'] / 1e3:.1f} µs",
                         "no clear difference from alone")
            out.findings.append(f"An L-app with {flows}: mean latency {mean}; p99 {p99}.")

def _network(rows: pd.DataFrame, network: pd.DataFrame, out: StudyResult) -> None:
    """Throughput per flow over the storage app's window, alone and beside each storage app in the
    same layout, with the interval of the difference over repeats (Holm over the cells)."""
    flows = network[network["engine"] == "iperf3"]
    if flows.empty:
        mine = rows[rows["part"] == "network"] if "part" in rows else rows
        reasons = mine["error"].dropna()
        out.findings.append("No network app was measured" + (f" ({reasons.iloc[0]})" if len(reasons) else "")
                            + ", so the network apps' throughput and the CPU per core are not shown.")
        return
    flows = flows.assign(layout=[PLACEMENT_LEG.get(p, leg) if leg == "isolated" else leg
                                 for leg, p in zip(flows["leg"], flows["placement"])])
    every = flow_totals(flows, ["leg", "layout", "app", "net_flows", "net_shares_storage_core"])
    kept_out = every[flagged(every)]
    per_point = every[~flagged(every)]
    cells, diffs, series = [], [], {}
    for (leg, layout, app, n), group in every.groupby(["leg", "layout", "app", "net_flows"], sort=True):
        alone = every[(every["leg"] == "isolated") & (every["layout"] == layout) & (every["net_flows"] == n)]
        shared = bool(flagged(group).any() or flagged(alone).any())
        cells.append((leg, layout, app, int(n), group, alone, shared))
        diffs.append(compare_values(list(alone["per_flow"]), list(group["per_flow"]))
                     if leg != "isolated" and not shared else None)
    tested = corrected([d for d in diffs if d is not None])
    it = iter(tested)
    diffs = [next(it) if d is not None else None for d in diffs]
    records = []
    for (leg, layout, app, n, group, alone, shared), diff in zip(cells, diffs):
        mean, base = float(group["per_flow"].mean()), float(alone["per_flow"].mean()) if len(alone) else math.nan
        beside = "alone" if leg == "isolated" else f"beside the {app}"
        records.append({"iperf3 flows": n, "placement": PLACE.get(layout, layout), "running": beside,
                        "flow cores": flow_cores(network[(network["leg"] == leg) & (network["net_flows"] == n)
                                                         & (network["app"] == app)]) or "—",
                        "total Gbit/s": r1(float(group["bw_bytes"].mean()) * 8, 1e9, 2),
                        "per flow Gbit/s": r1(mean * 8, 1e9, 2), "per flow % of alone": r1(100 * ratio(mean, base)),
                        "Δ per flow vs alone": diff.text(gbit) if diff is not None else "—",
                        "repeats": len(group), "cores shared": "yes (flagged)" if shared else "no"})
        label = f"{beside}, {PLACE.get(layout, layout)}"
        xs, ys = series.get(label, ([], []))
        series[label] = (xs + [n], ys + [mean * 8 / 1e9])
        if diff is not None:
            kept = 100 * ratio(mean, base)
            who = f"{n} iperf3 flow{'s' if n > 1 else ''} on {PLACE.get(layout, layout)} beside the {app}"
            out.findings.append(claim(diff, gbit, f"{who}: per-flow throughput kept {kept:.0f} % of the same flows alone",
                                      f"per-flow throughput between {who} and the same flows alone",
                                      f"{gbit(mean)} vs {gbit(base)}") + ".")
    out.tables.append(Table("Network apps (iperf3) alone and beside storage apps", pd.DataFrame(records),
                            "Throughput per flow over the storage app's measured window (iperf3 interval records "
                            "cut to it); alone = the same flows in the same layout without a storage app, in the "
                            "same rounds. Δ: mean over repeats with its 95 % interval (Welch), Holm over the cells; "
                            "none where flows wrapped onto cores meant to be apart (cores shared)."))
    out.figures.append(Figure("contention_network_per_flow", plots_extra.lines(
        series, title="Throughput per network app vs number of flows", xlabel="iperf3 flows",
        ylabel="Gbit/s per flow"), "Means over repeats, over the storage app's window."))
    if len(kept_out):
        out.findings.append(f"{len(kept_out)} network measurement(s) whose flows wrapped onto shared cores are left "
                            "out of the network findings (net_shares_storage_core).")
    alone = per_point[per_point["leg"] == "isolated"]
    if alone.empty:
        if not (kept_out["leg"] == "isolated").any():
            out.findings.append(missing_leg(rows[rows["part"] == "network"], "isolated",
                                            "the network apps have no baseline alone"))
        return
    for layout, group in alone.groupby("layout", sort=True):
        med = group.groupby("net_flows")["per_flow"].mean().sort_index()
        where = "" if layout == "same_core" else f" ({PLACE.get(layout, layout)})"
        lo, hi = int(med.index[0]), int(med.index[-1])
        out.findings.append(descriptive(
            f"Alone, {lo} iperf3 flow{'s' if lo > 1 else ''}{where} reached {gbit(med.iloc[0])} per flow"
            + (f"; {hi} flows {gbit(med.iloc[-1])} per flow." if len(med) > 1 else ".")))


def _cpu(network: pd.DataFrame, out: StudyResult) -> None:
    cpu = network[network["engine"].fillna("").str.startswith("cpu:")]
    if cpu.empty:
        return
    cpu = cpu.assign(side=[e.split(":")[1] for e in cpu["engine"]], core=[int(e.split(":")[2]) for e in cpu["engine"]],
                     busy=cpu["usr_cpu"] + cpu["sys_cpu"])
    med = cpu.groupby(["leg", "app", "net_flows", "side", "core"], as_index=False)[["usr_cpu", "sys_cpu", "busy"]].mean()
    out.tables.append(Table("CPU utilization per core (sender = storage host, receiver = target)", pd.DataFrame({
        "leg": med["leg"], "storage app": med["app"].where(med["app"] != "net", "none"),
        "iperf3 flows": med["net_flows"].astype(int),
        "side": med["side"].map({"host": "sender", "target": "receiver"}), "core": med["core"],
        "user %": [r1(v) for v in med["usr_cpu"]], "system %": [r1(v) for v in med["sys_cpu"]]}),
        "From /proc/stat over the flows' lifetime; system includes irq and softirq. On one machine (loopback) "
        "sender and receiver cores belong to the same kernel, so both sides' work shows on both."))
    top = med[(med["app"] == "T-app") & ~med["leg"].isin([MANY, GRID])]
    if top.empty:
        top = med
    flows_max = top["net_flows"].max()
    pick = top[top["net_flows"] == flows_max]
    groups = [f"{'sender' if s == 'host' else 'receiver'} core {c}" for s, c in dict.fromkeys(zip(pick["side"], pick["core"]))]
    keys = list(dict.fromkeys(zip(pick["side"], pick["core"])))
    series = {}
    for leg, g in pick.groupby("leg"):
        values = {(s, c): b for s, c, b in zip(g["side"], g["core"], g["busy"])}
        series[PLACE.get(leg, leg)] = [values.get(k, math.nan) for k in keys]
    out.figures.append(Figure("contention_cpu_per_core", plots_extra.grouped_bars(
        groups, series, title=f"CPU utilization per core with {int(flows_max)} iperf3 flows beside the "
                              f"{pick['app'].iloc[0] if pick['app'].iloc[0] != 'net' else 'flows alone'}",
        ylabel="busy % (user + system)"), "Means over repeats."))
