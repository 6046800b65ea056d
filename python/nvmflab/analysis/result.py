"""What a study's analysis hands to the report: tables, figures, findings, recommendations."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from matplotlib.figure import Figure as MplFigure


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    caption: str = ""


@dataclass
class Figure:
    """A matplotlib figure with a file-safe `name` (used for figures/<name>.png)."""

    name: str
    figure: MplFigure
    caption: str = ""

    def __post_init__(self) -> None:
        # What the plot noted about itself (an interval cut at zero, a sweep not drawn): the caption says it.
        from ..plots import notes

        extra = [n for n in notes(self.figure) if n not in self.caption]
        self.caption = " ".join([self.caption.strip(), *extra]).strip()


@dataclass
class StudyResult:
    study: str
    title: str
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    recommendations: pd.DataFrame | None = None
    # Points left out of the analysis (failed runs, broken invariants), one row each.
    excluded: pd.DataFrame | None = None
