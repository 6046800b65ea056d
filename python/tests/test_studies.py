"""Study-level behaviour on the fake binaries: what each study runs, and how it copes with failures."""

from conftest import nvmflab

from nvmflab.store import ResultsStore

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
    assert done.returncode == 0, done.stderr
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
