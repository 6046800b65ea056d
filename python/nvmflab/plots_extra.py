"""Figures of the contention, dimensions, busy-poll and parallelism studies: lines of a metric
against a swept value and grouped bars, drawn on the Agg backend, never shown (CDFs: plots.latency_cdf)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .plots import new_figure  # noqa: E402  (one figure style for every plot)


Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]  # label -> (x values, y values)


def lines(series: Series, *, title: str, xlabel: str, ylabel: str, log2_x: bool = False,
          xticklabels: Mapping[float, str] | None = None) -> Figure:
    """One marked line per label; x ticks at exactly the values measured."""
    figure, axes = new_figure(title)
    ticks: set[float] = set()
    for label, (xs, ys) in series.items():
        pairs = [(float(x), float(y)) for x, y in zip(xs, ys) if not math.isnan(float(y))]
        if not pairs:
            continue
        pairs.sort()
        axes.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", label=label)
        ticks |= {p[0] for p in pairs}
    if log2_x and ticks and min(ticks) > 0:
        axes.set_xscale("log", base=2)
    if ticks:
        ordered = sorted(ticks)
        axes.set_xticks(ordered)
        axes.set_xticklabels([(xticklabels or {}).get(t, f"{t:g}") for t in ordered])
        axes.minorticks_off()
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if series:
        axes.legend(fontsize=9)
    return figure


def grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str,
                 ylabel: str) -> Figure:
    """Bars per group (x) and series (colour), each labelled with its value."""
    figure, axes = new_figure(title)
    names = list(series)
    width = 0.8 / max(1, len(names))
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        values = [0.0 if v is None or math.isnan(v) else float(v) for v in series[name]]
        drawn = axes.bar(x + (i - (len(names) - 1) / 2) * width, values, width, label=name)
        axes.bar_label(drawn, labels=[f"{v:.1f}" for v in values], padding=2, fontsize=8)
    axes.set_xticks(x)
    axes.set_xticklabels(groups, fontsize=9)
    axes.set_ylabel(ylabel)
    axes.grid(False, axis="x")
    if len(names) > 1:
        axes.legend(fontsize=9)
    return figure
