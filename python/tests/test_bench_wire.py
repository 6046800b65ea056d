"""bench/nvmfbench/wire.py and bench/wire.py: PDUs per command from a loopback capture, on a pcap
built here (issue 40 item 3)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import wire as wire_cli  # noqa: E402
from nvmfbench import wire  # noqa: E402

HOST_PORT, TARGET_PORT = 40000, 4420
HOST_ISN, TARGET_ISN = 1000, 0xFFFFFF00  # the target's wraps past 2**32


def frame(sport: int, dport: int, seq: int, flags: int, payload: bytes = b"") -> bytes:
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, b"\x7f\0\0\1", b"\x7f\0\0\1") + tcp
    return b"\0" * 12 + b"\x08\x00" + ip


def pcap(frames: list[bytes]) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, wire.LINK_ETHERNET)
    for f in frames:
        out += struct.pack("<IIII", 0, 0, len(f), len(f)) + f
    return out


def pdu(kind: int, flags: int, hlen: int, pdo: int, specific: bytes, data: bytes = b"") -> bytes:
    header = specific.ljust(hlen - 8, b"\0")
    return struct.pack("<BBBBI", kind, flags, hlen, pdo, 8 + len(header) + len(data)) + header + data


def capsule(opcode: int, cid: int, data: bytes = b"") -> bytes:
    sqe = bytes([opcode, 0]) + struct.pack("<H", cid) + b"\0" * 60
    return pdu(4, 0, 72, 72 if data else 0, sqe, data)


IC_REQ = pdu(0, 0, 128, 0, struct.pack("<HBBI", 0, 0, 0, 0))
IC_RESP = pdu(1, 0, 128, 0, struct.pack("<HBBI", 0, 0, 2, 131072))  # data digest on
WRITE = capsule(0x01, 1, b"w" * 4096)
READ = capsule(0x02, 2)
C2H = pdu(7, 0x0C, 24, 24, struct.pack("<HHII", 2, 0, 0, 4096), b"r" * 4096)
RESP = pdu(5, 0, 24, 0, b"\0" * 16)


def conversation(host_segments: list[bytes], target_segments: list[bytes]) -> list[bytes]:
    """SYNs, then each side's segments in turn, sequence numbers from the ISNs."""
    frames = [frame(HOST_PORT, TARGET_PORT, HOST_ISN, wire.SYN), frame(TARGET_PORT, HOST_PORT, TARGET_ISN, wire.SYN | 0x10)]
    at = {HOST_PORT: HOST_ISN + 1, TARGET_PORT: TARGET_ISN + 1}
    for sport, dport, segments in ((HOST_PORT, TARGET_PORT, host_segments), (TARGET_PORT, HOST_PORT, target_segments)):
        for payload in segments:
            frames.append(frame(sport, dport, at[sport], 0x18, payload))
            at[sport] += len(payload)
    return frames


def test_pdus_per_command_sizes_and_the_handshake_come_from_the_rebuilt_streams():
    # The write's capsule is cut across two segments and the read's capsule rides with its tail.
    host = [IC_REQ, WRITE[:100], WRITE[100:] + READ]
    frames = conversation(host, [IC_RESP, C2H + RESP, RESP])
    frames.append(frames[3])  # a retransmission of a host segment counts once
    found = wire.summarize_capture(pcap(frames))
    assert found["commands"] == {"write": 1, "read": 1}
    assert found["ICResp"] == {"pda": 0, "header digest": False, "data digest": True, "maxh2cdata": 131072}
    assert found["sizes"] == {"in-capsule": {4096: 1}, "C2HData": {4096: 1}}
    assert found["flags"] == {"C2HData": {0x0C: 1}}
    assert found["per command"] == {"host CapsuleCmd": 1.0, "target C2HData": 0.5, "target CapsuleResp": 1.0}
    assert found["host segments"]["per command"] == 1.5  # ICReq and the two write segments, 2 commands
    assert found["host segments"]["commonest"][100] == 1


def test_how_each_side_groups_its_capsules_and_responses_per_segment():
    # The target answers three reads with their data and responses interleaved in one segment and
    # one read in another, then two reads with their responses after both reads' data, cut so
    # that the second response ends in the next segment.
    host = [IC_REQ, READ * 3, READ + READ, READ]
    grouped = C2H + C2H + RESP + RESP
    target = [IC_RESP, (C2H + RESP) * 3, C2H + RESP, grouped[:-10], grouped[-10:]]
    found = wire.summarize_capture(pcap(conversation(host, target)))
    # Host: 3, 2 and 1 capsules in their segments; target: 3, 1, 1 and 1 responses end in theirs.
    assert found["per segment"] == {"host CapsuleCmd": 2.0, "target CapsuleResp": 1.5}


def test_a_hole_in_the_capture_ends_the_stream_there():
    frames = conversation([IC_REQ, READ, READ, READ], [IC_RESP])
    del frames[4]  # the second READ's segment
    found = wire.summarize_capture(pcap(frames))
    assert found["commands"] == {"read": 1}  # the third READ, after the hole, cannot be placed


def test_bad_captures_are_named_errors_and_the_command_line_says_so(tmp_path, capsys):
    with pytest.raises(wire.WireError, match="not a pcap"):
        wire.summarize_capture(b"\x0a\x0d\x0d\x0a" + b"\0" * 40)  # pcapng
    with pytest.raises(wire.WireError, match="no NVMe/TCP connection"):
        wire.summarize_capture(pcap([frame(1, 2, 5, 0x18, b"x" * 10)]))
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"text")
    assert wire_cli.main([str(bad)]) == 1
    assert "not a pcap" in capsys.readouterr().err
