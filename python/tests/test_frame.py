"""nvmflab.load(): the tidy frame of a results directory, and docs/notebook.md's code run against it."""

import math
import re

import matplotlib
import pandas as pd
import pytest
from test_analysis_fixtures import interference_measurements, polling_measurements
from test_report import store_frame

import nvmflab
from nvmflab.frame import NoResults, intervals
from nvmflab.store import ResultsStore

from conftest import REPO

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("results")
    with ResultsStore(directory) as store:
        store_frame(store, polling_measurements(), "polling")
        store_frame(store, interference_measurements(), "interference")
    return directory


def test_one_row_per_point_role_and_repeat_with_units_in_the_names(results):
    df = nvmflab.load(results)
    raw = ResultsStore(results).measurements()
    assert not df.duplicated(["point_id", "role", "repeat"]).any()
    assert len(df) == len(raw.drop_duplicates(["point_id", "role", "repeat"]))
    for column in ("bs_bytes", "bw_MBps", "iops", "lat_p99_us", "lat_p50_us", "usr_cpu_pct", "iodepth",
                   "completion", "target_stack", "host_stack", "bg_load_pct", "noise_pct", "noisy", "outside_cpu_s"):
        assert column in df.columns, column
    assert not {"bs", "bw_bytes", "lat_p99_ns", "histogram_json"} & set(df.columns)
    first = raw.iloc[0]
    row = df[(df.point_id == first.point_id) & (df.role == first.role)].iloc[0]
    assert row.lat_p99_us == pytest.approx(first.lat_p99_ns / 1e3)
    assert set(df.target_stack) == {"ours"} and set(df.host_stack) == {"ours"}


def test_processes_of_one_role_are_combined_as_the_analysis_does(tmp_path):
    frame = interference_measurements()
    point = frame[frame.role == "bg"].iloc[0]
    twin = frame[(frame.point_id == point.point_id) & (frame.role == "bg")].assign(lat_p99_ns=point.lat_p99_ns * 2)
    with ResultsStore(tmp_path) as store:
        store_frame(store, pd.concat([frame, twin]), "interference")
    df = nvmflab.load(tmp_path)
    bg = df[(df.point_key == f"interference-{point['leg']}-{point['point_id']}-{point['repeat']}") & (df.role == "bg")]
    assert len(bg) == 1
    assert bg.iloc[0].iops == pytest.approx(2 * point.iops)
    assert bg.iloc[0].lat_p99_us == pytest.approx(point.lat_p99_ns * 2 / 1e3)


def test_knobs_only_in_knobs_json_become_columns(tmp_path):
    with ResultsStore(tmp_path) as store:
        run = store.start_run("overhead", "", {})
        store.save_point(run, "k1", "overhead", "netns", {"iodepth": 1, "bs": 4096, "app": "L-app",
                                                          "netns_link": "none"}, 0, "skipped",
                         "needs root to create network namespaces", [])
    df = nvmflab.load(tmp_path)
    assert df.loc[0, "app"] == "L-app" and df.loc[0, "netns_link"] == "none"
    assert df.loc[0, "status"] == "skipped" and "needs root" in df.loc[0, "error"]
    assert math.isnan(df.loc[0, "iops"])


def test_a_directory_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(NoResults, match="no results.sqlite here"):
        nvmflab.load(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()  # looking did not create it
    ResultsStore(tmp_path / "empty").close()
    with pytest.raises(FileNotFoundError, match="holds no point"):
        nvmflab.load(tmp_path / "empty")


def test_intervals_as_rows(tmp_path):
    records = [{"t_ms": 1000 * i, "iops": 10.0, "read_iops": 10.0, "write_iops": 0.0, "lat_mean_ns": 1e4,
                "lat_p50_ns": 1e4, "lat_p99_ns": 2e4 * i, "lat_p99_9_ns": 3e4} for i in (1, 2, 3)]
    import json

    with ResultsStore(tmp_path) as store:
        run = store.start_run("s", "", {})
        store.save_point(run, "k", "s", "sweep", {"iodepth": 1}, 0, "ok", None,
                         [{"role": "main", "iops": 10.0, "intervals_json": json.dumps(records)}])
    rows = intervals(nvmflab.load(tmp_path, blobs=True))
    assert rows["t_s"].tolist() == [1.0, 2.0, 3.0] and rows["lat_p99_us"].tolist() == [20.0, 40.0, 60.0]
    with pytest.raises(KeyError, match="blobs=True"):
        intervals(nvmflab.load(tmp_path))


def notebook_blocks() -> list[str]:
    text = (REPO / "docs" / "notebook.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_notebook_page_runs_and_redraws_the_report_figure(results):
    blocks = notebook_blocks()
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block.replace('"results/quick"', repr(str(results))), "docs/notebook.md", "exec"), namespace)
    ax, summary = namespace["ax"], namespace["summary"]
    assert sorted(c.get_label() for c in ax.containers) == ["completion = event", "completion = poll"]
    # the same numbers as the report's figure: mean p99 of the completion leg per mode and QD
    qd1 = summary[(summary.completion == "poll") & (summary.iodepth == 1)]["mean"].iloc[0]
    assert qd1 == pytest.approx(115.2, rel=0.05)
    assert len(summary) == summary.completion.nunique() * summary.iodepth.nunique() > 4
