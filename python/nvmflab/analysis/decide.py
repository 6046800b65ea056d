"""The decision rules every study's findings use, on repeats, vectorised.

Every function here takes per-repeat samples as arrays whose last axis is the repeat (NaN for a
repeat that is missing), so a study passes one comparison (shape (n,)) and the A/A check
(`analysis/aa.py`, docs/analysis.md) passes thousands at once (shape (trials, n)) through the very
same code.

- `welch`: the difference of two means with Welch's 95 % interval and its two-sided p value.
  No interval (NaN) when a side has fewer than two repeats or its repeats are all equal: identical
  repeats mean the metric could not vary there (a copied or quantised value), not that it is known
  exactly, so they never make a difference "certain".
- `holm`: Holm's step-down correction over a family of p values (the last axis), for every finding
  that picks among several candidates or tests many cells: the family-wise error stays at 5 %.
- `fieller`: the 95 % interval of a ratio of two independent means (loaded / isolated), with the
  baseline's variance included; unbounded when the baseline's mean is not clearly above zero.
- `ratio_to_constant`: the 95 % interval of a mean over a known constant (a device's ceiling
  from its parameters): the t interval of the mean, scaled; nothing to add for the constant. With a
  `resolution` (how far a repeat can be off with no noise at all, e.g. a bandwidth counted in whole
  I/Os over a window), the interval is widened by it on each side, and equal repeats get it as their
  interval from MIN_TIED_REPEATS repeats on.
- `safe_upto`: the highest load up to which every load's ratio interval stays on the good side of
  a limit (an intersection-union test: each load is tested at 2.5 % one-sided, no correction
  needed for the family).
- `pick_shortest`: idle_poll_us's rule: candidates clearly better than the baseline (Holm), then
  the first of them that is not clearly worse than the best candidate.
- `fewest_not_below`: saturation's target_cores rule: the first configuration whose mean is not
  clearly below the best one's (Holm over the comparisons with the best).
- `pairwise`: every pair of several samples compared, Holm over the pairs (stacks: which side
  limits).
- `family_clear`: whether Holm over a family of p values rejects any (the interference cells, the
  completion leg's p99-then-peak rule, the control's p99 and IOPS).
- `detectable`: the smallest |difference of means| that Welch's test (at 5 % / family) would find
  with 80 % power at the observed spreads and repeat counts: what a "no clear difference" could
  have seen (docs/analysis.md, "Detectable effect").
- `pick_best`: the best configuration of several, only when it is clearly better than every other
  one (Holm over the k − 1 comparisons with it); −1 otherwise. Every "lowest"/"highest"/"best".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from . import student as _student_t

ALPHA = 0.05


def _arr(x) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    return a.reshape(1) if a.ndim == 0 else a


def summary(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, sample standard deviation, n) over the last axis, NaN repeats left out."""
    a = _arr(x)
    ok = ~np.isnan(a)
    n = ok.sum(axis=-1)
    total = np.where(ok, a, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
        dev = np.where(ok, a - mean[..., None], 0.0)
        var = np.where(n > 1, (dev ** 2).sum(axis=-1) / np.maximum(n - 1, 1), np.nan)
    return mean, np.sqrt(var), n


def welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b):
    """(diff = mean_b − mean_a, 95 % half-width, two-sided p, dof) from summaries, vectorised.

    Half-width, p and dof are NaN where a side has fewer than two repeats or zero spread."""
    ma, sa, na, mb, sb, nb = (np.asarray(v, dtype=float) for v in (mean_a, std_a, n_a, mean_b, std_b, n_b))
    diff = mb - ma
    with np.errstate(invalid="ignore", divide="ignore"):
        va, vb = sa ** 2 / na, sb ** 2 / nb
        formed = (na >= 2) & (nb >= 2) & (va > 0) & (vb > 0) & ~np.isnan(diff)
        se2 = va + vb
        dof = se2 ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
        dof = np.where(formed, np.maximum(dof, 1.0), np.nan)
        se = np.sqrt(se2)
        half = np.where(formed, _student_t.ppf(1 - ALPHA / 2, dof) * se, np.nan)
        p = np.where(formed, 2 * _student_t.sf(np.abs(diff) / se, dof), np.nan)
    return diff, half, p, dof


def welch(a, b):
    """welch_summary of two samples (last axis = repeats): difference mean(b) − mean(a)."""
    return welch_summary(*summary(a), *summary(b))


def clear(p) -> np.ndarray:
    """True where a p value exists and is below 5 % (one comparison, no family)."""
    p = np.asarray(p, dtype=float)
    return ~np.isnan(p) & (np.nan_to_num(p, nan=1.0) < ALPHA)


def holm(p, alpha: float = ALPHA) -> np.ndarray:
    """Holm's step-down rejections over the last axis. A NaN p (no interval) is never rejected and
    does not count in the family size."""
    p = _arr(p)
    formed = ~np.isnan(p)
    m = formed.sum(axis=-1, keepdims=True)
    filled = np.where(formed, p, np.inf)
    order = np.argsort(filled, axis=-1)
    ranked = np.take_along_axis(filled, order, axis=-1)
    k = np.arange(p.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        passes = ranked <= alpha / np.maximum(m - k, 1)
    # Step down: reject the i-th smallest only while every smaller one was rejected too.
    passes = np.cumprod(passes, axis=-1).astype(bool) & (k < m)
    out = np.zeros_like(passes)
    np.put_along_axis(out, order, passes, axis=-1)
    return out


def fieller_summary(mean_b, std_b, n_b, mean_l, std_l, n_l, confidence: float = 0.95):
    """(ratio, low, high) of mean_l / mean_b from summaries of two independent samples, with
    Fieller's interval (the baseline's variance included), vectorised. high is +inf (low −inf)
    where the baseline's mean is not clearly non-zero, so the interval is unbounded; low and high
    are NaN where either side has fewer than two repeats or zero spread."""
    mb, sb, nb, ml, sl, nl = (np.asarray(v, dtype=float) for v in (mean_b, std_b, n_b, mean_l, std_l, n_l))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = ml / mb
        vb, vl = sb ** 2 / nb, sl ** 2 / nl
        formed = (nb >= 2) & (nl >= 2) & (vb > 0) & (vl > 0) & np.isfinite(ratio)
        # Welch–Satterthwaite degrees of freedom of loaded − ratio × base.
        r2 = np.where(formed, ratio ** 2, 0.0)
        dof = (vl + r2 * vb) ** 2 / (vl ** 2 / (nl - 1) + r2 ** 2 * vb ** 2 / (nb - 1))
        t = _student_t.ppf(1 - (1 - confidence) / 2, np.where(formed, np.maximum(dof, 1.0), 1.0))
        denom = mb ** 2 - t ** 2 * vb
        bounded = denom > 0
        disc = np.maximum(ml ** 2 * vb + mb ** 2 * vl - t ** 2 * vl * vb, 0.0)
        root = t * np.sqrt(disc)
        low = np.where(bounded, (ml * mb - root) / denom, -np.inf)
        high = np.where(bounded, (ml * mb + root) / denom, np.inf)
    low = np.where(formed, low, np.nan)
    high = np.where(formed, high, np.nan)
    return ratio, low, high


def fieller(base, loaded, confidence: float = 0.95):
    """fieller_summary of two samples (repeats on the last axis): mean(loaded) / mean(base)."""
    return fieller_summary(*summary(base), *summary(loaded), confidence=confidence)


# Equal repeats with a known resolution get it as their interval only from this many on: two equal
# counts happen by chance too often when the noise is about one step (docs/analysis.md, "Ratio to a
# constant").
MIN_TIED_REPEATS = 3


def ratio_to_constant(x, constant, confidence: float = 0.95, resolution=0.0):
    """(ratio, low, high) of mean(x) / constant over the last axis, with the t interval of the mean
    scaled by the constant.

    `resolution` is how far a value of x can be off with no noise at all (a rate counted in whole
    I/Os over a window: at least one I/O per window; 0 or NaN: none known). A deterministic source
    (a model device's cap) makes that error the same in every repeat, so it does not average out:
    the interval is widened by it on each side. Where every repeat is equal, the t part is zero and
    the interval is the resolution alone, but only with at least MIN_TIED_REPEATS repeats. low and
    high are NaN with fewer than two repeats, with zero spread and no resolution (or too few repeats
    for it), or where the constant is not positive."""
    m, s, n = summary(x)
    c = np.asarray(constant, dtype=float)
    q = np.nan_to_num(np.asarray(resolution, dtype=float), nan=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = s > 1e-12 * np.abs(m)  # equal repeats whose mean rounded in the last bit have none
        tied = ~spread & (q > 0) & (n >= MIN_TIED_REPEATS)
        formed = (n >= 2) & (spread | tied) & (c > 0)
        t = _student_t.ppf(1 - (1 - confidence) / 2, np.maximum(n - 1, 1))
        noise = np.where(spread, t * s / np.sqrt(np.maximum(n, 1)), 0.0)
        half = np.where(formed, noise + np.maximum(q, 0.0), np.nan)
        ratio = np.where(c > 0, m / c, np.nan)
        return ratio, (m - half) / c, (m + half) / c


def safe_upto(bounds, limit: float, higher_is_worse: bool = True) -> np.ndarray:
    """Index of the last load (last axis, ordered by load) up to which every load's bound is on the
    safe side of `limit` (upper end below it, or lower end at least it when higher is better);
    −1 when the first load already fails. A NaN bound (no interval) is never safe."""
    b = _arr(bounds)
    with np.errstate(invalid="ignore"):
        ok = (b < limit) if higher_is_worse else (b >= limit)
    ok &= ~np.isnan(b)
    run = np.cumprod(ok, axis=-1).astype(bool)
    return run.sum(axis=-1) - 1


def pick_shortest_summary(base, candidates, lower_is_better: bool = True) -> np.ndarray:
    """idle_poll_us's rule on summaries: `base` = (mean, std, n) arrays of shape (...), `candidates`
    = (mean, std, n) arrays of shape (..., k), the candidate axis ordered from the cheapest. Index
    of the chosen candidate, −1 for none. The candidates are those Holm finds clearly better than
    the base; of them, the first that is not clearly worse than the best of them (Holm again)."""
    bm, bs, bn = (np.asarray(v, dtype=float)[..., None] for v in base)
    cm, cs, cn = (np.asarray(v, dtype=float) for v in candidates)
    diff, _, p, _ = welch_summary(bm, bs, bn, cm, cs, cn)  # candidate − base
    better = holm(p) & ((diff < 0) if lower_is_better else (diff > 0))
    sign = 1.0 if lower_is_better else -1.0
    top = np.argmin(np.where(better, sign * cm, np.inf), axis=-1)[..., None]
    tm, ts, tn = (np.take_along_axis(v, top, axis=-1) for v in (cm, cs, cn))
    diff, _, p, _ = welch_summary(tm, ts, tn, cm, cs, cn)  # candidate − best
    others = better & (np.arange(cm.shape[-1]) != top)
    worse = holm(np.where(others, p, np.nan)) & ((diff > 0) if lower_is_better else (diff < 0))
    eligible = better & ~worse
    return np.where(eligible.any(axis=-1), np.argmax(eligible, axis=-1), -1)


def pick_shortest(base, candidates, lower_is_better: bool = True) -> np.ndarray:
    """pick_shortest_summary on samples: `base` (..., n), `candidates` (..., k, n)."""
    c = summary(candidates)
    return pick_shortest_summary(summary(base), c, lower_is_better)


def fewest_not_below_summary(configs, higher_is_better: bool = True) -> np.ndarray:
    """saturation's target_cores rule on summaries ((mean, std, n) arrays, configurations on the
    last axis ordered from the cheapest): index of the first configuration whose mean is not
    clearly worse than the best one's, Holm over the comparisons with the best."""
    m, s, n = (np.asarray(v, dtype=float) for v in configs)
    filled = np.where(np.isnan(m), -np.inf if higher_is_better else np.inf, m)
    top = (np.argmax(filled, axis=-1) if higher_is_better else np.argmin(filled, axis=-1))[..., None]
    tm, ts, tn = (np.take_along_axis(v, top, axis=-1) for v in (m, s, n))
    diff, _, p, _ = welch_summary(tm, ts, tn, m, s, n)  # configuration − best
    p = np.where(np.arange(m.shape[-1]) == top, np.nan, p)
    worse = holm(p) & ((diff < 0) if higher_is_better else (diff > 0))
    return np.argmax(~worse, axis=-1)


def fewest_not_below(samples, higher_is_better: bool = True) -> np.ndarray:
    """fewest_not_below_summary on samples (configurations on axis −2, repeats on the last)."""
    return fewest_not_below_summary(summary(samples), higher_is_better)


def pairwise(samples) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Every pair (i < j) of the configurations on axis −2: (diff = mean_j − mean_i, half, p,
    clear after Holm over the pairs, the pairs)."""
    s = _arr(samples)
    pairs = [(i, j) for i in range(s.shape[-2]) for j in range(i + 1, s.shape[-2])]
    if not pairs:
        empty = np.zeros(s.shape[:-2] + (0,))
        return empty, empty, empty, empty.astype(bool), pairs
    a = s[..., [i for i, _ in pairs], :]
    b = s[..., [j for _, j in pairs], :]
    diff, half, p, _ = welch(a, b)
    return diff, half, p, holm(p), pairs


def family_clear(p) -> np.ndarray:
    """True where Holm over the family (last axis) rejects at least one hypothesis."""
    return holm(p).any(axis=-1)


def detectable_summary(std_a, n_a, std_b, n_b, power: float = 0.8, family=1) -> np.ndarray:
    """The smallest |mean_b − mean_a| that a two-sided Welch test at ALPHA / family detects with
    probability `power`, at these spreads and repeat counts, vectorised:
    (t_{1 − α/(2·family), dof} + t_{power, dof}) · se, with Welch–Satterthwaite's dof and
    se = sqrt(s_a²/n_a + s_b²/n_b) (the usual normal-shift approximation with t quantiles).
    NaN where no interval can be formed (fewer than two repeats or zero spread on a side)."""
    sa, na, sb, nb, fam = (np.asarray(v, dtype=float) for v in (std_a, n_a, std_b, n_b, family))
    with np.errstate(invalid="ignore", divide="ignore"):
        va, vb = sa ** 2 / na, sb ** 2 / nb
        formed = (na >= 2) & (nb >= 2) & (va > 0) & (vb > 0) & (fam >= 1)
        se2 = va + vb
        dof = se2 ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
        dof = np.where(formed, np.maximum(dof, 1.0), 1.0)
        fam = np.where(formed, fam, 1.0)
        quantiles = _student_t.ppf(1 - ALPHA / (2 * fam), dof) + _student_t.ppf(power, dof)
        return np.where(formed, quantiles * np.sqrt(se2), np.nan)


def detectable(a, b, power: float = 0.8, family=1) -> np.ndarray:
    """detectable_summary of two samples (repeats on the last axis)."""
    _, sa, na = summary(a)
    _, sb, nb = summary(b)
    return detectable_summary(sa, na, sb, nb, power=power, family=family)


def pick_best_summary(configs, higher_is_better: bool = True) -> np.ndarray:
    """The index of the configuration with the best mean ((mean, std, n) arrays, configurations on
    the last axis) when Welch finds it clearly better than every other measured one, Holm over the
    k − 1 comparisons with it; −1 when it is not (or nothing was measured). A configuration without
    a mean (not measured) takes no part; one without an interval can never be beaten clearly, so
    its presence makes the pick −1 unless it is itself the best and the rest are beaten."""
    m, s, n = (np.asarray(v, dtype=float) for v in configs)
    if m.ndim == 0:
        m, s, n = m.reshape(1), s.reshape(1), n.reshape(1)
    measured = ~np.isnan(m)
    filled = np.where(measured, m, -np.inf if higher_is_better else np.inf)
    top = (np.argmax(filled, axis=-1) if higher_is_better else np.argmin(filled, axis=-1))[..., None]
    tm, ts, tn = (np.take_along_axis(v, top, axis=-1) for v in (m, s, n))
    diff, _, p, _ = welch_summary(tm, ts, tn, m, s, n)  # configuration − best
    others = measured & (np.arange(m.shape[-1]) != top)
    rejected = holm(np.where(others, p, np.nan)) & ((diff < 0) if higher_is_better else (diff > 0))
    beaten = np.where(others, rejected, True).all(axis=-1)
    return np.where(measured.any(axis=-1) & beaten, top[..., 0], -1)


def pick_best(samples, higher_is_better: bool = True) -> np.ndarray:
    """pick_best_summary on samples (configurations on axis −2, repeats on the last)."""
    return pick_best_summary(summary(samples), higher_is_better)


def values(xs: Sequence[float]) -> list[float]:
    """Finite floats of a sequence (None and NaN left out)."""
    out = []
    for v in xs:
        if v is None:
            continue
        f = float(v)
        if not math.isnan(f):
            out.append(f)
    return out
