import json
import math

import pytest

from nvmflab.metrics import summarize
from nvmflab.plan import point_key
from nvmflab.store import ResultsStore

REQUIRED = ("run_id study leg point_id point_key repeat role status error engine rw bs iodepth numjobs rate_iops "
            "completion target_mode idle_poll_us hdr_digest data_digest io_queues bg_load_pct knobs_json iops "
            "bw_bytes lat_mean_ns lat_p50_ns lat_p90_ns lat_p99_ns lat_p99_9_ns lat_p99_99_ns lat_max_ns usr_cpu "
            "sys_cpu ctx voluntary_ctx involuntary_ctx target_usr_s target_sys_s histogram_json invariant_ok "
            "invariant_detail").split()

KNOBS = {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "rate_iops": 0, "completion": "poll",
         "target_mode": "event", "idle_poll_us": 40, "hdr_digest": False, "data_digest": True, "io_queues": 1}


def perf_json(iops: float, ios: int) -> dict:
    side = {"iops": iops, "bw_bytes": iops * 4096, "total_ios": ios,
            "clat_ns": {"mean": 20000.0, "max": 90000, "percentile": {"99.000000": 50000}}}
    return {"jobs": [{"read": side, "write": {"total_ios": 0}, "usr_cpu": 10.0, "sys_cpu": 20.0, "ctx": 7,
                      "job_runtime": 1000}],
            "nvmflab": {"engine": "tcp", "voluntary_ctx": 5, "involuntary_ctx": 2,
                        "histogram": {"read": [[10000, 98], [50000, 1], [90000, 1]], "write": []}}}


def test_round_trip_keeps_points_measurements_and_runs(tmp_path):
    with ResultsStore(tmp_path) as store:
        run = store.start_run("polling", "name = 'x'\n", {"git_rev": "abc", "cores": 2})
        fg = summarize(perf_json(1000.0, 1000)) | {"role": "fg", "target_usr_s": 0.5, "target_sys_s": 0.25,
                                                   "invariant_ok": False, "invariant_detail": "fg on reactor 1"}
        bg = summarize(perf_json(5000.0, 5000)) | {"role": "bg", "knobs": KNOBS | {"iodepth": 32, "rate_iops": 900},
                                                   "invariant_ok": False, "invariant_detail": "fg on reactor 1"}
        key = point_key("interference", "target", KNOBS | {"bg_load_pct": 60}, 0, 10, 2)
        store.save_point(run, key, "interference", "target", KNOBS | {"bg_load_pct": 60}, 0, "invalid",
                         "fg on reactor 1", [fg, bg], fg_bg_shared_core=True, raw={"x": 1})
        failed_knobs = KNOBS | {"iodepth": 8}
        store.save_point(run, point_key("polling", "completion", failed_knobs, 0, 10, 2), "polling", "completion",
                         failed_knobs, 0, "failed", "nvmf-perf exited 1: refused", [])
        store.finish_run(run)

    store = ResultsStore(tmp_path)  # reopened: everything came from disk
    frame = store.measurements()
    assert set(REQUIRED) <= set(frame.columns)
    assert len(frame) == 3
    fg_row, bg_row, failed = frame.iloc[0], frame.iloc[1], frame.iloc[2]
    assert (fg_row.role, fg_row.status, fg_row.iops, fg_row.bg_load_pct) == ("fg", "invalid", 1000.0, 60.0)
    assert fg_row.lat_p99_ns == 50000 and fg_row.lat_p50_ns == 10000
    assert json.loads(fg_row.histogram_json) == [[10000, 98], [50000, 1], [90000, 1]]
    assert fg_row.invariant_ok is False and fg_row.fg_bg_shared_core
    assert fg_row.data_digest is True and fg_row.hdr_digest is False
    assert (bg_row.iodepth, bg_row.rate_iops, bg_row.knobs_json) == (32, 900, fg_row.knobs_json)
    assert failed.status == "failed" and "refused" in failed.error and math.isnan(failed.iops)
    assert math.isnan(failed.bg_load_pct) and failed.invariant_ok is None and failed.role == "main"
    runs = store.runs()
    assert list(runs.columns) == ["run_id", "study", "spec_toml", "env_json", "git_rev", "started_at", "finished_at"]
    assert runs.iloc[0].git_rev == "abc" and runs.iloc[0].finished_at
    assert (tmp_path / "raw" / f"{key}.json").is_file()


def test_failed_points_are_retried_and_replaced(tmp_path):
    store = ResultsStore(tmp_path)
    run = store.start_run("x", "", {})
    store.save_point(run, "k1", "x", "sweep", KNOBS, 0, "failed", "boom", [])
    store.save_point(run, "k2", "x", "sweep", KNOBS, 1, "ok", None, [summarize(perf_json(1.0, 1)) | {"role": "main"}])
    assert store.done_keys() == {"k2"}
    store.save_point(run, "k1", "x", "sweep", KNOBS, 0, "ok", None, [summarize(perf_json(2.0, 2)) | {"role": "main"}])
    assert store.done_keys() == {"k1", "k2"}
    assert len(store.measurements()) == 2


def test_max_background_load_is_infinite(tmp_path):
    store = ResultsStore(tmp_path)
    run = store.start_run("interference", "", {})
    store.save_point(run, "k", "interference", "initiator", KNOBS | {"bg_load_pct": "max"}, 0, "ok", None, [])
    assert store.measurements().iloc[0].bg_load_pct == math.inf


def test_a_store_from_before_extra_load_generators_takes_lg_roles_and_keeps_its_rows(tmp_path):
    import sqlite3

    from nvmflab.store import OLD_ROLE_CHECK, ROLE_CHECK, SCHEMA

    directory = tmp_path / "old"
    directory.mkdir()
    db = sqlite3.connect(directory / "results.sqlite")
    db.executescript(SCHEMA.replace(ROLE_CHECK, OLD_ROLE_CHECK))
    db.execute("INSERT INTO runs (study, spec_toml, env_json, started_at) VALUES ('s', '', '{}', 'now')")
    db.execute("INSERT INTO points (run_id, point_key, study, leg, knobs_json, repeat, status) "
               "VALUES (1, 'k0', 's', 'l', '{}', 0, 'ok')")
    db.execute("INSERT INTO measurements (point_id, role, iops) VALUES (1, 'fg', 123.0)")
    db.commit()
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO measurements (point_id, role, iops) VALUES (1, 'lg1', 1.0)")
    db.close()
    with ResultsStore(directory) as store:
        run = store.start_run("s", "", {})
        store.save_point(run, "k1", "s", "l", {}, 0, "ok", None, [{"role": "main", "iops": 1.0},
                                                                    {"role": "lg1", "iops": 2.0}])
        frame = store.measurements()
        assert sorted(zip(frame["role"], frame["iops"])) == [("fg", 123.0), ("lg1", 2.0), ("main", 1.0)]
        with pytest.raises(sqlite3.IntegrityError):
            store.save_point(run, "k2", "s", "l", {}, 0, "ok", None, [{"role": "other", "iops": 1.0}])
    with ResultsStore(directory) as store:  # opening again changes nothing
        assert len(store.measurements()) == 3


def test_a_run_with_an_outage_is_not_a_measurement():
    from nvmflab.runner import outage_text

    quiet = {"main": {"json": {"nvmflab": {"outages": []}}}}
    assert outage_text(quiet) is None and outage_text({"main": {"json": {}}}) is None
    lost = {"main": {"json": {"nvmflab": {"outages": [{"duration_ms": 1206, "cause": "connection reset"}]}}}}
    assert outage_text(lost) == ("connection lost and re-established during the run "
                                 "(main: 1206 ms (connection reset)); a re-run measures it again")
