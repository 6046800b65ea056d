"""A study's spec: spec.py's checks, then the study's own `[params]` model and the fields it ignores.

It sits above both spec.py and studies/ (every study imports spec.py for its types), so neither of
those imports the other: the dependency runs one way, and this module is where the two meet.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from .spec import Spec, SpecError, describe, line_suffix, read_spec
from .studies import study_module


def load_study_spec(path: Path, quick: bool = False, study: str | None = None) -> Spec:
    """load_spec, plus, when the spec names a study (or `study` is given), its `[params]` validated
    by the study's model and any field the study would ignore refused (SpecError, one line)."""
    spec, text = read_spec(path, quick, study)
    if spec.study is None:
        return spec
    module = study_module(spec.study)
    try:
        module.Params.model_validate(spec.params)
    except ValidationError as err:
        raise SpecError(describe(err, text, path, model=module.Params, within=("params",))) from None
    # Fields the study would ignore are refused rather than silently not applied.
    for loc, why in getattr(module, "unused_fields", lambda _spec: [])(spec):
        raise SpecError(f"{path}{line_suffix(text, loc)}: {'.'.join(loc)}: {why}")
    return spec
