import json
import math

import pandas as pd
import pytest

from nvmflab.analysis import formulas, stats


def test_aggregate_mean_std_n_ci_per_knob_group():
    frame = pd.DataFrame({
        "leg": ["a"] * 6, "role": ["main"] * 6, "iodepth": [1, 1, 1, 8, 8, 8],
        "run_id": 1, "point_id": range(6), "repeat": [0, 1, 2, 0, 1, 2],
        "iops": [99.0, 100.0, 101.0, 10.0, 20.0, math.nan],
    })
    agg = stats.aggregate(frame, by=["iodepth"], metrics=["iops"]).set_index("iodepth")
    assert agg.at[1, "iops_mean"] == pytest.approx(100.0)
    assert agg.at[1, "iops_std"] == pytest.approx(1.0)
    assert agg.at[1, "iops_n"] == 3
    assert agg.at[1, "iops_ci95"] == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert agg.at[8, "iops_n"] == 2  # the NaN repeat (failed) is not counted
    assert agg.at[8, "iops_ci95"] == pytest.approx(12.706 * math.sqrt(50) / math.sqrt(2), rel=1e-3)


def test_aggregate_keeps_missing_knob_values_as_their_own_group():
    frame = pd.DataFrame({"run_id": 1, "point_id": [1, 2], "repeat": 0, "role": "fg",
                          "bg_load_pct": [math.nan, 20.0], "iops": [10.0, 5.0]})
    agg = stats.aggregate(frame, by=["bg_load_pct"], metrics=["iops"])
    assert len(agg) == 2
    assert agg["bg_load_pct"].isna().sum() == 1


def test_collapse_jobs_sums_throughput_and_keeps_worst_latency():
    frame = pd.DataFrame({"run_id": 1, "point_id": [7, 7], "repeat": 0, "role": "bg",
                          "iops": [10.0, 30.0], "lat_p99_ns": [100.0, 300.0],
                          "read_iops": [10.0, 20.0], "write_iops": [0.0, 10.0], "total_ios": [100, 300],
                          "perf_usr_s": [0.5, 1.5], "perf_sys_s": [0.25, 0.25],
                          "histogram_json": [json.dumps([[1, 2]]), json.dumps([[1, 1], [5, 1]])]})
    row = stats.collapse_jobs(frame).iloc[0]
    assert row["iops"] == 40.0 and row["lat_p99_ns"] == 300.0
    # the I/O counts and CPU seconds of the processes add up too (CPU per I/O of the whole role)
    assert (row["read_iops"], row["write_iops"], row["total_ios"]) == (30.0, 10.0, 400)
    assert (row["perf_usr_s"], row["perf_sys_s"]) == (2.0, 0.5)
    assert json.loads(row["histogram_json"]) == [[1, 3], [5, 1]]


def test_ci_needs_two_values_and_t_is_exact_at_any_dof():
    assert math.isnan(stats.ci95_halfwidth([5.0]))
    assert stats.t95(100) == pytest.approx(1.984, abs=1e-3)  # scipy.stats, no table cut-off at 30
    assert math.isnan(stats.t95(0))


def test_usable_drops_failed_and_invariant_broken_rows():
    frame = pd.DataFrame({"status": ["ok", "failed", "ok", "invalid"],
                          "invariant_ok": [None, None, False, False]})
    assert stats.usable(frame).index.tolist() == [0]


def test_histogram_merge_and_percentiles():
    merged = stats.merge_histograms([[[100, 90], [200, 9]], json.dumps([[200, 0], [1000, 1]])])
    assert merged == [(100.0, 90), (200.0, 9), (1000.0, 1)]
    assert stats.histogram_percentile(merged, 50) == 100.0
    assert stats.histogram_percentile(merged, 99) == 200.0
    assert stats.histogram_percentile(merged, 99.9) == 1000.0
    assert math.isnan(stats.histogram_percentile([], 99))
    values, fractions = stats.histogram_cdf(merged)
    assert values.tolist() == [100.0, 200.0, 1000.0]
    assert fractions.tolist() == pytest.approx([0.9, 0.99, 1.0])
    with pytest.raises(ValueError, match="percentile"):
        stats.histogram_percentile(merged, 101)


def test_interference_and_ratio_formulas():
    assert formulas.latency_interference(380.0, 10.0) == pytest.approx(38.0)
    assert formulas.throughput_sustained(49.0, 100.0) == pytest.approx(0.49)
    assert formulas.peak_ratio(332.68, 128.24) == pytest.approx(2.594, abs=1e-3)
    assert formulas.concurrency(120.0, 40.0) == pytest.approx(3.0)
    assert formulas.change_pct(127.14, 115.20) == pytest.approx(-9.39, abs=0.01)
    assert math.isnan(formulas.throughput_sustained(1.0, 0.0))
    assert math.isnan(formulas.latency_interference(None, 1.0))


def test_overhead_decomposition_in_us_and_percent():
    software, network, total = formulas.overhead_decomposition(82.5, 88.64, 106.04)
    assert (software.name, software.baseline) == ("software", "local")
    assert software.delta_us == pytest.approx(6.14)
    assert software.pct == pytest.approx(7.44, abs=0.01)
    assert network.delta_us == pytest.approx(17.40)
    assert network.pct == pytest.approx(19.63, abs=0.01)
    assert total.delta_us == pytest.approx(23.54)
    assert total.pct == pytest.approx(28.53, abs=0.01)
    missing = formulas.overhead_decomposition(82.5, 88.64, None)
    assert math.isnan(missing[1].delta_us) and math.isnan(missing[2].pct)
    assert missing[0].delta_us == pytest.approx(6.14)
