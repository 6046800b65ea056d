"""The A/A check of the decision rules (issue 22, items 1 and 3): each rule fed repeats from one
distribution declares a difference in at most 5 % of the trials, finds large effects, and the rates
docs/analysis.md gives are the ones `python -m nvmflab.analysis.aa` measures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from nvmflab.analysis import aa, decide, polling
from nvmflab.analysis.common import compare, compare_values, corrected
from nvmflab.analysis.stats import diff_interval

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"


@pytest.fixture(scope="module")
def measured():
    return aa.rates()


def _binomial_slack(trials: int, rate: float = 0.05) -> float:
    """Two standard errors of a measured share at `rate` over `trials` (Monte Carlo noise)."""
    return 2 * math.sqrt(rate * (1 - rate) / trials)


def test_the_check_covers_the_spec_repeat_counts_with_enough_trials():
    assert aa.TRIALS >= 1000
    assert {1, 2, 3, 10} <= set(aa.REPEATS)  # quick (1; stacks 2) and full (auto: 3 to 10)
    assert set(aa.EFFECTS) == {1, 2, 4} and set(aa.DISTRIBUTIONS) == {"normal", "log-normal", "outliers"}


def test_no_rule_declares_a_difference_in_more_than_5_percent_of_aa_trials(measured):
    # A rule at level 5 % declares about 5 % under A/A by design (the Welch test with normal
    # repeats is exact), so a single cell may land a Monte Carlo hair above 5.0 %: each cell must be
    # within two standard errors of it, and every rule's rate pooled over the three distributions
    # (3 × TRIALS trials) must be at most 5 %.
    slack = _binomial_slack(aa.TRIALS)
    for rule in aa.RULES:
        for n in aa.REPEATS:
            cells = [measured[(rule.name, d, n, 0)] for d in aa.DISTRIBUTIONS]
            assert max(cells) <= 0.05 + slack, (rule.name, n, cells)
            assert sum(cells) / len(cells) <= 0.05, (rule.name, n, cells)
            if n == 1:  # one repeat: no interval, so no rule decides anything
                assert max(cells) == 0.0


def test_detection_grows_with_the_effect_and_the_repeats(measured):
    for rule in aa.RULES:
        for dist in aa.DISTRIBUTIONS:
            at10 = [measured[(rule.name, dist, 10, k)] for k in aa.EFFECTS]
            assert at10[-1] >= 0.95, (rule.name, dist, at10)  # 4 sd with 10 repeats is found
            assert at10[0] < at10[1] <= at10[2] + 0.01, (rule.name, dist, at10)
            by_n = [measured[(rule.name, dist, n, 2)] for n in aa.REPEATS]
            assert by_n[0] == 0.0 and by_n[-1] > by_n[1], (rule.name, dist, by_n)


def test_the_documented_rates_are_the_measured_ones(measured):
    doc = DOC.read_text()
    assert aa.BEGIN in doc and aa.END in doc
    assert aa.embedded(doc) == aa.table(measured).strip(), \
        "docs/analysis.md is stale: run `python -m nvmflab.analysis.aa --write docs/analysis.md`"


# -- the rules themselves ------------------------------------------------------------------------

def test_welch_matches_scipy_and_zero_spread_is_no_interval():
    rng = np.random.default_rng(1)
    a, b = rng.normal(100, 10, (20, 4)), rng.normal(105, 20, (20, 3))
    _, half, p, _ = decide.welch(a, b)
    for i in range(20):
        ref = sps.ttest_ind(b[i], a[i], equal_var=False)
        assert p[i] == pytest.approx(ref.pvalue, rel=1e-9)
        low, high = ref.confidence_interval(0.95)
        assert half[i] == pytest.approx((high - low) / 2, rel=1e-9)
    # identical repeats on either side: no interval, never a clear difference
    for same in ([5.0, 5.0, 5.0], [5.0, 5.0]):
        diff, half, p, _ = decide.welch(same, [7.0, 8.0, 9.0])
        assert math.isnan(float(half)) and math.isnan(float(p)) and not decide.clear(p)
    assert math.isnan(diff_interval(5.0, 0.0, 3, 9.0, 0.0, 3)[1])
    d = compare_values([5.0, 5.0, 5.0], [9.0, 9.0, 9.0])
    assert not d.decidable and not d.clear and "without spread" in d.interval(lambda v: f"{v:g}")


def test_holm_steps_down_and_ignores_missing_tests():
    p = np.array([[0.01, 0.04, 0.03], [0.001, 0.5, 0.0125], [np.nan, 0.02, 0.3], [0.2, 0.3, 0.4]])
    # row 0: 0.01 ≤ 0.05/3, 0.03 > 0.05/2 stops; row 1: 0.001 and 0.0125 ≤ 0.05/2; row 2: m = 2
    assert decide.holm(p).tolist() == [[True, False, False], [True, False, True], [False, True, False],
                                      [False, False, False]]
    diffs = corrected([compare_values([1.0, 1.1, 0.9], [2.0, 2.1, 1.9]),
                       compare_values([1.0, 1.1, 0.9], [1.25, 1.3, 1.2])] +
                      [compare_values([1.0, 1.1, 0.9], [1.0, 1.1, 0.9])] * 8)
    raw = compare_values([1.0, 1.1, 0.9], [1.25, 1.3, 1.2])
    assert raw.clear and 0.05 > raw.p > 0.05 / 9  # clear alone, but not against 0.05 / 9 after the first
    assert diffs[0].clear and not diffs[1].clear and diffs[1].lost_to_holm
    assert "excludes zero alone, not after Holm over 10 comparisons" in diffs[1].interval(lambda v: f"{v:g}")


def test_fieller_includes_the_baseline_variance_and_is_unbounded_when_it_is_unsure():
    rng = np.random.default_rng(2)
    base, loaded = rng.normal(100, 1, 4000), rng.normal(200, 1, 4000)
    ratio, low, high = decide.fieller(base, loaded)
    # with tight, large samples Fieller's interval meets the delta method's
    se = ratio * math.sqrt(loaded.var(ddof=1) / loaded.size / loaded.mean() ** 2
                           + base.var(ddof=1) / base.size / base.mean() ** 2)
    assert (high - low) / 2 == pytest.approx(1.96 * se, rel=0.01)
    # the baseline's spread widens the interval even when the loaded side is the same
    _, lo1, hi1 = decide.fieller([99.0, 100.0, 101.0], [199.0, 200.0, 201.0])
    _, lo2, hi2 = decide.fieller([90.0, 100.0, 110.0], [199.0, 200.0, 201.0])
    assert hi2 - lo2 > 5 * (hi1 - lo1)
    # a baseline whose mean is not clearly above zero: unbounded, so no load can be safe
    _, low, high = decide.fieller([-1.0, 1.0, 3.0], [10.0, 11.0, 12.0])
    assert math.isinf(high) and decide.safe_upto([high], 2.0) == -1
    # identical repeats: no interval, not certainty
    assert all(math.isnan(v) for v in decide.fieller([100.0] * 3, [200.0] * 3)[1:])


def test_a_ratio_to_a_constant_is_judged_by_the_resolution_it_was_counted_in():
    # equal repeats: no interval without a resolution, nor from two repeats; from three on, one step
    assert all(math.isnan(float(v)) for v in decide.ratio_to_constant([200.0] * 3, 200.0)[1:])
    assert all(math.isnan(float(v)) for v in decide.ratio_to_constant([200.0] * 2, 200.0, resolution=1.0)[1:])
    ratio, low, high = (float(v) for v in decide.ratio_to_constant([200.0] * 3, 200.0, resolution=1.0))
    assert (ratio, low, high) == (1.0, 199.0 / 200.0, 201.0 / 200.0)
    # with spread: the t interval widened by one step on each side; NaN resolution is none
    x = [190.0, 200.0, 210.0]
    _, t_low, t_high = decide.ratio_to_constant(x, 200.0)
    _, low, high = decide.ratio_to_constant(x, 200.0, resolution=2.0)
    assert float(low) == pytest.approx(float(t_low) - 0.01) and float(high) == pytest.approx(float(t_high) + 0.01)
    assert float(decide.ratio_to_constant(x, 200.0, resolution=np.nan)[1]) == float(t_low)
    # vectorised like the others: one resolution per comparison
    lows = decide.ratio_to_constant(np.array([[90.0] * 3, [100.0] * 3]), 100.0, resolution=np.array([1.0, 0.0]))[1]
    assert lows[0] == pytest.approx(0.89) and math.isnan(lows[1])


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_counted_repeats_at_the_share_are_rarely_called_converged_whatever_the_noise_against_the_step(n):
    # A/A of "converged to the device" with the bandwidth counted in steps: from a deterministic
    # device (no noise, every repeat equal) to noise ten steps wide, at a true ratio of exactly
    # CONVERGED, counts rounded up (the worst case) on a grid placed at random.
    rng = np.random.default_rng([aa.SEED, n])
    ceiling = aa.MEAN / aa.CONVERGED
    for noise_in_steps in (0.0, 0.1, 0.3, 0.5, 1.0, 3.0, 10.0):
        step = 1.0
        true = rng.normal(aa.MEAN, noise_in_steps * step, (aa.TRIALS, n))
        _, low, _ = decide.ratio_to_constant(aa.counted(true, rng, step), ceiling, resolution=step)
        rate = float((low >= aa.CONVERGED).mean())
        assert rate <= 0.05 + _binomial_slack(aa.TRIALS), (n, noise_in_steps, rate)
        if noise_in_steps == 0.0:
            assert rate == 0.0  # a device that repeats exactly is never called converged at the share


def test_safe_load_needs_every_load_up_to_it_inside_the_limit():
    assert decide.safe_upto([1.5, 1.9, 2.1, 1.2], 2.0) == 1
    assert decide.safe_upto([2.5, 1.0], 2.0) == -1
    assert decide.safe_upto([1.5, np.nan, 1.0], 2.0) == 0  # a load without an interval is not safe
    assert decide.safe_upto([0.95, 0.91, 0.89], 0.9, higher_is_worse=False) == 1


def test_polling_and_saturation_call_the_rules_the_check_measures():
    # idle_poll: the study's choice from aggregate rows equals decide.pick_shortest on the samples
    rng = np.random.default_rng(3)
    for trial in range(40):
        base = rng.normal(100, 5, 3)
        cands = rng.normal(100, 5, (5, 3)) - np.array([0, 0, 8, 8, 0])[:, None] * (trial % 2)
        rows = [pd.Series({"lat_p99_ns_mean": c.mean(), "lat_p99_ns_std": c.std(ddof=1), "lat_p99_ns_n": 3})
                for c in cands]
        base_row = pd.Series({"lat_p99_ns_mean": base.mean(), "lat_p99_ns_std": base.std(ddof=1),
                              "lat_p99_ns_n": 3})
        assert polling.idle_poll_choice(base_row, rows) == int(decide.pick_shortest(base, cands))
        assert compare(base_row, rows[2], "lat_p99_ns").p == pytest.approx(
            float(decide.welch(base, cands[2])[2]), rel=1e-12)


# -- one implementation each (issue 22, item 11) ----------------------------------------------------

def test_extra_means_are_stats_aggregate_under_the_metric_names():
    from test_analysis_fixtures import frame, rows

    from nvmflab.analysis.extra import means
    from nvmflab.analysis.stats import aggregate

    data = frame(rows("contention", "isolated", [{"iops": 1000.0, "point_id": "a"}, {"iops": 3000.0, "iodepth": 4}]),
                 rows("contention", "isolated", [{"iops": 500.0, "point_id": "a"}]))  # a second job of point a
    got = means(data, ["iodepth"], ["iops", "lat_p99_ns"]).set_index("iodepth")
    ref = aggregate(data, by=["iodepth"], metrics=["iops", "lat_p99_ns", "bw_bytes"]).set_index("iodepth")
    assert got["iops"].tolist() == pytest.approx(ref["iops_mean"].tolist())
    assert got.at[1, "iops"] == pytest.approx(1500.0)  # the point's two jobs add up before the mean
    assert got["iops_ci95"].tolist() == pytest.approx(ref["iops_ci95"].tolist())
    assert got["bw_ci95"].tolist() == pytest.approx(ref["bw_bytes_ci95"].tolist())
    assert got["repeats"].tolist() == [3, 3]


def test_plots_extra_uses_the_public_figure_style():
    import inspect

    from nvmflab import plots, plots_extra

    assert plots_extra.new_figure is plots.new_figure
    assert "plots import _" not in inspect.getsource(plots_extra)
    figure = plots_extra.lines({"a": ([1, 2], [3.0, 4.0])}, title="t", xlabel="x", ylabel="y")
    assert figure.axes[0].get_title() == "t"


def test_dimensions_with_every_pattern_at_the_same_iops_says_no_difference(tmp_path):
    import json

    from nvmflab.analysis import dimensions
    from nvmflab.store import ResultsStore

    store = ResultsStore(tmp_path / "r")
    run = store.start_run("dimensions", 'study = "dimensions"', {})
    for rw in ("randread", "randwrite", "read"):
        knobs = {"rw": rw, "bs": 4096, "numjobs": 1, "transport": "tcp", "iodepth": 128}
        for repeat, iops in enumerate((99_000.0, 100_000.0, 101_000.0)):
            store.save_point(run, f"{rw}-{repeat}", "dimensions", "pattern", knobs, repeat, "ok", None,
                             [{"role": "main", "engine": "tcp", "iops": iops, "bw_bytes": iops * 4096,
                               "lat_mean_ns": 1e5, "lat_p99_ns": 2e5, "knobs": knobs,
                               "histogram_json": json.dumps([[100_000, 1]])}])
    text = "\n".join(dimensions.analyze(store.measurements(), store.runs()).findings)
    finding = next(f for f in text.splitlines() if f.startswith("At 4k,"))
    assert "no clear difference in IOPS" in finding and "95 % interval of the difference" in finding
