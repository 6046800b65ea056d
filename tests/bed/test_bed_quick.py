"""`make test`'s slice of the two-guest bed (issue 39 item 5; `make test-bed-quick`): one TLS point
and one NVMe over RDMA point through `nvmflab run`, target on bed1 and host on bed2, each stored in
its results database with the run's functional label. The kernel stack on both sides: it needs
nothing copied to the guests (our binaries' first copy is the slowest step of a bed run), and its
TLS goes through tlshd on both guests, its RDMA through rxe0 on the bed's link. The whole bed (the
studies, ours and the mixed pairs, the faults) is `make test-bed`.

No timing is asserted: the guests are emulated; the specs' descriptions say their runs are
functional."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

from test_bed_studies import NVMFLAB, SPECS, assert_functional_report

RUN_LIMIT_S = 600  # one point: 40-60 s here on a loaded machine, most of it SSH round trips


def run_point(bed, spec: str) -> Path:
    """`nvmflab run` on specs/SPEC.toml (copied beside the bed's inventory); its results directory."""
    path = bed.work / f"{spec}.toml"
    shutil.copy2(SPECS / f"{spec}.toml", path)
    results = bed.work / f"results-{spec}"
    shutil.rmtree(results, ignore_errors=True)  # an earlier try's point would be resumed, not measured
    done = subprocess.run([str(NVMFLAB), "run", str(path), "--results", str(results)], capture_output=True,
                          text=True, timeout=RUN_LIMIT_S)
    (bed.work / f"{spec}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return results


def the_point(results: Path) -> tuple[dict, dict]:
    """(the run's one point, its main measurement), each a dict of its columns."""
    with sqlite3.connect(results / "results.sqlite") as db:
        db.row_factory = sqlite3.Row
        points = [dict(r) for r in db.execute("SELECT * FROM points")]
        measured = [dict(r) for r in db.execute("SELECT * FROM measurements WHERE role = 'main'")]
    assert len(points) == 1 and len(measured) == 1, (points, measured)
    point = points[0]
    assert point["status"] == "ok", point["error"]
    ids = json.loads(point["identity_json"])
    assert ids["target"]["host"]["name"] == "bed1" and ids["jobs"]["main"]["host"]["name"] == "bed2", ids
    knobs = json.loads(point["knobs_json"])
    assert knobs["target_stack"] == knobs["host_stack"] == "kernel", knobs
    assert measured[0]["total_ios"] > 0
    assert_functional_report(results)
    return point | {"knobs": knobs}, measured[0]


def test_one_kernel_tls_point_with_tlshd_on_both_guests(bed):
    point, measured = the_point(run_point(bed, "quick-tls"))
    assert point["knobs"]["tls"] == "on" and point["knobs"]["transport"] == "tcp"
    # the host's records were the kernel's (kTLS), as the run read them from bed2's tls_stat
    assert (measured["host_tls_records"] or "").startswith("ktls"), measured["host_tls_records"]


def test_one_kernel_rdma_point_over_the_bed_link(bed):
    before = rxe_sent_packets(bed)
    point, measured = the_point(run_point(bed, "quick-rdma"))
    assert point["knobs"]["transport"] == "rdma" and point["knobs"]["tls"] == "off"
    # the I/O went over rxe0: each command the host sent is at least one packet of bed2's rxe0
    assert rxe_sent_packets(bed) - before >= measured["total_ios"] > 0


def rxe_sent_packets(bed) -> int:
    return int(bed.ssh("bed2", "cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts").stdout)
