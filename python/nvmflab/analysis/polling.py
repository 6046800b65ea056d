"""The `polling` study: host completion polling, target idle polling, their interaction.

Legs: `completion` (completion = poll vs event, iodepth swept), `idle_poll` (idle_poll_us swept
at QD1 and a high QD), `matrix` (two on/off knobs crossed). Output follows thesis ch. 4: table 4.1
(throughput and p99 per completion mode), figs 4.2-4.5, table 3.3 (interaction matrix) and
table 4.2 (the configuration to use), each computed from the user's measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from .. import plots
from .common import (Difference, claim, compare, corrected, descriptive, excluded_points, first, leg_rows, missing_leg,
                     study_rows)
from .cores_used import cores_text
from .decide import pick_best_summary, pick_shortest_summary
from .polling_rx import analyze_rx
from .formulas import change_pct
from .result import Figure, StudyResult, Table
from .stats import aggregate
from .text import changed, kiops, us

STUDY = "polling"

# Knobs the interaction matrix may cross, with what "on" means for each column.
MATRIX_KNOBS: dict[str, Callable[[object], bool]] = {
    "completion": lambda v: v == "poll",
    "target_mode": lambda v: v == "poll",
    "idle_poll_us": lambda v: bool(v) and float(v) > 0,
    "hdr_digest": lambda v: bool(v),
    "data_digest": lambda v: bool(v),
}

# What each knob is when the study recommends nothing (the spec's defaults).
DEFAULTS = {"completion": "event", "target_mode": "event", "idle_poll_us": 0, "hdr_digest": False,
            "data_digest": False}
CHOSEN = "chosen"
NO_WINNER = "no clear winner: keep the default"
CANNOT_DECIDE = "cannot decide (fewer than two repeats, or repeats without spread: no interval): keep the default"


def _us(ns: float) -> str:
    return f"{ns / 1e3:.2f} µs"


def _kiops(iops: float) -> str:
    return f"{iops / 1e3:.2f} KIOPS"


def _completion(rows: pd.DataFrame, out: StudyResult, recommend: list[dict]) -> None:
    data = leg_rows(rows, "completion", "main")
    if data.empty:
        out.findings.append(missing_leg(rows, "completion",
                                        "host completion polling was not evaluated"))
        return
    agg = aggregate(data, by=["completion", "iodepth"])
    title = "host completion polling (completion = poll vs event), 4 KiB random read, 1 job"
    out.figures += [
        Figure("polling_p99_vs_qd", plots.p99_vs_qd(agg, "completion", f"p99 latency vs queue depth: {title}"),
               "p99 completion latency per queue depth; error bars are 95 % confidence intervals "
               "over repeats (thesis fig. 4.2)."),
        Figure("polling_iops_vs_qd", plots.iops_vs_qd(agg, "completion", f"Throughput vs queue depth: {title}"),
               "IOPS per queue depth (thesis fig. 4.3)."),
        Figure("polling_ctx_vs_qd", plots.ctx_vs_qd(agg, "completion", f"Context switches vs queue depth: {title}"),
               "Voluntary plus involuntary context switches of the load generator over the "
               "measured interval (thesis fig. 4.4)."),
    ]
    summary = []
    for mode, group in agg.groupby("completion"):
        qd1 = group[group["iodepth"] == group["iodepth"].min()]
        peak = group.loc[group["iops_mean"].idxmax()]
        summary.append({
            "completion": mode,
            "peak KIOPS": round(peak["iops_mean"] / 1e3, 2),
            "peak at iodepth": int(peak["iodepth"]),
            "p99 at lowest iodepth (µs)": round(first(qd1, "lat_p99_ns_mean") / 1e3, 2),
            "p99 95 % CI (± µs)": round(first(qd1, "lat_p99_ns_ci95") / 1e3, 2),
            "lowest iodepth": int(group["iodepth"].min()),
            "repeats": int(first(qd1, "lat_p99_ns_n")) if len(qd1) else 0,
            "cores used": cores_text(data[data["completion"] == mode]),
            "_p99": first(qd1, "lat_p99_ns_mean"), "_p99_ci": first(qd1, "lat_p99_ns_ci95"),
            "_peak": peak["iops_mean"], "_peak_ci": peak["iops_ci95"],
            "_qd1": qd1.iloc[0] if len(qd1) else None, "_peak_row": peak,
        })
    table = pd.DataFrame(summary)
    out.tables.append(Table("Throughput and tail latency per completion mode",
                            table[[c for c in table.columns if not c.startswith("_")]],
                            "Peak single-job IOPS over the queue depths swept and p99 at the "
                            "lowest queue depth (thesis table 4.1 shape)."))
    by_mode = {row["completion"]: row for row in summary}
    missing = {"poll", "event"} - by_mode.keys()
    if missing:
        out.findings.append(f"The completion leg has no measurements with completion = "
                            f"{', '.join(sorted(missing))}, so polling and interrupt-driven "
                            "completion cannot be compared.")
        return
    event, poll = by_mode["event"], by_mode["poll"]
    # Lower p99 for the L-app decides; when its interval includes zero, a clear peak IOPS gain does;
    # otherwise nothing is recommended and the default stays. The two tests are one family (Holm),
    # so the rule declares a winner in at most 5 % of runs where the modes do not differ, and the
    # findings state the very same two corrected differences.
    p99, peak = corrected([compare(event["_qd1"], poll["_qd1"], "lat_p99_ns"),
                           compare(event["_peak_row"], poll["_peak_row"], "iops")])
    qd = f"QD{poll['lowest iodepth']}"
    out.findings.append(claim(
        p99, _us, f"Host completion polling (completion = poll) "
                  f"{changed('the p99 latency at ' + qd, change_pct(event['_p99'], poll['_p99']))}",
        f"the p99 latency at {qd} between completion = poll and event",
        f"{us(event['_p99'])} → {us(poll['_p99'])}; Holm over p99 and peak IOPS") + ".")
    # Each mode's peak is read at the queue depth where its mean IOPS is highest; the test compares
    # the repeats at those two queue depths (the thesis's table 4.1 compares the same two numbers).
    peaks = (f"{kiops(event['_peak'])} at QD{event['peak at iodepth']} → {kiops(poll['_peak'])} at "
             f"QD{poll['peak at iodepth']}, each mode's repeats at its own peak queue depth; Holm over p99 and peak IOPS")
    out.findings.append(claim(
        peak, _kiops, f"Host completion polling {changed('the peak IOPS', change_pct(event['_peak'], poll['_peak']))}",
        "the peak IOPS between completion = poll and event", peaks) + ".")
    _context_switches(agg, out)
    evidence = (f"p99 at {qd}: poll − event = {p99.text(_us)}; peak IOPS: poll − event = {peak.text(_kiops)}")
    choice, decision = completion_choice(p99, peak)
    if decision == CHOSEN:
        decision += (f" (lower p99 at {qd})" if p99.clear else " (p99 tie; higher peak IOPS)" if p99.decidable
                     else " (p99 without an interval; higher peak IOPS)")
    recommend.append({"knob": "completion (host completion polling)", "suggested value": choice,
                      "decision": decision, "evidence": evidence, "leg": "completion",
                      "_knob": "completion", "_value": choice, "_decided": decision.startswith(CHOSEN)})


def _context_switches(agg: pd.DataFrame, out: StudyResult) -> None:
    """The load generator's context switches at the deepest queue depth, poll against event."""
    deepest = agg[agg["iodepth"] == agg["iodepth"].max()]
    if not {"poll", "event"} <= set(deepest["completion"]) or deepest["ctx_mean"].isna().any():
        return
    event, poll = (deepest[deepest["completion"] == mode].iloc[0] for mode in ("event", "poll"))
    qd = f"QD{int(agg['iodepth'].max())}"
    d, what = compare(event, poll, "ctx"), "the load generator's context switches"
    out.findings.append(claim(
        d, lambda v: f"{v:,.0f}", f"At {qd} polling {changed(what, change_pct(event['ctx_mean'], poll['ctx_mean']))}",
        f"{what} at {qd} between completion = poll and event",
        f"{event['ctx_mean']:,.0f} → {poll['ctx_mean']:,.0f}") + ".")


def completion_choice(p99: Difference, peak: Difference) -> tuple[str, str]:
    """(mode, decision) of the completion leg from the Holm-corrected p99 and peak differences
    (poll − event): the clearly lower p99 wins, else the clearly higher peak, else the default."""
    if p99.clear:
        return ("poll" if p99.diff < 0 else "event"), CHOSEN
    if peak.clear:  # p99 not clearly different (or without an interval): the peak decides
        return ("poll" if peak.diff > 0 else "event"), CHOSEN
    if not p99.decidable or not peak.decidable:
        return DEFAULTS["completion"], CANNOT_DECIDE
    return DEFAULTS["completion"], NO_WINNER


def idle_poll_choice(base, candidates) -> int:
    """Index of the chosen idle poll period among `candidates` (aggregate rows ordered from the
    shortest period), −1 for none: `decide.pick_shortest_summary` on their p99."""
    def summ(rows):
        return tuple(np.array([float(r.get(f"lat_p99_ns_{k}", math.nan)) for r in rows]) for k in ("mean", "std", "n"))

    return int(pick_shortest_summary(tuple(v[0] for v in summ([base])), summ(candidates), lower_is_better=True))


def _idle_poll(rows: pd.DataFrame, out: StudyResult, recommend: list[dict]) -> None:
    data = leg_rows(rows, "idle_poll", "main")
    if data.empty:
        out.findings.append(missing_leg(rows, "idle_poll", "target idle polling was not evaluated"))
        return
    agg = aggregate(data, by=["idle_poll_us", "iodepth"])
    low_qd, high_qd = int(agg["iodepth"].min()), int(agg["iodepth"].max())
    low = agg[agg["iodepth"] == low_qd].set_index("idle_poll_us").sort_index()
    high = agg[agg["iodepth"] == high_qd].set_index("idle_poll_us").sort_index()
    out.figures.append(Figure(
        "polling_p99_vs_idle_poll",
        plots.p99_vs_idle_poll(low.reset_index(),
                               f"p99 latency at QD{low_qd} vs target idle poll period"),
        "p99 latency of a 4 KiB random-read job at the lowest queue depth for each target idle "
        "poll period (thesis fig. 4.5)."))
    base_p99 = low["lat_p99_ns_mean"].get(0, math.nan)
    base_iops = high["iops_mean"].get(0, math.nan) if high_qd != low_qd else math.nan
    table = pd.DataFrame({
        "idle_poll_us": low.index.astype(int),
        f"p99 at QD{low_qd} (µs)": (low["lat_p99_ns_mean"] / 1e3).round(2).values,
        "p99 change vs 0 µs (%)": [round(change_pct(base_p99, v), 1) for v in low["lat_p99_ns_mean"]],
    })
    if high_qd != low_qd:
        iops_high = high["iops_mean"].reindex(low.index)
        table[f"KIOPS at QD{high_qd}"] = (iops_high / 1e3).round(2).values
        table["KIOPS change vs 0 µs (%)"] = [round(change_pct(base_iops, v), 1) for v in iops_high]
    table["cores used"] = [cores_text(data[data["idle_poll_us"] == v]) for v in low.index]
    out.tables.append(Table("Target idle polling period", table,
                            "Each period's p99 at the lowest and IOPS at the highest queue depth, "
                            "relative to no idle polling (0 µs)."))
    modes = sorted(str(m) for m in data["completion"].dropna().unique()) if "completion" in data else []
    under = f" with completion = {', '.join(modes)}" if modes else ""
    decision, best = CANNOT_DECIDE, 0
    evidence = ""
    if math.isnan(base_p99):
        out.findings.append("The idle_poll leg has no idle_poll_us = 0 baseline, so the effect "
                            "of idle polling cannot be expressed as a change and no period is recommended.")
        decision = "cannot decide (no 0 µs baseline): keep the default"
    else:
        # A period is a candidate when its p99 is clearly below no idle polling (interval of the
        # difference excludes zero); of the candidates, the shortest one not clearly worse than the
        # best candidate wins, since a longer period costs target CPU for nothing.
        base = low.loc[0]
        periods = [p for p in low.index if p != 0]
        diffs = dict(zip(periods, corrected([compare(base, low.loc[p], "lat_p99_ns") for p in periods])))
        _period_findings(out, diffs, low["lat_p99_ns_mean"], _us, f"p99 at QD{low_qd}", under)
        if diffs and all(d.decidable for d in diffs.values()):
            pick = idle_poll_choice(base, [low.loc[p] for p in periods])
            if pick >= 0:
                best = periods[pick]
                decision = CHOSEN + " (shortest period whose p99 is not clearly worse than the best)"
            else:
                decision = NO_WINNER
        elif not diffs:
            decision = "cannot decide (only 0 µs measured): keep the default"
        evidence = "; ".join(f"{p:g} µs − 0 µs = {d.text(_us)}" for p, d in sorted(diffs.items()))
    if high_qd != low_qd and not math.isnan(base_iops):
        periods = [p for p in high.index if p != 0]
        iops_diffs = dict(zip(periods, corrected([compare(high.loc[0], high.loc[p], "iops") for p in periods])))
        _period_findings(out, iops_diffs, high["iops_mean"], _kiops, f"IOPS at QD{high_qd}", under)
    p99_text = us(low["lat_p99_ns_mean"].get(best, math.nan))
    recommend.append({"knob": "idle_poll_us (target idle polling)",
                      "suggested value": f"{best:g} µs", "decision": decision,
                      "evidence": f"p99 at QD{low_qd}{under}: {p99_text}" + (f"; {evidence}" if evidence else ""),
                      "leg": "idle_poll", "_knob": "idle_poll_us", "_value": int(best),
                      "_decided": decision.startswith(CHOSEN)})


def _period_findings(out: StudyResult, diffs: dict, means: pd.Series, fmt: Callable[[float], str], what: str,
                     under: str) -> None:
    """Each idle poll period against none (0 µs), Holm over the periods: every clear change in a
    sentence of its own; the periods without one together, shown by the closest call (smallest p)."""
    if not diffs:
        return
    family = f"Holm over {len(diffs)} period{'s' if len(diffs) != 1 else ''}"
    base = means.get(0, math.nan)
    for period, d in sorted(diffs.items()):
        if d.clear:
            out.findings.append(claim(
                d, fmt, f"Target idle polling at {period:g} µs{under} {changed(what, change_pct(base, means[period]))}",
                f"{what} between idle polling at {period:g} µs and none",
                f"{fmt(base)} at 0 µs → {fmt(means[period])}; {family}") + ".")
    rest = {p: d for p, d in diffs.items() if not d.clear}
    if not rest:
        return
    shown = min(rest, key=lambda p: (math.isnan(rest[p].p), rest[p].p if not math.isnan(rest[p].p) else 0, p))
    names = ", ".join(f"{p:g}" for p in sorted(rest))
    out.findings.append(claim(
        rest[shown], fmt, "", f"{what} between target idle polling{under} at {names} µs and none",
        f"{family}; the closest call, {shown:g} µs: {fmt(base)} at 0 µs → {fmt(means[shown])}") + ".")


def _matrix(rows: pd.DataFrame, out: StudyResult, recommend: list[dict]) -> None:
    data = leg_rows(rows, "matrix", "main")
    if data.empty:
        out.findings.append(missing_leg(rows, "matrix",
                                        "the interaction of two knobs was not evaluated"))
        return
    flags = pd.DataFrame({k: data[k].map(on) for k, on in MATRIX_KNOBS.items() if k in data})
    crossed = [k for k in flags if flags[k].nunique() == 2]
    if len(crossed) != 2:
        out.findings.append(f"The matrix leg varies {len(crossed)} on/off knob(s) "
                            f"({', '.join(crossed) or 'none'}) instead of two, so no 2×2 matrix "
                            "was built.")
        return
    a, b = crossed
    data = data.assign(**{f"{a} on": flags[a], f"{b} on": flags[b]})
    agg = aggregate(data, by=[f"{a} on", f"{b} on", "iodepth"])
    low_qd, high_qd = agg["iodepth"].min(), agg["iodepth"].max()
    cells, best = {}, None
    low_rows = {}
    for (a_on, b_on), group in agg.groupby([f"{a} on", f"{b} on"]):
        p99 = first(group[group["iodepth"] == low_qd], "lat_p99_ns_mean")
        iops = first(group[group["iodepth"] == high_qd], "iops_mean")
        low = group[group["iodepth"] == low_qd]
        low_rows[(bool(a_on), bool(b_on))] = low.iloc[0] if len(low) else None
        redundant = _redundant({a: a_on, b: b_on})
        cells[(a_on, b_on)] = f"{p99 / 1e3:.2f} / {iops / 1e3:.2f}" + (" (redundant)" if redundant else "")
        if not redundant and (best is None or (p99, -iops) < (best[2], -best[3])):
            best = (a_on, b_on, p99, iops)
    name = {k: {v: f"{k} = {_on_value(data, k, v)}" for v in (True, False)} for k in (a, b)}
    matrix = pd.DataFrame(
        [[cells.get((ra, cb), "missing") for cb in (True, False)] for ra in (True, False)],
        index=[name[a][v] for v in (True, False)],
        columns=[name[b][v] for v in (True, False)],
    ).rename_axis(f"p99 µs (QD{low_qd:g}) / KIOPS (QD{high_qd:g})").reset_index()
    out.tables.append(Table(f"Interaction of {a} and {b}", matrix,
                            f"Each cell: p99 latency at QD{low_qd:g} in µs / throughput at "
                            f"QD{high_qd:g} in KIOPS (thesis table 3.3 shape); a cell marked redundant "
                            "combines a polling reactor with idle polling, which it never uses."))
    if best is None:
        return
    a_on, b_on, p99, iops = best
    candidates = [k for k in sorted(low_rows, reverse=True) if low_rows[k] is not None and not _redundant({a: k[0], b: k[1]})]
    cell_name = {k: f"{name[a][k[0]]} with {name[b][k[1]]}" for k in candidates}
    out.findings.append(matrix_pick(candidates, low_rows, cell_name, f"QD{low_qd:g}", len(cells)) + ".")
    chosen_on = {a: bool(a_on), b: bool(b_on)}
    for knob, other in ((a, b), (b, a)):
        if any(r.get("_knob") == knob for r in recommend):
            continue
        # Hold the other knob where it is recommended (or at the best cell), and compare this one
        # on against off there: the interval of the difference decides, else the default stays.
        prior = next((r for r in recommend if r.get("_knob") == other), None)
        other_on = MATRIX_KNOBS[other](prior["_value"]) if prior is not None else chosen_on[other]
        cell = lambda on: low_rows.get((on, other_on) if knob == a else (other_on, on))  # noqa: E731
        off_row, on_row = cell(False), cell(True)
        default = DEFAULTS.get(knob)
        if off_row is None or on_row is None:
            value, decision, evidence = default, "cannot decide (a matrix cell is missing): keep the default", ""
        else:
            d = compare(off_row, on_row, "lat_p99_ns")
            evidence = (f"p99 at QD{low_qd:g} with {name[other][other_on]}: on − off = {d.text(_us)}")
            if not d.decidable:
                value, decision = default, CANNOT_DECIDE
            elif d.clear:
                value = _typed_value(data, knob, d.diff < 0)
                decision = CHOSEN + " (lower p99 in the matrix)"
            else:
                value, decision = default, NO_WINNER
        recommend.append({"knob": knob, "suggested value": str(value), "decision": decision,
                          "evidence": evidence, "leg": "matrix", "_knob": knob, "_value": value,
                          "_decided": decision.startswith(CHOSEN)})


def matrix_pick(candidates: list, low_rows: dict, cell_name: dict, qd: str, cells: int) -> str:
    """The matrix's lowest p99 at `qd` among the cells that are not redundant, as a decision:
    `decide.pick_best_summary` (clearly below every other cell, Holm over the k − 1 comparisons with
    it), stated with the interval against the runner-up; else no clear best, shown by the comparison
    that stopped it (the largest p)."""
    k = len(candidates)
    left = f" ({cells - k} redundant or missing left out)" if cells > k else ""
    if k < 2:
        return descriptive(f"Only {k} of the {cells} combinations could be compared{left}, so none is picked")
    summary = tuple(np.array([float(low_rows[c].get(f"lat_p99_ns_{s}", math.nan)) for c in candidates])
                    for s in ("mean", "std", "n"))
    pick = int(pick_best_summary(summary, higher_is_better=False))
    top = pick if pick >= 0 else int(np.nanargmin(summary[0]))
    others = [i for i in range(k) if i != top]
    diffs = corrected([compare(low_rows[candidates[top]], low_rows[candidates[i]], "lat_p99_ns") for i in others])
    family = f"Holm over the {k - 1} comparison{'s' if k > 2 else ''} with it"
    best = candidates[top]
    if pick >= 0:
        runner = min(range(len(others)), key=lambda j: summary[0][others[j]])
        d = diffs[runner]
        return claim(d, _us, f"Of the {k} combinations{left}, {cell_name[best]} had the lowest p99 at {qd} "
                             f"({us(summary[0][top])}), clearly below every other",
                     "", f"{family}; against the runner-up, {cell_name[candidates[others[runner]]]} "
                         f"({us(summary[0][others[runner]])}): other − best")
    weakest = max(range(len(others)), key=lambda j: (diffs[j].p if not math.isnan(diffs[j].p) else math.inf))
    d = diffs[weakest]
    return (claim(d, _us, "", f"p99 at {qd} between {cell_name[best]} (the lowest mean, {us(summary[0][top])}) and "
                              f"{cell_name[candidates[others[weakest]]]} ({us(summary[0][others[weakest]])})",
                  f"{family}: other − best") + f", so no clear best among the {k} combinations{left}")


def _redundant(state: dict[str, bool]) -> bool:
    """A polling reactor never idles, so idle polling on top of it changes nothing."""
    return bool(state.get("target_mode")) and bool(state.get("idle_poll_us"))


def _typed_value(data: pd.DataFrame, knob: str, knob_on: bool):
    values = data.loc[data[f"{knob} on"] == knob_on, knob].dropna().unique()
    value = values[0] if len(values) else DEFAULTS.get(knob)
    return value.item() if hasattr(value, "item") else value


def _drop_redundant(recommend: list[dict]) -> None:
    """Reactor polling makes idle polling redundant: recommend idle_poll_us = 0 with it."""
    mode = next((r for r in recommend if r.get("_knob") == "target_mode"), None)
    idle = next((r for r in recommend if r.get("_knob") == "idle_poll_us"), None)
    if mode is None or idle is None or mode["_value"] != "poll" or not idle["_value"]:
        return
    idle.update({"suggested value": "0 µs", "_value": 0, "_decided": False,
                 "decision": f"redundant with target_mode = poll (a polling reactor never idles; the idle_poll "
                             f"leg had chosen {idle['suggested value']}): keep the default"})


def _on_value(data: pd.DataFrame, knob: str, knob_on: bool) -> str:
    """The spec value of `knob` used in the matrix rows that had it on/off."""
    values = data.loc[data[f"{knob} on"] == knob_on, knob].dropna().unique()
    return ", ".join(str(v) for v in values) if len(values) else ("on" if knob_on else "off")


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Polling configuration knobs (completion, idle polling, interaction)")
    out.excluded = excluded_points(rows)
    recommend = _recommend(rows, out)
    _io_queues(rows, out)
    analyze_rx(rows, out)
    if recommend:
        frame = pd.DataFrame(recommend)
        out.recommendations = frame[[c for c in frame.columns if not c.startswith("_")]]
    return out


def _io_queues(rows: pd.DataFrame, out: StudyResult) -> None:
    """The I/O queue count sweep (one job per queue): IOPS and p99 per queue count and QD, and
    whether the most queues beat one queue at each QD, with the interval of the difference."""
    if rows.empty or "io_queues" not in set(rows["leg"]):
        return
    data = leg_rows(rows, "io_queues", "main")
    if data.empty:
        out.findings.append(missing_leg(rows, "io_queues", "the queue count effect was not measured"))
        return
    agg = aggregate(data, by=["io_queues", "iodepth"])
    table = pd.DataFrame({
        "io_queues": agg["io_queues"].astype(int), "QD": agg["iodepth"].astype(int),
        "KIOPS": (agg["iops_mean"] / 1e3).round(2), "± KIOPS (95 %)": (agg["iops_ci95"] / 1e3).round(2),
        "p99 (µs)": (agg["lat_p99_ns_mean"] / 1e3).round(1), "repeats": agg["iops_n"].astype(int),
        "cores used": [cores_text(data[(data["io_queues"] == q) & (data["iodepth"] == d)])
                       for q, d in zip(agg["io_queues"], agg["iodepth"])]})
    out.tables.append(Table("I/O queue count (one job per queue)", table,
                            "Means over repeats with the 95 % interval; the jobs of a point add up (IOPS), "
                            "p99 is the worst job's. Queue count and job count move together here."))
    cells = []
    for qd, group in agg.groupby("iodepth"):
        group = group.sort_values("io_queues")
        if len(group) >= 2:
            cells.append((qd, group.iloc[0], group.iloc[-1]))
    # One comparison per queue depth: a family, so Holm's correction over the depths.
    diffs = corrected([compare(low, high, "iops") for _, low, high in cells])
    for (qd, low, high), d in zip(cells, diffs):
        pair = f"{int(high['io_queues'])} I/O queues vs {int(low['io_queues'])}"
        out.findings.append(claim(
            d, _kiops, f"At QD{int(qd)}, {pair} {changed('IOPS', change_pct(low['iops_mean'], high['iops_mean']))}",
            f"IOPS at QD{int(qd)} between {pair}",
            f"{kiops(low['iops_mean'])} → {kiops(high['iops_mean'])}; Holm over {len(cells)} queue depths") + ".")


def _recommend(rows: pd.DataFrame, out: StudyResult) -> list[dict]:
    recommend: list[dict] = []
    _completion(rows, out, recommend)
    _idle_poll(rows, out, recommend)
    _matrix(rows, out, recommend)
    _drop_redundant(recommend)
    return recommend


def recommended_knobs(measurements: pd.DataFrame) -> dict[str, object]:
    """The knobs the polling study chose, as spec `[knobs]` values (thesis table 4.2 carried over).

    Only decided recommendations count: a knob with no clear winner, or too few repeats, is left
    out so the spec's own value (the default) stays.
    """
    rows = study_rows(measurements, STUDY)
    if rows.empty:
        return {}
    scratch = StudyResult(STUDY, "")
    return {r["_knob"]: r["_value"] for r in _recommend(rows, scratch) if r.get("_decided")}
