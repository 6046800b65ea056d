"""Medians over clean runs, ratios of medians, and the run-to-run range: pure functions on run
records (dicts), no I/O.

A run record holds what one load-generator run measured plus its noise verdict from
nvmflab.sysstat: {"target", "host", "work", "round", "iops", "bw_bytes", "lat_mean_ns",
"lat_p99_99_ns", "histogram", "noise_pct", "noisy", "error"}. A run with an "error" measured nothing.

p99.99 is taken over every sample of the clean runs together (their latency histograms merged),
not as a median of per-run values: a 4 s run at QD1 has only about 36 samples above its p99.99,
so a median of those throws most of the tail away and swings from bench to bench.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

from nvmflab.analysis.decide import ratio_to_constant
from nvmflab.metrics import histogram_percentile, merge_histograms

METRICS = ("iops", "bw_bytes", "lat_mean_ns", "lat_p99_99_ns")


def usable(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs that measured something (no error)."""
    return [r for r in runs if not r.get("error")]


def pick_clean(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The runs a median should use, and a note saying what was left out.

    Noisy runs are left out; when every run was noisy the median takes them all rather than
    nothing, and the note says so (the number is then the machine's, not only the stack's)."""
    ok = usable(runs)
    if not ok:
        return [], "no run finished"
    clean = [r for r in ok if not r.get("noisy")]
    noisy = len(ok) - len(clean)
    if not noisy:
        return ok, ""
    if clean:
        return clean, f"{noisy} of {len(ok)} runs noisy, left out"
    return ok, f"all {len(ok)} runs noisy: median over noisy runs"


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def pooled_percentile(runs: list[dict[str, Any]], pct: float) -> float | None:
    """The pct percentile over all samples of `runs` (histograms [[value_ns, count], ...]
    merged); None unless every run brought a histogram."""
    if not runs or any(not r.get("histogram") for r in runs):
        return None
    merged = merge_histograms(r["histogram"] for r in runs)
    return histogram_percentile(merged, pct) if merged else None


def cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (target, host, work) cell: medians over the clean runs (p99.99 over their samples
    together where they carry histograms), the per-run range, counts."""
    chosen, note = pick_clean(runs)
    out: dict[str, Any] = {"runs": len(runs), "used": len(chosen), "note": note,
                           "noisy": sum(1 for r in usable(runs) if r.get("noisy"))}
    for key in METRICS:
        out[key] = median_of(chosen, key)
        values = [float(r[key]) for r in chosen if r.get(key) is not None]
        out[f"{key}_range"] = [min(values), max(values)] if values else None
    pooled = pooled_percentile(chosen, 99.99)
    out["lat_p99_99_pooled"] = pooled is not None
    if pooled is not None:
        out["lat_p99_99_ns"] = pooled
    return out


def ratio(subject: float | None, baseline: float | None) -> float | None:
    """subject / baseline, None when either is missing or the baseline is not positive."""
    if subject is None or baseline is None or baseline <= 0:
        return None
    return subject / baseline


def group(runs: Iterable[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def by_round(runs: list[dict[str, Any]], pair: tuple[str, str], work: str, key: str) -> dict[Any, float]:
    """round -> `key` of the pair's clean run on `work` (failed and noisy runs left out)."""
    return {r["round"]: float(r[key]) for r in usable(runs)
            if (r["target"], r["host"]) == pair and r["work"] == work and not r.get("noisy")
            and r.get(key) is not None and "round" in r}


def cells(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(target, host, work) -> cell()."""
    return {k: cell(v) for k, v in group(runs, ("target", "host", "work")).items()}


# (name, subject pair, baseline pair): pairs are (target stack, host stack). What each says:
COMPARISONS = (
    ("ours x ours / SPDK x SPDK", ("ours", "ours"), ("spdk", "spdk")),
    ("our target / SPDK target, under spdk_nvme_perf", ("ours", "spdk"), ("spdk", "spdk")),
    ("our target / SPDK target, under nvmf-perf", ("ours", "ours"), ("spdk", "ours")),
    ("nvmf-perf / spdk_nvme_perf, on SPDK's target", ("spdk", "ours"), ("spdk", "spdk")),
    ("nvmf-perf / spdk_nvme_perf, on our target", ("ours", "ours"), ("ours", "spdk")),
    # SPDK-spec: SPDK's target sending C2HData SUCCESS only as the specification allows, as ours does.
    ("ours x ours / SPDK-spec x SPDK", ("ours", "ours"), ("spdk-spec", "spdk")),
    ("our target / SPDK-spec target, under spdk_nvme_perf", ("ours", "spdk"), ("spdk-spec", "spdk")),
    ("SPDK-spec target / SPDK target, under spdk_nvme_perf", ("spdk-spec", "spdk"), ("spdk", "spdk")),
    # TLS rows (issue 20 item 5): what TLS costs each stack, and the stacks against each other with TLS.
    ("ours x ours TLS / ours x ours plain", ("ours-tls", "ours-tls"), ("ours", "ours")),
    ("SPDK x SPDK TLS / SPDK x SPDK plain", ("spdk-tls", "spdk-tls"), ("spdk", "spdk")),
    ("ours x ours TLS / SPDK x SPDK TLS", ("ours-tls", "ours-tls"), ("spdk-tls", "spdk-tls")),
    ("our TLS target / SPDK TLS target, under spdk_nvme_perf TLS", ("ours-tls", "spdk-tls"), ("spdk-tls", "spdk-tls")),
    ("nvmf-perf TLS / spdk_nvme_perf TLS, on SPDK's TLS target", ("spdk-tls", "ours-tls"), ("spdk-tls", "spdk-tls")),
)


def comparison_rows(table: dict[tuple[str, str, str], dict[str, Any]], works: list[str]) -> list[dict[str, Any]]:
    """Ratios of medians, subject / baseline, per comparison and workload. For latency a ratio
    below 1 is better for the subject; for IOPS and bandwidth above 1 is."""
    rows = []
    for name, subject, baseline in COMPARISONS:
        for work in works:
            s, b = table.get((*subject, work)), table.get((*baseline, work))
            if s is None or b is None:
                continue
            row: dict[str, Any] = {"comparison": name, "work": work}
            for key in METRICS:
                row[f"{key}_ratio"] = _round(ratio(s[key], b[key]))
            notes = [n for n in (s["note"], b["note"]) if n]
            row["note"] = "; ".join(notes)
            rows.append(row)
    return rows


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def paired_ratio_interval(ratios: list[float]) -> tuple[float, float, float] | None:
    """The geometric mean of paired ratios (each round's subject / baseline) and its 95 % t
    interval, taken on their logarithms so that one stalled round's 6x does not outweigh many
    0.9x. None with fewer than two ratios, a ratio that is not positive, or no spread at all."""
    if len(ratios) < 2 or any(not r > 0 for r in ratios):
        return None
    mean, low, high = (float(v) for v in ratio_to_constant([math.log(r) for r in ratios], 1.0))
    if math.isnan(low):
        return None
    return math.exp(mean), math.exp(low), math.exp(high)
