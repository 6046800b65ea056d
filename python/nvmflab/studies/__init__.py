"""The built-in studies (STUDIES.md). Each module has a `Params` model for its spec's `[params]`
table and `execute(ctx, params)`, which builds the points of every leg and runs them."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from pydantic import BaseModel

STUDIES = ("polling", "overhead", "saturation", "interference", "stacks", "contention", "dimensions", "busy-poll",
           "parallelism")


def study_module(name: str) -> ModuleType:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}")
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")  # busy-poll -> busy_poll


def study_params(name: str, raw: dict[str, Any]) -> BaseModel:
    """The study's `[params]` table as its model (load_spec has already reported what is wrong)."""
    return study_module(name).Params.model_validate(raw)
