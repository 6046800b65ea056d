"""Figures of the contention, dimensions, busy-poll and parallelism studies: lines of a metric
against a swept value and grouped bars, drawn on the Agg backend, never shown (CDFs: plots.latency_cdf)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .plots import (  # noqa: E402  (one figure style and one error-bar rule for every plot)
    MISSING_BAR_NOTE, add_note, fit_value_labels, fit_x_labels, mark_left_out, missing_bar, needs_sweep, needs_text,
    new_figure, nonnegative_yerr)


Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]  # label -> (x values, y values)
LEFT_OUT_LABEL = "left out of the findings"
BETTER_TITLES = {"lower": "lower is better", "higher": "higher is better"}


def lines(series: Series, *, title: str, xlabel: str, ylabel: str, log2_x: bool = False,
          xticklabels: Mapping[float, str] | None = None,
          errors: Mapping[str, Sequence[float]] | None = None,
          left_out: Series | None = None, left_out_label: str = LEFT_OUT_LABEL,
          needs: str | None = None) -> Figure:
    """One marked line per label; x ticks at exactly the values measured. `errors` (label -> 95 %
    half-widths, aligned with its x values) draws error bars; `left_out` draws points measured but
    left out of the findings as crosses. With fewer than two x values in all, no line: `needs`
    (default: needs_text(xlabel)) stands in the axes and the caption."""
    figure, axes = new_figure(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    every_x = [x for xs, _ in list(series.values()) + list((left_out or {}).values()) for x in xs]
    if needs_sweep(figure, axes, every_x, needs or needs_text(xlabel),
                   lambda v: (xticklabels or {}).get(v, f"{v:g}")):
        return figure
    ticks: set[float] = set()
    for label, (xs, ys) in series.items():
        halves = list((errors or {}).get(label, [math.nan] * len(xs)))
        points = sorted((float(x), float(y), float(h)) for x, y, h in zip(xs, ys, halves) if not math.isnan(float(y)))
        if not points:
            continue
        x, y, h = (list(column) for column in zip(*points))
        if errors and label in errors:
            axes.errorbar(x, y, yerr=nonnegative_yerr(figure, y, h), marker="o", capsize=3, label=label)
        else:
            axes.plot(x, y, marker="o", label=label)
        ticks |= set(x)
    for label, (xs, ys) in (left_out or {}).items():
        mark_left_out(axes, xs, ys, f"{left_out_label} ({label})" if len(left_out) > 1 else left_out_label)
        ticks |= {float(x) for x in xs}
    if log2_x and ticks and min(ticks) > 0:
        axes.set_xscale("log", base=2)
    if ticks:
        ordered = sorted(ticks)
        axes.set_xticks(ordered)
        axes.set_xticklabels([(xticklabels or {}).get(t, f"{t:g}") for t in ordered])
        axes.minorticks_off()
    if series:
        axes.legend(fontsize=9)
    return figure


def grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str,
                 ylabel: str, errors: Mapping[str, Sequence[float]] | None = None,
                 better: Sequence[str] | None = None, missing_note: str = MISSING_BAR_NOTE) -> Figure:
    """Bars per group (x) and series (colour), each labelled with its value; `errors` (series ->
    95 % half-widths per group) draws error bars. `better` says per group whether "lower" or
    "higher" is better: groups of both kinds go to two panels, so a bar that grew is never read as
    good on one and bad on the next. A bar without a value (None, NaN) is a hatched column marked
    ✗, and `missing_note` (why such bars have none) goes to the caption."""
    missing = any(v is None or math.isnan(float(v)) for values in series.values() for v in values)
    note = missing_note if missing else ""
    kinds = list(dict.fromkeys(better or []))
    if len(kinds) < 2:
        figure, axes = new_figure(title)
        _bars(figure, axes, list(range(len(groups))), groups, series, errors, ylabel)
        if note:
            add_note(figure, note)
        return figure
    figure, first = new_figure(title)
    figure.delaxes(first)
    for i, kind in enumerate(kinds):
        axes = figure.add_subplot(1, len(kinds), i + 1)
        axes.set_title(BETTER_TITLES.get(kind, kind), fontsize=10)
        axes.grid(True, which="major", alpha=0.3)
        picked = [j for j, k in enumerate(better) if k == kind]
        _bars(figure, axes, picked, groups, series, errors, ylabel if i == 0 else "")
    figure.suptitle(first.get_title(), fontsize=11)
    if note:
        add_note(figure, note)
    return figure


def _bars(figure: Figure, axes, picked: Sequence[int], groups: Sequence[str], series: Mapping[str, Sequence[float]],
          errors: Mapping[str, Sequence[float]] | None, ylabel: str) -> None:
    """The bars of the groups at indices `picked` on one axes."""
    names = list(series)
    width = 0.8 / max(1, len(names))
    x = np.arange(len(picked))
    texts = []
    for i, name in enumerate(names):
        values = [float(series[name][j]) if series[name][j] is not None else math.nan for j in picked]
        heights = [0.0 if math.isnan(v) else v for v in values]
        yerr = None
        if errors and name in errors:
            halves = [math.nan if errors[name][j] is None else float(errors[name][j]) for j in picked]
            yerr = nonnegative_yerr(figure, heights, halves)
        where = x + (i - (len(names) - 1) / 2) * width
        drawn = axes.bar(where, heights, width, yerr=yerr, capsize=3 if yerr is not None else 0, label=name)
        labels = axes.bar_label(drawn, labels=["✗" if math.isnan(v) else f"{v:.1f}" for v in values],
                                padding=2, fontsize=8)
        for at, value, label in zip(where, values, labels):
            if math.isnan(value):
                missing_bar(axes, at, width)
                label.set_color("tab:red")
        texts += labels
    axes.margins(y=0.12)  # headroom: the value labels above the tallest bar stay under the title
    axes.set_xticks(x)
    axes.set_xticklabels([groups[j] for j in picked], fontsize=9)
    axes.set_ylabel(ylabel)
    axes.grid(False, axis="x")
    if len(names) > 1:
        axes.legend(fontsize=9)
    fit_x_labels(figure, axes)
    fit_value_labels(figure, axes, texts)
