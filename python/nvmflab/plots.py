"""Figures of the studies, drawn from aggregated measurements (analysis.stats.aggregate).

Each function returns a matplotlib Figure with a title, axis labels carrying units, a legend
naming the knob values as the spec names them (e.g. "completion = poll"), and 95 % confidence
error bars from the repeats. Figures are built on the Agg backend and never shown.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402  (the backend must be chosen before figures exist)
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from .analysis.stats import histogram_cdf  # noqa: E402
from .analysis.text import size  # noqa: E402

QD_LABEL = "Queue depth (iodepth, outstanding I/Os per job)"
P99_LABEL = "p99 latency (µs)"
KIOPS_LABEL = "Throughput (KIOPS)"
LOAD_LABEL = "Background load (bg_load_pct, % of the resource's saturation point)"


def new_figure(title: str) -> tuple[Figure, object]:
    """A figure and its axes in the one style every plot of the report shares (this module's and
    plots_extra's): constrained layout, the title wrapped at 80 characters, a light major grid."""
    figure = Figure(figsize=(7.5, 4.6), layout="constrained")
    axes = figure.add_subplot()
    axes.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=11)
    axes.grid(True, which="major", alpha=0.3)
    return figure, axes


def _log2_axis(axes, values: Sequence[float], formatter: Callable[[float], str] = lambda v: f"{v:g}") -> None:
    """Log2 x-axis whose ticks are exactly the swept values, written as a person would."""
    ticks = sorted({float(v) for v in values if v and not math.isnan(v)})
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(ticks))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([formatter(t) for t in ticks])


def knob_label(knob: str) -> Callable[[object], str]:
    """Legend text for one value of a knob, using the knob's own name."""
    return lambda value: f"{knob} = {value}"


def series_vs_x(
    agg: pd.DataFrame,
    x: str,
    metric: str,
    *,
    series: str | None,
    title: str,
    xlabel: str,
    ylabel: str,
    scale: float = 1.0,
    log2x: bool = False,
    xformat: Callable[[float], str] = lambda v: f"{v:g}",
    label: Callable[[object], str] | None = None,
) -> Figure:
    """One line per value of `series`: mean of `metric` vs `x`, with 95 % CI error bars."""
    figure, axes = new_figure(title)
    groups = [(None, agg)] if series is None else list(agg.groupby(series, dropna=False, sort=True))
    label = label or (knob_label(series) if series else (lambda _v: metric))
    for value, group in groups:
        group = group.sort_values(x)
        err = group.get(f"{metric}_ci95", pd.Series(np.nan, index=group.index)).fillna(0) * scale
        axes.errorbar(
            group[x], group[f"{metric}_mean"] * scale, yerr=err, marker="o", capsize=3,
            label=label(value),
        )
    if log2x and not agg.empty:
        _log2_axis(axes, agg[x].tolist(), xformat)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if groups and series is not None:
        axes.legend(fontsize=9)
    return figure


def p99_vs_qd(agg: pd.DataFrame, series: str, title: str) -> Figure:
    return series_vs_x(agg, "iodepth", "lat_p99_ns", series=series, title=title,
                       xlabel=QD_LABEL, ylabel=P99_LABEL, scale=1e-3, log2x=True)


def iops_vs_qd(agg: pd.DataFrame, series: str, title: str,
               label: Callable[[object], str] | None = None) -> Figure:
    return series_vs_x(agg, "iodepth", "iops", series=series, title=title, xlabel=QD_LABEL,
                       ylabel=KIOPS_LABEL, scale=1e-3, log2x=True, label=label)


def ctx_vs_qd(agg: pd.DataFrame, series: str, title: str) -> Figure:
    return series_vs_x(agg, "iodepth", "ctx", series=series, title=title, xlabel=QD_LABEL,
                       ylabel="Context switches of the load generator (count per run)",
                       log2x=True)


def p99_vs_idle_poll(agg: pd.DataFrame, title: str) -> Figure:
    return series_vs_x(agg, "idle_poll_us", "lat_p99_ns", series=None, title=title,
                       xlabel="Target idle poll period (idle_poll_us, µs; 0 = sleep when idle)",
                       ylabel=P99_LABEL, scale=1e-3)


def bandwidth_vs_bs(agg: pd.DataFrame, series: str, title: str,
                    label: Callable[[object], str] | None = None) -> Figure:
    return series_vs_x(agg, "bs", "bw_bytes", series=series, title=title,
                       xlabel="Block size (bs)", ylabel="Bandwidth (MB/s)", scale=1e-6,
                       log2x=True, xformat=size, label=label)


def load_positions(loads: Sequence[float]) -> dict[float, float]:
    """Where each background load sits on the x-axis; 'max' (inf, uncapped) goes last, a tenth of
    the axis (at least) after the highest finite load, so its label stands clear of that one's."""
    finite = sorted({float(v) for v in loads if not math.isinf(v) and not math.isnan(v)})
    span = finite[-1] - finite[0] if finite else 0.0
    step = max(min((b - a for a, b in zip(finite, finite[1:])), default=10.0), span / 10, 1.0)
    positions = {v: v for v in finite}
    if any(math.isinf(v) for v in loads):
        positions[math.inf] = (finite[-1] if finite else 0.0) + step
    return positions


def blank_overlapping_labels(figure: Figure, axes) -> None:
    """Blank each x tick label that would overlap the last one kept (measured on the laid-out
    figure); the last label ('max' on a load axis) is always kept, in place of a neighbour it
    overlaps."""
    figure.draw_without_rendering()  # lays the labels out, so their extents are known
    labels = axes.get_xticklabels()  # fresh Text objects each call: decide first, then set them
    texts = [label.get_text() for label in labels]
    boxes = [label.get_window_extent() for label in labels]
    kept: list[int] = []
    for index in (i for i, text in enumerate(texts) if text):
        if kept and boxes[index].x0 < boxes[kept[-1]].x1 + 2:
            if index < len(texts) - 1:
                texts[index] = ""
                continue
            texts[kept.pop()] = ""
        kept.append(index)
    axes.set_xticklabels(texts)


def vs_load(
    frame: pd.DataFrame, y: str, *, series: str, title: str, ylabel: str,
    reference: float, scale: float = 1.0, threshold: float | None = None,
    threshold_label: str = "",
) -> Figure:
    """An interference metric vs background load; the uncapped load (inf) is labelled 'max'.

    `frame` has columns bg_load_pct, `y`, optional `y`_ci95 and `series`. A dashed line marks the
    no-interference value, a dotted one the guideline threshold when given.
    """
    figure, axes = new_figure(title)
    positions = load_positions(frame["bg_load_pct"].dropna().tolist())
    for value, group in frame.groupby(series, sort=True):
        group = group.dropna(subset=["bg_load_pct"]).sort_values("bg_load_pct")
        err = group.get(f"{y}_ci95", pd.Series(np.nan, index=group.index)).fillna(0) * scale
        axes.errorbar(group["bg_load_pct"].map(positions), group[y] * scale, yerr=err,
                      marker="o", capsize=3, label=str(value))
    axes.axhline(reference * scale, color="grey", linestyle="--", linewidth=1,
                 label="no interference")
    values = frame[y].dropna()
    values = values[values > 0]
    if len(values) and values.max() > 10 * values.min():
        # One resource can be an order of magnitude worse; a log axis keeps the others readable.
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    if threshold is not None:
        axes.axhline(threshold * scale, color="tab:red", linestyle=":", linewidth=1.2,
                     label=threshold_label)
    loads = sorted(positions)
    axes.xaxis.set_major_locator(FixedLocator([positions[v] for v in loads]))
    axes.set_xticklabels(["max" if math.isinf(v) else f"{v:g}" for v in loads])
    blank_overlapping_labels(figure, axes)  # achieved loads of several series can lie close together
    axes.set_xlabel(LOAD_LABEL)
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=9)
    return figure


def latency_cdf(histograms: Mapping[str, object], title: str) -> Figure:
    """Cumulative distribution of completion latency, one line per labelled histogram."""
    figure, axes = new_figure(title)
    for label, histogram in histograms.items():
        values, fractions = histogram_cdf(histogram)
        if len(values):
            axes.step(values / 1e3, fractions, where="post", label=label)
    axes.set_xscale("log")
    axes.set_ylim(0, 1.01)
    axes.axhline(0.99, color="grey", linestyle=":", linewidth=1, label="p99")
    axes.set_xlabel("Completion latency (µs, log scale)")
    axes.set_ylabel("Fraction of I/Os completed (CDF)")
    axes.legend(fontsize=9)
    return figure


def bars(labels: Sequence[str], values: Sequence[float], errors: Sequence[float], *,
         title: str, ylabel: str) -> Figure:
    """Bar chart with value labels on top, for a few configurations side by side."""
    figure, axes = new_figure(title)
    errs = [0 if e is None or math.isnan(e) else e for e in errors]
    drawn = axes.bar(labels, values, yerr=errs, capsize=4,
                     color=["tab:blue", "tab:orange", "tab:green", "tab:purple"][: len(labels)])
    axes.bar_label(drawn, labels=[f"{v:.1f}" for v in values], padding=3)
    axes.set_ylabel(ylabel)
    axes.grid(True, axis="y", alpha=0.3)
    axes.grid(False, axis="x")
    return figure


def latency_timeline(records: Sequence[Mapping[str, float]], *, title: str,
                     change_at_ms: float | None = None) -> Figure:
    """Per-interval latency percentiles (left axis) and IOPS (right axis) over the run.

    `records` are nvmflab.intervals entries; t_ms is the end of each interval, so a dotted line at
    `change_at_ms` (the end of the last interval before a change) marks where it happened.
    """
    figure, axes = new_figure(title)
    seconds = np.array([r["t_ms"] for r in records], dtype=float) / 1e3
    for key, label, style in (("lat_mean_ns", "mean", ":"), ("lat_p50_ns", "p50", "-"), ("lat_p99_ns", "p99", "-"),
                              ("lat_p99_9_ns", "p99.9", "--")):
        values = np.array([np.nan if r.get(key) is None else r[key] for r in records], dtype=float) / 1e3
        if np.isfinite(values).any():
            axes.plot(seconds, values, style, marker="o", markersize=3, label=label)
    axes.set_xlabel("Time since the measurement started (s, end of each interval)")
    axes.set_ylabel("Completion latency (µs)")
    axes.set_ylim(bottom=0)
    if change_at_ms is not None:
        axes.axvline(change_at_ms / 1e3, color="grey", linestyle=":", linewidth=1.2, label="change")
    iops = np.array([np.nan if r.get("iops") is None else r["iops"] for r in records], dtype=float)
    if np.isfinite(iops).any():
        right = axes.twinx()
        right.plot(seconds, iops / 1e3, color="tab:grey", linewidth=1, alpha=0.6, label="KIOPS")
        right.set_ylabel(KIOPS_LABEL)
        right.set_ylim(bottom=0)
        lines, labels = axes.get_legend_handles_labels()
        more, more_labels = right.get_legend_handles_labels()
        axes.legend(lines + more, labels + more_labels, fontsize=9, loc="best")
    else:
        axes.legend(fontsize=9)
    return figure
