"""The decisions around the formulas (issue 13): achieved load, recommendations only from clear
differences, configurable guidelines with their knee, limits confirmed by utilization, exact
invariants, interleaved repeats, and the polling configuration carried over."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_analysis_fixtures import (frame, interference_measurements, polling_measurements, rows,
                                    runs_frame, saturation_measurements)

from nvmflab.analysis import interference, polling, saturation
from nvmflab.analysis.common import compare, within_spread
from nvmflab.analysis.stats import diff_interval
from nvmflab.studies import common as study_common
from nvmflab.studies import interference as interference_study
from nvmflab.studies.saturation import peak_iops


def table(result, title_part):
    return next(t.frame for t in result.tables if title_part in t.title)


def rec(result, leg):
    return result.recommendations.set_index("leg").loc[leg]


# -- statistics --------------------------------------------------------------------------------

def test_difference_interval_is_welch_and_needs_two_repeats():
    diff, half = diff_interval(100.0, 1.0, 3, 103.0, 1.0, 3)
    # se = sqrt(2/3), Welch dof = 4, t = 2.776
    assert diff == pytest.approx(3.0) and half == pytest.approx(2.776 * math.sqrt(2 / 3), rel=1e-3)
    assert math.isnan(diff_interval(100.0, math.nan, 1, 103.0, 1.0, 3)[1])
    assert within_spread([1.0, 1.1], [0.1, 0.1]) and not within_spread([1.0, 1.3], [0.1, 0.1])
    assert not within_spread([1.0, 1.0], [math.nan, 0.1])  # one repeat: no flat claim


# -- polling: no recommendation from noise ------------------------------------------------------

def _completion_only(poll_p99_factor: float, poll_peak_factor: float) -> pd.DataFrame:
    data = polling_measurements()
    data = data[data["leg"] == "completion"].copy()
    event_qd1 = data[(data["completion"] == "event") & (data["iodepth"] == 1)]
    poll = data["completion"] == "poll"
    # poll's p99 at QD1 and IOPS everywhere as a factor of event's (the fixture's ±1 % repeats stay)
    for index in data[poll].index:
        qd = data.at[index, "iodepth"]
        twin = data[(data["completion"] == "event") & (data["iodepth"] == qd)
                    & (data["repeat"] == data.at[index, "repeat"])].iloc[0]
        data.loc[index, "lat_p99_ns"] = twin["lat_p99_ns"] * poll_p99_factor
        data.loc[index, "iops"] = twin["iops"] * poll_peak_factor
    assert len(event_qd1) == 3
    return data


def test_a_half_percent_difference_is_no_clear_winner_and_keeps_the_default():
    # The old rule picked the lower p99 however small the gap; within ±1 % repeats 0.5 % is noise.
    result = polling.analyze(_completion_only(0.995, 1.005), runs_frame(["polling"]))
    row = rec(result, "completion")
    assert row["suggested value"] == "event"
    assert row["decision"] == "no clear winner: keep the default"
    assert "±" in row["evidence"]  # the interval that includes zero is shown
    assert result.findings[0].startswith("No clear difference in the p99 latency")  # undecided reads as such
    assert "would have been seen with 80 % power at these 3 repeats" in result.findings[0]
    assert polling.recommended_knobs(_completion_only(0.995, 1.005)) == {}


def test_a_clear_p99_gain_is_chosen_and_a_p99_tie_falls_to_a_clear_peak_gain():
    assert rec(polling.analyze(_completion_only(0.9, 1.0), runs_frame([])), "completion")["suggested value"] == "poll"
    tie = rec(polling.analyze(_completion_only(1.0, 1.2), runs_frame([])), "completion")
    assert tie["suggested value"] == "poll" and "higher peak IOPS" in tie["decision"]


def test_a_single_repeat_cannot_decide():
    data = _completion_only(0.5, 2.0)
    result = polling.analyze(data[data["repeat"] == 0], runs_frame(["polling"]))
    row = rec(result, "completion")
    assert row["suggested value"] == "event" and row["decision"].startswith("cannot decide")
    assert result.findings[0].startswith("Cannot tell whether the p99 latency")
    assert "only one repeat on a side" in result.findings[0]


def test_idle_poll_without_a_clear_gain_keeps_zero():
    data = polling_measurements()
    idle = data["leg"] == "idle_poll"
    others = idle & (data["idle_poll_us"] > 0)
    base = data.loc[idle & (data["idle_poll_us"] == 0), "lat_p99_ns"].mean()
    # every period 0.5 % below no idle polling, with the fixture's ±1 % spread over the repeats
    data.loc[others, "lat_p99_ns"] = base * 0.995 * data.loc[others, "repeat"].map(dict(enumerate((0.99, 1.0, 1.01))))
    row = rec(polling.analyze(data, runs_frame([])), "idle_poll")
    assert row["suggested value"] == "0 µs" and row["decision"] == "no clear winner: keep the default"
    # identical repeats are no interval, not certainty: the rule cannot decide
    data.loc[others, "lat_p99_ns"] = base * 0.9
    row = rec(polling.analyze(data, runs_frame([])), "idle_poll")
    assert row["suggested value"] == "0 µs" and row["decision"].startswith("cannot decide")


def test_reactor_polling_and_idle_polling_are_not_recommended_together():
    data = polling_measurements()
    matrix = data["leg"] == "matrix"
    # make poll/poll the clear winner of the matrix: target_mode = poll is then chosen
    cell = matrix & (data["completion"] == "poll") & (data["target_mode"] == "poll") & (data["iodepth"] == 1)
    data.loc[cell, "lat_p99_ns"] *= 0.8
    result = polling.analyze(data, runs_frame([]))
    assert rec(result, "matrix")["suggested value"] == "poll"
    idle = rec(result, "idle_poll")
    assert idle["suggested value"] == "0 µs" and idle["decision"].startswith("redundant with target_mode = poll")
    assert polling.recommended_knobs(data) == {"completion": "poll", "target_mode": "poll"}


def test_idle_poll_leg_runs_under_the_completion_the_completion_leg_chose(tmp_path):
    from nvmflab.studies import polling as polling_study

    measured = polling_measurements()
    ctx = SimpleNamespace(planning=False, measurements=lambda leg: measured[measured["leg"] == leg])
    assert polling_study.chosen_completion(ctx) == {"completion": "poll"}
    noisy = _completion_only(0.995, 1.0)
    ctx = SimpleNamespace(planning=False, measurements=lambda leg: noisy)
    assert polling_study.chosen_completion(ctx) == {}  # no clear winner: the spec's own completion


# -- configuration carried over ----------------------------------------------------------------

def test_carry_over_applies_decided_knobs_and_leaves_out_what_a_stack_refuses(tmp_path, monkeypatch):
    from nvmflab.spec import Spec

    (tmp_path / study_common.ResultsStore.FILENAME).write_text("")
    measured = polling_measurements()

    class FakeStore:
        FILENAME = study_common.ResultsStore.FILENAME

        def __init__(self, _path):
            pass

        def measurements(self):
            return measured

    monkeypatch.setattr(study_common, "ResultsStore", FakeStore)
    spec, applied, refused = study_common.carry_over(Spec(study="interference"), tmp_path)
    assert applied == {"completion": "poll", "idle_poll_us": 10, "target_mode": "event"} and refused == {}
    assert spec.knobs.completion == "poll" and "completion" in spec.knobs.model_fields_set
    assert spec.knobs.idle_poll_us == 10
    # a stack that cannot honour a chosen value keeps its own, and the refusal is named
    spdk_target = Spec.model_validate({"study": "interference", "stack": {"target": "spdk", "host": "ours"}})
    spec, applied, refused = study_common.carry_over(spdk_target, tmp_path)
    assert applied.get("completion") == "poll"
    assert set(refused) and all("spdk" in why for why in refused.values()), refused
    assert study_common.carry_over(Spec(), tmp_path / "missing")[1] == {}


# -- interference: achieved load, guidelines, control -------------------------------------------

def _stuck_background(limit_pct: float = 40.0) -> pd.DataFrame:
    """Target leg, L-app: interference harmless everywhere, the background never above `limit_pct`."""
    out = rows("interference", "target", [{"role": "fg", "iodepth": 1, "iops": 9e3, "p99_ns": 100_000.0,
                                          "point_id": "iso"}])
    saturation_iops = 100_000.0
    for load in (20, 40, 60, 90, math.inf):
        pid = f"p{load}"
        out += rows("interference", "target", [{"role": "fg", "iodepth": 1, "bg_load_pct": load, "iops": 9e3,
                                              "p99_ns": 110_000.0, "point_id": pid}])
        requested = saturation_iops * load / 100 if not math.isinf(load) else 0
        achieved = min(saturation_iops * (load if not math.isinf(load) else 100) / 100,
                       saturation_iops * limit_pct / 100)
        out += rows("interference", "target", [{"role": "bg", "iodepth": 32, "bg_load_pct": load, "point_id": pid,
                                              "rate_iops": requested, "iops": achieved}])
    return frame(out)


def test_a_background_stuck_at_40_percent_bounds_the_guideline_at_40():
    result = interference.analyze(_stuck_background(), runs_frame(["interference"]))
    guide = result.recommendations.set_index("application").loc["L-app"]
    # Keyed on requested load the guideline would have read 90 %; nothing above 40 % was measured.
    assert guide["keep background load at or below"] == "40 %"
    assert guide["highest load reached"] == "40 %"
    text = " ".join(result.findings)
    assert "reached no more than 40 %, so nothing is known about higher loads" in text
    assert "90 %" not in guide["keep background load at or below"]
    labels = list(table(result, "Interference per background load")["bg load"])
    assert "60 % asked, reached 40 %" in labels and "90 % asked, reached 40 %" in labels
    assert "max (reached 40 %)" in labels


def test_guideline_thresholds_come_from_the_spec_and_the_knee_is_reported():
    runs = runs_frame(["interference"]).assign(env_json=json.dumps(
        {"spec_effective": {"params": {"latency_limit": 5.0, "sustained_limit": 0.5}}}))
    result = interference.analyze(interference_measurements(), runs)
    guide = result.recommendations.set_index(["resource", "application"])
    assert guide.at[("shared target core", "L-app"), "criterion"] == "p99 below 5× isolated"
    assert guide.at[("shared target core", "L-app"), "keep background load at or below"] == "60 %"
    assert guide.at[("shared target core", "T-app (QD128)"), "keep background load at or below"] == "85 %"
    assert guide.at[("shared target core", "L-app"), "largest jump"].startswith(
        "3.20× → 6.80× between 60 % and 70 % achieved load")
    # a flat curve's largest step is within the noise, and says so
    assert "no knee" in guide.at[("shared initiator core", "L-app"), "largest jump"]


def test_stayed_near_only_inside_the_measured_spread():
    data = interference_measurements()
    # initiator L-app: 38.0, 38.2, 38.4× with ±1 % repeats is flat; 30× vs 38× is not
    flat = " ".join(interference.analyze(data, runs_frame([])).findings)
    assert "latency interference stayed near 38.20×" in flat
    changed = data.copy()
    point = (changed["point_id"] == "initiator-1-20") & (changed["role"] == "fg")
    changed.loc[point, "lat_p99_ns"] *= 30 / 38
    text = " ".join(interference.analyze(changed, runs_frame([])).findings)
    assert "Shared initiator core, L-app (isolated p99 100.0 µs): latency interference went from 30.00× at 20 %" in text


def test_control_judges_with_the_interval_and_claims_only_what_it_measured():
    data = interference_measurements()
    loaded = (data["point_id"] == "control-1-inf") & (data["role"] == "fg")
    data.loc[loaded, "lat_p99_ns"] *= 1.2 / 1.02  # 1.2× with ±1 % repeats: a clear change
    text = " ".join(interference.analyze(data, runs_frame([])).findings)
    assert "Control (shared network only), L-app" in text
    assert "a measurable change in p99" in text
    one = interference_measurements()
    text = " ".join(interference.analyze(one[one["repeat"] == 0], runs_frame([])).findings)
    assert "fewer than two repeats (or repeats without spread), so no interval: the control cannot judge" in text


# -- saturation: peak, knee, confirmed limit -----------------------------------------------------

def _with_utilization(data: pd.DataFrame, leg: str, host_cpu: float, reactor_busy: float) -> pd.DataFrame:
    data = data.copy()
    mine = data["leg"] == leg
    data.loc[mine, "usr_cpu"] = host_cpu / 2
    data.loc[mine, "sys_cpu"] = host_cpu / 2
    counters = {"reactors": [{"index": 0, "busy_ns": int(reactor_busy * 1e9), "idle_ns": int((1 - reactor_busy) * 1e9)}]}
    data.loc[mine, "target_counters_json"] = json.dumps(counters)
    data.loc[mine, "knobs_json"] = json.dumps({"host_cores": "1,3" if leg == "target" else "1", "target_cores": "0"})
    return data


def test_a_target_core_saturation_with_an_idle_reactor_is_not_confirmed():
    data = _with_utilization(saturation_measurements(), "target", host_cpu=150.0, reactor_busy=0.6)
    data = _with_utilization(data, "initiator", host_cpu=98.0, reactor_busy=0.5)
    t = table(saturation.analyze(data, runs_frame([])), "Saturation points").set_index("Resource")
    assert t.at["Target core", "Limit confirmed"].startswith("no: the target reactor was 40 % idle at the peak")
    assert t.at["Target core", "Host busy at peak (%)"] == pytest.approx(75.0)  # 150 % over two cores
    assert t.at["Initiator core", "Limit confirmed"] == "yes (host core 98 % busy)"
    unknown = table(saturation.analyze(saturation_measurements(), runs_frame([])), "Saturation points")
    assert unknown.set_index("Resource").at["Target core", "Limit confirmed"].startswith("unknown")


def test_interference_caps_on_the_calibration_peak_not_the_knee():
    calibration = saturation_measurements(("initiator",))
    calibration = calibration[calibration["numjobs"] == 1]
    # the single-job curve's knee (5 % rule) lies at QD64 (123 K); the cap uses the peak, 128.24 K
    assert peak_iops(calibration) == pytest.approx(128_240.0)


# -- studies: layout, invariant, interleaving --------------------------------------------------

def _ctx(repeats=3):
    from nvmflab.spec import Spec

    spec = Spec.model_validate({"study": "interference", "repeats": repeats,
                                "topology": {"target_cores": [0, 1], "host_cores": [2, 3, 4]}})
    return SimpleNamespace(spec=spec)


def test_repeats_are_interleaved_round_by_round():
    built = study_common.repeated(_ctx(), [{"a": 1}, {"a": 2}, {"a": 1}], lambda k, r: (k["a"], r))
    assert built == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]
    items = [({"a": 1}, lambda k, r: ("x", r)), ({"a": 2}, lambda k, r: ("y", r))]
    assert interference_study.interleaved(_ctx(2), items) == [("x", 0), ("y", 0), ("x", 1), ("y", 1)]


def test_target_leg_keeps_a_spare_reactor_and_controls_match_each_legs_job_count():
    ctx = SimpleNamespace(spec=_ctx().spec)
    target = interference_study.layout(ctx, "target")
    assert target.target == (0, 1) and target.fg_reactor == target.bg_reactor == 0  # reactor 1 is spare
    assert len(interference_study.layout(ctx, "control_target").bg_host) == 2
    assert len(interference_study.layout(ctx, "control_initiator").bg_host) == 1


def _perf(completed: int, ramp: int | None) -> dict:
    job = {"read": {"total_ios": completed}, "write": {"total_ios": 0}}
    extra = {"nvmflab": {"jobs": [{"ramp_ios": ramp}]}} if ramp is not None else {}
    return {"jobs": [job]} | extra


def _stats(fg_on_0: int, fg_on_1: int = 0) -> dict:
    def ns(n):
        return [{"subnqn": "fg", "commands": n}] if n else []
    return {"reactors": [{"index": 0, "namespaces": ns(fg_on_0)}, {"index": 1, "namespaces": ns(fg_on_1)}]}


def test_fg_commands_are_checked_exactly_when_the_ramp_is_reported():
    lay = interference_study.Layout((0,), (1, 2), (0, 1), 0, 0, "reactor")
    check = interference_study._invariant(lay, "fg", "bg", runtime=10, ramp_time=2, fg_iodepth=1)
    assert check({"fg": _perf(1000, 200)}, _stats(1200))[0] is True
    ok, detail = check({"fg": _perf(1000, 200)}, _stats(1201))
    assert not ok and "expected exactly 1200 = 1000 measured + 200 ramp" in detail
    ok, detail = check({"fg": _perf(1000, 200)}, _stats(1100, 100))  # a queue on the spare reactor
    assert not ok and "served by reactors {1: 100}" in detail
    # without a ramp count the bound is loose, and says so: 1000..1000*(10+6)/10+1
    assert check({"fg": _perf(1000, None)}, _stats(1601))[0] is True
    ok, detail = check({"fg": _perf(1000, None)}, _stats(1602))
    assert not ok and "loose" in detail


def test_guideline_uses_the_ratio_interval_and_says_when_there_is_none():
    data = interference_measurements()
    # target L-app at 10 %: 1.5× on average, but one repeat far off: the mean stays under 2×, the
    # interval (isolated variance included) reaches past it, so 10 % is no longer safe
    point = (data["point_id"] == "target-1-10") & (data["role"] == "fg")
    data.loc[point, "lat_p99_ns"] = [100_000.0, 150_000.0, 200_000.0]
    guide = interference.analyze(data, runs_frame(["interference"])).recommendations.set_index(
        ["resource", "application"]).loc[("shared target core", "L-app")]
    assert guide["keep background load at or below"] == "none"
    assert guide["by the means alone"] == "20 %"
    # one repeat: no interval at any load, so no load is called safe, and the finding says why
    single = interference_measurements()
    single = single[single["repeat"] == 0]
    result = interference.analyze(single, runs_frame(["interference"]))
    guide = result.recommendations.set_index(["resource", "application"]).loc[("shared target core", "L-app")]
    assert guide["keep background load at or below"] == "none" and guide["by the means alone"] == "20 %"
    assert "(no interval at one of the two loads, so not judged)" in guide["largest jump"]
    assert any("no load can be called safe" in f and "has no 95 % interval" in f for f in result.findings)


def test_interference_table_shows_the_interval_the_guideline_is_judged_on():
    result = interference.analyze(interference_measurements(), runs_frame(["interference"]))
    t = table(result, "Interference per background load")
    row = t[(t["leg"] == "target") & (t["app"] == "L-app") & (t["requested bg load"] == "20 %")].iloc[0]
    low, high = (float(v) for v in row["95 % interval (×)"].split("–"))
    assert low < row["latency interference (×)"] < high < 2.0  # the guideline's 20 %: upper end under 2×
    single = interference_measurements()
    t1 = table(interference.analyze(single[single["repeat"] == 0], runs_frame([])), "Interference per background load")
    assert set(t1["95 % interval (×)"]) == {"no interval"}


# -- issue 37: detectable effect, the pick among k, undecided reads as undecided -------------------

def test_detectable_is_the_power_formula_and_nan_without_an_interval():
    from scipy.stats import t

    from nvmflab.analysis import decide

    # se = sqrt(2/3), Welch dof = 4
    expected = (t.ppf(0.975, 4) + t.ppf(0.8, 4)) * math.sqrt(2 / 3)
    assert float(decide.detectable_summary(1.0, 3, 1.0, 3)) == pytest.approx(expected)
    wider = decide.detectable_summary([1.0, 1.0, 1.0, 0.0], [3, 3, 1, 3], [1.0] * 4, [3] * 4, family=[3, 1, 1, 1])
    assert wider[0] > expected and math.isnan(wider[2]) and math.isnan(wider[3])
    a, b = [10.0, 11.0, 12.0], [10.5, 12.0, 13.0]
    assert float(decide.detectable(a, b)) == pytest.approx(float(decide.detectable_summary(1.0, 3, 1.25, 3)),
                                                           rel=1e-2)


def test_detectable_effect_is_found_about_80_percent_of_the_time():
    from nvmflab.analysis import decide

    rng = np.random.default_rng(37)
    shift = float(decide.detectable_summary(1.0, 5, 1.0, 5))
    a = rng.normal(0.0, 1.0, size=(4000, 5))
    b = rng.normal(shift, 1.0, size=(4000, 5))
    power = float(decide.clear(decide.welch(a, b)[2]).mean())
    assert 0.7 <= power <= 0.9


def test_pick_best_needs_a_clear_win_over_every_other():
    from nvmflab.analysis import decide

    low, high, near = [1.0, 1.1, 0.9], [5.0, 5.1, 4.9], [2.0, 2.1, 1.9]
    assert int(decide.pick_best([low, high, near])) == 1
    assert int(decide.pick_best([low, high, near], higher_is_better=False)) == 0
    assert int(decide.pick_best([low, high, [5.0, 5.2, 4.8]])) == -1  # a tie for best
    assert int(decide.pick_best([low, high, [9.0, np.nan, np.nan]])) == -1  # one repeat: best unknown
    assert int(decide.pick_best([low, high, [np.nan] * 3])) == 1  # not measured: no part
    assert int(decide.pick_best([[np.nan] * 3] * 2)) == -1
    # A/A: k equal configurations, a pick is a false positive; Holm keeps them at most 5 %
    rng = np.random.default_rng(1)
    picks = decide.pick_best(rng.normal(size=(3000, 4, 3)))
    assert picks.shape == (3000,) and float((picks >= 0).mean()) <= 0.05


def test_difference_carries_se_dof_and_its_detectable_effect():
    from nvmflab.analysis import decide
    from nvmflab.analysis.common import compare_values, corrected

    a, b = [10.0, 11.0, 12.0], [10.5, 12.0, 13.0]
    d = compare_values(a, b)
    assert d.detectable == pytest.approx(float(decide.detectable(a, b)))
    family = corrected([d, compare_values(a, [20.0, 21.0, 23.0])])
    assert family[0].se == d.se and family[0].dof == d.dof and family[0].detectable > d.detectable
    assert math.isnan(compare_values([10.0], b).detectable)
    row_a = {"iops_mean": 100.0, "iops_std": 2.0, "iops_n": 3}
    row_b = {"iops_mean": 103.0, "iops_std": 2.0, "iops_n": 3}
    assert compare(row_a, row_b, "iops").detectable == pytest.approx(float(decide.detectable_summary(2, 3, 2, 3)))


def _us(v):
    return f"{v:.1f} µs"


def test_undecided_reads_as_undecided():
    from nvmflab.analysis.common import claim, compare_values, corrected, descriptive, stated

    same = compare_values([10.0, 11.0, 12.0], [10.5, 12.0, 13.0])
    text = stated(same, _us, "raised by 8 %", "11.8 vs 11.0 µs")
    assert text.startswith("no clear difference (11.8 vs 11.0 µs; 95 % interval of the difference −1.8 to +3.5 µs; ")
    assert "an effect larger than ±3.5 µs (±32 % of 11.0 µs) would have been seen with 80 % power at these 3 repeats" in text
    assert "raised" not in text
    sentence = claim(same, _us, "Polling raised p99 by 8 %", "p99 latency", "11.8 vs 11.0 µs")
    assert sentence.startswith("No clear difference in p99 latency (11.8 vs 11.0 µs; 95 %") and "±3.5 µs" in sentence
    one = compare_values([10.0], [12.0, 13.0])
    assert one.verdict("raised") == "cannot decide (only one repeat on a side)"
    assert stated(one, _us, "raised", "12.5 vs 10.0 µs") == "cannot decide (only one repeat on a side; 12.5 vs 10.0 µs)"
    assert claim(one, _us, "raised", "p99 latency") == "Cannot tell whether p99 latency changed (only one repeat on a side)"
    up = compare_values([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    assert claim(up, _us, "Polling raised p99", "p99 latency") == (
        "Polling raised p99 (95 % interval of the difference +7.7 to +12.3 µs)")
    assert descriptive("Peak 3 µs.") == "Peak 3 µs (descriptive, not tested)."


def test_lost_to_holm_says_so_with_the_family_size():
    from nvmflab.analysis.common import compare_values, corrected, stated

    base = [10.0, 11.0, 12.0]
    family = corrected([compare_values(base, [12.6, 13.6, 14.6])] +
                       [compare_values(base, [10.0, 11.0, 12.1]) for _ in range(5)])
    lost = family[0]
    assert lost.lost_to_holm and lost.family == 6
    text = stated(lost, _us, "raised")
    assert text.startswith("no clear difference (95 % interval of the difference +0.")
    assert "which excludes zero alone, not after Holm over 6 comparisons" in text
    assert "would have been seen with 80 % power" in text
