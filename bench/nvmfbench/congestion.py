"""The machine's TCP congestion control, set for one bench run and put back after it.

SPDK's sockets cannot choose their congestion control, so comparing every stack under another
one than the machine's needs the sysctl itself (root). On the 2-core AMD VM the choice moved
128 KiB writes 1.4x (bench/README.md), so the bench names it in its header either way.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from nvmflab.spec import check_congestion
from nvmflab.sysstat import CONGESTION

AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"


class CongestionError(Exception):
    """The congestion control could not be set; the message says why, in one line."""


def check_name(name: str) -> str | None:
    """The name to set, or None for `system` (the machine's own), as the knob tcp_congestion reads it."""
    try:
        return None if check_congestion(name) == "system" else name
    except ValueError as err:
        raise CongestionError(f"--tcp-congestion: {err}") from None


@contextmanager
def set_for_run(name: str | None, path: str = CONGESTION, available: str = AVAILABLE) -> Iterator[str | None]:
    """Sets the machine's congestion control to `name` for the block and puts the old one back
    after it, also when the block fails or the bench gets SIGTERM. None changes nothing. Yields
    the one the machine had before."""
    try:
        before = Path(path).read_text().strip()
    except OSError as err:
        raise CongestionError(f"cannot read {path} ({err.strerror})") from None
    name = None if name is None else check_name(name)
    if name is None or name == before:
        yield before
        return
    try:
        offered = Path(available).read_text().split()
    except OSError:
        offered = []
    try:
        Path(path).write_text(name + "\n")
    except OSError as err:
        # The kernel loads a missing tcp_NAME module on demand, so the list is only a hint.
        hint = f"; this kernel offers {', '.join(offered)}" if offered else ""
        why = "needs root" if isinstance(err, PermissionError) else err.strerror or str(err)
        raise CongestionError(f"cannot set the TCP congestion control to {name!r} ({why}{hint})") from None
    previous = signal.getsignal(signal.SIGTERM)
    # SIGTERM would end the bench without running the block's cleanup: make it an exit instead.
    signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield before
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            Path(path).write_text(before + "\n")
        except OSError as err:
            raise CongestionError(f"could not put the TCP congestion control back to {before!r} ({err.strerror}): "
                                  f"sysctl -w net.ipv4.tcp_congestion_control={before}") from None


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(128 + signum)
