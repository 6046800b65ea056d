"""`nvmflab compare --until-decided` (issue 41 item 1): the gate's inconclusive points get more
repeats until decided or the cap, and a side that cannot take them is refused by name."""

from __future__ import annotations

import itertools
import json

import pytest
from synth_results import repeats, write_results
from test_compare import run_main

from nvmflab import compare as cmp
from nvmflab import gate, rerun
from nvmflab.store import ResultsStore


def pair(tmp_path, before, after, env=None):
    return tuple(write_results(tmp_path / name, [{"knobs": {"iodepth": 1}, "repeats": repeats(iops)}], env=env)
                 for name, iops in (("before", before), ("after", after)))


def noisy_pair(tmp_path, env=None):
    """Three repeats a side with about 8 % spread: 10 % can be neither shown nor excluded."""
    return pair(tmp_path, [100e3, 92e3, 108e3], [102e3, 90e3, 110e3], env)


def noisy_after(tmp_path, env=None):
    """A tight BEFORE (1 %) and an AFTER of 20 % spread: more repeats of AFTER could decide it."""
    return pair(tmp_path, [100e3, 99e3, 101e3], [100e3, 80e3, 120e3], env)


class FakeRerunner:
    """rerun.Rerunner at its seam: each new repeat is a copy of the point's stored repeat with the
    next IOPS of `draws[side]`, stored through the real ResultsStore."""

    draws: dict[str, itertools.cycle] = {}
    opened: list[str] = []

    def __init__(self, path, label, studies):
        self.label = label.lower()
        FakeRerunner.opened.append(self.label)
        self.store = ResultsStore(path)
        self.run_id = self.store.start_run("sweep-x", "# fake", {})

    def next_repeats(self, study, point_keys):
        return point_keys

    def run(self, study, points, description):
        stored = self.store.points()
        for keys in points:
            row = stored[stored["point_key"] == keys[0]].iloc[0]
            repeat = int(stored["repeat"].max()) + 1
            values = repeats([next(self.draws[self.label])])[0]
            knobs = json.loads(row["knobs_json"])
            self.store.save_point(self.run_id, f"{keys[0]}-r{repeat}", study, row["leg"], knobs, repeat, "ok", None,
                                  [{"role": "main", "knobs": knobs, "bw_bytes": values["iops"] * 4096, **values}])
        return []

    def close(self):
        self.store.finish_run(self.run_id)
        self.store.close()


@pytest.fixture
def fake_rerunner(monkeypatch):
    FakeRerunner.opened = []
    monkeypatch.setattr(rerun, "Rerunner", FakeRerunner)
    return FakeRerunner


def test_extra_rounds_of_both_sides_decide_a_noisy_pair_of_three(tmp_path, monkeypatch, capsys, fake_rerunner):
    b, a = noisy_pair(tmp_path)
    as_it_stands = cmp.compare(cmp.load_side(b), cmp.load_side(a), {"iops": 10.0}).gate_result
    assert as_it_stands.exit_status == 3 and as_it_stands.of(gate.INCONCLUSIVE)
    fake_rerunner.draws = {side: itertools.cycle([100e3, 99e3, 101e3]) for side in ("before", "after")}
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "iops=10", "--out", tmp_path / "o",
                              "--until-decided", "--max-extra-rounds", "6", "--rerun-before")
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    rounds = doc["until_decided"]["rounds"]
    assert code == 0 and "gate passed (exit 0" in out, (out, err)
    assert 1 <= len(rounds) < 6 and err.count("compare --until-decided: round ") == len(rounds)
    assert [r["sides"] for r in rounds][:2] == [["after", "before"], ["before", "after"]][:len(rounds)]
    (v,) = doc["gate"]["verdicts"]
    assert v["verdict"] == "within threshold" and "× 7 looks" in v["reason"]
    assert v["confidence"] == pytest.approx(1 - 0.05 / 7)  # every possible look is paid for
    for side in (b, a):  # the repeats are in each side's database
        with ResultsStore(side, read_only=True) as store:
            assert len(store.points()) == 3 + len(rounds)


def test_the_cap_ends_the_rounds_with_exit_3_naming_it(tmp_path, monkeypatch, capsys, fake_rerunner):
    b, a = noisy_after(tmp_path)
    fake_rerunner.draws = {"after": itertools.cycle([130e3, 70e3])}  # more repeats, no narrower interval
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "iops=10", "--until-decided",
                              "--max-extra-rounds", "2", "--out", tmp_path / "o")
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert code == 3 and fake_rerunner.opened == ["after"]  # BEFORE only with --rerun-before
    assert "the cap (--max-extra-rounds 2)" in out and "gate passed" not in out
    assert len(doc["until_decided"]["rounds"]) == 2 and doc["until_decided"]["stopped"].startswith("the cap")
    assert "round 2/2" in err and "--until-decided: 2 of at most 2 extra round(s) on after" in out


def test_after_alone_is_not_rerun_where_befores_spread_keeps_it_undecided(tmp_path, monkeypatch, capsys,
                                                                          fake_rerunner):
    b, a = noisy_pair(tmp_path)  # BEFORE: 8 % over 3 repeats, wider than 10 % at Bonferroni's level
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "iops=10", "--until-decided",
                              "--out", tmp_path / "o")
    assert code == 3 and fake_rerunner.opened == [] and "round" not in err
    assert "BEFORE's 3 repeats alone keep it" in out and "--rerun-before" in out


@pytest.mark.parametrize("env, reason", [
    (None, "no spec of study 'sweep-x' is stored with its runs"),
    ({"spec_effective": {}, "hostname": "another-lab"},
     "it was measured with hostname 'another-lab', this machine has"),
])
def test_a_side_that_cannot_be_rerun_exits_2_naming_why(tmp_path, monkeypatch, capsys, env, reason):
    b, a = noisy_after(tmp_path, env)
    code, out, err = run_main(monkeypatch, capsys, b, a, "--fail-if-slower", "iops=10", "--until-decided",
                              "--out", tmp_path / "o")
    assert code == 2 and f"AFTER: {a}: cannot be re-run here: {reason}" in err, err
    assert "internal error" not in err and not out
    with ResultsStore(a, read_only=True) as store:
        assert len(store.points()) == 3  # nothing added
    with ResultsStore(a) as store:
        store.lock()  # and the lock let go


@pytest.mark.parametrize("args, why", [
    (["--until-decided"], "give --fail-if-slower too"),
    (["--fail-if-slower", "5", "--max-extra-rounds", "3"], "give --until-decided too"),
    (["--fail-if-slower", "5", "--rerun-before"], "give --until-decided too"),
    (["--fail-if-slower", "5", "--until-decided", "--max-extra-rounds", "0"], "give 1 to 100"),
])
def test_until_decided_options_are_checked(tmp_path, monkeypatch, capsys, args, why):
    b, a = noisy_pair(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, b, a, "--out", tmp_path / "o", *args)
    assert code == 2 and why in err and not out, err


@pytest.mark.long
def test_the_real_runner_adds_repeats_to_after_until_decided(fake_env, tmp_path, monkeypatch, capsys):
    """Two runs of one sweep through the real runner (fake binaries with a spread), then compare
    --until-decided: the new repeats are measured by the runner into AFTER, in a run of their own."""
    from nvmflab import env as machine
    from nvmflab.session import run_spec
    from nvmflab.study_spec import load_study_spec

    monkeypatch.setattr(machine, "git_rev", lambda: "same-build")  # others may commit meanwhile
    monkeypatch.setitem(rerun.MACHINE, "git_rev", lambda: "same-build")
    monkeypatch.setenv("FAKE_PERF_JITTER", "0.05")
    spec = tmp_path / "gate.toml"
    spec.write_text('name = "gate"\nrepeats = 3\nramp_time = 0\nruntime = 0.1\n[workload]\nrw = "randread"\n'
                    '[sweep]\niodepth = [1]\n')
    for side in ("before", "after"):
        assert run_spec(load_study_spec(spec), spec, "gate", tmp_path / side, False).code == 0
    code, out, err = run_main(monkeypatch, capsys, tmp_path / "before", tmp_path / "after", "--fail-if-slower",
                              "iops=10", "--until-decided", "--max-extra-rounds", "8", "--out", tmp_path / "o")
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert code == 0 and doc["until_decided"]["rounds"], (out, err)
    with ResultsStore(tmp_path / "after", read_only=True) as store:
        runs, points = store.runs(), store.points()
    added = points[points["run_id"] == runs["run_id"].max()]
    assert len(added) == len(doc["until_decided"]["rounds"]) and set(added["status"]) == {"ok"}
    assert sorted(points["repeat"]) == list(range(len(points)))
    assert json.loads(runs["env_json"].iloc[-1])["until_decided"] is True
    with ResultsStore(tmp_path / "before", read_only=True) as store:
        assert len(store.points()) == 3
    # A stack of another version here: the stored repeats are not this build's, so none is added.
    from nvmflab.runner import PlanningRunner

    monkeypatch.setattr(PlanningRunner, "_safe_version", lambda self, stack, host: "nvmf-target 9.9-other")
    side = rerun.Rerunner(tmp_path / "after", "AFTER", {"gate"})
    try:
        with pytest.raises(rerun.RerunError, match="was measured under another stack version or host"):
            side.next_repeats("gate", sorted(points["point_key"]))
    finally:
        side.close()
