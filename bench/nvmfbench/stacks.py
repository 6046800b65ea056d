"""Targets and load generators of both stacks, started through the harness's own stack drivers
(nvmflab.stacks: our TOML config and ready line, SPDK's nvmf_tgt over rpc.py with --no-huge,
spdk_nvme_perf's text report), with each run's noise window from nvmflab.sysstat."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from nvmflab import metrics, sysstat
from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.spec import Knobs, Workload
from nvmflab.stacks import RunningTarget, StackError, get_stack
from nvmflab.stacks import spdk as spdk_stack
from nvmflab.stacks import spdk_sockbuf
from nvmflab.stacks.ours import TLS_HOSTNQN
from nvmflab.tlskey import random_key
from nvmflab.topology.base import HostError
from nvmflab.topology.local import LocalHost

NQN = "nqn.2024-01.io.nvmflab:bench"
NULL_SIZE = 1 << 30
GRACE_S = 30.0  # start-up (DPDK init under --no-huge) and tear-down on top of ramp + runtime


@dataclass(frozen=True)
class Work:
    name: str
    rw: str
    bs: int
    iodepth: int
    numjobs: int = 1

    @property
    def key(self) -> str:
        """The short name `--works` takes, e.g. 4k-randread-qd32."""
        return f"{self.bs // 1024}k-{self.rw}-qd{self.iodepth}"


MATRIX_WORKS = (
    Work("4k randread QD1", "randread", 4096, 1),
    Work("4k randread QD32", "randread", 4096, 32),
    Work("4k randread QD128", "randread", 4096, 128),
    Work("4k randwrite QD32", "randwrite", 4096, 32),
    Work("128k randread QD32", "randread", 131072, 32),
    Work("128k randwrite QD32", "randwrite", 131072, 32),
)
GIB = 1 << 30

# The TLS rows (issue 20 item 5, writes from issue 40): each stack with TLS 1.3 on (a PSK made per
# bench, the host NQN the target gives it to), on the workloads the issues' goals name. A label is
# the stack plus TLS_SUFFIX.
TLS_SUFFIX = "-tls"
TLS_WORKS = ("4k randread QD1", "4k randread QD32", "4k randwrite QD32", "128k randread QD32", "128k randwrite QD32")


def tls_stack(label: str) -> tuple[str, bool]:
    """'ours-tls' -> ('ours', True); 'spdk' -> ('spdk', False)."""
    return (label[: -len(TLS_SUFFIX)], True) if label.endswith(TLS_SUFFIX) else (label, False)


def spdk_missing() -> str | None:
    """Why SPDK cannot run here, or None when its build is found."""
    if spdk_stack.spdk_dir(LocalHost()) is None:
        return f"no SPDK build found; {spdk_stack.BUILD_HINT}"
    return None


class Bench:
    """This machine, a scratch directory, and a counter naming each run's files."""

    def __init__(self, workdir: Path, noise_limit_pct: float | None):
        self.workdir = workdir
        self.host = LocalHost(workdir=workdir)
        self.noise_limit_pct = noise_limit_pct
        self.count = 0
        # One PSK for the whole bench, in a file only we can read (SPDK refuses any other).
        self.tls_key = random_key()
        self.psk_path = workdir / "tls-psk.txt"
        self.psk_path.write_text(self.tls_key)
        self.psk_path.chmod(0o600)

    @contextlib.contextmanager
    def target(self, stack: str, cores: list[int], mode: str) -> Iterator[RunningTarget]:
        """A target with one null namespace, its reactors on `cores`, stopped on exit. A TLS label
        ('ours-tls', 'spdk-tls') gives a port that requires TLS with the bench's PSK."""
        base, tls = tls_stack(stack)
        setup = TargetSetup(cores=tuple(cores), mode=mode, idle_poll_us=0, in_capsule_data_size=8192,
                            so_priority=0, tos=0, busy_poll_us=0,
                            subsystems=(Subsystem(NQN, "null", NULL_SIZE),),
                            tls="on" if tls else "off", tls_key=self.tls_key if tls else None)
        try:
            with spdk_transport_args(spdk_transport_extra(base), self.psk_path if tls else None):
                running = get_stack(SPDK if base == SPDK_SPEC else base).start_target(setup, self.host, self.workdir)
        except (StackError, HostError) as err:
            raise BenchError(f"{stack} target did not start: {err}") from None
        try:
            yield running
        finally:
            running.stop()

    def measure(self, host_stack: str, target: RunningTarget, work: Work, completion: str, cpus: list[int],
                seconds: int, ramp: int) -> dict[str, Any]:
        """One load-generator run against `target`; the summary plus the noise of its window.
        A failed run comes back with "error" set instead of raising, so a round goes on."""
        self.count += 1
        base, tls = tls_stack(host_stack)
        knobs = (Workload(rw=work.rw, bs=work.bs, iodepth=work.iodepth, numjobs=work.numjobs).model_dump()
                 | Knobs(completion=completion, tls="on" if tls else "off").model_dump())
        job = PerfJob(role="main", knobs=knobs, cpus=tuple(cpus), nqn=NQN, hostnqn=TLS_HOSTNQN if tls else None)
        output = str(self.workdir / f"run-{self.count}.out")
        log = self.workdir / f"run-{self.count}.log"
        cores = sorted(set(cpus) | set(target.setup.cores))
        try:
            session = get_stack(base).open_host(job, target, self.host, self.workdir)
            argv = session.perf_argv(seconds, ramp, output)
        except (StackError, HostError) as err:
            return {"error": str(err)}
        if tls:
            argv += tls_host_args(base, target, self.psk_path, argv)
        target_before = target.cpu_seconds() or (0.0, 0.0)
        before = sysstat.local_snapshot(cores)
        proc = self.host.spawn(argv, cpus, log)
        try:
            code, usr, sys_ = proc.wait(seconds + ramp + GRACE_S)
        finally:
            proc.stop()
            session.close()
        after = sysstat.local_snapshot(cores)
        target_after = target.cpu_seconds() or (0.0, 0.0)
        if code is None:
            return {"error": f"{Path(argv[0]).name} still running {seconds + ramp + GRACE_S:.0f} s after start"}
        if code != 0:
            return {"error": f"{host_stack} host exited {code}: {last_line(log)}"}
        try:
            summary = metrics.summarize(session.parse_output(self.host.read_text(output)))
        except (StackError, HostError, KeyError, ValueError) as err:
            return {"error": f"{host_stack} host report unreadable: {err}"}
        experiment = usr + sys_ + sum(target_after) - sum(target_before)
        noise = self.noise(before, after, cores, experiment,
                           {"target": sorted(target.setup.cores), "host": sorted(cpus)})
        measured = {k: summary.get(k) for k in ("iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns", "lat_p99_99_ns")}
        # The whole histogram, so that a cell's p99.99 can be taken over all its runs' samples.
        measured["histogram"] = json.loads(summary.get("histogram_json") or "[]")
        target_usr, target_sys = (a - b for a, b in zip(target_after, target_before))
        cpu = {"host_cpu_s": round(usr + sys_, 3), "target_cpu_s": round(target_usr + target_sys, 3)}
        # Over TLS the harness preloads spdk_nvme_perf with its ssl socket's buffers raised (spdk_sockbuf).
        raised = {"host_sockbuf": spdk_sockbuf.FLOOR_BYTES} if tls and base in (SPDK, SPDK_SPEC) else {}
        return measured | cpu | cpu_per_gib(usr, sys_, target_usr, target_sys, measured.get("bw_bytes"),
                                            seconds + ramp) | noise | raised

    def noise(self, before: sysstat.Snapshot, after: sysstat.Snapshot, cores: list[int], experiment_cpu_s: float,
              roles: dict[str, list[int]]) -> dict[str, Any]:
        """The CPU time others used on `cores` in the window, and whether that makes it noisy."""
        window = sysstat.window(before, after, cores, experiment_cpu_s)
        found = sysstat.summarize({"local": window}, self.noise_limit_pct, {"local": roles})
        return {k: found[k] for k in ("noise_pct", "outside_cpu_s", "steal_s", "noisy")}


SPDK = "spdk"
# SPDK's target with C2HData SUCCESS as the NVMe/TCP specification allows it: only to a host that
# disabled SQ flow control in Connect. SPDK's default (c2h_success) sets it on every read that ends
# without a result, which spares each read a CapsuleResp. Our target and Linux nvmet follow the
# specification, and neither spdk_nvme_perf nor nvmf-perf disables SQ flow control, so this target
# shows how much of a gap is that shortcut. A target only: its hosts are the usual two.
SPDK_SPEC = "spdk-spec"

# SPDK's TCP transport defaults to 128 entries per queue (MQES 127), one short of a QD128 queue
# (SQSIZE = depth + 1 entries); ours allows 1024. The bench asks SPDK for as many entries as it
# needs so both targets run the same workloads.
SPDK_MAX_QUEUE_DEPTH = 256


def tls_host_args(host_stack: str, target: RunningTarget | None, psk_path: Path, argv: list[str]) -> list[str]:
    """What a TLS host adds to its command line `argv`, unless it is there already. spdk_nvme_perf:
    its `ssl` socket and the PSK file (the harness's SPDK stack gives both with the knob, and its
    socket buffer shim, so nothing is added to its argv). nvmf-perf already has --tls from the knob;
    on SPDK 24.01's target it must offer a version 0 identity, the only one SPDK accepts
    (tests/spdk/test_spdk_tls.py)."""
    if host_stack in (SPDK, SPDK_SPEC):
        return [] if "-S" in argv else ["-S", "ssl", "--psk-path", str(psk_path)]
    if target is not None and get_stack_name(target) == SPDK and "--tls-key-identity" not in argv:
        return ["--tls-key-identity", "0"]
    return []


def get_stack_name(target: RunningTarget) -> str:
    """'spdk' for SPDK's target, else 'ours'."""
    return SPDK if isinstance(target, spdk_stack.SpdkTarget) else "ours"


def spdk_transport_extra(stack: str) -> list[str]:
    """What the bench adds to SPDK's `nvmf_create_transport` for `stack` (nothing for ours)."""
    if stack not in (SPDK, SPDK_SPEC):
        return []
    return ["-q", str(SPDK_MAX_QUEUE_DEPTH)] + (["--c2h-success"] if stack == SPDK_SPEC else [])


@contextlib.contextmanager
def spdk_transport_args(extra: list[str], psk_path: Path | None = None) -> Iterator[None]:
    """While starting a target, the harness's SPDK configuration also passes `extra` to
    `nvmf_create_transport` (the harness itself keeps SPDK's defaults). rpc.py's
    `--c2h-success` switch turns the SUCCESS shortcut off. With `psk_path`, the listener is a
    secure channel (TLS required, SPDK's `ssl` socket) and only TLS_HOSTNQN is admitted, with that
    PSK, as tests/spdk/test_spdk_tls.py configures it (the harness's SPDK target has no TLS)."""
    original = spdk_stack.target_rpcs

    def with_extra(setup: TargetSetup, port: int, *more: Any, **named: Any) -> list[list[str]]:
        calls = original(setup, port, *more, **named)
        for call in calls:
            if call[0] == "nvmf_create_transport" and "-q" not in call:
                call += extra
        return secure_channel(calls, psk_path) if psk_path else calls

    spdk_stack.target_rpcs = with_extra
    try:
        yield
    finally:
        spdk_stack.target_rpcs = original


# SPDK's TLS target with the posix socket's buffer sizes (its host gets them from spdk_sockbuf's shim).
SSL_SOCKET_BUFFERS = spdk_stack.SSL_SOCKET_BUFFERS


def secure_channel(calls: list[list[str]], psk_path: Path) -> list[list[str]]:
    """SPDK's target calls with every listener TLS-only and TLS_HOSTNQN the one host, with its PSK,
    and the ssl socket's buffers as large as the posix socket's (SSL_SOCKET_BUFFERS).
    Where the calls already say so (a harness whose SPDK target does TLS itself), they stay as they are."""
    admitted = {c[1] for c in calls if c[0] == "nvmf_subsystem_add_host" and TLS_HOSTNQN in c}
    sized = any(c[:3] == ["sock_impl_set_options", "-i", "ssl"] for c in calls)
    out = []
    for call in calls:
        if call[0] == "framework_start_init" and not sized:
            out.append(SSL_SOCKET_BUFFERS)  # before the framework starts, as the harness sets posix options
        if call[0] == "nvmf_create_subsystem":
            out.append([a for a in call if a != "-a"])  # no longer open to any host
            if call[1] not in admitted:
                out.append(["nvmf_subsystem_add_host", call[1], TLS_HOSTNQN, "--psk", str(psk_path)])
        elif call[0] == "nvmf_subsystem_add_listener" and "--secure-channel" not in call:
            out.append(call + ["--secure-channel"])
        else:
            out.append(call)
    return out


def cpu_per_gib(host_usr: float, host_sys: float, target_usr: float, target_sys: float, bw_bytes: float | None,
                window_s: float) -> dict[str, float]:
    """Each side's user and system CPU seconds per GiB moved. The CPU times cover the whole run
    (ramp included; the host's also its connect), the bytes are the measured bandwidth over
    ramp + runtime: a copy saved shows up here even where loopback bandwidth is the limit."""
    if not bw_bytes or window_s <= 0:
        return {}
    gib = bw_bytes * window_s / GIB
    sides = {"host_usr": host_usr, "host_sys": host_sys, "target_usr": target_usr, "target_sys": target_sys}
    return {f"{k}_s_per_gib": round(v / gib, 4) for k, v in sides.items()}


class BenchError(Exception):
    """Something the bench needs did not work; one line."""


def last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    return lines[-1][:300] if lines else "(no output)"


def bench_binary(name: str) -> Path:
    """nvmf-bench and friends: $NVMFLAB_BIN_DIR, then target/release of this checkout."""
    root = Path(__file__).resolve().parents[2]
    for folder in (os.environ.get("NVMFLAB_BIN_DIR"), root / "target" / "release"):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    raise BenchError(f"{name} not found (cargo build --release --workspace --bins)")
