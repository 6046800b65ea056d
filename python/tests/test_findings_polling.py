"""Issue 37 for the polling study: every sentence that states a change, a pick or its absence is
decided (Welch's interval, Holm over its family) or says it cannot be."""

from test_analysis_fixtures import polling_measurements, runs_frame

from nvmflab.analysis import polling


def _findings(data):
    return polling.analyze(data, runs_frame(["polling"])).findings


def _scale(data, mask, column, factor):
    data = data.copy()
    data.loc[mask, column] = data.loc[mask, column] * factor
    return data


def test_a_p99_change_inside_its_interval_leads_with_no_clear_difference():
    data = polling_measurements()
    data = data[data["leg"] == "completion"]
    # poll's QD1 p99 0.3 % above event's, with ±1 % repeats: the interval includes zero
    qd1 = (data["iodepth"] == 1)
    data = _scale(data, qd1 & (data["completion"] == "poll"), "lat_p99_ns", 127_140.0 * 1.003 / 115_200.0)
    first = _findings(data)[0]
    assert first.startswith("No clear difference in the p99 latency at QD1 between completion = poll and event ("), first
    assert "raised" not in first and "lowered" not in first
    assert "would have been seen with 80 % power at these 3 repeats" in first


def test_peak_iops_and_context_switches_carry_their_intervals():
    findings = _findings(polling_measurements())
    assert ("Host completion polling raised the peak IOPS by 14.5 % (114.2 KIOPS at QD64 → 130.7 KIOPS at QD64, "
            "each mode's repeats at its own peak queue depth; Holm over p99 and peak IOPS; 95 % interval of the "
            "difference +13.71 to +19.31 KIOPS).") == findings[1]
    assert findings[2].startswith("At QD256 polling lowered the load generator's context switches by 99.0 % "
                                  "(12,800,000 → 128,000; 95 % interval of the difference −")


def test_idle_poll_periods_within_their_intervals_are_not_a_change():
    data = polling_measurements()
    idle = (data["leg"] == "idle_poll") & (data["iodepth"] == 1) & (data["idle_poll_us"] > 0)
    data.loc[idle, "lat_p99_ns"] = data.loc[idle, "lat_p99_ns"] / data.loc[idle, "lat_p99_ns"].round(-3) * 116_300.0
    findings = [f for f in _findings(data) if "idle polling" in f]
    assert findings[0].startswith("No clear difference in p99 at QD1 between target idle polling with completion = "
                                  "event at 10, 20, 40, 80, 160 µs and none (Holm over 5 periods; the closest call"), findings
    assert not any("changed p99" in f or "lowered p99" in f for f in findings)


def test_a_clear_idle_poll_period_states_its_corrected_interval():
    findings = _findings(polling_measurements())
    assert ("Target idle polling at 40 µs with completion = event lowered p99 at QD1 by 10.6 % (116.00 µs at 0 µs → "
            "103.71 µs; Holm over 5 periods; 95 % interval of the difference −14.80 to −9.78 µs).") in findings


def test_the_matrix_pick_is_clear_against_every_other_cell():
    pick = next(f for f in _findings(polling_measurements()) if f.startswith("Of the 4 combinations"))
    assert pick.startswith("Of the 4 combinations, completion = poll with target_mode = event had the lowest p99 at "
                           "QD1 (102.2 µs), clearly below every other (Holm over the 3 comparisons with it; against "
                           "the runner-up, completion = poll with target_mode = poll (106.7 µs)"), pick
    assert "95 % interval of the difference +2.07 to +6.81 µs" in pick


def test_near_equal_matrix_cells_give_no_clear_best():
    data = polling_measurements()
    cell = (data["leg"] == "matrix") & (data["iodepth"] == 1)
    # every cell within 0.5 % of 110 µs, repeats ±1 %: no cell is clearly the lowest
    for i, (c, t) in enumerate([("poll", "poll"), ("event", "poll"), ("poll", "event"), ("event", "event")]):
        mine = cell & (data["completion"] == c) & (data["target_mode"] == t)
        data.loc[mine, "lat_p99_ns"] = data.loc[mine, "lat_p99_ns"] / data.loc[mine, "lat_p99_ns"].mean() * (
            110_000.0 * (1 + 0.0015 * i))
    findings = _findings(data)
    pick = next(f for f in findings if "combinations" in f)
    assert pick.startswith("No clear difference in p99 at QD1 between completion = poll with target_mode = poll "
                           "(the lowest mean, 110.0 µs) and "), pick
    assert "(Holm over the 3 comparisons with it: other − best; 95 % interval of the difference" in pick
    assert pick.endswith("would have been seen with 80 % power at these 3 repeats), so no clear best among the 4 "
                         "combinations."), pick
    assert "had the lowest p99" not in "\n".join(findings)
