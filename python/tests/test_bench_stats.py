"""bench/nvmfbench: the arithmetic of `make bench` (medians over clean runs, ratios, goals,
memory per queue, core split), fed synthetic runs; nothing is started."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from nvmfbench import goals, matrix, memory, report, scaling, stats  # noqa: E402
from nvmfbench.stacks import Work  # noqa: E402


def run(target, host, work, iops, mean_us, noisy=False, bw=None, p9999_us=None, **extra):
    return {"target": target, "host": host, "work": work, "iops": iops, "bw_bytes": bw if bw is not None else iops * 4096,
            "lat_mean_ns": mean_us * 1000, "lat_p99_99_ns": None if p9999_us is None else p9999_us * 1000,
            "noisy": noisy, "noise_pct": 50.0 if noisy else 1.0} | extra


def test_noisy_runs_are_left_out_of_the_median_and_counted():
    runs = [run("ours", "ours", "w", 100, 10), run("ours", "ours", "w", 120, 9),
            run("ours", "ours", "w", 5, 99, noisy=True)]
    c = stats.cell(runs)
    assert c["iops"] == 110  # median of 100 and 120; the noisy 5 would have made it 100
    assert (c["used"], c["noisy"], c["runs"]) == (2, 1, 3)
    assert c["note"] == "1 of 3 runs noisy, left out"
    assert c["iops_range"] == [100, 120]


def test_p99_99_is_taken_over_every_clean_sample_not_as_a_median_of_runs():
    # One run of three had ten 500 µs outliers in 10,000 I/Os. Per run, p99.99 is 500, 10 and 10
    # µs, whose median (10) hides the tail; over all 30,000 samples the 10 outliers are p99.99.
    calm = [[10_000, 10_000]]
    tail = [[10_000, 9_990], [500_000, 10]]
    runs = [run("o", "o", "w", 100, 10, p9999_us=500, histogram=tail),
            run("o", "o", "w", 100, 10, p9999_us=10, histogram=calm),
            run("o", "o", "w", 100, 10, p9999_us=10, histogram=calm),
            run("o", "o", "w", 100, 10, noisy=True, p9999_us=9000, histogram=[[9_000_000, 10_000]])]
    c = stats.cell(runs)
    assert c["lat_p99_99_pooled"] is True
    assert c["lat_p99_99_ns"] == 500_000, "the noisy run's 9 ms is left out, the clean tail is kept"
    assert c["lat_p99_99_ns_range"] == [10_000, 500_000]
    # Without a histogram in every clean run, the median of the runs' own values stands.
    runs[1].pop("histogram")
    c = stats.cell(runs)
    assert (c["lat_p99_99_pooled"], c["lat_p99_99_ns"]) == (False, 10_000)


def test_all_noisy_falls_back_to_every_run_and_says_so():
    runs = [run("s", "s", "w", v, 10, noisy=True) for v in (10, 30, 20)]
    c = stats.cell(runs)
    assert c["iops"] == 20 and c["used"] == 3
    assert c["note"].startswith("all 3 runs noisy")


def test_failed_runs_measure_nothing():
    runs = [{"target": "s", "host": "s", "work": "w", "error": "boom"}, run("s", "s", "w", 7, 1)]
    c = stats.cell(runs)
    assert c["iops"] == 7 and c["used"] == 1
    assert stats.cell([{"error": "x"}])["note"] == "no run finished"


def test_ratio_refuses_missing_or_zero_baselines():
    assert stats.ratio(3.0, 2.0) == 1.5
    assert stats.ratio(None, 2.0) is None and stats.ratio(3.0, 0.0) is None and stats.ratio(3.0, None) is None


def test_comparison_rows_are_ratios_of_medians_per_pair():
    runs = []
    for iops_ss, iops_oo, iops_os, iops_so in ((100, 150, 90, 110), (102, 148, 91, 111), (98, 152, 89, 109)):
        runs += [run("spdk", "spdk", "q", iops_ss, 10), run("ours", "ours", "q", iops_oo, 8),
                 run("ours", "spdk", "q", iops_os, 11), run("spdk", "ours", "q", iops_so, 9)]
    rows = {r["comparison"]: r for r in stats.comparison_rows(stats.cells(runs), ["q"])}
    assert rows["ours x ours / SPDK x SPDK"]["iops_ratio"] == 1.5
    assert rows["our target / SPDK target, under spdk_nvme_perf"]["iops_ratio"] == 0.9
    assert rows["nvmf-perf / spdk_nvme_perf, on SPDK's target"]["iops_ratio"] == 1.1
    assert rows["ours x ours / SPDK x SPDK"]["lat_mean_ns_ratio"] == 0.8
    assert rows["ours x ours / SPDK x SPDK"]["lat_p99_99_ns_ratio"] is None  # no p99.99 recorded


def test_a_pair_that_did_not_run_gives_no_row():
    rows = stats.comparison_rows(stats.cells([run("ours", "ours", "q", 1, 1)]), ["q"])
    assert rows == []


@pytest.mark.parametrize("value,op,limit,expected", [
    (1.3, ">=", 1.2, "met"), (1.2, ">=", 1.2, "met"), (0.9, ">=", 1.2, "missed by 25.0 %"),
    (1.0, "<=", 1.1, "met"), (1.32, "<=", 1.1, "missed by 20.0 %"), (None, "<=", 1.1, "not measured")])
def test_verdict_says_met_or_by_how_much_it_missed(value, op, limit, expected):
    assert goals.verdict(value, op, limit) == expected


def test_goal_rows_use_the_floor_and_the_pairs():
    qd1, qd32, large = goals.QD1, goals.QD32, goals.LARGE
    runs = [run("spdk", "spdk", qd1, 70, 14, p9999_us=40), run("ours", "ours", qd1, 80, 12, p9999_us=50),
            run("spdk", "spdk", qd32, 500, 60, noisy=True), run("ours", "ours", qd32, 700, 45),
            run("spdk", "spdk", large, 30, 100, bw=4e9), run("ours", "ours", large, 20, 150, bw=2.4e9)]
    floor = {"busy": {"mean_ns": 10_000, "note": ""}, "blocking": {"mean_ns": 20_000, "note": "all 3 runs noisy: ..."}}
    rows = {r["goal"]: r for r in goals.goal_rows(stats.cells(runs), floor, {"lat_mean_ns": 30_000, "note": ""})}
    big = rows["128k randread QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.2"]
    assert big["value"] == 0.6 and big["status"] == "missed by 50.0 %"
    qd32_status = rows["4k randread QD32 IOPS: ours x ours / SPDK x SPDK >= 1.3"]["status"]
    assert qd32_status == f"met ({goals.NOISY})"  # 1.4, but SPDK's only run was noisy
    floor = rows["4k QD1 mean latency (ours x ours, polling) / busy ping-pong mean <= 1.1"]
    assert floor["value"] == 1.2 and floor["status"] == "missed by 9.1 %"
    assert rows["4k QD1 p99.99 latency: ours x ours / SPDK x SPDK <= 1.0"]["value"] == 1.25
    event = rows["event mode 4k QD1 mean latency (ours x ours) / blocking ping-pong mean <= 1.2"]
    assert event["value"] == 1.5 and event["status"] == f"missed by 25.0 % ({goals.NOISY})"  # its floor was noisy
    foreign = rows["4k randread QD1 IOPS under spdk_nvme_perf: our target / SPDK's >= 1.0"]
    assert foreign["value"] is None and foreign["status"] == "not measured"


def test_issue_40_item_3_asks_our_target_against_spdks_under_spdk_nvme_perf_on_six_works():
    works = {goals.QD1: "iops", goals.QD32: "iops", goals.QD128: "iops", goals.WRITE_QD32: "iops",
             goals.LARGE: "bw_bytes", goals.LARGE_WRITE: "bw_bytes"}
    runs = []
    for rnd in range(3):  # our target at 0.9x SPDK's at QD128, 1.1x elsewhere, in every round
        for work in works:
            ours = (90 if work == goals.QD128 else 110) + rnd
            runs += [run("ours", "spdk", work, ours, 50, bw=ours * 1e7, round=rnd),
                     run("spdk", "spdk", work, 100 + rnd, 50, bw=(100 + rnd) * 1e7, round=rnd)]
    rows = {r["goal"]: r for r in goals.goal_rows(stats.cells(runs), {}, None, "", runs)}
    for work, key in works.items():
        label = "bandwidth" if key == "bw_bytes" else "IOPS"
        row = rows[f"{work} {label} under spdk_nvme_perf: our target / SPDK's >= 1.0"]
        assert row["per_round"]["rounds"] == 3
        expected = "missed" if work == goals.QD128 else "met"  # medians 91 / 101 at QD128: missed by 9.9 %
        assert row["status"].split()[0] == expected and row["per_round"]["decided"] == expected, work


def test_pair_goals_carry_the_per_round_interval_and_which_side_of_the_goal_it_lies_on():
    large, qd1 = goals.LARGE, goals.QD1
    runs = []
    # ours x ours at 1.10-1.30x SPDK x SPDK in four rounds; round 4's SPDK run was noisy and its
    # pair is left out; ours' QD1 tail is 0.5x SPDK's in four rounds and 4x in one
    for rnd, (ours, spdk) in enumerate([(6.6, 6.0), (7.2, 6.0), (6.9, 6.0), (7.8, 6.0), (9.0, 6.0)]):
        runs += [run("ours", "ours", large, 50, 600, bw=ours * 1e9, round=rnd),
                 run("spdk", "spdk", large, 45, 700, bw=spdk * 1e9, round=rnd, noisy=rnd == 4)]
        runs += [run("ours", "ours", qd1, 80, 12, p9999_us=160 if rnd == 2 else 20, round=rnd),
                 run("spdk", "spdk", qd1, 70 + rnd, 14, p9999_us=40, round=rnd)]
    rows = {r["goal"]: r for r in goals.goal_rows(stats.cells(runs), {}, None, "", runs)}
    met = rows["128k randread QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.05"]["per_round"]
    assert met["rounds"] == 4 and met["decided"] == "met"
    assert met["mean"] == pytest.approx((1.1 * 1.2 * 1.15 * 1.3) ** 0.25, abs=1e-3)
    assert met["low"] < met["mean"] < met["high"] and met["low"] > 1.05
    undecided = rows["128k randread QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.2"]
    # the medians (7.2 / 6.0 GB/s) just meet 1.2; the rounds (1.19x on the geometric mean) cannot tell
    assert undecided["status"] == "met" and undecided["per_round"]["decided"] == "undecided"
    # p99.99 per round, from each run's own: 0.5x four times and 4x once
    tail = rows["4k QD1 p99.99 latency: ours x ours / SPDK x SPDK <= 1.0"]["per_round"]
    assert tail["rounds"] == 5 and tail["mean"] == pytest.approx((0.5 ** 4 * 4) ** 0.2, abs=1e-3)
    assert tail["decided"] == "undecided", "one round's tail must widen the interval across the goal"
    lower = rows["4k randread QD1 IOPS on SPDK's target: nvmf-perf / spdk_nvme_perf >= 1.0"]["per_round"]
    assert lower is None, "no such pair ran"
    text = report._goals({"matrix": [1], "goals": list(rows.values())})
    assert f"| {met['mean']:.2f}× ({met['low']:.2f}-{met['high']:.2f}, 4 rounds): met |" in text
    # without rounds (or with one) there is no interval
    assert goals.per_round([r for r in runs if r["round"] == 0], ("ours", "ours"), ("spdk", "spdk"), large,
                           "bw_bytes") is None
    clearly_short = goals.per_round(runs, ("spdk", "spdk"), ("ours", "ours"), large, "bw_bytes")
    assert clearly_short[2] < 1.0
    decided = lambda op, interval: goals._row("g", interval[0], op, 1.0, [], "", interval)["per_round"]["decided"]  # noqa: E731
    assert decided(">=", (0.8, 0.7, 0.9, 3)) == "missed" and decided(">=", (1.1, 1.01, 1.2, 3)) == "met"
    assert decided("<=", (1.2, 1.1, 1.3, 3)) == "missed" and decided("<=", (0.9, 0.8, 0.95, 3)) == "met"
    assert decided("<=", (0.9, 0.8, 1.05, 3)) == "undecided"


def test_vmrss_parsing_and_bytes_per_queue():
    status = "Name:\tnvmf-target\nVmPeak:\t  9999 kB\nVmRSS:\t    4032 kB\nThreads:\t3\n"
    assert memory.parse_vmrss(status) == 4032 * 1024
    assert memory.parse_vmrss("Name: x\n") is None
    points = [(1, 10_000 + 500), (100, 10_000 + 50_000), (1000, 10_000 + 500_000)]
    assert memory.bytes_per_queue(points) == pytest.approx(500)
    assert memory.bytes_per_queue([(5, 1), (5, 2)]) is None


def test_scaling_gives_the_target_half_the_cores_and_enough_depth():
    assert scaling.split_cores([0, 1]) == ([0], [1])
    assert scaling.split_cores([0, 1, 2, 3, 4, 5, 6, 7]) == ([0, 1, 2, 3], [4, 5, 6, 7])
    w = scaling.work_for(3, [4, 5, 6, 7])
    assert w.numjobs == 4 and w.numjobs * w.iodepth >= 3 * scaling.QUEUE_DEPTH_PER_REACTOR


def test_rounds_alternate_their_order_and_count_every_run():
    assert matrix.in_turn(["a", "b"], 0) == ["a", "b"] and matrix.in_turn(["a", "b"], 1) == ["b", "a"]
    cfg = matrix.Config(seconds=1, ramp=0, rounds=3, target_core=0, host_core=1, targets=["ours", "spdk"],
                        hosts=["ours", "spdk"], works=[Work("w", "randread", 4096, 1)] * 5)
    assert matrix.planned_runs(cfg) == 3 * (4 * 5 + 1 + 2)


def test_report_tables_carry_the_ratios_and_the_goals():
    qd1 = goals.QD1
    runs = [run("spdk", "spdk", qd1, 70_000, 14.0, p9999_us=40), run("ours", "ours", qd1, 84_000, 11.0, p9999_us=30),
            run(matrix.EVENT, matrix.EVENT, qd1, 30_000, 30.0)]
    floors = [{"mode": "busy", "mean_ns": 10_000.0, "noisy": False}, {"mode": "blocking", "mean_ns": 28_000.0,
                                                                      "noisy": True}]
    config = {"seconds": 3, "ramp": 1, "rounds": 1, "target_core": 0, "host_core": 1, "works": [qd1]}
    results = report.assemble(runs, floors, [qd1], config, None, [], [{"stack": "ours", "queues": 1, "rss_bytes": 2 << 20,
                                                                       "rss_idle_bytes": 1 << 20}], 10.0)
    assert results["qd1_over_floor"]["ours x nvmf-perf, polling: QD1 mean / busy ping-pong"] == 1.1
    assert results["qd1_over_floor"]["ours x nvmf-perf, event mode: QD1 mean / blocking ping-pong"] == pytest.approx(
        30 / 28, abs=1e-3)
    assert results["floor"]["blocking"]["note"].startswith("all 1 runs noisy")
    assert results["memory"]["bytes_per_queue"] == {"ours": None}  # one point gives no slope
    text = report.markdown(results)
    assert "| 4k randread QD1 | 70 K, 14.0 µs, p99.99 40 µs | 84 K, 11.0 µs, p99.99 30 µs | — | — |" in text
    assert "| ours x ours / SPDK x SPDK | 4k randread QD1 | 1.20× |" in text
    assert "| 4k QD1 mean latency (ours x ours, polling) / busy ping-pong mean <= 1.1 | 1.10× | met |" in text


def test_the_spec_following_spdk_target_gets_its_columns_and_ratios_only_when_it_ran():
    qd32 = goals.QD32
    config = {"seconds": 3, "ramp": 1, "rounds": 1, "target_core": 0, "host_core": 1, "works": [qd32]}
    base = [run("spdk", "spdk", qd32, 600_000, 50.0), run("ours", "spdk", qd32, 540_000, 55.0)]
    without = report.markdown(report.assemble(base, [], [qd32], config, None, [], [], 10.0))
    assert "SPDK-spec" not in without
    spec = [run("spdk-spec", "spdk", qd32, 450_000, 66.0)]
    results = report.assemble(base + spec, [], [qd32], config, None, [], [], 10.0)
    rows = {r["comparison"]: r for r in results["ratios"]}
    assert rows["our target / SPDK-spec target, under spdk_nvme_perf"]["iops_ratio"] == pytest.approx(1.2)
    assert rows["SPDK-spec target / SPDK target, under spdk_nvme_perf"]["iops_ratio"] == pytest.approx(0.75)
    text = report.markdown(results)
    header = next(line for line in text.splitlines() if line.startswith("| work |"))
    assert header.endswith("| SPDK-spec tgt x spdk_nvme_perf |"), "only the pair that ran gets a column"
    row = next(line for line in text.splitlines() if line.startswith(f"| {qd32} |"))
    assert row.split(" | ")[-1].startswith("450 K")


def test_spdk_transport_gets_the_queue_depth_only_while_the_bench_starts_it():
    from nvmflab.plan import Subsystem, TargetSetup
    from nvmflab.stacks import spdk

    from nvmfbench.stacks import SPDK_SPEC, spdk_transport_args, spdk_transport_extra

    setup = TargetSetup(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(Subsystem("nqn.2024-01.io.nvmflab:t", "null", 1 << 30),))

    def transport(calls):
        return next(c for c in calls if c[0] == "nvmf_create_transport")

    with spdk_transport_args(spdk_transport_extra("spdk")):
        assert transport(spdk.target_rpcs(setup, 4420))[-2:] == ["-q", "256"]
    assert "-q" not in transport(spdk.target_rpcs(setup, 4420))
    # The specification's SUCCESS rule: rpc.py's --c2h-success switch turns SPDK's shortcut off.
    with spdk_transport_args(spdk_transport_extra(SPDK_SPEC)):
        assert transport(spdk.target_rpcs(setup, 4420))[-3:] == ["-q", "256", "--c2h-success"]
    assert "--c2h-success" not in transport(spdk.target_rpcs(setup, 4420))
    assert spdk_transport_extra("ours") == []


def test_tls_rows_get_their_columns_ratios_and_goals_only_when_they_ran():
    qd32, large = goals.QD32, goals.LARGE
    config = {"seconds": 3, "ramp": 1, "rounds": 1, "target_core": 0, "host_core": 1, "works": [qd32, large]}
    plain = [run("ours", "ours", qd32, 800_000, 40.0), run("spdk", "spdk", qd32, 700_000, 45.0),
             run("ours", "ours", large, 40_000, 800.0, bw=5e9), run("spdk", "spdk", large, 40_000, 800.0, bw=5e9)]
    without = report.assemble(plain, [], [qd32, large], config, None, [], [], 10.0)
    assert "TLS" not in report.markdown(without)
    assert not [g for g in without["goals"] if g["goal"].startswith("TLS")]
    tls = [run("ours-tls", "ours-tls", qd32, 720_000, 44.0), run("spdk-tls", "spdk-tls", qd32, 400_000, 80.0),
           run("ours-tls", "spdk-tls", qd32, 500_000, 64.0), run("spdk-tls", "ours-tls", qd32, 450_000, 70.0),
           run("ours-tls", "ours-tls", large, 20_000, 1600.0, bw=3e9)]
    results = report.assemble(plain + tls, [], [qd32, large], config, None, [], [], 10.0)
    rows = {(r["comparison"], r["work"]): r["iops_ratio"] for r in results["ratios"]}
    assert rows[("ours x ours TLS / ours x ours plain", qd32)] == pytest.approx(0.9)
    assert rows[("ours x ours TLS / SPDK x SPDK TLS", qd32)] == pytest.approx(1.8)
    assert rows[("our TLS target / SPDK TLS target, under spdk_nvme_perf TLS", qd32)] == pytest.approx(1.25)
    assert rows[("nvmf-perf TLS / spdk_nvme_perf TLS, on SPDK's TLS target", qd32)] == pytest.approx(1.125)
    assert rows[("SPDK x SPDK TLS / SPDK x SPDK plain", qd32)] == pytest.approx(400 / 700, abs=1e-3)
    found = {g["goal"]: (g["value"], g["status"]) for g in results["goals"] if g["goal"].startswith("TLS")}
    assert found["TLS: 4k randread QD32 IOPS, ours x ours TLS / plain >= 0.85"] == (0.9, "met")
    assert found["TLS: 128k randread QD32 bandwidth, ours x ours TLS / plain >= 0.7"] == (0.6, "missed by 14.3 %")
    assert found["TLS: 4k randread QD32 IOPS, ours x ours TLS / SPDK x SPDK TLS >= 1.2"] == (1.8, "met")
    header = next(line for line in report.markdown(results).splitlines() if line.startswith("| work |"))
    assert header.endswith("| TLS: SPDK tgt x spdk_nvme_perf | TLS: ours x nvmf-perf | TLS: ours tgt x spdk_nvme_perf "
                           "| TLS: SPDK tgt x nvmf-perf |")


def test_tls_legs_run_every_tls_pair_on_the_tls_works_among_the_plain_targets():
    works = [w for w in matrix.MATRIX_WORKS]
    cfg = matrix.Config(seconds=1, ramp=0, rounds=2, target_core=0, host_core=1, targets=["ours", "spdk", "spdk-spec"],
                        hosts=["ours", "spdk"], works=works, event=False, floor=False, tls=True)
    legs = cfg.legs()
    assert [t for t, _, _ in legs] == ["ours", "spdk", "spdk-spec", "ours-tls", "spdk-tls"]
    ours_tls = dict((t, (h, w)) for t, h, w in legs)["ours-tls"]
    assert ours_tls[0] == ["ours-tls", "spdk-tls"]
    assert [w.name for w in ours_tls[1]] == ["4k randread QD1", "4k randread QD32", "4k randwrite QD32",
                                             "128k randread QD32", "128k randwrite QD32"]
    assert matrix.planned_runs(cfg) == 2 * (3 * 2 * len(works) + 2 * 2 * 5)
    cfg.tls = False
    assert [t for t, _, _ in cfg.legs()] == ["ours", "spdk", "spdk-spec"]
    cfg.tls, cfg.hosts = True, ["ours"]
    assert [t for t, _, _ in cfg.legs()][-1] == "ours-tls"


def test_spdk_tls_target_admits_one_host_with_its_psk_on_a_secure_channel(tmp_path):
    from nvmflab.plan import Subsystem, TargetSetup
    from nvmflab.stacks import spdk
    from nvmflab.stacks.ours import TLS_HOSTNQN

    from nvmfbench.stacks import Bench, secure_channel, spdk_transport_args, spdk_transport_extra, tls_host_args

    nqn = "nqn.2024-01.io.nvmflab:t"
    setup = TargetSetup(cores=(0,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(Subsystem(nqn, "null", 1 << 30),))
    psk = tmp_path / "psk"
    with spdk_transport_args(spdk_transport_extra("spdk"), psk):
        calls = spdk.target_rpcs(setup, 4420)
    create = next(c for c in calls if c[0] == "nvmf_create_subsystem")
    assert "-a" not in create, "a TLS subsystem admits only the host that has the key"
    assert ["nvmf_subsystem_add_host", nqn, TLS_HOSTNQN, "--psk", str(psk)] in calls
    assert next(c for c in calls if c[0] == "nvmf_subsystem_add_listener")[-1] == "--secure-channel"
    # SPDK 24.01's ssl socket defaults to 4 KiB buffers (80-90 ms per 128 KiB read): sized before it starts.
    sized = calls.index(["sock_impl_set_options", "-i", "ssl", "--recv-buf-size", "2097152", "--send-buf-size", "2097152"])
    assert sized < calls.index(["framework_start_init"])
    assert secure_channel(calls, psk) == calls, "never twice"
    plain = spdk.target_rpcs(setup, 4420)
    assert "--secure-channel" not in sum(plain, []) and "-a" in next(c for c in plain if c[0] == "nvmf_create_subsystem")
    assert "ssl" not in sum(plain, []), "the plain target keeps SPDK's defaults"
    assert tls_host_args("spdk", None, psk, ["perf"]) == ["-S", "ssl", "--psk-path", str(psk)]
    assert tls_host_args("spdk", None, psk, ["perf", "-S", "ssl"]) == [], "never twice"
    # A harness whose SPDK target does TLS itself: its calls are kept, nothing is added twice.
    own = [["nvmf_create_subsystem", nqn, "-s", "X"], ["nvmf_subsystem_add_host", nqn, TLS_HOSTNQN, "--psk", "k"],
           ["nvmf_subsystem_add_listener", nqn, "-t", "tcp", "--secure-channel"]]
    assert secure_channel(own, psk) == own
    bench = Bench(tmp_path, None)
    assert bench.psk_path.read_text() == bench.tls_key and bench.psk_path.stat().st_mode & 0o077 == 0


def test_spdk_memory_points_stop_where_its_heap_does():
    assert memory.counts_for("ours", [1, 100, 1000]) == [1, 100, 1000]
    assert memory.counts_for("spdk", [1, 100, 1000]) == [1, 100]


def test_runs_from_a_slow_phase_of_the_machine_are_noisy_and_left_out():
    from nvmfbench import speed

    fast = [run("ours", "ours", "w", 900, 10, probe_ns=[9_000, 9_300]),
            run("ours", "ours", "w", 880, 10, probe_ns=[9_100, 9_000])]
    slow = run("ours", "ours", "w", 400, 20, probe_ns=[9_200, 15_000])  # the machine slowed mid-run
    unprobed = run("spdk", "spdk", "w", 500, 12)
    fastest = speed.mark_slow_phases(fast + [slow, unprobed])
    assert fastest == 9_000
    assert slow["noisy"] and slow["slow_machine"] == round(15_000 / 9_000, 2)
    assert not any(r["noisy"] for r in fast + [unprobed])
    assert stats.cell(fast + [slow])["iops"] == 890  # the slow run would have pulled the median to 880
    assert speed.mark_slow_phases([unprobed]) is None


def test_a_target_is_paused_while_the_probe_runs_and_resumed_after():
    import subprocess
    import time

    from nvmfbench import speed

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with speed.paused(sleeper.pid):
            assert speed.process_state(sleeper.pid) == "T"  # stopped before the probe runs
        for _ in range(1000):  # SIGCONT is asynchronous too
            if speed.process_state(sleeper.pid) != "T":
                break
            time.sleep(0.001)
        assert speed.process_state(sleeper.pid) in ("S", "R")
    finally:
        sleeper.kill()
        sleeper.wait()
    with speed.paused(None):  # nothing to pause: a no-op
        pass


def test_scaling_runs_are_probed_and_one_from_a_slow_phase_is_left_out(monkeypatch):
    import contextlib

    from nvmfbench import speed

    probes = iter([9_000, 9_100, 9_000, 16_000, 9_200, 9_000])  # the second run ends slow
    monkeypatch.setattr(speed, "probe", lambda *a, **k: next(probes))
    iops = iter([1_100_000, 400_000, 1_000_000])

    class FakeBench:
        @contextlib.contextmanager
        def target(self, stack, cores, mode):
            yield None

        def measure(self, host, target, work, mode, cpus, seconds, ramp):
            return {"iops": next(iops), "noisy": False}

    runs = [scaling.measure(FakeBench(), 1, [0], [1], 1, 0) for _ in range(3)]
    assert [r["probe_ns"] for r in runs] == [[9_000, 9_100], [9_000, 16_000], [9_200, 9_000]]
    speed.mark_slow_phases(runs)
    assert [r["noisy"] for r in runs] == [False, True, False]
    row = report.scaling_summary([r | {"reactors": 1} for r in runs])[0]
    assert (row["iops"], row["used"], row["runs"]) == (1_050_000, 2, 3)


def test_the_gate_waits_for_a_fast_phase_within_its_budgets():
    from nvmfbench import speed

    slept, said = [], []
    gate = speed.Gate(sleep=slept.append, say=said.append)
    assert speed.Gate(0).wait_for_fast(9_000, lambda: 1 / 0) == 9_000
    idle = speed.Gate(0, sleep=slept.append)  # no budget (--quick): never waits
    idle.seen(9_000)
    assert idle.wait_for_fast(15_000, lambda: 1 / 0) == 15_000 and not slept
    assert gate.wait_for_fast(9_000, lambda: 1 / 0) == 9_000  # the first probe sets the pace, no wait
    probes = iter([15_000, 14_800, 9_100])
    assert gate.wait_for_fast(15_000, lambda: next(probes)) == 9_100  # waited three steps for it
    assert slept == [gate.WAIT_STEP_S] * 3 and len(said) == 1 and "slow phase" in said[0]
    # A machine that stays slow: at most WAIT_PER_RUN_S per run, then it runs anyway.
    slept.clear()
    assert gate.wait_for_fast(15_000, lambda: 15_000) == 15_000
    assert sum(slept) == gate.WAIT_PER_RUN_S
    # Once the bench-wide budget is spent, nothing waits any more.
    gate.budget = 0
    slept.clear()
    assert gate.wait_for_fast(15_000, lambda: 1 / 0) == 15_000 and not slept
    assert gate.waited == 3 * gate.WAIT_STEP_S + gate.WAIT_PER_RUN_S


def test_a_cell_with_clean_runs_is_marked_as_having_left_noisy_ones_out_not_as_all_noisy():
    half = stats.cell([run("o", "o", "w", 100, 10), run("o", "o", "w", 110, 10),
                       run("o", "o", "w", 50, 20, noisy=True), run("o", "o", "w", 40, 20, noisy=True)])
    assert report._mark(half) == " †"  # two clean runs made the median
    every = stats.cell([run("o", "o", "w", 50, 20, noisy=True)])
    assert report._mark(every) == " *"
    assert report._mark(stats.cell([run("o", "o", "w", 50, 20)])) == ""


def test_the_command_line_checks_workloads_and_stacks_before_anything_runs(capsys):
    spec = importlib.util.spec_from_file_location("bench_run", Path(__file__).resolve().parents[2] / "bench" / "run.py")
    run_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_py)
    a = run_py.parse_args(["--works", "128k-randread-qd32,4k-randread-qd1"])
    assert [w.key for w in a.works] == ["4k-randread-qd1", "128k-randread-qd32"], "in the matrix's order"
    assert len(run_py.parse_args([]).works) == 6
    for argv, says in ((["--works", "4k-qd1"], "unknown workload '4k-qd1'"), (["--works", ","], "names no workload"),
                       (["--stacks", "spdk-spec"], "needs a host"), (["--stacks", "kernel"], "unknown stack 'kernel'")):
        with pytest.raises(SystemExit):
            run_py.parse_args(argv)
        assert says in capsys.readouterr().err, argv


def test_cpu_per_gib_divides_each_sides_counters_by_the_bytes_moved():
    from nvmfbench.stacks import cpu_per_gib

    # 2 GiB/s for 3 s + 1 s ramp is 8 GiB: 4 s of host user CPU is 0.5 s per GiB.
    got = cpu_per_gib(4.0, 0.8, 2.0, 1.6, 2 * (1 << 30), 4)
    assert got == {"host_usr_s_per_gib": 0.5, "host_sys_s_per_gib": 0.1, "target_usr_s_per_gib": 0.25,
                   "target_sys_s_per_gib": 0.2}
    assert cpu_per_gib(1, 1, 1, 1, None, 4) == {} and cpu_per_gib(1, 1, 1, 1, 1e9, 0) == {}


def test_cpu_rows_are_medians_of_clean_128k_runs_in_both_modes():
    big = "128k randwrite QD32"
    per = lambda v: {f"{s}_s_per_gib": v for s in report.CPU_SIDES}  # noqa: E731
    runs = [run("ours", "ours", big, 40_000, 800, bw=5e9, **per(0.1)),
            run("ours", "ours", big, 40_000, 800, bw=5e9, **per(0.3)),
            run("ours", "ours", big, 40_000, 800, bw=5e9, noisy=True, **per(9.0)),
            run(matrix.EVENT, matrix.EVENT, big, 30_000, 900, bw=4e9, **per(0.05)),
            run("ours", "ours", "4k randread QD32", 800_000, 40, **per(1.0))]
    rows = {r["target"]: r for r in report.cpu_summary(runs)}
    assert set(rows) == {"ours", matrix.EVENT}  # 4 KiB rows carry no CPU table
    assert rows["ours"]["host_usr_s_per_gib"] == pytest.approx(0.2) and rows["ours"]["used"] == 2
    config = {"seconds": 3, "ramp": 1, "rounds": 1, "target_core": 0, "host_core": 1, "works": [big]}
    text = report.markdown(report.assemble(runs, [], [big], config, None, [], [], 10.0))
    assert "| ours x nvmf-perf, event mode | 128k randwrite QD32 | 0.050 s | 0.050 s | 0.050 s | 0.050 s |" in text
    assert "128k randwrite QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.05" in text


def test_the_cpu_model_and_vendor_come_from_cpuinfo():
    m = report.machine("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n")
    assert (m["cpu"], m["vendor"]) == ("Intel(R) Xeon(R) Platinum 8480C", "Intel")
    assert report.machine("vendor_id : AuthenticAMD\nmodel name : AMD EPYC 9654\n")["vendor"] == "AMD"
    assert report.machine("")["vendor"] == "unknown"


def test_the_report_names_the_congestion_control_every_socket_got():
    assert report.machine("", congestion="bbr")["tcp_congestion"] == "bbr"
    assert report.machine("")["tcp_congestion"] == Path(report.CONGESTION).read_text().strip()
    results = {"machine": report.machine("model name : X\n", congestion="cubic"), "when": "now", "spdk": "none",
               "config": {"rounds": 1, "seconds": 3, "ramp": 1, "target_core": 0, "host_core": 1},
               "noise": {"limit_pct": None, "failed": 0}}
    assert "TCP congestion control cubic" in report._header(results)
    results["config"] |= {"tcp_congestion_set": "cubic", "tcp_congestion_machine": "bbr"}
    assert ("TCP congestion control cubic set for this run with --tcp-congestion; the machine's own is bbr"
            in report._header(results))


def _congestion_files(tmp_path: Path, now: str = "bbr") -> tuple[str, str]:
    setting, offered = tmp_path / "tcp_congestion_control", tmp_path / "tcp_available_congestion_control"
    setting.write_text(now + "\n")
    offered.write_text("reno cubic bbr\n")
    return str(setting), str(offered)


def test_a_congestion_control_set_for_the_run_is_put_back_after_it_even_when_the_run_fails(tmp_path):
    from nvmfbench import congestion

    setting, offered = _congestion_files(tmp_path)
    with congestion.set_for_run("cubic", setting, offered) as before:
        assert before == "bbr" and Path(setting).read_text() == "cubic\n"
    assert Path(setting).read_text() == "bbr\n"
    with pytest.raises(RuntimeError):
        with congestion.set_for_run("reno", setting, offered):
            assert Path(setting).read_text() == "reno\n"
            raise RuntimeError("a suite failed")
    assert Path(setting).read_text() == "bbr\n"
    with congestion.set_for_run(None, setting, offered) as before:  # the default changes nothing
        assert before == "bbr"
    assert Path(setting).read_text() == "bbr\n"


def test_sigterm_during_a_run_with_a_congestion_control_set_puts_the_old_one_back(tmp_path):
    import os
    import signal

    from nvmfbench import congestion

    setting, offered = _congestion_files(tmp_path)
    with pytest.raises(SystemExit) as ended:
        with congestion.set_for_run("cubic", setting, offered):
            os.kill(os.getpid(), signal.SIGTERM)
    assert ended.value.code == 128 + signal.SIGTERM
    assert Path(setting).read_text() == "bbr\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_congestion_control_that_cannot_be_set_is_one_line_naming_what_the_kernel_offers(tmp_path):
    from nvmfbench import congestion

    _, offered = _congestion_files(tmp_path)
    # A file anyone can read and nobody, root included, can write.
    with pytest.raises(congestion.CongestionError) as err:
        with congestion.set_for_run("cubic", "/proc/version", offered):
            raise AssertionError("the block must not run")
    assert "cannot set the TCP congestion control to 'cubic'" in str(err.value)
    assert "this kernel offers reno, cubic, bbr" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(congestion.CongestionError, match="1-15 of a-z, 0-9, _"):
        congestion.check_name("Cubic!")
    assert congestion.check_name("system") is None and congestion.check_name("cubic") == "cubic"


def test_the_command_line_refuses_a_congestion_name_the_kernel_could_not_have(capsys):
    spec = importlib.util.spec_from_file_location("bench_run", Path(__file__).resolve().parents[2] / "bench" / "run.py")
    run_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_py)
    with pytest.raises(SystemExit):
        run_py.parse_args(["--tcp-congestion", "no such"])
    assert "--tcp-congestion: expected \"system\" or a kernel congestion control" in capsys.readouterr().err
    a = run_py.parse_args(["--tcp-congestion", "cubic"])
    assert a.tcp_congestion == "cubic" and a.readme is False, "a run under another setting keeps the README's block"
    assert run_py.parse_args(["--tcp-congestion", "cubic", "--readme"]).readme is True
    assert run_py.parse_args([]).readme is True and run_py.parse_args([]).tcp_congestion is None
    system = run_py.parse_args(["--tcp-congestion", "system"])
    assert system.tcp_congestion is None and system.readme is True, "system is the machine's own, as for the knob"


def test_the_readme_keeps_the_latest_figures_of_each_cpu_vendor():
    readme = "# bench\n\n## Latest results\n\nolder prose\n"
    one = report.readme_with_latest(readme, "AMD", "amd run 1")
    two = report.readme_with_latest(one, "Intel", "intel run 1")
    three = report.readme_with_latest(two, "AMD", "amd run 2")
    assert "amd run 2" in three and "amd run 1" not in three and "intel run 1" in three
    assert three.count("### Latest on AMD") == 1 and "older prose" in three
    assert report.readme_with_latest("# bench\n", "Intel", "x").endswith("<!-- end latest Intel -->\n")


def test_ab_gives_the_ratio_of_means_with_its_interval_and_p():
    spec = importlib.util.spec_from_file_location("bench_ab", Path(__file__).resolve().parents[2] / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    runs = [{"side": s, "work": "w", "iops": v} for s, vals in (("A", (100, 102, 98, 101)), ("B", (80, 83, 79, 82)))
            for v in vals] + [{"side": "B", "work": "w", "error": "boom"}]
    text = ab.ratio_interval(runs, "w")
    ratio, interval, p = text.split()[0], text.split()[1], float(text.split()[2])
    assert ratio == "0.808" and p < 0.001
    low, high = (float(x) for x in interval.strip("()").split("–"))
    assert low < 0.808 < high < 1.0, "a clear drop: the interval stays below 1"
    assert ab.ratio_interval(runs[:5], "w").split() == ["—", "—"], "one B run gives no interval"


def test_ab_pairs_each_round_so_a_drift_between_rounds_cancels():
    spec = importlib.util.spec_from_file_location("bench_ab", Path(__file__).resolve().parents[2] / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    # The machine halves its speed every round; B is 10 % slower than A within each round.
    speed = (1000, 500, 250, 125)
    runs = [{"side": "A", "work": "w", "round": r, "iops": v} for r, v in enumerate(speed)]
    runs += [{"side": "B", "work": "w", "round": r, "iops": v * (0.9 + 0.002 * r)} for r, v in enumerate(speed)]
    runs.append({"side": "B", "work": "w", "round": 4, "iops": 77})  # a round without A counts nowhere
    ratio, interval = ab.paired_interval(runs, "w").split()
    low, high = (float(x) for x in interval.strip("()").split("–"))
    assert ratio == "0.903" and 0.89 < low < 0.903 < high < 0.92, "paired: tight around 0.9"
    fieller_low, fieller_high = (float(x) for x in ab.ratio_interval(runs, "w").split()[1].strip("()").split("–"))
    assert fieller_high - fieller_low > 10 * (high - low), "unpaired means drown in the drift"
    assert ab.paired_interval(runs[:5], "w").strip() == "—"


def test_ab_takes_a_run_that_moved_nothing():
    spec = importlib.util.spec_from_file_location("bench_ab", Path(__file__).resolve().parents[2] / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    assert ab.per_gib(2.0, 0.0, 3) is None, "a stalled run has no CPU per GiB (it divided by zero)"
    assert abs(ab.per_gib(1.0, (1 << 30) / 4, 4) - 1.0) < 1e-9
    runs = [{"iops": 0.0, "host_usr_s_per_gib": None}, {"iops": 10.0, "host_usr_s_per_gib": 3.0},
            {"iops": 20.0, "host_usr_s_per_gib": 5.0}]
    assert ab.median_of(runs, "iops") == 10.0, "the stalled run still counts as a run"
    assert ab.median_of(runs, "host_usr_s_per_gib") == 4.0 and ab.median_of(runs[:1], "host_usr_s_per_gib") is None


def test_ab_fifo_runs_each_program_under_fifo_with_a_cpu_limit_and_its_own_pid():
    spec = importlib.util.spec_from_file_location("bench_ab", Path(__file__).resolve().parents[2] / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    assert ab.fifo_prefix(False, 30) == ()
    prefix = ab.fifo_prefix(True, 30)
    assert prefix[:2] == ("prlimit", "--cpu=30") and prefix[2:] == ("chrt", "-f", "10")
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit here")
    # prlimit becomes the program (cpu_of reads the target's own CPU time by this pid), limited
    child = subprocess.Popen([*prefix[:2], "sh", "-c", "echo $$ $(ulimit -t)"], stdout=subprocess.PIPE, text=True)
    pid, limit = child.communicate(timeout=10)[0].split()
    assert int(pid) == child.pid and limit == "30"


def test_ab_leaves_out_slow_phase_runs_with_their_pairs():
    spec = importlib.util.spec_from_file_location("bench_ab", Path(__file__).resolve().parents[2] / "bench" / "ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    # Rounds 0-3 in the fast phase (probe 9 us), B 2 % slower; in round 4 the VM halved its speed
    # after A's run, so B's run looks 45 % slower.
    runs = []
    for r in range(5):
        slow_b = r == 4
        runs.append({"side": "A", "work": "w", "round": r, "iops": 100.0 + r, "probe_ns": [9000.0, 9100.0]})
        runs.append({"side": "B", "work": "w", "round": r, "iops": 55.0 if slow_b else (100.0 + r) * (0.98 + 0.004 * (-1) ** r),
                     "probe_ns": [15000.0, 16000.0] if slow_b else [9050.0, 9000.0]})
    kept = ab.in_fast_phase([dict(x) for x in runs])
    assert len(kept) == 9 and all(x["round"] != 4 or x["side"] == "A" for x in kept)
    ratio, interval = ab.paired_interval(kept, "w").split()
    low, high = (float(x) for x in interval.strip("()").split("–"))
    assert 0.97 < float(ratio) < 0.99 and high < 1.0, "without the slow pair: B is 2 % slower, decided"
    ratio_all, interval_all = ab.paired_interval(runs, "w").split()
    assert float(ratio_all) < 0.9 and float(interval_all.strip("()").split("–")[1]) > 1.0, "with it: undecided"
    unprobed = [{k: v for k, v in x.items() if k != "probe_ns"} for x in runs]
    assert len(ab.in_fast_phase(unprobed)) == 10, "runs without probes are all kept"


def test_paired_ratio_interval_is_a_geometric_mean_and_none_where_no_interval_exists():
    mean, low, high = stats.paired_ratio_interval([0.9, 0.9, 0.9, 6.0])
    assert mean == pytest.approx((0.9 ** 3 * 6.0) ** 0.25) and low < mean < high  # 1.44, not the 2.2 of the plain mean
    assert stats.paired_ratio_interval([1.1]) is None
    assert stats.paired_ratio_interval([1.1, 1.1, 1.1]) is None, "no spread, no interval"
    assert stats.paired_ratio_interval([1.1, 0.0, 1.2]) is None
