"""What an NVMe/TCP host and target put on the wire, from a loopback capture (`tcpdump -i lo -s 0
-w FILE 'tcp port N'`, started before the host connects): each connection's byte streams rebuilt
from the TCP segments, cut into PDUs, and counted per command (issue 40 item 3: spdk_nvme_perf
against nvmf-perf). Pure functions on the capture's bytes; bench/wire.py is the command line.

No pcap library is in the project's environment, and the format needs a few lines: the classic
pcap file (not pcapng), Ethernet (tcpdump -i lo) or Linux cooked frames, IPv4."""

from __future__ import annotations

import bisect
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

PCAP_MAGIC = {0xA1B2C3D4, 0xA1B23C4D}  # microsecond and nanosecond timestamps, little-endian file
LINK_ETHERNET, LINK_COOKED = 1, 113
PDU_NAMES = {0: "ICReq", 1: "ICResp", 2: "H2CTermReq", 3: "C2HTermReq", 4: "CapsuleCmd", 5: "CapsuleResp",
             6: "H2CData", 7: "C2HData", 9: "R2T"}
HDGST, DDGST = 0x01, 0x02  # common-header flags: a header or data digest follows
SYN = 0x02
OPCODES = {0x01: "write", 0x02: "read", 0x7F: "fabrics"}
FCTYPE_CONNECT = 0x01


class WireError(Exception):
    """The capture cannot be read; one line."""


@dataclass
class Stream:
    """One direction of one TCP connection: its bytes from the first after the SYN, as far as they
    run without a hole, and the (offset, length) of each data segment within them."""
    isn: int | None = None
    chunks: dict[int, bytes] = field(default_factory=dict)
    data: bytes = b""
    segments: list[tuple[int, int]] = field(default_factory=list)


def tcp_segments(capture: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(source port, destination port, sequence number, flags, payload) of every IPv4 TCP packet."""
    if len(capture) < 24 or struct.unpack("<I", capture[:4])[0] not in PCAP_MAGIC:
        raise WireError("not a pcap capture (tcpdump -w writes one; pcapng is not read)")
    link = struct.unpack("<I", capture[20:24])[0]
    if link not in (LINK_ETHERNET, LINK_COOKED):
        raise WireError(f"link type {link} is not read: capture on lo (Ethernet) or any (cooked)")
    off = 24
    while off + 16 <= len(capture):
        incl = struct.unpack("<I", capture[off + 8:off + 12])[0]
        frame = capture[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(frame) < incl:
            break  # a capture cut short ends here
        ethertype_at, ip_at = (12, 14) if link == LINK_ETHERNET else (14, 16)
        if frame[ethertype_at:ethertype_at + 2] != b"\x08\x00" or frame[ip_at + 9] != 6:
            continue  # not IPv4, or not TCP
        ip = frame[ip_at:ip_at + struct.unpack(">H", frame[ip_at + 2:ip_at + 4])[0]]
        tcp = ip[(ip[0] & 0x0F) * 4:]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        yield sport, dport, seq, tcp[13], tcp[(tcp[12] >> 4) * 4:]


def streams(capture: bytes) -> dict[tuple[int, int], Stream]:
    """Each direction's stream, keyed by (source port, destination port). A direction whose SYN
    is not in the capture has no bytes: PDUs can be found only from a stream's start."""
    found: dict[tuple[int, int], Stream] = {}
    for sport, dport, seq, flags, payload in tcp_segments(capture):
        s = found.setdefault((sport, dport), Stream())
        if flags & SYN:
            s.isn = (seq + 1) & 0xFFFFFFFF
        elif payload and s.isn is not None:
            s.chunks.setdefault((seq - s.isn) & 0xFFFFFFFF, payload)  # a retransmission keeps the first
    for s in found.values():
        data = bytearray()
        for at in sorted(s.chunks):
            if at > len(data):
                break  # a hole (a packet the capture dropped): what follows cannot be placed
            data += s.chunks[at][len(data) - at:]
            s.segments.append((at, len(s.chunks[at])))
        s.data, s.chunks = bytes(data), {}
    return found


def pdus(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(offset, type, whole PDU) of every complete PDU from the stream's start."""
    off = 0
    while off + 8 <= len(data):
        plen = struct.unpack("<I", data[off + 4:off + 8])[0]
        if plen < 8 or off + plen > len(data):
            return
        yield off, data[off], data[off:off + plen]
        off += plen


def connections(found: dict[tuple[int, int], Stream]) -> list[tuple[Stream, Stream]]:
    """(host to target, target to host) of every NVMe/TCP connection: the side whose stream
    starts with an ICReq is the host's. Busiest first (most PDUs from the host)."""
    pairs = [(s, found[(b, a)]) for (a, b), s in found.items() if s.data[:1] == b"\x00" and (b, a) in found]
    return sorted(pairs, key=lambda p: -sum(1 for _ in pdus(p[0].data)))


def data_len(pdu: bytes) -> int:
    """DATAL of an H2CData or C2HData PDU, R2TL of an R2T: the same place in all three."""
    return struct.unpack("<I", pdu[16:20])[0]


def in_capsule(pdu: bytes) -> int:
    """Bytes of in-capsule data a CapsuleCmd carries (from PDO; 0 without data)."""
    pdo, plen, flags = pdu[3], struct.unpack("<I", pdu[4:8])[0], pdu[1]
    return max(0, plen - pdo - (4 if flags & DDGST else 0)) if pdo else 0


def connect_fields(pdu: bytes) -> dict[str, int]:
    """QID, SQSIZE, CATTR (bit 2: SQ flow control disabled) and KATO of a Connect capsule (its SQE
    starts at byte 8: QID at 42, SQSIZE 44, CATTR 46, KATO 48)."""
    qid, sqsize, cattr, _, kato = struct.unpack("<HHBBI", pdu[50:60])
    return {"qid": qid, "sqsize": sqsize, "cattr": cattr, "kato": kato}


def per_segment(stream: Stream, kind: int) -> float | None:
    """PDUs of type `kind` completed per segment that completes any: how a side groups them
    (SPDK's host completes the CapsuleResps it finds in one 32 KiB read of its socket, and sends
    the next commands together)."""
    starts = [at for at, _ in stream.segments]
    hits: Counter[int] = Counter()
    for at, k, pdu in pdus(stream.data):
        if k == kind:
            hits[bisect.bisect_right(starts, at + len(pdu) - 1) - 1] += 1
    return round(sum(hits.values()) / len(hits), 1) if hits else None


def summarize(host: Stream, target: Stream) -> dict[str, Any]:
    """One connection's negotiation (ICReq, ICResp, Connect), PDUs per command by direction and
    type, the sizes that decide the path (in-capsule data, H2CData, C2HData, R2T), and how the
    bytes were segmented."""
    out: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    sizes: dict[str, Counter[int]] = {k: Counter() for k in ("in-capsule", "H2CData", "C2HData", "R2T")}
    flags: dict[str, Counter[int]] = {"H2CData": Counter(), "C2HData": Counter()}
    commands: Counter[str] = Counter()
    for side, stream in (("host", host), ("target", target)):
        for _, kind, pdu in pdus(stream.data):
            name = PDU_NAMES.get(kind, f"type {kind}")
            if kind in (0, 1):  # ICReq: PFV, HPDA, DGST, MAXR2T; ICResp: PFV, CPDA, DGST, MAXH2CDATA
                pfv, pda, dgst, last = struct.unpack("<HBBI", pdu[8:16])
                out[name] = {"pda": pda, "header digest": bool(dgst & 1), "data digest": bool(dgst & 2),
                             "maxr2t" if kind == 0 else "maxh2cdata": last}
                continue
            counts[f"{side} {name}"] += 1
            if kind == 4:
                commands[OPCODES.get(pdu[8], hex(pdu[8]))] += 1
                if pdu[8] == 0x7F and pdu[12] == FCTYPE_CONNECT:
                    out["Connect"] = connect_fields(pdu)
                if pdu[8] == 0x01:
                    sizes["in-capsule"][in_capsule(pdu)] += 1
            elif name in ("H2CData", "C2HData", "R2T"):
                sizes[name][data_len(pdu)] += 1
                if name in flags:
                    flags[name][pdu[1]] += 1
            if pdu[1] & (HDGST | DDGST):
                counts[f"{side} PDUs with a digest"] += 1
    n = sum(commands.values())
    out["commands"] = dict(commands)
    out["per command"] = {k: round(v / max(n, 1), 3) for k, v in sorted(counts.items())}
    out["sizes"] = {k: dict(v.most_common(4)) for k, v in sizes.items() if v}
    out["flags"] = {k: dict(v.most_common(4)) for k, v in flags.items() if v}
    for side, stream in (("host", host), ("target", target)):
        lengths = [length for _, length in stream.segments]
        out[f"{side} segments"] = {"per command": round(len(lengths) / max(n, 1), 3),
                                   "mean bytes": round(sum(lengths) / max(len(lengths), 1)),
                                   "commonest": dict(Counter(lengths).most_common(4))}
    out["per segment"] = {"host CapsuleCmd": per_segment(host, 4), "target CapsuleResp": per_segment(target, 5)}
    return out


def summarize_capture(capture: bytes) -> dict[str, Any]:
    """The busiest NVMe/TCP connection of a capture (the I/O queue of a one-queue run)."""
    found = connections(streams(capture))
    if not found:
        raise WireError("no NVMe/TCP connection starts in the capture (start tcpdump before the host connects)")
    return summarize(*found[0])
