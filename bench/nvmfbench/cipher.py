"""The AES-GCM rate a core reaches, and the limit it puts on a TLS row (issue 40 item 1).

The TLS rows negotiate TLS_AES_128_GCM_SHA256 (the bench's PSK is a SHA-256 one), and our record
layer seals and opens records with OpenSSL's EVP, from the same libcrypto the `openssl` command
uses. So `openssl speed -aead -evp aes-128-gcm` measures the code our stack runs, in the sequence
a TLS record takes (a fresh nonce, 13 bytes of additional data and a tag per buffer), and counts
the CPU time it used (speed's default), so a busy shared machine slows it less than it slows a run.
It is pinned with taskset to the target's core, before the round's targets start.

A TLS record holds at most 16 KiB, so a 128 KiB I/O is sealed as 16 KiB records: the limit of a
row takes the rate at its record size. The rate at 128 KiB buffers is measured too and shown, to
say what a record size cannot reach.

The limit: a row's plain run takes 1/plain_IOPS per I/O on its busier side; TLS adds the cipher's
time. At QD1 one I/O is in flight, so the sealing side and the opening side take turns: both
count. With many in flight each side ciphers on its own core while the other works, and the busier
side (the one that decrypts: opening is the slower direction) bounds the rate:
    limit = 1 / (1/plain_IOPS + per-I/O cipher time)."""

from __future__ import annotations

import re
import statistics
import subprocess
from typing import Any, Iterable

SUITE = "TLS_AES_128_GCM_SHA256"
EVP_NAME = "aes-128-gcm"
RECORD_MAX = 16 << 10  # TLS's largest record payload
SIZES = (4 << 10, 16 << 10, 128 << 10)
OPS = ("encrypt", "decrypt")
TIMEOUT_S = 30.0

# `openssl speed -mr`: "+F:<n>:<cipher>:<bytes per second>" for each buffer size asked.
_RATE = re.compile(r"^\+F:\d+:[^:]+:([0-9.eE+]+)\s*$", re.MULTILINE)


class CipherError(Exception):
    """The cipher rate could not be measured: the message says why."""


def speed_command(core: int, size: int, op: str, seconds: int) -> list[str]:
    if op not in OPS:
        raise ValueError(f"unknown cipher direction {op!r} ({', '.join(OPS)})")
    return (["taskset", "-c", str(core), "openssl", "speed", "-mr", "-aead"] + (["-decrypt"] if op == "decrypt" else [])
            + ["-evp", EVP_NAME, "-bytes", str(size), "-seconds", str(seconds)])


def parse_speed(text: str) -> float:
    """Bytes per second from `openssl speed -mr` output; CipherError when it holds no rate."""
    found = _RATE.findall(text)
    if not found:
        tail = " ".join(text.strip().splitlines()[-2:])[-200:]
        raise CipherError(f"openssl speed gave no rate line (+F:...): {tail or 'no output'}")
    rate = float(found[-1])
    if not rate > 0:
        raise CipherError(f"openssl speed gave a rate of {rate:g} bytes/s")
    return rate


def measure(core: int, size: int, op: str, seconds: int = 1) -> float:
    """One `openssl speed` on `core`: bytes per second (CPU time) at `size`-byte buffers."""
    cmd = speed_command(core, size, op, seconds)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CipherError(f"{' '.join(cmd[:5])} failed: {err}") from err
    if done.returncode != 0:
        raise CipherError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-200:]}")
    return parse_speed(done.stdout)


def measure_round(core: int, round_index: int, seconds: int = 1) -> list[dict[str, Any]]:
    """Every size and direction once: records {"round", "core", "size", "op", "rate_bps"} or
    with "error" in place of the rate."""
    out = []
    for size in SIZES:
        for op in OPS:
            record: dict[str, Any] = {"round": round_index, "core": core, "size": size, "op": op}
            try:
                record["rate_bps"] = measure(core, size, op, seconds)
            except CipherError as err:
                record["error"] = str(err)
            out.append(record)
    return out


def record_size(bs: int) -> int:
    """The plaintext bytes per record a `bs`-byte I/O's data travels in."""
    return min(bs, RECORD_MAX)


def rates(records: Iterable[dict[str, Any]], bs: int) -> dict[str, float] | None:
    """{"encrypt": B/s, "decrypt": B/s} at the record size of a `bs`-byte I/O (the largest
    measured size not above it), the median over `records`; None when a direction has none."""
    ok = [r for r in records if r.get("rate_bps")]
    sizes = sorted({r["size"] for r in ok if r["size"] <= record_size(bs)})
    if not sizes:
        return None
    out = {}
    for op in OPS:
        values = [r["rate_bps"] for r in ok if r["size"] == sizes[-1] and r["op"] == op]
        if not values:
            return None
        out[op] = statistics.median(values)
    return out


def cipher_seconds(bs: int, iodepth: int, rate: dict[str, float]) -> float:
    """Cipher time per I/O on the critical path: both directions at QD1 (the sealing and the opening
    side take turns), else the slower direction alone (each side on its own core)."""
    enc, dec = bs / rate["encrypt"], bs / rate["decrypt"]
    return enc + dec if iodepth <= 1 else max(enc, dec)


def limit_iops(plain_iops: float, cipher_s: float) -> float:
    """1 / (1/plain_IOPS + per-I/O cipher time)."""
    if not plain_iops > 0 or cipher_s < 0:
        raise ValueError(f"plain IOPS must be positive and cipher time not negative ({plain_iops}, {cipher_s})")
    return 1.0 / (1.0 / plain_iops + cipher_s)
