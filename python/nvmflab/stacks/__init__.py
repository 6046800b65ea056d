"""NVMe/TCP stacks the harness can drive, one module each behind `Stack` (base.py):
`ours` (nvmf-target + nvmf-perf, the default), `kernel` (nvmet via configfs; nvme-cli + fio) and
`spdk` (nvmf_tgt via JSON-RPC; spdk_nvme_perf)."""

from __future__ import annotations

import importlib

from ..names import STACK_NAMES, module_name
from .base import Fixed, HostSession, RunningTarget, Stack, StackError

STACKS = STACK_NAMES  # each one a module here whose STACK is its Stack class


def get_stack(name: str) -> Stack:
    if name not in STACKS:
        raise StackError(f"stack {name!r} is not known; allowed: {', '.join(STACKS)}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name(name)}")
    except ImportError as err:
        raise StackError(f"stack {name!r} cannot be loaded: {err}") from None
    return module.STACK()


__all__ = ["Fixed", "HostSession", "RunningTarget", "Stack", "StackError", "STACKS", "get_stack"]
