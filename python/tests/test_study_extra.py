"""The contention, dimensions, busy-poll and parallelism analyses on synthetic stores: findings
computed from the numbers, and a clear sentence where a leg is missing."""

import json

from conftest import nvmflab

from nvmflab.analysis import busy_poll, contention, dimensions, parallelism
from nvmflab.store import ResultsStore

HIST = json.dumps([[100_000, 90], [200_000, 9], [400_000, 1]])


def _save(store, run, study, leg, knobs, repeat, rows, status="ok", error=None, key=None):
    key = key or f"{study}-{leg}-{json.dumps(knobs, sort_keys=True)}-{repeat}"
    store.save_point(run, key, study, leg, knobs, repeat, status, error,
                     [{"knobs": knobs, "histogram_json": HIST, **r} for r in rows])


def _row(iops, bs=4096, lat=100_000.0, role="main", **extra):
    return {"role": role, "engine": "tcp", "iops": iops, "bw_bytes": iops * bs, "lat_mean_ns": lat,
            "lat_p90_ns": lat * 1.2, "lat_p99_ns": lat * 2, "lat_p99_99_ns": lat * 4, "usr_cpu": 10.0,
            "sys_cpu": 30.0, "total_ios": int(iops * 10), "runtime_ms": 10_000, "target_usr_s": 1.0,
            "target_sys_s": 1.0} | extra


def test_contention_findings_from_the_numbers(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    tapp = {"app": "T-app", "rw": "read", "bs": 131072, "iodepth": 4, "numjobs": 1, "part": "storage",
            "net_flows": 0, "placement": "none"}
    for r in range(2):
        _save(store, run, "contention", "isolated", tapp, r, [_row(10_000, 131072)])
        _save(store, run, "contention", "same_core", tapp | {"net_flows": 4, "placement": "same"}, r,
              [_row(1_500, 131072)])
        net = {"app": "net", "part": "network", "net_flows": 4, "placement": "none"}
        _save(store, run, "contention", "isolated", net, r,
              [{"role": "bg", "engine": "iperf3", "bw_bytes": 1e9} for _ in range(4)]
              + [{"role": "bg", "engine": "cpu:host:1", "usr_cpu": 10.0, "sys_cpu": 80.0}])
        _save(store, run, "contention", "same_core", tapp | {"net_flows": 4, "placement": "same", "part": "network"}, r,
              [{"role": "bg", "engine": "iperf3", "bw_bytes": 5e8} for _ in range(4)]
              + [{"role": "bg", "engine": "cpu:host:1", "usr_cpu": 20.0, "sys_cpu": 78.0},
                 {"role": "bg", "engine": "cpu:target:0", "usr_cpu": 5.0, "sys_cpu": 60.0}])
    result = contention.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert ("Cannot tell whether throughput between a T-app with 4 iperf3 flows on same core and alone changed "
            "(2 repeats without spread: no interval; 197 vs 1311 MB/s).") in text  # identical repeats are no certainty
    assert "Alone, 4 iperf3 flows reached 8.00 Gbit/s per flow (descriptive, not tested)." in text
    network = next(t for t in result.tables if t.title.startswith("Network apps")).frame
    assert list(network["per flow % of alone"]) == [100.0, 50.0]
    assert {f.name for f in result.figures} >= {"contention_storage_vs_flows", "contention_cpu_per_core"}


def test_contention_without_iperf3_says_why(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    knobs = {"app": "L-app", "rw": "read", "bs": 4096, "iodepth": 1, "numjobs": 1, "part": "storage", "net_flows": 0}
    _save(store, run, "contention", "isolated", knobs, 0, [_row(8_000)])
    _save(store, run, "contention", "same_core", knobs | {"net_flows": 1}, 0, [], status="skipped",
          error="network apps skipped: iperf3 not found on local (Debian: apt-get install iperf3)")
    _save(store, run, "contention", "same_core", knobs | {"net_flows": 1, "part": "network"}, 0, [],
          status="skipped", error="network apps skipped: iperf3 not found on local (Debian: apt-get install iperf3)")
    text = "\n".join(contention.analyze(store.measurements(), store.runs()).findings)
    assert "The same_core leg was skipped (network apps skipped: iperf3 not found on local" in text
    assert "No network app was measured (network apps skipped: iperf3 not found" in text


def test_dimensions_concurrency_and_missing_legs(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("dimensions", 'study = "dimensions"', {})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "transport": "tcp"}
    _save(store, run, "dimensions", "local", base | {"iodepth": 1}, 0, [_row(50_000)])
    for qd, iops in ((1, 10_000), (8, 40_000), (32, 100_000)):
        _save(store, run, "dimensions", "concurrency", base | {"iodepth": qd}, 0, [_row(iops)])
    for rw, iops in (("randread", 100_000), ("randwrite", 50_000)):
        _save(store, run, "dimensions", "pattern", base | {"rw": rw, "iodepth": 128}, 0, [_row(iops)])
    _save(store, run, "dimensions", "pattern_rdma", base | {"iodepth": 128, "transport": "rdma"}, 0, [],
          status="skipped", error="no RDMA transport")
    result = dimensions.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    # one repeat: no interval, so neither the match nor the pattern difference is decided
    assert ("Cannot tell whether NVMe/TCP matched local QD1 throughput (50.0 KIOPS) at any queue depth (fewer than two "
            "repeats a side or no spread: no interval); at QD32 concurrency is 2.00 (no interval).") in text
    assert ("At 4k, randread reached 100.0 KIOPS and randwrite 50.0 KIOPS: cannot decide (only one repeat on a side; "
            "Holm over 1 pair).") in text
    assert "The pattern_rdma leg was skipped (no RDMA transport), so RDMA is not compared with TCP." in text
    assert "The cores leg was not measured" in text
    conc = next(t for t in result.tables if t.title.startswith("Concurrency")).frame
    assert list(conc["concurrency"]) == [0.2, 0.8, 2.0]


def test_busy_poll_cores_to_best_and_comparison(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("busy-poll", 'study = "busy-poll"', {})
    values = {"off": {1: 100_000, 2: 180_000, 3: 200_000}, "on": {1: 150_000, 2: 195_000, 3: 196_000}}
    for config, per_cores in values.items():
        for n, iops in per_cores.items():
            for r, jitter in enumerate((0.99, 1.01)):
                knobs = {"config": config, "target_cpus": n, "rw": "randread", "bs": 4096, "iodepth": 32,
                         "numjobs": 3 * n, "shares_host_cores": False}
                _save(store, run, "busy-poll", config, knobs, r, [_row(iops * jitter, lat=1e9 / iops)])
    result = busy_poll.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert ("With busy polling and placement off, 3 target cores were needed for its highest throughput (200.0 "
            "KIOPS): fewer were clearly below it (Holm over the 2 comparisons with the best; 2 vs 3") in text
    assert ("No clear difference in IOPS between 2 and 3 target cores with busy polling and placement on (Holm over the "
            "2 comparisons with the best; 195.0 KIOPS vs 196.0 KIOPS with 3; 95 % interval of the difference −12.9 to "
            "+10.9 KIOPS; an effect larger") in text
    assert "at these 2 repeats), so 2 target cores were enough for its highest throughput." in text
    assert ("1 target core, busy polling and placement on vs off: IOPS +50.0 % (150.0 KIOPS vs 100.0 KIOPS; Holm over "
            "3; 95 % interval of the difference +41.0 to +59.0 KIOPS)") in text
    assert ("3 target cores, busy polling and placement on vs off: IOPS no clear difference (196.0 KIOPS vs 200.0 "
            "KIOPS; Holm over 3; 95 % interval of the difference −16.1 to +8.1 KIOPS") in text
    assert "IOPS -2.0 %" not in text


def test_busy_poll_skipped_on_a_stack_without_busy_polling(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("busy-poll", 'study = "busy-poll"', {})
    knobs = {"config": "off", "target_cpus": 1, "rw": "randread", "bs": 4096, "iodepth": 32, "numjobs": 3}
    _save(store, run, "busy-poll", "off", knobs, 0, [_row(100_000)])
    _save(store, run, "busy-poll", "on", knobs | {"config": "on"}, 0, [], status="skipped",
          error="kernel target / ours host: knob busy_poll_us = 50: the kernel target has no such setting")
    text = "\n".join(busy_poll.analyze(store.measurements(), store.runs()).findings)
    assert "The on leg was skipped (kernel target / ours host: knob busy_poll_us = 50" in text


def test_parallelism_cpu_cost_and_tail_latency(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("parallelism", 'study = "parallelism"', {"spec_effective": {"ramp_time": 0}})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "backend": "file"}
    # host CPU per I/O = (usr + sys) % × 10 s / (iops × 10 s): local 40 % / 100k, remote 60 % / 100k
    _save(store, run, "parallelism", "size_local", base | {"iodepth": 16}, 0, [_row(100_000)])
    _save(store, run, "parallelism", "size_remote", base | {"iodepth": 16}, 0,
          [_row(100_000, usr_cpu=15.0, sys_cpu=45.0)])
    for qd, local, remote in ((1, 50_000, 100_000), (16, 100_000, 150_000)):
        _save(store, run, "parallelism", "depth_local", base | {"iodepth": qd}, 0, [_row(50_000, lat=local)])
        _save(store, run, "parallelism", "depth_remote", base | {"iodepth": qd}, 0, [_row(40_000, lat=remote)])
    result = parallelism.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert ("Cannot tell whether host CPU per I/O (the load generator's own: no per-core count, softirq missed) "
            "between remote and local I/O at 4k changed (only one repeat on a side; 6.00 vs 4.00 µs).") in text
    assert "kernel share was 75.0 % local and 75.0 % remote (descriptive, not tested)" in text
    assert ("Remote p99 at QD1: cannot decide (only one repeat on a side; 200.0 µs vs 100.0 µs; Holm over 3); at QD16: "
            "cannot decide (only one repeat on a side; 300.0 µs vs 200.0 µs; Holm over 3)") in text
    assert "The numjobs leg was not measured, so scaling with jobs is not shown." in text


def _noisy(clear_factor):
    """Three repeats of (1.0, 0.6, 1.4) × base against `clear_factor` × that: noisy unless far apart."""
    return [(1.0, 1.0), (0.6, 0.6 * clear_factor), (1.4, 1.4 * clear_factor)]


def test_contention_noisy_reads_no_significant_difference_and_clear_states_interval(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    tapp = {"app": "T-app", "rw": "read", "bs": 131072, "iodepth": 4, "numjobs": 1, "part": "storage",
            "net_flows": 0, "placement": "none"}
    lapp = tapp | {"app": "L-app", "bs": 4096, "iodepth": 1}
    for r, (alone, beside) in enumerate([(1.0, 0.95), (0.6, 1.4), (1.4, 0.7)]):
        _save(store, run, "contention", "isolated", tapp, r, [_row(10_000 * alone, 131072)])
        _save(store, run, "contention", "same_core", tapp | {"net_flows": 1, "placement": "same"}, r,
              [_row(10_000 * beside, 131072)])
        _save(store, run, "contention", "isolated", lapp, r, [_row(8_000, lat=100_000 * (1 + r / 100))])
        _save(store, run, "contention", "same_core", lapp | {"net_flows": 1, "placement": "same"}, r,
              [_row(8_000, lat=300_000 * (1 + r / 100))])
    text = "\n".join(contention.analyze(store.measurements(), store.runs()).findings)
    assert ("No clear difference in throughput between a T-app with 1 iperf3 flow on same core and alone (1333 vs "
            "1311 MB/s; 95 % interval of the difference −1108 to +1152 MB/s; an effect larger than") in text
    assert "kept 102 %" not in text
    assert ("An L-app with 1 iperf3 flow on same core: mean latency 3.00× its latency alone (303.0 µs vs 101.0 µs; "
            "95 % interval of the difference +") in text


def test_dimensions_noisy_pattern_and_clear_cores(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("dimensions", 'study = "dimensions"', {})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "transport": "tcp"}
    for r, (a, b) in enumerate(_noisy(1.1)):
        _save(store, run, "dimensions", "pattern", base | {"iodepth": 128}, r, [_row(100_000 * a)])
        _save(store, run, "dimensions", "pattern", base | {"rw": "randwrite", "iodepth": 128}, r, [_row(100_000 * b)])
        for cores, iops in ((1, 50_000), (2, 100_000)):
            _save(store, run, "dimensions", "cores", base | {"iodepth": 32, "cores": cores, "host_cpus": cores}, r,
                  [_row(iops * (1 + r / 100), lat=100_000 * (1 + r / 100))])
    text = "\n".join(dimensions.analyze(store.measurements(), store.runs()).findings)
    assert ("At 4k, randwrite reached 106.7 KIOPS and randread 100.0 KIOPS: no clear difference in IOPS "
            "(Holm over 1 pair; 95 % interval of the difference −89.5 to +102.8 KIOPS; an effect larger") in text
    assert "1.07×" not in text
    assert ("2 cores gave 2.00× the IOPS of 1 (101.0 KIOPS vs 50.5 KIOPS; Holm over 2; 95 % interval of the "
            "difference +") in text
    assert ("p99 no clear difference (202.0 µs vs 202.0 µs; Holm over 2; 95 % interval of the difference −4.5 to "
            "+4.5 µs; an effect larger") in text


def test_busy_poll_near_best_states_the_interval(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("busy-poll", 'study = "busy-poll"', {})
    for n, iops in ((1, 100_000), (2, 197_000), (3, 200_000)):
        for r in range(3):
            knobs = {"config": "off", "target_cpus": n, "rw": "randread", "bs": 4096, "iodepth": 32,
                     "numjobs": 3 * n, "shares_host_cores": False}
            _save(store, run, "busy-poll", "off", knobs, r, [_row(iops + 100 * r, lat=1e9 / iops)])
    text = "\n".join(busy_poll.analyze(store.measurements(), store.runs()).findings)
    # 2 cores are 1.5 % below 3, clearly (a 5 % rule would have called them enough)
    assert ("With busy polling and placement off, 3 target cores were needed for its highest throughput (200.1 KIOPS): "
            "fewer were clearly below it (Holm over the 2 comparisons with the best; 2 vs 3: 197.1 KIOPS vs 200.1 "
            "KIOPS; 95 % interval of the difference −3.2 to −2.8 KIOPS).") in text


def test_parallelism_noisy_jobs_and_clear_cpu_cost(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("parallelism", 'study = "parallelism"', {"spec_effective": {"ramp_time": 0}})
    base = {"rw": "randread", "bs": 4096, "numjobs": 1, "backend": "file"}
    for r, (a, b) in enumerate(_noisy(1.2)):
        _save(store, run, "parallelism", "numjobs", base | {"iodepth": 16}, r, [_row(100_000 * a)])
        _save(store, run, "parallelism", "numjobs", base | {"iodepth": 16, "numjobs": 2}, r,
              [_row(100_000 * b, lat=100_000 * (2 + r))])
        _save(store, run, "parallelism", "size_local", base | {"iodepth": 16}, r, [_row(100_000, sys_cpu=30.0 + r)])
        _save(store, run, "parallelism", "size_remote", base | {"iodepth": 16}, r,
              [_row(100_000, usr_cpu=15.0, sys_cpu=45.0 + r)])
    text = "\n".join(parallelism.analyze(store.measurements(), store.runs()).findings)
    assert ("2 jobs gave 464 MB/s vs 410 MB/s with 1: no clear difference in bandwidth (Holm over 2; 95 % interval of "
            "the difference −370 to +479 MB/s; an effect larger than") in text
    assert "+13.3 %" not in text
    assert ("At 4k, remote I/O used 48.8 % more host CPU per I/O (the load generator's own: no per-core count, softirq "
            "missed) than local (6.10 vs 4.10 µs; 95 % interval of the difference +1.77 to +2.23 µs)") in text


def test_empty_stores_say_so(tmp_path):
    store = ResultsStore(tmp_path / "r")
    frame, runs = store.measurements(), store.runs()
    for module in (contention, dimensions, busy_poll, parallelism):
        result = module.analyze(frame, runs)
        assert result.findings and "no usable measurements" in result.findings[0]


def test_specs_load_and_plan_with_their_quick_variants(tmp_path, fake_env):
    for name in ("contention", "dimensions", "busy-poll", "parallelism"):
        done = nvmflab("study", name, "--quick", "--plan", env=fake_env)
        assert done.returncode == 0, (name, done.stderr)
        assert "nvmf-perf" in done.stdout


def test_contention_many_apps_throughput_latency_and_network(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("contention", 'study = "contention"', {})
    tapp = {"app": "T-app", "rw": "read", "bs": 131072, "iodepth": 4, "numjobs": 1, "part": "storage",
            "placement": "one_to_one"}
    lapp = {"app": "L-app", "rw": "read", "bs": 4096, "iodepth": 1, "numjobs": 1, "part": "storage",
            "placement": "same"}
    roles = ["main", "lg1", "lg2", "lg3", "lg4", "lg5", "lg6", "lg7"]
    for r in range(3):
        jitter = 1 + 0.01 * r
        _save(store, run, "contention", "isolated", {"app": "net", "part": "network", "net_flows": 1}, r,
              [{"role": "bg", "engine": "iperf3", "bw_bytes": 2e9 * jitter}])
        for flows in (0, 1):
            # 8 T-apps: the shared-core one drops to 88 % beside the network app, the others don't move
            _save(store, run, "contention", "many_apps", tapp | {"storage_apps": 8, "net_flows": flows}, r,
                  [_row((880 if flows and role == "main" else 1000) * jitter, 131072, role=role) for role in roles])
            _save(store, run, "contention", "many_apps", lapp | {"storage_apps": 1, "net_flows": flows}, r,
                  [_row(10_000, lat=(30_000.0 if flows else 10_000.0) * jitter)])
        _save(store, run, "contention", "many_apps", tapp | {"storage_apps": 8, "net_flows": 1, "part": "network"}, r,
              [{"role": "bg", "engine": "iperf3", "bw_bytes": 1.5e9 * jitter}])
    result = contention.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert "With 8 T-apps, the T-app sharing its core with a network app kept 88 % of its throughput without it" in text
    assert "No clear difference in throughput for the T-apps on other cores" in text
    assert "1 L-app sharing a core with a network app: mean latency 3.00× that of 1 L-app alone" in text
    assert "The network app sharing a core with T-apps (8 in all) kept 75 % of its throughput alone" in text
    table = next(t for t in result.tables if t.title.startswith("Several storage apps")).frame
    eight = table[(table["storage app"] == "T-app") & (table["network app"] == "yes")].iloc[0]
    assert eight["shared-core app MB/s"] == round(880 * 1.01 * 131072 / 1e6, 1)
    assert {"contention_many_tapps", "contention_many_lapps_latency",
            "contention_network_vs_storage_apps"} <= {f.name for f in result.figures}
    # the single-app tables and figures leave the many_apps leg out
    assert not any("many_apps" in str(t.frame.to_dict()) for t in result.tables if t.title.startswith("Network apps"))


def test_busy_poll_adds_up_the_load_generators_of_a_placed_point(tmp_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("busy-poll", 'study = "busy-poll"', {})
    for r in range(2):
        for n in (1, 4):
            knobs = {"config": "off", "target_cpus": n, "conns": 3 * n, "rw": "randread", "bs": 4096}
            _save(store, run, "busy-poll", "off", knobs, r, [_row(50_000.0 * n + r)])
            roles = ["main"] + [f"lg{i}" for i in range(1, n)]  # one generator per target core
            _save(store, run, "busy-poll", "on", knobs | {"config": "on"}, r,
                  [_row(15_000.0 * n + r, lat=80_000.0 + 1000 * i, role=role) for i, role in enumerate(roles)])
    result = busy_poll.analyze(store.measurements(), store.runs())
    table = next(t for t in result.tables if t.title.startswith("Configurations")).frame
    on4 = table[(table["configuration"] == "busy polling and placement on") & (table["target cores"] == 4)].iloc[0]
    assert on4["KIOPS"] == round((4 * (60_000.0 + 0.5)) / 1e3, 1)  # 4 generators summed, mean over repeats
    assert on4["mean (µs)"] == 83.0  # the worst generator's latency


def test_a_contention_point_run_again_measures_its_flows_again_and_keeps_only_the_last(monkeypatch):
    from nvmflab.studies import contention as study

    monkeypatch.setattr(study.time, "sleep", lambda s: None)
    flows = study.Flows(ctx=None, layout={}, duration=1, ramp=0)
    runs = iter([[{"bw_bytes": 1.0}], [{"bw_bytes": 2.0}]])
    flows._measure = lambda: flows.rows.extend(next(runs))
    pending: list = []
    prepare = study._chain(pending, flows, None, wait_inside=True)
    prepare()
    prepare()  # the runner re-runs a noisy point: prepare again
    assert pending == [flows]
    assert flows.rows == [{"bw_bytes": 2.0}]
