"""The report from a results directory written through the real ResultsStore, checked in a browser."""

import math
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_analysis_fixtures import (interference_measurements, overhead_measurements,
                                    polling_measurements, saturation_measurements)

from nvmflab.report import build_report, write_report
from nvmflab.store import ResultsStore

KNOBS = ["rw", "bs", "iodepth", "numjobs", "rate_iops", "completion", "target_mode",
         "idle_poll_us", "hdr_digest", "data_digest", "io_queues", "bg_load_pct"]
METRICS = ["engine", "iops", "bw_bytes", "lat_mean_ns", "lat_p50_ns", "lat_p90_ns", "lat_p99_ns",
           "lat_p99_9_ns", "lat_p99_99_ns", "lat_max_ns", "usr_cpu", "sys_cpu", "ctx",
           "voluntary_ctx", "involuntary_ctx", "target_usr_s", "target_sys_s", "histogram_json",
           "invariant_ok", "invariant_detail"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def knobs(row) -> dict:
    out = {}
    for k in KNOBS:
        value = row[k]
        if k == "bg_load_pct":
            if math.isnan(value):
                continue
            value = "max" if math.isinf(value) else value
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out[k] = value.item() if hasattr(value, "item") else value
    return out


def store_frame(store: ResultsStore, frame: pd.DataFrame, study: str) -> None:
    run_id = store.start_run(study, f'[study]\nname = "{study}"\nrepeats = 3\n',
                             {"cpu_model": "Synthetic CPU", "cores": 4, "kernel": "6.1.0"})
    for (leg, point_id, repeat), point in frame.groupby(["leg", "point_id", "repeat"], sort=False):
        lead = point[point["role"] != "bg"].iloc[0]
        measurements = [{"role": r["role"], "knobs": knobs(r),
                         **{m: (None if isinstance(r[m], float) and math.isnan(r[m]) else r[m])
                            for m in METRICS}} for _, r in point.iterrows()]
        store.save_point(run_id, f"{study}-{leg}-{point_id}-{repeat}", study, leg, knobs(lead),
                         int(repeat), lead["status"], None, measurements)
    store.finish_run(run_id)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    with ResultsStore(results) as store:
        store_frame(store, polling_measurements(), "polling")
        store_frame(store, overhead_measurements(("local", "loopback")), "overhead")
        store_frame(store, saturation_measurements(), "saturation")
        store_frame(store, interference_measurements(), "interference")
    return write_report(results, tmp_path_factory.mktemp("report"))


def test_report_contains_every_study_its_findings_and_provenance(report):
    html = report.read_text()
    for study in ("polling", "overhead", "saturation", "interference"):
        assert f'id="{study}"' in html
    assert "lowered the p99 latency at QD1 by 9.4 %" in html
    assert "The netns leg was not measured" in html
    assert "Knee configuration" in html and "Peak configuration" in html and "P2.QD128" in html
    assert "keep background load at or below" in html
    assert "broke a sanity invariant" in html and "fg completions 1000" in html
    assert "Synthetic CPU" in html and "repeats = 3" in html
    assert html.count('src="data:image/png;base64,') == 12
    figures = sorted(p.name for p in (report.parent / "figures").glob("*.png"))
    assert len(figures) == 12 and "polling_p99_vs_qd.png" in figures


def test_report_of_an_empty_or_missing_database(tmp_path):
    html = write_report(tmp_path / "nothing", tmp_path / "out").read_text()
    assert 'id="no-results"' in html
    ResultsStore(tmp_path / "empty").close()
    html = write_report(tmp_path / "empty", tmp_path / "out2").read_text()
    assert 'id="no-results"' in html


def test_skipped_leg_reason_reaches_the_page(tmp_path):
    frame = overhead_measurements(("local", "loopback"))
    skipped = frame.iloc[[0]].assign(leg="netns", point_id="netns-skip", status="skipped",
                                     error="needs root to create network namespaces", iops=math.nan)
    html = build_report(pd.concat([frame, skipped]), pd.DataFrame(), tmp_path).read_text()
    assert "The netns leg was skipped (needs root to create network namespaces)" in html
    assert "1 measurement row(s) left out" in html


def test_report_with_one_study_names_the_absent_ones(tmp_path):
    with ResultsStore(tmp_path / "r") as store:
        store_frame(store, saturation_measurements(("target",)), "saturation")
    html = write_report(tmp_path / "r", tmp_path / "out").read_text()
    assert "Not in these results: polling, overhead, interference" in html
    assert "initiator leg was not measured" in html


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_figures_render_in_a_browser(report, tmp_path):
    url = report.resolve().as_uri()
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", url, profile=tmp_path / "p1").stdout
    assert 'data-figures-loaded="12"' in dom
    assert 'data-figures-broken="0"' in dom
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1200,3000", url, profile=tmp_path / "p2")
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 3000 and pixels.std() > 0.05, "screenshot is blank"
