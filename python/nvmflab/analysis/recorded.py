"""What the analyses and findings_data.py share, in one module both import at the top (issue 38:
before, analysis/common.py and findings_data.py imported each other inside functions): the marker
a finding that passed no test carries, and the notes a comparison leaves when its text is written
while a study is analysed (findings_data reads them back as the finding's evidence)."""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any

# What a finding that passed no test carries in its text (findings_data reads it back).
DESCRIPTIVE = "(descriptive, not tested)"

_NOTES: contextvars.ContextVar[list | None] = contextvars.ContextVar("nvmflab_finding_notes", default=None)


@contextmanager
def recording():
    """Collect the (Difference, text) pairs written while the block runs (one study's analysis)."""
    notes: list = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note(difference: Any, text: str) -> None:
    """Called by Difference.text/interval: remember that `text` was written for `difference`."""
    notes = _NOTES.get()
    if notes is not None and text:
        notes.append((difference, text))
