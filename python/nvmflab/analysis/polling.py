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
from .common import Difference, compare, corrected, excluded_points, first, leg_rows, missing_leg, study_rows
from .cores_used import cores_text
from .decide import pick_shortest_summary
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


def _note(d: Difference) -> str:
    """What a finding adds after a difference: nothing when its interval excludes zero."""
    if not d.decidable:
        return " (fewer than two repeats or repeats without spread, so no interval: not a decision)"
    if d.clear:
        return ""
    return (f" (difference {d.text(_us)}: the 95 % interval includes zero, so not a clear effect)")


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
    p99_change = change_pct(event["_p99"], poll["_p99"])
    peak_change = change_pct(event["_peak"], poll["_peak"])
    out.findings.append(
        f"Host completion polling (completion = poll) "
        f"{changed('the p99 latency at QD' + str(poll['lowest iodepth']), p99_change)} "
        f"({us(event['_p99'])} → {us(poll['_p99'])})"
        f"{_note(compare(event['_qd1'], poll['_qd1'], 'lat_p99_ns'))} and "
        f"{changed('the peak IOPS', peak_change)} ({kiops(event['_peak'])} at QD"
        f"{event['peak at iodepth']} → {kiops(poll['_peak'])} at QD{poll['peak at iodepth']})."
    )
    deepest = agg[agg["iodepth"] == agg["iodepth"].max()].set_index("completion")["ctx_mean"]
    if {"poll", "event"} <= set(deepest.index) and not deepest.isna().any():
        what = "the load generator's context switches"
        out.findings.append(
            f"At QD{int(agg['iodepth'].max())} polling "
            f"{changed(what, change_pct(deepest['event'], deepest['poll']))} "
            f"({deepest['event']:,.0f} → {deepest['poll']:,.0f})."
        )
    # Lower p99 for the L-app decides; when its interval includes zero, a clear peak IOPS gain does;
    # otherwise nothing is recommended and the default stays. The two tests are one family (Holm),
    # so the rule declares a winner in at most 5 % of runs where the modes do not differ.
    p99, peak = corrected([compare(event["_qd1"], poll["_qd1"], "lat_p99_ns"),
                           compare(event["_peak_row"], poll["_peak_row"], "iops")])
    qd = f"QD{poll['lowest iodepth']}"
    evidence = (f"p99 at {qd}: poll − event = {p99.text(_us)}; peak IOPS: poll − event = {peak.text(_kiops)}")
    choice, decision = completion_choice(p99, peak)
    if decision == CHOSEN:
        decision += (f" (lower p99 at {qd})" if p99.clear else " (p99 tie; higher peak IOPS)" if p99.decidable
                     else " (p99 without an interval; higher peak IOPS)")
    recommend.append({"knob": "completion (host completion polling)", "suggested value": choice,
                      "decision": decision, "evidence": evidence, "leg": "completion",
                      "_knob": "completion", "_value": choice, "_decided": decision.startswith(CHOSEN)})


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
        changes = {p: change_pct(base_p99, v) for p, v in low["lat_p99_ns_mean"].items() if p != 0}
        if changes:
            lo, hi = min(changes.values()), max(changes.values())
            periods = sorted(changes)
            effect = (f"by {lo:+.1f} % at {periods[0]:g} µs" if len(periods) == 1
                      else f"by {lo:+.1f} to {hi:+.1f} % across {periods[0]:g}–{periods[-1]:g} µs")
            out.findings.append(
                f"Target idle polling{under} changed p99 at QD{low_qd} {effect} (baseline {us(base_p99)} at 0 µs)."
            )
        # A period is a candidate when its p99 is clearly below no idle polling (interval of the
        # difference excludes zero); of the candidates, the shortest one not clearly worse than the
        # best candidate wins, since a longer period costs target CPU for nothing.
        base = low.loc[0]
        diffs = {p: compare(base, low.loc[p], "lat_p99_ns") for p in low.index if p != 0}
        if diffs and all(d.decidable for d in diffs.values()):
            periods = sorted(diffs)
            pick = idle_poll_choice(base, [low.loc[p] for p in periods])
            diffs = dict(zip(periods, corrected([diffs[p] for p in periods])))
            if pick >= 0:
                best = periods[pick]
                decision = CHOSEN + " (shortest period whose p99 is not clearly worse than the best)"
            else:
                decision = NO_WINNER
            evidence = "; ".join(f"{p:g} µs − 0 µs = {d.text(_us)}" for p, d in sorted(diffs.items()))
        elif diffs:
            evidence = "; ".join(f"{p:g} µs − 0 µs = {d.text(_us)}" for p, d in sorted(diffs.items()))
        else:
            decision = "cannot decide (only 0 µs measured): keep the default"
    if high_qd != low_qd and not math.isnan(base_iops):
        periods = [p for p in high.index if p != 0]
        iops_diffs = dict(zip(periods, corrected([compare(high.loc[0], high.loc[p], "iops") for p in periods])))
        iops_changes = [change_pct(base_iops, v) for p, v in high["iops_mean"].items() if p != 0]
        if iops_changes:
            clear = [p for p, d in iops_diffs.items() if d.clear]
            spread = max(abs(c) for c in iops_changes)
            if not all(d.decidable for d in iops_diffs.values()):
                verdict = f"throughput changes of up to {spread:.1f} % (fewer than two repeats or no spread, so no interval)"
            elif not clear:
                verdict = "no clear throughput change (every difference within its 95 % interval)"
            else:
                verdict = (f"a clear throughput change at {', '.join(f'{p:g}' for p in sorted(clear))} µs "
                           f"(up to {spread:.1f} %)")
            span = (f"{iops_changes[0]:+.1f} %" if len(iops_changes) == 1
                    else f"{min(iops_changes):+.1f} to {max(iops_changes):+.1f} %")
            out.findings.append(f"At QD{high_qd} idle polling showed {verdict} ({span} vs 0 µs).")
    p99_text = us(low["lat_p99_ns_mean"].get(best, math.nan))
    recommend.append({"knob": "idle_poll_us (target idle polling)",
                      "suggested value": f"{best:g} µs", "decision": decision,
                      "evidence": f"p99 at QD{low_qd}{under}: {p99_text}" + (f"; {evidence}" if evidence else ""),
                      "leg": "idle_poll", "_knob": "idle_poll_us", "_value": int(best),
                      "_decided": decision.startswith(CHOSEN)})


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
    out.findings.append(f"Of the {len(cells)} combinations, {name[a][a_on]} with "
                        f"{name[b][b_on]} had the lowest p99 ({us(p99)}) with {kiops(iops)} at "
                        f"QD{high_qd:g}.")
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
        what = f"At QD{int(qd)}, {int(high['io_queues'])} I/O queues vs {int(low['io_queues'])}"
        if not d.decidable:
            out.findings.append(f"{what}: {d.text(_kiops)} (fewer than two repeats or no spread, so no interval: not a decision).")
        elif not d.clear:
            out.findings.append(f"{what}: no significant difference in IOPS ({d.text(_kiops)}, the 95 % interval "
                                f"of the difference includes zero).")
        else:
            out.findings.append(f"{what} {changed('IOPS', change_pct(low['iops_mean'], high['iops_mean']))} "
                                f"({d.text(_kiops)}, 95 % interval of the difference).")


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
