"""`nvmflab soak`: hours of mixed load with nothing lost (issue: reliability).

One nvmf-target on loopback serves a file namespace (512-byte blocks). Several hosts, each on its
own region of the namespace, run nvmf-perf passes back to back for the whole soak: each pass writes
self-checking patterns over the region and reads them back (`--verify`), at sizes from 512 B to
1 MiB, with digests on for some hosts and off for others.
Meanwhile:
- the target is restarted on the same port and file (SIGKILL and SIGTERM in turn) during the
  first half; a pass in flight reconnects (`--reconnect-delay`, `--ctrl-loss-tmo`) and retries
  what was in flight, and the restart shows as an outage window in its report. A restart waits
  until every pass is past its first half second (a first connection is never retried, as with
  nvme-cli), and a pass that still could not connect because of a restart is started again;
- hostile clients open connections that send garbage, stop in the middle of a PDU, or never
  speak, a few per second;
- the target's resident memory is sampled every second. The second half has no restarts, so its
  samples after a warm-up show whether memory stays flat.

It passes with 0 verify errors (every host exits 0 with its blocks read back correct), 0 crashes
(the target never exits unless told to, and never panics) and memory flat: the RSS at the end of
the quiet half at most `max(16 MiB, 20 %)` above its level after the warm-up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tools import require_tool

NQN = "nqn.2024-01.io.nvmflab:soak"
BLOCK_SIZE = 512
MiB = 1 << 20
FLAT_SLACK_BYTES = 16 * MiB
FLAT_SLACK_RATIO = 0.20
# A restart waits until every pass is this old, so that it hits passes past their first connection
# (never retried, as with nvme-cli) but still running I/O. A pass that dies before UNCONNECTED_S
# while a restart happened could only have been connecting: its first reconnect attempt comes
# --reconnect-delay (0.5 s) after a loss at CONNECT_GRACE_S or later.
CONNECT_GRACE_S = 0.5
UNCONNECTED_S = 0.9

# (rw, bs, iodepth, digests, region): every size from 512 B to 1 MiB, digests on and off; each host
# owns `region` bytes of the namespace, enough for passes of seconds that a restart can interrupt
WORKLOADS = [
    ("randrw", "512", 8, (), 16 * MiB),
    ("randrw", "4k", 16, ("--hdr_digest", "--data_digest"), 64 * MiB),
    ("write", "128k", 4, ("--data_digest",), 512 * MiB),
    ("randrw", "1m", 2, (), 1024 * MiB),
    ("randrw", "8k", 32, ("--hdr_digest",), 64 * MiB),
    ("write", "64k", 8, (), 256 * MiB),
]


@dataclass
class SoakResult:
    seconds: float
    hosts: list[dict[str, Any]] = field(default_factory=list)
    restarts: int = 0
    crashes: list[str] = field(default_factory=list)
    hostile: dict[str, int] = field(default_factory=dict)
    rss: list[tuple[float, int, int]] = field(default_factory=list)  # (t, incarnation, bytes)
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        out = [f"host {h['index']} ({h['workload']}): {h['error']}" for h in self.hosts if h.get("error")]
        out += [f"target crash: {c}" for c in self.crashes]
        if not self.memory.get("flat", False):
            out.append(f"memory not flat: {self.memory.get('detail', 'no samples')}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "hosts": self.hosts, "restarts": self.restarts, "crashes": self.crashes,
                "hostile_connections": self.hostile, "memory": self.memory, "failures": self.failures,
                "rss_samples": [{"t_s": round(t, 1), "incarnation": i, "rss_bytes": b} for t, i, b in self.rss]}


def memory_flat(samples: list[tuple[float, int, int]], quiet_from: float, warmup_s: float) -> dict[str, Any]:
    """Whether RSS stayed flat over the quiet period's last incarnation, after its warm-up."""
    last = max((i for t, i, _ in samples if t >= quiet_from), default=None)
    mine = [(t, b) for t, i, b in samples if i == last and t >= quiet_from]
    if len(mine) < 3:
        return {"flat": False, "detail": f"only {len(mine)} RSS samples in the quiet period"}
    start = mine[0][0] + warmup_s
    after = [b for t, b in mine if t >= start]
    if len(after) < 2:
        return {"flat": False, "detail": f"the quiet period is shorter than the {warmup_s:.0f} s warm-up"}
    base, end, peak = after[0], after[-1], max(after)
    allowed = max(FLAT_SLACK_BYTES, int(base * FLAT_SLACK_RATIO))
    flat = peak - base <= allowed
    return {"flat": flat, "after_warmup_bytes": base, "end_bytes": end, "peak_bytes": peak,
            "allowed_growth_bytes": allowed,
            "detail": f"RSS {base / 2**20:.1f} MiB after warm-up, peak {peak / 2**20:.1f} MiB, end "
                      f"{end / 2**20:.1f} MiB (growth allowed {allowed / 2**20:.1f} MiB)"}


class Target:
    """nvmf-target on 127.0.0.1:port with the soak's file; restartable on the same port and file."""

    def __init__(self, binary: str, port: int, path: Path, log: Path):
        self.binary, self.port, self.path, self.log = binary, port, path, log
        self.proc: subprocess.Popen | None = None
        self.incarnation = 0

    def start(self) -> None:
        argv = [self.binary, "--listen", f"127.0.0.1:{self.port}", "--nqn", NQN, "--ns", f"file:{self.path}",
                "--block-size", str(BLOCK_SIZE), "--stall-timeout-ms", "2000"]
        deadline = time.monotonic() + 20
        while True:  # the port may linger a moment after a kill
            with open(self.log, "a") as log:
                self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                             start_new_session=True)
            line = self.proc.stdout.readline()
            if line.startswith("ready"):
                self.incarnation += 1
                return
            self.proc.wait(timeout=10)
            if time.monotonic() > deadline:
                raise RuntimeError(f"nvmf-target did not start (see {self.log}): {line.strip()!r}")
            time.sleep(0.3)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def rss(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


class Hostile(threading.Thread):
    """A few hostile connections per second until stopped: garbage, half PDUs, silence."""

    KINDS = ("garbage", "half_pdu", "silent", "bad_icreq")

    def __init__(self, port: int, per_second: float, seed: int, max_open: int = 32):
        super().__init__(daemon=True)
        self.port, self.per_second, self.max_open = port, per_second, max_open
        self.random = random.Random(seed)
        self.counts = {k: 0 for k in self.KINDS} | {"refused": 0}
        self.halt = threading.Event()
        self.held: list[tuple[float, socket.socket]] = []

    def run(self) -> None:
        while not self.halt.wait(1 / self.per_second):
            now = time.monotonic()
            for opened, sock in [h for h in self.held if now - h[0] > 5]:  # bounded: released after 5 s
                sock.close()
            self.held = [h for h in self.held if now - h[0] <= 5]
            if len(self.held) >= self.max_open:
                continue
            kind = self.random.choice(self.KINDS)
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
            except OSError:
                self.counts["refused"] += 1  # the target is restarting
                continue
            try:
                sock.sendall(self.payload(kind))
            except OSError:
                pass
            self.counts[kind] += 1
            if kind == "garbage":
                sock.close()
            else:
                self.held.append((now, sock))
        for _, sock in self.held:
            sock.close()

    def payload(self, kind: str) -> bytes:
        if kind == "garbage":
            return self.random.randbytes(self.random.randint(1, 4096))
        icreq = struct.pack("<BBBBI", 0x00, 0, 128, 0, 128) + struct.pack("<HBBI", 0, 0, 0, 0) + bytes(112)
        if kind == "half_pdu":
            return icreq[: self.random.randint(1, len(icreq) - 1)]
        if kind == "bad_icreq":  # a header that claims a huge PDU, then stops
            return struct.pack("<BBBBI", 0x00, 0, 128, 0, 0x7FFFFFFF) + bytes(16)
        return b""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HostLoop(threading.Thread):
    """One host: nvmf-perf write+verify passes over its region, back to back, until `until`."""

    def __init__(self, index: int, perf: str, port: int, until: float, workdir: Path, target_up: threading.Event,
                 restarts: list[int]):
        super().__init__(daemon=True)
        self.index, self.perf, self.port, self.until, self.workdir = index, perf, port, until, workdir
        self.target_up, self.restarts = target_up, restarts
        rw, bs, qd, digests, region = WORKLOADS[index]
        offset = sum(w[4] for w in WORKLOADS[:index])
        self.workload = f"{rw} {bs} QD{qd}{' ' + ' '.join(digests) if digests else ''}"
        self.argv = [perf, "run", "-a", "127.0.0.1", "-s", str(port), "-n", NQN, "--rw", rw, "--bs", bs,
                     "--iodepth", str(qd), "--offset", str(offset), "--size", str(region), "--verify",
                     "--reconnect-delay", "0.5", "--ctrl-loss-tmo", "60", "--log_avg_msec", "0", "-o", "json",
                     *digests]
        self.outcome: dict[str, Any] = {"index": index, "workload": self.workload, "passes": 0, "ios": 0,
                                        "verified_ios": 0, "retried_ios": 0, "outages": [], "unconnected_passes": 0}
        self.proc: subprocess.Popen | None = None
        self.halt = threading.Event()
        self.connecting_until = 0.0  # a pass is still making its first connection until then

    def run(self) -> None:
        while not self.halt.is_set() and time.monotonic() < self.until - 1:
            if not self.target_up.wait(timeout=1):
                continue
            restarts_before = self.restarts[0]
            report, log = self.workdir / f"host{self.index}.json", self.workdir / f"host{self.index}.log"
            started = time.monotonic()
            self.connecting_until = started + CONNECT_GRACE_S
            with open(log, "w") as out:
                self.proc = subprocess.Popen(self.argv + ["--output", str(report)], stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = self.proc.wait(timeout=max(5.0, self.until - time.monotonic() + 120))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                code = self.proc.wait(timeout=10)
                self.outcome["error"] = "a pass did not finish within 2 minutes of the soak's end; killed"
                return
            tail = _last_line(log)
            connecting = time.monotonic() - started < UNCONNECTED_S or "cannot connect" in tail
            if code != 0 and connecting and self.restarts[0] != restarts_before:
                self.outcome["unconnected_passes"] += 1  # its first connection met the restart
                continue
            done = host_outcome(self.index, self.workload, report, code, log)
            self.outcome["passes"] += 1
            for key in ("ios", "verified_ios", "retried_ios"):
                self.outcome[key] += done.get(key, 0)
            self.outcome["outages"] += done.get("outages", [])
            if done.get("error"):
                self.outcome["error"] = f"pass {self.outcome['passes']}: {done['error']}"
                return

    def stop(self) -> None:
        self.halt.set()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def run_soak(minutes: float, workdir: Path, hosts: int = 4, restart_every_s: float = 30.0,
             hostile_per_s: float = 4.0, seed: int = 1, progress=print) -> SoakResult:
    if not 0.5 <= minutes <= 24 * 60:
        raise ValueError("minutes must be between 0.5 and 1440")
    if not 1 <= hosts <= len(WORKLOADS):
        raise ValueError(f"hosts must be between 1 and {len(WORKLOADS)}")
    seconds = minutes * 60
    workdir.mkdir(parents=True, exist_ok=True)
    target_bin, perf_bin = str(require_tool("nvmf-target")), str(require_tool("nvmf-perf"))
    path = workdir / "soak.img"
    with open(path, "wb") as f:
        f.truncate(sum(w[4] for w in WORKLOADS[:hosts]))
    (workdir / "target.log").write_text("")
    port = free_port()
    target = Target(target_bin, port, path, workdir / "target.log")
    target.start()
    result = SoakResult(seconds=seconds)
    started = time.monotonic()
    target_up, restarts = threading.Event(), [0]
    target_up.set()
    loops = [HostLoop(i, perf_bin, port, started + seconds, workdir, target_up, restarts) for i in range(hosts)]
    for loop in loops:
        loop.start()
    hostile = Hostile(port, hostile_per_s, seed)
    hostile.start()
    quiet_from = seconds / 2
    next_restart, next_note = restart_every_s, 0.0
    signals = [signal.SIGKILL, signal.SIGTERM]
    try:
        while any(loop.is_alive() for loop in loops) and time.monotonic() - started < seconds + 150:
            t = time.monotonic() - started
            code = target.exited()
            if code is not None:  # not ours to have stopped it
                result.crashes.append(f"exited {code} at {t:.0f} s (log {target.log})")
                target.start()
            rss = target.rss()
            if rss is not None:
                result.rss.append((t, target.incarnation, rss))
            if next_restart <= t < quiet_from:
                sig = signals[result.restarts % 2]
                progress(f"soak: {t:.0f} s: restarting the target ({signal.Signals(sig).name})")
                target_up.clear()
                # no pass may be in its first connection (never retried, as with nvme-cli): the
                # restart must hit passes that are running I/O
                deadline = time.monotonic() + CONNECT_GRACE_S + 1
                while any(loop.connecting_until > time.monotonic() for loop in loops) and time.monotonic() < deadline:
                    time.sleep(0.05)
                restarts[0] += 1
                target.stop(sig)
                time.sleep(0.5)
                target.start()
                target_up.set()
                result.restarts += 1
                next_restart += restart_every_s
            if t >= next_note:
                passes = sum(loop.outcome["passes"] for loop in loops)
                progress(f"soak: {t:.0f} s of {seconds:.0f} s, {passes} passes verified, "
                         f"target RSS {(rss or 0) / 2**20:.1f} MiB")
                next_note += 30
            time.sleep(1)
    finally:
        hostile.halt.set()
        hostile.join(timeout=10)
        for loop in loops:
            loop.stop()
            loop.join(timeout=15)
        target.stop(signal.SIGTERM)
    if "panicked" in target.log.read_text(errors="replace"):
        result.crashes.append(f"a panic in {target.log}")
    result.hostile = dict(hostile.counts)
    result.hosts = [loop.outcome for loop in loops]
    for host in result.hosts:
        if not host.get("error") and host["passes"] == 0:
            host["error"] = "no pass completed"
    result.memory = memory_flat(result.rss, quiet_from, warmup_s=min(30.0, seconds / 8))
    return result


def _last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else ""


def host_outcome(index: int, workload: str, report: Path, code: int | None, log: Path) -> dict[str, Any]:
    outcome: dict[str, Any] = {"index": index, "workload": workload, "exit": code}
    try:
        doc = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError) as err:
        outcome["error"] = f"exit {code}, no report ({err}): {_last_line(log)}"
        return outcome
    own = doc.get("nvmflab", {})
    jobs = doc.get("jobs", [{}])
    outcome |= {"ios": sum(int(j.get(d, {}).get("total_ios", 0)) for j in jobs for d in ("read", "write")),
                "verified_ios": sum(int(j.get("verified_ios") or 0) for j in own.get("jobs", [])),
                "retried_ios": sum(int(j.get("retried_ios") or 0) for j in own.get("jobs", [])),
                "outages": own.get("outages", [])}
    if code != 0:
        outcome["error"] = f"exit {code}: {_last_line(log)}"
    elif outcome["verified_ios"] == 0:
        outcome["error"] = "no I/O was read back and checked"
    return outcome
