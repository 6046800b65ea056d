"""The regression gate of `nvmflab compare --fail-if-slower` (issue 41 item 1): it fails closed.

A gated metric is one point's IOPS, bandwidth, mean or p99 latency with a threshold (PCT % of the
before mean). Its slowdown is after − before for latency and before − after for IOPS and bandwidth,
so a positive slowdown is always worse. Welch's one-sided bounds at level 1 − α/m (α = 5 %, m the
number of gated metrics: Bonferroni, so the bounds of the whole family hold together) give
the slowdown's best end and worst end, and the verdict:

- `slower beyond threshold`: even the best end is beyond PCT % (exit 1);
- `within threshold`: even the worst end is within PCT % (an equivalence / non-inferiority test);
- `inconclusive`: neither, or no interval (fewer than two repeats a side, repeats without spread);
  the advice says what these runs can exclude (the worst end) and how many repeats a side would
  decide the threshold at the observed spread (`repeats_needed`).

The gate passes (exit 0) only when every gated metric is within its threshold and every gated point
was measured usably on both sides. Exit statuses: docs/compare.md. Under `compare --until-decided`,
which judges the family after every extra round, the level is 1 − α/(m · looks): each look is paid for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from . import exits
from .analysis import student as student_t
from .analysis.decide import ALPHA, summary

SLOWER = "slower beyond threshold"
WITHIN = "within threshold"
INCONCLUSIVE = "inconclusive"
EXIT_PASSED, EXIT_REGRESSION = exits.OK, exits.FAILED
EXIT_UNUSABLE, EXIT_INCONCLUSIVE = exits.BAD_INPUT, exits.INCONCLUSIVE
KINDS = ("iops", "bw", "mean", "p99")
KIND_ALIASES = {"iops": "iops", "bw": "bw", "bandwidth": "bw", "mean": "mean", "lat_mean": "mean",
                "p99": "p99", "lat_p99": "p99"}
POINT_FIELDS = ("study", "leg", "role")  # besides the knobs, what a --gate-point may name
MAX_REPEATS = 1000  # repeats_needed looks no further


class GateError(ValueError):
    """A gate option compare cannot use: one line for the CLI."""


@dataclass
class GateVerdict:
    study: str
    leg: str
    role: str
    point: str
    kind: str
    threshold_pct: float
    slowdown_pct: float | None  # estimate; positive is slower
    best_pct: float | None  # one-sided bounds of the slowdown at `confidence`
    worst_pct: float | None
    confidence: float
    verdict: str
    reason: str
    repeats_needed: int | None = None  # a side, to decide the threshold at the observed spread


@dataclass
class Gate:
    thresholds: dict[str, float]
    points: list[dict[str, str]]
    min_points: int
    looks: int = 1  # times the same family is judged (compare --until-decided): Bonferroni over them too
    family: int = 0
    verdicts: list[GateVerdict] = field(default_factory=list)
    missing: list[dict] = field(default_factory=list)  # gated points without usable repeats on a side
    gated_points: int = 0
    decided_points: int = 0
    status: str = "off"
    exit_status: int = EXIT_PASSED
    reason: str = ""

    def of(self, verdict: str) -> list[GateVerdict]:
        return [v for v in self.verdicts if v.verdict == verdict]


def parse_thresholds(values: list[str] | None) -> dict[str, float]:
    """`5` (every kind) or `iops=5`, `p99=10`, … (repeatable, or comma-separated) → kind → percent.
    Refuses an empty, negative or non-numeric threshold and one kind given twice."""
    gate: dict[str, float] = {}
    for value in values or []:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                raise GateError(f"--fail-if-slower {value!r}: an empty threshold; give PCT or KIND=PCT "
                                f"(KIND: {', '.join(KINDS)})")
            kind, _, pct = part.rpartition("=")
            try:
                number = float(pct)
            except ValueError:
                raise GateError(f"--fail-if-slower {part!r}: {pct.strip() or 'nothing'} is not a number; give "
                                f"PCT or KIND=PCT (KIND: {', '.join(KINDS)})") from None
            if not math.isfinite(number) or number < 0:
                raise GateError(f"--fail-if-slower {part!r}: PCT must be a finite number ≥ 0")
            if kind and kind.strip().lower() not in KIND_ALIASES:
                raise GateError(f"--fail-if-slower {part!r}: unknown kind {kind!r} ({', '.join(KINDS)})")
            kinds = [KIND_ALIASES[kind.strip().lower()]] if kind else list(KINDS)
            twice = [k for k in kinds if k in gate]
            if twice:
                raise GateError(f"--fail-if-slower {part!r}: a threshold for {', '.join(twice)} was given "
                                "already; give each kind one threshold")
            gate.update(dict.fromkeys(kinds, number))
    return gate


def parse_points(values: list[str] | None) -> list[dict[str, str]]:
    """`--gate-point KNOB=VALUE[,KNOB=VALUE...]`, repeatable: a point is gated when it has every
    KNOB=VALUE of one of them."""
    out = []
    for value in values or []:
        condition: dict[str, str] = {}
        for part in str(value).split(","):
            name, sep, wanted = (s.strip() for s in part.partition("="))
            if not sep or not name or not wanted:
                raise GateError(f"--gate-point {value!r}: give KNOB=VALUE[,KNOB=VALUE...] "
                                "(for example iodepth=32,bs=4096)")
            if name in condition:
                raise GateError(f"--gate-point {value!r}: {name} is given twice")
            condition[name] = wanted
        out.append(condition)
    return out


def knob_text(value) -> str:
    """A knob's value as --gate-point writes it: strings as they are, the rest as JSON (4096, true)."""
    return value if isinstance(value, str) else json.dumps(value)


def point_fields(point: dict) -> dict[str, str]:
    """What a --gate-point condition can match: the point's knobs, study, leg and role."""
    return {**{k: knob_text(v) for k, v in point["knobs"].items()},
            **{k: str(point[k]) for k in POINT_FIELDS}}


def selected(point: dict, conditions: list[dict[str, str]]) -> bool:
    fields = point_fields(point)
    return not conditions or any(all(fields.get(k) == v for k, v in c.items()) for c in conditions)


def check_points(conditions: list[dict[str, str]], points: list[dict]) -> None:
    """Each condition names fields some point has and matches at least one point of either side."""
    fields = [point_fields(p) for p in points]
    names = sorted({k for f in fields for k in f})
    for condition in conditions:
        unknown = [k for k in condition if k not in names]
        if unknown:
            raise GateError(f"--gate-point: no point has {', '.join(unknown)} (they have: {', '.join(names)})")
        if not any(all(f.get(k) == v for k, v in condition.items()) for f in fields):
            have = "; ".join(f"{k}: {', '.join(sorted({f[k] for f in fields if k in f}))}" for k in condition)
            text = ",".join(f"{k}={v}" for k, v in condition.items())
            raise GateError(f"--gate-point {text}: matches no point ({have})")


def repeats_needed(slowdown: float, var_b: float, var_a: float, limit: float, level: float) -> int | None:
    """The fewest repeats a side (n, the same on both) whose one-sided bound at `level` would put the
    threshold on one side of the interval, if the means and spreads stayed as observed:
    |limit − slowdown| > t(level, ν(n)) · √((s_b² + s_a²) / n),
    ν(n) = (s_b² + s_a²)² (n − 1) / (s_b⁴ + s_a⁴) (Welch's degrees of freedom for n a side).
    None when no n up to MAX_REPEATS does (or the estimate sits on the threshold)."""
    total = var_b + var_a
    gap = abs(limit - slowdown)
    if not total > 0 or not gap > 0:
        return None
    n = np.arange(2, MAX_REPEATS + 1)
    dof = total ** 2 * (n - 1) / (var_b ** 2 + var_a ** 2)
    decided = student_t.ppf(level, dof) * np.sqrt(total / n) < gap
    return int(n[decided][0]) if decided.any() else None


def before_bounds_it(before: list[float], after: list[float], slowdown_pct: float, threshold_pct: float,
                     level: float) -> float | None:
    """Where more repeats of AFTER alone cannot decide a threshold at the observed spreads: the
    narrowest one-sided reach (in % of the before mean) of Welch's bound for any number of AFTER
    repeats up to MAX_REPEATS with BEFORE's as they are, when even it reaches the threshold from the
    observed slowdown; else None."""
    mean_b, sd_b, n_b = (float(v) for v in summary(before))
    _, sd_a, n_a = (float(v) for v in summary(after))
    if min(n_b, n_a) < 2 or not mean_b > 0 or not sd_b > 0:
        return None
    part_b, n = sd_b ** 2 / n_b, np.arange(int(n_a), MAX_REPEATS + 1)
    part_a = sd_a ** 2 / n
    dof = (part_b + part_a) ** 2 / (part_b ** 2 / (n_b - 1) + part_a ** 2 / np.maximum(n - 1, 1))
    reach = float(np.min(student_t.ppf(level, dof) * np.sqrt(part_b + part_a))) * 100.0 / mean_b
    return reach if reach >= abs(threshold_pct - slowdown_pct) else None


def judge(before: list[float], after: list[float], higher_better: bool, threshold_pct: float,
          family: int, looks: int = 1) -> dict:
    """One gated metric: the slowdown in % of the before mean with its one-sided bounds at
    1 − α/(family · looks), the verdict, its reason and, when inconclusive, the advice."""
    level = 1 - ALPHA / (max(family, 1) * max(looks, 1))
    mean_b, sd_b, n_b = (float(v) for v in summary(before))
    mean_a, sd_a, n_a = (float(v) for v in summary(after))
    sign = -1.0 if higher_better else 1.0
    slowdown = sign * (mean_a - mean_b)
    out = {"confidence": level, "slowdown_pct": None, "best_pct": None, "worst_pct": None}
    if not mean_b > 0:
        return out | {"verdict": INCONCLUSIVE, "reason": "the before mean is not above zero: no % to judge"}
    pct = 100.0 / mean_b
    out["slowdown_pct"] = slowdown * pct
    var_b, var_a = sd_b ** 2 / n_b if n_b >= 2 else math.nan, sd_a ** 2 / n_a if n_a >= 2 else math.nan
    if min(n_b, n_a) < 2 or not (var_b > 0 and var_a > 0):
        why = "fewer than two repeats on a side" if min(n_b, n_a) < 2 else "repeats without spread"
        return out | {"verdict": INCONCLUSIVE,
                      "reason": f"inconclusive: {why}, so no interval; run at least 3 repeats a side"}
    se = math.sqrt(var_b + var_a)
    dof = (var_b + var_a) ** 2 / (var_b ** 2 / (n_b - 1) + var_a ** 2 / (n_a - 1))
    reach = float(student_t.ppf(level, dof)) * se
    best, worst = (slowdown - reach) * pct, (slowdown + reach) * pct
    out |= {"best_pct": best, "worst_pct": worst}
    bound = f"one-sided {100 * level:.4g} % bound, Bonferroni over {family}" + (
        f" metric(s) × {looks} looks" if looks > 1 else "")
    if best > threshold_pct:
        return out | {"verdict": SLOWER, "reason": f"slower beyond threshold: the slowdown is at least "
                                                   f"{best:.1f} % ({bound}) > {threshold_pct:g} %"}
    if worst <= threshold_pct:
        return out | {"verdict": WITHIN, "reason": f"within threshold: the slowdown is at most {worst:.1f} % "
                                                   f"({bound}) ≤ {threshold_pct:g} %"}
    limit = threshold_pct / pct
    n = repeats_needed(slowdown, sd_b ** 2, sd_a ** 2, limit, level)
    goal = "show it within" if slowdown < limit else "show it slower than"
    more = (f"about {n} repeats a side would {goal} {threshold_pct:g} %" if n is not None
            else f"no number of repeats up to {MAX_REPEATS} a side would decide {threshold_pct:g} %")
    return out | {"verdict": INCONCLUSIVE, "repeats_needed": n,
                  "reason": f"inconclusive: the slowdown is {slowdown * pct:+.1f} % [{best:+.1f}, {worst:+.1f}] "
                            f"({bound}); these runs exclude only a slowdown above {worst:.1f} %, not "
                            f"{threshold_pct:g} %; at the observed spread {more}"}


def evaluate(gate: Gate, metrics: list, higher_better: dict[str, bool], missing: list[dict]) -> Gate:
    """Judge every gated metric (`metrics`: compare's MetricComparison of matched points) and set
    the gate's status and exit status. `missing`: gated points not usable, or absent, on a side."""
    gated = [m for m in metrics if m.kind in gate.thresholds and selected(vars(m), gate.points)]
    gate.family = len(gated)
    gate.missing = missing
    for m in gated:
        j = judge(m.before, m.after, higher_better[m.kind], gate.thresholds[m.kind], gate.family, gate.looks)
        gate.verdicts.append(GateVerdict(study=m.study, leg=m.leg, role=m.role, point=m.point, kind=m.kind,
                                         threshold_pct=gate.thresholds[m.kind], **j))
    by_point: dict[tuple, bool] = {}
    for v in gate.verdicts:
        key = (v.study, v.leg, v.role, v.point)
        by_point[key] = by_point.get(key, True) and v.worst_pct is not None
    gate.gated_points = len(by_point) + len(missing)
    gate.decided_points = sum(by_point.values())
    if not gate.verdicts:
        gate.status, gate.exit_status = "unusable", EXIT_UNUSABLE
        gate.reason = ("nothing to gate: no point of the selection was measured usably on both sides"
                       + (f" ({len(missing)} gated point(s) only on one side or not usable)" if missing else ""))
    elif gate.of(SLOWER):
        gate.status, gate.exit_status = "failed", EXIT_REGRESSION
        gate.reason = f"{len(gate.of(SLOWER))} gated metric(s) slower beyond the threshold"
    elif gate.decided_points < gate.min_points:
        gate.status, gate.exit_status = "unusable", EXIT_UNUSABLE
        gate.reason = (f"only {gate.decided_points} of {gate.gated_points} gated point(s) could be decided "
                       f"(an interval needs two repeats a side with spread); at least {gate.min_points} "
                       "required (--gate-min-points)")
    elif gate.of(INCONCLUSIVE) or missing:
        gate.status, gate.exit_status = "inconclusive", EXIT_INCONCLUSIVE
        gate.reason = (f"{len(gate.of(INCONCLUSIVE))} gated metric(s) inconclusive"
                       + (f", {len(missing)} gated point(s) not measured usably on both sides" if missing else ""))
    else:
        gate.status, gate.exit_status = "passed", EXIT_PASSED
        gate.reason = f"all {gate.family} gated metric(s) shown within their thresholds"
    return gate
