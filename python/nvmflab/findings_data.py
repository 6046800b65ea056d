"""Findings as data: every finding of the report with its study, metric, values, interval, decision
and the points it came from (issue 24 item 2).

A `Finding` is a `str` (its sentence, so the analyses, the HTML template and every test that reads a
finding as text keep working) that also carries the numbers behind it. The report turns each study's
findings into `Finding`s once; the HTML page renders them and `findings.json` is written from the
very same objects (`document()`), so the two cannot disagree.

Where the numbers come from: the comparisons the analyses make go through
`analysis.common.Difference` (Welch's interval of a difference, Holm where a family is corrected).
While a study is analysed, `recording()` collects every Difference whose text or interval was
written (`note()`, called by `Difference.text` / `Difference.interval`), with the source the
comparison was made from (metric, per-repeat values or the aggregate rows, hence the points). A
finding's sentence that contains a noted interval is a *comparison* finding with that evidence; a
finding without one (a plateau, a missing leg, a noise note) is a *statement*, whose points are the
study's usable points.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from .analysis.recorded import DESCRIPTIVE, note, recording  # noqa: F401  (note, recording: this module's API)
from .analysis.stats import study_rows, usable

FORMAT = "nvmflab-findings/1"
FILE_NAME = "findings.json"

def _num(value: Any) -> float | int | None:
    """A JSON-safe number: None for NaN, missing or non-numeric; ±inf kept as None too."""
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(f) or math.isinf(f):
        return None
    return int(f) if isinstance(value, (int,)) and not isinstance(value, bool) else f


def _plain(value: Any) -> Any:
    """Knob values as JSON scalars (numpy types, NaN → None)."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def decision_of(d: Any) -> str:
    """The decision a Difference stands for, in the words the findings use."""
    if d is None or math.isnan(getattr(d, "diff", math.nan)):
        return "no difference could be formed"
    if not d.decidable:
        return "cannot decide"
    if d.clear:
        return "clear increase" if d.diff > 0 else "clear decrease"
    if d.lost_to_holm:
        return "not clear after Holm"
    return "no clear difference"


def _points_of_frame(frame: Any) -> list[str]:
    if isinstance(frame, pd.DataFrame) and "point_key" in frame:
        return sorted({str(k) for k in frame["point_key"].dropna()})
    return []


def _points_of_row(row: Any, metric: str | None, rows: pd.DataFrame) -> list[str]:
    """The usable points of the study whose knob columns equal those of an aggregate() row."""
    if row is None or rows.empty or "point_key" not in rows:
        return []
    items = row.items() if hasattr(row, "items") else []
    mask = pd.Series(True, index=rows.index)
    used = 0
    for column, value in items:
        if column not in rows.columns or column.endswith(("_mean", "_std", "_n", "_ci95")):
            continue
        if metric and column.startswith(metric):
            continue
        col = rows[column]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            mask &= col.isna()
        else:
            mask &= col == value
        used += 1
    if not used:
        return []
    return sorted({str(k) for k in rows.loc[mask, "point_key"].dropna()})


def _side_of_row(row: Any, metric: str | None) -> dict:
    if row is None or not metric:
        return {}
    get = row.get if hasattr(row, "get") else (lambda k, default=None: default)
    knobs = {str(k): _plain(v) for k, v in (row.items() if hasattr(row, "items") else [])
             if not str(k).endswith(("_mean", "_std", "_n", "_ci95"))}
    return {"mean": _num(get(f"{metric}_mean", None)), "std": _num(get(f"{metric}_std", None)),
            "n": _num(get(f"{metric}_n", None)), "knobs": knobs}


def _side_of_values(values: Iterable[float] | None) -> dict:
    data = [float(v) for v in (values or []) if _num(v) is not None]
    n = len(data)
    mean = sum(data) / n if n else None
    return {"repeats": data, "mean": mean, "n": n}


def evidence(d: Any, text: str, rows: pd.DataFrame) -> dict:
    """One comparison behind a finding: metric, both sides' values, the interval, the decision and
    the points (point keys) of each side."""
    source = getattr(d, "source", None) or {}
    metric = source.get("metric")
    a: dict = {}
    b: dict = {}
    if "a" in source or "b" in source:
        a, b = _side_of_values(source.get("a")), _side_of_values(source.get("b"))
    if "rows" in source:
        ra, rb = source["rows"]
        a.update(_side_of_row(ra, metric))
        b.update(_side_of_row(rb, metric))
        a["points"] = _points_of_row(ra, metric, rows)
        b["points"] = _points_of_row(rb, metric, rows)
    if "frames" in source:
        fa, fb = source["frames"]
        a["points"], b["points"] = _points_of_frame(fa), _points_of_frame(fb)
    terms = []
    for coefficient, row in source.get("terms", []):
        side = _side_of_row(row, metric)
        side["coefficient"] = _num(coefficient)
        side["points"] = _points_of_row(row, metric, rows)
        terms.append(side)
    diff, half = _num(getattr(d, "diff", None)), _num(getattr(d, "half", None))
    detectable = getattr(d, "detectable", None)
    interval = None
    if diff is not None and half is not None:
        interval = {"difference": diff, "low": diff - half, "high": diff + half, "confidence": 0.95}
    out = {
        "metric": metric,
        "text": text,
        "difference": diff,
        "interval": interval,
        "p": _num(getattr(d, "p", None)),
        "holm_family": int(getattr(d, "family", 1) or 1),
        "decision": decision_of(d),
        # the smallest |difference| this comparison would have found with 80 % power (common.POWER)
        "detectable": _num(detectable),
        "why_undecided": getattr(d, "why_undecided", "") or None,
        "n": _num(getattr(d, "n", None)),
        "a": a, "b": b,
    }
    if terms:
        out["terms"] = terms
    return out


class Finding(str):
    """A finding's sentence (str) with its data: `study`, `kind` ('comparison' or 'statement'),
    `evidence` (one dict per comparison behind it) and `points` (point keys it came from)."""

    study: str
    kind: str
    evidence: list[dict]
    points: list[str]

    def __new__(cls, text: str, study: str, evidence: list[dict] | None = None,
                points: list[str] | None = None, decided: bool = False) -> "Finding":
        obj = super().__new__(cls, str(text))
        obj.study = study
        obj.evidence = list(evidence or [])
        obj.kind = "comparison" if obj.evidence else "statement"
        obj.points = sorted(set(points or []))
        # a statement that an analysis decided by intervals of its own (not a two-sample Difference),
        # e.g. where a gap closes: the summary lists it with the decided findings
        obj.decided = decided and not obj.evidence
        return obj

    @property
    def text(self) -> str:
        return str.__str__(self)

    @property
    def metric(self) -> str | None:
        return next((e["metric"] for e in self.evidence if e.get("metric")), None)

    @property
    def descriptive(self) -> bool:
        """The analysis marked the sentence as passing no test (common.descriptive)."""
        return DESCRIPTIVE in self.text

    @property
    def is_decided(self) -> bool:
        """What the summary lists as decided and findings.json marks `"decided": true`: a clear
        comparison behind the sentence, or a statement the analysis decided by a test of its own;
        never a descriptive one."""
        if self.descriptive:
            return False
        return self.decided or any(e["decision"] in CLEAR for e in self.evidence)

    @property
    def is_undecided(self) -> bool:
        """A test was tried and decided nothing: comparisons none of which is clear, or a sentence
        that says it cannot decide or tell."""
        if self.is_decided or self.descriptive:
            return False
        return bool(self.evidence) or any(m in self.text for m in UNDECIDED_WORDS)

    @property
    def decision(self) -> str:
        if self.descriptive:
            return "descriptive"
        if not self.evidence:
            return "decided statement" if self.decided else "statement"
        clear = next((e["decision"] for e in self.evidence if e["decision"] in CLEAR), None)
        return clear or self.evidence[0]["decision"]

    def as_dict(self) -> dict:
        first = self.evidence[0] if self.evidence else {}
        return {
            "study": self.study,
            "text": self.text,
            "kind": self.kind,
            "metric": self.metric,
            "values": ({"a": first.get("a"), "b": first.get("b"), "terms": first.get("terms")}
                       if first else None),
            "interval": first.get("interval") if first else None,
            "decision": self.decision,
            "decided": self.is_decided,
            "descriptive": self.descriptive,
            "points": self.points,
            "points_scope": "comparison" if self.evidence else "study",
            "evidence": self.evidence,
        }


def structure(study: str, findings: Iterable[str], notes: list, measurements: pd.DataFrame) -> list[Finding]:
    """The study's finding sentences as Findings, each with the noted comparisons its text contains."""
    rows = usable(study_rows(measurements, study)) if not measurements.empty else measurements
    study_points = _points_of_frame(rows)
    out = []
    for text in findings:
        if isinstance(text, Finding) and text.study == study:
            out.append(text)
            continue
        found = []
        seen: set[int] = set()
        for d, written in notes:
            if written in text and id(d) not in seen:  # one evidence per comparison
                seen.add(id(d))
                found.append(evidence(d, written, rows))
        points: list[str] = []
        for e in found:
            for side in ("a", "b"):
                points += e.get(side, {}).get("points", []) or []
            for term in e.get("terms", []):
                points += term.get("points", []) or []
        if found and not points:
            points = study_points  # the comparison's rows could not be traced: the study's points
        out.append(Finding(text, study, found, points if found else study_points))
    return out


def document(studies: Iterable[Any], source: str = "") -> dict:
    """The findings JSON document of the report's studies (the objects the HTML page rendered)."""
    findings = []
    for study in studies:
        result = study["result"] if isinstance(study, dict) else study
        for f in result.findings:
            f = f if isinstance(f, Finding) else Finding(f, result.study)
            findings.append(f.as_dict())
    return {"format": FORMAT, "source": source,
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "findings": findings}


def write(doc: dict, path: Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    return path


def read(path: Path) -> list[dict]:
    """The findings of a findings.json (or of RESULTS/report/findings.json given a results dir)."""
    path = Path(path)
    if path.is_dir():
        candidate = path / FILE_NAME
        path = candidate if candidate.exists() else path / "report" / FILE_NAME
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not an nvmflab findings file (format {doc.get('format')!r})")
    return doc["findings"]


CLEAR = ("clear increase", "clear decrease")
UNDECIDED = ("cannot decide", "no difference could be formed")
# How a sentence that tried a test and decided nothing says so (common.stated / common.claim).
UNDECIDED_WORDS = ("cannot decide", "Cannot tell whether", "No clear difference", "no clear difference",
                   "no clear best", "no clear winner")


def summary(studies: Iterable[Any]) -> dict:
    """The report's opening page: per study, what was decided (a clear difference, a pick or a
    recommendation chosen from the measurements), each with the anchor of its finding, then what
    could not be decided, why, and the smallest effect it could have seen. A recommendation that
    keeps the default because nothing was decided is listed as undecided. `decided` holds exactly
    the findings that findings.json marks `"decided": true` (plus chosen recommendations)."""
    decided, undecided = [], []
    names, descriptive = [], 0
    for study in studies:
        result = study["result"] if isinstance(study, dict) else study
        names.append(result.study)
        for index, f in enumerate(result.findings, start=1):
            f = f if isinstance(f, Finding) else Finding(f, result.study)
            item = {"study": result.study, "anchor": f"{result.study}-f{index}", "text": f.text}
            descriptive += f.descriptive
            if f.is_decided:
                decided.append(item)
            elif f.is_undecided:
                undecided.append(item | {"why": _why(f), "detectable": _detectable(f)})
        recommendations = getattr(result, "recommendations", None)
        if recommendations is None or recommendations.empty or "decision" not in recommendations:
            continue
        for _, row in recommendations.iterrows():
            decision = str(row.get("decision", ""))
            what = " = ".join(str(row[c]) for c in ("knob", "suggested value") if c in row and pd.notna(row[c]))
            item = {"study": result.study, "anchor": f"{result.study}-recommendations",
                    "text": f"{what}: {decision}" if what else decision}
            if decision.startswith("chosen"):
                decided.append(item)
            else:  # "keep the default" because nothing was decided, redundant, cannot decide
                evidence = row.get("evidence") if "evidence" in row else None
                why = str(evidence) if evidence is not None and pd.notna(evidence) and str(evidence) else decision
                undecided.append(item | {"why": why})
    unsettled = {item["study"] for item in undecided}
    return {"decided": decided, "undecided": undecided, "noise": None, "headline": "",
            "settled": [n for n in names if n not in unsettled], "descriptive": descriptive}


# A number that a finding states with its unit: digits followed by %, ×, a time, a rate or a size.
_MEASURED = re.compile(r"\d(?:[\d,.]*\d)?\s*(?:%|×|[µmn]s\b|[KM]?IOPS\b|[KMG]B/s|[GM]bit/s|[KMG]iB\b|B\b|"
                       r"bytes\b|W\b|J\b)")


# A pick among several ("lowest", "highest", "best", "matched", "from SIZE on", "cores to saturate").
_PICK = re.compile(r"\b(?:lowest|highest|best|matched|cores to saturate)\b|\bfrom (?:QD)?\d+\w* on\b")

# A bare comparison, with or without a number: a difference ("faster", "lower", "worse") or its
# absence ("the same", "no difference") claimed in words.
_COMPARATIVE = re.compile(r"\b(?:faster|slower|higher|lower|better|worse|same|no difference)\b", re.I)


def untested(f: Finding) -> bool:
    """The gate of issue 37 item 1: True for a finding that states a measured number (digits with a
    unit, %, ×), a pick among several or a bare comparison ("faster", "higher", "worse", "the
    same", "no difference") but carries no decision: no comparison behind it, no decision of its
    own, no words saying that nothing could be decided, and no descriptive marker."""
    if f.descriptive or f.is_decided or f.evidence:
        return False
    if any(word in f.text for word in UNDECIDED_WORDS):
        return False
    return bool(_MEASURED.search(f.text) or _PICK.search(f.text) or _COMPARATIVE.search(f.text))


def noise_sentence(measurements: pd.DataFrame, limit_pct: float = 10.0) -> str | None:
    """A sentence for the summary when other processes took a large share of the experiment's
    cores during the points (median noise_pct above `limit_pct`): intervals widen and fewer
    differences can be decided. None otherwise."""
    if measurements.empty or "noise_pct" not in measurements:
        return None
    values = pd.to_numeric(measurements.drop_duplicates("point_key")["noise_pct"] if "point_key" in measurements
                           else measurements["noise_pct"], errors="coerce").dropna()
    if values.empty or float(values.median()) <= limit_pct:
        return None
    return (f"Other processes (or steal) took a median {values.median():.0f} % of the experiment's cores during the "
            f"points (up to {values.max():.0f} %, noise_pct): the repeats spread wider and fewer differences can "
            "be decided than on a quiet machine.")


def _why(f: Finding) -> str:
    """Why a finding could not decide: its comparisons' own reasons, else its sentence's."""
    for e in f.evidence:
        if e.get("why_undecided"):
            return e["why_undecided"]
    for e in f.evidence:
        if e.get("interval") is None:
            return "no interval: fewer than two usable repeats on a side, or repeats without spread"
    if f.evidence and all(e["decision"] == "not clear after Holm" for e in f.evidence):
        return f"the interval excludes zero alone, not after Holm over {f.evidence[0]['holm_family']} comparisons"
    if f.evidence:
        return "every 95 % interval includes zero"
    text = f.text
    for marker in ("cannot decide (", "Cannot tell whether "):
        start = text.find(marker)
        if start >= 0:  # the analysis said why in its own words: up to the matching parenthesis
            return _bracketed(text, text.find("(", start)) or "the finding says"
    return "the finding says"


def _bracketed(text: str, start: int) -> str:
    """The text inside the parenthesis that opens at `start`, nested ones included."""
    if start < 0:
        return ""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    return text[start + 1:]


_DETECTABLE = re.compile(r"an effect larger than ±.*? would have been seen with \d+ % power at these [^;)]*")


def _detectable(f: Finding) -> str | None:
    """The smallest effect the finding could have seen, in its own words ('an effect larger than
    ±3.5 µs (±32 % of 11 µs) would have been seen …'), None where it states none."""
    match = _DETECTABLE.search(f.text)
    return match.group(0) if match else None
