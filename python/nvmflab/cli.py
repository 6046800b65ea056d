"""`nvmflab`: run studies and sweeps, inspect and export results, write reports, describe the machine.

Bad input ends with one line on stderr and a non-zero exit, never a traceback. `study` and `run`
print the report's path as their last line.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional  # List, Optional: Typer reads the annotations by name

import typer
from rich.console import Console
from rich.table import Table

from . import exits
from .names import IN_ALL, STACK_NAMES, STUDY_NAMES, module_name
from .spec import Spec, SpecError
from .study_spec import load_study_spec

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="NVMe-over-Fabrics performance laboratory.")
results_app = typer.Typer(no_args_is_help=True, help="Inspect and export a results directory.")
app.add_typer(results_app, name="results")
out = Console(width=None if sys.stdout.isatty() else 200)  # pipes get whole rows
err = Console(stderr=True, soft_wrap=True)

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"


# The choices of `nvmflab study NAME` and `--stack NAME`, from names.py (members are the names
# with `-` as `_`: StudyName.busy_poll is "busy-poll").
StudyName = Enum("StudyName", {module_name(n): n for n in (*STUDY_NAMES, "all")}, type=str)


class Format(str, Enum):
    csv = "csv"
    parquet = "parquet"


def fail(message: str, code: int = 2) -> None:
    err.print(f"nvmflab: error: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


StackOption = Enum("StackOption", {module_name(n): n for n in STACK_NAMES}, type=str)


STACK_HELP = (f"stack for both target and host: {', '.join(STACK_NAMES[:-1])} or {STACK_NAMES[-1]} "
              "(overrides the spec's \\[stack])")
STACK_OPT = typer.Option(None, "--stack", help=STACK_HELP)
TARGET_STACK_OPT = typer.Option(None, "--target-stack", help="stack serving the target (after --stack)")
HOST_STACK_OPT = typer.Option(None, "--host-stack", help="stack driving the load (after --stack)")
PLAN_OPT = typer.Option(False, "--plan", help="print every command each host would run; run nothing")
KNOBS_FROM_OPT = typer.Option(None, "--knobs-from", help="results directory whose polling study chose the "
                              "knobs to run overhead, saturation and interference with (thesis table 4.2)")
FORCE_MIX_OPT = typer.Option(False, "--force-mix", help="store points of a spec that differs from the one that "
                             "filled --results beside its points (default: refused, saying what differs)")
FORCE_OPT = typer.Option(False, "--force", help="overwrite a file nvmflab did not write")
ORDER_SEED_OPT = typer.Option(None, "--order-seed", min=0, max=2**63 - 1,
                              help="seed of the order of legs and points within each round (default: the spec's "
                                   "order_seed, else a new one; every run records its own)")


@app.command()
def study(name: StudyName = typer.Argument(..., help=f"a study of studies/ ({', '.join(STUDY_NAMES)}) or all"),
          spec: Optional[Path] = typer.Option(None, "--spec", help="spec file (default: studies/NAME.toml)"),
          quick: bool = typer.Option(False, "--quick", help="apply the spec's \\[quick] overrides (about a minute)"),
          results: Path = typer.Option(Path("results"), "--results", help="results directory (resumable)"),
          stack: Optional[StackOption] = STACK_OPT, target_stack: Optional[StackOption] = TARGET_STACK_OPT,
          host_stack: Optional[StackOption] = HOST_STACK_OPT, plan: bool = PLAN_OPT,
          knobs_from: Optional[Path] = KNOBS_FROM_OPT, force_mix: bool = FORCE_MIX_OPT,
          order_seed: Optional[int] = ORDER_SEED_OPT) -> None:
    """Run a built-in study (STUDIES.md) and write its report. Exit code 1 when a point failed,
    2 when nothing could run."""
    names = list(IN_ALL) if name is StudyName.all else [name.value]
    if spec is not None and len(names) > 1:
        fail("--spec names one study's spec; run the studies one by one to give each its own")
    _check_knobs_from(knobs_from)
    specs = []
    for study_name in names:
        path = spec or STUDIES_DIR / f"{study_name}.toml"
        loaded = _with_order_seed(_with_stacks(_load(path, quick, study_name), stack, target_stack, host_stack),
                                  order_seed)
        specs.append((study_name, path, loaded))
    summaries = []
    for study_name, path, loaded in specs:
        # `study all` runs the later studies with the configuration its polling study chose.
        source = knobs_from or (results if "polling" in names and len(names) > 1 and not plan else None)
        loaded = _carry_over(loaded, study_name, source)
        summaries.append(_execute(loaded, path, study_name, results, quick, plan, force_mix))
    if not plan:
        _report(results)
    _exit(summaries)


@app.command()
def run(spec: Path = typer.Argument(..., help="spec file: any sweep"),
        quick: bool = typer.Option(False, "--quick", help="apply the spec's \\[quick] overrides"),
        results: Path = typer.Option(Path("results"), "--results", help="results directory (resumable)"),
        stack: Optional[StackOption] = STACK_OPT, target_stack: Optional[StackOption] = TARGET_STACK_OPT,
        host_stack: Optional[StackOption] = HOST_STACK_OPT, plan: bool = PLAN_OPT,
        knobs_from: Optional[Path] = KNOBS_FROM_OPT, force_mix: bool = FORCE_MIX_OPT,
        order_seed: Optional[int] = ORDER_SEED_OPT) -> None:
    """Run any spec: its study when it names one, else the cross product of its sweep table. Exit
    code 1 when a point failed, 2 when nothing could run."""
    _check_knobs_from(knobs_from)
    loaded = _with_order_seed(_with_stacks(_load(spec, quick), stack, target_stack, host_stack), order_seed)
    loaded = _carry_over(loaded, loaded.study or "", knobs_from)
    summary = _execute(loaded, spec, loaded.study or loaded.name, results, quick, plan, force_mix)
    if not plan:
        _report(results)
    _exit([summary])


@app.command()
def soak(minutes: float = typer.Option(2.0, "--minutes", help="how long (0.5 to 1440)"),
         workdir: Path = typer.Option(Path("results/soak"), "--workdir", help="files, logs and soak.json"),
         hosts: int = typer.Option(4, "--hosts", help="load generators, each its own workload (1 to 6)"),
         restart_every: float = typer.Option(30.0, "--restart-every", help="seconds between target restarts "
                                             "(first half only)"),
         hostile_per_s: float = typer.Option(4.0, "--hostile-per-s", help="hostile connections per second")) -> None:
    """Mixed verified load with target restarts and hostile connections; fails on any lost block,
    crash or growing memory (docs/reliability.md)."""
    from .soak import run_soak
    from .tools import ToolMissing

    if restart_every < 5 or not 0 < hostile_per_s <= 100:
        fail("--restart-every must be at least 5 s and --hostile-per-s between 0 and 100")
    try:
        result = run_soak(minutes, workdir, hosts, restart_every, hostile_per_s,
                          progress=lambda line: print(line, flush=True))
    except (ValueError, RuntimeError, ToolMissing) as err:
        fail(str(err))
    (workdir / "soak.json").write_text(json.dumps(result.to_json(), indent=1))
    for host in result.hosts:
        outages = host.get("outages") or []
        print(f"host {host['index']} {host['workload']}: {host['passes']} passes, {host['ios']} I/Os, "
              f"{host['verified_ios']} read back and checked, {host['retried_ios']} retried, {len(outages)} "
              f"outage(s)"
              + (f" — {host['error']}" if host.get("error") else ""))
    print(f"target restarts {result.restarts}, crashes {len(result.crashes)}, hostile connections "
          + ", ".join(f"{k} {v}" for k, v in result.hostile.items()))
    print(f"memory: {result.memory.get('detail')}")
    if result.failures:
        fail("soak failed: " + "; ".join(result.failures), exits.FAILED)  # measured, not bad input
    print(f"soak passed ({workdir / 'soak.json'})")


@app.command()
def report(results: Path = typer.Argument(..., help="results directory"),
           out_dir: Optional[Path] = typer.Option(None, "--out", help="report directory (default: RESULTS/report)"),
           force: bool = FORCE_OPT,
           as_json: bool = typer.Option(False, "--json", help="print every finding as JSON (always written to OUT/findings.json)")) -> None:
    """Write the report of a results directory (refuses to overwrite a report.html it did not write)."""
    _require_store(results).close()
    _report(results, out_dir, force, as_json)


@results_app.command("list")
def results_list(results: Path = typer.Argument(..., help="results directory")) -> None:
    """Runs and their point counts by status."""
    store = _require_store(results)
    runs, points = _read(results, store.runs), _read(results, store.points)
    table = Table("run", "study", "started", "finished", "ok", "failed", "invalid", "skipped")
    for row in runs.itertuples():
        mine = points[points["run_id"] == row.run_id]["status"].value_counts()
        finished = row.finished_at if isinstance(row.finished_at, str) else "(interrupted)"  # NULL reads as NaN
        table.add_row(str(row.run_id), _cell(row.study), _cell(row.started_at), finished,
                      *(str(mine.get(s, 0)) for s in ("ok", "failed", "invalid", "skipped")))
    _show(table)


@results_app.command("show")
def results_show(results: Path = typer.Argument(..., help="results directory"),
                 study_name: Optional[str] = typer.Option(None, "--study", help="only this study"),
                 leg: Optional[str] = typer.Option(None, "--leg", help="only this leg")) -> None:
    """The measurements, one line per point and role. A --study or --leg not stored there is refused,
    naming those that are."""
    store = _require_store(results)
    frame = _read(results, store.measurements)
    if study_name is not None:
        _check_filter(results, "study", study_name, frame["study"], "")
        frame = frame[frame["study"] == study_name]
    if leg is not None:
        _check_filter(results, "leg", leg, frame["leg"], f" of study {study_name}" if study_name is not None else "")
        frame = frame[frame["leg"] == leg]
    table = Table("study", "leg", "role", "rw", "bs", "iodepth", "numjobs", "repeat", "status", "iops",
                  "p99 µs", "error")
    for row in frame.itertuples():
        table.add_row(_cell(row.study), _cell(row.leg), _cell(row.role), _cell(row.rw), _cell(row.bs),
                      _cell(row.iodepth), _cell(row.numjobs), _cell(row.repeat), _cell(row.status),
                      _number(row.iops, 1, "{:,.0f}"), _number(row.lat_p99_ns, 1000, "{:.1f}"), _cell(row.error))
    _show(table, *(["(no points stored)"] if frame.empty else []))


def _check_filter(results: Path, what: str, wanted: str, stored, scope: str) -> None:
    """Exit 2 when `wanted` is not among the stored values, naming those that are."""
    have = sorted({str(v) for v in stored.dropna()})
    if wanted not in have:
        fail(f"{results}: no {what} {wanted!r}{scope} is stored here; "
             + (f"{'studies' if what == 'study' else what + 's'} stored: {', '.join(have)}" if have
                else "no points are stored"))


@results_app.command("export")
def results_export(results: Path = typer.Argument(..., help="results directory"),
                   out_arg: str = typer.Option(..., "--out", help="FILE.csv or FILE.parquet, or a directory "
                                               "(existing, ending in /, or a name without a suffix; made when "
                                               "missing) to write measurements.csv (or .parquet) into"),
                   fmt: Optional[Format] = typer.Option(None, "--format", help="csv or parquet (default: from --out; "
                                                        "csv into a directory)"),
                   force: bool = FORCE_OPT) -> None:
    """Export measurements() as CSV or Parquet (the format the file name says)."""
    store = _require_store(results)
    frame = _read(results, store.measurements)
    if not out_arg.strip():
        fail("--out is empty: give a file (.csv or .parquet) or a directory")
    out_file = Path(out_arg)
    if out_arg.endswith(os.sep) or out_file.is_dir() or not out_file.suffix:
        out_file = out_file / f"measurements.{fmt.value if fmt else 'csv'}"
    suffix = out_file.suffix.lower().lstrip(".")
    if suffix not in ("csv", "parquet"):
        fail(f"{out_file}: cannot tell the format from the name: name the file .csv or .parquet "
             "(those are the formats export writes)")
    if fmt is not None and fmt.value != suffix:
        fail(f"{out_file}: --format {fmt.value} but the file name says {suffix}; make them agree")
    chosen = suffix
    if out_file.exists() and not force and not _exported_by_us(out_file, chosen):
        fail(f"{out_file}: exists and was not written by `nvmflab results export`; give --force to overwrite it")
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        if chosen == "parquet":
            frame.astype({"invariant_ok": "boolean", "hdr_digest": "boolean", "data_digest": "boolean"}).to_parquet(out_file)
        else:
            frame.to_csv(out_file, index=False)
    except OSError as error:
        fail(_os_error(error, out_file))
    _print(f"{len(frame)} rows written to {out_file}")


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="print JSON"),
        topology: Optional[Path] = typer.Option(None, "--topology", help="an inventory, or a spec with an ssh "
                                                "[topology]: describe each of its hosts instead")) -> None:
    """Cores, CPU model, kernel, memory, the tools nvmflab can drive (with versions), the stacks this
    machine can run (ours, the kernel's, SPDK's and its build), TLS (userspace, kTLS), RDMA devices,
    and what will make results unreliable here."""
    from .env import collect

    if topology is not None:
        from .env import topology_report, topology_tables
        from .topology.base import HostError

        try:
            reports = topology_report(topology)
        except (HostError, SpecError) as error:
            fail(str(error))
        if as_json:
            _print(json.dumps(reports, indent=1))
        else:
            _show(*topology_tables(reports))
        return
    from .env import capabilities, capability_rows, reliability_warnings
    from .topology.local import LocalHost

    info = collect()
    can = capabilities(LocalHost())
    warnings = reliability_warnings()
    if as_json:
        _print(json.dumps(info | can | {"warnings": warnings}, indent=1))
        return
    table = Table("item", "value", show_header=False)
    table.add_row("cpu model", info["cpu_model"])
    table.add_row("cores", f"{info['cores']} (allowed: {','.join(map(str, info['cores_allowed']))})")
    table.add_row("kernel", info["kernel"])
    table.add_row("memory", f"{(info['memory_bytes'] or 0) / 2**30:.1f} GiB")
    table.add_row("git revision", info["git_rev"] or "(not a checkout)")
    for name, tool in info["tools"].items():
        table.add_row(name, f"{tool['version'] or '(no version)'}  {tool['path']}" if tool["path"] else "not found")
    for item, value in capability_rows(can):
        table.add_row(item, value)
    # what will make results here unreliable (sysstat.machine_warnings)
    _show(table, *(f"[yellow]warning:[/yellow] {warning}" for warning in warnings), *([] if warnings else [
        "No noise source found: governor, steal, throttling and other processes look quiet."]))


# -- helpers ---------------------------------------------------------------------------------

def _load(path: Path, quick: bool, study_name: Optional[str] = None) -> Spec:
    try:
        return load_study_spec(path, quick=quick, study=study_name)
    except SpecError as error:
        fail(str(error))


def _require_store(results: Path):
    from .store import ResultsStore, StoreError

    if not (results / ResultsStore.FILENAME).is_file():
        fail(f"{results}: no {ResultsStore.FILENAME} here (run `nvmflab study` or `nvmflab run` first)")
    try:
        return ResultsStore(results, read_only=True)  # every caller only reads
    except StoreError as error:
        fail(str(error))
    except OSError as error:
        fail(f"{results}: cannot open the results ({error})")


def _read(results: Path, reader):
    """A store query; a damaged database is named with its path instead of an internal error."""
    import sqlite3

    import pandas as pd

    try:
        return reader()
    except (sqlite3.Error, pd.errors.DatabaseError) as error:
        fail(f"{results / 'results.sqlite'}: the results database is damaged ({' '.join(str(error).split())})")


def _os_error(error: OSError, target: object, what: str = "cannot write") -> str:
    """`TARGET: cannot write (what the OS said: 'the file it said it of')` for a failed write."""
    said = error.strerror or " ".join(str(error).split()) or type(error).__name__
    if error.filename is not None and str(error.filename) != str(target):
        said += f": '{error.filename}'"
    return f"{target}: {what} ({said})"


def _stdout_failed(error: OSError) -> None:
    """A full disk behind stdout ends the command with a named error (exit 2); a reader that went
    away (`nvmflab results show | head`) took what it wanted, so that ends quietly with 141, as a
    shell tool killed by SIGPIPE does. stdout goes to /dev/null first, so the interpreter's own flush
    at exit does not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    if isinstance(error, BrokenPipeError):
        raise typer.Exit(exits.PIPE_CLOSED)
    fail(f"cannot write to stdout: {error.strerror or error}")


def _print(text: str, end: str = "\n") -> None:
    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()
    except OSError as error:
        _stdout_failed(error)


def _show(*renderables) -> None:
    """Rich output to stdout, with _print's handling of a failed write."""
    try:
        for renderable in renderables:
            out.print(renderable)
        out.file.flush()
    except OSError as error:
        _stdout_failed(error)


def _cell(value) -> str:
    """A table cell: empty for NULL/NaN, the text otherwise."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def _number(value, scale: float, form: str) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return "" if number != number else form.format(number / scale)


def _exported_by_us(path: Path, fmt: str) -> bool:
    """True when `path` holds an export of measurements() (its first columns are ours)."""
    from .store import FRAME_COLUMNS

    head = FRAME_COLUMNS[:5]
    try:
        if fmt == "csv":
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.readline().strip().split(",")[:5] == head
        import pyarrow.parquet as pq

        return pq.read_schema(path).names[:5] == head
    except Exception:  # unreadable or another format: not ours
        return False


def _check_knobs_from(knobs_from: Optional[Path]) -> None:
    """--knobs-from names a results directory that exists and holds a results database."""
    if knobs_from is None:
        return
    _require_store(knobs_from).close()


def _exit(summaries: list) -> None:
    """Exit 2 when nothing could run in any study, else 1 when a point failed, else 0 (a study of
    `study all` whose points were all skipped here is not a failure)."""
    summaries = [s for s in summaries if s is not None]  # --plan: nothing to judge
    if summaries and all(s.code == 2 for s in summaries):
        raise typer.Exit(2)
    if any(s.failed for s in summaries):
        raise typer.Exit(1)


def _with_stacks(spec: Spec, both: Optional[StackOption], target: Optional[StackOption],
                 host: Optional[StackOption]) -> Spec:
    """--stack sets both sides, then --target-stack / --host-stack set one each."""
    choice = spec.stack.model_dump()
    if both is not None:
        choice |= {"target": both.value, "host": both.value}
    if target is not None:
        choice["target"] = target.value
    if host is not None:
        choice["host"] = host.value
    return spec.model_copy(update={"stack": type(spec.stack).model_validate(choice)})


def _with_order_seed(spec: Spec, seed: Optional[int]) -> Spec:
    """--order-seed replaces the spec's order_seed (order.py)."""
    return spec if seed is None else spec.model_copy(update={"order_seed": seed})


def _carry_over(spec: Spec, study_name: str, source: Optional[Path]) -> Spec:
    """The polling study's chosen knobs from `source` applied to `spec` (carried-over studies only)."""
    from .studies.common import CARRY_OVER, carry_over

    from .store import StoreError

    if source is None or study_name not in CARRY_OVER:
        return spec
    try:
        spec, applied, refused = carry_over(spec, source)
    except StoreError as error:
        fail(str(error))
    chosen = ", ".join(f"{k} = {v}" for k, v in applied.items()) or "none (no decided recommendation)"
    out.print(f"{study_name}: knobs from the polling study in {source}: {chosen}", highlight=False, markup=False)
    for knob, why in refused.items():
        out.print(f"{study_name}: not carried over: {knob}: {why}", highlight=False, markup=False)
    return spec


def _execute(spec: Spec, path: Path, study_name: str, results: Path, quick: bool, plan: bool = False,
             force_mix: bool = False):
    from .session import SessionError, run_spec

    try:
        summary = run_spec(spec, path, study_name, results, quick, plan, force_mix)
    except SessionError as error:
        fail(str(error))
    except KeyboardInterrupt:
        fail(f"interrupted; finished points are stored in {results}: re-run the same command to resume", 130)
    out.print(summary.text, highlight=False, markup=False)
    return None if plan else summary


def _report(results: Path, out_dir: Optional[Path] = None, force: bool = False, as_json: bool = False) -> None:
    try:
        from .report import write_report
    except ImportError as error:
        fail(f"the report module is not available ({error})")
    default_place = out_dir is None
    out_dir = out_dir or results / "report"
    page = out_dir / "report.html"
    if not force and page.exists() and not _report_by_us(page):
        fail(f"{page}: exists and was not written by nvmflab; give --force to overwrite it, or another --out")
    if not force and out_dir.is_file():
        fail(f"{out_dir}: is a file, not a report directory; give another --out")
    import sqlite3

    import pandas as pd

    try:
        path = write_report(results, out_dir)
    # pandas' DatabaseError is an OSError: a damaged results database is a read error, named as one.
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as error:
        cause = error.__cause__ if isinstance(error, pd.errors.DatabaseError) and error.__cause__ else error
        fail(f"{results / 'results.sqlite'}: cannot read the results ({' '.join(str(cause).split())})")
    except OSError as error:
        if not (as_json and default_place):
            fail(_os_error(error, out_dir, "cannot write the report"))
        # `--json` asks for stdout only: a results directory that cannot take the report (a
        # read-only mount, another user's) still gives the findings.
        import tempfile

        err.print(f"nvmflab: note: {_os_error(error, out_dir, 'cannot write the report')}; the findings are "
                  "printed, the report is not kept (give --out DIR to keep it)", markup=False, highlight=False)
        with tempfile.TemporaryDirectory(prefix="nvmflab-report-") as scratch:
            try:
                findings = (write_report(results, Path(scratch)).parent / "findings.json").read_text(encoding="utf-8")
            except OSError as again:
                fail(_os_error(again, scratch, "cannot write the report"))
        _print(findings, end="")
        return
    if as_json:
        _print((path.parent / "findings.json").read_text(encoding="utf-8"), end="")
    else:
        _print(str(path))


def _report_by_us(page: Path) -> bool:
    try:
        with open(page, encoding="utf-8", errors="replace") as handle:
            return "<title>nvmflab report</title>" in handle.read(4096)
    except OSError:
        return False


DEFAULT_EXTRA_ROUNDS = 10  # compare --until-decided's cap when --max-extra-rounds is not given


@app.command("compare")
def compare(
    before: Path = typer.Argument(..., help="results directory measured before the change"),
    after: Path = typer.Argument(..., help="results directory measured after the change"),
    study: Optional[str] = typer.Option(None, "--study", help="compare only this study's points"),
    fail_if_slower: Optional[List[str]] = typer.Option(
        None, "--fail-if-slower", help="gate: PCT for every kind, or KIND=PCT (iops, bw, mean, p99; only the "
        "kinds named are gated); repeatable. Exit 1 when a gated metric is shown slower beyond PCT %, 0 only "
        "when every one is shown within it, 3 when any is inconclusive"),
    gate_point: Optional[List[str]] = typer.Option(
        None, "--gate-point", help="gate only points with every KNOB=VALUE of one of these (e.g. "
        "iodepth=32,bs=4096; also study=, leg=, role=); repeatable. Default: every matched point"),
    gate_min_points: int = typer.Option(1, "--gate-min-points", help="exit 2 when fewer gated points than "
                                        "this have an interval (two repeats a side with spread)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="where compare.html and compare.json go "
                                           "(default: AFTER/compare, skipped with a warning when AFTER is read-only)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON instead of the text summary"),
    until_decided: bool = typer.Option(False, "--until-decided", help="re-run the gated points the gate calls "
                                       "inconclusive on AFTER, one repeat a round, until decided or the cap; exit 2 "
                                       "when AFTER cannot be re-run here"),
    max_extra_rounds: Optional[int] = typer.Option(None, "--max-extra-rounds", help="the cap of --until-decided "
                                                   f"(1 to 100; default {DEFAULT_EXTRA_ROUNDS})"),
    rerun_before: bool = typer.Option(False, "--rerun-before", help="with --until-decided, re-run BEFORE too, "
                                      "rounds interleaved: only where this machine is still as BEFORE measured it"),
) -> None:
    """Before/after: match points on knobs and stacks, judge IOPS, bandwidth, mean and p99 with
    Welch + Holm (faster / slower / no clear difference), list unmatched points. With
    --fail-if-slower: exit 1 slower beyond the threshold, 3 inconclusive, 2 nothing to judge."""
    # Imported here: the statistics stack takes most of a second to load, which every other
    # command (and every one-line refusal) would otherwise pay.
    from .compare import CompareError, GateError, run as run_compare, text_summary, write
    from .rerun import RerunError

    if max_extra_rounds is not None and not until_decided:
        fail("--max-extra-rounds is the cap of --until-decided; give --until-decided too")
    rounds = (DEFAULT_EXTRA_ROUNDS if max_extra_rounds is None else max_extra_rounds) if until_decided else None
    try:
        c, written = run_compare(before, after, study, fail_if_slower, out_dir, gate_points=gate_point,
                                 min_points=gate_min_points, max_extra_rounds=rounds, rerun_before=rerun_before,
                                 note=lambda line: err.print(f"nvmflab: compare --until-decided: {line}",
                                                             markup=False, highlight=False))
        if out_dir is None:
            try:
                written = write(c, Path(after) / "compare")
            except CompareError as error:  # a read-only AFTER: the comparison still goes to stdout
                err.print(f"nvmflab: warning: {error}; compare.json and compare.html not written "
                          "(give --out DIR to keep them)", markup=False, highlight=False)
    except (CompareError, GateError, RerunError) as error:
        fail(str(error))
        return
    for warning in c.warnings:
        err.print(f"nvmflab: warning: {warning}", markup=False, highlight=False)
    try:
        if as_json:
            print(json.dumps(c.as_dict(), indent=1, allow_nan=False), flush=True)
        else:
            print(text_summary(c))
            if "html" in written:
                print(written["html"])
            sys.stdout.flush()
    except OSError as error:
        _stdout_failed(error)
    gate = c.gate_result
    if gate is not None and gate.exit_status == exits.BAD_INPUT:
        fail(f"the gate cannot decide: {gate.reason}")
    raise typer.Exit(c.exit_status())


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:
        err.print("nvmflab: interrupted")
        sys.exit(130)
    except Exception as error:  # a bug, not bad input: one line unless asked for the traceback
        if type(error).__name__ == "Abort":  # the CLI library's form of Ctrl-C
            err.print("nvmflab: interrupted")
            sys.exit(130)
        if type(error).__name__ == "NoArgsIsHelpError":  # `nvmflab` or `nvmflab results` alone: the help
            print(error.ctx.get_help())
            sys.exit(0)
        if hasattr(error, "format_message") and hasattr(error, "exit_code"):  # bad arguments: one line
            context = getattr(error, "ctx", None)
            where = f" (`{context.command_path} --help` lists the options)" if context is not None else ""
            message = " ".join(error.format_message().split()).replace("Value error, ", "")
            err.print(f"nvmflab: error: {message}{where}", markup=False, highlight=False)
            sys.exit(error.exit_code)
        if os.environ.get("NVMFLAB_DEBUG"):
            raise
        err.print(f"nvmflab: internal error: {type(error).__name__}: {error} (NVMFLAB_DEBUG=1 shows the traceback)",
                  markup=False, highlight=False)
        sys.exit(exits.INTERNAL)  # never 1 or 2: those say something about the measurements or the input
    sys.exit(code if isinstance(code, int) else 0)
