"""What one measurement point is: the target to run, the load generators, and how to judge it.

Studies build `Point`s; the runner executes them; the store keys them by `point_key`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Subsystem:
    nqn: str
    backend: str  # null | ram | file | model
    size: int
    path: str | None = None
    block_size: int = 512
    reactor: int | None = None  # index into TargetSetup.cores; None = round robin
    model: str | None = None  # the model backend's parameters (spec.Backend.model)


@dataclass(frozen=True)
class TargetSetup:
    """Everything that decides how the target process is started (equal setups share a process)."""

    cores: tuple[int, ...]  # physical cores, one reactor each
    mode: str
    idle_poll_us: int
    in_capsule_data_size: int
    so_priority: int
    tos: int
    busy_poll_us: int
    subsystems: tuple[Subsystem, ...]
    netns: str | None = None  # run inside this network namespace
    listen_ip: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # host NQNs every subsystem admits; empty = any host
    tls: str = "off"  # "on": every port requires TLS 1.3 with tls_key as the host's PSK
    tls_key: str | None = None  # NVMeTLSkey-1:HH:...: (the host side connects with the same key)
    dhchap: str = "off"  # a DH group: hosts authenticate with DH-HMAC-CHAP using dhchap_key
    dhchap_key: str | None = None  # DHHC-1:00:...: (the host side authenticates with the same secret)
    transport: str = "tcp"  # "rdma": the target's port is an NVMe over RDMA port (docs/rdma.md)
    tcp_congestion: str = "system"  # a kernel congestion control name for every connection, or the machine's


@dataclass(frozen=True)
class PerfJob:
    """One load-generator process (nvmf-perf, fio or spdk_nvme_perf, by the host stack)."""

    role: str  # main | fg | bg | lg1, lg2, ... (store.ROLE_CHECK)
    knobs: dict[str, Any]  # flat workload + host knobs, spec names
    cpus: tuple[int, ...]  # physical cores for --cpus_allowed
    nqn: str | None = None  # tcp engine
    local_path: str | None = None  # local engine (--local)
    local_file_size: int | None = None  # bytes the runner makes local_path (files.place_file) before the point
    host: str | None = None  # initiator host by inventory name; None = the topology's first
    hostnqn: str | None = None  # the host NQN to connect with; None = the stack's own default
    spread: tuple[str, ...] = ()  # run on each of these initiators at once, results merged (spread.py)


def generator_roles(n: int) -> list[str]:
    """Roles of a point's n load generators: `main`, then `lg1` ... `lg{n-1}`."""
    return ["main"] + [f"lg{i}" for i in range(1, n)]


# (perf JSON per role, target /stats diff) -> (ok, detail)
Invariant = Callable[[dict[str, dict[str, Any]], dict[str, Any]], tuple[bool, str]]


@dataclass
class Point:
    study: str
    leg: str
    knobs: dict[str, Any]  # the coordinates stored as knobs_json
    repeat: int
    jobs: list[PerfJob]
    runtime: float
    ramp_time: float
    target: TargetSetup | None = None
    invariant: Invariant | None = None
    fg_bg_shared_core: bool = False
    skip_reason: str | None = None  # the leg cannot run here; stored as status "skipped"
    fail_reason: str | None = None  # an earlier step it needs failed; stored "failed", so a re-run retries it
    prepare: Callable[[], None] | None = field(default=None, repr=False)

    @cached_property
    def key(self) -> str:
        return point_key(self.study, self.leg, self.knobs, self.repeat, self.runtime, self.ramp_time,
                         self.definition())

    def definition(self) -> dict[str, Any] | None:
        """What decides the measurement beyond the knobs: the target's setup (cores, backends, sizes,
        block sizes, files, address) and each load generator's (cores, host, subsystem, files).
        Files the harness keeps in a results directory's work/ are named relative to it, so a moved
        results directory keeps its keys; a namespace's name (made anew by each run) is left out.
        None for a point that runs neither (a network-only measurement keyed by its knobs alone)."""
        if self.target is None and not self.jobs:
            return None
        target = None
        if self.target is not None:
            target = dataclasses.asdict(self.target)
            target.pop("netns", None)
            target.pop("tls_key", None)  # made per run: the same point under another key is the same point
            if target.get("tls") == "off":
                target.pop("tls")  # keeps the identities of points stored before the knob existed
            target.pop("dhchap_key", None)  # made per run, as the TLS key
            if target.get("dhchap") == "off":
                target.pop("dhchap")
            if target.get("transport") == "tcp":
                target.pop("transport")  # likewise for the transport knob
            for sub in target["subsystems"]:
                sub["path"] = _path_id(sub["path"])
        jobs = [{"role": j.role, "knobs": j.knobs, "cpus": list(j.cpus), "nqn": j.nqn, "host": j.host,
                 "hostnqn": j.hostnqn, "local_path": _path_id(j.local_path), "local_file_size": j.local_file_size,
                 **({"spread": list(j.spread)} if j.spread else {})}  # unspread jobs keep their old keys
                for j in self.jobs]
        return {"target": target, "jobs": jobs}


def _path_id(path: str | None) -> str | None:
    """A file under a results directory's work/ as `work/NAME`; any other path as given."""
    if not path:
        return path
    where = Path(path)
    if where.parent.name == "work" and (where.parent.parent / "results.sqlite").exists():
        return f"work/{where.name}"
    return path


# Knobs added after results directories were first written, with their defaults: a knob at its
# default stays out of the key, so a directory written before the knob existed resumes instead of
# measuring every point again.
KEYLESS_DEFAULTS: dict[str, Any] = {"sqflow": "on", "tcp_congestion": "system"}


def point_key(study: str, leg: str, knobs: dict[str, Any], repeat: int, runtime: float, ramp_time: float,
              definition: dict[str, Any] | None = None) -> str:
    """Same key = same measurement: a re-run with another runtime, ramp_time, placement, backend or
    load-generator layout measures anew (`definition`: Point.definition)."""
    knobs = {k: v for k, v in knobs.items() if k not in KEYLESS_DEFAULTS or v != KEYLESS_DEFAULTS[k]}
    fields = {"study": study, "leg": leg, "knobs": knobs, "repeat": repeat, "runtime": float(runtime),
              "ramp_time": float(ramp_time)}
    if definition is not None:
        fields["definition"] = definition
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
