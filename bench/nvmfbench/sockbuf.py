"""spdk_nvme_perf's TLS socket with the buffers of its plain one (bench/shim/sockbuf.c).

SPDK 24.01 gives its `ssl` socket 4 KiB send and 64 KiB receive buffers, set with setsockopt so
the kernel never grows them, and spdk_nvme_perf has no option for their size: its TLS writes
waited on delayed ACKs (128 KiB randwrite on our TLS target: 23-33 IOPS) and its TLS reads on its
window. The bench's TLS target side was fixed with SPDK's own RPC (stacks.SSL_SOCKET_BUFFERS);
for the host, a preloaded shim raises every smaller SO_RCVBUF/SO_SNDBUF request to the 2 MiB its
`posix` socket asks for, so its TLS rows measure TLS and not that stall."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "shim" / "sockbuf.c"
# SPDK's DEFAULT_SO_RCVBUF_SIZE and DEFAULT_SO_SNDBUF_SIZE, its posix socket's sizes.
FLOOR_BYTES = 2 << 20
FLOOR_VARIABLE = "NVMFBENCH_SOCKBUF_MIN"
LIBRARY = "libnvmfbench-sockbuf.so"


class ShimError(Exception):
    """The shim could not be built: no C compiler, or the compiler refused it."""


def build(directory: Path) -> Path:
    """The shim compiled into `directory` (once: an existing build is reused)."""
    library = directory / LIBRARY
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ShimError(f"no C compiler (cc) to build {SOURCE.name}, which spdk_nvme_perf's TLS runs need; "
                        "apt-get install gcc")
    directory.mkdir(parents=True, exist_ok=True)
    argv = [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE), "-ldl"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        library.unlink(missing_ok=True)
        raise ShimError(f"{' '.join(argv)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return library


def prefix(library: Path, floor_bytes: int = FLOOR_BYTES) -> list[str]:
    """What goes before a command line so that it runs with the shim preloaded."""
    return ["env", f"LD_PRELOAD={library}", f"{FLOOR_VARIABLE}={floor_bytes}"]
