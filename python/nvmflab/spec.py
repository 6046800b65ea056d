"""Experiment specs: TOML files validated by pydantic models before anything runs.

A spec names the topology, the stack, the backend, one workload and the knobs, and a `[sweep]`
table where any workload or knob field may be a list (the points are their cross product).
A `[quick]` table holds overrides merged over the spec for `--quick`. Study specs add a
`[params]` table that the study's own model validates.

Field names are fio's and the knobs table's (DESIGN.md), so they carry unchanged from the spec
to nvmf-perf's flags, the results columns and the figure labels.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError,
                      model_validator)

from .names import STACK_NAMES, STUDY_NAMES
from .units import parse_size
from .tlskey import check_key

Size = Annotated[int, BeforeValidator(parse_size)]
IoDepth = Annotated[int, Field(ge=1, le=4096)]
NumJobs = Annotated[int, Field(ge=1, le=256)]
RW = Literal["read", "write", "randread", "randwrite", "rw", "randrw"]


class SpecError(Exception):
    """A spec that cannot run; the message is one line naming file, line, field and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Topology(_Strict):
    """Where target and host run. `local`: both on this machine, pinned to the given cores.
    `ssh`: real hosts from an inventory file; the cores are indices into each host's usable cores."""

    kind: Literal["local", "ssh"] = "local"
    target_cores: list[Annotated[int, Field(ge=0)]] = Field(default=[0], min_length=1)
    host_cores: list[Annotated[int, Field(ge=0)]] = Field(default=[1], min_length=1)
    inventory: str | None = None  # ssh: inventory file (nvmflab TOML or Ansible YAML), relative to the spec
    target: str | None = None  # ssh: inventory name of the target host
    initiators: list[str] = []  # ssh: inventory names of the initiator hosts; the first is the default
    # The load generator on several initiators at once (spread.py): "all", "first" or a list of
    # initiators; unset: "all" for saturation and stacks, "first" for the other studies.
    spread: Literal["all", "first"] | Annotated[list[str], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _check_kind(self) -> "Topology":
        ssh_fields = {"inventory": self.inventory, "target": self.target, "initiators": self.initiators}
        if self.kind == "ssh":
            for name, value in ssh_fields.items():
                if not value:
                    raise ValueError(f"{name}: a `kind = \"ssh\"` topology needs it")
        else:
            for name, value in ssh_fields.items():
                if value:
                    raise ValueError(f"{name}: only a `kind = \"ssh\"` topology takes it")
        if isinstance(self.spread, list):
            unknown = [h for h in self.spread if h not in self.initiators]
            if unknown:
                have = ", ".join(self.initiators) or "none: a local topology has one"
                raise ValueError(f"spread: {unknown[0]!r} is not one of the initiators ({have})")
            if len(set(self.spread)) != len(self.spread):
                raise ValueError("spread: a host is listed twice")
        return self


StackName = Literal[STACK_NAMES]
StudyName = Literal[STUDY_NAMES]


def _stack_table(value: Any) -> Any:
    """`stack = "spdk"` is shorthand for `[stack] target = "spdk"` and `host = "spdk"`."""
    return {"target": value, "host": value} if isinstance(value, str) else value


class StackChoice(_Strict):
    """Which stack serves the target and which one drives the load, chosen separately. With
    `hostnqn`, every load generator connects as that host and the targets admit only it."""

    target: StackName = "ours"
    host: StackName = "ours"
    hostnqn: Annotated[str, Field(pattern=r"^nqn\.[A-Za-z0-9.:_-]{1,219}$")] | None = None
    # The TLS PSK for `tls = "on"` points, as `nvme gen-tls-key` prints it; None: a random one per run.
    tls_key: Annotated[str, AfterValidator(check_key)] | None = None


MODEL_KEYS = {"lat": r"\d+(ns|us|ms|s)", "par": r"\d+", "bw": r"(\d+([kmgt]i?b?)?|none)"}


def check_congestion(name: str) -> str:
    """`system`, or a name the kernel could know as a TCP congestion control (whether a machine has
    it is known only when a socket is set: nvmf-target and nvmf-perf refuse it then)."""
    if name != "system" and not re.fullmatch(r"[a-z0-9_]{1,15}", name):
        raise ValueError(f"expected \"system\" or a kernel congestion control such as cubic or bbr "
                         f"(1-15 of a-z, 0-9, _), got {name!r}")
    return name


def check_model(text: str) -> str:
    """The model backend's parameters, `lat=80us,par=32,bw=3GiB` (nvmf-target's syntax, each key
    optional); the error names the pair. nvmf-target checks the ranges again at start."""
    for pair in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = pair.partition("=")
        if key not in MODEL_KEYS:
            raise ValueError(f"{pair!r}: unknown model parameter (lat, par, bw)")
        if not re.fullmatch(MODEL_KEYS[key], value.strip().lower()):
            raise ValueError(f"{pair!r}: expected e.g. lat=80us, par=32, bw=3GiB or bw=none")
    return text


class Backend(_Strict):
    """What the namespace stores to. `model` is RAM that completes like a device (nvmf-target's
    backend/model.rs: `par` media units of `lat` each behind one link of `bw` per second); only our
    target has it, so other target stacks skip its points with that reason."""

    kind: Literal["null", "ram", "file", "model"] = "ram"
    size: Size = 256 << 20
    # file backend: the image to serve; default is a file in the results directory.
    path: str | None = None
    block_size: Literal[512, 4096] = 512
    # model backend: its parameters over nvmf-target's defaults (lat=80us,par=32,bw=3GiB).
    model: Annotated[str, AfterValidator(check_model)] | None = None

    @model_validator(mode="after")
    def _model_only_for_model(self) -> "Backend":
        if self.model is not None and self.kind != "model":
            raise ValueError(f"model = {self.model!r} belongs to kind = \"model\", not {self.kind!r}")
        return self


class Workload(_Strict):
    rw: RW = "randread"
    bs: Size = 4096
    iodepth: IoDepth = 1
    numjobs: NumJobs = 1
    rwmixread: int = Field(default=50, ge=0, le=100)
    rate_iops: int = Field(default=0, ge=0)  # per job, 0 = unlimited
    size: Size | None = None  # region each job touches; default: whole namespace


def _knob(default: Any, what: str, sides: tuple[str, ...], **limits: Any) -> Any:
    """A knob field: what it controls and the side(s) of the connection that set it (the knob
    registry, knobs.py, is built from these)."""
    return Field(default=default, description=what, json_schema_extra={"sides": list(sides)}, **limits)


class Knobs(_Strict):
    completion: Literal["poll", "event"] = _knob("event", "host completion polling", ("host",))
    target_mode: Literal["poll", "event"] = _knob("event", "target busy polling", ("target",))
    idle_poll_us: int = _knob(0, "target idle polling (µs)", ("target",), ge=0)
    hdr_digest: bool = _knob(False, "header digest", ("target", "host"))
    data_digest: bool = _knob(False, "data digest", ("target", "host"))
    so_priority: int = _knob(0, "socket priority", ("target", "host"), ge=0, le=6)
    tos: int = _knob(0, "type of service", ("target", "host"), ge=0, le=255)
    busy_poll_us: int = _knob(0, "socket busy polling (µs)", ("target", "host"), ge=0)
    # A kernel name (cubic, bbr, ...) set per socket with TCP_CONGESTION; "system": the machine's
    # net.ipv4.tcp_congestion_control. It governs the side that sends the data (host for writes).
    tcp_congestion: Annotated[str, AfterValidator(check_congestion)] = _knob(
        "system", "TCP congestion control (system: the machine's default)", ("target", "host"))
    in_capsule_data_size: Size = _knob(8192, "in-capsule data size", ("target",))
    # nvmf-perf opens one I/O queue pair per job; None means "= numjobs".
    io_queues: int | None = _knob(None, "number of I/O queues", ("host",), ge=1)
    # TLS 1.3 with a PSK (docs/tls.md): the key is [stack] tls_key, else one made per run.
    tls: Literal["off", "on"] = _knob("off", "TLS 1.3 secure channel (PSK)", ("target", "host"))
    # DH-HMAC-CHAP in-band authentication with this DH group ("off": none); a secret made per run.
    dhchap: Literal["off", "null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"] = _knob(
        "off", "DH-HMAC-CHAP authentication (its DH group)", ("target", "host"))
    # NVMe/TCP or NVMe over RDMA (docs/rdma.md); rdma needs an RDMA device on both hosts.
    transport: Literal["tcp", "rdma"] = _knob("tcp", "transport (NVMe/TCP or NVMe over RDMA)", ("target", "host"))
    # "off": the host asks in Connect for SQ flow control to be disabled (CATTR bit 2); a target that
    # grants it may end a read with its last C2HData PDU (SUCCESS flag) and send no response capsule.
    sqflow: Literal["on", "off"] = _knob("on", "SQ flow control (off: reads may end without a response capsule)",
                                         ("host",))


SWEEPABLE = tuple(Workload.model_fields) + tuple(Knobs.model_fields)


class Spec(_Strict):
    name: str = "sweep"
    study: StudyName | None = None
    description: str = ""
    topology: Topology = Topology()
    stack: Annotated[StackChoice, BeforeValidator(_stack_table)] = StackChoice()
    backend: Backend = Backend()
    workload: Workload = Workload()
    knobs: Knobs = Knobs()
    sweep: dict[str, list[Any]] = {}
    params: dict[str, Any] = {}
    # "auto": every point runs min_repeats times, then more rounds (up to max_repeats) for the
    # configurations whose main metric's 95 % interval is wider than ci_within_pct of the mean.
    # After validation `repeats` holds the starting count (min_repeats), so studies can range() it;
    # `auto_repeats` tells whether more rounds may follow.
    repeats: Annotated[int, Field(ge=1, le=100)] | Literal["auto"] = "auto"
    min_repeats: int = Field(default=3, ge=2, le=100)
    max_repeats: int = Field(default=10, ge=2, le=100)
    ci_within_pct: float = Field(default=5.0, gt=0, le=100, allow_inf_nan=False)
    ramp_time: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    runtime: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    quick: dict[str, Any] = {}
    # Shuffles the order of legs and points within each round (order.py); unset, a run draws one
    # and records it in its spec_effective, so giving it again repeats the order.
    order_seed: int | None = Field(default=None, ge=0, lt=2**63)
    _auto_repeats: bool = PrivateAttr(default=False)

    @property
    def auto_repeats(self) -> bool:
        """True when repeats = "auto": Context.run adds rounds until the answer is stable."""
        return self._auto_repeats

    @model_validator(mode="after")
    def _resolve_repeats(self) -> "Spec":
        if self.repeats == "auto":
            if self.max_repeats < self.min_repeats:
                raise ValueError(f"max_repeats: {self.max_repeats} is below min_repeats ({self.min_repeats})")
            self.repeats = self.min_repeats
            self._auto_repeats = True
        return self

    @model_validator(mode="after")
    def _check_sweep(self) -> "Spec":
        if self.study is not None and self.sweep:
            raise ValueError(f"sweep: the {self.study} study takes its swept values from [params], so it would "
                             "ignore [sweep]; [sweep] is for specs without `study`, run by `nvmflab run`")
        for key, values in self.sweep.items():
            if key not in SWEEPABLE:
                raise ValueError(f"sweep.{key}: not a workload or knob field; allowed: {', '.join(SWEEPABLE)}")
            if not values:
                raise ValueError(f"sweep.{key}: empty list; give at least one value")
            for value in values:
                base = self.base_knobs() | {key: value}
                validate_knobs(base, where=f"sweep.{key}")
        self._check_sizes()
        validate_knobs(self.base_knobs())  # the base point obeys the same rules as a swept one
        return self

    def _check_sizes(self) -> None:
        """Block sizes that are whole blocks of the backend, regions that fit in it."""
        block, capacity = self.backend.block_size, self.backend.size
        if capacity % block:
            raise ValueError(f"backend.size: {capacity} bytes is not a multiple of backend.block_size ({block})")
        sources = [("workload", self.workload.bs, self.workload.size)]
        sources += [(f"sweep.bs", parse_size(v), None) for v in self.sweep.get("bs", [])]
        sources += [(f"sweep.size", None, parse_size(v)) for v in self.sweep.get("size", []) if v is not None]
        for where, bs, size in sources:
            field = where if where.startswith("sweep") else f"{where}.bs"
            if bs is not None and bs % block:
                raise ValueError(f"{field}: {bs} bytes is not a multiple of backend.block_size ({block})")
            if bs is not None and bs > capacity:
                raise ValueError(f"{field}: {bs} bytes is larger than backend.size ({capacity} bytes)")
            field = where if where.startswith("sweep") else f"{where}.size"
            if size is not None and size > capacity:
                raise ValueError(f"{field}: {size} bytes is larger than backend.size ({capacity} bytes); "
                                 "a job cannot touch more than the namespace holds")
            if size is not None and size % block:
                raise ValueError(f"{field}: {size} bytes is not a multiple of backend.block_size ({block})")

    def base_knobs(self) -> dict[str, Any]:
        """Workload and knob fields in one flat dict (the point coordinates before sweeping)."""
        return self.workload.model_dump() | self.knobs.model_dump()

    def points(self) -> list[dict[str, Any]]:
        """The cross product of the sweep lists applied over the base knobs, in spec order."""
        keys = list(self.sweep)
        combos = itertools.product(*(self.sweep[k] for k in keys)) if keys else [()]
        return [validate_knobs(self.base_knobs() | dict(zip(keys, combo))) for combo in combos]


def validate_knobs(flat: dict[str, Any], where: str = "knobs") -> dict[str, Any]:
    """Validate a flat workload+knobs dict; returns it normalised (sizes in bytes, io_queues set)."""
    workload = {k: v for k, v in flat.items() if k in Workload.model_fields}
    knobs = {k: v for k, v in flat.items() if k in Knobs.model_fields}
    try:
        merged = Workload.model_validate(workload).model_dump() | Knobs.model_validate(knobs).model_dump()
    except ValidationError as err:
        first = err.errors()[0]
        raise ValueError(f"{where}: {field_name(first['loc'])}: {problem(first)}") from None
    if merged["io_queues"] is None:
        merged["io_queues"] = merged["numjobs"]
    elif merged["io_queues"] != merged["numjobs"]:
        field = "knobs.io_queues" if where == "knobs" else where
        raise ValueError(f"{field}: nvmf-perf opens one I/O queue pair per job, so io_queues must equal "
                         f"numjobs ({merged['numjobs']}) or be left out")
    return merged


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_spec(path: Path, quick: bool = False, study: str | None = None) -> Spec:
    """Read and validate a spec file; raises SpecError with file:line, field and allowed values.

    `study` is the study the caller will run: a spec without `study` gets it, a spec naming another
    study is refused. The study's own `[params]` are not checked here (studies import this module,
    not the other way round): study_spec.load_study_spec checks them too.
    """
    return read_spec(path, quick, study)[0]


def read_spec(path: Path, quick: bool = False, study: str | None = None) -> tuple[Spec, str]:
    """load_spec, also returning the file's text (for the line numbers of later checks)."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, not a spec file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise SpecError(f"{path}: cannot read spec ({err.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a spec: the file is not UTF-8 text (a TOML spec is)") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {' '.join(str(err).split())}") from None
    if not raw:
        raise SpecError(f"{path}: the spec is empty; it would run the default point only. Write what to "
                        "measure (a [workload], [knobs] or [sweep] table, or `study = ...`; docs/harness.md)")
    if study is not None and raw.setdefault("study", study) != study:
        raise SpecError(f"{path}{line_suffix(text, ('study',))}: study: this spec is for {raw['study']!r}, "
                        f"but `nvmflab study {study}` was asked")
    if quick:
        if "quick" not in raw:
            raise SpecError(f"{path}: --quick applies the spec's [quick] overrides, but it has no [quick] table; "
                            "add one or leave out --quick")
        overrides = raw["quick"]
        if not isinstance(overrides, dict):
            raise SpecError(f"{path}: [quick] must be a table")
        raw = deep_merge(raw, overrides)
    try:
        return Spec.model_validate(raw), text
    except ValidationError as err:
        raise SpecError(describe(err, text, path)) from None


# Parts of a pydantic location that name a type, not a field: the member of a union that was tried
# (`repeats.constrained-int`, `repeats.literal['auto']`), a validator (`function-after[...]`).
_TYPE_TAG = re.compile(r"^(?:constrained-)?(?:int|float|str|bool|bytes|list|dict|tuple|set|none|decimal)$|[\[\]-]")


def spec_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """A pydantic location with its type tags left out: the field as the spec names it. The first
    part is always a field (a spec may not name a field after a type)."""
    return tuple(p for i, p in enumerate(loc) if i == 0 or isinstance(p, int) or not _TYPE_TAG.search(p))


def field_name(loc: tuple[str | int, ...]) -> str:
    """A pydantic location as a person writes it: `params.iodepth[1]`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in spec_loc(loc)).lstrip(".")


def problem(error: dict[str, Any]) -> str:
    """What is wrong with one value: a validator's own sentence, or pydantic's with the value given."""
    if error["type"] == "value_error" and "ctx" in error:
        return str(error["ctx"]["error"])
    text = " ".join(str(error["msg"]).split())
    return f"{text} (got {_shown(error.get('input'))})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_error(err: ValidationError) -> tuple[tuple[str | int, ...], dict[str, Any], str]:
    """The first error's field (spec names) and message; the members of a union that all failed
    at that field are said together (`must be ... or ...`)."""
    errors = err.errors()
    first = errors[0]
    loc = spec_loc(tuple(first["loc"]))
    same = [e for e in errors if spec_loc(tuple(e["loc"])) == loc]
    if len(same) > 1 and len(first["loc"]) > len(loc):  # a union: every member refused the value
        messages = list(dict.fromkeys(" ".join(str(e["msg"]).split()) for e in same))
        return loc, first, " or ".join(messages) + f" (got {_shown(first.get('input'))})"
    return loc, first, problem(first)


def describe(err: ValidationError, text: str, path: Path, model: type[BaseModel] | None = None,
              within: tuple[str, ...] = ()) -> str:
    """One line for the first error: file:line, the field, what is allowed."""
    loc, first, message = _first_error(err)
    loc = within + loc
    if first["type"] == "extra_forbidden":
        allowed = list(model.model_fields) if model else _allowed_fields(loc[:-1])
        message = f"unknown field; allowed: {', '.join(allowed)}"
    else:
        # Spec-level checks start their message with the field they are about (`sweep.iodepth: ...`).
        match = re.match(r"([a-z_]+(?:\.\w+)?): ", message) if not loc else None
        if match and match.group(1).split(".")[0] in Spec.model_fields:
            loc = tuple(match.group(1).split("."))
            message = message[match.end():]
    return f"{path}{line_suffix(text, loc)}: {field_name(loc) or 'spec'}: {message}"


def _allowed_fields(loc: tuple[str, ...]) -> list[str]:
    model: type[BaseModel] = Spec
    for part in loc:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return []
    return list(model.model_fields)


def line_suffix(text: str, loc: tuple[str | int, ...]) -> str:
    """':N' for the line that sets loc (table header or key), '' when it cannot be found."""
    line = find_line(text, tuple(p for p in loc if isinstance(p, str)))
    return f":{line}" if line else ""


def find_line(text: str, loc: tuple[str, ...]) -> int | None:
    """Best-effort line number of a dotted key in TOML text (tomllib keeps no positions)."""
    if not loc:
        return None
    section: tuple[str, ...] = ()
    table_line = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.split("#", 1)[0].strip()
        header = re.match(r"^\[+\s*([^\]]+?)\s*\]+$", stripped)
        if header:
            section = tuple(p.strip().strip('"') for p in header.group(1).split("."))
            if section == loc[: len(section)] and table_line is None and len(section) == len(loc):
                table_line = number
            continue
        key = re.match(r"^([A-Za-z0-9_.\"-]+)\s*=", stripped)
        if key:
            full = section + tuple(p.strip().strip('"') for p in key.group(1).split("."))
            if full == loc[: len(full)] and len(full) >= min(len(loc), len(section) + 1):
                return number
    return table_line
