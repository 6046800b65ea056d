"""The overhead study's B-app against an SSD-like device (thesis fig. 5.3's convergence).

The thesis saw NVMe/TCP's bandwidth gap to local NVMe close at 64 KiB, "because the SSD was
saturated". The study's `device` option serves our target's model backend (legs `device_loopback`,
`device_netns`), measured in the same rounds as the local leg. The local leg cannot reach the model
(it lives in the target), so local access to that device is taken as the lower of the local path
measured on the file and the device's ceiling (`device_model.DeviceModel.ceiling`, at the deepest
queue tried), per block size:

- where the local path is clearly above the ceiling (its t interval over the ceiling starts at 1 or
  more), local access would be device-bound, and NVMe/TCP is compared with the ceiling
  (`decide.ratio_to_constant`);
- elsewhere NVMe/TCP is compared with the local path itself (`decide.fieller`).

A block size is "converged" when the ratio's 95 % interval starts at CONVERGED_SHARE or above; the
gap converges from the smallest size from which every larger size is converged (`decide.safe_upto`
read from the largest size down: an intersection-union test, no correction needed).

A bandwidth is counted in whole I/Os issued in the measured window, so a path held exactly to the
model's link repeats the same count every time. Without any noise that count can still miss the
device's rate by one I/O (the count's step) plus the commands in flight at the window's two ends
(`count_resolution`). The ratio to the ceiling is judged with that resolution
(`ratio_to_constant`'s `resolution`): the interval is widened by it on each side, and three or more
equal repeats are known to it rather than "no interval".
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .. import plots
from .common import leg_rows, missing_leg, repeat_values
from .decide import fieller, ratio_to_constant, safe_upto
from ..findings_data import Finding
from .device_model import CONVERGED_SHARE, DeviceModel
from .result import Figure, StudyResult, Table
from .stats import aggregate, ci95_halfwidth
from .text import mbps, size

DEVICE_LEGS = ("device_loopback", "device_netns")
THESIS_BS = 64 << 10  # fig. 5.3: similar bandwidth from 64 KiB on


def _best(rows: pd.DataFrame) -> tuple[dict[float, list[float]], dict[float, float]]:
    """({bs: per-repeat bandwidth at the queue depth with the highest mean bandwidth for that size},
    {bs: those values' resolution, `count_resolution`})."""
    if rows.empty:
        return {}, {}
    agg = aggregate(rows, by=["bs", "iodepth"], metrics=["bw_bytes"])
    values, resolution = {}, {}
    for bs, group in agg.groupby("bs"):
        qd = group.loc[group["bw_bytes_mean"].idxmax(), "iodepth"]
        best = rows[(rows["bs"] == bs) & (rows["iodepth"] == qd)]
        values[float(bs)] = repeat_values(best, "bw_bytes")
        resolution[float(bs)] = count_resolution(best)
    return values, resolution


def count_resolution(rows: pd.DataFrame) -> float:
    """Bytes per second by which a bandwidth counted over these rows' shortest window can miss the
    device's rate with no noise at all: nvmf-perf (and fio) count the I/Os issued in the window
    (`runtime_ms`), which differ from the device's completions in it by one I/O (the count's step)
    plus the commands in flight at the window's start and end (at most iodepth × numjobs). NaN
    without a window or a queue depth."""
    if rows.empty or not {"runtime_ms", "iodepth", "bs"} <= set(rows):
        return math.nan
    window_ms = pd.to_numeric(rows["runtime_ms"], errors="coerce")
    window_ms = window_ms[window_ms > 0]
    depth = pd.to_numeric(rows["iodepth"], errors="coerce")
    jobs = pd.to_numeric(rows["numjobs"], errors="coerce").fillna(1) if "numjobs" in rows else 1
    in_flight = float((depth * jobs).max())
    if window_ms.empty or math.isnan(in_flight):
        return math.nan
    return (1 + in_flight) * float(pd.to_numeric(rows["bs"]).max()) * 1000.0 / float(window_ms.min())


def compare_sizes(remote: dict[float, list[float]], local: dict[float, list[float]],
                  ceiling: dict[float, float], remote_resolution: dict[float, float] | None = None,
                  local_resolution: dict[float, float] | None = None) -> pd.DataFrame:
    """Per block size (ascending): the reference NVMe/TCP is compared with ('device' or 'local'),
    the ratio and its 95 % interval, whether that interval is the resolution alone (`tied`: every
    repeat equal), and whether that size is converged. The resolutions ({bs: bytes per second,
    `count_resolution`}; a size left out: unknown) apply to the ratios to the ceiling."""
    remote_resolution, local_resolution = remote_resolution or {}, local_resolution or {}
    records = []
    for bs in sorted(remote):
        r, c, loc = remote[bs], ceiling[bs], local.get(bs, [])
        local_step = local_resolution.get(bs, math.nan)
        local_low = _one(ratio_to_constant(loc, c, resolution=local_step))[1] if len(loc) else math.nan
        if not len(loc) or local_low >= 1:
            reference = "device"
            ratio, low, high = _one(ratio_to_constant(r, c, resolution=remote_resolution.get(bs, math.nan)))
        else:  # the local path is not clearly above the device: it is local access's own bound
            reference = "local"
            ratio, low, high = _one(fieller(loc, r))
        tied = reference == "device" and not math.isnan(low) and len(set(r)) == 1
        records.append({"bs": bs, "reference": reference, "ratio": float(ratio), "low": float(low),
                        "high": float(high), "tied": tied, "remote": float(np.mean(r)) if r else math.nan,
                        "local": float(np.mean(loc)) if len(loc) else math.nan, "ceiling": c})
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    frame["converged"] = frame["low"] >= CONVERGED_SHARE
    run = int(np.asarray(safe_upto(frame["low"].to_numpy()[::-1], CONVERGED_SHARE, higher_is_worse=False)).item()) + 1
    frame["in_run"] = [i >= len(frame) - run for i in range(len(frame))]
    return frame


def _one(values) -> tuple[float, ...]:
    """The decision functions' vectorised results for one comparison, as floats."""
    return tuple(float(np.asarray(v).item()) for v in values)


def _decimals(low: float, high: float, least: int = 2) -> int:
    """Enough decimals to keep an interval's two ends apart (a count's resolution can be 0.001 wide)."""
    width = high - low
    return max(least, 2 if width >= 0.02 else 3 if width >= 0.002 else 4)


def _interval(row: pd.Series) -> str:
    if math.isnan(row["low"]):
        return f"ratio {row['ratio']:.2f}, no interval: fewer than two repeats or no spread"
    d = _decimals(row["low"], row["high"])
    span = f"95 % interval {row['low']:.{d}f} to {row['high']:.{d}f}"
    if row.get("tied", False):
        return (f"ratio {row['ratio']:.{d}f}, every repeat the same count, so {span} (the count's resolution "
                "either side: one I/O and the commands in flight at the window's ends)")
    return f"ratio {row['ratio']:.{d}f}, {span}"


def _reference(row: pd.Series) -> str:
    if row["reference"] == "local":
        return "the local path (it stays below the device there)"
    if math.isnan(row["local"]):
        return "the device's ceiling (no local path was measured to bound it)"
    return "the device's ceiling (local access is device-bound there)"


def verdict(frame: pd.DataFrame, remote_name: str) -> str:
    """The convergence finding: from which block size NVMe/TCP reaches local access on the device,
    that the gap does not close, or that the intervals cannot decide."""
    share = f"{CONVERGED_SHARE * 100:.0f} %"
    thesis = f"the thesis saw the gap close at {size(THESIS_BS)} on its SSD (fig. 5.3)"
    largest = frame.iloc[-1]
    if frame["in_run"].any():
        first = frame[frame["in_run"]].iloc[0]
        below = frame[~frame["in_run"]]
        text = (f"B-app against the device: NVMe/TCP ({remote_name}) reaches at least {share} of local access's "
                f"bandwidth from {size(first['bs'])} on ({_interval(first)} against {_reference(first)}"
                f"{'; the interval includes 1' if first['high'] >= 1 else ''})")
        if not below.empty:
            prev = below.iloc[-1]
            state = ("clearly below" if prev["high"] < CONVERGED_SHARE else "not decided")
            text += f"; at {size(prev['bs'])} it is {state} ({_interval(prev)})"
        else:
            text += "; already at the smallest size tried, so the device limits every size here"
        return text + f"; {thesis}."
    # "cannot decide (why)": the report's summary quotes the reason in the parentheses.
    if math.isnan(largest["low"]):
        return (f"B-app against the device: where NVMe/TCP ({remote_name}) converges with local access, "
                "cannot decide "
                f"(the largest size, {size(largest['bs'])}, has {_interval(largest)}); {thesis}.")
    if largest["high"] < CONVERGED_SHARE:
        return (f"B-app against the device: the gap does not close up to {size(largest['bs'])}: NVMe/TCP "
                f"({remote_name}) stays below {share} of local access there ({_interval(largest)} against "
                f"{_reference(largest)}), so NVMe/TCP, not the device, limits every size tried; {thesis}.")
    return (f"B-app against the device: whether NVMe/TCP ({remote_name}) converges with local access, cannot decide "
            f"(at the largest size, {size(largest['bs'])}, the interval reaches both sides of {share}: "
            f"{_interval(largest)}); {thesis}.")


def device_section(rows: pd.DataFrame, local: pd.DataFrame, out: StudyResult) -> None:
    """Figure, table and findings of the device comparison; nothing when no device leg was asked."""
    asked = [leg for leg in DEVICE_LEGS if not rows.empty and (rows["leg"] == leg).any()]
    if not asked:
        return
    parts = {leg: leg_rows(rows, leg, "main") for leg in asked}
    present = [leg for leg in asked if not parts[leg].empty]
    for leg in (leg for leg in asked if leg not in present):
        out.findings.append(missing_leg(rows, leg, "the B-app against the device model has no "
                                        f"{leg.removeprefix('device_')} numbers"))
    if not present:
        return
    leg = "device_netns" if "device_netns" in present else "device_loopback"
    remote_rows = parts[leg]
    knobs = json.loads(remote_rows["knobs_json"].iloc[0] or "{}")
    model = DeviceModel.parse(knobs.get("backend_model"))
    deepest = float(remote_rows["iodepth"].max())
    remote, remote_step = _best(remote_rows)
    local_best, local_step = _best(local)
    ceiling = {bs: model.ceiling(bs, deepest) for bs in remote}
    frame = compare_sizes(remote, local_best, ceiling, remote_step, local_step)
    remote_name = leg.removeprefix("device_")
    lines = [("device ceiling", bs, ceiling[bs], math.nan) for bs in remote]
    lines += [(f"NVMe/TCP {remote_name} on the device", bs, np.mean(v), ci95_halfwidth(v))
              for bs, v in remote.items()]
    lines += [("local path (file, no device)", bs, np.mean(v), ci95_halfwidth(v))
              for bs, v in local_best.items() if bs in remote]
    figure_rows = pd.DataFrame(lines, columns=["series", "bs", "bw_bytes_mean", "bw_bytes_ci95"])
    out.figures.append(Figure(
        "overhead_device_bandwidth_vs_bs",
        plots.bandwidth_vs_bs(figure_rows, "series", "B-app against a device model: best bandwidth per block size",
                              label=str),
        f"The model device ({model.text()}): its ceiling at QD{deepest:g}, NVMe/TCP ({remote_name}) serving it, "
        "and the local path measured on the file in the same rounds (thesis fig. 5.3's convergence, against a device)."))
    table = pd.DataFrame({
        "bs": [size(b) for b in frame["bs"]],
        "device ceiling MB/s": (frame["ceiling"] / 1e6).round(1),
        "ceiling set by": [model.limit(b, deepest) for b in frame["bs"]],
        "local path MB/s": (frame["local"] / 1e6).round(1),
        f"NVMe/TCP {remote_name} MB/s": (frame["remote"] / 1e6).round(1),
        "compared with": frame["reference"],
        "ratio": frame["ratio"].round(3),
        "95 % interval": [("n/a" if math.isnan(lo) else "{0:.{2}f} to {1:.{2}f}".format(lo, hi, _decimals(lo, hi, 3)))
                          for lo, hi in zip(frame["low"], frame["high"])],
        f"converged (≥ {CONVERGED_SHARE:g})": frame["in_run"],
    })
    out.tables.append(Table(
        "B-app against the device model", table,
        f"Device: our target's model backend, {model.text()}. Local access to it is the lower of the local path and "
        "the ceiling: where the local path's interval is above the ceiling, NVMe/TCP is compared with the ceiling "
        "(t interval widened by the count's resolution, one I/O and the commands in flight at the window's ends; "
        "equal repeats: that resolution alone), "
        "elsewhere with the local path (Fieller). Converged: this size and every larger one have the "
        f"ratio's lower end at {CONVERGED_SHARE:g} or above."))
    text = verdict(frame, remote_name)
    # converged or "does not close" were decided by the ratio intervals: the summary lists them
    out.findings.append(Finding(text, "overhead", decided="cannot decide" not in text))
    if frame["reference"].eq("local").any():
        sizes = ", ".join(size(b) for b in frame.loc[frame["reference"] == "local", "bs"])
        # decided by the local path's interval against the ceiling (the reference column)
        out.findings.append(Finding(f"B-app against the device: the local path ({mbps(frame['local'].min())} at its "
                                    f"lowest) was not clearly faster than the device at {sizes}, so there NVMe/TCP is "
                                    "compared with the local path, which would bound local access to the device too.",
                                    "overhead", decided=True))
