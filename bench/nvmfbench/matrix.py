"""The side-by-side matrix: every target x host pair of {SPDK, ours} on every workload, in
interleaved rounds (each round visits every pair once, alternating the order, so slow drifts of
a shared machine fall on all pairs alike). With TLS rows, each round also runs every TLS target x
TLS host pair (ours and SPDK with TLS 1.3 on, one PSK) on TLS_WORKS among the plain targets, after
measuring on the target's core the AES-GCM rate that bounds them (nvmfbench.cipher). Each round
also measures our stack in event mode at QD1 and on the 128 KiB workloads (whose CPU per GiB the
report gives, in both modes), and the two ping-pong floors, so floors and stacks see the same
machine. Every run is bracketed by speed probes (nvmfbench.speed): runs from a slow phase of the machine are noisy."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import cipher, floor, speed
from .stacks import MATRIX_WORKS, TLS_SUFFIX, TLS_WORKS, Bench, BenchError, Work

EVENT = "ours-event"  # target/host label of the event-mode runs (reactor and host sleep when idle)
EVENT_WORK = MATRIX_WORKS[0]


def event_works(works: Sequence[Work]) -> list[Work]:
    """Our stack in event mode: QD1 always, and every 128 KiB workload the matrix runs."""
    return [EVENT_WORK] + [w for w in works if w.bs >= 128 << 10 and w != EVENT_WORK]


@dataclass
class Config:
    seconds: int
    ramp: int
    rounds: int
    target_core: int
    host_core: int
    targets: list[str]
    hosts: list[str]
    works: Sequence[Work] = MATRIX_WORKS
    event: bool = True
    floor: bool = True
    # Seconds the whole matrix may wait for the machine's fast phase (speed.Gate).
    wait_budget_s: float = speed.Gate.WAIT_BUDGET_S
    # TLS rows: every TLS target x TLS host ('ours-tls', 'spdk-tls') on the TLS workloads.
    tls: bool = False

    @property
    def tls_stacks(self) -> list[str]:
        """ours and spdk with TLS, where the plain matrix runs them (SPDK-spec has no TLS row)."""
        return [s + TLS_SUFFIX for s in self.hosts if s in ("ours", "spdk")] if self.tls else []

    @property
    def tls_works(self) -> list[Work]:
        return [w for w in self.works if w.name in TLS_WORKS]

    def legs(self) -> list[tuple[str, list[str], list[Work]]]:
        """(target, its hosts, their workloads): the plain targets, then the TLS ones."""
        plain = [(t, self.hosts, list(self.works)) for t in self.targets]
        tls = [(t, self.tls_stacks, self.tls_works) for t in self.tls_stacks] if self.tls_works else []
        return plain + tls


def in_turn(items: Sequence[Any], round_index: int) -> list[Any]:
    """Forward on even rounds, backward on odd ones."""
    return list(items) if round_index % 2 == 0 else list(reversed(items))


def planned_runs(cfg: Config) -> int:
    events = len(event_works(cfg.works)) if cfg.event else 0
    per_round = sum(len(hosts) * len(works) for _, hosts, works in cfg.legs()) + events + 2 * int(cfg.floor)
    return per_round * cfg.rounds


@dataclass
class Progress:
    """One line per run on stderr: i/N, what, the headline number, noise, time left."""

    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def step(self, label: str, run: dict[str, Any]) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * max(0, self.total - self.done)
        print(f"[{self.done}/{self.total}] {label}: {headline(run)} ({left:.0f} s left)", file=sys.stderr, flush=True)


def headline(run: dict[str, Any]) -> str:
    if run.get("error"):
        return f"FAILED: {run['error']}"
    if "mean_ns" in run:
        text = f"mean {run['mean_ns'] / 1000:.1f} us"
    else:
        text = f"{run['iops'] / 1000:.0f} K IOPS, {run['bw_bytes'] / 1e9:.2f} GB/s, mean {run['lat_mean_ns'] / 1000:.1f} us"
    noise = run.get("noise_pct")
    if noise is not None:
        text += f", others {noise:.0f} % of the cores" + (" (noisy)" if run.get("noisy") else "")
    return text


def run_matrix(bench: Bench, cfg: Config, progress: Progress) -> dict[str, list[dict[str, Any]]]:
    """Every round; returns {"runs": stack runs, "floor": ping-pong runs, "cipher": AES-GCM rates}."""
    runs: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    ciphers: list[dict[str, Any]] = []
    gate = speed.Gate(cfg.wait_budget_s) if bench.noise_limit_pct is not None else None
    for r in range(cfg.rounds):
        if cfg.tls_stacks and cfg.tls_works:
            # Before the round's targets start: a polling target would share the core.
            ciphers += cipher_round(bench, cfg, r, gate)
        for target_stack, hosts, works in in_turn(cfg.legs(), r):
            try:
                with bench.target(target_stack, [cfg.target_core], "poll") as target:
                    for host_stack in in_turn(hosts, r):
                        for work in works:
                            with speed.Bracket(bench, cfg.target_core, cfg.host_core, target, gate) as probes:
                                run = bench.measure(host_stack, target, work, "poll", [cfg.host_core], cfg.seconds,
                                                    cfg.ramp)
                            run |= probes.fields | {"target": target_stack, "host": host_stack, "work": work.name, "round": r}
                            runs.append(run)
                            progress.step(f"round {r + 1} {target_stack} target x {host_stack} host, {work.name}", run)
            except BenchError as err:
                for host_stack in hosts:
                    for work in works:
                        run = {"target": target_stack, "host": host_stack, "work": work.name, "round": r,
                               "error": str(err)}
                        runs.append(run)
                        progress.step(f"round {r + 1} {target_stack} target x {host_stack} host, {work.name}", run)
        for work in event_works(cfg.works) if cfg.event else []:
            run = event_run(bench, cfg, work, gate)
            runs.append(run | {"target": EVENT, "host": EVENT, "work": work.name, "round": r})
            progress.step(f"round {r + 1} ours x ours, event mode, {work.name}", run)
        if cfg.floor:
            for mode in in_turn(floor.MODES, r):
                with speed.Bracket(bench, cfg.target_core, cfg.host_core, gate=gate) as probes:
                    run = floor.pingpong(bench, mode, cfg.target_core, cfg.host_core, cfg.seconds)
                floors.append(run | probes.fields | {"mode": mode, "round": r})
                progress.step(f"round {r + 1} {mode} ping-pong", run)
    # Last: "slow" is relative to the fastest phase the whole bench saw. With the noise limit
    # off (NVMFLAB_NOISE_LIMIT_PCT=off) every run stays in the medians, probes only recorded.
    if bench.noise_limit_pct is not None:
        speed.mark_slow_phases(runs + floors)
    return {"runs": runs, "floor": floors, "cipher": ciphers, "waited_s": gate.waited if gate else 0.0}


def cipher_round(bench: Bench, cfg: Config, r: int, gate: speed.Gate | None) -> list[dict[str, Any]]:
    """The AES-GCM rates of the TLS rows' suite on the target's core, both implementations
    (nvmfbench.cipher), one line on stderr. With the gate (the noise limit on), each size and
    direction is bracketed by speed probes like a run, so bound.bound_rows can leave slow ones out."""
    core = cfg.target_core

    def bracket() -> speed.Bracket:
        return speed.Bracket(bench, core, cfg.host_core, gate=gate)

    found = cipher.measure_round(core, r, bracket=bracket if gate is not None else None)
    text = ", ".join(f"{c['op']} {c['size'] >> 10} KiB {c['impl']} "
                     + (f"{c['rate_bps'] / 1e9:.2f} GB/s" if c.get("rate_bps") else f"FAILED: {c['error']}") for c in found)
    print(f"round {r + 1} {cipher.SUITE} on core {core}: {text}", file=sys.stderr, flush=True)
    return found


def event_run(bench: Bench, cfg: Config, work: Work = EVENT_WORK, gate: speed.Gate | None = None) -> dict[str, Any]:
    """Our target and host in event mode (both sleep when idle; the default)."""
    try:
        with bench.target("ours", [cfg.target_core], "event") as target:
            with speed.Bracket(bench, cfg.target_core, cfg.host_core, target, gate) as probes:
                run = bench.measure("ours", target, work, "event", [cfg.host_core], cfg.seconds, cfg.ramp)
            return run | probes.fields
    except BenchError as err:
        return {"error": str(err)}


