"""One self-contained HTML page from a results directory: figures, tables, findings, provenance.

`write_report(results_dir, out_dir)` loads the store, runs the analysis of every study present
(the generic sweep analysis for any name that is not a built-in study), and writes
out_dir/report.html (figures embedded as base64 PNG, so the page travels alone) plus each figure
as out_dir/figures/<name>.png. Absent studies or legs are stated on the page; an empty
or missing database gives a page that says there are no results.
"""

from __future__ import annotations

import base64
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .analysis import sweep
from .analysis.common import descriptive, excluded_points, study_rows
from .analysis.left_out import mark_figures
from .analysis.cores_used import cores_note
from .analysis.result import StudyResult
from .analysis.stability import stability_note
from .analysis.stats import usable
from .analysis.text import size
from .analysis.timeline import timeline_figures
from . import findings_data, probes
from .names import STUDY_NAMES, module_name

# Each study's analysis.NAME.analyze (names.py lists the studies).
ANALYZERS: dict[str, Callable[[pd.DataFrame, pd.DataFrame], StudyResult]] = {
    name: importlib.import_module(f"{__package__}.analysis.{module_name(name)}").analyze for name in STUDY_NAMES}
STORE_FILE = "results.sqlite"
TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class RenderedFigure:
    name: str
    caption: str
    png_base64: str
    path: str


def load(results_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """measurements() and runs() of the store; empty frames when there is no database."""
    if not (Path(results_dir) / STORE_FILE).exists():
        return pd.DataFrame(), pd.DataFrame()
    from .store import ResultsStore

    with ResultsStore(results_dir, read_only=True) as store:  # a report writes nothing into the store
        return store.measurements(), store.runs()


_LABEL_BOOL = re.compile(r"=(True|False)\b")
_LABEL_BS = re.compile(r"\b(bs=)(\d+)\b")


def _readable(value: object, column: str = "") -> object:
    """A cell or environment value as a reader reads it: yes/no for booleans, byte counts with
    their binary unit, block sizes as fio writes them (issue 37 item 6)."""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, str):  # point labels such as 'bs=131072, net_shares_storage_core=True'
        value = _LABEL_BOOL.sub(lambda m: "=" + ("yes" if m.group(1) == "True" else "no"), value)
        return _LABEL_BS.sub(lambda m: m.group(1) + size(float(m.group(2))), value)
    name = str(column).lower()
    if isinstance(value, (int, float, np.integer, np.floating)) and not pd.isna(value) and value == int(value):
        if name in ("bs", "block size", "block_size"):
            return size(float(value))
        if name.endswith("bytes") and not name.startswith("bw"):
            return _binary(float(value))
    return value


def _binary(count: float) -> str:
    """'16.0 GiB', '512 B': a byte count in its largest binary unit."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(count) >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count:.0f} B"


def _html_table(frame: pd.DataFrame) -> str:
    readable = frame.copy()
    for column in readable.columns:
        named = str(column).lower()
        if (not pd.api.types.is_numeric_dtype(readable[column]) or pd.api.types.is_bool_dtype(readable[column])
                or named in ("bs", "block size", "block_size") or named.endswith("bytes")):
            readable[column] = readable[column].map(lambda v, c=column: _readable(v, c)).astype(object)
    return readable.to_html(index=False, na_rep="—", border=0, classes="data", escape=True)


def _save(result: StudyResult, figures_dir: Path) -> list[RenderedFigure]:
    rendered = []
    for figure in result.figures:
        buffer = BytesIO()
        figure.figure.savefig(buffer, format="png", dpi=110)
        png = buffer.getvalue()
        path = figures_dir / f"{figure.name}.png"
        path.write_bytes(png)
        rendered.append(RenderedFigure(figure.name, figure.caption,
                                       base64.b64encode(png).decode("ascii"),
                                       f"figures/{path.name}"))
    return rendered


def _text(value: object) -> str | None:
    """A text column's value, None where the database has NULL (pandas hands that over as NaN)."""
    return None if value is None or pd.isna(value) else str(value)


def _runs(runs: pd.DataFrame) -> list[dict]:
    out = []
    for _, run in runs.iterrows():
        env_json = _text(run.get("env_json")) or "{}"
        try:
            env = json.loads(env_json)
        except json.JSONDecodeError:
            env = {"env_json": env_json}
        out.append({
            "run_id": run["run_id"], "study": run["study"], "git_rev": _text(run.get("git_rev")),
            "started_at": _text(run.get("started_at")),
            "finished_at": _text(run.get("finished_at")) or "not finished (interrupted or running)",
            "env": {k: (json.dumps(v, sort_keys=True, ensure_ascii=False) if isinstance(v, (dict, list))
                        else _readable(v, k))
                    for k, v in sorted(env.items())},
            "spec_toml": _text(run.get("spec_toml")) or "",
        })
    return out


def _add_timelines(result: StudyResult, measurements: pd.DataFrame) -> None:
    """Latency over time for the study's measurements whose latency changed during the run."""
    figures, finding = timeline_figures(result.study, usable(study_rows(measurements, result.study)))
    result.figures += figures
    if finding:
        result.findings.append(finding)


NOISY_COLUMNS = ["run_id", "leg", "point_id", "repeat", "role", "noise_pct", "outside_cpu_s", "steal_s",
                 "throttle_events", "cpu_governor", "noise_tries"]


def noisy_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Usable rows whose point stayed noisy after its re-runs (sysstat.py): kept, but listed."""
    if rows.empty or "noisy" not in rows:
        return rows.iloc[0:0]
    mine = usable(rows)
    mine = mine[mine["noisy"].map(lambda v: v is True or v == 1)]
    return mine[[c for c in NOISY_COLUMNS if c in mine.columns]].reset_index(drop=True)


def _add_noise(result: StudyResult, noisy: pd.DataFrame) -> None:
    if noisy.empty:
        return
    points = noisy["point_id"].nunique()
    worst = noisy["noise_pct"].max()
    result.findings.append(descriptive(
        f"{points} point(s) stayed noisy after their re-runs (other processes or steal took up to {worst:.1f} % "
        "of the cores the experiment ran on, or the CPU throttled): they are kept in the numbers above and "
        "listed under \"noisy points\"; read their differences with care."))


def _machine(runs: pd.DataFrame) -> str:
    """'lab (Synthetic CPU, 4 cores, kernel 6.1.0)' from the runs' recorded environment."""
    seen = []
    for _, run in runs.iterrows():
        try:
            env = json.loads(_text(run.get("env_json")) or "{}")
        except json.JSONDecodeError:
            continue
        if not isinstance(env, dict) or not env.get("hostname"):
            continue
        detail = ", ".join(x for x in (env.get("cpu_model"), f"{env['cores']} cores" if env.get("cores") else None,
                                       f"kernel {env['kernel']}" if env.get("kernel") else None) if x)
        text = f"{env['hostname']} ({detail})" if detail else str(env["hostname"])
        if text not in seen:
            seen.append(text)
    return " and ".join(seen) if seen else "a machine whose environment was not recorded"


def _stacks(measurements: pd.DataFrame) -> str:
    """'target stacks ours, spdk; host stacks ours' of the usable rows."""
    rows = usable(measurements)
    parts = []
    for column, side in (("target_stack", "target"), ("host_stack", "host")):
        if column in rows and rows[column].notna().any():
            parts.append(f"{side} stack(s) {', '.join(sorted(str(v) for v in rows[column].dropna().unique()))}")
    return "; ".join(parts) if parts else "stacks not recorded"


def _skipped(measurements: pd.DataFrame) -> str:
    """The legs skipped, per study with its first reason shortened: 'saturation: initiator, target
    (too few cores to isolate the initiator core: the leg needs at least …)'."""
    if measurements.empty or "status" not in measurements:
        return ""
    skipped = measurements[measurements["status"] == "skipped"]
    items = []
    for study, rows in skipped.groupby("study", sort=True):
        legs = list(dict.fromkeys(str(v) for v in rows["leg"]))
        reason = rows["error"].dropna()
        why = f" ({_shortened(str(reason.iloc[0]))})" if len(reason) else ""
        shown = ", ".join(legs[:4]) + (f" and {len(legs) - 4} more" if len(legs) > 4 else "")
        items.append(f"{study}: {shown}{why}")
    return "; ".join(items)


def _shortened(text: str, limit: int = 70) -> str:
    """`text` cut at a word boundary before `limit` characters, with ' …' where it was cut."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


def _busy(measurements: pd.DataFrame) -> str:
    """How much of the experiment's cores other processes took, from noise_pct."""
    if measurements.empty or "noise_pct" not in measurements:
        return "how busy the machine was is not recorded"
    points = measurements.drop_duplicates("point_key") if "point_key" in measurements else measurements
    noise = pd.to_numeric(points["noise_pct"], errors="coerce").dropna()
    if noise.empty:
        return "how busy the machine was is not recorded"
    return (f"other processes (or steal) took a median {noise.median():.0f} % of the experiment's cores during "
            f"the points (up to {noise.max():.0f} %)")


FUNCTIONAL = "FUNCTIONAL"  # a spec description that starts so declares an emulated run (tests/bed's specs)


def functional_runs(runs: pd.DataFrame) -> list[str]:
    """The spec descriptions of runs declared functional: their timings come from emulated machines
    (docs/topologies.md, the two-guest bed), and the report says so above everything else."""
    found = []
    for _, run in runs.iterrows():
        try:
            env = json.loads(_text(run.get("env_json")) or "{}")
        except json.JSONDecodeError:
            continue
        spec = env.get("spec_effective") if isinstance(env, dict) else None
        description = str(spec.get("description") or "") if isinstance(spec, dict) else ""
        if description.upper().startswith(FUNCTIONAL) and description not in found:
            found.append(description)
    return found


def headline(measurements: pd.DataFrame, runs: pd.DataFrame) -> str:
    """What ran where, in one or two sentences: the machine, the stacks run and the legs skipped,
    and how busy the machine was (issue 37 item 5)."""
    skipped = _skipped(measurements)
    return (f"Measured on {_machine(runs)} with {_stacks(measurements)}"
            + (f"; skipped: {skipped}" if skipped else "; nothing skipped")
            + f". During the run {_busy(measurements)}.")


def build_report(measurements: pd.DataFrame, runs: pd.DataFrame, out_dir: Path,
                 source: str = "") -> Path:
    """Analyse the frames and write report.html and figures/ into out_dir; returns the HTML path."""
    out_dir = Path(out_dir)
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    measured = set(measurements["study"].unique()) if not measurements.empty else set()
    recorded = set(runs["study"].unique()) if not runs.empty else set()
    studies = []
    for name in [n for n in ANALYZERS if n in measured] + sorted(measured - set(ANALYZERS)):
        with findings_data.recording() as notes:
            result = (ANALYZERS[name](measurements, runs) if name in ANALYZERS
                      else sweep.analyze(measurements, runs, name))
        _add_timelines(result, measurements)
        probes.add_to_report(result, study_rows(measurements, name))  # energy, network counters (issue 24)
        noisy = noisy_rows(study_rows(measurements, name))
        _add_noise(result, noisy)
        if result.excluded is None:
            result.excluded = excluded_points(study_rows(measurements, name))
        mark_figures(result)  # every figure says which of its study's points failed (issue 37 item 7)
        used = cores_note(usable(study_rows(measurements, name)))  # issue 22 item 8: cores as they were
        if used:
            result.findings.append(used)
        note = stability_note(measurements, runs, name)
        if note:
            result.findings.append(note)
        # Findings as data: the page renders these objects and findings.json is written from them.
        result.findings = findings_data.structure(name, result.findings, notes, measurements)
        studies.append({
            "result": result,
            "figures": _save(result, figures_dir),
            "tables": [(t.title, _html_table(t.frame), t.caption) for t in result.tables],
            "recommendations": (None if result.recommendations is None
                                else _html_table(result.recommendations)),
            "excluded": (None if result.excluded is None or result.excluded.empty
                         else _html_table(result.excluded)),
            "excluded_count": 0 if result.excluded is None else len(result.excluded),
            "noisy": None if noisy.empty else _html_table(noisy),
            "noisy_count": len(noisy),
        })
    absent = [name for name in ANALYZERS if name not in measured] if measured & set(ANALYZERS) else []
    unmeasured = sorted(recorded - measured - set(ANALYZERS))
    summary = findings_data.summary(studies)
    summary["noise"] = findings_data.noise_sentence(measurements)
    summary["headline"] = headline(measurements, runs)
    template = Environment(loader=FileSystemLoader(TEMPLATES),
                           autoescape=select_autoescape(["html", "j2"])).get_template("report.html.j2")
    page = template.render(
        studies=studies, summary=summary, absent=absent, unmeasured=unmeasured, runs=_runs(runs),
        functional=functional_runs(runs),
        measurement_count=len(measurements), source=source,
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    findings_data.write(findings_data.document(studies, source), out_dir / findings_data.FILE_NAME)
    return path


def write_report(results_dir: Path, out_dir: Path) -> Path:
    """Load the results store in results_dir and write out_dir/report.html (returned)."""
    measurements, runs = load(Path(results_dir))
    return build_report(measurements, runs, Path(out_dir), source=str(results_dir))
