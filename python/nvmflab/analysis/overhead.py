"""The `overhead` study: what NVMe/TCP costs compared with local access (thesis ch. 5).

Legs: `local` (same backend, no network stack), `loopback` (NVMe/TCP on one host: software
overhead), `netns` (NVMe/TCP across an emulated link: network overhead). The L-app is 4 KiB
random read at QD1, the T-app the 4 KiB random-read queue-depth sweep, the B-app every block size
(the best bandwidth over queue depths and patterns per block size, as fig. 5.3). When the netns
leg ran over a plain veth pair (no `tc netem` on this kernel), every place showing its numbers
says so, and its share is called the veth hop's, not an emulated network's. With the study's
`device` option, the B-app also runs against a model device (`overhead_device.py`).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from .. import plots
from .common import (claim, compare, contrast, corrected, descriptive, excluded_points, leg_rows, missing_leg, stated,
                     study_rows)
from ..findings_data import Finding
from .conditions import conditions_text
from .cores_used import cores_text
from .overhead_device import device_section
from .formulas import concurrency, overhead_decomposition, peak_ratio
from .decide import fewest_not_below_summary
from .result import Figure, StudyResult, Table
from .stats import aggregate
from .text import kiops, mbps, pct, size, times, us

STUDY = "overhead"
LEGS = ("local", "loopback", "netns")
LEG_LABEL = {
    "local": "local (no network stack)",
    "loopback": "NVMe/TCP loopback",
    "netns": "NVMe/TCP across netns link",
}
L_APP_BS = 4096
PLAIN_VETH = "plain veth, no netem"


def netns_caveat(data: pd.DataFrame) -> str | None:
    """Why the netns numbers are not those of an emulated link; None when netem shaped it."""
    netns = [json.loads(k) for k in data.loc[data["leg"] == "netns", "knobs_json"]]
    if not any(knobs.get("netns_link") == "none" for knobs in netns):
        return None
    asked = f"{netns[0].get('netns_delay_us')} µs delay" + (
        f" and {netns[0]['netns_rate']} rate" if netns[0].get("netns_rate") else "")
    return (f"The netns leg ran over a plain veth pair: tc netem was not available, so the {asked} asked "
            f"for were not applied. Its numbers (marked [{PLAIN_VETH}]) measure a hop between network "
            "namespaces, not an emulated network link, and the \"network\" overhead is that hop's cost.")


LINK = {"text": ""}  # the netns link as measured, set by analyze() for the names below


def link_text(data: pd.DataFrame) -> str:
    """The emulated link's delay and rate as the netns points recorded them ('' without netns)."""
    netns = [json.loads(k or "{}") for k in data.loc[data["leg"] == "netns", "knobs_json"]]
    if not netns:
        return ""
    knobs = netns[0]
    if knobs.get("netns_link") == "none":
        return ""  # the plain-veth caveat says it
    if "netns_delay_us" not in knobs and "netns_rate" not in knobs:
        return ""  # the points did not record their link
    delay, rate = knobs.get("netns_delay_us"), knobs.get("netns_rate")
    if not delay and not rate:
        return "veth, no delay, no rate cap"
    return f"veth, {delay or 0} µs delay, " + (f"{rate} rate" if rate else "no rate cap")


def _name(leg: str, plain_veth: bool) -> str:
    """The leg as findings and table columns call it, with the link it crossed on netns."""
    if leg == "netns" and plain_veth:
        return f"{leg} [{PLAIN_VETH}]"
    return f"{leg} [{LINK['text']}]" if leg == "netns" and LINK["text"] else leg


def _label(leg: str, plain_veth: bool) -> str:
    """The leg as figure legends call it."""
    if leg == "netns" and (plain_veth or LINK["text"]):
        return LEG_LABEL[leg] + f" [{PLAIN_VETH if plain_veth else LINK['text']}]"
    return LEG_LABEL.get(leg, leg)


def _app(data: pd.DataFrame, app: str) -> pd.DataFrame:
    """Rows of one application model by the `app` knob; every row when no point recorded it."""
    apps = data["knobs_json"].map(lambda k: json.loads(k or "{}").get("app"))
    return data[apps == app] if apps.notna().any() else data


def _rows(rows: pd.DataFrame) -> pd.DataFrame:
    parts = [leg_rows(rows, leg, "main") for leg in LEGS]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts) if parts else rows.iloc[0:0]


def _b_rows(data: pd.DataFrame) -> pd.DataFrame:
    """B-app rows, when points recorded their app (they are left out of the L-app and T-app)."""
    apps = data["knobs_json"].map(lambda k: json.loads(k or "{}").get("app"))
    return data[apps == "B-app"]


def _us2(ns: float) -> str:
    return f"{ns / 1e3:.2f} µs"


def _t_app(data: pd.DataFrame) -> pd.DataFrame:
    """4 KiB random reads: the L-app (QD1) and T-app (QD sweep) share this selection."""
    selected = data[data["bs"] == L_APP_BS]
    if "rw" in selected and (selected["rw"] == "randread").any():
        selected = selected[selected["rw"] == "randread"]
    return selected


def _l_app(agg: pd.DataFrame, out: StudyResult, rows: pd.DataFrame, present: list[str], veth: bool) -> None:
    qd1 = agg[agg["iodepth"] == 1].set_index("leg")
    legs = [leg for leg in LEGS if leg in qd1.index]
    if not legs:
        out.findings.append("No leg has an L-app measurement (small random reads at queue depth one), so the "
                            "L-app overhead was not computed.")
        return
    p99 = {leg: qd1.at[leg, "lat_p99_ns_mean"] for leg in legs}
    ci = {leg: qd1.at[leg, "lat_p99_ns_ci95"] for leg in legs}
    out.figures.append(Figure(
        "overhead_l_app_p99",
        plots.bars([_label(leg, veth) for leg in legs], [p99[leg] / 1e3 for leg in legs],
                   [ci[leg] / 1e3 for leg in legs],
                   title="L-app p99 latency: local vs NVMe/TCP (4 KiB random read, QD1, 1 job)",
                   ylabel="p99 latency (µs)"),
        "p99 latency of the latency-sensitive application on each path; error bars are 95 % "
        "confidence intervals over repeats (thesis fig. 5.1)."))
    to_us = {leg: (p99[leg] / 1e3 if leg in p99 else None) for leg in LEGS}
    parts = overhead_decomposition(to_us["local"], to_us["loopback"], to_us["netns"])
    out.tables.append(Table(
        "L-app overhead decomposition",
        pd.DataFrame([{"component": p.name + (f" [{PLAIN_VETH}]" if veth and p.name != "software" else ""),
                       "relative to": p.baseline,
                       "added p99 (µs)": round(p.delta_us, 2), "added p99 (%)": round(p.pct, 1)}
                      for p in parts]),
        "software = loopback − local, network = netns − loopback, total = netns − local; "
        "p99 at QD1 (thesis ch. 5.1)." + (f" The netns leg ran over a {PLAIN_VETH}: network is the cost of a "
                                          "veth hop, not of an emulated link." if veth else "")))
    network_name = "veth-hop overhead (no emulated link)" if veth else "network overhead"
    ends = {"software": ("local", "loopback"), "network": ("loopback", "netns"), "total": ("local", "netns")}
    measured = [(part, what) for part, what in zip(parts, ("software overhead", network_name, "total overhead"))
                if not math.isnan(part.delta_us)]
    software, network = parts[0].delta_us, parts[1].delta_us
    both = not math.isnan(software) and not math.isnan(network)
    # The decomposition's comparisons are one family (each part, and network − software): Holm
    # over them, so one of several that clears 5 % by chance is not reported as an overhead.
    diffs = [compare(qd1.loc[ends[part.name][0]], qd1.loc[ends[part.name][1]], "lat_p99_ns") for part, _ in measured]
    if both:
        # network − software = (netns − loopback) − (loopback − local), over independent legs
        diffs.append(contrast([(1, qd1.loc["netns"]), (-2, qd1.loc["loopback"]), (1, qd1.loc["local"])],
                              "lat_p99_ns"))
    diffs = corrected(diffs)
    sentences = []
    for (part, what), d in zip(measured, diffs):
        sentences.append(stated(d, _us2, f"the {what} is {part.delta_us:+.2f} µs, {pct(part.pct)} over {part.baseline}",
                                "", f"no clear {what} over {part.baseline}"))
    if sentences:
        out.findings.append(f"L-app p99 at QD1: {', '.join(us(p99[leg]) + ' ' + _name(leg, veth) for leg in legs)}; "
                            + "; ".join(sentences) + f" (Holm over the decomposition's {len(diffs)} comparisons).")
    if both:
        hop = "veth hop between the namespaces" if veth else "network"
        d = diffs[-1]
        if network > software:
            verdict = f"The {hop} adds more to the tail latency than the NVMe/TCP software stack"
        else:
            verdict = f"The NVMe/TCP software stack adds more to the tail latency than the {hop}"
        out.findings.append(claim(d, _us2, verdict, f"what the {hop} and the NVMe/TCP software stack add to the tail "
                                  "latency", f"{network:.2f} vs {software:.2f} µs; network − software") + ".")
    for leg in LEGS:
        if leg not in present:
            what = {"netns": "the network share of the overhead (and the total) is unknown",
                    "loopback": "software and network overhead cannot be separated",
                    "local": "there is no local baseline to compare against"}[leg]
            out.findings.append(missing_leg(rows, leg, what))


def _peaks(agg: pd.DataFrame, out: StudyResult, veth: bool, data: pd.DataFrame) -> None:
    peaks = {}
    for leg, group in agg.groupby("leg"):
        group = group.sort_values("iodepth").reset_index(drop=True)
        if group["iops_mean"].notna().any():
            # The first depth whose IOPS is not clearly below the best depth's (Welch, Holm over the
            # depths): saturation's rule, a decision rather than a 5 % threshold on means.
            stats = tuple(group[f"iops_{k}"].to_numpy(dtype=float) for k in ("mean", "std", "n"))
            index = int(fewest_not_below_summary(stats))
            top = int(group["iops_mean"].idxmax())
            peaks[leg] = (group.at[index, "iodepth"], group.at[index, "iops_mean"], index < len(group) - 1,
                          group.at[top, "iodepth"], group.at[top, "iops_mean"], len(group))
    for leg in (leg for leg in LEGS if leg in peaks):
        qd, iops, inside, top_qd, top, depths = peaks[leg]
        state = (f"reaches its peak from QD{qd:g} on: {kiops(iops)}, the first queue depth whose IOPS is not "
                 f"clearly below the best depth's (peak {kiops(top)} at QD{top_qd:g}; Welch against the best, Holm "
                 f"over the {depths} depths)" if inside else
                 f"was still clearly rising at the deepest queue tried (QD{qd:g}, {kiops(iops)}: every shallower "
                 f"depth is clearly below it; Welch, Holm over the {depths} depths)")
        # decided by fewest_not_below (Welch against the best depth, Holm over the depths)
        out.findings.append(Finding(f"T-app, {_name(leg, veth)}: a single job {state}.", STUDY, decided=True))
    remote = "netns" if "netns" in peaks else "loopback" if "loopback" in peaks else None
    if "local" in peaks and remote:
        def top_row(leg: str) -> pd.Series:
            return agg[(agg["leg"] == leg) & (agg["iodepth"] == peaks[leg][3])].iloc[0]

        d = compare(top_row(remote), top_row("local"), "iops")
        where = conditions_text(data[data["leg"] == remote], _name(remote, veth))
        out.findings.append(claim(
            d, kiops, f"One local job delivers {times(peak_ratio(peaks['local'][4], peaks[remote][4]))} the peak IOPS "
            f"of one NVMe/TCP ({_name(remote, veth)}) job", f"peak IOPS between one local job and one NVMe/TCP "
            f"({_name(remote, veth)}) job", f"{kiops(peaks['local'][4])} vs {kiops(peaks[remote][4])}")
            + f". The NVMe/TCP job ran with {where}: one job at its best queue depth, so its IOPS is not a "
            "stack's capacity (the stacks study's pairs may run other modes, jobs and cores).")


def _concurrency_table(agg: pd.DataFrame, veth: bool) -> pd.DataFrame:
    wide = agg.pivot_table(index="iodepth", columns="leg", values="iops_mean")
    table = pd.DataFrame({"iodepth": wide.index.astype(int)})
    local_qd1 = wide.at[1, "local"] if "local" in wide and 1 in wide.index else math.nan
    for leg in (leg for leg in LEGS if leg in wide):
        table[f"{_name(leg, veth)} KIOPS"] = (wide[leg] / 1e3).round(2).values
        table[f"{_name(leg, veth)} concurrency"] = [round(concurrency(v, local_qd1), 2) for v in wide[leg]]
    return table


def _b_app(data: pd.DataFrame, out: StudyResult, veth: bool) -> None:
    data = _app(data, "B-app")  # the B-app's best comes only from B-app rows
    if data.empty:
        out.findings.append("No B-app point was measured, so bandwidth per block size is missing.")
        return
    agg = aggregate(data, by=["leg", "bs", "rw", "iodepth"])
    if agg["bs"].nunique() < 2:
        out.findings.append("Only one block size was measured, so the B-app (bandwidth per "
                            "block size) comparison is missing.")
        return
    best = agg.loc[agg.groupby(["leg", "bs"])["bw_bytes_mean"].idxmax()]
    out.figures.append(Figure(
        "overhead_bandwidth_vs_bs",
        plots.bandwidth_vs_bs(best, "leg", "B-app: best bandwidth per block size, local vs NVMe/TCP (1 job)",
                              label=lambda leg: _label(leg, veth)),
        "Highest bandwidth over the queue depths tried for each block size (thesis fig. 5.3)."))
    wide = best.pivot_table(index="bs", columns="leg", values="bw_bytes_mean")
    table = pd.DataFrame({"bs": [size(b) for b in wide.index]})
    for leg in (leg for leg in LEGS if leg in wide):
        table[f"{_name(leg, veth)} MB/s"] = (wide[leg] / 1e6).round(1).values
    remote = "netns" if "netns" in wide else "loopback" if "loopback" in wide else None
    if "local" in wide and remote:
        share = wide[remote] / wide["local"] * 100
        table[f"{_name(remote, veth)} / local (%)"] = share.round(1).values
        low, high = share.idxmin(), share.idxmax()
        sizes = [bs for bs in share.index if not math.isnan(share[bs])]

        def pair(bs: float) -> pd.DataFrame:
            return best[best["bs"] == bs].set_index("leg")

        # every size against local is one family: Holm over the sizes
        family = dict(zip(sizes, corrected([compare(pair(bs).loc["local"], pair(bs).loc[remote], "bw_bytes")
                                            for bs in sizes])))

        def at(bs: float, gap: str, what: str) -> str:
            return stated(family[bs], mbps, f"{share[bs]:.1f} %{' ' + what if what else ''} at {size(bs)}",
                          f"{gap}; {mbps(wide.at[bs, remote])} vs {mbps(wide.at[bs, 'local'])}",
                          f"no clear difference from local bandwidth at {size(bs)}")

        if low in family:
            out.findings.append(
                f"B-app: NVMe/TCP ({_name(remote, veth)}) reaches {at(low, 'lowest share by the means', 'of local bandwidth')}"
                + (f" and {at(high, 'highest share by the means', '')}" if high != low and high in family else "")
                + f" (Holm over the {len(sizes)} sizes; which size has the lowest share is read from the means, "
                "not tested).")
    out.tables.append(Table("B-app bandwidth per block size", table,
                            "Best bandwidth over queue depths per block size and path."))


# Softirq below this share of a core is not called receive processing charged to it.
SOFTIRQ_VISIBLE_PCT = 1.0
HOP = {"loopback": "Loopback", "netns": "A veth pair"}


def _core_groups(detail: dict) -> dict[str, dict[str, float]] | None:
    """One point's cpu_cores_json -> {group: {softirq, system, user (% of the group's cores), cores}}
    for the load generator's cores, the target's, cores both share, and every other core."""
    sums: dict[str, dict[str, float]] = {}
    names: dict[str, list[str]] = {}
    for machine, w in detail.items():
        roles, cores, wall = w.get("roles") or {}, w.get("cores") or {}, w.get("wall_s") or 0.0
        if not roles or wall <= 0:
            continue
        target = {str(c) for c in roles.get("target", [])}
        lg = {str(c) for role, cs in roles.items() if role != "target" for c in cs}
        groups = {"load generator": lg - target, "target": target - lg, "shared": lg & target}
        groups["other"] = set(cores) - lg - target
        for group, members in groups.items():
            for core in members:
                if core not in cores:
                    continue
                acc = sums.setdefault(group, {"softirq": 0.0, "system": 0.0, "user": 0.0, "core_s": 0.0})
                acc["softirq"] += cores[core].get("softirq_s", 0.0)
                acc["system"] += cores[core].get("system_s", 0.0)
                acc["user"] += cores[core].get("user_s", 0.0)
                acc["core_s"] += wall
                names.setdefault(group, []).append(f"cpu{core}" if machine == "local" else f"{machine}:cpu{core}")
    if not sums:
        return None
    return {g: {k: 100 * v / a["core_s"] for k, v in a.items() if k != "core_s"} | {"cores": ",".join(sorted(names[g]))}
            for g, a in sums.items() if a["core_s"] > 0}


def softirq_table(data: pd.DataFrame) -> pd.DataFrame:
    """Mean user, system and softirq time per core group (% of those cores' wall time) per network leg."""
    if "cpu_cores_json" not in data:
        return pd.DataFrame()
    records = []
    for leg in ("loopback", "netns"):
        rows = data[(data["leg"] == leg) & data["cpu_cores_json"].notna()]
        per_group: dict[str, list[dict]] = {}
        for text in rows["cpu_cores_json"]:
            try:
                groups = _core_groups(json.loads(text))
            except (TypeError, ValueError):
                continue
            for group, values in (groups or {}).items():
                per_group.setdefault(group, []).append(values)
        for group in ("load generator", "target", "shared", "other"):
            if group in per_group:
                values = per_group[group]
                records.append({"leg": leg, "cores": group, "which": values[0]["cores"],
                                **{f"{k} (% of core)": round(sum(v[k] for v in values) / len(values), 2)
                                   for k in ("softirq", "system", "user")},
                                "points": len(values)})
    return pd.DataFrame(records)


def _softirq(data: pd.DataFrame, out: StudyResult, veth: bool) -> None:
    """Where receive processing (softirq) was charged, from the per-core /proc/stat of each point."""
    table = softirq_table(data)
    if table.empty:
        return
    out.tables.append(Table(
        "Per-core softirq time (receive processing)", table,
        "user, system and softirq time of the load generator's cores, the target's cores and the rest, "
        "as % of those cores' time during the point (/proc/stat per core, mean over points). Softirq is where "
        "the kernel's network receive path runs; irq time is left out."))
    for leg in ("loopback", "netns"):
        mine = table[table["leg"] == leg].set_index("cores")
        if mine.empty:
            continue
        name = _name(leg, veth)
        if "shared" in mine.index and not {"load generator", "target"} & set(mine.index):
            out.findings.append(descriptive(
                f"{name}: the load generator and the target shared {mine.at['shared', 'which']}, so softirq time "
                f"({mine.at['shared', 'softirq (% of core)']:.1f} % of it) cannot be assigned to either side."))
            continue
        soft = {g: mine.at[g, "softirq (% of core)"] for g in mine.index}
        lg, tgt = soft.get("load generator", math.nan), soft.get("target", math.nan)
        other = soft.get("other", 0.0)
        if max((v for v in (lg, tgt) if not math.isnan(v)), default=0.0) < SOFTIRQ_VISIBLE_PCT:
            out.findings.append(descriptive(
                f"{name}: softirq stayed under {SOFTIRQ_VISIBLE_PCT:g} % on the load generator's and the target's "
                "cores, so no receive processing charged to the sending core was visible (a kernel without IRQ "
                "time accounting counts it as the running process's system time instead)."))
            continue
        where = []
        if not math.isnan(lg):
            where.append(f"{lg:.1f} % of the load generator's core ({mine.at['load generator', 'which']})")
        if not math.isnan(tgt):
            where.append(f"{tgt:.1f} % of the target's ({mine.at['target', 'which']})")
        text = (f"{name}: softirq (kernel receive processing) took {' and '.join(where)}. {HOP[leg]} delivers each "
                "packet on the core that sent it, so the receive path of the target's requests ran on the load "
                "generator's core and that of its replies on the target's: each side's CPU figures include part "
                "of the other side's network work.")
        if other >= SOFTIRQ_VISIBLE_PCT and other > max(lg if not math.isnan(lg) else 0, tgt if not math.isnan(tgt) else 0):
            text += f" More ran on other cores ({other:.1f} % of them): receive processing was moved off the sending core there."
        out.findings.append(descriptive(text))


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "NVMe/TCP overhead compared with local access")
    out.excluded = excluded_points(rows)
    data = _rows(rows)
    if data.empty:
        out.findings.append("The overhead study has no usable measurements in any leg "
                            f"({', '.join(LEGS)}).")
        return out
    present = [leg for leg in LEGS if leg in set(data["leg"])]
    caveat = netns_caveat(data)
    if caveat:
        out.findings.append(descriptive(caveat))
    veth = caveat is not None
    LINK["text"] = link_text(data)
    if LINK["text"]:
        out.findings.append(descriptive(f"The netns leg crossed a {LINK['text']}; every netns number below is for "
                                        "that link."))
    agg = aggregate(_t_app(data[~data.index.isin(_b_rows(data).index)]), by=["leg", "iodepth"])
    _l_app(agg, out, rows, present, veth)
    if agg["iodepth"].nunique() > 1:
        out.figures.append(Figure(
            "overhead_iops_vs_qd",
            plots.iops_vs_qd(agg, "leg", "T-app: IOPS vs queue depth, local vs NVMe/TCP (4 KiB random read, 1 job)",
                             label=lambda leg: _label(leg, veth)),
            "Single-job throughput per queue depth on each path (thesis fig. 5.2)."))
        out.tables.append(Table("T-app throughput and concurrency per queue depth",
                                _concurrency_table(agg, veth),
                                "concurrency = IOPS(path, QD) / IOPS(local, QD1)."))
        _peaks(agg, out, veth, data)
    else:
        out.findings.append("Only one queue depth was measured, so the T-app (IOPS vs queue "
                            "depth) comparison is missing.")
    _b_app(data, out, veth)
    device_section(rows, _app(data[data["leg"] == "local"], "B-app"), out)
    out.tables.append(Table("Cores used per leg", pd.DataFrame(
        [{"leg": _name(leg, veth), "cores used": cores_text(data[data["leg"] == leg])} for leg in present]),
        "The distinct cores each leg's load generator (host) and target were pinned to, as they ran; "
        "\"roles shared a core\" where a small machine put two roles on one core."))
    # Last: its table and findings exist only where per-core times were recorded.
    _softirq(data, out, veth)
    return out
