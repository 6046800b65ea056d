"""NVMe/TCP stacks the harness can drive, one module each behind `Stack` (base.py):
`ours` (nvmf-target + nvmf-perf, the default), `kernel` (nvmet via configfs; nvme-cli + fio) and
`spdk` (nvmf_tgt via JSON-RPC; spdk_nvme_perf)."""

from __future__ import annotations

import importlib

from .base import Fixed, HostSession, RunningTarget, Stack, StackError

STACKS = {"ours": "OurStack", "kernel": "KernelStack", "spdk": "SpdkStack"}


def get_stack(name: str) -> Stack:
    if name not in STACKS:
        raise StackError(f"stack {name!r} is not known; allowed: {', '.join(STACKS)}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ImportError as err:
        raise StackError(f"stack {name!r} cannot be loaded: {err}") from None
    return getattr(module, STACKS[name])()


__all__ = ["Fixed", "HostSession", "RunningTarget", "Stack", "StackError", "STACKS", "get_stack"]
