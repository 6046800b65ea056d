"""`nvmflab compare BEFORE AFTER`: what got faster, what got slower, what did not change (issue 24 item 1).

Each side is a results directory (or one study of it, `--study`), opened read-only. Points are
matched on what defines them apart from the repeat: study, leg, load-generator role and the point's
knobs (`knobs_json`, which carries `target_stack` and `host_stack`), so a point measured with another
stack or knob value is a different point. Points without a partner, and points that did not run
cleanly on one side, are listed, never dropped.

For every matched point and metric (IOPS, bandwidth, mean and p99 latency) with repeats, the
per-repeat values of both sides go through the project's decision functions
(`analysis.decide.welch`: after − before with Welch's 95 % interval and p value; no interval with
fewer than two repeats a side or repeats without spread) and Holm's correction over the whole family
(every point × metric compared, `analysis.decide.holm`). A difference that Holm keeps is `faster` or
`slower` (for latency, lower is faster); one it does not keep, or whose interval includes zero, is
`no clear difference`; one without an interval is `cannot decide`.

`--fail-if-slower PCT` (or `KIND=PCT` for iops, bw, mean, p99) gates the metrics it names on the
points `--gate-point` selects, failing closed (gate.py): exit 1 only for a metric shown slower beyond
PCT, 0 only when every gated metric is shown within PCT, 3 when any is inconclusive, 2 for input or
data the gate cannot use. `--until-decided` first measures more repeats of the inconclusive gated
points (rerun.py), then judges as above.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import gate as gating
from .analysis.decide import holm, welch
from .analysis.stats import collapse_jobs, usable_mask
from .gate import Gate, GateError

# kind → (column, label, higher is better, unit scale, unit)
METRICS: dict[str, tuple[str, str, bool, float, str]] = {
    "iops": ("iops", "IOPS", True, 1e3, "KIOPS"),
    "bw": ("bw_bytes", "bandwidth", True, 1e6, "MB/s"),
    "mean": ("lat_mean_ns", "mean latency", False, 1e3, "µs"),
    "p99": ("lat_p99_ns", "p99 latency", False, 1e3, "µs"),
}
# Point knobs that name where a run kept its files, not what it measured.
IGNORED_KNOBS = {"file_dir"}
ENV_KEYS = ["hostname", "kernel", "cpu_model", "cores", "memory_bytes", "nic", "python", "git_rev"]


class CompareError(ValueError):
    """Input compare cannot use (no results, no such study, an unreadable or unwritable file): one
    line for the CLI, exit 2."""


@dataclass
class Side:
    path: str
    study: str | None
    rows: pd.DataFrame  # every measurement row of the selection, every status
    runs: pd.DataFrame


@dataclass
class MetricComparison:
    study: str
    leg: str
    role: str
    point: str  # label: the knobs that vary in this study and leg
    knobs: dict
    kind: str
    metric: str
    before: list[float]
    after: list[float]
    before_mean: float | None
    after_mean: float | None
    difference: float | None
    low: float | None
    high: float | None
    change_pct: float | None
    low_pct: float | None
    high_pct: float | None
    p: float | None
    holm_family: int = 1
    holm_kept: bool = False
    verdict: str = "cannot decide"
    reason: str = ""


@dataclass
class Comparison:
    before: str
    after: str
    study: str | None
    metrics: list[MetricComparison] = field(default_factory=list)
    only_before: list[dict] = field(default_factory=list)
    only_after: list[dict] = field(default_factory=list)
    not_usable: list[dict] = field(default_factory=list)
    environment: list[dict] = field(default_factory=list)
    gate: dict[str, float] = field(default_factory=dict)
    gate_failures: list[MetricComparison] = field(default_factory=list)  # slower beyond the threshold
    gate_result: Gate | None = None  # with --fail-if-slower
    warnings: list[str] = field(default_factory=list)
    until_decided: dict | None = None  # --until-decided: the cap, the sides re-run and each extra round

    def exit_status(self) -> int:
        """0, or the gate's: 1 slower beyond a threshold, 2 nothing it can use, 3 inconclusive."""
        return self.gate_result.exit_status if self.gate_result else gating.EXIT_PASSED

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.metrics:
            out[m.verdict] = out.get(m.verdict, 0) + 1
        return out

    def as_dict(self) -> dict:
        return {
            "format": "nvmflab-compare/1",
            "before": self.before, "after": self.after, "study": self.study,
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "counts": self.counts(),
            "metrics": [asdict(m) for m in self.metrics],
            "unmatched": {"only_before": self.only_before, "only_after": self.only_after},
            "not_usable": self.not_usable,
            "environment": self.environment,
            "warnings": self.warnings,
            "gate": self._gate_dict(),
            **({"until_decided": self.until_decided} if self.until_decided is not None else {}),
        }

    def _gate_dict(self) -> dict:
        g = self.gate_result
        out = {"fail_if_slower_pct": self.gate, "failed": bool(self.gate_failures),
               "failures": [f"{m.study}/{m.leg} {m.point} {m.kind}" for m in self.gate_failures]}
        if g is None:
            return out
        return out | {"status": g.status, "exit_status": g.exit_status, "reason": g.reason,
                      "points": g.points, "min_points": g.min_points, "family": g.family, "looks": g.looks,
                      "gated_points": g.gated_points, "decided_points": g.decided_points,
                      "verdicts": [asdict(v) for v in g.verdicts], "missing": g.missing}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


def load_side(path: Path, study: str | None = None) -> Side:
    """The rows and runs of a results directory, or of one study in it."""
    from .store import ResultsStore

    import sqlite3

    from .store import StoreError

    path = Path(path)
    if not (path / ResultsStore.FILENAME).is_file():
        raise CompareError(f"{path}: no {ResultsStore.FILENAME} here (not a results directory)")
    try:
        with ResultsStore(path, read_only=True) as store:
            rows, runs = store.measurements(), store.runs()
    # pandas' DatabaseError is an OSError: caught here, a damaged page is never called a write error.
    except (sqlite3.Error, pd.errors.DatabaseError, StoreError, OSError) as error:
        cause = error.__cause__ if isinstance(error, pd.errors.DatabaseError) and error.__cause__ else error
        raise CompareError(f"{path / ResultsStore.FILENAME}: cannot read the results "
                           f"({' '.join(str(cause).split())})") from None
    if study is not None:
        if rows.empty or study not in set(rows["study"]):
            have = ", ".join(sorted(set(rows["study"]))) if not rows.empty else "none"
            raise CompareError(f"{path}: no study {study!r} in these results (studies: {have})")
        rows = rows[rows["study"] == study]
        runs = runs[runs["study"] == study]
    return Side(str(path), study, rows, runs)


def match_key(knobs_json: Any) -> str:
    """The point's knobs as canonical JSON, without the knobs that name a run's own files."""
    try:
        knobs = json.loads(knobs_json) if isinstance(knobs_json, str) else dict(knobs_json or {})
    except (TypeError, ValueError):
        return str(knobs_json)
    return json.dumps({k: v for k, v in knobs.items() if k not in IGNORED_KNOBS}, sort_keys=True)


def _configs(rows: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """(study, leg, role, knobs) → the usable rows of that configuration (jobs of a role summed)."""
    if rows.empty:
        return {}
    good = collapse_jobs(rows[usable_mask(rows)])
    out: dict[tuple, pd.DataFrame] = {}
    for (study, leg, role, key), group in good.assign(_key=good["knobs_json"].map(match_key)).groupby(
            ["study", "leg", "role", "_key"], sort=True, dropna=False):
        out[(study, leg, role, key)] = group
    return out


def _all_configs(rows: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    if rows.empty:
        return {}
    return {k: g for k, g in rows.assign(_key=rows["knobs_json"].map(match_key)).groupby(
        ["study", "leg", "role", "_key"], sort=True, dropna=False)}


def _labels(keys: list[tuple]) -> dict[tuple, str]:
    """A short label per configuration: the knobs that vary within its study and leg."""
    by_leg: dict[tuple, list[dict]] = {}
    for study, leg, role, key in keys:
        by_leg.setdefault((study, leg), []).append(json.loads(key))
    varying = {}
    for leg, knob_list in by_leg.items():
        names = sorted({k for knobs in knob_list for k in knobs})
        varying[leg] = [n for n in names if len({json.dumps(k.get(n), sort_keys=True) for k in knob_list}) > 1]
    out = {}
    for study, leg, role, key in keys:
        knobs = json.loads(key)
        parts = [f"{n}={knobs.get(n)}" for n in varying[(study, leg)]]
        if role != "main":
            parts.append(f"role={role}")
        out[(study, leg, role, key)] = ", ".join(parts) or "(one point)"
    return out


def _point_list(configs: dict[tuple, pd.DataFrame], keys, labels=None) -> list[dict]:
    out = []
    for key in keys:
        study, leg, role, knobs = key
        group = configs[key]
        out.append({"study": study, "leg": leg, "role": role, "knobs": json.loads(knobs),
                    "point_keys": sorted({str(k) for k in group["point_key"].dropna()}),
                    "statuses": sorted({str(s) for s in group["status"].dropna()})})
    return out


def environment(before: Side, after: Side) -> list[dict]:
    """Versions and environment side by side: the runs' env (kernel, CPU, cores, network devices with
    driver and speed, tools), the data interface each machine's traffic used (from the points' network
    counters) and the stacks' versions from the measurements."""
    def env_of(side: Side) -> dict[str, str]:
        values: dict[str, set[str]] = {}
        for text in side.runs.get("env_json", pd.Series(dtype=object)).dropna():
            try:
                env = json.loads(text)
            except (TypeError, ValueError):
                continue
            for key in ENV_KEYS:
                if key in env and env[key] is not None:
                    values.setdefault(key, set()).add(str(env[key]))
            for nic, info in (env.get("nics") or {}).items():
                if isinstance(info, dict):
                    speed = f", {info['speed_mbps']} Mb/s" if info.get("speed_mbps") else ""
                    values.setdefault(f"nic {nic}", set()).add(f"{info.get('driver') or 'driver unknown'}{speed}")
            for tool, info in (env.get("tools") or {}).items():
                version = info.get("version") if isinstance(info, dict) else info
                if version:
                    values.setdefault(f"tool {tool}", set()).add(str(version))
        # The interface that carried each point's traffic, per machine (netcounters.py), with its speed.
        for text in (side.rows["net_json"].dropna() if "net_json" in side.rows else []):
            try:
                machines = json.loads(text)
            except (TypeError, ValueError):
                continue
            for machine, w in machines.items():
                data = (w or {}).get("data_interface")
                if data:
                    speed = ((w.get("interfaces") or {}).get(data) or {}).get("speed_mbps")
                    values.setdefault("data interface", set()).add(
                        f"{machine}: {data}" + (f" ({speed} Mb/s)" if speed else ""))
        for column, name in (("target_stack_version", "target stack"), ("host_stack_version", "host stack")):
            if column in side.rows:
                for v in side.rows[column].dropna():
                    values.setdefault(name, set()).add(str(v))
        return {k: "; ".join(sorted(v)) for k, v in values.items()}

    a, b = env_of(before), env_of(after)
    order = [k for k in ENV_KEYS if k in a or k in b] + sorted((set(a) | set(b)) - set(ENV_KEYS))
    return [{"what": k, "before": a.get(k), "after": b.get(k), "changed": a.get(k) != b.get(k)} for k in order]


def parse_gate(values: list[str] | None) -> dict[str, float]:
    """`5` (every kind) or `iops=5`, `p99=10`, … → kind → percent (gate.parse_thresholds)."""
    return gating.parse_thresholds(values)


def compare(before: Side, after: Side, gate: dict[str, float] | None = None,
            gate_points: list[dict[str, str]] | None = None, min_points: int = 1, looks: int = 1) -> Comparison:
    """Match the points of two sides, judge every metric with repeats (Welch, Holm over all) and,
    with thresholds, the gated metrics (gate.py; `looks`: how often --until-decided may judge them)."""
    result = Comparison(before.path, after.path, before.study or after.study, gate=dict(gate or {}))
    if _same_directory(before.path, after.path):
        result.warnings.append(f"BEFORE and AFTER are the same directory ({before.path}): every difference "
                               "is zero by construction; compare two runs")
    cb, ca = _configs(before.rows), _configs(after.rows)
    allb, alla = _all_configs(before.rows), _all_configs(after.rows)
    matched = sorted(set(cb) & set(ca))
    result.only_before = _point_list(allb, sorted(set(allb) - set(alla)))
    result.only_after = _point_list(alla, sorted(set(alla) - set(allb)))
    # Present on both sides but without a usable repeat on one: listed with their statuses.
    for key in sorted((set(allb) & set(alla)) - set(matched)):
        side = "before" if key not in cb else "after"
        entry = _point_list(allb if side == "before" else alla, [key])[0]
        entry["unusable_on"] = side if (key in cb) != (key in ca) else "both"
        errors = (allb if side == "before" else alla)[key]["error"].dropna()
        entry["error"] = str(errors.iloc[0]) if len(errors) else None
        result.not_usable.append(entry)
    labels = _labels(matched)
    pending = []
    for key in matched:
        study, leg, role, knobs = key
        for kind, (column, _, higher_better, _, _) in METRICS.items():
            if column not in cb[key] or column not in ca[key]:
                continue
            vb = [float(v) for v in pd.to_numeric(cb[key][column], errors="coerce").dropna()]
            va = [float(v) for v in pd.to_numeric(ca[key][column], errors="coerce").dropna()]
            if not vb or not va:
                continue
            diff, half, p, _ = welch(np.asarray(vb), np.asarray(va))
            diff, half, p = float(np.ravel(diff)[0]), float(np.ravel(half)[0]), float(np.ravel(p)[0])
            mean_b = float(np.mean(vb))
            low, high = (diff - half, diff + half) if not math.isnan(half) else (math.nan, math.nan)
            pct = (lambda x: 100.0 * x / mean_b if mean_b else math.nan)
            pending.append((MetricComparison(
                study=study, leg=leg, role=role, point=labels[key], knobs=json.loads(knobs), kind=kind,
                metric=column, before=vb, after=va, before_mean=_num(mean_b), after_mean=_num(np.mean(va)),
                difference=_num(diff), low=_num(low), high=_num(high), change_pct=_num(pct(diff)),
                low_pct=_num(pct(low)), high_pct=_num(pct(high)), p=_num(p)), higher_better))
    kept = holm(np.array([m.p if m.p is not None else math.nan for m, _ in pending])) if pending else []
    family = sum(1 for m, _ in pending if m.p is not None)
    for (m, higher_better), keep in zip(pending, kept):
        m.holm_family, m.holm_kept = family, bool(keep)
        if m.p is None:
            n = min(len(m.before), len(m.after))
            m.verdict = "cannot decide"
            m.reason = ("fewer than two repeats on a side" if n < 2 else "repeats without spread: no interval")
        elif keep:
            better = (m.difference > 0) == higher_better
            m.verdict = "faster" if better else "slower"
            m.reason = f"95 % interval excludes zero and Holm over {family} comparisons keeps it"
        else:
            m.verdict = "no clear difference"
            clear_alone = m.low is not None and (m.low > 0 or m.high < 0)
            m.reason = (f"not clear after Holm's correction over {family} comparisons" if clear_alone
                        else "95 % interval of the difference includes zero")
        result.metrics.append(m)
    result.environment = environment(before, after)
    if result.gate:
        _judge_gate(result, gate_points or [], min_points, looks)
    return result


def _same_directory(a: str, b: str) -> bool:
    try:
        return Path(a).samefile(b)
    except OSError:
        return False


def _judge_gate(result: Comparison, conditions: list[dict[str, str]], min_points: int, looks: int = 1) -> None:
    """The gated metrics' verdicts (gate.py); gated points found on the before side only, or not
    usable on a side, keep the gate from passing."""
    points = [vars(m) for m in result.metrics] + result.only_before + result.only_after + result.not_usable
    gating.check_points(conditions, points)
    missing = [p for p in result.only_before + result.not_usable if gating.selected(p, conditions)]
    higher_better = {kind: spec[2] for kind, spec in METRICS.items()}
    result.gate_result = gating.evaluate(Gate(result.gate, conditions, min_points, looks), result.metrics,
                                         higher_better, missing)
    slower = {(v.study, v.leg, v.role, v.point, v.kind) for v in result.gate_result.of(gating.SLOWER)}
    result.gate_failures = [m for m in result.metrics if (m.study, m.leg, m.role, m.point, m.kind) in slower]


def _fmt(m: MetricComparison, value: float | None) -> str:
    scale, unit = METRICS[m.kind][3], METRICS[m.kind][4]
    return "n/a" if value is None else f"{value / scale:.2f} {unit}"


def _interval_text(m: MetricComparison) -> str:
    if m.difference is None:
        return "n/a"
    sign = "+" if m.difference >= 0 else "−"
    scale, unit = METRICS[m.kind][3], METRICS[m.kind][4]
    if m.low is None:
        return f"{sign}{abs(m.difference) / scale:.2f} {unit} (no interval)"
    return (f"{m.difference / scale:+.2f} {unit} [{m.low / scale:+.2f}, {m.high / scale:+.2f}]"
            f" = {m.change_pct:+.1f} % [{m.low_pct:+.1f}, {m.high_pct:+.1f}]")


def text_summary(c: Comparison) -> str:
    lines = [f"nvmflab compare: before {c.before}  after {c.after}" + (f"  (study {c.study})" if c.study else "")]
    lines += [f"warning: {w}" for w in c.warnings]
    counts = c.counts()
    lines.append("verdicts: " + (", ".join(f"{counts.get(v, 0)} {v}" for v in
                                           ("faster", "slower", "no clear difference", "cannot decide"))
                                 if counts else "nothing to compare"))
    changed = [e for e in c.environment if e["changed"]]
    if changed:
        lines.append("changed besides the knobs: " + "; ".join(
            f"{e['what']}: {e['before'] or '—'} → {e['after'] or '—'}" for e in changed))
    for m in c.metrics:
        lines.append(f"  {m.verdict:<20} {m.study}/{m.leg} [{m.point}] {METRICS[m.kind][1]}: "
                     f"{_fmt(m, m.before_mean)} → {_fmt(m, m.after_mean)}, {_interval_text(m)}"
                     f" (n {len(m.before)}/{len(m.after)}): {m.reason}")
    for title, items in (("only in before", c.only_before), ("only in after", c.only_after),
                         ("not usable", c.not_usable)):
        for p in items:
            extra = f" on {p['unusable_on']} ({p.get('error') or ', '.join(p['statuses'])})" if "unusable_on" in p else ""
            lines.append(f"  {title}: {p['study']}/{p['leg']} role={p['role']} "
                         f"{json.dumps(p['knobs'], sort_keys=True)}{extra}")
    if c.until_decided is not None:
        u = c.until_decided
        lines.append(f"--until-decided: {len(u['rounds'])} of at most {u['max_extra_rounds']} extra round(s) on "
                     f"{' and '.join(u['rerun'])}; {u['stopped']}")
    if c.gate_result is not None:
        lines += gate_summary(c.gate_result)
    return "\n".join(lines)


def gate_summary(g: Gate) -> list[str]:
    """The gate's outcome with its exit status, and every gated metric's verdict and reason."""
    limits = ", ".join(f"{k} {v:g} %" for k, v in g.thresholds.items())
    where = " on " + " or ".join(",".join(f"{k}={v}" for k, v in c.items()) for c in g.points) if g.points else ""
    head = {"passed": "gate passed", "failed": "REGRESSION", "inconclusive": "GATE INCONCLUSIVE",
            "unusable": "GATE CANNOT DECIDE"}[g.status]
    lines = [f"{head} (exit {g.exit_status}, --fail-if-slower {limits}{where}): {g.reason}"]
    for v in sorted(g.verdicts, key=lambda v: (v.verdict != gating.SLOWER, v.verdict != gating.INCONCLUSIVE)):
        lines.append(f"  {v.verdict:<23} {v.study}/{v.leg} [{v.point}] {METRICS[v.kind][1]}: {v.reason}")
    for p in g.missing:
        side = f"not usable on {p['unusable_on']}" if "unusable_on" in p else "only in before"
        lines.append(f"  {'not measured':<23} {p['study']}/{p['leg']} role={p['role']} "
                     f"{json.dumps(p['knobs'], sort_keys=True)}: {side}")
    return lines


def figures(c: Comparison, limit: int = 24) -> list[dict]:
    """Both runs overlaid: per study, leg and metric kind, the before and after means of every matched
    point with their 95 % intervals (error bars), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .analysis.stats import ci95_halfwidth
    from .plots import nonnegative_yerr, notes

    groups: dict[tuple, list[MetricComparison]] = {}
    for m in c.metrics:
        groups.setdefault((m.study, m.leg, m.kind), []).append(m)
    out = []
    for (study, leg, kind), items in list(groups.items())[:limit]:
        scale, unit, label = METRICS[kind][3], METRICS[kind][4], METRICS[kind][1]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(items) + 2), 3.4))
        x = np.arange(len(items))
        for offset, side, colour in ((-0.15, "before", "tab:blue"), (0.15, "after", "tab:orange")):
            means = [np.mean(getattr(m, side)) / scale for m in items]
            errs = [ci95_halfwidth(getattr(m, side)) / scale for m in items]
            ax.errorbar(x + offset, means, yerr=nonnegative_yerr(fig, means, errs), fmt="o", capsize=3,
                        color=colour, label=side)
        for i, m in enumerate(items):
            if m.verdict in ("faster", "slower"):
                ax.annotate(m.verdict, (i, max(np.mean(m.before), np.mean(m.after)) / scale),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                            color="tab:green" if m.verdict == "faster" else "tab:red")
        ax.set_xticks(x)
        ax.set_xticklabels([m.point for m in items], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"{label} ({unit})")
        ax.set_title(f"{study} / {leg}: {label}, before vs after (95 % intervals)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        buffer = BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        plt.close(fig)
        name = f"{study}-{leg}-{kind}".replace("/", "_").replace(" ", "_")
        out.append({"name": name, "caption": "; ".join([f"{study} / {leg}: {label}", *notes(fig)]),
                    "png": buffer.getvalue(), "png_base64": base64.b64encode(buffer.getvalue()).decode("ascii")})
    return out


def write_html(c: Comparison, out_dir: Path) -> Path:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    out_dir = Path(out_dir)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    figs = figures(c)
    for f in figs:
        (out_dir / "figures" / f"{f['name']}.png").write_bytes(f["png"])
    template = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                           autoescape=select_autoescape(["html", "j2"])).get_template("compare.html.j2")
    rows = [{"m": m, "before": _fmt(m, m.before_mean), "after": _fmt(m, m.after_mean),
             "interval": _interval_text(m), "label": METRICS[m.kind][1]} for m in c.metrics]
    page = template.render(c=c, rows=rows, figures=figs, counts=c.counts(), summary=text_summary(c),
                           generated=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    path = out_dir / "compare.html"
    path.write_text(page, encoding="utf-8")
    return path


def run(before: Path, after: Path, study: str | None = None, fail_if_slower: list[str] | None = None,
        out_dir: Path | None = None, html: bool = True, gate_points: list[str] | None = None,
        min_points: int = 1, max_extra_rounds: int | None = None, rerun_before: bool = False,
        note=None) -> tuple[Comparison, dict[str, Path]]:
    """Everything `nvmflab compare` does: load, compare (with `max_extra_rounds`, re-running the gate's
    inconclusive points first: rerun.until_decided), write compare.json (+ compare.html)."""
    gate = parse_gate(fail_if_slower)
    conditions = gating.parse_points(gate_points)
    if (conditions or min_points != 1) and not gate:
        raise GateError("--gate-point and --gate-min-points choose what --fail-if-slower gates; "
                        "give --fail-if-slower too")
    if min_points < 1:
        raise GateError(f"--gate-min-points {min_points}: give at least 1")
    if max_extra_rounds is not None or rerun_before:
        if not gate:
            raise GateError("--until-decided re-runs the points the gate cannot decide; give --fail-if-slower too")
        if max_extra_rounds is None:
            raise GateError("--rerun-before chooses a side --until-decided re-runs; give --until-decided too")
        if not 1 <= max_extra_rounds <= 100:
            raise GateError(f"--max-extra-rounds {max_extra_rounds}: give 1 to 100")
        from .rerun import until_decided

        c = until_decided(Path(before), Path(after), study, gate, conditions, min_points, max_extra_rounds,
                          rerun_before, note or (lambda line: None))
        return c, (write(c, Path(out_dir), html) if out_dir is not None else {})
    c = compare(load_side(before, study), load_side(after, study), gate, conditions, min_points)
    return c, (write(c, Path(out_dir), html) if out_dir is not None else {})


def write(c: Comparison, out_dir: Path, html: bool = True) -> dict[str, Path]:
    """compare.json (+ compare.html and its figures) in out_dir; a failure is a CompareError naming it."""
    written: dict[str, Path] = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "compare.json"
        path.write_text(json.dumps(c.as_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        written["json"] = path
        if html:
            written["html"] = write_html(c, out_dir)
    except OSError as error:
        raise CompareError(f"{out_dir}: cannot write the comparison ({error.strerror or error})") from None
    return written
