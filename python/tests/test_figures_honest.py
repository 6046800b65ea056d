"""Figures that do not overstate (issue 37 item 7): no error bar below zero for a quantity that
cannot be negative, no line over a sweep axis with a single value, points left out of the findings
marked, loads past saturation explained, "lower is better" and "higher is better" never on one
axis, and no overlapping tick or value labels in any study's figure.

The label check measures matplotlib's own text boxes on every figure the studies draw from the
findings-gate walk fixture (`nvmflab study all --quick` on the fake binaries, plus the transports
store). The report embeds each figure as one PNG shown at its natural width (825 px) in a 1400 px
window and scaled down as a whole (max-width: 100 %) in a 700 px one, so labels that stand clear
in the PNG stand clear at both widths.
"""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from nvmflab import plots, plots_extra
from nvmflab.analysis.result import Figure
from nvmflab.report import ANALYZERS

SAVED_DPI = 110  # report._save


def lowest_error_bar_end(axes) -> float:
    """The lowest y any error bar of the axes reaches."""
    ends = [y for c in axes.containers if isinstance(c, ErrorbarContainer)
            for segments in c.lines[2] for segment in segments.get_segments() for _, y in segment]
    ends += [y for c in axes.containers if getattr(c, "errorbar", None) is not None
             for segments in c.errorbar.lines[2] for segment in segments.get_segments() for _, y in segment]
    assert ends, "no error bar drawn"
    return min(ends)


def test_error_bars_of_nonnegative_quantities_stop_at_zero_and_the_caption_says_so():
    # 3 repeats of a noisy p99: mean 10 µs, 95 % half-width 25 µs; a symmetric bar would reach -15.
    agg = pd.DataFrame({"completion": ["poll", "poll"], "iodepth": [1, 2], "lat_p99_ns_mean": [10e3, 50e3],
                        "lat_p99_ns_ci95": [25e3, 5e3]})
    made = [
        plots.p99_vs_qd(agg, "completion", "t"),
        plots.vs_load(pd.DataFrame({"bg_load_pct": [20.0, 40.0], "lat": [0.5, 3.0], "lat_ci95": [1.5, 0.2],
                                    "leg": ["target"] * 2}), "lat", series="leg", title="t", ylabel="×",
                      reference=1.0),
        plots.bars(["a", "b"], [10.0, 50.0], [25.0, 5.0], title="t", ylabel="µs"),
        plots_extra.grouped_bars(["a", "b"], {"s": [10.0, 50.0]}, title="t", ylabel="µs",
                                 errors={"s": [25.0, 5.0]}),
        plots_extra.lines({"s": ([1, 2], [10.0, 50.0])}, title="t", xlabel="QD", ylabel="µs",
                          errors={"s": [25.0, 5.0]}),
    ]
    for figure in made:
        assert lowest_error_bar_end(figure.axes[0]) == pytest.approx(0.0, abs=1e-9)
        caption = Figure("f", figure, "p99 per queue depth.").caption
        assert caption.startswith("p99 per queue depth.") and "cut at zero" in caption


def test_upper_arm_is_kept_and_a_missing_interval_is_not_drawn_as_exact():
    figure = plots.new_figure("t")[0]
    yerr = plots.nonnegative_yerr(figure, [10.0, 50.0, 30.0], [25.0, 5.0, math.nan])
    assert yerr[:, 0].tolist() == [10.0, 25.0] and yerr[:, 1].tolist() == [5.0, 5.0]
    assert np.isnan(yerr[:, 2]).all()  # no bar, rather than a zero-length one that looks exact
    assert plots.notes(figure) == [plots.CLIPPED_NOTE]
    figure = plots.new_figure("t")[0]
    plots.nonnegative_yerr(figure, [10.0], [5.0])
    assert plots.notes(figure) == []  # nothing cut, nothing to say


def drawn_lines(axes) -> list:
    return [line for line in axes.lines if len(line.get_xdata())]


def test_a_sweep_with_one_value_draws_no_line_and_says_what_it_needs():
    agg = pd.DataFrame({"series": ["4 KiB"], "target_core_count": [1], "iops_mean": [100e3], "iops_ci95": [5e3]})
    figure = plots.series_vs_x(agg, "target_core_count", "iops", series="series", title="t",
                               xlabel="Target cores", ylabel=plots.KIOPS_LABEL)
    axes = figure.axes[0]
    assert drawn_lines(axes) == [] and not axes.containers
    assert any("needs ≥ 2 core counts" in t.get_text() for t in axes.texts)
    assert "only 1" in plots.notes(figure)[0]
    one_qd = plots.p99_vs_qd(pd.DataFrame({"c": ["poll"], "iodepth": [1], "lat_p99_ns_mean": [9e3]}), "c", "t")
    assert plots.notes(one_qd) == [f"Not drawn: needs ≥ 2 values of {plots.QD_LABEL} (this run measured only 1)."]
    figure = plots_extra.lines({"busy": ([2], [5.0]), "off": ([2], [4.0])}, title="t",
                               xlabel="Target cores (reactors)", ylabel="KIOPS")
    assert drawn_lines(figure.axes[0]) == []
    assert "needs ≥ 2 core counts" in Figure("f", figure, "").caption and "only 2" in Figure("f", figure, "").caption
    sizes = plots_extra.lines({"tcp": ([131072], [900.0])}, title="t", xlabel="I/O size", ylabel="MB/s",
                              xticklabels={131072.0: "128k"})
    assert "only 128k" in plots.notes(sizes)[0]  # the size as the axis would name it, not a byte count
    two = plots_extra.lines({"busy": ([1, 2], [5.0, 6.0])}, title="t", xlabel="Target cores", ylabel="KIOPS")
    assert len(drawn_lines(two.axes[0])) == 1 and plots.notes(two) == []


def test_points_left_out_of_the_findings_are_crosses_with_a_legend_entry():
    figure = plots_extra.lines({"alone": ([1, 2], [9.0, 8.5])}, title="t", xlabel="network apps",
                               ylabel="Gbit/s", left_out={"alone": ([3], [4.0])},
                               left_out_label="left out: shared cores")
    axes = figure.axes[0]
    crosses = [line for line in axes.lines if line.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [3] and crosses[0].get_linestyle() == "None"
    assert "left out: shared cores" in [t.get_text() for t in axes.get_legend().get_texts()]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1", "2", "3"]


def test_loads_above_saturation_are_explained():
    frame = pd.DataFrame({"bg_load_pct": [50.0, 142.2], "x": [1.1, 1.5], "leg": ["initiator"] * 2})
    over = plots.vs_load(frame, "x", series="leg", title="t", ylabel="×", reference=1.0)
    assert plots.OVER_SATURATION_NOTE in Figure("f", over, "c").caption
    within = plots.vs_load(frame.assign(bg_load_pct=[50.0, 90.0]), "x", series="leg", title="t", ylabel="×",
                           reference=1.0)
    assert plots.notes(within) == []


def test_lower_and_higher_is_better_go_to_separate_panels():
    figure = plots_extra.grouped_bars(["L-app", "T-app QD32", "B-app"], {"tls": [1.3, 0.8, 0.9]}, title="t",
                                      ylabel="÷ plain", better=["lower", "higher", "higher"])
    assert [a.get_title() for a in figure.axes] == ["lower is better", "higher is better"]
    assert [[t.get_text() for t in a.get_xticklabels()] for a in figure.axes] == [["L-app"], ["T-app QD32", "B-app"]]
    one = plots_extra.grouped_bars(["T-app", "B-app"], {"tls": [0.8, 0.9]}, title="t", ylabel="÷ plain",
                                   better=["higher", "higher"])
    assert len(one.axes) == 1


def shown_tick_labels(axis) -> list:
    """The tick labels the axis draws: those of ticks inside its view (matplotlib keeps labels of
    ticks just outside it, which are never drawn)."""
    low, high = sorted(axis.get_view_interval())
    span = high - low
    return [tick.label1 for tick in axis.get_major_ticks()
            if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span]


def overlapping_texts(figure) -> list[tuple[str, str]]:
    """Pairs of tick labels, value labels (texts in the axes), titles or axis labels whose boxes overlap
    at the saved DPI."""
    figure.set_dpi(SAVED_DPI)
    figure.draw_without_rendering()
    pairs = []
    for axes in figure.axes:
        texts = [t for t in shown_tick_labels(axes.xaxis) + shown_tick_labels(axes.yaxis) + list(axes.texts)
                 + [axes.title, axes.xaxis.label, axes.yaxis.label] + ([figure._suptitle] if figure._suptitle else [])
                 if t.get_visible() and t.get_text().strip()]
        boxes = [t.get_window_extent() for t in texts]
        pairs += [(texts[i].get_text(), texts[j].get_text()) for i in range(len(texts))
                  for j in range(i + 1, len(texts)) if boxes[i].overlaps(boxes[j])]
    return pairs


def test_long_bar_labels_are_wrapped_clear_of_one_another():
    names = ["NVMe/TCP loopback", "NVMe/TCP across netns link [veth, no delay, no rate cap]", "local file"]
    figure = plots.bars(names, [80.0, 95.0, 20.0], [2.0, 3.0, 1.0], title="t", ylabel="µs")
    assert overlapping_texts(figure) == []
    crowded = plots_extra.grouped_bars([f"group {i}" for i in range(8)],
                                       {s: [1234.5 + i for i in range(8)] for s in "abcd"}, title="t", ylabel="MB/s")
    assert overlapping_texts(crowded) == []


@pytest.fixture(scope="module")
def study_figures(tmp_path_factory) -> list[tuple[str, Figure]]:
    from test_findings_gate import walk_data

    measurements, runs = walk_data(tmp_path_factory)
    return [(name, figure) for name, analyze in ANALYZERS.items() if name in set(measurements["study"])
            for figure in analyze(measurements, runs).figures]


def test_no_study_figure_has_overlapping_tick_or_value_labels(study_figures):
    assert len(study_figures) > 20
    crowded = {f.name: overlapping_texts(f.figure) for _, f in study_figures}
    assert {name: pairs for name, pairs in crowded.items() if pairs} == {}


def test_every_figure_whose_caption_claims_an_interval_draws_it(study_figures):
    claim = re.compile(r"error bars (are|show)|error bars:|95 % (confidence )?intervals? over (the )?repeats", re.I)
    claiming = [f for _, f in study_figures if claim.search(f.caption)]
    assert claiming
    for figure in claiming:
        drawn = [a for a in figure.figure.axes if drawn_lines(a) or a.patches]
        assert drawn and all(error_bar_spans(a) for a in drawn), figure.name  # drawn, not only NaN


def test_no_study_draws_a_line_over_a_single_value(study_figures):
    for _, figure in study_figures:
        for axes in figure.figure.axes:
            xs = {float(x) for line in drawn_lines(axes) for x in line.get_xdata()}  # crosses count
            if axes.patches or (axes.get_xscale() == "log" and axes.get_ylabel().startswith("Fraction")):
                continue  # bars are categories, a CDF's x is latency: neither is a sweep
            assert len(xs) != 1, f"{figure.name}: one x value under a line"


def test_the_security_ratio_figure_splits_latency_from_throughput(study_figures):
    ratio = [f for name, f in study_figures if name == "security" and f.name.endswith("_ratio")]
    assert ratio
    for figure in ratio:
        assert [a.get_title() for a in figure.figure.axes] == ["lower is better", "higher is better"]


def test_contention_grid_marks_its_shared_core_cells_as_left_out(tmp_path):
    from test_contention_layout import _flows, _lapp, _save

    from nvmflab.analysis import contention
    from nvmflab.store import ResultsStore

    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    lapps = {"app": "L-app", "part": "storage", "placement": "one_per_core", "storage_apps": 8}
    for r in range(3):
        for m, shares in ((0, False), (1, False), (2, False), (3, True)):
            knobs = lapps | {"net_flows": m, "net_shares_storage_core": shares}
            lapp_rows = [_lapp(100e3 * (1 + m + 0.01 * r), role) for role in ("main", "lg1")]
            _save(store, run, "lapps_flows", knobs, r, lapp_rows)
            if m:
                alone = {"app": "net", "part": "network", "placement": "one_per_core", "storage_apps": 0,
                         "net_flows": m, "net_shares_storage_core": shares}
                _save(store, run, "lapps_flows", alone, r, _flows(m, 1e9 * (1 + 0.01 * r)))
                _save(store, run, "lapps_flows", knobs | {"part": "network"}, r, _flows(m, 0.9e9 * (1 + 0.02 * r)))
    figures = {f.name: f.figure.axes[0] for f in contention.analyze(store.measurements(), store.runs()).figures}
    for name in ("contention_lapps_vs_network_apps", "contention_network_apps_beside_lapps"):
        axes = figures[name]
        crosses = [line for line in axes.lines if line.get_marker() == "x"]
        assert crosses and {x for line in crosses for x in line.get_xdata()} == {3}, name
        assert all(3 not in line.get_xdata() for line in axes.lines if line.get_marker() != "x"), name
        assert any(t.get_text().startswith("left out") for t in axes.get_legend().get_texts()), name


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Appended to a copy of the report: after load, the page's width, the window's, the tables that
# scroll inside themselves and the figures that stick out of the window, as a body attribute.
PROBE = """<script>window.addEventListener("load", function () {
  var all = function (q) { return Array.prototype.slice.call(document.querySelectorAll(q)); };
  var scrolling = all("table.data").filter(function (t) { return t.scrollWidth > t.clientWidth; }).length;
  var out = all("img[data-figure]").filter(function (i) {
    return i.getBoundingClientRect().right > window.innerWidth; }).length;
  document.body.setAttribute("data-probe",
    [document.documentElement.scrollWidth, window.innerWidth, scrolling, out].join(" "));
});</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_wide_tables_scroll_and_figures_fit_at_700_and_1400_px(tmp_path):
    import subprocess

    from test_analysis_fixtures import interference_measurements, polling_measurements
    from test_report import store_frame

    from nvmflab.report import write_report
    from nvmflab.store import ResultsStore

    with ResultsStore(tmp_path / "r") as store:
        store_frame(store, polling_measurements(), "polling")
        store_frame(store, interference_measurements(), "interference")
    page = write_report(tmp_path / "r", tmp_path / "out")
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    scrolled = {}
    for width in (700, 1400):
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / f'p{width}'}", f"--window-size={width},2000",
             "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
            capture_output=True, text=True, timeout=120).stdout
        found = re.search(r'data-probe="(\d+) (\d+) (\d+) (\d+)"', dom)
        assert found, f"the probe did not run at {width} px"
        page_width, window, scrolled[width], sticking_out = map(int, found.groups())
        assert page_width <= window and sticking_out == 0, (width, found.group(0))
    assert scrolled[700] > scrolled[1400] >= 0  # the narrow window scrolls tables the wide one shows whole


def test_compare_figures_use_the_same_rule_and_say_so():
    from nvmflab.compare import Comparison, MetricComparison, figures

    noisy = MetricComparison(study="polling", leg="completion", role="main", point="QD1", knobs={"iodepth": 1},
                             kind="p99", metric="lat_p99_ns", before=[10e3, 12e3, 200e3], after=[11e3, 12e3, 13e3],
                             before_mean=None, after_mean=None, difference=None, low=None, high=None,
                             change_pct=None, low_pct=None, high_pct=None, p=None)
    [figure] = figures(Comparison("a", "b", None, metrics=[noisy]))
    assert figure["caption"].startswith("polling / completion: p99 latency") and "cut at zero" in figure["caption"]



def error_bar_spans(axes) -> list[tuple[float, float]]:
    segments = [seg for c in axes.containers if isinstance(c, ErrorbarContainer) for lines in c.lines[2]
                for seg in lines.get_segments() if len(seg) and np.isfinite(seg).all()]
    return sorted((min(y for _, y in seg), max(y for _, y in seg)) for seg in segments)


def test_interference_error_bars_are_the_fieller_interval_its_findings_state():
    frame = pd.DataFrame({"bg_load_pct": [20.0, 40.0, 60.0], "latency_interference": [1.5, 2.0, 3.0],
                          "latency_interference_ci95": [0.1, 0.1, 0.1],  # symmetric, not what the text states
                          "latency_interference_low": [1.2, 1.9, math.nan],
                          "latency_interference_high": [2.5, 2.2, math.inf], "leg": ["target"] * 3})
    figure = plots.vs_load(frame, "latency_interference", series="leg", title="t", ylabel="×", reference=1.0)
    assert error_bar_spans(figure.axes[0]) == [pytest.approx((1.2, 2.5)), pytest.approx((1.9, 2.2))]
    assert plots.FIELLER_NOTE in Figure("f", figure, "").caption
    none = plots.vs_load(frame.assign(latency_interference_low=math.nan), "latency_interference", series="leg",
                         title="t", ylabel="×", reference=1.0)
    assert error_bar_spans(none.axes[0]) == [] and plots.notes(none) == [plots.NO_INTERVAL_NOTE]


def red_crosses(axes) -> list[float]:
    return sorted(float(x) for line in axes.lines if line.get_marker() == "x" and line.get_color() == "tab:red"
                  for x in line.get_xdata())


def test_a_failed_or_invalid_point_is_marked_on_every_figure_of_its_study_and_named_in_the_caption():
    from test_analysis_fixtures import interference_measurements, runs_frame

    from nvmflab.analysis import interference
    from nvmflab.analysis.left_out import mark_figures

    measurements = interference_measurements(invalid_target_load=50)  # one point broke its invariant
    failed = measurements.iloc[[0]].assign(status="failed", error="fio exited with status 1", point_id="init-failed",
                                           leg="initiator", bg_load_pct=70.0, role="fg", iodepth=1)
    result = interference.analyze(pd.concat([measurements, failed], ignore_index=True), runs_frame(["interference"]))
    latency = next(f for f in result.figures if f.name == "interference_latency_vs_load")
    assert red_crosses(latency.figure.axes[0]) == [50.0, 70.0]  # on the load axis, where no ratio exists
    assert plots.FAILED_LABEL in [t.get_text() for t in latency.figure.axes[0].get_legend().get_texts()]
    assert mark_figures(result) == 2
    for figure in result.figures:
        assert "2 points failed or were invalid and are not drawn" in figure.caption
        assert "leg initiator at background load 70 % (failed: fio exited with status 1)" in figure.caption
        assert "leg target at background load 50 % (invalid: fg completions 1000" in figure.caption
        assert "2 points of this study failed" in figure.figure._supxlabel.get_text()
    clean = interference.analyze(interference_measurements(invalid_target_load=None), runs_frame(["interference"]))
    assert mark_figures(clean) == 0
    assert all(red_crosses(f.figure.axes[0]) == [] and "not drawn" not in f.caption for f in clean.figures)


def test_a_bar_without_a_value_is_a_hatched_column_marked_x_not_a_zero():
    figure = plots_extra.grouped_bars(["4k", "128k"], {"local": [2.0, 5.0], "remote host cores": [math.nan, 6.0]},
                                      title="t", ylabel="µs", missing_note="Shared cores: no split.")
    axes = figure.axes[0]
    hatched = [p for p in axes.patches if p.get_hatch() == "//"]
    assert len(hatched) == 1 and not hatched[0].get_fill()
    assert [t.get_text() for t in axes.texts if t.get_color() == "tab:red"] == ["✗"]
    assert "Shared cores: no split." in Figure("f", figure, "").caption
    whole = plots_extra.grouped_bars(["4k"], {"local": [2.0]}, title="t", ylabel="µs")
    assert not [p for p in whole.axes[0].patches if p.get_hatch()] and plots.notes(whole) == []


def test_parallelism_marks_the_split_bars_its_shared_core_points_lost(tmp_path):
    from test_cores_used import cores_json
    from test_study_extra import _row, _save

    from nvmflab.analysis import parallelism
    from nvmflab.analysis.parallelism import SPLIT_MISSING_NOTE
    from nvmflab.store import ResultsStore

    store = ResultsStore(tmp_path / "r")
    run = store.start_run("parallelism", 'study = "parallelism"', {"spec_effective": {"ramp_time": 0}})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "backend": "file", "iodepth": 16}
    for r in range(3):
        local = cores_json({"main": [1]}, {1: (1.0, 2.0, 0.1)})
        shared = cores_json({"main": [1], "target": [1]}, {1: (2.0, 3.0, 0.5)})  # both sides on core 1
        _save(store, run, "parallelism", "size_local", base, r, [_row(100_000, cpu_cores_json=local)])
        _save(store, run, "parallelism", "size_remote", base, r, [_row(100_000, cpu_cores_json=shared)])
    [figure] = [f for f in parallelism.analyze(store.measurements(), store.runs()).figures
                if f.name == "parallelism_cpu_per_io"]
    hatched = [p for p in figure.figure.axes[0].patches if p.get_hatch() == "//"]
    assert len(hatched) == 2 and SPLIT_MISSING_NOTE in figure.caption  # remote host cores, remote target cores
