"""Figures of the studies, drawn from aggregated measurements (analysis.stats.aggregate).

Each function returns a matplotlib Figure with a title, axis labels carrying units, a legend
naming the knob values as the spec names them (e.g. "completion = poll"), and, where the data
carries them, 95 % confidence error bars from the repeats (nonnegative_yerr: never below zero).
Figures are built on the Agg backend and never shown. What a reader must know to not over-read a
figure (an interval cut at zero, loads past saturation, a sweep with one value) is added as a note
(add_note) that analysis.result.Figure appends to the caption.
"""

from __future__ import annotations

import math
import numbers
import textwrap
from collections.abc import Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402  (the backend must be chosen before figures exist)
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from .analysis.stats import histogram_cdf  # noqa: E402
from .analysis.text import size  # noqa: E402

QD_LABEL = "Queue depth (iodepth, outstanding I/Os per job)"
P99_LABEL = "p99 latency (µs)"
KIOPS_LABEL = "Throughput (KIOPS)"
LOAD_LABEL = "Background load (bg_load_pct, % of the resource's saturation point)"

CLIPPED_NOTE = ("Error bars: 95 % intervals; where one would reach below zero it is cut at zero, since the "
                "quantity cannot be negative.")
FIELLER_NOTE = ("Error bars: Fieller's 95 % interval of each ratio (the isolated baseline's spread included), "
                "the interval the findings state; a point without one has no bounded interval.")
NO_INTERVAL_NOTE = ("No point has a bounded 95 % interval here (too few repeats, or a baseline too spread for "
                    "Fieller's), so the figure has no error bars.")
OVER_SATURATION_NOTE = ("Loads above 100 %: 100 % is the saturation point the run calibrated (the IOPS its "
                        "capped rates are derived from); an uncapped ('max') or faster background can run "
                        "past it, so those loads are shown as achieved, not capped.")
LEFT_OUT_STYLE = {"marker": "x", "linestyle": "none", "color": "black", "markersize": 8}
FAILED_STYLE = {"marker": "x", "linestyle": "none", "color": "tab:red", "markersize": 9, "markeredgewidth": 2}
FAILED_LABEL = "failed or invalid (no value)"
MISSING_BAR_NOTE = ("A hatched column marked ✗ has no value: that point failed, was not measured or was "
                    "left out.")


def add_note(figure: Figure, text: str) -> None:
    """Remember a sentence the figure's caption must carry (read back by notes())."""
    kept = figure.__dict__.setdefault("nvmflab_notes", [])
    if text not in kept:
        kept.append(text)


def notes(figure: Figure) -> list[str]:
    return list(getattr(figure, "nvmflab_notes", []))


def nonnegative_yerr(figure: Figure, means: Sequence[float], halves: Sequence[float]) -> np.ndarray:
    """Error bars (2 x n, lower and upper) for a quantity that cannot be negative (latency, IOPS,
    bandwidth, CPU, their ratios): the 95 % t interval, its lower arm cut at zero, with a caption
    note when any was cut. A missing interval (NaN) stays missing: no bar is drawn, rather than a
    zero-length one that would look exact. Every error bar of the report goes through here."""
    means = np.asarray(means, dtype=float)
    halves = np.asarray(halves, dtype=float)
    lower = np.where(np.isnan(halves), np.nan, np.minimum(halves, np.clip(means, 0.0, None)))
    if (halves > np.clip(means, 0.0, None)).any():  # NaN compares False
        add_note(figure, CLIPPED_NOTE)
    return np.vstack([lower, halves])


def bounds_yerr(figure: Figure, means: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> np.ndarray:
    """Error bars (2 x n) from an interval's own bounds, such as Fieller's for a ratio, which need
    not be symmetric; cut at zero like nonnegative_yerr, and no bar where the interval is missing or
    unbounded."""
    means, lows, highs = (np.asarray(v, dtype=float) for v in (means, lows, highs))
    bounded = np.isfinite(lows) & np.isfinite(highs)
    if (bounded & (lows < 0)).any():
        add_note(figure, CLIPPED_NOTE)
    lower = np.where(bounded, means - np.clip(lows, 0.0, None), np.nan)
    upper = np.where(bounded, highs - means, np.nan)
    return np.vstack([np.clip(lower, 0.0, None), np.clip(upper, 0.0, None)])


def needs_text(what: str) -> str:
    """What a sweep axis needs before a line over it means anything."""
    if "cores" in what.lower():
        return "needs ≥ 2 core counts (a machine with more cores)"
    return f"needs ≥ 2 values of {what}"


def needs_sweep(figure: Figure, axes, xs: Sequence[float], needs: str,
                shown: Callable[[float], str] = lambda v: f"{v:g}") -> bool:
    """True when `xs` has fewer than two distinct values: then the axes says so instead of a line,
    and the caption gets the same note, since one point on an axis that promises a sweep reads as a
    trend that was never measured."""
    # A swept knob may take words (tls = off/on) as well as numbers: count values, do not convert them.
    distinct = {x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))}
    if len(distinct) >= 2:
        return False
    only = next(iter(distinct)) if distinct else None
    measured = ("this run measured none" if only is None else
                f"this run measured only {shown(only) if isinstance(only, numbers.Real) else only}")
    axes.set_xticks([])
    axes.set_yticks([])
    axes.grid(False)
    axes.text(0.5, 0.5, f"Not drawn: {needs}\n({measured})", transform=axes.transAxes, ha="center",
              va="center", fontsize=11, color="dimgrey")
    add_note(figure, f"Not drawn: {needs} ({measured}).")
    return True


def mark_left_out(axes, xs: Sequence[float], ys: Sequence[float], label: str) -> None:
    """Points measured but left out of the findings, drawn as black crosses with a legend entry,
    so a reader does not take them for the ones the findings rest on."""
    if len(xs):
        axes.plot(list(xs), list(ys), label=label, **LEFT_OUT_STYLE)


def mark_failed(figure: Figure, count: int) -> None:
    """A red line under the figure saying how many points of its study failed or broke a sanity
    invariant and so are not drawn (the caption names them), so a curve with a hole is not read as
    complete. Kept by constrained layout like a title."""
    figure.nvmflab_failed = count
    plural = count != 1
    figure.supxlabel(f"✗ {count} point{'s' if plural else ''} of this study failed or {'were' if plural else 'was'} "
                     f"invalid and {'are' if plural else 'is'} not drawn (the caption names them)",
                     color="tab:red", fontsize=9)


def failed_marks(axes, xs: Sequence[float]) -> None:
    """Red crosses on the x-axis at the x values of points that failed, which have no y to draw."""
    if len(xs):
        axes.plot(list(xs), [0.02] * len(xs), transform=axes.get_xaxis_transform(), clip_on=False,
                  label=FAILED_LABEL, **FAILED_STYLE)


def missing_bar(axes, x: float, width: float) -> None:
    """A hatched, empty column over the whole height where a bar has no value, so a dropped bar is
    seen as dropped rather than as zero (its value label is the ✗)."""
    axes.add_patch(Rectangle((x - width / 2, 0), width, 1, transform=axes.get_xaxis_transform(), fill=False,
                             hatch="//", edgecolor="0.65", linewidth=0))


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
    needs: str | None = None,
) -> Figure:
    """One line per value of `series`: mean of `metric` vs `x`, with 95 % CI error bars; with fewer
    than two values of `x`, no line but `needs` (default: needs_text(xlabel)) in the axes and caption."""
    figure, axes = new_figure(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if needs_sweep(figure, axes, agg[x].tolist() if x in agg else [], needs or needs_text(xlabel), xformat):
        return figure
    groups = [(None, agg)] if series is None else list(agg.groupby(series, dropna=False, sort=True))
    label = label or (knob_label(series) if series else (lambda _v: metric))
    for value, group in groups:
        group = group.sort_values(x)
        means = group[f"{metric}_mean"] * scale
        halves = group.get(f"{metric}_ci95", pd.Series(np.nan, index=group.index)) * scale
        axes.errorbar(group[x], means, yerr=nonnegative_yerr(figure, means, halves), marker="o", capsize=3,
                      label=label(value))
    if log2x and not agg.empty:
        _log2_axis(axes, agg[x].tolist(), xformat)
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


def _overlap(boxes) -> bool:
    """Whether any two of the boxes (display extents) overlap."""
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def fit_x_labels(figure: Figure, axes) -> None:
    """Make the x tick labels of a category axis stand clear of one another: wrap long ones over
    more lines, narrower each try, and as a last resort slant them."""
    texts = [label.get_text() for label in axes.get_xticklabels()]
    for width in (None, 24, 16, 11):
        if width is not None:
            axes.set_xticks(axes.get_xticks(),
                            [t if "\n" in t else "\n".join(textwrap.wrap(t, width)) or t for t in texts])
        figure.draw_without_rendering()
        if not _overlap([label.get_window_extent() for label in axes.get_xticklabels() if label.get_text()]):
            return
    for label in axes.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")


def fit_value_labels(figure: Figure, axes, texts: Sequence) -> None:
    """Value labels on bars that would overlap are turned upright, and dropped if even that overlaps
    (the table beside the figure carries the numbers)."""
    figure.draw_without_rendering()
    if not _overlap([t.get_window_extent() for t in texts if t.get_text()]):
        return
    for text in texts:
        text.set_rotation(90)
        text.set_verticalalignment("bottom")
    figure.draw_without_rendering()
    if _overlap([t.get_window_extent() for t in texts if t.get_text()]):
        for text in texts:
            text.set_visible(False)
        add_note(figure, "Bar values are in the table; they did not fit on the bars.")


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
    threshold_label: str = "", failed_loads: Sequence[float] = (),
) -> Figure:
    """An interference metric vs background load; the uncapped load (inf) is labelled 'max'.

    `frame` has columns bg_load_pct, `y`, `series` and, for the error bars, either `y`_low and
    `y`_high (the bounds of the interval the findings state, e.g. Fieller's for a ratio) or
    `y`_ci95. A dashed line marks the no-interference value, a dotted one the guideline threshold
    when given. `failed_loads` (the loads asked for at points that failed or broke an invariant)
    are red crosses on the x-axis.
    """
    figure, axes = new_figure(title)
    failed_loads = [float(v) for v in failed_loads if not math.isnan(float(v))]
    positions = load_positions(frame["bg_load_pct"].dropna().tolist() + failed_loads)
    fieller: list[bool] = []  # per series drawn with Fieller bounds: whether any point had one
    for value, group in frame.groupby(series, sort=True):
        group = group.dropna(subset=["bg_load_pct"]).sort_values("bg_load_pct")
        if f"{y}_low" in group and f"{y}_high" in group:
            yerr = bounds_yerr(figure, group[y] * scale, group[f"{y}_low"] * scale, group[f"{y}_high"] * scale)
            fieller.append(np.isfinite(yerr).all(axis=0).any())
        else:
            halves = group.get(f"{y}_ci95", pd.Series(np.nan, index=group.index)) * scale
            yerr = nonnegative_yerr(figure, group[y] * scale, halves)
        axes.errorbar(group["bg_load_pct"].map(positions), group[y] * scale, yerr=yerr,
                      marker="o", capsize=3, label=str(value))
    if fieller:
        add_note(figure, FIELLER_NOTE if any(fieller) else NO_INTERVAL_NOTE)
    if any(100 < v < math.inf for v in positions):
        add_note(figure, OVER_SATURATION_NOTE)
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
    failed_marks(axes, sorted({positions[v] for v in failed_loads}))
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
    halves = [math.nan if e is None else e for e in errors]
    drawn = axes.bar(labels, values, yerr=nonnegative_yerr(figure, values, halves), capsize=4,
                     color=["tab:blue", "tab:orange", "tab:green", "tab:purple"][: len(labels)])
    texts = axes.bar_label(drawn, labels=[f"{v:.1f}" for v in values], padding=3)
    axes.margins(y=0.12)  # headroom: the value labels above the tallest bar stay under the title
    axes.set_ylabel(ylabel)
    axes.grid(True, axis="y", alpha=0.3)
    axes.grid(False, axis="x")
    fit_x_labels(figure, axes)
    fit_value_labels(figure, axes, texts)
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
