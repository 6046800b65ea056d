"""The built-in studies (STUDIES.md). Each module has a `Params` model for its spec's `[params]`
table and `execute(ctx, params)`, which builds the points of every leg and runs them."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from ..names import STUDY_NAMES, module_name

STUDIES = STUDY_NAMES


def study_module(name: str) -> ModuleType:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}")
    return importlib.import_module(f"{__name__}.{module_name(name)}")


def study_params(name: str, raw: dict[str, Any]) -> BaseModel:
    """The study's `[params]` table as its model (load_spec has already reported what is wrong)."""
    return study_module(name).Params.model_validate(raw)
