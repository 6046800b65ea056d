"""The AES-GCM rate a core reaches, and the limit it puts on a TLS row (issue 40 item 1).

The TLS rows negotiate TLS_AES_128_GCM_SHA256 (the bench's PSK is a SHA-256 one). Two
implementations of it run here, and each round measures both, pinned with taskset to the target's
core before the round's targets start, counting CPU time (so a busy shared machine slows them less
than it slows a run):
- "openssl-evp": `openssl speed -aead -evp aes-128-gcm`, OpenSSL's EVP from the libcrypto SPDK's
  TLS uses, in the sequence a TLS record takes (a fresh nonce, 13 bytes of additional data and a
  tag per buffer);
- "nvmf-tls": `nvmf-bench aead`, our record layer's Sealer and Opener (ring's AES-GCM), whole
  records of the size asked (at most 16 KiB, so not at 128 KiB).
The limit takes, per direction, the faster of the two: no stack beats the fastest AES-GCM the core
runs with the code at hand. Issue 40 states its bound with OpenSSL's EVP rate alone, a looser one
where ring is faster (as on AMD cores with VAES but no AVX-512); the TLS rows show it beside
(bound.bound_rows, OPENSSL_ONLY). Each (size, direction) is bracketed by the bench's speed probes, and a
measurement from a slow phase of the machine (mark_slow, the rule of speed.mark_slow_phases) is
left out unless every one is slow.

A TLS record holds at most 16 KiB, so a 128 KiB I/O is sealed as 16 KiB records: the limit of a
row takes the rate at its record size. OpenSSL's rate at 128 KiB buffers is measured too and shown,
to say what a record size cannot reach.

The limit: a row's plain run takes 1/plain_IOPS per I/O on its busier side; TLS adds the cipher's
time. At QD1 one I/O is in flight, so the sealing side and the opening side take turns: both
count. With many in flight each side ciphers on its own core while the other works, and the busier
side (the one whose direction is slower) bounds the rate:
    limit = 1 / (1/plain_IOPS + per-I/O cipher time)."""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import subprocess
from typing import Any, Callable, ContextManager, Iterable

from . import speed
from .speed import SLOW_LIMIT
from .stacks import BenchError, bench_binary

SUITE = "TLS_AES_128_GCM_SHA256"
EVP_NAME = "aes-128-gcm"
OPENSSL, OURS = "openssl-evp", "nvmf-tls"
IMPLS = (OPENSSL, OURS)
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


def aead_command(core: int, size: int, op: str, seconds: float) -> list[str]:
    """`nvmf-bench aead` on `core`; CipherError when the binary is not built."""
    if op not in OPS:
        raise ValueError(f"unknown cipher direction {op!r} ({', '.join(OPS)})")
    try:
        binary = bench_binary("nvmf-bench")
    except BenchError as err:
        raise CipherError(str(err)) from err
    return (["taskset", "-c", str(core), str(binary), "aead", "--bytes", str(size), "--seconds", str(seconds)]
            + (["--decrypt"] if op == "decrypt" else []))


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


def parse_aead(text: str) -> float:
    """Bytes per second from `nvmf-bench aead`'s JSON line; CipherError when it holds none."""
    lines = text.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    rate = found.get("rate_bps") if isinstance(found, dict) and found.get("impl") == OURS else None
    if not isinstance(rate, (int, float)) or not rate > 0:
        raise CipherError(f"nvmf-bench aead gave no positive rate_bps of {OURS}: {text.strip()[-200:] or 'no output'}")
    return float(rate)


def _run(cmd: list[str], seconds: float, parse: Callable[[str], float]) -> float:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CipherError(f"{' '.join(cmd[:5])} failed: {err}") from err
    if done.returncode != 0:
        raise CipherError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-200:]}")
    return parse(done.stdout)


def measure(core: int, size: int, op: str, seconds: int = 1, impl: str = OPENSSL) -> float:
    """One measurement of `impl` on `core`: bytes per second (CPU time) at `size`-byte buffers."""
    if impl == OPENSSL:
        return _run(speed_command(core, size, op, seconds), seconds, parse_speed)
    if impl == OURS:
        return _run(aead_command(core, size, op, seconds), seconds, parse_aead)
    raise ValueError(f"unknown AES-GCM implementation {impl!r} ({', '.join(IMPLS)})")


def impls_at(size: int) -> tuple[str, ...]:
    """Our records hold at most 16 KiB: larger buffers are OpenSSL's alone."""
    return IMPLS if size <= RECORD_MAX else (OPENSSL,)


def measure_round(core: int, round_index: int, seconds: int = 1,
                  bracket: Callable[[], ContextManager[Any]] | None = None) -> list[dict[str, Any]]:
    """Every size, direction and implementation once: records {"round", "core", "size", "op",
    "impl", "rate_bps"} or with "error" in place of the rate. With `bracket` (a speed.Bracket
    maker), each size and direction's measurements are bracketed together and carry its fields."""
    out = []
    for size in SIZES:
        for op in OPS:
            found = []
            with bracket() if bracket else contextlib.nullcontext() as probes:
                for impl in impls_at(size):
                    record: dict[str, Any] = {"round": round_index, "core": core, "size": size, "op": op, "impl": impl}
                    try:
                        record["rate_bps"] = measure(core, size, op, seconds, impl)
                    except CipherError as err:
                        record["error"] = str(err)
                    found.append(record)
            out += [r | probes.fields for r in found] if probes is not None else found
    return out


def mark_slow(records: list[dict[str, Any]], runs: Iterable[dict[str, Any]], limit: float = SLOW_LIMIT) -> int:
    """Marks (in place, like speed.mark_slow_phases marks runs) each cipher record whose slower
    probe exceeds `limit` x the fastest probe of the runs and the records, with `slow_machine`;
    returns how many it marked. Records without probes are never slow."""
    fastest = speed.fastest_probe([*runs, *records])
    if fastest is None:
        return 0
    marked = 0
    for r in records:
        r.pop("slow_machine", None)
        slow = speed.slowness(r, fastest, limit)
        if slow is not None:
            r["slow_machine"] = slow
            marked += 1
    return marked


def record_size(bs: int) -> int:
    """The plaintext bytes per record a `bs`-byte I/O's data travels in."""
    return min(bs, RECORD_MAX)


def by_impl(records: Iterable[dict[str, Any]], size: int, op: str) -> tuple[dict[str, float], bool]:
    """Each implementation's median rate at `size` and `op`, over the records not from a slow phase
    (all of them when every one is slow: then True)."""
    ok = [r for r in records if r.get("rate_bps") and r["size"] == size and r["op"] == op]
    fast = [r for r in ok if not r.get("slow_machine")]
    chosen = fast or ok
    medians = {}
    for impl in IMPLS:
        values = [r["rate_bps"] for r in chosen if r.get("impl", OPENSSL) == impl]
        if values:
            medians[impl] = statistics.median(values)
    return medians, bool(ok) and not fast


def rates(records: Iterable[dict[str, Any]], bs: int, impls: tuple[str, ...] = IMPLS) -> dict[str, Any] | None:
    """At the record size of a `bs`-byte I/O (the largest measured size not above it), per
    direction the faster implementation's (of `impls`) median rate: {"encrypt": B/s, "decrypt":
    B/s, "impl": {op: implementation}, "all_slow": [ops measured only in slow phases]}; None when
    a direction has no rate."""
    ok = [r for r in records if r.get("rate_bps") and r.get("impl", OPENSSL) in impls]
    sizes = sorted({r["size"] for r in ok if r["size"] <= record_size(bs)})
    if not sizes:
        return None
    out: dict[str, Any] = {"impl": {}, "all_slow": []}
    for op in OPS:
        medians, all_slow = by_impl(ok, sizes[-1], op)
        if not medians:
            return None
        out["impl"][op] = max(medians, key=medians.__getitem__)
        out[op] = medians[out["impl"][op]]
        if all_slow:
            out["all_slow"].append(op)
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
