"""Each TLS row against the limit the cipher puts on it (nvmfbench.cipher): the plain row of the
same pair, plus the AES-GCM time per I/O. Pure functions on cells, runs and cipher records, but
bound_rows, which first marks the cipher records from a slow phase of the machine (cipher.mark_slow)."""

from __future__ import annotations

from typing import Any

from . import cipher
from .stacks import MATRIX_WORKS, TLS_WORKS
from .stats import by_round, paired_ratio_interval, ratio

WORKS = {w.name: w for w in MATRIX_WORKS}
# (TLS pair, the same pair without TLS, label): pairs are (target stack, host stack).
TLS_PLAIN = (
    (("ours-tls", "ours-tls"), ("ours", "ours"), "ours x ours"),
    (("ours-tls", "spdk-tls"), ("ours", "spdk"), "our target x spdk_nvme_perf"),
    (("spdk-tls", "spdk-tls"), ("spdk", "spdk"), "SPDK x SPDK"),
    (("spdk-tls", "ours-tls"), ("spdk", "ours"), "SPDK target x nvmf-perf"),
)
NO_RATE = "no AES-GCM rate measured"
# Issue 40's own bound: OpenSSL's EVP rate alone (`openssl speed -evp`), without our record layer's
# faster ring where it is faster. The goals judge the stricter limit; the report shows both.
OPENSSL_ONLY = (cipher.OPENSSL,)
# SPDK 24.01's spdk_nvme_perf gives its ssl socket fixed 4 KiB send and 64 KiB receive buffers and
# cannot be told otherwise; the bench preloads a shim that raises them to its posix socket's 2 MiB
# (nvmflab.stacks.spdk_sockbuf), and each such run says so ("host_sockbuf"). Runs without it (saved before the
# shim, 2026-12-08) measured these stalls, and their rows say which:
# its TLS writes waited on delayed ACKs (128 KiB QD1 on our TLS target: 4-14 IOPS, nvmf-perf 234; bench/README.md).
SPDK_HOST_SEND = "spdk_nvme_perf's ssl socket sends through SPDK 24.01's 4 KiB buffer: this row measures that stall"
# With many reads in flight the target waited on the host's window (`ss -tmi`: rb 65920, no autotuning;
# 4k randread QD32 on our TLS target: rwnd_limited 95 % of the run, 48 K IOPS; bench/README.md, 2026-12-07 05:06).
SPDK_HOST_RECV = ("spdk_nvme_perf's ssl socket receives into SPDK 24.01's fixed 64 KiB buffer: the target waits on "
                  "its window, and this row measures that")


def caveat(tls: tuple[str, str], work: str, runs: list[dict[str, Any]]) -> str:
    """What a measured TLS row measures besides TLS: SPDK's host, where any of its runs had SPDK's
    own socket buffers, sending the data or receiving more than one read's data at a time."""
    if tls[1] != "spdk-tls":
        return ""
    mine = [r for r in runs if (r.get("target"), r.get("host")) == tls and r.get("work") == work and r.get("iops")]
    if all(r.get("host_sockbuf") for r in mine):
        return ""
    if "randwrite" in work:
        return SPDK_HOST_SEND
    return SPDK_HOST_RECV if WORKS[work].iodepth > 1 else ""


def limit_at(plain_iops: float | None, bs: int, iodepth: int, records: list[dict[str, Any]],
             impls: tuple[str, ...] = cipher.IMPLS) -> float | None:
    """The cipher-bound IOPS over TLS of `bs`-byte I/O at `iodepth`, from its plain IOPS and the
    cipher records of `impls`; None when either is missing."""
    rate = cipher.rates(records, bs, impls)
    if not plain_iops or plain_iops <= 0 or rate is None:
        return None
    return cipher.limit_iops(plain_iops, cipher.cipher_seconds(bs, iodepth, rate))


def limit_of(plain_iops: float | None, work: str, records: list[dict[str, Any]],
             impls: tuple[str, ...] = cipher.IMPLS) -> float | None:
    """limit_at for the matrix's work named `work`."""
    w = WORKS[work]
    return limit_at(plain_iops, w.bs, w.iodepth, records, impls)


def per_round(runs: list[dict[str, Any]], tls: tuple[str, str], plain: tuple[str, str], work: str,
              records: list[dict[str, Any]],
              impls: tuple[str, ...] = cipher.IMPLS) -> tuple[float, float, float, int] | None:
    """measured / limit per round (each round's TLS run, its plain run and its own cipher rate):
    the geometric mean, its 95 % interval and the rounds used; None below two rounds."""
    measured, base = by_round(runs, tls, work, "iops"), by_round(runs, plain, work, "iops")
    ratios = []
    for r in sorted(set(measured) & set(base), key=str):
        limit = limit_of(base[r], work, [c for c in records if c.get("round") == r], impls)
        if limit is not None:
            ratios.append(measured[r] / limit)
    found = paired_ratio_interval(ratios)
    return None if found is None else (*found, len(ratios))


def bound_rows(table: dict[tuple[str, str, str], dict[str, Any]], runs: list[dict[str, Any]],
               records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per TLS pair and workload that ran: plain and TLS IOPS (medians), the limit from
    them and the median cipher rates, measured / limit, and the per-round interval; the same
    against OpenSSL's EVP rate alone ("evp_*"). Marks the cipher
    records slow relative to the fastest probe of `runs` and the records (kept on them for the report)."""
    cipher.mark_slow(records, runs)
    rows = []
    for tls, plain, label in TLS_PLAIN:
        for work in (w for w in TLS_WORKS if (*tls, w) in table):
            t, p = table[(*tls, work)], table.get((*plain, work)) or {}
            limit = limit_of(p.get("iops"), work, records)
            why = caveat(tls, work, runs) if limit is not None else (NO_RATE if p.get("iops") else "its plain row did not run")
            evp = limit_of(p.get("iops"), work, records, OPENSSL_ONLY)
            rows.append({"pair": label, "tls": tls, "plain": plain, "work": work, "plain_iops": p.get("iops"),
                         "tls_iops": t.get("iops"), "limit_iops": limit, "value": ratio(t.get("iops"), limit),
                         "per_round": per_round(runs, tls, plain, work, records), "why_missing": why,
                         "evp_limit_iops": evp, "evp_value": ratio(t.get("iops"), evp),
                         "evp_per_round": per_round(runs, tls, plain, work, records, OPENSSL_ONLY),
                         "cells": [t, p or None]})
    return rows
