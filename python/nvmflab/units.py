"""Sizes as nvmf-perf and fio write them: 512, 4k, 128k, 1m, 64MiB, 1GiB (all powers of 1024)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(value: int | str) -> int:
    """Bytes from an int or a size string; ValueError names the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: use bytes or 512, 4k, 128k, 1m, 64MiB, 1GiB")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size must be positive, got {value}")
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"invalid size {value!r}: use bytes or 512, 4k, 128k, 1m, 64MiB, 1GiB")
    number = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if number <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return number


def format_size(nbytes: int) -> str:
    """The shortest exact spelling nvmf-perf accepts (4096 -> '4k', 1048576 -> '1m')."""
    for suffix, factor in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return str(nbytes)
