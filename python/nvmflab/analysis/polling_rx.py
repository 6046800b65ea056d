"""The polling study's `matrix_rx` leg: the matrix's cells (completion × target_mode) for each
receive steering mode over one netns veth pair (the thesis's Table 3.3 second axis).

Table: one row per cell, one column per mode, each "p99 µs at the lowest QD / KIOPS at the
highest". Findings: every mode other than `off` against `off` in every cell, p99 at the lowest QD
and IOPS at the highest, Welch's interval over the interleaved repeats and Holm over all those
comparisons. What the steering emulates and what it cannot is said once (rx_steering.py)."""

from __future__ import annotations

import pandas as pd

from .common import compare_frames, corrected, leg_rows, missing_leg, stated
from .cores_used import cores_text
from .extra import with_knobs
from .result import StudyResult, Table
from .text import kiops, us

LEG = "matrix_rx"
WHAT = ("Receive steering over a veth: with none, a packet's receive processing runs on the sending core; "
        "rps hands it to {cores}; rfs to the core where the socket's reader last ran (the application's). "
        "It emulates RPS/RFS in software; not a NIC's interrupt, aRFS's hardware queue choice, several "
        "hardware queues or interrupt moderation.")


def analyze_rx(rows: pd.DataFrame, out: StudyResult) -> None:
    if rows.empty or LEG not in set(rows["leg"]):
        return
    data = leg_rows(rows, LEG, "main")
    if data.empty:
        out.findings.append(missing_leg(rows, LEG, "where receive processing runs was not evaluated"))
        return
    data = with_knobs(data, ["rx_steering", "rps_cores", "rps_on_role_core"])
    modes = [m for m in ("off", "rps", "rfs") if m in set(data["rx_steering"])]
    low, high = int(data["iodepth"].min()), int(data["iodepth"].max())
    cells = sorted({(c, m) for c, m in zip(data["completion"], data["target_mode"])})

    def pick(cell, mode, qd):
        return data[(data["completion"] == cell[0]) & (data["target_mode"] == cell[1])
                    & (data["rx_steering"] == mode) & (data["iodepth"] == qd)]

    def mean(frame, metric):
        return float(pd.to_numeric(frame[metric]).mean()) if len(frame) else float("nan")

    records = []
    for cell in cells:
        record = {"cell": f"completion = {cell[0]}, target_mode = {cell[1]}"}
        for mode in modes:
            record[mode] = (f"{mean(pick(cell, mode, low), 'lat_p99_ns') / 1e3:.1f} / "
                            f"{mean(pick(cell, mode, high), 'iops') / 1e3:.1f}")
        records.append(record)
    cores = str(data["rps_cores"].dropna().iloc[0]) if data["rps_cores"].notna().any() else "its cores"
    out.tables.append(Table("Where receive processing runs (receive steering × matrix)", pd.DataFrame(records),
                            f"Each cell: p99 µs at QD{low} / KIOPS at QD{high}, over one netns veth pair; cores used: "
                            f"{cores_text(data)}. " + WHAT.format(cores=cores)))
    if "off" not in modes or len(modes) < 2:
        return
    tests = []
    for cell in cells:
        for mode in (m for m in modes if m != "off"):
            tests.append((cell, mode, "lat_p99_ns", low))
            if high != low:
                tests.append((cell, mode, "iops", high))
    diffs = corrected([compare_frames(pick(cell, "off", qd), pick(cell, mode, qd), metric)
                       for cell, mode, metric, qd in tests])
    for (cell, mode, metric, qd), diff in zip(tests, diffs):
        fmt, name = (us, "p99") if metric == "lat_p99_ns" else (kiops, "IOPS")
        a, b = mean(pick(cell, "off", qd), metric), mean(pick(cell, mode, qd), metric)
        out.findings.append(
            f"Receive steering {mode} against none (completion = {cell[0]}, target_mode = {cell[1]}): {name} at "
            f"QD{qd} " + stated(diff, fmt, f"{'lower' if b < a else 'higher'} ({fmt(b)} vs {fmt(a)})",
                                same="no clear difference") + ".")
    if data["rps_on_role_core"].map(lambda v: v is True or v == 1).any():
        out.findings.append(f"rps handed packets to {cores}, a core the host or the target already runs on: this "
                            "machine has no other, so rps here measures moving receive work onto a role's core, not "
                            "onto a core of its own.")
