"""Per-point progress of a session, with a time estimate from the points measured so far.

The estimate scales what the remaining points would take at their nominal length (ramp_time +
runtime) by how long measured points really took against theirs (connect, target start and
teardown add to every point). Points already stored, and points skipped or failed before running,
finish instantly: they count as done but never enter the estimate.

On a terminal a rich bar per leg; elsewhere (make run piped to a log, CI) one plain line per point:
`study · leg · point i/N · status · took · elapsed · estimate`. Skipped and failed points print
their reason on both.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .plan import Point

# Seconds a point takes beyond ramp_time + runtime before anything was measured: a first guess only.
MIN_NOMINAL_S = 0.1


def nominal(point: Point) -> float:
    return max(float(point.ramp_time) + float(point.runtime), MIN_NOMINAL_S)


def instant(point: Point) -> bool:
    """Points that are stored without running anything."""
    return bool(point.skip_reason or point.fail_reason)


@dataclass
class Estimator:
    """Seconds left from (nominal, actual) pairs of the points measured so far."""

    nominal_s: float = 0.0
    actual_s: float = 0.0
    measured: int = 0

    def add(self, nominal_s: float, actual_s: float) -> None:
        self.nominal_s += nominal_s
        self.actual_s += actual_s
        self.measured += 1

    def remaining(self, nominal_left: float) -> float | None:
        """None until a point was measured: no guess is shown rather than a wrong one."""
        if self.measured == 0:
            return None
        return nominal_left * (self.actual_s / self.nominal_s)


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class Leg:
    """One `Runner.run` call: its points, which of them are stored, and the tracker to report to."""

    tracker: "Tracker"
    description: str
    points: list[Point]
    stored: set[str]
    done: int = 0
    nominal_left: float = field(init=False)
    task: Any = None

    def __post_init__(self) -> None:
        self.nominal_left = sum(nominal(p) for p in self.points if p.key not in self.stored and not instant(p))

    def skip_stored(self, count: int) -> None:
        self.done += count
        self.tracker.stored(self, count)

    def finished(self, point: Point, status: str, error: str | None, took_s: float) -> None:
        self.done += 1
        if not instant(point):
            self.nominal_left -= nominal(point)
            self.tracker.estimator.add(nominal(point), took_s)
            if self.tracker.study_left is not None:
                self.tracker.study_left = max(self.tracker.study_left - nominal(point), 0.0)
        self.tracker.finished(self, point, status, error, took_s)

    def remaining(self) -> float | None:
        return self.tracker.estimator.remaining(max(self.nominal_left, 0.0))


class Tracker:
    """What Runner reports to; `console.print` is the studies' way to add a note (Context.console_note)."""

    def __init__(self, stream: TextIO | None = None, terminal: bool | None = None):
        self.stream = stream or sys.stdout
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.console = Console(file=self.stream, force_terminal=self.terminal,
                               width=None if self.terminal else 200, soft_wrap=not self.terminal)
        self.estimator = Estimator()
        self.study_left: float | None = None  # nominal seconds of the study's points not yet measured
        self.started = time.monotonic()
        self._bars: Progress | None = None
        if self.terminal:
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                  console=self.console, transient=False)
            self.console = self._bars.console

    def __enter__(self) -> "Tracker":
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def plan(self, points: list[Point], stored: set[str]) -> None:
        """Every point the study planned, so the estimate covers the whole study, not one leg. Legs
        planned on results not measured yet (interference's capped points) may differ a little."""
        self.study_left = sum(nominal(p) for p in points if p.key not in stored and not instant(p))

    def study_remaining(self) -> float | None:
        return None if self.study_left is None else self.estimator.remaining(self.study_left)

    def leg(self, description: str, points: list[Point], stored: set[str]) -> Leg:
        leg = Leg(self, description, points, stored)
        if self._bars is not None:
            leg.task = self._bars.add_task(description, total=len(points), eta="")
        return leg

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- reports from a leg ------------------------------------------------------------------

    def stored(self, leg: Leg, count: int) -> None:
        if self._bars is not None:
            self._bars.advance(leg.task, count)
        else:
            self._line(f"{leg.description} · {count} of {len(leg.points)} point(s) already stored, not run again")

    def finished(self, leg: Leg, point: Point, status: str, error: str | None, took_s: float) -> None:
        reason = f": {error}" if error and status != "ok" else ""
        left, study_left = leg.remaining(), self.study_remaining()
        estimate = "estimating after the first measured point" if left is None else f"about {clock(left)} left"
        if left is not None and study_left is not None:
            estimate += f" in this leg, {clock(study_left)} in the study"
        if self._bars is not None:
            self._bars.update(leg.task, advance=1, eta=estimate if leg.done < len(leg.points) else "")
            if status not in ("ok", "stored"):
                self.console.print(f"{point.study} · {point.leg} · point {leg.done}/{len(leg.points)} "
                                   f"{status}{reason}", markup=False, highlight=False)
            return
        if leg.done == len(leg.points):
            estimate = "leg done"
        self._line(f"{point.study} · {point.leg} · point {leg.done}/{len(leg.points)} · {status}{reason} · "
                   f"took {took_s:.1f} s · elapsed {clock(self.elapsed())} · {estimate}")

    def _line(self, text: str) -> None:
        # print() rather than rich: no wrapping or markup, and flushed at once for a log being tailed.
        print(text, file=self.stream, flush=True)
