"""NVMe/TCP stacks the harness can drive. `ours` (nvmf-target + nvmf-perf) is the default;
`kernel` (nvmet + nvme-cli + fio) and `spdk` fit the same `Stack` interface."""

from __future__ import annotations

from .base import RunningTarget, Stack, StackError


def get_stack(name: str) -> Stack:
    if name == "ours":
        from .ours import OurStack

        return OurStack()
    raise StackError(f"stack {name!r} is not available; allowed: ours")


__all__ = ["RunningTarget", "Stack", "StackError", "get_stack"]
