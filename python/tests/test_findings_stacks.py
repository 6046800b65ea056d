"""stacks' findings (issue 37): the ratio to the baseline pair and its test use one statistic (the
mean over repeats), with Fieller's interval of the ratio; the L-app and B-app lines are tested too."""

from test_study_stacks import _store

from nvmflab.analysis import stacks


def _values(tapp: list[int]) -> dict:
    return {
        ("spdk/spdk", "L-app", 1, 4096): [50_000, 49_000, 51_000],
        ("spdk/spdk", "T-app", 32, 4096): [100_000, 100_500, 99_500],
        ("spdk/spdk", "B-app", 32, 131072): [10_000, 10_100, 9_900],
        ("ours/spdk", "L-app", 1, 4096): [40_000, 39_000, 41_000],
        ("ours/spdk", "T-app", 32, 4096): tapp,
        ("ours/spdk", "B-app", 32, 131072): [10_050, 9_950, 10_000],
    }


def _analyzed(tmp_path, tapp):
    store = _store(tmp_path, _values(tapp))
    return stacks.analyze(store.measurements(), store.runs())


def test_the_ratio_is_of_the_means_the_test_compares(tmp_path):
    # median 101k (1.01×), mean 110k (1.10×): the ratio must be the one the Welch test is about
    result = _analyzed(tmp_path, [100_000, 101_000, 129_000])
    side = next(t.frame for t in result.tables if t.title == "Pairs side by side").set_index("target × host")
    assert side.at["ours target × spdk host", "QD32 IOPS ÷ baseline"] == 1.1
    finding = next(f for f in result.findings if f.startswith("ours target × spdk host:"))
    # the wild repeat leaves the difference undecided: the sentence leads with that, not a ratio
    assert finding.startswith("ours target × spdk host: No clear difference in IOPS"), finding
    assert "ratio of means 1.10× (Fieller's 95 % interval" in finding, finding


def test_l_app_and_b_app_lines_carry_their_decision(tmp_path):
    result = _analyzed(tmp_path, [110_000, 110_500, 109_500])
    finding = next(f for f in result.findings if f.startswith("ours target × spdk host:"))
    # L-app: 1e9/iops ns, so 25 µs against 20 µs with spread: a clear change with its interval
    assert "L-app mean latency 1.25× the baseline's (25.0 µs vs 20.0 µs; ratio of means 1.25× (Fieller's" in finding
    assert "95 % interval of the difference +" in finding.split("L-app mean latency")[1]
    # B-app bandwidths within each other's spread: not a ratio stated as an effect
    assert "No clear difference in B-app bandwidth (" in finding, finding


def test_each_pair_names_the_conditions_it_ran_with(tmp_path):
    result = _analyzed(tmp_path, [110_000, 110_500, 109_500])
    finding = next(f for f in result.findings if f.startswith("ours target × spdk host:"))
    assert "Measured with target stack ours, host stack spdk," in finding, finding
    assert "jobs 1, cores —, link loopback (one machine)." in finding, finding
