"""The soak's verdicts on made-up samples and reports (the soak itself runs in `make test-soak`)."""

import json

from nvmflab.soak import Hostile, host_outcome, memory_flat

MiB = 1 << 20


def test_memory_flat_judges_the_quiet_periods_last_incarnation_after_its_warmup():
    restarts = [(t, 1, 100 * MiB + t * MiB) for t in range(0, 30)]  # growth before the quiet half: ignored
    steady = [(t, 2, 40 * MiB + (t % 3) * MiB) for t in range(30, 60)]
    verdict = memory_flat(restarts + steady, quiet_from=30, warmup_s=5)
    assert verdict["flat"] and verdict["after_warmup_bytes"] == 40 * MiB + 2 * MiB
    leaking = [(t, 2, 40 * MiB + (t - 30) * 2 * MiB) for t in range(30, 60)]
    verdict = memory_flat(restarts + leaking, quiet_from=30, warmup_s=5)
    assert not verdict["flat"] and "growth allowed 16.0 MiB" in verdict["detail"]
    assert not memory_flat([(t, 1, MiB) for t in range(10)], quiet_from=30, warmup_s=5)["flat"]


def test_host_outcome_sums_jobs_and_reports_failures(tmp_path):
    report, log = tmp_path / "r.json", tmp_path / "h.log"
    doc = {"jobs": [{"read": {"total_ios": 10}, "write": {"total_ios": 30}}],
           "nvmflab": {"jobs": [{"verified_ios": 30, "retried_ios": 2}], "outages": [{"duration_ms": 700}]}}
    report.write_text(json.dumps(doc))
    log.write_text("started\n")
    ok = host_outcome(0, "randrw 4k", report, 0, log)
    assert (ok["ios"], ok["verified_ios"], ok["retried_ios"], len(ok["outages"])) == (40, 30, 2, 1)
    assert "error" not in ok
    log.write_text("nvmf-perf: verify: LBA 7 holds a pattern for LBA 9\n")
    assert host_outcome(0, "randrw 4k", report, 1, log)["error"] == "exit 1: nvmf-perf: verify: LBA 7 holds a pattern for LBA 9"
    report.unlink()
    assert "no report" in host_outcome(0, "randrw 4k", report, 1, log)["error"]
    doc["nvmflab"]["jobs"][0]["verified_ios"] = 0
    report.write_text(json.dumps(doc))
    assert host_outcome(0, "randrw 4k", report, 0, log)["error"] == "no I/O was read back and checked"


def test_hostile_payloads_are_garbage_half_pdus_and_oversized_headers():
    hostile = Hostile(port=1, per_second=1, seed=3)
    half = hostile.payload("half_pdu")
    assert 1 <= len(half) < 128 and half[0] == 0x00  # an ICReq cut short
    assert int.from_bytes(hostile.payload("bad_icreq")[4:8], "little") == 0x7FFFFFFF
    assert hostile.payload("silent") == b"" and 1 <= len(hostile.payload("garbage")) <= 4096
