"""The arguments that put one loopback pair of ours on TLS 1.3: the target requires it and admits
one host NQN with a PSK, nvmf-perf connects as that host with the same key (bench/ab.py --tls,
bench/callgrind.py's -tls works)."""

from __future__ import annotations


def tls_args(key: str, hostnqn: str) -> tuple[list[str], list[str]]:
    """nvmf-target's and nvmf-perf's extra arguments for PSK `key` and host `hostnqn`."""
    return ["--tls", "required", "--tls-key", f"{hostnqn}={key}"], ["--tls-key", key, "-q", hostnqn]
