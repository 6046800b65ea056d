"""Finding the binaries nvmflab drives and asking them for their versions."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# name -> argument that prints a version on the first line
VERSION_FLAGS = {
    "nvmf-target": "--version",
    "nvmf-perf": "--version",
    "fio": "--version",
    "nvme": "version",
    "ip": "-V",
    "tc": "-V",
    "iperf3": "--version",
    "qemu-system-x86_64": "--version",
}
OUR_BINARIES = ("nvmf-target", "nvmf-perf")


class ToolMissing(Exception):
    pass


def find_tool(name: str) -> Path | None:
    """Our binaries: $NVMFLAB_BIN_DIR, then target/release in the checkout, then PATH."""
    if name in OUR_BINARIES:
        for folder in (os.environ.get("NVMFLAB_BIN_DIR"), REPO_ROOT / "target" / "release"):
            if folder and (Path(folder) / name).is_file() and os.access(Path(folder) / name, os.X_OK):
                return Path(folder) / name
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    path = find_tool(name)
    if path is None:
        hint = " (build it with `cargo build --release --workspace --bins` or set NVMFLAB_BIN_DIR)" \
            if name in OUR_BINARIES else ""
        raise ToolMissing(f"{name} not found{hint}")
    return path


def tool_version(path: Path, name: str) -> str | None:
    try:
        done = subprocess.run([str(path), VERSION_FLAGS.get(name, "--version")], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None


def tools_found() -> dict[str, dict[str, str | None]]:
    out: dict[str, dict[str, str | None]] = {}
    for name in VERSION_FLAGS:
        path = find_tool(name)
        out[name] = {"path": str(path) if path else None,
                     "version": tool_version(path, name) if path else None}
    return out
