"""Faults on the two-guest bed (issue 39 item 4), through the harness as a user runs it: the link
between the guests cut and restored during a TLS run and during an RDMA run, the target's guest
powered off mid-run, and the harness SIGKILLed with its target up. Each checks what the user is
promised: a point hit by a fault reconnects or is stored failed with its reason, every point
measured before stays in the database, the next point runs; a guest gone ends the run naming it
and the same command resumes it; what a killed run left on a guest is removed by the next run.

Faults are made from outside the guests, as a pulled cable and a power cut are: qemu's monitor
(`set_link link off` takes the carrier off both ends of the bed's link; `quit` stops a guest at
once). No timing is asserted; the points are functional (specs/faults.toml)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from test_bed_studies import NVMFLAB, SPECS, STUDY_LIMIT_S, points

CUT_S = 6  # under the kernel host's ctrl-loss-tmo (10 s): it may reconnect, or the point fails named
WAIT_S = 1200  # for the first point to be stored, on emulated guests of a loaded machine
MARK = "nqn.2024-01.io.nvmflab:"
USER_SUB, USER_HOST = "nqn.2026-01.example:bed-user", "nqn.2026-01.example:bed-user-host"


def study(bed, name: str, params: dict[str, str], spec: str = "faults") -> tuple[list[str], Path]:
    """The argv of `nvmflab study` on specs/SPEC.toml with [params] lines replaced, and its results."""
    text = (SPECS / f"{spec}.toml").read_text()
    for key, value in params.items():
        lines = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert len(lines) == 1, f"{spec}.toml has no single {key} line"
        text = text.replace(lines[0], f"{key} = {value}")
    path = bed.work / f"{name}.toml"
    path.write_text(text)
    study_name = next(line.split('"')[1] for line in text.splitlines() if line.startswith("study = "))
    results = bed.work / f"results-{name}"
    shutil.rmtree(results, ignore_errors=True)  # an earlier try's points would be resumed, not measured
    return [str(NVMFLAB), "study", study_name, "--spec", str(path), "--results", str(results)], results


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=os.environ.copy())


def finish(proc: subprocess.Popen, log: Path) -> tuple[int, str]:
    try:
        proc.wait(STUDY_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the study ran over {STUDY_LIMIT_S} s: {log.read_text()[-2000:]}") from None
    return proc.returncode, log.read_text()


def wait_for(what: str, ready, proc: subprocess.Popen, log: Path, limit: float = WAIT_S) -> None:
    """Poll `ready()` every 2 s until it holds; the study ending first, or the limit, fails the test."""
    deadline = time.monotonic() + limit
    while not ready():
        assert proc.poll() is None, f"the study ended before {what}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {what} in {limit:.0f} s"
        time.sleep(2)


def stored(results: Path) -> list[dict]:
    db = results / "results.sqlite"
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            rows = conn.execute("SELECT point_key, status, error, started_at, finished_at FROM points").fetchall()
    except sqlite3.OperationalError:  # the harness is creating its tables
        return []
    return [dict(zip(("key", "status", "error", "started", "finished"), row)) for row in rows]


def running(bed, guest: str, program: str) -> bool:
    return bed.ssh(guest, f"pgrep -x {program}", check=False, timeout=60).returncode == 0


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


def cut_link_during_a_point(bed, name: str, params: dict[str, str], generator: str) -> None:
    argv, results = study(bed, name, params)
    log = bed.work / f"{name}.log"
    proc = start(argv, log)
    try:
        wait_for("stored point", lambda: len(stored(results)) >= 1, proc, log)
        wait_for(f"{generator} running on bed2", lambda: running(bed, "bed2", generator), proc, log, 600)
        cut = datetime.now(timezone.utc).replace(microsecond=0)
        bed.set_link(False)
        time.sleep(CUT_S)
        bed.set_link(True)
        restored = datetime.now(timezone.utc)
    finally:
        bed.set_link(True)  # the link back for the tests after, whatever failed
    rc, out = finish(proc, log)
    got = stored(results)
    assert len(got) == 4, got  # L-app, T-app at QD 1 and 2, B-app: every point stored, none lost
    before = [p for p in got if utc(p["finished"]) <= cut]
    hit = [p for p in got if utc(p["started"]) <= restored and utc(p["finished"]) > cut]
    after = [p for p in got if utc(p["started"]) > restored]
    assert before and after, got  # the cut fell inside the run, and points ran after it
    assert all(p["status"] == "ok" for p in before + after), [(p["status"], p["error"]) for p in got]
    for p in hit:  # reconnected (ok), or failed with its reason
        assert p["status"] == "ok" or (p["status"] == "failed" and p["error"]), p
    print(f"{name}: the point under the cut: {[(p['status'], p['error']) for p in hit]}")
    assert rc == (1 if any(p["status"] == "failed" for p in got) else 0), out[-3000:]


def test_link_cut_and_restored_during_a_tls_run(bed):
    cut_link_during_a_point(bed, "faults-tls", {"stacks": '["ours"]', "configs": '["tls"]'}, "nvmf-perf")


def test_link_cut_and_restored_during_an_rdma_run(bed):
    cut_link_during_a_point(bed, "faults-rdma", {"stacks": '["kernel"]', "configs": '["rdma"]'}, "fio")


def nvmet_names(bed, kind: str) -> list[str]:
    done = bed.ssh("bed1", f"ls /sys/kernel/config/nvmet/{kind} 2>/dev/null", check=False, timeout=60)
    return done.stdout.split()


def test_a_killed_harness_leaves_a_keyed_host_entry_that_the_next_run_removes(bed):
    # DH-HMAC-CHAP: the target keys an nvmet host entry; left behind, it was refused by name.
    params = {"modes": '["dhchap"]', "data_modes": '["dhchap"]', "wrong_key": "false"}
    argv, results = study(bed, "faults-killed", params, spec="security")
    log = bed.work / "faults-killed.log"
    proc = start(argv, log)
    wait_for("target up on bed1 (a keyed host entry, a port serving the subsystem)",
             lambda: MARK + "host:tls" in nvmet_names(bed, "hosts") and any(n.startswith(MARK) for n in nvmet_names(bed, "ports/*/subsystems")),
             proc, log)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    left = {kind: [n for n in nvmet_names(bed, kind) if n.startswith(MARK)] for kind in ("subsystems", "hosts")}
    assert left["subsystems"] and left["hosts"] == [MARK + "host:tls"], left
    bed.ssh("bed1", f"mkdir /sys/kernel/config/nvmet/subsystems/{USER_SUB} /sys/kernel/config/nvmet/hosts/{USER_HOST}")
    try:
        rc, out = finish(start(argv, log.with_suffix(".again.log")), log.with_suffix(".again.log"))
        assert rc == 0, out[-3000:]
        removed = next(line for line in out.splitlines() if "bed1: removed what an earlier nvmflab run left:" in line)
        assert f"host entry {MARK}host:tls" in removed and "port " in removed and "null_blk nvmflab-" in removed
        assert not [n for n in nvmet_names(bed, "subsystems") + nvmet_names(bed, "hosts") if n.startswith(MARK)]
        assert USER_SUB in nvmet_names(bed, "subsystems") and USER_HOST in nvmet_names(bed, "hosts")
        data = [p for p in points(results) if p["app"] != "connect"]
        assert len(data) == 3 and all(p["status"] == "ok" for p in data), data
    finally:
        bed.ssh("bed1", f"rmdir /sys/kernel/config/nvmet/subsystems/{USER_SUB} "
                        f"/sys/kernel/config/nvmet/hosts/{USER_HOST}", check=False)


def test_the_target_guest_powered_off_ends_the_run_naming_it_and_the_same_command_resumes(bed):
    argv, results = study(bed, "faults-power", {"stacks": '["kernel"]', "configs": '["tcp"]'})
    log = bed.work / "faults-power.log"
    proc = start(argv, log)
    wait_for("stored point", lambda: len(stored(results)) >= 1, proc, log)
    wait_for("fio running on bed2", lambda: running(bed, "bed2", "fio"), proc, log, 600)
    bed.monitor("bed1", "quit")  # a power cut: the guest stops at once, nothing shut down
    rc, out = finish(proc, log)
    assert rc != 0 and "bed1 stopped answering during the run" in out and "run the same command again" in out, \
        out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    kept = {p["key"]: p for p in stored(results) if p["status"] == "ok"}
    assert kept and len(kept) < 4, stored(results)
    bed.back_up("bed1")
    rc, out = finish(start(argv, log.with_suffix(".again.log")), log.with_suffix(".again.log"))
    assert rc == 0, out[-3000:]
    got = stored(results)
    assert len(got) == 4 and all(p["status"] == "ok" for p in got), got
    for key, p in kept.items():  # measured before the power cut: kept, not measured again
        assert next(q for q in got if q["key"] == key)["started"] == p["started"]
