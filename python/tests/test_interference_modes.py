"""The interference study under both host completion modes, and the exact command-count invariant.

The thesis (§6.3) measured a flat ~38× initiator latency interference with fio polling and
suspected the polling without testing it; the analysis tests it with the interval of poll − event.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
from test_analysis_fixtures import frame, rows

from nvmflab.analysis import interference
from nvmflab.spec import Spec
from nvmflab.studies import interference as study

ISO_P99 = 100_000.0
SATURATION = 100_000.0


def measurements(factors: dict[str, float], loads=(20, 60, math.inf), repeats: int | None = None,
                 tapp: dict[str, float] | None = None) -> pd.DataFrame:
    """Initiator leg, one curve per completion mode: L-app p99 = factor × isolated at every load
    (T-app IOPS = tapp share of isolated when given); the background reaches what it was asked."""
    out = []
    for mode, factor in factors.items():
        apps = [(1, factor, 1.0)] + ([(32, 1.0, tapp[mode])] if tapp else [])
        for qd, lat, share in apps:
            base = {"role": "fg", "iodepth": qd, "completion": mode}
            out += rows("interference", "initiator", [base | {"iops": 9e3 * qd, "p99_ns": ISO_P99,
                                                              "point_id": f"{mode}-{qd}-iso"}])
            for load in loads:
                pid = f"{mode}-{qd}-{load}"
                out += rows("interference", "initiator", [base | {
                    "bg_load_pct": load, "iops": 9e3 * qd * share, "p99_ns": ISO_P99 * lat, "point_id": pid}])
                capped = not math.isinf(load)
                out += rows("interference", "initiator", [{
                    "role": "bg", "iodepth": 32, "completion": mode, "bg_load_pct": load, "point_id": pid,
                    "rate_iops": SATURATION * load / 100 if capped else 0,
                    "iops": SATURATION * (load if capped else 40) / 100}])
    data = frame(out)
    return data[data["repeat"] < repeats] if repeats else data


def analyze(data: pd.DataFrame):
    return interference.analyze(data, pd.DataFrame())


def hypothesis_table(result) -> pd.DataFrame:
    return next(t.frame for t in result.tables if t.title.startswith("Initiator interference: completion"))


def test_polling_hypothesis_is_supported_when_poll_is_clearly_worse():
    result = analyze(measurements({"event": 3.0, "poll": 38.0}, tapp={"event": 0.95, "poll": 0.49}))
    text = " ".join(result.findings)
    assert "Polling hypothesis (supported): The thesis's hypothesis (§6.3)" in text
    assert "clearly worse at 6 of 6 (application, load) points" in text
    assert "3.00–3.00× with completion event, 38.00–38.00× with completion poll (the thesis: ~38×)" in text
    table = hypothesis_table(result).set_index(["app", "requested bg load"])
    assert table.at[("L-app", "60 %"), "event"] == "3.00×" and table.at[("L-app", "60 %"), "poll"] == "38.00×"
    assert table.at[("L-app", "60 %"), "verdict"] == "worse with poll"
    assert table.at[("T-app (QD32)", "max"), "verdict"] == "worse with poll"  # less throughput sustained
    assert table.at[("L-app", "20 %"), "poll − event (95 % interval)"].startswith("+35.00× ± ")
    # each mode keeps its own curve, guideline and achieved load
    curves = interference._curves(measurements({"event": 3.0, "poll": 38.0}))
    assert set(curves["completion"]) == {"event", "poll"}
    assert "Shared initiator core, completion poll, L-app (isolated p99 100.0 µs)" in text
    assert set(result.recommendations["completion"]) == {"event", "poll"}


def test_polling_hypothesis_is_contradicted_when_event_is_worse():
    text = " ".join(analyze(measurements({"event": 38.0, "poll": 3.0})).findings)
    assert "Polling hypothesis (contradicted)" in text
    assert "clearly lower with polling at 3 of 3" in text


def test_equal_modes_within_noise_show_no_clear_difference():
    # the fixture's ±1 % repeat spread around equal means: every interval of poll − event includes 0
    result = analyze(measurements({"event": 38.0, "poll": 38.0}))
    text = " ".join(result.findings)
    assert "Polling hypothesis (no clear difference)" in text
    assert "is neither supported nor contradicted by this run" in text
    assert set(hypothesis_table(result)["verdict"]) == {"no clear difference"}


def test_one_repeat_cannot_decide_and_one_mode_is_untested():
    text = " ".join(analyze(measurements({"event": 3.0, "poll": 38.0}, repeats=1)).findings)
    assert "Polling hypothesis (undecided)" in text and "fewer than two repeats" in text
    text = " ".join(analyze(measurements({"event": 3.0})).findings)
    assert "Polling hypothesis (untested)" in text and "completion event only" in text
    # a single mode keeps the single-mode wording (no "completion" in the leg's name)
    assert "Shared initiator core, L-app (isolated p99" in text


def test_each_mode_is_calibrated_on_its_own_saturation_point():
    data = measurements({"event": 3.0, "poll": 3.0})
    # poll's background was capped at rates implying twice event's saturation point, and reached them
    bg = (data["role"] == "bg") & (data["completion"] == "poll")
    data.loc[bg, "rate_iops"] *= 2
    data.loc[bg, "iops"] *= 2
    curves = interference._curves(data)
    capped = curves[~curves["bg_load_pct"].map(math.isinf)]
    assert capped["achieved_pct"].tolist() == pytest.approx([20.0, 60.0, 20.0, 60.0])


# -- the study: modes, interleaving, invariant --------------------------------------------------

def _ctx(spec: dict) -> SimpleNamespace:
    notes = []
    return SimpleNamespace(spec=Spec.model_validate({"study": "interference"} | spec),
                           console_note=notes.append, notes=notes)


def test_modes_default_to_the_carried_over_completion_and_refuse_duplicates():
    ctx = _ctx({"knobs": {"completion": "poll"}})
    assert study.modes(ctx, study.Params()) == ["poll"]
    assert study.modes(ctx, study.Params(completion=["event", "poll"])) == ["event", "poll"]
    with pytest.raises(ValueError, match="names a mode twice"):
        study.Params(completion=["poll", "poll"])
    with pytest.raises(ValueError):
        study.Params(completion=["interrupt"])


def _perf(measured: int, ramp: int | None, verified: int = 0, jobs: int = 1) -> dict:
    report = {"jobs": [{"read": {"total_ios": measured // jobs}, "write": {"total_ios": 0}}] * jobs}
    if ramp is not None:
        report["nvmflab"] = {"jobs": [{"ramp_ios": ramp // jobs, "verified_ios": verified}] * jobs}
    return report


def _stats(fg: dict[int, int], bg: dict[int, int]) -> dict:
    return {"reactors": [{"index": r, "namespaces": [{"subnqn": "fg", "commands": fg.get(r, 0)},
                                                       {"subnqn": "bg", "commands": bg.get(r, 0)}]}
                         for r in (0, 1)]}


def test_invariant_is_exact_for_both_roles_when_the_ramp_is_reported():
    lay = study.Layout((0,), (0,), (0, 1), 0, 1, "host")
    check = study._invariant(lay, "fg", "bg", runtime=1, ramp_time=0.5, fg_iodepth=1)
    ok, detail = check({"fg": _perf(1000, 300), "bg": _perf(5000, 2000, jobs=2)}, _stats({0: 1300}, {1: 7000}))
    assert ok, detail
    assert detail == ("fg: reactor 0 served 1300 commands = 1000 measured + 300 ramp (exact); "
                      "bg: reactor 1 served 7000 commands = 5000 measured + 2000 ramp (exact)")
    # one command too many for the background: the point is invalid, and the detail says how
    ok, detail = check({"fg": _perf(1000, 300), "bg": _perf(5000, 2000, jobs=2)}, _stats({0: 1300}, {1: 7001}))
    assert not ok and detail == ("bg: reactor 1 served 7001 commands, expected exactly 7000 = 5000 measured + "
                                 "2000 ramp (exact: the load generator reports its ramp I/O)")
    # a verify read-back counts too
    ok, detail = check({"fg": _perf(1000, 300, verified=50)}, _stats({0: 1350}, {}))
    assert ok and "= 1000 measured + 300 ramp + 50 verify (exact)" in detail
    # a load generator without the count (fio, spdk_nvme_perf) keeps the loose bound, and says so
    ok, detail = check({"fg": _perf(1000, None)}, _stats({0: 1400}, {}))
    assert ok and "loose" in detail and "(exact)" not in detail
