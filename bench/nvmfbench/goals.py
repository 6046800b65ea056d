"""Issue 9's (and issue 26's 128 KiB, issue 20's TLS, issue 40's cipher bound) performance goals as
rows that say "met" or "missed by X %": the numbers speak, the goals do not move. Pure functions on the cells of stats.cells()."""

from __future__ import annotations

from typing import Any

from .stats import by_round, paired_ratio_interval, ratio

QD1, QD32, LARGE = "4k randread QD1", "4k randread QD32", "128k randread QD32"
QD128, WRITE_QD32, LARGE_WRITE = "4k randread QD128", "4k randwrite QD32", "128k randwrite QD32"
BOUND_GOAL = 0.9  # of the limit AES-GCM puts on a TLS row (nvmfbench.cipher)


def verdict(value: float | None, op: str, limit: float) -> str:
    """'met', 'missed by N %' (how far short of, or over, the limit, relative to it), or
    'not measured'."""
    if value is None:
        return "not measured"
    if op == ">=":
        return "met" if value >= limit else f"missed by {100 * (1 - value / limit):.1f} %"
    if op == "<=":
        return "met" if value <= limit else f"missed by {100 * (value / limit - 1):.1f} %"
    raise ValueError(f"unknown comparison {op!r}")


NOISY = "from noisy runs only"


def per_round(runs: list[dict[str, Any]], subject: tuple[str, str], baseline: tuple[str, str], work: str,
              key: str) -> tuple[float, float, float, int] | None:
    """The geometric mean of the per-round ratios subject / baseline of `key` and its 95 % t
    interval, with the number of rounds it took: each round ran both pairs back to back, so a
    drift of the machine between rounds cancels out. Rounds where either run failed or was noisy
    are left out. None with fewer than two usable rounds or where a value is not positive."""
    a, b = by_round(runs, subject, work, key), by_round(runs, baseline, work, key)
    rounds = sorted(set(a) & set(b), key=str)
    if any(b[r] <= 0 for r in rounds):
        return None
    found = paired_ratio_interval([a[r] / b[r] for r in rounds])
    return None if found is None else (*found, len(rounds))


def _row(goal: str, value: float | None, op: str, limit: float, inputs: list[dict[str, Any] | None],
         why_missing: str = "", rounds: tuple[float, float, float, int] | None = None) -> dict[str, Any]:
    """One goal; `inputs` are the cells (or floor summaries) the value came from: when any of
    them had only noisy runs the verdict says so. `rounds` is the per-round interval where the
    goal compares two pairs (per_round); the verdict stays the ratio of the medians, and the
    interval says whether the rounds agree on which side of the limit it lies."""
    status = verdict(value, op, limit)
    if status == "not measured" and why_missing:
        status += f" ({why_missing})"
    elif value is not None and any(c and str(c.get("note", "")).startswith("all ") for c in inputs):
        status += f" ({NOISY})"
    row = {"goal": goal, "value": None if value is None else round(value, 3), "op": op, "limit": limit,
           "status": status, "per_round": None}
    if rounds is not None:
        mean, low, high, n = rounds
        worst, best = (low, high) if op == ">=" else (high, low)
        if verdict(worst, op, limit) == "met":
            side = "met"  # even the interval's worst end meets the goal
        elif verdict(best, op, limit) != "met":
            side = "missed"  # even its best end misses it
        else:
            side = "undecided"
        row["per_round"] = {"mean": round(mean, 3), "low": round(low, 3), "high": round(high, 3), "rounds": n,
                            "decided": side}
    return row


def goal_rows(table: dict[tuple[str, str, str], dict[str, Any]], floor: dict[str, dict[str, Any]],
              event_qd1: dict[str, Any] | None, spdk_missing: str = "",
              runs: list[dict[str, Any]] | None = None,
              bounds: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The goals of issue 9 item 2. `floor` maps "busy" and "blocking" to the ping-pong summary
    ({"mean_ns", "note"}); `event_qd1` is the cell of QD1 with our target and host both in event
    mode. With the `runs` the cells came from, goals between two pairs carry their per-round
    interval. For p99.99 the value is the ratio of the pooled tails (stats.cell) and the interval
    comes from each run's own p99.99: a tail that one round shows and the others do not widens it,
    which is why that goal's status flips between benches. `bounds` are the TLS rows against their
    cipher-bound limit (bound.bound_rows)."""
    oo, ss, os_, so = ("ours", "ours"), ("spdk", "spdk"), ("ours", "spdk"), ("spdk", "ours")
    c = lambda pair, work: table.get((*pair, work))  # noqa: E731

    def ratio_of(a: dict | None, b: dict | None, key: str, b_key: str | None = None) -> float | None:
        return ratio(a.get(key) if a else None, b.get(b_key or key) if b else None)

    def pair_goal(goal: str, subject, baseline, work: str, key: str, op: str, limit: float) -> dict[str, Any]:
        a, b = c(subject, work), c(baseline, work)
        rounds = per_round(runs, subject, baseline, work, key) if runs else None
        return _row(goal, ratio_of(a, b, key), op, limit, [a, b], spdk_missing, rounds)

    rows = [
        pair_goal("128k randread QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.2", oo, ss, LARGE, "bw_bytes", ">=", 1.2),
        pair_goal("4k randread QD32 IOPS: ours x ours / SPDK x SPDK >= 1.3", oo, ss, QD32, "iops", ">=", 1.3),
        # Issue 26: large I/O without staging copies.
        pair_goal("128k randread QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.05", oo, ss, LARGE, "bw_bytes", ">=",
                  1.05),
        pair_goal("128k randwrite QD32 bandwidth: ours x ours / SPDK x SPDK >= 1.05", oo, ss, LARGE_WRITE, "bw_bytes",
                  ">=", 1.05),
    ]
    # Issue 9's three rows, and issue 40 item 3's others: the target a host we did not write sees.
    for work, key in ((QD1, "iops"), (QD32, "iops"), (LARGE, "bw_bytes"), (QD128, "iops"), (WRITE_QD32, "iops"),
                      (LARGE_WRITE, "bw_bytes")):
        label = "bandwidth" if key == "bw_bytes" else "IOPS"
        rows.append(pair_goal(f"{work} {label} under spdk_nvme_perf: our target / SPDK's >= 1.0", os_, ss, work, key,
                              ">=", 1.0))
    for work, key in ((QD1, "iops"), (QD32, "iops"), (LARGE, "bw_bytes")):
        label = "bandwidth" if key == "bw_bytes" else "IOPS"
        rows.append(pair_goal(f"{work} {label} on SPDK's target: nvmf-perf / spdk_nvme_perf >= 1.0", so, ss, work,
                              key, ">=", 1.0))
    # Issue 20 item 5: what TLS (userspace records) keeps of plain, and ours against SPDK with TLS.
    tls, stls = ("ours-tls", "ours-tls"), ("spdk-tls", "spdk-tls")
    if any(k[:2] == tls for k in table):
        rows += [
            pair_goal("TLS: 4k randread QD32 IOPS, ours x ours TLS / plain >= 0.85", tls, oo, QD32, "iops", ">=", 0.85),
            pair_goal("TLS: 128k randread QD32 bandwidth, ours x ours TLS / plain >= 0.7", tls, oo, LARGE, "bw_bytes",
                      ">=", 0.7),
            pair_goal("TLS: 4k randread QD32 IOPS, ours x ours TLS / SPDK x SPDK TLS >= 1.2", tls, stls, QD32, "iops",
                      ">=", 1.2),
        ]
    # Issue 40: ours x ours, and our target under spdk_nvme_perf, keep 90 % of the cipher-bound limit.
    for b in bounds or []:
        if b["tls"] in (tls, ("ours-tls", "spdk-tls")):
            rows.append(_row(f"TLS: {b['work']}, {b['pair']} / cipher-bound limit >= {BOUND_GOAL}", b["value"], ">=",
                             BOUND_GOAL, b["cells"], b["why_missing"], b["per_round"]))
            if b["value"] is not None and b["why_missing"]:  # measured, but not only TLS (bound.caveat)
                rows[-1]["status"] += f" ({b['why_missing']})"
    busy, blocking, ours_qd1 = floor.get("busy"), floor.get("blocking"), c(oo, QD1)
    rows += [
        _row("4k QD1 mean latency (ours x ours, polling) / busy ping-pong mean <= 1.1",
             ratio_of(ours_qd1, busy, "lat_mean_ns", "mean_ns"), "<=", 1.1, [ours_qd1, busy]),
        pair_goal("4k QD1 p99.99 latency: ours x ours / SPDK x SPDK <= 1.0", oo, ss, QD1, "lat_p99_99_ns", "<=", 1.0),
        _row("event mode 4k QD1 mean latency (ours x ours) / blocking ping-pong mean <= 1.2",
             ratio_of(event_qd1, blocking, "lat_mean_ns", "mean_ns"), "<=", 1.2, [event_qd1, blocking]),
    ]
    return rows
