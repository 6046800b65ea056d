"""Number formatting shared by findings and tables, so every page speaks the same units."""

from __future__ import annotations

import math


def us(ns: float) -> str:
    """Nanoseconds as microseconds with one decimal, e.g. '115.6 µs'."""
    return "n/a" if ns is None or math.isnan(ns) else f"{ns / 1e3:.1f} µs"


def kiops(iops: float) -> str:
    return "n/a" if iops is None or math.isnan(iops) else f"{iops / 1e3:.1f} KIOPS"


def mbps(bytes_per_s: float) -> str:
    return "n/a" if bytes_per_s is None or math.isnan(bytes_per_s) else f"{bytes_per_s / 1e6:.0f} MB/s"


def pct(value: float, signed: bool = True) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def times(ratio: float) -> str:
    return "n/a" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}×"


def changed(what: str, change: float) -> str:
    """'lowered the p99 by 9.1 %' / 'raised …' / 'left … unchanged' for a relative change in %."""
    if change is None or math.isnan(change):
        return f"could not compare {what} (missing data)"
    if abs(change) < 0.05:
        return f"left {what} unchanged"
    verb = "lowered" if change < 0 else "raised"
    return f"{verb} {what} by {abs(change):.1f} %"


def size(bs: float) -> str:
    """Block size in bytes as fio writes it: 4k, 128k, 1m."""
    bs = int(bs)
    if bs >= 1 << 20 and bs % (1 << 20) == 0:
        return f"{bs >> 20}m"
    if bs >= 1 << 10 and bs % (1 << 10) == 0:
        return f"{bs >> 10}k"
    return str(bs)
