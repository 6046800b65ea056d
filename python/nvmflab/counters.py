"""Target `/stats` snapshots: differences between two snapshots and per-namespace sums.

Counters are cumulative since the target started, so a point's share is after minus before.
"""

from __future__ import annotations

from typing import Any

# Fields that identify an entry in a list of counters (reactors, namespaces, queues).
_IDENTITY = ("index", "core", "subnqn", "nsid", "hostnqn", "cntlid", "qid")


def _identity(entry: dict[str, Any]) -> tuple:
    return tuple(entry.get(k) for k in _IDENTITY if k in entry and not isinstance(entry.get(k), (dict, list)))


def diff(before: Any, after: Any) -> Any:
    """after - before for every number; identity fields and strings are taken from after."""
    if isinstance(after, bool) or isinstance(after, str):
        return after
    if isinstance(after, (int, float)):
        return after - before if isinstance(before, (int, float)) and not isinstance(before, bool) else after
    if isinstance(after, dict):
        before = before if isinstance(before, dict) else {}
        return {k: (v if k in _IDENTITY or k == "version" else diff(before.get(k), v)) for k, v in after.items()}
    if isinstance(after, list):
        earlier = {_identity(e): e for e in before or [] if isinstance(e, dict)}
        return [diff(earlier.get(_identity(e)), e) if isinstance(e, dict) else e for e in after]
    return after


def namespace_commands(stats: dict[str, Any], subnqn: str) -> dict[int, int]:
    """I/O commands each reactor served for the namespaces of one subsystem: {reactor index: n}."""
    served: dict[int, int] = {}
    for reactor in stats.get("reactors", []):
        total = sum(ns.get("commands", 0) for ns in reactor.get("namespaces", []) if ns.get("subnqn") == subnqn)
        if total:
            served[reactor.get("index", 0)] = total
    return served
