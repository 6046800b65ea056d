"""One invocation of `study` or `run`: open the store, record the run, execute, always clean up."""

from __future__ import annotations

import signal
import sqlite3
from collections import Counter
from pathlib import Path

from . import procs
from .env import collect
from .runner import Runner, make_progress
from .spec import Spec
from .stacks import StackError, get_stack
from .store import ResultsStore
from .studies import study_module, study_params
from .studies.common import Context
from .tools import OUR_BINARIES, ToolMissing, require_tool


class SessionError(Exception):
    pass


def run_spec(spec: Spec, path: Path, study_name: str, results: Path, quick: bool) -> str:
    """Run every point of the spec (skipping stored ones); returns a one-line summary."""
    try:
        for name in OUR_BINARIES:
            require_tool(name)
        stack = get_stack(spec.stack)
    except (ToolMissing, StackError) as error:
        raise SessionError(str(error)) from None
    params = study_params(spec.study, spec.params) if spec.study else None
    env = collect() | {"spec_effective": spec.model_dump(mode="json"), "quick": quick, "spec_path": str(path)}
    spec_text = Path(path).read_text()
    try:
        store = ResultsStore(results)
    except (OSError, sqlite3.Error) as error:
        raise SessionError(f"{results}: cannot keep results there ({error})") from None
    run_id = store.start_run(study_name, spec_text, env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with make_progress() as progress:
            runner = Runner(store, run_id, stack, progress)
            ctx = Context(spec=spec, study=study_name, runner=runner, store=store)
            try:
                if spec.study:
                    study_module(spec.study).execute(ctx, params)
                else:
                    from .studies import sweep

                    sweep.execute(ctx)
            finally:
                runner.close()
        store.finish_run(run_id)
    finally:
        signal.signal(signal.SIGTERM, previous)
        procs.stop_all()
    statuses = Counter(store.points().query("run_id == @run_id")["status"])
    store.close()
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing new (all points stored)"
    return f"{study_name}: {counts} in {results}"


def _interrupt(signum, frame) -> None:
    # SIGTERM takes the same path as Ctrl-C: children stopped, finished points kept.
    raise KeyboardInterrupt
