"""The model backend's device as arithmetic (nvmf-target's backend/model.rs): its parameters and the
bandwidth it allows, so a finding can say how close a measured path came to the device behind it.

The model: `par` media units each hold a command for `lat`, then its data crosses one link of `bw`
bytes per second, one transfer after another. With `iodepth` commands always outstanding and
nothing else in the loop, a command takes `lat + bs / bw`, so the device completes
min(iodepth / (lat + bs / bw), par / lat, bw / bs) commands per second: the bound a closed loop
reaches when the only delay is the device's own (a deterministic pipeline reaches it exactly).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..units import parse_size

# nvmf-target's defaults (ModelParams::default): 80 µs, 32 units, 3 GiB/s.
DEFAULT_LATENCY_S = 80e-6
DEFAULT_PARALLELISM = 32
DEFAULT_BANDWIDTH = float(3 << 30)
# NVMe/TCP at this share of local access or more (the interval's lower end) is "converged": the
# thesis called bandwidths "similar" by eye; 10 % leaves room for the timer slack a model device adds.
CONVERGED_SHARE = 0.9
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class DeviceModel:
    latency_s: float
    parallelism: int
    bandwidth: float | None  # bytes per second; None: no link cap

    @classmethod
    def parse(cls, text: str | None) -> DeviceModel:
        """`lat=80us,par=32,bw=3GiB` (each key optional, over nvmf-target's defaults); ValueError
        names a pair it cannot read."""
        latency, parallelism, bandwidth = DEFAULT_LATENCY_S, DEFAULT_PARALLELISM, DEFAULT_BANDWIDTH
        for pair in (p.strip() for p in (text or "").split(",") if p.strip()):
            key, _, value = (part.strip().lower() for part in pair.partition("="))
            if key in ("lat", "latency"):
                match = re.fullmatch(r"(\d+)(ns|us|ms|s)", value)
                if not match:
                    raise ValueError(f"{pair!r}: latency must be e.g. 80us")
                latency = int(match.group(1)) * _SECONDS[match.group(2)]
            elif key in ("par", "parallelism"):
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{pair!r}: parallelism must be a whole number of at least 1")
                parallelism = int(value)
            elif key in ("bw", "bandwidth"):
                bandwidth = None if value in ("none", "0") else float(parse_size(value))
            else:
                raise ValueError(f"{pair!r}: unknown model parameter (lat, par, bw)")
        return cls(latency, parallelism, bandwidth)

    def ceiling(self, bs: float, iodepth: float) -> float:
        """Bytes per second the device allows at block size `bs` with `iodepth` commands in flight."""
        transfer = bs / self.bandwidth if self.bandwidth else 0.0
        rates = [iodepth / (self.latency_s + transfer), self.parallelism / self.latency_s]
        if self.bandwidth:
            rates.append(self.bandwidth / bs)
        return min(rates) * bs

    def limit(self, bs: float, iodepth: float) -> str:
        """What sets the ceiling at this size and depth: 'link', 'media units' or 'queue depth'."""
        transfer = bs / self.bandwidth if self.bandwidth else 0.0
        rates = {"queue depth": iodepth / (self.latency_s + transfer),
                 "media units": self.parallelism / self.latency_s,
                 "link": self.bandwidth / bs if self.bandwidth else math.inf}
        return min(rates, key=rates.get)

    def text(self) -> str:
        bw = f"{self.bandwidth / (1 << 30):.3g} GiB/s link" if self.bandwidth else "no link cap"
        return f"{self.latency_s * 1e6:g} µs per command, {self.parallelism} media units, {bw}"
