"""The knob registry: one table of the spec's knobs (spec.Knobs), and how each stack sets each one.

Every knob comes from a field of `spec.Knobs` with what it controls and the side(s) of the
connection that set it, so a knob added to the spec is in the registry with nothing else to edit.
Each stack's module gives, per side, a `Setter` for each knob it has (a line for the docs and, where
the stack applies the knob through an argument list or config lines, the function that makes them)
or a `Fixed` value it always has; a knob it lacks is absent and only its default is accepted.

`apply` is how a stack turns knob values into its settings: the stack's own code calls it, so the
documented map and what is applied are the same table. `markdown` renders that table for
docs/stacks.md; `python -m nvmflab.stacks docs/stacks.md` rewrites the generated section there
(stacks/__main__.py) and test_knobs fails when the file and the table disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from .spec import Knobs

Side = Literal["target", "host"]
SIDES: tuple[Side, ...] = ("target", "host")


@dataclass(frozen=True)
class Knob:
    name: str
    what: str  # what it controls, as the docs say it
    sides: tuple[Side, ...]
    default: Any


def _registry() -> dict[str, Knob]:
    out = {}
    for name, field in Knobs.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        sides = tuple(extra.get("sides", ()))
        if not sides or any(s not in SIDES for s in sides) or not field.description:
            raise RuntimeError(f"spec.Knobs.{name}: a knob needs its description and sides (spec._knob)")
        out[name] = Knob(name, field.description, sides, field.default)
    return out


KNOBS: dict[str, Knob] = _registry()


@dataclass(frozen=True)
class Setter:
    """How a stack sets a knob: `doc` for the table; `make(value, knobs)` returns the stack's own
    words for it (argument list pieces, config lines), or None where the stack's code applies it
    outside an argument list (a module parameter, an RPC) as `doc` says."""

    doc: str
    make: Callable[[Any, dict[str, Any]], list[str]] | None = None


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


def cell(mapping: KnobMap, knob: Knob, side: Side) -> str:
    """One table cell: the setting, the fixed value, or what happens without a setting."""
    if side not in knob.sides:
        return "—"
    setting = mapping.get(knob.name)
    if isinstance(setting, Fixed):
        return f"always `{setting.value}` ({setting.why})"
    if isinstance(setting, Setter):
        return setting.doc
    return f"none: only the default `{knob.default}`"


def markdown(stacks: dict[str, Any]) -> str:
    """The per-stack knob map as a markdown table: one row per knob, a column per stack and side."""
    header = ["knob", "controls"] + [f"{name} {side}" for name in stacks for side in SIDES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for knob in KNOBS.values():
        cells = [f"`{knob.name}`", knob.what]
        cells += [cell(stack.knob_map(side), knob, side).replace("|", "\\|") for stack in stacks.values()
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
