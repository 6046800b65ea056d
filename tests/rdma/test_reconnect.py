"""Reconnect and resubmission over NVMe/RDMA, in the boot conftest.py shares (guest-check.sh's
reconnect_check): nvmf-perf -t rdma --verify writes 1 MiB in 4k writes (QD 4, 100 IOPS at most) to
our target's file namespace; once the I/O queue is connected the target is stopped, so that the
queue's commands are in flight, then killed, and started again half a second later on the same file.
The run must reconnect, resubmit what was in flight on the fresh RDMA queue pair, and end with
every write done once and every block read back correct. The first target ran in event mode with
idle polling, the restarted one in poll mode: both reactor modes serve RDMA queues."""

from __future__ import annotations

import json

import check  # tests/rdma, on sys.path through conftest.py

# One pass over 1 MiB in 4 KiB writes.
WRITES = 256


def perf_report(run) -> dict:
    return json.loads((run.out / "perf-reconnect.json").read_text())


def test_the_target_restarted_under_a_running_rdma_write_verify(guest):
    run, results, _ = guest
    steps = ("reconnect start", "reconnect restart", "reconnect perf")
    bad = [results.get(s, f"MISSING {s}") for s in steps if not results.get(s, "").startswith("PASS")]
    assert not bad, bad
    assert "RDMA queue connected" in (run.out / "reconnect-target-2.log").read_text(), "the host came back to the restarted target"


def test_no_io_was_lost_or_corrupted_across_the_restart(guest):
    run, _, _ = guest
    doc = perf_report(run)
    n = doc["nvmflab"]
    written = sum(j["write"]["total_ios"] for j in doc["jobs"])
    verified = sum(j["verified_ios"] for j in n["jobs"])
    assert written == WRITES, f"each write counted once: {written}"
    assert verified == WRITES, f"every block read back and checked: {verified}"
    assert all(j.get("error") is None for j in n["jobs"]), n["jobs"]


def test_commands_in_flight_were_resubmitted_after_one_outage(guest):
    run, _, _ = guest
    n = perf_report(run)["nvmflab"]
    outages = n["outages"]
    assert len(outages) == 1, f"one restart, one outage: {outages}"
    o = outages[0]
    assert o["duration_ms"] is not None, f"the outage ended: {o}"
    assert o["reconnect_attempts"] >= 1, o
    # The target was stopped before it was killed: the queue's commands were in flight then.
    retried = sum(j["retried_ios"] for j in n["jobs"])
    assert retried >= 1, f"nothing resubmitted: {n['jobs']}"
    assert "reconnected" in (run.out / "perf-reconnect.err").read_text()


def reactor_stats(run, n: int) -> list[dict]:
    """The reactors of reconnect target `n`'s /stats, as the guest read it."""
    return check.stats_json(run.out / f"stats-reconnect-{n}.txt")["reactors"]


def test_event_mode_with_idle_polling_and_poll_mode_each_served_the_rdma_queue(guest):
    run, _, _ = guest
    for n, mode, idle_poll_us in ((1, "event", 2000), (2, "poll", 0)):
        reactors = reactor_stats(run, n)
        assert [(r["mode"], r["idle_poll_us"]) for r in reactors] == [(mode, idle_poll_us)], reactors
        served = [q for q in reactors[0]["queues"] if q["transport"] == "rdma" and q["qid"] >= 1]
        assert served and sum(q["commands"] for q in served) > 0, f"target {n} ({mode}) served no RDMA I/O queue: {reactors}"
