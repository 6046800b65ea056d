"""Our stack: nvmf-target (config TOML, ready line, /stats) and nvmf-perf (fio-layout JSON).

Every knob of the registry (knobs.py) is a setting of ours with the same name, on both sides: a
line of the target's config, an option of nvmf-perf; both are made by the setters below."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..cores import cpulist
from ..dhchapkey import random_secret
from ..plan import PerfJob, TargetSetup
from ..topology.base import Host, HostError, HostProcess
from ..units import format_size
from ..knobs import KnobMap, Setter, apply, tcp_only
from .base import HostSession, RunningTarget, Stack, StackError, error_line, links_rdma

READY_TIMEOUT_S = 15.0


def _line(key: str) -> Setter:
    """A knob that is one line of the target's [target] table."""
    quote = key == "mode"
    return Setter(f"config `{key}`", lambda v, _k: [f'{key} = "{v}"' if quote else f"{key} = {int(v)}"])


def _flag(flag: str) -> Setter:
    """A knob that is one nvmf-perf option taking the value."""
    return Setter(f"nvmf-perf `{flag}`", lambda v, _k: [flag, str(v)])


def _switch(flag: str) -> Setter:
    """A yes/no knob that is one nvmf-perf option given when yes."""
    return Setter(f"nvmf-perf `{flag}`", lambda v, _k: [flag] if v else [])


def _one_queue_per_job(value: Any, knobs: dict[str, Any]) -> list[str]:
    if value is not None and value != knobs.get("numjobs"):
        raise StackError(f"io_queues {value}: nvmf-perf opens one I/O queue pair per job, so it must equal "
                         f"numjobs ({knobs.get('numjobs')})")
    return []  # carried by --numjobs


ACCEPTED = "accepted: follows the host's ICReq"
NO_TOS = "a socket option of NVMe/TCP; ours sets no RDMA service type"
TARGET_KNOBS: KnobMap = {
    # The reactors serve RDMA queues as they serve TCP connections (docs/rdma.md): mode, idle
    # polling, cores and placement hold over both.
    "target_mode": _line("mode"),
    "idle_poll_us": _line("idle_poll_us"),
    "in_capsule_data_size": _line("in_capsule_data_size"),
    "so_priority": _line("so_priority"),
    "tos": tcp_only(_line("tos"), NO_TOS),
    "busy_poll_us": _line("busy_poll_us"),
    "tcp_congestion": Setter('config `tcp_congestion` (none for "system")',
                             lambda v, _k: [] if v == "system" else [f'tcp_congestion = "{v}"']),
    "hdr_digest": Setter(ACCEPTED),
    "data_digest": Setter(ACCEPTED),
    "tls": Setter('config `[[port]] tls = "required"`, `[[host]] tls_key` (the run\'s key) for the host NQN'),
    "dhchap": Setter("config `[[host]] dhchap_key` (the run's secret), `dhchap_dhgroup`, `dhchap_hash = \"sha256\"`"),
    "transport": Setter('config `[[port]] trtype` (rdma: an nvmf-target built with `--features rdma`)'),
}
HOST_KNOBS: KnobMap = {
    "completion": _flag("--completion"),
    "io_queues": Setter("nvmf-perf `--numjobs` (one I/O queue pair per job; another count is refused)",
                        _one_queue_per_job),
    "so_priority": _flag("--so_priority"),
    "tos": tcp_only(_flag("--tos"), NO_TOS),
    "busy_poll_us": _flag("--busy_poll_us"),
    "tcp_congestion": Setter('nvmf-perf `--tcp_congestion` (none for "system")',
                             lambda v, _k: [] if v == "system" else ["--tcp_congestion", v]),
    "hdr_digest": _switch("--hdr_digest"),
    "data_digest": _switch("--data_digest"),
    "tls": Setter("nvmf-perf `--tls --tls-key KEY --hostnqn NQN` (the target's key)"),
    "dhchap": Setter("nvmf-perf `--dhchap-secret SECRET --hostnqn NQN` (the target's secret; it picks the group)"),
    "transport": Setter("nvmf-perf `-t tcp|rdma` (rdma: a build with RDMA support)"),
    "sqflow": Setter("nvmf-perf `--disable-sqflow` when off", lambda v, _k: ["--disable-sqflow"] if v == "off" else []),
}

# The host NQN a TLS or DH-HMAC-CHAP connection names when the spec gives none: the PSK identity and
# the authentication carry the host NQN, so the target's [[host]] entry and nvmf-perf's --hostnqn
# must agree.
TLS_HOSTNQN = "nqn.2024-01.io.nvmflab:host:tls"


def tls_hosts(setup: TargetSetup) -> tuple[str, ...]:
    """The host NQNs the target gives the run's TLS key or DH-HMAC-CHAP secret to (the admitted ones,
    else ours)."""
    return setup.allowed_hosts or (TLS_HOSTNQN,)


def tls_argv(key: str, hostnqn: str | None, identity: int | None = None) -> list[str]:
    """nvmf-perf's TLS options: the PSK and the host NQN whose identity the target knows (and the
    identity version, where the target takes only one: SPDK's 0)."""
    version = ["--tls-key-identity", str(identity)] if identity is not None else []
    return ["--tls", "--tls-key", key, *version, "--hostnqn", hostnqn or TLS_HOSTNQN]


def target_values(setup: TargetSetup) -> dict[str, Any]:
    """The target-side knob values a setup carries (the setup names `target_mode` `mode`)."""
    return {"target_mode": setup.mode, "idle_poll_us": setup.idle_poll_us, "so_priority": setup.so_priority,
            "in_capsule_data_size": setup.in_capsule_data_size, "tos": setup.tos,
            "busy_poll_us": setup.busy_poll_us, "tcp_congestion": setup.tcp_congestion}


def render_config(setup: TargetSetup, port: int, stats_port: int) -> str:
    """The target's TOML config (CONTRACTS.md §2); the knob lines come from the registry's setters."""
    lines = [
        "[target]",
        f"cores = [{', '.join(str(c) for c in setup.cores)}]",
        *apply(TARGET_KNOBS, "target", target_values(setup)),
        f'stats = "{setup.listen_ip}:{stats_port}"',
        "",
        "[[port]]",
        f'addr = "{setup.listen_ip}:{port}"',
    ]
    if setup.transport != "tcp":
        if setup.tls == "on":
            raise StackError(f"tls = on: TLS is an NVMe/TCP feature, not one of {setup.transport}")
        lines.append(f'trtype = "{setup.transport}"')
    if setup.tls == "on":
        if not setup.tls_key:
            raise StackError("tls = on: the target setup carries no TLS key")
        lines.append('tls = "required"')
    for index, sub in enumerate(setup.subsystems, start=1):
        lines += ["", "[[subsystem]]", f'nqn = "{sub.nqn}"', f'serial = "NVMFLAB{index:04d}"']
        if setup.allowed_hosts:
            lines += ["allow_any_host = false", f"hosts = [{', '.join(json.dumps(h) for h in setup.allowed_hosts)}]"]
        else:
            lines.append("allow_any_host = true")
        if sub.reactor is not None:
            lines.append(f"reactor = {sub.reactor}")
        lines += ["", "  [[subsystem.namespace]]", "  nsid = 1", f'  backend = "{sub.backend}"',
                  f"  block_size = {sub.block_size}"]
        if sub.backend == "file":
            lines.append(f"  path = {json.dumps(sub.path)}")
        else:
            lines.append(f'  size = "{format_size(sub.size)}"')
        if sub.backend == "model" and sub.model:
            lines.append(f"  model = {json.dumps(sub.model)}")
    if setup.dhchap != "off" and not setup.dhchap_key:
        raise StackError(f"dhchap = {setup.dhchap}: the target setup carries no DH-HMAC-CHAP secret")
    if setup.tls == "on" or setup.dhchap != "off":
        for hostnqn in tls_hosts(setup):
            lines += ["", "[[host]]", f"nqn = {json.dumps(hostnqn)}"]
            if setup.tls == "on":
                lines.append(f"tls_key = {json.dumps(setup.tls_key)}")
            if setup.dhchap != "off":
                lines += [f"dhchap_key = {json.dumps(setup.dhchap_key)}", 'dhchap_hash = "sha256"',
                          f'dhchap_dhgroup = "{setup.dhchap}"']
    return "\n".join(lines) + "\n"


class OurTarget(RunningTarget):
    def __init__(self, setup: TargetSetup, host: Host, workdir: Path):
        self.setup, self.host = setup, host
        self.address = setup.listen_ip
        self.port = host.free_port()
        self.stats_port = host.free_port()
        while self.stats_port == self.port:
            self.stats_port = host.free_port()
        config = workdir / f"target-{self.port}.toml"
        config.write_text(render_config(setup, self.port, self.stats_port))
        remote_config = f"{host.workdir()}/{config.name}"
        host.put(config, remote_config)
        self.log_path = workdir / f"target-{self.port}.log"
        self.ready_path = workdir / f"target-{self.port}.out"
        self.proc: HostProcess = host.spawn([host.binary("nvmf-target"), "--config", remote_config], setup.cores,
                                            log=self.log_path, stdout=self.ready_path)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.ready_path.read_text(errors="replace") if self.ready_path.exists() else ""
            if "\n" in text:
                line = text.split("\n", 1)[0]
                if line.startswith("ready "):
                    return
                raise StackError(f"nvmf-target printed {line!r} instead of its ready line")
            if not self.proc.alive():
                raise StackError(f"nvmf-target exited: {self._log_tail()}")
            time.sleep(0.01)  # a target is ready within tens of ms: a point waits little
        raise StackError(f"nvmf-target not ready after {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return error_line(self.log_path.read_text(errors="replace") if self.log_path.exists() else "")

    def stats(self) -> dict[str, Any]:
        # The stats endpoint listens on the data address: reached directly (loopback, a namespace's
        # veth) or through the host's SSH connection (a data network with no route from here).
        address, port = self.host.forward(self.address, self.stats_port)
        url = f"http://{address}:{port}/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def cpu_seconds(self) -> tuple[float, float]:
        return self.proc.cpu_seconds()

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop()
        self.host.unforward(self.address, self.stats_port)


class OurSession(HostSession):
    def __init__(self, argv_head: list[str], job: PerfJob):
        self.argv_head, self.job = argv_head, job

    def perf_argv(self, runtime: float, ramp_time: float, output: str) -> list[str]:
        k = self.job.knobs
        argv = self.argv_head + [
            "--rw", k["rw"], "--bs", format_size(k["bs"]), "--iodepth", str(k["iodepth"]),
            "--numjobs", str(k["numjobs"]), "--runtime", _seconds(runtime), "--ramp_time", _seconds(ramp_time),
            "--cpus_allowed", cpulist(list(self.job.cpus)), "--output-format", "json", "--output", output]
        if k["rw"] in ("rw", "randrw"):
            argv += ["--rwmixread", str(k["rwmixread"])]
        if k["rate_iops"]:
            argv += ["--rate_iops", str(k["rate_iops"])]
        if k.get("size"):
            argv += ["--size", str(k["size"])]
        if k.get("verify"):
            argv += ["--verify"]
        if k.get("connects"):  # the security study's connect app: each operation is a connect
            argv += ["--connects"]
        return argv


# nvmf-perf's line after a TLS run (docs/tls.md, "Saying which").
_RECORDS = re.compile(r"TLS records: ktls on (\d+) connection\(s\), userspace on (\d+)")


def records_of_log(log: str) -> str | None:
    """"ktls", "userspace" or "mixed (ktls on N connections, userspace on M)" from nvmf-perf's
    TLS records line; None without one (a run without TLS, or an nvmf-perf before the line)."""
    found = _RECORDS.findall(log or "")
    if not found:
        return None
    ktls, userspace = (sum(int(f[i]) for f in found) for i in (0, 1))
    if ktls and userspace:
        return f"mixed (ktls on {ktls} connections, userspace on {userspace})"
    return "ktls" if ktls else "userspace"


class OurStack(Stack):
    name = "ours"
    backends = ("null", "ram", "file", "model")
    target_knobs = TARGET_KNOBS
    host_knobs = HOST_KNOBS

    def start_target(self, setup: TargetSetup, host: Host, workdir: Path) -> OurTarget:
        try:
            return OurTarget(setup, host, workdir)
        except HostError as err:
            raise StackError(str(err)) from None

    def plan_target(self, setup: TargetSetup, host: Host) -> list[str]:
        config = render_config(setup, 4420, 9100).replace("\n", " | ")
        return [f"write target.toml: {config}", host.describe(["nvmf-target", "--config", "target.toml"])]

    def open_host(self, job: PerfJob, target: RunningTarget | None, host: Host, workdir: Path) -> OurSession:
        key = target.setup.tls_key if target is not None else None
        secret = target.setup.dhchap_key if target is not None else None
        if secret and job.knobs.get("wrong_key"):  # the security study's refusal check: a secret the target lacks
            secret = random_secret()
        identity = getattr(target, "tls_identity", None)
        return OurSession(self._argv_head(job, target.address if target else None,
                                          target.port if target else None, host.binary("nvmf-perf"), key,
                                          secret, identity), job)

    def plan_host(self, job: PerfJob, address: str, port: int, host: Host, runtime: float = 10.0,
                  ramp_time: float = 2.0) -> list[str]:
        argv = OurSession(self._argv_head(job, address, port, "nvmf-perf", "RUN_TLS_KEY", "RUN_DHCHAP_SECRET"),
                          job).perf_argv(
            runtime, ramp_time, "perf.json")
        return [host.describe(argv)]

    def _argv_head(self, job: PerfJob, address: str | None, port: int | None, binary: str,
                   tls_key: str | None = None, dhchap_secret: str | None = None,
                   tls_identity: int | None = None) -> list[str]:
        k = job.knobs
        argv = [binary, "run"]
        if job.local_path:
            return argv + ["--local", job.local_path]
        if address is None or job.nqn is None:
            raise StackError("a tcp job needs a running target and a subsystem NQN")
        argv += ["-t", k.get("transport", "tcp"), "-a", address, "-s", str(port), "-n", job.nqn, *apply(HOST_KNOBS, "host", k)]
        if k.get("dhchap", "off") != "off":
            if not dhchap_secret:
                raise StackError(f"dhchap = {k['dhchap']}: the target this job connects to has no DH-HMAC-CHAP "
                                 "secret (only our target makes one)")
            argv += ["--dhchap-secret", dhchap_secret]
        if k.get("tls", "off") == "on":
            if not tls_key:
                raise StackError("tls = on: the target this job connects to has no TLS key (only our target "
                                 "makes one)")
            return argv + tls_argv(tls_key, job.hostnqn, tls_identity)
        if k.get("dhchap", "off") != "off":
            return argv + ["--hostnqn", job.hostnqn or TLS_HOSTNQN]
        argv += ["--hostnqn", job.hostnqn] if job.hostnqn else []
        return argv

    def host_tls_records(self, log: str) -> str | None:
        """nvmf-perf says which layer made each connection's records (--ktls auto: kTLS where the
        socket takes the TLS ULP, else userspace)."""
        return records_of_log(log)

    def versions(self, host: Host) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name in ("nvmf-target", "nvmf-perf"):
            try:
                done = host.ask([host.binary(name), "--version"])  # once per run and host
                lines = (done.stdout or done.stderr).strip().splitlines()
                out[name] = lines[0] if lines else None
            except HostError:
                out[name] = None
        return out

    def unavailable(self, host: Host, side) -> str | None:
        name = "nvmf-target" if side == "target" else "nvmf-perf"
        try:
            host.binary(name)
        except HostError as err:
            return str(err)
        return None

    def rdma_unavailable(self, host: Host, side) -> str | None:
        name = "nvmf-target" if side == "target" else "nvmf-perf"
        try:
            path = host.binary(name)
        except HostError as err:
            return str(err)
        if links_rdma(host, path):
            return None
        build = ("`cargo build --release -p nvmf-target --features rdma` (needs librdmacm-dev and libibverbs-dev), "
                 "then NVMFLAB_BIN_DIR at its folder") if side == "target" else "a build with the RDMA queue pair"
        return f"{host.name}: {path} was built without RDMA (it does not link librdmacm); use {build}"


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


STACK = OurStack  # what get_stack('ours') makes
