"""The names of the stacks and studies, said once: spec validation, the command line, the
environment report and the report's analyzers are built from these.

A leaf module (it imports nothing of nvmflab), so spec.py, stacks/ and studies/ can all use it
without importing each other. Each stack NAME is stacks/NAME.py; each study NAME is
studies/NAME.py and analysis/NAME.py with `-` written `_` (busy-poll -> busy_poll).
"""

from __future__ import annotations

STACK_NAMES = ("ours", "kernel", "spdk")  # ours first: the default
STUDY_NAMES = ("polling", "overhead", "saturation", "interference", "stacks", "contention", "dimensions",
               "busy-poll", "parallelism", "security", "transports")  # `study all` runs them in this order
# Studies `study all` leaves out: their quick variant alone would add more than ~30 s to `make run`.
NOT_IN_ALL = ("transports",)
IN_ALL = tuple(name for name in STUDY_NAMES if name not in NOT_IN_ALL)


def module_name(name: str) -> str:
    """The Python module of a stack or study name (busy-poll -> busy_poll)."""
    return name.replace("-", "_")
