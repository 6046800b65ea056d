"""bench/nvmfbench/syscalls.py, wire_row.py and bench/kernel_wire.py's reading of a guest run's files
(issue 40 item 3): system calls per I/O from the kernel's hist trigger and from perf trace, and the
README table's row from a capture summary. Nothing is booted or captured here."""

from __future__ import annotations

import json
import struct
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kernel_wire  # noqa: E402
import wire_capture  # noqa: E402
from nvmfbench import syscalls, wire, wire_row  # noqa: E402

TARGET_TIDS = {311, 312}
# What `cat events/raw_syscalls/sys_exit/hist` prints for keys=common_pid,id.syscall (Linux 6.12):
# the target's two threads, and fio (400) whose calls must not count.
HIST = """# event histogram
#
# trigger info: hist:keys=common_pid,id.syscall:vals=hitcount:sort=hitcount:size=4096 if ret >= 0 [active]
#

{ common_pid:        312, id: sys_writev                    [ 20] } hitcount:         30
{ common_pid:        311, id: sys_accept4                   [288] } hitcount:          1
{ common_pid:        312, id: sys_recvfrom                  [ 45] } hitcount:         60
{ common_pid:        400, id: sys_io_submit                 [209] } hitcount:        500
{ common_pid:        312, id: sys_recvfrom                  [ 45] } hitcount:          4

Totals:
    Hits: 595
    Entries: 5
    Dropped: 0
"""
PERF_TRACE = """
 Summary of events:

 nvmf-target (5998), 318 events, 97.5%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   recvfrom             500    400     0.351     0.006     0.009     0.027      6.78%
   writev                50      0     0.340     0.008     0.011     0.024      5.87%

 reactor-0 (5999), 10 events, 2.5%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   readv                 25      0     0.064     0.006     0.009     0.023     25.43%
"""


def test_hist_counts_only_the_targets_threads_per_io():
    hist = syscalls.parse_hist(HIST)
    assert hist[(400, "io_submit")] == 500
    calls = syscalls.threads_calls(hist, TARGET_TIDS)
    assert calls == Counter({"recvfrom": 64, "writev": 30, "accept4": 1})
    assert syscalls.calls_per_io(calls, 32) == {"recvfrom": 2.0, "writev": 0.938, "accept4": 0.031}


def test_a_hist_that_dropped_entries_or_never_ran_is_a_named_error():
    with pytest.raises(syscalls.SyscallsError, match="dropped 7"):
        syscalls.parse_hist(HIST.replace("Dropped: 0", "Dropped: 7"))
    with pytest.raises(syscalls.SyscallsError, match="no histogram entries"):
        syscalls.parse_hist("")
    with pytest.raises(syscalls.SyscallsError, match="no I/O commands"):
        syscalls.parse_ios("350 350\n")
    assert syscalls.parse_ios("42 350\n") == 308


def test_perf_trace_counts_successful_calls_over_every_thread():
    assert syscalls.parse_perf_trace(PERF_TRACE) == Counter({"recvfrom": 100, "writev": 50, "readv": 25})
    with pytest.raises(syscalls.SyscallsError, match="not a perf trace"):
        syscalls.parse_perf_trace("perf: no permission\n")


def pdu(kind: int, flags: int, hlen: int, pdo: int, specific: bytes, data: bytes = b"") -> bytes:
    header = specific.ljust(hlen - 8, b"\0")
    return struct.pack("<BBBBI", kind, flags, hlen, pdo, 8 + len(header) + len(data)) + header + data


def capsule(opcode: int, data: bytes = b"") -> bytes:
    return pdu(4, 0, 72, 72 if data else 0, bytes([opcode, 0, 1, 0]) + b"\0" * 60, data)


def stream(*segments: bytes) -> wire.Stream:
    data = b"".join(segments)
    at = [sum(map(len, segments[:i])) for i in range(len(segments))]
    return wire.Stream(data=data, segments=list(zip(at, map(len, segments))))


IC_REQ = pdu(0, 0, 128, 0, b"")
IC_RESP = pdu(1, 0, 128, 0, struct.pack("<HBBI", 0, 0, 0, 131072))
RESP = pdu(5, 0, 24, 0, b"")


def test_rows_say_how_write_data_went_and_what_a_read_got():
    # A 4 KiB write in the capsule, and a 128 KiB write after one R2T in one H2CData.
    r2t = pdu(9, 0, 24, 0, struct.pack("<HHII", 2, 0, 0, 131072))
    h2c = pdu(6, 0x04, 24, 24, struct.pack("<HHII", 2, 0, 0, 131072), b"w" * 131072)
    writes = wire.summarize(stream(IC_REQ, capsule(0x01, b"w" * 4096), capsule(0x01), h2c),
                            stream(IC_RESP, RESP, r2t, RESP))
    row = wire_row.table_row("mixed", "a host", writes, {"recvfrom": 0.5, "readv": 1.0})
    assert row.split(" | ")[2] == "4096 in the capsule; R2T (R2TL 131072) 0.5 per command, H2CData 131072 0.5 per command"
    assert row.split(" | ")[3] == "-"  # no reads
    assert row.endswith("| 0.5, 1, 0 |")  # recvfrom, readv, writev (none counted)
    # Reads: C2HData LAST then a CapsuleResp, the summary as JSON gives it back (string keys).
    c2h = pdu(7, 0x04, 24, 24, struct.pack("<HHII", 1, 0, 0, 4096), b"r" * 4096)
    reads = json.loads(json.dumps(wire.summarize(stream(IC_REQ, capsule(0x02)), stream(IC_RESP, c2h + RESP))))
    cells = wire_row.table_row("4k randread QD1", "h", reads, None).split(" | ")
    assert cells[3] == "C2HData 4096 (LAST) + CapsuleResp 1 per command"
    assert cells[4] == "2 (100)" and cells[5] == "? |"  # ICReq + capsule over 1 command; calls not counted
    assert wire_row.work_name("128k-randwrite-qd32") == "128k randwrite QD32"
    assert wire_row.work_name("4k-randread-qd32+digest+batch") == (
        "4k randread QD32, header and data digests, fio submits in batches")


def test_kernel_wire_report_reads_a_finished_guest_run(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    c2h = pdu(7, 0x04, 24, 24, struct.pack("<HHII", 1, 0, 0, 4096), b"r" * 4096)
    summary = wire.summarize(stream(IC_REQ, capsule(0x02), capsule(0x02)), stream(IC_RESP, c2h + RESP, c2h + RESP))
    (out / "4k-randread-qd1.summary.json").write_text(json.dumps(summary))
    (out / "4k-randread-qd1.hist.txt").write_text(HIST)
    (out / "4k-randread-qd1.tids.txt").write_text("311\n312\n")
    (out / "4k-randread-qd1.ios.txt").write_text("10 42\n")
    assert kernel_wire.main(["--report", str(tmp_path), "--works", "4k-randread-qd1"]) == 0
    row = capsys.readouterr().out.strip()
    assert row.startswith("| 4k randread QD1 | Linux 6.12 nvme-tcp")
    assert row.endswith("| 2, 0, 0.938 |")  # 64 recvfrom and 30 writev over 32 I/O commands
    assert json.loads((out / "report.json").read_text())[0]["ios"] == 32
    # A work whose capture was not summarized is named, and the exit status says so.
    assert kernel_wire.main(["--report", str(tmp_path), "--works", "4k-randread-qd32"]) == 1
    assert "4k-randread-qd32: no capture summary" in capsys.readouterr().err


def test_unknown_works_and_hosts_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        kernel_wire.main(["--works", "4k-randread-qd7"])
    assert "unknown work 4k-randread-qd7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_wire.main(["--works", "4k-randread-qd32+digest,4k-randread-qd32+tls"])
    assert "unknown work 4k-randread-qd32+tls;" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernel_wire.main(["--report", "/nonexistent/kernel-wire"])
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        wire_capture.main(["--hosts", "kernel"])
    assert "unknown kernel" in capsys.readouterr().err
    stats = {"reactors": [{"namespaces": [{"reads": 5, "writes": 2}, {"reads": 1, "writes": 0}]}]}
    assert wire_capture.io_commands(stats) == 8


def test_the_summary_gives_the_connects_queue_size_and_flow_control_attribute():
    # Connect for I/O queue 1: SQSIZE 127, CATTR 0x04 (SQ flow control disabled), KATO 0.
    sqe = bytes([0x7F, 0, 1, 0, 0x01]) + b"\0" * 35 + struct.pack("<HHHBBI", 0, 1, 127, 0x04, 0, 0) + b"\0" * 12
    connect = pdu(4, 0, 72, 72, sqe, b"\0" * 1024)
    found = wire.summarize(stream(IC_REQ, connect), stream(IC_RESP, RESP))
    assert found["Connect"] == {"qid": 1, "sqsize": 127, "cattr": 0x04, "kato": 0}
    assert found["commands"] == {"fabrics": 1}
