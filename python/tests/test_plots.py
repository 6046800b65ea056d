import math

import pandas as pd
from test_analysis_fixtures import polling_measurements

from nvmflab import plots
from nvmflab.analysis.stats import aggregate


def labels(figure):
    axes = figure.axes[0]
    return axes.get_title(), axes.get_xlabel(), axes.get_ylabel(), axes.get_legend()


def test_qd_figures_have_units_log2_axis_legend_and_error_bars():
    data = polling_measurements()
    agg = aggregate(data[data["leg"] == "completion"], by=["completion", "iodepth"])
    for make, unit in ((plots.p99_vs_qd, "µs"), (plots.iops_vs_qd, "KIOPS"), (plots.ctx_vs_qd, "count")):
        figure = make(agg, "completion", "t")
        title, xlabel, ylabel, legend = labels(figure)
        assert "Queue depth" in xlabel and unit in ylabel
        assert [t.get_text() for t in legend.get_texts()] == ["completion = event", "completion = poll"]
        axes = figure.axes[0]
        assert axes.get_xscale() == "log"
        assert [t.get_text() for t in axes.get_xticklabels()][:3] == ["1", "2", "4"]
        assert axes.containers, "error bars drawn"


def test_bandwidth_axis_names_block_sizes():
    agg = pd.DataFrame({"leg": ["local"] * 3, "bs": [4096, 131072, 1 << 20],
                        "bw_bytes_mean": [1e9, 2e9, 2e9], "bw_bytes_ci95": [math.nan] * 3})
    figure = plots.bandwidth_vs_bs(agg, "leg", "B-app")
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["4k", "128k", "1m"]
    assert labels(figure)[2] == "Bandwidth (MB/s)"


def test_load_axis_puts_max_last_and_switches_to_log_for_wide_ranges():
    frame = pd.DataFrame({"bg_load_pct": [20.0, 40.0, math.inf, 20.0, math.inf],
                          "latency_interference": [38.0, 38.0, 38.0, 1.5, 2.0],
                          "leg": ["initiator"] * 3 + ["target"] * 2})
    figure = plots.vs_load(frame, "latency_interference", series="leg", title="t",
                           ylabel="Latency interference (×)", reference=1.0, threshold=2.0,
                           threshold_label="limit")
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["20", "40", "max"]
    assert axes.get_yscale() == "log"
    assert "bg_load_pct" in axes.get_xlabel()
    assert plots.load_positions([20.0, 40.0, math.inf])[math.inf] == 60.0



def test_vs_load_labels_close_loads_without_overlap():
    # a quick run's achieved loads: 50 and 50.8 of two legs, 142.2 and the uncapped 'max'
    frame = pd.DataFrame({"bg_load_pct": [50.0, 50.8, 142.2, math.inf, 50.0, 142.2],
                          "latency_interference": [1.1, 1.2, 1.5, 2.0, 1.0, 1.4],
                          "leg": ["initiator"] * 4 + ["target"] * 2})
    figure = plots.vs_load(frame, "latency_interference", series="leg", title="t", ylabel="x", reference=1.0)
    shown = [t for t in figure.axes[0].get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in shown] == ["50", "142.2", "max"]  # 50.8 sits on 50's label
    boxes = [t.get_window_extent() for t in shown]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))

def test_latency_cdf_and_bars():
    figure = plots.latency_cdf({"isolated": [[100_000, 99], [200_000, 1]]}, "CDF")
    title, xlabel, ylabel, legend = labels(figure)
    assert "µs" in xlabel and "CDF" in ylabel
    line = figure.axes[0].lines[0]
    assert list(line.get_xdata()) == [100.0, 200.0]
    figure = plots.bars(["local", "loopback"], [82.5, 88.6], [1.0, math.nan], title="L-app",
                        ylabel="p99 latency (µs)")
    assert [t.get_text() for t in figure.axes[0].texts] == ["82.5", "88.6"]


def test_a_sweep_of_words_counts_its_values_instead_of_converting_them():
    """tls = off/on is a sweep of two values: needs_sweep must not call float('off')."""
    from nvmflab.plots import needs_sweep, new_figure

    figure, axes = new_figure("tls")
    assert needs_sweep(figure, axes, ["off", "on"], "needs two values") is False
    figure, axes = new_figure("tls")
    assert needs_sweep(figure, axes, ["on", "on"], "needs two values") is True
