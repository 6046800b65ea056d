"""Study-level behaviour on the fake binaries: what each study runs, and how it copes with failures."""

from types import SimpleNamespace

from conftest import REPO, nvmflab, ours_stacks

from nvmflab.spec import load_spec
from nvmflab.store import ResultsStore
from nvmflab.studies import common, saturation, study_params
from nvmflab.topology.base import Hosts
from nvmflab.topology.local import LocalHost
from nvmflab.studies.common import Context

INTERFERENCE = """
study = "interference"
repeats = 1
ramp_time = 0
runtime = 0.2
[params]
resources = ["initiator", "target"]
fg_apps = ["L-app"]
bg_load_pct = [50, "max"]
bg_iodepth = 8
calibrate_iodepth = [16]
control = false
"""


def test_failed_calibration_fails_the_capped_points_and_the_study_goes_on(tmp_path, fake_env):
    spec = tmp_path / "interference.toml"
    spec.write_text(INTERFERENCE)
    env = fake_env | {"FAKE_PERF_FAIL_IODEPTH": "16"}  # every calibration point fails
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env)
    assert done.returncode == 1, done.stderr  # the capped points failed; the rest ran
    assert done.stdout.strip().splitlines()[-1].endswith("report.html")
    points = ResultsStore(tmp_path / "r").measurements()
    for resource in ("initiator", "target"):
        leg = points[points["leg"] == resource]
        capped = leg[leg["bg_load_pct"] == 50]
        assert set(capped["status"]) == {"failed"}
        assert capped["error"].str.contains(f"no calibrate_{resource} point succeeded .*exited 1").all()
        assert set(leg[leg["bg_load_pct"] != 50]["status"]) == {"ok"}  # isolated and "max" need no cap
    html = (tmp_path / "r" / "report" / "report.html").read_text()
    assert "no saturation point to cap the background at" in html


def saturation_legs(monkeypatch, tmp_path, cores: list[int]) -> dict[str, list]:
    """The points studies/saturation.toml (quick) builds per leg on a machine with these cores."""
    monkeypatch.setattr(common, "available_cores", lambda: cores)
    spec = load_spec(REPO / "studies" / "saturation.toml", quick=True)
    legs = {}
    local = LocalHost()
    runner = SimpleNamespace(run=lambda points, _description: [legs.setdefault(p.leg, []).append(p) for p in points],
                             progress=None,
                             hosts=Hosts(local, [local]), stacks_for=ours_stacks)
    saturation.execute(Context(spec, "saturation", runner, SimpleNamespace(dir=tmp_path)),
                       study_params("saturation", spec.params))
    return legs


def test_saturation_legs_isolate_each_resource_on_four_cores(monkeypatch, tmp_path):
    legs = saturation_legs(monkeypatch, tmp_path, [0, 1, 2, 3])
    assert set(legs) == {"initiator", "target", "target_cores"}
    # target core counts 1 and 2 against host cores no target uses
    assert {(p.jobs[0].cpus, p.target.cores) for p in legs["target_cores"]} == {((2, 3), (0,)), ((2, 3), (0, 1))}
    assert {(p.jobs[0].cpus, p.target.cores) for p in legs["initiator"]} == {((1,), (0, 2))}
    assert {(p.jobs[0].cpus, p.target.cores) for p in legs["target"]} == {((1, 3), (0,))}
    assert not any(p.skip_reason for leg in legs.values() for p in leg)
    assert legs["initiator"][0].knobs["host_cores"] == "1" and legs["initiator"][0].knobs["target_cores"] == "0,2"


def test_saturation_on_two_cores_says_why_and_measures_one_core_each(monkeypatch, tmp_path):
    legs = saturation_legs(monkeypatch, tmp_path, [0, 1])
    assert set(legs) == {"initiator", "target", "combined", "target_cores"}
    assert all(p.skip_reason.startswith("too few cores to sweep the target's core count") for p in legs["target_cores"])
    for resource in ("initiator", "target"):
        assert all(p.skip_reason.startswith(f"too few cores to isolate the {resource} core") for p in legs[resource])
    assert {(p.jobs[0].cpus, p.target.cores, p.skip_reason) for p in legs["combined"]} == {((1,), (0,), None)}
