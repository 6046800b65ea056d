"""The interface every stack implements: start a target, build a load-generator command line."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ..plan import PerfJob, TargetSetup


class StackError(Exception):
    """The stack could not do what a point asked; the message is one line."""


class RunningTarget(ABC):
    setup: TargetSetup
    address: str
    port: int

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Cumulative counters in the layout of nvmf-target's /stats (CONTRACTS.md §2)."""

    @abstractmethod
    def cpu_seconds(self) -> tuple[float, float]:
        """(user, system) CPU seconds the target has used so far."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def stop(self) -> None: ...


class Stack(ABC):
    name: str

    @abstractmethod
    def start_target(self, setup: TargetSetup, workdir: Path) -> RunningTarget: ...

    @abstractmethod
    def perf_argv(self, job: PerfJob, target: RunningTarget | None, runtime: float, ramp_time: float,
                  output: Path) -> list[str]:
        """Command line of one load-generator process writing fio-layout JSON to `output`."""

    @abstractmethod
    def versions(self) -> dict[str, str | None]: ...
