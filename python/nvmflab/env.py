"""The machine a run happened on: stored with every run, printed by `nvmflab env`."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from typing import Any

from .cores import available_cores
from .tools import REPO_ROOT, tools_found


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def git_rev() -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def collect() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_allowed": available_cores(),
        "kernel": platform.release(),
        "memory_bytes": memory_bytes(),
        "python": platform.python_version(),
        "tools": tools_found(),
        "git_rev": git_rev(),
    }
