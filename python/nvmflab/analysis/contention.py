"""The `contention` study (end-host contention report): storage T-apps and L-apps beside iperf3
network apps on the same core and on different cores; each app's throughput and latency against
the app running alone, and CPU utilization per core on the sender (storage host) and receiver
(target)."""

from __future__ import annotations

import math

import pandas as pd

from .. import plots_extra
from .common import corrected, compare_frames, excluded_points, missing_leg, stated, study_rows
from .contention_many import LEG as MANY, analyze_many_apps
from .cores_used import used_text, with_cores
from .extra import means, r1, ratio, with_knobs
from .result import Figure, StudyResult, Table
from .stats import usable
from .text import mbps, times, us

STUDY = "contention"
KNOBS = ["app", "net_flows", "placement", "part", "net_shares_storage_core", "storage_apps"]
PLACE = {"same_core": "same core", "different_core": "different cores"}


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
    storage = data[(data["part"] == "storage") & (data["role"] == "main") & (data["leg"] != MANY)]
    network = data[data["part"] == "network"]
    _storage(rows, storage, out, network)
    _network(rows, network[network["leg"] != MANY], out)
    _cpu(network, out)
    analyze_many_apps(rows, data, out)
    return out


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
    wrapped = (mixed["leg"] == "different_core") & mixed["net_shares_storage_core"].map(
        lambda v: v is True or v == 1 or v == "True") if "net_shares_storage_core" in mixed else None
    if wrapped is not None and wrapped.any():
        cells = sorted({(a, int(n)) for a, n in zip(mixed.loc[wrapped, "app"], mixed.loc[wrapped, "net_flows"])})
        out.findings.append(
            "On this machine the \"different cores\" placement put network apps on the storage app's cores for "
            + ", ".join(f"{a} with {n} flow(s)" for a, n in cells)
            + f" ({flow_cores(network[(network['leg'] == 'different_core')])}): those points are flagged "
              "(net_shares_storage_core) and left out of the findings below.")
        mixed = mixed[~wrapped]
    if alone.empty:
        out.findings.append(missing_leg(rows, "isolated", "no storage app has a baseline to compare against"))
        return
    if mixed.empty:
        for leg in PLACE:
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
                            "target core serving it. Different cores: each flow on cores of its own (wrapping on "
                            "small machines, see the knob net_shares_storage_core)."))
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
            kept = stated(diff["bw_bytes"], mbps, f"kept {rec['throughput kept %']:.0f} % of its throughput",
                          f"{rec['MB/s']:.0f} vs {alone.at['T-app', 'bw_bytes'] / 1e6:.0f} MB/s",
                          "showed no significant difference in throughput from running alone")
            out.findings.append(f"A T-app with {flows} {kept}.")
        else:
            mean = stated(diff["lat_mean_ns"], us, f"{times(rec['mean × alone'])} its latency alone",
                          f"{rec['mean (µs)']} µs vs {alone.at['L-app', 'lat_mean_ns'] / 1e3:.1f} µs",
                          "no significant difference from alone")
            p99 = stated(diff["lat_p99_ns"], us, f"{times(rec['p99 × alone'])} its p99 alone",
                         f"{rec['p99 (µs)']} µs vs {alone.at['L-app', 'lat_p99_ns'] / 1e3:.1f} µs",
                         "no significant difference from alone")
            out.findings.append(f"An L-app with {flows}: mean latency {mean}; p99 {p99}.")

def _network(rows: pd.DataFrame, network: pd.DataFrame, out: StudyResult) -> None:
    flows = network[network["engine"] == "iperf3"]
    if flows.empty:
        mine = rows[rows["part"] == "network"] if "part" in rows else rows.iloc[0:0]
        reasons = mine["error"].dropna()
        out.findings.append("No network app was measured" + (f" ({reasons.iloc[0]})" if len(reasons) else "")
                            + ", so the network apps' throughput and the CPU per core are not shown.")
        return
    per_point = flows.groupby(["point_id", "leg", "app", "net_flows"], as_index=False)["bw_bytes"].sum()
    per_point["per_flow"] = per_point["bw_bytes"] / per_point["net_flows"]
    med = per_point.groupby(["leg", "app", "net_flows"], as_index=False)[["bw_bytes", "per_flow"]].mean()
    alone = med[med["leg"] == "isolated"].set_index("net_flows")
    records, series = [], {}
    for _, row in med.iterrows():
        base = alone["per_flow"].get(row["net_flows"], math.nan)
        beside = "alone" if row["leg"] == "isolated" else f"beside the {row['app']} on {PLACE.get(row['leg'], row['leg'])}"
        records.append({"iperf3 flows": int(row["net_flows"]), "running": beside, "total Gbit/s": r1(row["bw_bytes"] * 8, 1e9, 2),
                        "per flow Gbit/s": r1(row["per_flow"] * 8, 1e9, 2),
                        "per flow % of alone": r1(100 * ratio(row["per_flow"], base))})
        xs, ys = series.get(beside, ([], []))
        series[beside] = (xs + [row["net_flows"]], ys + [row["per_flow"] * 8 / 1e9])
    out.tables.append(Table("Network apps (iperf3) alone and beside storage apps", pd.DataFrame(records),
                            "Receiver-side throughput per iperf3 client; flows last ramp_time + runtime (+ a little "
                            "slack beside a storage app, whose start they precede)."))
    out.figures.append(Figure("contention_network_per_flow", plots_extra.lines(
        series, title="Throughput per network app vs number of flows", xlabel="iperf3 flows",
        ylabel="Gbit/s per flow"), "Means over repeats."))
    if len(alone):
        first = alone.iloc[0]
        out.findings.append(f"Alone, {int(alone.index[0])} iperf3 flow{'s' if alone.index[0] > 1 else ''} reached "
                            f"{gbit(first['per_flow'])} per flow"
                            + (f"; {int(alone.index[-1])} flows {gbit(alone.iloc[-1]['per_flow'])} per flow."
                               if len(alone) > 1 else "."))
    else:
        out.findings.append(missing_leg(rows[rows["part"] == "network"], "isolated",
                                        "the network apps have no baseline alone"))


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
    top = med[(med["app"] == "T-app") & (med["leg"] != MANY)]
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
