"""The `stacks` study: target stack × host stack pairs side by side, as ratios to a baseline pair.

The L-app is 4 KiB random read at QD1 (latency), the T-app the same over queue depths (IOPS), the
B-app large random reads (bandwidth). One statistic for the ratio and its test: the mean over the
interleaved repeats. A ratio to the baseline pair is the ratio of the means with Fieller's 95 %
interval (decide.fieller); whether two pairs differ is decided on the same means with Welch's
interval (cannot decide below two repeats a side or without spread), Holm-corrected over the pairs
compared with the baseline (one family per app: the T-app's IOPS, the L-app's mean latency, the
B-app's bandwidth), and over every pair that shares a host (or a target) when telling which side
limits: with the host fixed, a faster pair has the faster target.

Each pair's modes (the target's reactor mode `target_mode` and the host's `completion`, as its
points recorded them) are shown beside it, and a finding about which side limits names them and
says when the compared sides ran in different modes (then it compares modes as much as stacks).
"""

from __future__ import annotations

from dataclasses import replace

import math
import tomllib

import pandas as pd

from .. import plots
from .common import Difference, claim, compare_values, corrected, excluded_points, study_rows
from .conditions import conditions_text
from .decide import fieller
from .cores_used import cores_text
from .result import Figure, StudyResult, Table
from .stats import collapse_jobs, usable
from .text import kiops, mbps, size, times, us

STUDY = "stacks"
REFERENCE_QD = 32  # the queue depth the matrix compares at when measured (the largest otherwise)


def pair_label(leg: str) -> str:
    target, _, host = leg.partition("/")
    return f"{target} target × {host} host"


def baseline_of(runs: pd.DataFrame) -> str:
    """The baseline pair the latest stacks run asked for (its spec's params), else spdk/spdk."""
    mine = runs[runs["study"] == STUDY] if not runs.empty else runs
    for text in reversed(list(mine["spec_toml"])) if len(mine) else []:
        try:
            return tomllib.loads(text).get("params", {}).get("baseline", "spdk/spdk")
        except tomllib.TOMLDecodeError:
            continue
    return "spdk/spdk"


def means(data: pd.DataFrame) -> pd.DataFrame:
    """Mean over repeats per pair, app, block size and queue depth: the statistic the Welch tests
    and Fieller ratios use, so a table's ratio and its finding's test cannot disagree."""
    collapsed = collapse_jobs(data)
    metrics = ["iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns"]
    grouped = collapsed.groupby(["leg", "app", "bs", "iodepth"], as_index=False)
    out = grouped[metrics].mean()
    out["repeats"] = grouped.size()["size"].values
    return out


def link_of(runs: pd.DataFrame) -> str:
    """The link the latest stacks run crossed, from its spec's topology: loopback on one machine, or
    the network between the inventory's target and initiators."""
    mine = runs[runs["study"] == STUDY] if not runs.empty and "study" in runs else runs.iloc[0:0]
    for text in reversed(list(mine["spec_toml"])) if len(mine) else []:
        try:
            topology = tomllib.loads(text).get("topology", {})
        except tomllib.TOMLDecodeError:
            continue
        if topology.get("kind", "local") == "local":
            return "loopback (one machine)"
        hosts = ", ".join(topology.get("initiators") or []) or "the initiators"
        return f"network from {hosts} to {topology.get('target') or 'the target'}"
    return "not recorded"


def welch_difference(a: list[float], b: list[float]) -> Difference:
    """mean(b) − mean(a) of the per-repeat IOPS with Welch's 95 % interval and p value; no interval
    with fewer than two repeats on a side or repeats without spread ("cannot decide"). The samples
    are `_samples`' 4 KiB IOPS, named as the metric for findings as data."""
    d = compare_values(a, b)
    return replace(d, source={**(d.source or {}), "metric": "iops"})


def _difference_text(d: Difference) -> tuple[bool | None, str]:
    """(significant, words): None when there is no interval."""
    if not d.decidable:
        if math.isnan(d.diff):
            return None, "no repeats to compare"
        why = "fewer than two repeats on a side" if d.n < 2 else "repeats without spread"
        return None, f"difference {d.diff / 1e3:+.1f} KIOPS; cannot decide ({why}, so no interval)"
    text = f"Welch's {d.interval(_kiops_delta)}"
    seen = d.detectable_clause(_kiops_delta) if not d.clear else ""
    return d.clear, text + (f"; {seen}" if seen else "")


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Stacks side by side: target stack × host stack")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    data = data[data["role"] == "main"] if not data.empty else data
    if data.empty:
        out.findings.append("The stacks study has no usable measurements for any pair.")
        _skipped_pairs(rows, data, out)
        return out
    data = data.assign(app=[_app(k) for k in data["knobs_json"]])
    med = means(data)
    pairs = list(dict.fromkeys(med["leg"]))
    asked = baseline_of(runs)
    baseline = asked if asked in pairs else ("ours/ours" if "ours/ours" in pairs else pairs[0])
    if baseline != asked:
        out.findings.append(f"The baseline pair {pair_label(asked)} has no usable measurements here, so the "
                            f"ratios are taken against {pair_label(baseline)}.")
    tapp = med[med["app"].isin(["L-app", "T-app"]) & (med["bs"] == 4096)]
    qds = sorted(set(tapp["iodepth"]))
    ref_qd = REFERENCE_QD if REFERENCE_QD in qds else (max(qds) if qds else None)
    samples = _samples(data, ref_qd)
    modes = pair_modes(data)
    _side_by_side(med, pairs, baseline, ref_qd, samples, out, modes,
                  {leg: cores_text(data[data["leg"] == leg]) for leg in pairs}, data, link_of(runs))
    if ref_qd is not None:
        _matrix(tapp, pairs, baseline, ref_qd, out)
        _bottleneck(tapp, pairs, ref_qd, samples, out, modes)
    if len(qds) > 1:
        out.figures.append(Figure(
            "stacks_iops_vs_qd",
            plots.iops_vs_qd(tapp.rename(columns={"leg": "pair"}).groupby(["pair", "iodepth"], as_index=False)
                             .agg(iops_mean=("iops", "mean"), iops_ci95=("iops", lambda _: math.nan)),
                             "pair", "T-app: IOPS vs queue depth per target × host pair (4 KiB random read)",
                             label=lambda leg: pair_label(str(leg))),
            "Mean IOPS over the interleaved repeats per pair and queue depth."))
    _bars(med, pairs, out)
    _skipped_pairs(rows, data, out)
    return out


def pair_modes(data: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Per pair, the modes its points ran with: {"target": reactor mode, "host": completion}; a
    side whose points disagree (or recorded nothing) reads "mixed" (or "not recorded")."""
    out: dict[str, dict[str, str]] = {}
    for leg, group in data.groupby("leg", sort=False):
        sides = {}
        for side, column in (("target", "target_mode"), ("host", "completion")):
            seen = sorted({str(v) for v in group.get(column, pd.Series(dtype=object)).dropna()})
            sides[side] = seen[0] if len(seen) == 1 else ("mixed: " + "/".join(seen) if seen else "not recorded")
        out[leg] = sides
    return out


def modes_text(modes: dict[str, str]) -> str:
    return f"target reactor {modes['target']}, host completion {modes['host']}"


def _app(knobs_json: str) -> str:
    import json

    return json.loads(knobs_json).get("app", "T-app")


def _samples(data: pd.DataFrame, qd: int | None) -> dict[str, list[float]]:
    """Per pair, the 4 KiB IOPS of every repeat at the reference queue depth."""
    if qd is None:
        return {}
    collapsed = collapse_jobs(data)
    sel = collapsed[(collapsed["bs"] == 4096) & (collapsed["iodepth"] == qd) & (collapsed["app"] != "B-app")]
    return {leg: group["iops"].tolist() for leg, group in sel.groupby("leg")}


def _value(med: pd.DataFrame, leg: str, app: str, column: str, qd: int | None = None) -> float:
    sel = med[(med["leg"] == leg) & (med["app"] == app)]
    if qd is not None:
        sel = sel[sel["iodepth"] == qd]
    return float(sel[column].iloc[0]) if len(sel) else math.nan


def _tapp_iops(tapp: pd.DataFrame, leg: str, qd: int) -> float:
    sel = tapp[(tapp["leg"] == leg) & (tapp["iodepth"] == qd)]
    return float(sel["iops"].max()) if len(sel) else math.nan


def _app_samples(data: pd.DataFrame, app: str, metric: str) -> dict[str, list[float]]:
    """Per pair, `metric` of every repeat of one app (the L-app at QD1, the B-app at its size)."""
    collapsed = collapse_jobs(data)
    sel = collapsed[collapsed["app"] == app]
    return {leg: [float(v) for v in pd.to_numeric(group[metric], errors="coerce").dropna()]
            for leg, group in sel.groupby("leg")}


def ratio_text(base: list[float], other: list[float]) -> str:
    """'1.10× (Fieller's 95 % interval 1.07× to 1.13×)': mean(other) / mean(base), the same means
    the Welch test compares."""
    r, low, high = (float(v) for v in fieller(base or [math.nan], other or [math.nan]))
    if math.isnan(r):
        return "n/a"
    if math.isnan(low):
        return times(r)  # the clause says why there is no interval
    if math.isinf(high) or math.isinf(low):
        return f"{times(r)} (interval unbounded: the baseline's mean is not clearly above zero)"
    return f"{times(r)} (Fieller's 95 % interval {times(low)} to {times(high)})"


def _said(d: Difference, fmt, effect: str, what: str, detail: str) -> str:
    """common.claim as a clause after the pair's name: its decision first ('No clear difference in …',
    'Cannot tell whether … changed' or the effect), then the detail and the interval."""
    return claim(d, fmt, effect, what, detail)


def _side_by_side(med: pd.DataFrame, pairs: list[str], baseline: str, ref_qd: int | None,
                  samples: dict[str, list[float]], out: StudyResult,
                  modes: dict[str, dict[str, str]] | None = None, cores: dict[str, str] | None = None,
                  data: pd.DataFrame | None = None, link: str | None = None) -> None:
    modes, cores = modes or {}, cores or {}
    unknown = {"target": "not recorded", "host": "not recorded"}
    records = []
    b_lat = _value(med, baseline, "L-app", "lat_mean_ns")
    b_bw = _value(med, baseline, "B-app", "bw_bytes")
    tapp = med[med["bs"] == 4096]
    b_iops = _tapp_iops(tapp, baseline, ref_qd) if ref_qd else math.nan
    others = [leg for leg in pairs if leg != baseline]
    lat = _app_samples(data, "L-app", "lat_mean_ns") if data is not None else {}
    bw = _app_samples(data, "B-app", "bw_bytes") if data is not None else {}

    def family(values: dict[str, list[float]], metric: str) -> dict[str, Difference]:
        """Every pair against the baseline on one metric: one family, Holm over the pairs."""
        diffs = [replace(compare_values(values.get(baseline, []), values.get(leg, [])),
                         source={"a": values.get(baseline, []), "b": values.get(leg, []), "metric": metric})
                 for leg in others]
        return dict(zip(others, corrected(diffs)))

    iops_d = dict(zip(others, corrected([welch_difference(samples.get(baseline, []), samples.get(leg, []))
                                         for leg in others])))
    lat_d, bw_d = family(lat, "lat_mean_ns"), family(bw, "bw_bytes")
    for leg in pairs:
        lat_m = _value(med, leg, "L-app", "lat_mean_ns")
        iops = _tapp_iops(tapp, leg, ref_qd) if ref_qd else math.nan
        bw_m = _value(med, leg, "B-app", "bw_bytes")
        records.append({
            "target × host": pair_label(leg), "modes": modes_text(modes.get(leg, unknown)),
            "L-app mean (µs)": round(lat_m / 1e3, 1),
            "L-app p99 (µs)": round(_value(med, leg, "L-app", "lat_p99_ns") / 1e3, 1),
            f"T-app QD{ref_qd} KIOPS": round(iops / 1e3, 1), "B-app MB/s": round(bw_m / 1e6, 0),
            "L-app latency ÷ baseline": round(lat_m / b_lat, 2), f"QD{ref_qd} IOPS ÷ baseline": round(iops / b_iops, 2),
            "B-app ÷ baseline": round(bw_m / b_bw, 2),
            "repeats": int(med[med["leg"] == leg]["repeats"].min()),
            "cores used": cores.get(leg, "—"),
        })
        if leg == baseline or math.isnan(iops / b_iops):
            continue
        parts = [_said(iops_d[leg], _kiops_delta,
                       f"{times(iops / b_iops)} the IOPS of {pair_label(baseline)} at QD{ref_qd}",
                       f"IOPS from {pair_label(baseline)} at QD{ref_qd}",
                       f"{kiops(iops)} vs {kiops(b_iops)}; ratio of means "
                       + ratio_text(samples.get(baseline, []), samples.get(leg, [])))]
        if lat.get(leg) and lat.get(baseline):
            parts.append(_said(lat_d[leg], us, f"L-app mean latency {times(lat_m / b_lat)} the baseline's",
                               "L-app mean latency", f"{us(lat_m)} vs {us(b_lat)}; ratio of means "
                               + ratio_text(lat[baseline], lat[leg])))
        if bw.get(leg) and bw.get(baseline):
            parts.append(_said(bw_d[leg], mbps, f"B-app bandwidth {times(bw_m / b_bw)} the baseline's",
                               "B-app bandwidth", f"{mbps(bw_m)} vs {mbps(b_bw)}; ratio of means "
                               + ratio_text(bw[baseline], bw[leg])))
        mine, theirs = modes.get(leg, unknown), modes.get(baseline, unknown)
        unlike = (f" The two ran in different modes ({modes_text(mine)} against {modes_text(theirs)}), so "
                  "this compares the modes as much as the stacks." if mine != theirs else "")
        where = conditions_text(data[data["leg"] == leg], link) if data is not None else ""
        out.findings.append(f"{pair_label(leg)}: " + "; ".join(parts) + "." + unlike
                            + (f" Measured with {where}." if where else ""))
    bapp = med[med["app"] == "B-app"]
    bapp_note = f" B-app: {size(bapp['bs'].iloc[0])} random read at QD{int(bapp['iodepth'].iloc[0])}." if len(bapp) else ""
    out.tables.append(Table("Pairs side by side", pd.DataFrame(records),
                            f"Means over interleaved repeats (the statistic the findings test); ratios against "
                            f"{pair_label(baseline)} (latency: lower is better, IOPS and bandwidth: higher is "
                            f"better).{bapp_note}"))


def _kiops_delta(iops: float) -> str:
    return f"{iops / 1e3:.1f} KIOPS"


def _matrix(tapp: pd.DataFrame, pairs: list[str], baseline: str, qd: int, out: StudyResult) -> None:
    targets = list(dict.fromkeys(p.partition("/")[0] for p in pairs))
    hosts = list(dict.fromkeys(p.partition("/")[2] for p in pairs))
    base = _tapp_iops(tapp, baseline, qd)
    frame = pd.DataFrame({"target \\ host": targets})
    for host in hosts:
        frame[f"{host} host"] = [round(_tapp_iops(tapp, f"{t}/{host}", qd) / base, 2) for t in targets]
    out.tables.append(Table(f"IOPS at QD{qd} as a multiple of {pair_label(baseline)}", frame,
                            "Rows: target stack; columns: host stack; blank where the pair did not run."))


def _bottleneck(tapp: pd.DataFrame, pairs: list[str], qd: int, samples: dict[str, list[float]],
                out: StudyResult, modes: dict[str, dict[str, str]] | None = None) -> None:
    """With one side fixed, the other side's stacks compared: which side limits the pair. The
    finding names the modes each side ran with."""
    modes = modes or {}
    unknown = {"target": "not recorded", "host": "not recorded"}
    mode_word = {"target": "reactor", "host": "completion"}
    for side, fixed_index in (("host", 2), ("target", 0)):
        by_fixed: dict[str, list[str]] = {}
        for leg in pairs:
            by_fixed.setdefault(leg.partition("/")[fixed_index], []).append(leg)
        for fixed, legs in by_fixed.items():
            ranked = sorted(((l, _tapp_iops(tapp, l, qd)) for l in legs), key=lambda x: -x[1])
            ranked = [(l, v) for l, v in ranked if not math.isnan(v)]
            if len(ranked) < 2:
                continue
            (best, top), (worst, low) = ranked[0], ranked[-1]
            other = "target" if side == "host" else "host"
            pick = 0 if other == "target" else 2
            # Picking the best and the worst of several is a choice among candidates: every pair of
            # them is compared, Holm over the pairs, and the best-vs-worst pair is read from that.
            legs_ranked = [l for l, _ in ranked]
            pairs_of = [(i, j) for i in range(len(legs_ranked)) for j in range(i + 1, len(legs_ranked))]
            diffs = corrected([welch_difference(samples.get(legs_ranked[j], []), samples.get(legs_ranked[i], []))
                               for i, j in pairs_of])
            significant, words = _difference_text(diffs[pairs_of.index((0, len(legs_ranked) - 1))])
            a, b = best.partition('/')[pick], worst.partition('/')[pick]
            # the fixed side's mode, then the compared side's mode in each of the two pairs
            fixed_mode = modes.get(best, unknown)[side]
            mode_a, mode_b = modes.get(best, unknown)[other], modes.get(worst, unknown)[other]
            named = (f" Modes: the {fixed} {side} {mode_word[side]} {fixed_mode}; the {a} {other} "
                     f"{mode_word[other]} {mode_a}, the {b} {other} {mode_word[other]} {mode_b}"
                     + (f": different {mode_word[other]} modes, so this compares the modes as much as the "
                        f"{other}s." if mode_a != mode_b else "."))
            if significant is None:
                out.findings.append(f"With the {fixed} {side}, cannot decide whether the {a} or the {b} {other} "
                                    f"limits at QD{qd} ({kiops(top)} vs {kiops(low)}; {words})." + named)
            elif significant is False:
                out.findings.append(f"With the {fixed} {side}, no clear difference between the {a} and {b} "
                                    f"{other}s at QD{qd} ({words})." + named)
            else:
                out.findings.append(f"With the {fixed} {side}, the {a} {other} gives {times(top / low)} the QD{qd} "
                                    f"IOPS of the {b} {other} ({words})." + named)


def _bars(med: pd.DataFrame, pairs: list[str], out: StudyResult) -> None:
    charts = (("B-app", "bw_bytes", 1e6, "stacks_bapp_bandwidth", "B-app bandwidth per target × host pair", "MB/s",
               "Mean bandwidth of large random reads per pair over the repeats."),
              ("L-app", "lat_mean_ns", 1e3, "stacks_lapp_latency",
               "L-app mean latency per target × host pair (4 KiB, QD1)", "mean latency (µs)",
               "Mean over the repeats of the mean completion latency at QD1 per pair."))
    for app, column, scale, name, title, ylabel, caption in charts:
        values = [(leg, _value(med, leg, app, column)) for leg in pairs]
        values = [(leg, v) for leg, v in values if not math.isnan(v)]
        if values:
            labels = [pair_label(leg).replace(" × ", "\n× ") for leg, _ in values]
            out.figures.append(Figure(name, plots.bars(labels, [v / scale for _, v in values], [math.nan] * len(values),
                                                       title=title, ylabel=ylabel), caption))


def _skipped_pairs(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if rows.empty:
        return
    ran = set(data["leg"]) if not data.empty else set()
    for leg, group in rows.groupby("leg", sort=False):
        if leg in ran:
            continue
        reasons = group["error"].dropna()
        status = "skipped" if (group["status"] == "skipped").all() else "failed"
        out.findings.append(f"{pair_label(leg)}: {status}" + (f" ({reasons.iloc[0]})" if len(reasons) else "") + ".")
