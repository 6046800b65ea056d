"""spdk_nvme_perf's TLS socket with the buffers of its plain one (spdk_sockbuf.c, preloaded).

SPDK 24.01 gives its `ssl` socket 4 KiB send and 64 KiB receive buffers, set with setsockopt so
the kernel never grows them (`g_ssl_impl_opts` in module/sock/posix/posix.c). Its target can be
told otherwise (`sock_impl_set_options -i ssl`, spdk.SSL_SOCKET_BUFFERS); spdk_nvme_perf cannot:
it reads no configuration, and its options do not reach the sizes. Its TLS writes then wait on
delayed ACKs (128 KiB randwrite on our TLS target: 23-33 IOPS) and its TLS reads on its window
(bench/README.md). A shim preloaded into it raises every smaller SO_RCVBUF/SO_SNDBUF request to
the 2 MiB its `posix` socket asks for, so that a TLS point measures TLS and not that stall. It is
compiled with the host's `cc` into the host's working directory."""

from __future__ import annotations

from pathlib import Path

from ..topology.base import Host, HostError
from .base import StackError

SOURCE = Path(__file__).with_name("spdk_sockbuf.c")
# SPDK's DEFAULT_SO_RCVBUF_SIZE and DEFAULT_SO_SNDBUF_SIZE: its posix socket's sizes.
FLOOR_BYTES = 2 << 20
FLOOR_VARIABLE = "NVMFLAB_SOCKBUF_MIN"
LIBRARY = "libnvmflab-sockbuf.so"
# $1 the source's path, $2 the library's; the source comes on stdin. A library already built in
# this working directory is reused; a failed build leaves none behind.
_BUILD = ('test -f "$2" && exit 0; cat > "$1" && cc -shared -fPIC -O2 -o "$2" "$1" -ldl && exit 0; '
          'rm -f "$2"; exit 1')


def build(host: Host) -> str:
    """The shim's path on `host`, compiled there on first use."""
    folder = host.workdir()
    library = f"{folder}/{LIBRARY}"
    try:
        host.run(["sh", "-c", _BUILD, "sh", f"{folder}/{SOURCE.name}", library], timeout=120, input=SOURCE.read_text())
    except HostError as err:
        raise StackError(f"spdk_nvme_perf over TLS needs {SOURCE.name} compiled on {host.name} to lift SPDK's "
                         f"4 KiB ssl socket buffers, and that failed (a C compiler: apt-get install gcc): {err}") from None
    return library


def prefix(library: str, floor_bytes: int = FLOOR_BYTES) -> list[str]:
    """What goes before a command line so that it runs with the shim preloaded."""
    return ["env", f"LD_PRELOAD={library}", f"{FLOOR_VARIABLE}={floor_bytes}"]
