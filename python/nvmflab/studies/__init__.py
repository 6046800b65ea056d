"""The built-in studies (STUDIES.md). Each module has a `Params` model for its spec's `[params]`
table and `execute(ctx, params)`, which builds the points of every leg and runs them."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

STUDIES = ("polling", "overhead", "saturation", "interference")


def study_module(name: str) -> ModuleType:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def study_params(name: str, raw: dict[str, Any]) -> BaseModel:
    """The study's params validated; ValueError names the field and what is allowed."""
    model = study_module(name).Params
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            return_msg = f"unknown field; allowed: {', '.join(model.model_fields)}"
        else:
            return_msg = f"{first['msg']} (got {first.get('input')!r})"
        raise ValueError(f"{field}: {return_msg}") from None
