"""Backing files for file namespaces and local jobs, made on the host that uses them.

A study names its files under the results directory's `work/` on the controlling machine. The
runner makes each file on the host that opens it (the target host for a namespace, the initiator
for a local job) just before the point runs; on an SSH host such a path moves into the host's
own work directory, which closing the host removes. A path the user gave (`[backend] path`) is
used where it is and never overwritten: it is created when missing, and refused when it is a
regular file smaller than the backend size.
"""

from __future__ import annotations

from pathlib import Path

from .topology.base import Host, HostError

# $1 path, $2 size in bytes, $3 1 when the harness owns the file (may rewrite it to the right size).
# The pattern is written, not left as holes or zeros, so reads cost what reads of data cost.
ENSURE_FILE = r"""p="$1"; n="$2"; owned="$3"
if [ -e "$p" ]; then
  [ -f "$p" ] || exit 0
  have=$(stat -c %s "$p")
  [ "$have" = "$n" ] && exit 0
  if [ "$owned" != 1 ]; then
    [ "$have" -ge "$n" ] && exit 0
    echo "$p holds $have bytes, fewer than the backend size $n; give a bigger file or a smaller size" >&2
    exit 3
  fi
fi
mkdir -p "$(dirname "$p")" || exit 1
yes nvmflab-backing-file | head -c "$n" > "$p.part" && mv -f "$p.part" "$p"
"""


def place_file(host: Host, path: str, size: int, work_dir: Path) -> str:
    """Make the backing file `path` (`size` bytes) on `host`; the path it has there."""
    owned = _owned(path, work_dir)
    there = f"{host.workdir()}/files/{Path(path).name}" if owned and host.remote else path
    done = host.run(["sh", "-c", ENSURE_FILE, "sh", there, str(int(size)), "1" if owned else "0"],
                    timeout=600, check=False)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise HostError(f"{host.name}: cannot make the backing file {there}: "
                        f"{message[-1] if message else f'exit {done.returncode}'}")
    return there


def _owned(path: str, work_dir: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(work_dir).resolve())
    except ValueError:
        return False
    return True
