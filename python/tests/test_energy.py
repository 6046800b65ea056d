"""RAPL energy per point (issue 24 item 5) against a fake /sys/class/powercap tree."""

import json

import pytest

from nvmflab import energy, probes


def zone(root, name, label, uj, max_uj=262143328850):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


@pytest.fixture
def powercap(tmp_path):
    root = tmp_path / "powercap"
    zone(root, "intel-rapl:0", "package-0", 1_000_000)
    zone(root, "intel-rapl:0:0", "core", 500_000)
    zone(root, "intel-rapl:0:1", "dram", 200_000)
    zone(root, "intel-rapl:1", "package-1", 3_000_000)
    zone(root, "intel-rapl-mmio:0", "package-0", 7_000_000)  # the MMIO copy of package 0
    (root / "intel-rapl").mkdir()  # the control type directory has no energy_uj
    return root


def bump(root, name, uj):
    (root / name / "energy_uj").write_text(f"{uj}\n")


def test_window_sums_packages_and_dram_once(powercap):
    before = energy.local_snapshot(powercap)
    assert before["unavailable"] is None and set(before["zones"]) == {
        "intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:1", "intel-rapl-mmio:0"}
    bump(powercap, "intel-rapl:0", 6_000_000)      # +5 J
    bump(powercap, "intel-rapl:0:0", 3_500_000)    # core +3 J: inside the package, not added
    bump(powercap, "intel-rapl:0:1", 1_200_000)    # dram +1 J
    bump(powercap, "intel-rapl:1", 5_500_000)      # +2.5 J
    bump(powercap, "intel-rapl-mmio:0", 12_000_000)  # the copy: not added again
    w = energy.window(before, energy.local_snapshot(powercap))
    assert w["available"]
    assert w["package_j"] == pytest.approx(7.5) and w["dram_j"] == pytest.approx(1.0)
    assert w["zones"]["intel-rapl:0:0"]["kind"] == "core"


def test_counter_wrap_is_handled(tmp_path):
    root = tmp_path / "pc"
    zone(root, "intel-rapl:0", "package-0", 999_000, max_uj=1_000_000)
    before = energy.local_snapshot(root)
    bump(root, "intel-rapl:0", 1_000)  # wrapped: 999000 → 1000000 → 0 → 1000
    w = energy.window(before, energy.local_snapshot(root))
    assert w["package_j"] == pytest.approx((1_000_000 - 999_000 + 1 + 1_000) / 1e6)


def test_absent_or_unreadable_reads_not_available(tmp_path):
    missing = energy.local_snapshot(tmp_path / "nothing")
    assert missing["zones"] == {} and missing["unavailable"].startswith("not available")
    w = energy.window(missing, missing)
    assert not w["available"] and w["package_j"] is None and "no RAPL zones" in w["reason"]
    cols = energy.summarize({"local": w}, 1000)
    assert cols["energy_pkg_j"] is None and cols["joules_per_io"] is None
    assert energy.availability(cols["energy_json"]).startswith("local: no RAPL zones")
    # Unreadable (root only): the reason says so.
    root = tmp_path / "pc"
    d = zone(root, "intel-rapl:0", "package-0", 5)
    (d / "energy_uj").unlink()
    (d / "energy_uj").mkdir()  # reading it fails like a permission error does
    assert "not readable" in energy.local_snapshot(root)["unavailable"]


def test_joules_per_io_needs_every_machine(powercap, tmp_path):
    before = energy.local_snapshot(powercap)
    bump(powercap, "intel-rapl:0", 3_000_000)  # +2 J
    here = energy.window(before, energy.local_snapshot(powercap))
    cols = energy.summarize({"local": here}, 4000)
    assert cols["joules_per_io"] == pytest.approx((2.0 + 0.0) / 4000)
    none = energy.window(energy.local_snapshot(tmp_path / "x"), energy.local_snapshot(tmp_path / "x"))
    partial = energy.summarize({"local": here, "server2": none}, 4000)
    assert partial["joules_per_io"] is None  # a partial sum would understate the cost
    assert "server2" in json.loads(partial["energy_json"])


def test_remote_script_output_parses_like_the_local_read(powercap):
    lines = []
    for d in sorted(powercap.iterdir()):
        if (d / "energy_uj").exists():
            lines.append(f"zone {d.name} {(d / 'energy_uj').read_text().strip()} "
                         f"{(d / 'max_energy_range_uj').read_text().strip()} {(d / 'name').read_text().strip()}")
    lines.append("unreadable intel-rapl:9")
    assert energy.parse_remote("\n".join(lines))["zones"] == energy.local_snapshot(powercap)["zones"]
    assert "not readable" in energy.parse_remote("unreadable intel-rapl:0\n")["unavailable"]


def test_probes_read_around_a_point_through_the_environment(powercap, monkeypatch):
    monkeypatch.setenv("NVMFLAB_POWERCAP_ROOT", str(powercap))
    machines = {"local": (None, [0])}
    before = probes.take(machines)
    bump(powercap, "intel-rapl:0", 2_000_000)   # +1 J
    bump(powercap, "intel-rapl:0:1", 700_000)   # +0.5 J
    cols = probes.columns(before, probes.take(machines), 1500)
    assert cols["energy_pkg_j"] == pytest.approx(1.0) and cols["energy_dram_j"] == pytest.approx(0.5)
    assert cols["joules_per_io"] == pytest.approx(1.5 / 1500)


def test_runner_stores_energy_and_report_shows_it_or_not_available(fake_env, tmp_path, powercap):
    """Through the real runner (fake binaries): energy columns per point, then the report's table;
    without a powercap tree the columns are NULL and the report says 'not available'."""
    from conftest import nvmflab

    from nvmflab.store import ResultsStore

    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nrepeats = 1\nramp_time = 0\nruntime = 0.2\n[workload]\nrw = "randread"\n'
                    '[sweep]\niodepth = [1, 2]\n')
    for label, root in (("with", powercap), ("without", tmp_path / "absent")):
        env = {**fake_env, "NVMFLAB_POWERCAP_ROOT": str(root), "MPLBACKEND": "Agg"}
        done = nvmflab("run", str(spec), "--results", str(tmp_path / label), env=env, timeout=240)
        assert done.returncode == 0, done.stderr
        with ResultsStore(tmp_path / label) as store:
            rows = store.measurements()
        assert len(rows) == 2 and (rows["status"] == "ok").all()
        assert rows["net_json"].notna().all()  # this machine's /proc was read around each point
        html = (tmp_path / label / "report" / "report.html").read_text()
        if label == "with":
            assert (rows["energy_pkg_j"] == 0).all()  # the fake counters did not move
            assert (rows["joules_per_io"] == 0).all() and "Energy per I/O (RAPL)" in html
        else:
            assert rows["energy_pkg_j"].isna().all() and rows["joules_per_io"].isna().all()
            assert "Energy per I/O: not available" in html and "no RAPL zones" in html
