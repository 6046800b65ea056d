"""The conditions a number was measured under, named in one clause (issue 37 item 6).

Two sections can report very different magnitudes for what reads as the same thing (overhead's one
NVMe/TCP job against stacks' pairs): each then names the conditions its points ran with, so a
reader sees what differs (stacks, modes, jobs, cores) instead of a contradiction.
"""

from __future__ import annotations

import pandas as pd

from .cores_used import cores_text

# (column, how the clause names it)
NAMED = (("target_stack", "target stack"), ("host_stack", "host stack"), ("target_mode", "target reactor"),
         ("completion", "host completion"), ("numjobs", "jobs"))


def _seen(rows: pd.DataFrame, column: str) -> str:
    if column not in rows:
        return "not recorded"
    values = sorted({str(v).removesuffix(".0") for v in rows[column].dropna()})
    return "/".join(values) if values else "not recorded"


def conditions_text(rows: pd.DataFrame, link: str | None = None) -> str:
    """'target stack ours, host stack ours, target reactor poll, host completion poll, jobs 1,
    cores host cpu1 · target cpu0[, link …]' over the rows' points ('not recorded' where absent)."""
    parts = [f"{name} {_seen(rows, column)}" for column, name in NAMED]
    parts.append(f"cores {cores_text(rows)}")
    if link:
        parts.append(f"link {link}")
    return ", ".join(parts)
