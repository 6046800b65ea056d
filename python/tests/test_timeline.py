"""Latency over time: intervals kept from the load generator's JSON, the change rule, report figures."""

import json
import sqlite3

import pytest
from conftest import nvmflab

from nvmflab.analysis.timeline import MAX_FIGURES, latency_change, timeline_figures
from nvmflab.metrics import summarize
from nvmflab.store import ResultsStore


def test_steady_latency_is_not_a_change():
    assert latency_change([100, 104, 98, 101, 103, 99, 102, 100]) is None
    assert latency_change([100, 300]) is None  # too few intervals to tell
    assert latency_change([]) is None


def test_warm_up_step_and_late_interference_are_changes():
    warm = latency_change([300, 100, 102, 99, 101, 100])
    assert warm is not None and warm.split == 1 and warm.before_ns == 300
    step = latency_change([100, 101, 99, 100, 300, 305, 298, 302])
    assert step is not None and step.split == 4 and step.ratio == pytest.approx(3.0, rel=0.02)
    # a shift smaller than 20 % of the median is noise-level for a figure, even beyond the spread
    assert latency_change([100, 100, 100, 110, 110, 110]) is None


def test_summarize_keeps_intervals_and_leaves_null_without_them():
    records = [{"t_ms": 2000, "iops": 5.0, "read_iops": 5.0, "write_iops": 0.0, "lat_mean_ns": 1.0,
                "lat_p50_ns": 1.0, "lat_p99_ns": 2.0, "lat_p99_9_ns": 3.0, "extra": 1},
               {"t_ms": 1000, "iops": 4.0, "read_iops": 4.0, "write_iops": 0.0, "lat_mean_ns": 1.0,
                "lat_p50_ns": 1.0, "lat_p99_ns": 2.0, "lat_p99_9_ns": 3.0}]
    row = summarize({"jobs": [], "nvmflab": {"intervals": records}})
    kept = json.loads(row["intervals_json"])
    assert [r["t_ms"] for r in kept] == [1000.0, 2000.0] and "extra" not in kept[1]
    assert summarize({"jobs": [], "nvmflab": {}})["intervals_json"] is None


def test_an_old_store_gains_the_column_on_open(tmp_path):
    db = sqlite3.connect(tmp_path / "results.sqlite")
    schema = ResultsStore.__module__ and __import__("nvmflab.store", fromlist=["SCHEMA"]).SCHEMA
    db.executescript(schema.replace(",\n    intervals_json TEXT", ""))
    db.close()
    with ResultsStore(tmp_path) as store:
        assert "intervals_json" in store.measurements().columns
        columns = list(store.measurements().columns)
    # columns added later come after fg_bg_shared_core, so the earlier ones keep their places
    assert columns.index("intervals_json") > columns.index("fg_bg_shared_core") > columns.index("lat_p99_ns")


@pytest.mark.parametrize("shape, figures", [("flat", 0), ("step", 4), ("warmup", 4)])
def test_report_draws_points_whose_latency_changed(tmp_path, fake_env, tiny_spec, shape, figures):
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"),
                   env=fake_env | {"FAKE_PERF_INTERVALS": shape})
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert frame["intervals_json"].map(lambda t: len(json.loads(t))).eq(8).all()
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    drawn = sorted(p.name for p in (tmp_path / "r" / "report" / "figures").glob("tiny_timeline_*.png"))
    assert len(drawn) == min(8, MAX_FIGURES) if figures else drawn == []
    if figures:
        assert "Latency changed during the run of 8 measurement(s)" in html
        assert "2 more not drawn" in html and "latency over the run" in html
    else:
        assert "Latency changed" not in html


def test_figures_are_capped_and_largest_first():
    import pandas as pd

    rows = []
    for i in range(MAX_FIGURES + 3):
        p99 = [100.0] * 4 + [100.0 * (2 + i)] * 4
        records = [{"t_ms": 1000 * (k + 1), "iops": 1.0, "lat_p50_ns": 50.0, "lat_p99_ns": v, "lat_p99_9_ns": v}
                   for k, v in enumerate(p99)]
        rows.append({"leg": "l", "role": "main", "repeat": 0, "point_key": f"k{i}", "knobs_json": "{}",
                     "intervals_json": json.dumps(records)})
    figures, finding = timeline_figures("s", pd.DataFrame(rows))
    assert len(figures) == MAX_FIGURES and "3 more not drawn" in finding
    assert figures[0].name == f"s_timeline_k{MAX_FIGURES + 2}_main"


def test_intervals_without_percentiles_are_judged_on_the_mean():
    import pandas as pd

    # fio's averaged logs: IOPS and mean latency only; the mean doubles halfway
    records = [{"t_ms": 1000 * (k + 1), "iops": 10.0, "lat_mean_ns": v, "lat_p50_ns": None, "lat_p99_ns": None,
                "lat_p99_9_ns": None} for k, v in enumerate([100.0] * 3 + [200.0] * 3)]
    row = {"leg": "l", "role": "main", "repeat": 0, "point_key": "k", "knobs_json": "{}",
           "intervals_json": json.dumps(records)}
    figures, finding = timeline_figures("s", pd.DataFrame([row]))
    assert len(figures) == 1 and "mean latency went from 0.1 µs to 0.2 µs" in figures[0].caption
    flat = dict(row, intervals_json=json.dumps([dict(r, lat_mean_ns=100.0) for r in records]))
    assert timeline_figures("s", pd.DataFrame([flat])) == ([], None)
