"""The knob registry: one table of the spec's knobs (spec.Knobs), and how each stack sets each one.

Every knob comes from a field of `spec.Knobs` with what it controls and the side(s) of the
connection that set it, so a knob added to the spec is in the registry with nothing else to edit.
Each stack's module gives, per side, a `Setter` for each knob it has (a line for the docs and, where
the stack applies the knob through an argument list or config lines, the function that makes them)
or a `Fixed` value it always has; a knob it lacks is absent and only its default is accepted.

`apply` is how a stack turns knob values into its settings: the stack's own code calls it, so the
documented map and what is applied are the same table. Each knob and each stack's setting also say
which transports they hold on (`transports`; default all): `transport_refusal` refuses a point that
sets one to a non-default value over another transport, by name. `markdown` renders that table for
docs/stacks.md; `python -m nvmflab.stacks docs/stacks.md` rewrites the generated section there
(stacks/__main__.py) and test_knobs fails when the file and the table disagree.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args

from .spec import Knobs

Side = Literal["target", "host"]
SIDES: tuple[Side, ...] = ("target", "host")
TRANSPORTS: tuple[str, ...] = get_args(Knobs.model_fields["transport"].annotation)

# Knobs no stack can honour over a transport other than NVMe/TCP, and why: they set a socket
# option, TCP itself or an NVMe/TCP PDU feature, and NVMe over RDMA has none of those.
_NO_SOCKET = "a socket option, and NVMe over RDMA has no socket"
TCP_ONLY: dict[str, str] = {
    "so_priority": _NO_SOCKET,
    "busy_poll_us": _NO_SOCKET,
    "tcp_congestion": "TCP's congestion control, and NVMe over RDMA does not run over TCP",
    "tls": "TLS is an NVMe/TCP feature",
    "hdr_digest": "digests are NVMe/TCP PDU fields",
    "data_digest": "digests are NVMe/TCP PDU fields",
}


@dataclass(frozen=True)
class Knob:
    name: str
    what: str  # what it controls, as the docs say it
    sides: tuple[Side, ...]
    default: Any
    transports: tuple[str, ...] = TRANSPORTS  # where any stack can honour it
    why_not: str = ""  # why not on the others


def _registry() -> dict[str, Knob]:
    stale = sorted(set(TCP_ONLY) - set(Knobs.model_fields))
    if stale:  # a renamed knob would otherwise lose its limit without a word
        raise RuntimeError(f"knobs.TCP_ONLY names {', '.join(stale)}, which spec.Knobs does not have")
    out = {}
    for name, field in Knobs.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        sides = tuple(extra.get("sides", ()))
        if not sides or any(s not in SIDES for s in sides) or not field.description:
            raise RuntimeError(f"spec.Knobs.{name}: a knob needs its description and sides (spec._knob)")
        limited = {"transports": ("tcp",), "why_not": TCP_ONLY[name]} if name in TCP_ONLY else {}
        out[name] = Knob(name, field.description, sides, field.default, **limited)
    return out


KNOBS: dict[str, Knob] = _registry()

# Target setup beyond the spec's knobs that a stack's transport may still ignore: the topology's
# target cores (one reactor each; the value is their count) and a study binding a subsystem to one
# reactor. A stack says so on its `transport` setter (`Setter.setup_tcp_only`).
SETUP: dict[str, Knob] = {
    "cores": Knob("cores", "target reactors (one per target core)", ("target",), 1),
    "placement": Knob("placement", "a subsystem bound to one reactor", ("target",), False),
}


@dataclass(frozen=True)
class Setter:
    """How a stack sets a knob: `doc` for the table; `make(value, knobs)` returns the stack's own
    words for it (argument list pieces, config lines), or None where the stack's code applies it
    outside an argument list (a module parameter, an RPC) as `doc` says."""

    doc: str
    make: Callable[[Any, dict[str, Any]], list[str]] | None = None
    transports: tuple[str, ...] | None = None  # None: every transport the knob itself has
    why_not: str = ""  # why not on the other transports (also for setup_tcp_only)
    setup_tcp_only: tuple[str, ...] = ()  # on a `transport` setter: SETUP choices honoured over TCP only


def tcp_only(setter: Setter, why: str) -> Setter:
    """`setter`, honoured by its stack over NVMe/TCP only (`why` says why not over the others)."""
    return dataclasses.replace(setter, transports=("tcp",), why_not=why)


@dataclass(frozen=True)
class Fixed:
    """The stack always behaves as `value` (SPDK's host always polls); another value is refused."""

    value: Any
    why: str


KnobMap = dict[str, "Setter | Fixed"]


def apply(mapping: KnobMap, side: Side, values: dict[str, Any]) -> list[str]:
    """The stack's settings for `values` on `side`, in registry order: every Setter's `make` called
    with its knob's value (knobs absent from `values` are left out)."""
    out: list[str] = []
    for name, knob in KNOBS.items():
        setting = mapping.get(name)
        if side in knob.sides and name in values and isinstance(setting, Setter) and setting.make:
            out += setting.make(values[name], values)
    return out


def limit(mapping: KnobMap, knob: Knob, transport: str) -> tuple[str, str] | None:
    """Where `knob` (or a SETUP choice) does not hold over `transport` for the stack side with
    `mapping`: (the transports it holds on, why not), or None where it holds."""
    if transport not in knob.transports:
        return ", ".join(knob.transports), knob.why_not
    setting = mapping.get(knob.name)
    if isinstance(setting, Setter) and setting.transports is not None and transport not in setting.transports:
        return ", ".join(setting.transports), setting.why_not
    carrier = mapping.get("transport")
    if knob.name in SETUP and isinstance(carrier, Setter) and knob.name in carrier.setup_tcp_only \
            and transport != "tcp":
        return "tcp", carrier.why_not
    return None


def _setup_values(setup: Any) -> dict[str, Any]:
    """A target setup's SETUP choices: its core count, whether a subsystem is bound to a reactor."""
    return {"cores": len(setup.cores), "placement": any(s.reactor is not None for s in setup.subsystems)}


def transport_refusal(point: Any, target_stack: Any, host_stack: Any) -> str | None:
    """Why a point cannot run as asked over its transport, or None: a knob or SETUP choice at a
    value other than its default that the knob itself (TCP_ONLY) or the stack side (`Setter.
    transports`, `setup_tcp_only`) holds over other transports only. The message names the knob,
    its value, the transport and the stack side; planning (topology/rdma.py) stores the point
    skipped, or refuses a plain sweep, with it. Only a non-default value looks at a stack's map."""
    sides = []
    if point.target is not None:
        sides.append((target_stack, "target", point.knobs, _setup_values(point.target)))
    sides += [(host_stack, "host", job.knobs, {}) for job in point.jobs]
    for stack, side, values, setup in sides:
        transport = values.get("transport", "tcp")
        asked = [(KNOBS[n], v) for n, v in values.items() if n in KNOBS and side in KNOBS[n].sides]
        asked += [(SETUP[n], v) for n, v in setup.items()]
        for knob, value in asked:
            if value == knob.default:
                continue
            everywhere = transport not in knob.transports  # no stack's map need be asked
            found = limit({} if everywhere else stack.knob_map(side), knob, transport)
            if found:
                holds, why = found
                who = "it holds" if everywhere else f"the {stack.name} {side} honours it"
                return (f"{knob.name} = {json.dumps(value, default=str)} with transport = \"{transport}\": "
                        f"{who} over {holds} only ({why})")
    return None


def cell(mapping: KnobMap, knob: Knob, side: Side) -> str:
    """One table cell: the setting, the fixed value, or what happens without a setting."""
    if side not in knob.sides:
        return "—"
    setting = mapping.get(knob.name)
    if isinstance(setting, Fixed):
        return f"always `{setting.value}` ({setting.why})"
    if isinstance(setting, Setter):
        return setting.doc + _only(mapping, knob)
    return f"none: only the default `{knob.default}`"


def _only(mapping: KnobMap, knob: Knob) -> str:
    """A stack's own transport limit on a knob the knob's own transports allow, for its cell."""
    for transport in knob.transports:
        found = limit(mapping, knob, transport)
        if found:
            return f"; over {found[0]} only ({found[1]})"
    return ""


def setup_cell(mapping: KnobMap, knob: Knob, side: Side) -> str:
    """A SETUP row's cell: where the stack side honours it over some transports only."""
    if side not in knob.sides:
        return "—"
    return _only(mapping, knob).removeprefix("; ") or "not limited by the transport"


def markdown(stacks: dict[str, Any]) -> str:
    """The per-stack knob map as a markdown table: one row per knob (with the transports it can
    hold on), a column per stack and side; then a row per SETUP choice, saying where it holds."""
    header = ["knob", "controls", "transports"] + [f"{name} {side}" for name in stacks for side in SIDES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = [(knob, cell) for knob in KNOBS.values()] + [(knob, setup_cell) for knob in SETUP.values()]
    for knob, make in rows:
        cells = [f"`{knob.name}`", knob.what, ", ".join(knob.transports)]
        cells += [make(stack.knob_map(side), knob, side).replace("|", "\\|") for stack in stacks.values()
                  for side in SIDES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- knob map: generated from python/nvmflab/knobs.py by `python -m nvmflab.stacks docs/stacks.md` -->"
END = "<!-- end of knob map -->"


def generated_section(text: str) -> str | None:
    """The generated table in a docs file's text, or None when it has no such section."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def with_section(text: str, table: str) -> str:
    """`text` with its generated section replaced by `table` (ValueError when it has none)."""
    if generated_section(text) is None:
        raise ValueError(f"no generated knob map section ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}"
