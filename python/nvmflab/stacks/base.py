"""The interface every stack implements, on the target side and on the host side.

A point has a target stack and a host stack, chosen separately. The target side starts a target
on a `Host` (this machine, a namespace, or a server over SSH); the host side opens a `HostSession`
on an initiator `Host`: whatever must happen before the load generator runs (nothing for nvmf-perf
and spdk_nvme_perf, `nvme connect` for the kernel), the load generator's command line, the reader
that turns its output into fio-layout JSON, and the teardown.

Knobs (the registry in knobs.py, built from spec.Knobs) map to each stack's own settings through
`target_knobs`/`host_knobs`: a `Setter` per knob the stack has (knobs.apply calls them), a `Fixed`
value it always has; a knob it lacks is refused by `check_knobs` before anything runs, naming the
knob and the stack.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ..knobs import KNOBS, Fixed, KnobMap, Side
from ..plan import PerfJob, TargetSetup
from ..topology.base import Host, HostError

# Which side of the connection each knob is set on (both: each side sets its own socket).
KNOB_SIDES: dict[str, tuple[Side, ...]] = {name: knob.sides for name, knob in KNOBS.items()}


class StackError(Exception):
    """The stack could not do what a point asked; the message is one line."""


# Lines a failing program prints after its error that say nothing about it: Rust's panic and
# backtrace hints, clap's usage footer, an allocator's abort note.
_NOISE = ("note: run with `RUST_BACKTRACE", "note: some details are omitted", "stack backtrace:",
          "For more information, try", "Usage:", "run with `RUST_BACKTRACE")


def error_line(text: str) -> str:
    """The line of a program's output that says why it failed: the last line naming an error
    (`error: ...`, a panic, a failed allocation), else the last line that is not one of the hints
    Rust and clap print after it; '(no output)' when there is nothing."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(_NOISE) and not line.startswith("note:")]
    for line in reversed(useful):
        lowered = line.lower()
        if "error" in lowered or "panicked" in lowered or "failed" in lowered:
            return line
    return useful[-1] if useful else lines[-1] if lines else "(no output)"


def links_rdma(host: Host, path: str) -> bool:
    """Whether the program at `path` on `host` was linked against rdma-core's librdmacm (the
    `rdma` feature of our binaries, an SPDK built with RDMA)."""
    try:
        return host.run(["grep", "-qa", "librdmacm.so", path], check=False, timeout=20).returncode == 0
    except HostError:
        return False


class RunningTarget(ABC):
    setup: TargetSetup
    address: str  # where initiators connect (the target host's data address)
    port: int

    def stats(self) -> dict[str, Any] | None:
        """Cumulative counters in the layout of nvmf-target's /stats (CONTRACTS.md §2); None if the
        stack exposes none."""
        return None

    def cpu_seconds(self) -> tuple[float, float] | None:
        """(user, system) CPU seconds the target has used so far; None where not attributable."""
        return None

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop the target and remove exactly what starting it created."""


class HostSession(ABC):
    """One load generator's life on an initiator host: attach, the command, its output, detach."""

    @abstractmethod
    def perf_argv(self, runtime: float, ramp_time: float, output: str) -> list[str]:
        """The load generator's command line; it writes its report to `output` on the host."""

    def parse_output(self, text: str) -> dict[str, Any]:
        """The report as fio-layout JSON (jobs[].read.iops, clat_ns.percentile, ...)."""
        import json

        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise StackError(f"load generator report is not JSON: {err}") from None

    def close(self) -> None:
        """Undo whatever opening did (disconnect); runs even after a failure."""


class Stack(ABC):
    name: str
    backends: tuple[str, ...] = ("null", "ram", "file")  # what its target can store to
    target_knobs: KnobMap = {}
    host_knobs: KnobMap = {}

    # -- target side ----------------------------------------------------------------------------
    @abstractmethod
    def start_target(self, setup: TargetSetup, host: Host, workdir: Path) -> RunningTarget: ...

    def plan_target(self, setup: TargetSetup, host: Host) -> list[str]:
        """What starting this target runs on `host`, one line per step (for `--plan`)."""
        return [f"start {self.name} target"]

    # -- host side ------------------------------------------------------------------------------
    @abstractmethod
    def open_host(self, job: PerfJob, target: RunningTarget | None, host: Host, workdir: Path) -> HostSession: ...

    def plan_host(self, job: PerfJob, address: str, port: int, host: Host, runtime: float = 10.0,
                  ramp_time: float = 2.0) -> list[str]:
        """What one load generator runs on `host`, one line per step (for `--plan`)."""
        return [f"run {self.name} load generator"]

    def check_timing(self, runtime: float, ramp_time: float) -> None:
        """Refuse a runtime or ramp_time this stack's load generator cannot take (StackError)."""

    def job_refusal(self, job: PerfJob) -> str | None:
        """Why this stack's load generator cannot run `job` at all (a file where it needs a
        subsystem, too few cores for its jobs, ...), or None. Checked before anything runs."""
        return None

    # -- both -----------------------------------------------------------------------------------
    def unavailable(self, host: Host, side: Side) -> str | None:
        """None when this side of the stack can run on `host`, else what is missing there."""
        return None

    def rdma_unavailable(self, host: Host, side: Side) -> str | None:
        """None when this side of the stack can speak NVMe over RDMA on `host` (its build, its
        modules), else why not. The RDMA device itself is topology/rdma.py's to check."""
        return f"the {self.name} {side} has no NVMe over RDMA"

    # PSK identity versions this stack offers as a host and accepts as a target (0: NVMe0R, 1: NVMe1R).
    tls_identities: frozenset[int] = frozenset({0, 1})

    def tls_unavailable(self, host: Host, side: Side) -> str | None:
        """None when this side of the stack can do NVMe/TCP over TLS 1.3 on `host`, else why not.
        Default: TLS in userspace (OpenSSL), which needs nothing of the host's kernel."""
        return None

    def host_tls_records(self, log: str) -> str | None:
        """Who made the TLS records of a host run whose load generator's output (stdout and stderr)
        is `log`: "ktls" (the kernel), "userspace" (the stack's process), a mix, or None where the
        stack does not say. Stored with every TLS point (runner, `host_tls_records`)."""
        return None

    @abstractmethod
    def versions(self, host: Host) -> dict[str, str | None]: ...

    def version(self, host: Host) -> str | None:
        """One line naming the stack's version on `host` (stored with every measurement)."""
        found = [f"{k} {v}" for k, v in self.versions(host).items() if v]
        return "; ".join(found) or None

    def knob_map(self, side: Side) -> KnobMap:
        return self.target_knobs if side == "target" else self.host_knobs

    def check_knobs(self, knobs: dict[str, Any], side: Side, defaults: dict[str, Any]) -> None:
        """Refuse knob values this side of the stack cannot honour (StackError naming both)."""
        mapping = self.knob_map(side)
        for knob, sides in KNOB_SIDES.items():
            if side not in sides or knob not in knobs:
                continue
            value, setting = knobs[knob], mapping.get(knob)
            if isinstance(setting, Fixed) and value != setting.value:
                raise StackError(f"knob {knob} = {value!r}: the {self.name} {side} cannot do it ({setting.why})")
            if setting is None and value != defaults.get(knob):
                raise StackError(f"knob {knob} = {value!r}: the {self.name} {side} has no such setting "
                                 f"(only the default {defaults.get(knob)!r} is accepted)")

    def fixed_defaults(self, side: Side) -> dict[str, Any]:
        """Knob values this side always has; they replace the spec's defaults where a user set none."""
        return {k: v.value for k, v in self.knob_map(side).items() if isinstance(v, Fixed)}
