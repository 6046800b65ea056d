"""The Linux kernel stack: nvmet configured through configfs, and the kernel host (nvme-cli + fio).

Every command runs through the `Host` (this machine, a namespace, a server over SSH), as root or
through `sudo -n`. Kernel paths hang off `root` ("/" for real; tests point it at a temporary
directory that stands in for configfs and sysfs).

Teardown guarantee: the target records one undo command for each thing it created or changed (a
configfs directory, a symlink, `enable`, a module parameter, a module it loaded, a file in
/dev/shm) and runs them in reverse order. A subsystem, port, nullb device or file that already
exists is refused, never reused, so nothing it did not create is ever touched.

Leftovers: what a run killed before its teardown left (SIGKILL, a lost connection) carries
nvmflab's marks (kernel_leftovers.py); before its first target or host on a machine, the stack
removes those, and only those.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from ..dhchapkey import random_secret
from ..plan import PerfJob, Subsystem, TargetSetup
from ..topology import tls as tls_facts
from ..topology.base import Host, HostError, checked
from ..knobs import KnobMap, Setter, apply, tcp_only
from .base import Fixed, HostSession, RunningTarget, Stack, StackError
from . import kernel_leftovers as leftovers
from . import kernel_tls
from .fio import LOG_AVG_MSEC, fio_argv, fio_intervals, log_prefix, parse_fio
from .ours import TLS_HOSTNQN

DEVICE_WAIT_S = 15.0  # namespace scanning after `nvme connect` is asynchronous
CTRL_LOSS_TMO_S = 10  # a dead target fails fio in seconds instead of the default 600 s of reconnects

_WRITE = 'printf "%s" "$1" > "$2"'
# noclobber refuses an existing file; a file it made but could not size is removed again.
_NEW_FILE = 'set -C; : > "$1" || exit 1; truncate -s "$2" "$1" || { rm -f "$1"; exit 1; }'
# One line per controller: name, subsysnqn, hostnqn, state, its namespace block devices.
_SCAN = r"""for c in "$1"/nvme*; do
  [ -r "$c/subsysnqn" ] || continue
  printf '%s\t%s\t%s\t%s\t' "${c##*/}" "$(cat "$c/subsysnqn")" "$(cat "$c/hostnqn" 2>/dev/null)" \
    "$(cat "$c/state" 2>/dev/null)"
  ls "$c/" | grep -E '^nvme[0-9]+(c[0-9]+)?n[0-9]+$' | tr '\n' ' '
  echo
done"""
_CTRL = re.compile(r"nvme\d{1,6}")
# Machines whose leftovers this process removed already: once per machine, whichever side (and
# whichever KernelStack instance) comes first, so nothing this run made is ever taken for one.
_CLEANED: "weakref.WeakSet[Host]" = weakref.WeakSet()
_NS = re.compile(r"nvme(\d{1,6})(?:c\d{1,6})?n(\d{1,6})")


class KernelTarget(RunningTarget):
    """nvmet serving `setup` on `host`: configfs subsystems, namespaces and one tcp port."""

    def __init__(self, stack: KernelStack, setup: TargetSetup, host: Host):
        self.stack, self.setup, self.host = stack, setup, host
        self.address = setup.listen_ip
        self.port = host.free_port()
        self.undo: list[list[str]] = []  # run in reverse at stop()
        self.teardown_errors: list[str] = []
        self.port_dir: str | None = None
        self.own_hosts: set[str] = set()  # host entries this target made (and keyed, with dhchap)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        s, setup = self.stack, self.setup
        s._load_module(self.host, "nvmet", self.undo)
        s._load_module(self.host, target_module(setup.transport), self.undo)
        module_params, port_attrs = target_settings(setup)
        # Module parameters apply to sockets accepted afterwards, so they are set before the port.
        for param, value in module_params:
            s._set(self.host, s.path(f"sys/module/nvmet_tcp/parameters/{param}"), value, self.undo)
        if setup.tls == "on":  # the key and tlshd before the port: a host may connect at once
            s._tls_ready(self.host, "target", self.undo)
            if not setup.tls_key:
                raise StackError("tls = on: the target setup carries no TLS key")
            for hostnqn in tls_hosts(setup):
                for sub in setup.subsystems:
                    s._insert_tls_key(self.host, setup.tls_key, hostnqn, sub.nqn, self.undo)
        nvmet = s.path("sys/kernel/config/nvmet")
        if not s._exists(self.host, nvmet):
            raise StackError(f"{self.host.name}: {nvmet} missing (configfs not mounted or nvmet not loaded)")
        port_id = s._free_port_id(self.host, f"{nvmet}/ports")
        admitted = dhchap_hosts(setup)
        sub_dirs = []
        for index, sub in enumerate(setup.subsystems):
            device = self._backend(sub, index)
            sub_dir = f"{nvmet}/subsystems/{_name(sub.nqn, 'subsystem NQN')}"
            s._mkdir(self.host, sub_dir, self.undo, what=f"subsystem {sub.nqn}")
            s._write(self.host, f"{sub_dir}/attr_allow_any_host", "0" if admitted else "1")
            for hostnqn in admitted:
                self._allow_host(f"{nvmet}/hosts", sub_dir, hostnqn)
            s._mkdir(self.host, f"{sub_dir}/namespaces/1", self.undo)
            s._write(self.host, f"{sub_dir}/namespaces/1/device_path", device)
            # nvmet opens files O_DIRECT, which tmpfs refuses: such files go through the page cache
            if sub.backend == "ram" or (sub.backend == "file" and not opens_direct(self.host, device)):
                s._write(self.host, f"{sub_dir}/namespaces/1/buffered_io", "1")
            s._set(self.host, f"{sub_dir}/namespaces/1/enable", "1", self.undo, old="0")
            sub_dirs.append((sub.nqn, sub_dir))
        port_dir = f"{nvmet}/ports/{port_id}"
        s._mkdir(self.host, port_dir, self.undo, what=f"port {port_id}")
        for attr, value in (("addr_trtype", setup.transport), ("addr_adrfam", "ipv4"),
                            ("addr_traddr", setup.listen_ip), ("addr_trsvcid", str(self.port)), *port_attrs):
            s._write(self.host, f"{port_dir}/{attr}", value)
        for nqn, sub_dir in sub_dirs:  # linking a subsystem to a port starts listening
            link = f"{port_dir}/subsystems/{nqn}"
            s._run(self.host, ["ln", "-s", sub_dir, link])
            self.undo.append(["rm", link])
        self.port_dir = port_dir

    def _allow_host(self, hosts_dir: str, sub_dir: str, hostnqn: str) -> None:
        """Admit hostnqn to the subsystem. nvmet's host entries are shared by every subsystem: one
        that exists is linked but left in place; one we make goes again at teardown. With
        DH-HMAC-CHAP the entry carries the run's secret, so it must be ours (made now, or by an
        earlier subsystem of this target)."""
        s, entry = self.stack, f"{hosts_dir}/{_name(hostnqn, 'host NQN')}"
        if not s._exists(self.host, entry):
            s._mkdir(self.host, entry, self.undo)
            if self.setup.dhchap != "off":
                if not self.setup.dhchap_key:
                    raise StackError(f"dhchap = {self.setup.dhchap}: the target setup carries no DH-HMAC-CHAP secret")
                # The hash and group first: the key is what nvmet checks a host against.
                for attr, value in dhchap_host_attrs(self.setup):
                    s._write(self.host, f"{entry}/{attr}", value)
                self.own_hosts.add(hostnqn)
        elif self.setup.dhchap != "off" and hostnqn not in self.own_hosts:
            raise StackError(f"{self.host.name}: nvmet host entry {hostnqn} exists already ({entry}); nvmflab does "
                             "not change the DH-HMAC-CHAP key of an entry it did not make")
        link = f"{sub_dir}/allowed_hosts/{_name(hostnqn, 'host NQN')}"
        s._run(self.host, ["ln", "-s", entry, link])
        self.undo.append(["rm", link])

    def _backend(self, sub: Subsystem, index: int) -> str:
        """The namespace's device_path: a fresh null_blk device, a file in /dev/shm, or the given path."""
        s, name = self.stack, f"nvmflab-{self.port}-{index}"
        if sub.backend == "file":
            if not sub.path:
                raise StackError(f"subsystem {sub.nqn}: backend file needs a path")
            return sub.path
        if sub.backend == "ram":
            path = s.path(f"dev/shm/{name}.img")
            try:
                s._run(self.host, ["sh", "-c", _NEW_FILE, "sh", path, str(sub.size)])
            except StackError as err:
                raise StackError(f"{self.host.name}: cannot create {path} (exists already?): {err}") from None
            self.undo.append(["rm", "-f", path])
            return path
        if sub.backend == "null":
            # nr_devices=0: loading null_blk creates no default device that we did not ask for.
            s._load_module(self.host, "null_blk", self.undo, ("nr_devices=0",))
            nullb = s.path(f"sys/kernel/config/nullb/{name}")
            s._mkdir(self.host, nullb, self.undo, what=f"null_blk device {name}")
            s._write(self.host, f"{nullb}/size", str(max(1, -(-sub.size // (1 << 20)))))  # MiB, rounded up
            s._write(self.host, f"{nullb}/blocksize", str(sub.block_size))
            s._set(self.host, f"{nullb}/power", "1", self.undo, old="0")
            # Kernels since 5.x name a configfs-made disk after its folder; older ones nullbINDEX.
            if s._exists(self.host, s.path(f"sys/block/{name}")):
                return s.path(f"dev/{name}")
            index_text = s._read(self.host, f"{nullb}/index")
            if not re.fullmatch(r"\d{1,6}", index_text):
                raise StackError(f"{self.host.name}: {nullb}/index reads {index_text[:40]!r}, not a number")
            return s.path(f"dev/nullb{index_text}")
        raise StackError(f"subsystem {sub.nqn}: backend {sub.backend!r} unknown to the kernel stack")

    def stats(self) -> dict[str, Any] | None:
        """With TLS, the machine's /proc/net/tls_stat (the runner takes each point's difference, so
        the analysis reads whether kTLS carried the target's records: kernel_tls); else none."""
        if self.setup.tls != "on":
            return None
        found, why = kernel_tls.read(lambda argv: self.stack._run(self.host, argv, check=False, sudo=False),
                                     self.stack.path(kernel_tls.FILE))
        return kernel_tls.snapshot(found, why)

    def alive(self) -> bool:
        return self.port_dir is not None and self.stack._exists(self.host, self.port_dir)

    def stop(self) -> None:
        """Undo every recorded step, newest first; a failing step does not stop the others."""
        while self.undo:
            argv = self.undo.pop()
            try:
                if self.stack._run(self.host, argv, check=False).returncode != 0:
                    self.teardown_errors.append(f"`{' '.join(argv)}` failed")
            except (HostError, StackError) as err:
                self.teardown_errors.append(str(err))
        self.port_dir = None
        if self.teardown_errors:  # stop() runs in cleanup paths: report, do not raise
            print(f"nvmflab: kernel target teardown on {self.host.name}: {self.teardown_errors[0]}", file=sys.stderr)


@dataclass
class KernelSession(HostSession):
    """One fio run against a connected controller (or a local file: no connect)."""

    stack: KernelStack
    job: PerfJob
    host: Host
    filename: str
    fio: str = "fio"
    engine: str = "io_uring"
    sudo: list[str] = field(default_factory=list)
    direct: bool = True  # O_DIRECT; off for a local file on a filesystem without it (tmpfs)
    hostnqn: str | None = None  # set once `nvme connect` was attempted
    log_prefix: str | None = None  # fio's per-interval logs (iops, clat) start with this
    preexisting: set[str] = field(default_factory=set)  # controllers with our host NQN before we connected
    held: list[str] = field(default_factory=list)  # host settings this session holds
    undo: list[list[str]] = field(default_factory=list)  # TLS keys it inserted, tlshd it started: undone at close
    close_errors: list[str] = field(default_factory=list)
    tls_records: str | None = None  # with TLS: the record layer read over the connect (kernel_tls)

    def perf_argv(self, runtime: float, ramp_time: float, output: str) -> list[str]:
        self.log_prefix = log_prefix(output)
        return self.sudo + fio_argv(self.fio, self.job, self.filename, self.engine, runtime, ramp_time, output,
                                    direct=self.direct)

    def parse_output(self, text: str) -> dict[str, Any]:
        report = parse_fio(text)
        if self.log_prefix:
            logs = {}
            for kind in ("iops", "clat"):
                for number in range(1, int(self.job.knobs["numjobs"]) + 1):
                    try:
                        logs[(kind, number)] = self.host.read_text(f"{self.log_prefix}_{kind}.{number}.log")
                    except HostError:
                        continue  # no log (fio failed early, or a job without I/O): no intervals from it
            found = fio_intervals(logs, LOG_AVG_MSEC)
            if found:
                report.setdefault("nvmflab", {"engine": "fio"})["intervals"] = found
        if self.tls_records:  # the runner stores it as the point's host_tls_records
            report.setdefault("nvmflab", {"engine": "fio"})["tls_records"] = self.tls_records
        return report

    def close(self) -> None:
        """Disconnect our own controllers (found by our unique host NQN), then give back settings.
        It never raises: the runner closes every session in a row, whatever failed before."""
        errors = self.close_errors
        if self.hostnqn is not None:
            try:
                for ctrl, _ in self.stack._controllers(self.host, self.job.nqn or "", self.hostnqn):
                    if ctrl in self.preexisting:
                        continue  # someone else's connection with the same host NQN
                    done = self.stack._run(self.host, ["nvme", "disconnect", "-d", ctrl], check=False)
                    if done.returncode != 0:
                        errors.append(f"nvme disconnect -d {ctrl} exited {done.returncode}")
            except (HostError, StackError) as err:
                errors.append(str(err))
            self.hostnqn = None
        while self.held:
            try:
                self.stack._release(self.host, self.held.pop())
            except (HostError, StackError) as err:
                errors.append(str(err))
        while self.undo:
            argv = self.undo.pop()
            try:
                if self.stack._run(self.host, argv, check=False).returncode != 0:
                    errors.append(f"`{' '.join(argv)}` failed")
            except (HostError, StackError) as err:
                errors.append(str(err))
        if errors:
            print(f"nvmflab: kernel host teardown on {self.host.name}: {errors[0]}", file=sys.stderr)


def _queues(knobs: dict[str, Any]) -> int:
    return knobs.get("io_queues") or knobs["numjobs"]


def _module_param(name: str) -> Setter:
    return tcp_only(Setter(f"nvmet_tcp module parameter `{name}`", lambda v, _k: [f"module:{name}", str(int(v))]),
                    "an nvmet_tcp module parameter, which an nvmet rdma port does not use")


def _port_attr(name: str) -> Setter:
    return Setter(f"port attribute `{name}`", lambda v, _k: [f"port:{name}", str(int(v))])


def target_settings(setup: TargetSetup) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(nvmet_tcp module parameters, port attributes) as (name, value), made by the registry's
    setters (TARGET_KNOBS) from the setup's knob values."""
    values = {"idle_poll_us": setup.idle_poll_us, "so_priority": setup.so_priority,
              "in_capsule_data_size": setup.in_capsule_data_size, "tls": setup.tls}
    made = apply(TARGET_KNOBS, "target", values)
    pairs = [(where.split(":", 1), value) for where, value in zip(made[::2], made[1::2])]
    module = [(name, value) for (kind, name), value in pairs if kind == "module"]
    if setup.transport != "tcp":  # nvmet_tcp's parameters: an RDMA port has no socket to set
        asked = [f"{name} = {value}" for name, value in module if value != "0"]
        if asked:
            raise StackError(f"{', '.join(asked)}: nvmet_tcp module parameters, which an nvmet {setup.transport} "
                             "port does not use")
        module = []
    return module, [(name, value) for (kind, name), value in pairs if kind == "port"]


ACCEPTED = "accepted: nvmet_tcp follows what the host asks in ICReq"
TARGET_KNOBS: KnobMap = {
    "target_mode": Fixed("event", "nvmet_tcp's io_work runs on a kernel workqueue, woken by the socket; "
                                  "there is no polling reactor (see idle_poll_us)"),
    # Module parameters (sysfs) and port attributes (configfs), written by KernelTarget._start.
    "idle_poll_us": _module_param("idle_poll_period_usecs"),
    "in_capsule_data_size": _port_attr("param_inline_data_size"),
    "so_priority": _module_param("so_priority"),
    "tos": Setter("accepted: nvmet_tcp answers with the TOS of the host's connection"),
    "hdr_digest": Setter(ACCEPTED),
    "data_digest": Setter(ACCEPTED),
    "transport": Setter("port attribute `addr_trtype` (module nvmet_tcp or nvmet_rdma)"),
    "tls": Setter("port attributes `addr_tsas = tls1.3`, `addr_treq = required`; the run's key in the `.nvme` "
                  "keyring (`nvme check-tls-key --insert`, identities 0 and 1) for the host NQN; tlshd running",
                  lambda v, _k: ["port:addr_tsas", "tls1.3", "port:addr_treq", "required"] if v == "on" else []),
    "dhchap": Setter("host entry `dhchap_key` (the run's secret), `dhchap_hash = hmac(sha256)`, `dhchap_dhgroup`; "
                     "the subsystem admits only that host NQN (unidirectional: no `dhchap_ctrl_key`)"),
    # busy_poll_us is absent: nvmet_tcp never busy-polls its sockets, so it is refused.
}
HOST_KNOBS: KnobMap = {
    # fio's hipri I/O goes to the poll queues (fio.fio_argv adds --hipri)
    "completion": Setter("`nvme connect --nr-poll-queues` (= io_queues) + fio `--hipri` (io_uring)",
                         lambda v, k: [f"--nr-poll-queues={_queues(k)}"] if v == "poll" else []),
    "io_queues": Setter("`nvme connect --nr-io-queues` (default: numjobs)",
                        lambda _v, k: [f"--nr-io-queues={_queues(k)}"]),
    # Host-wide settings held for the session by KernelStack._open (read when a socket is made).
    "so_priority": Setter("nvme_tcp module parameter `so_priority` (host-wide, restored afterwards)"),
    "busy_poll_us": Setter("sysctl `net.core.busy_read` (host-wide, restored afterwards)"),
    "tos": Setter("`nvme connect --tos` (when > 0)", lambda v, _k: [f"--tos={v}"] if v else []),
    "transport": Setter("`nvme connect -t tcp|rdma` (module nvme_tcp or nvme_rdma)"),
    "tls": Setter("`nvme connect --tls` with the run's key in the `.nvme` keyring (`nvme check-tls-key --insert`) "
                  "for the host NQN; tlshd running", lambda v, _k: ["--tls"] if v == "on" else []),
    "dhchap": Setter("`nvme connect --dhchap-secret` (the target's secret) with the host NQN it admits; "
                     "the controller picks the group"),
    "hdr_digest": Setter("`nvme connect --hdr-digest`", lambda v, _k: ["--hdr-digest"] if v else []),
    "data_digest": Setter("`nvme connect --data-digest`", lambda v, _k: ["--data-digest"] if v else []),
    "sqflow": Setter("`nvme connect --disable-sqflow` when off",
                     lambda v, _k: ["--disable-sqflow"] if v == "off" else []),
}


def connect_argv(job: PerfJob, address: str, port: int, hostnqn: str, hostid: str,
                 dhchap_secret: str | None = None) -> list[str]:
    """`nvme connect`; the knob options come from the registry's setters (HOST_KNOBS)."""
    k = job.knobs | {"io_queues": _queues(job.knobs)}
    secret = [f"--dhchap-secret={dhchap_secret}"] if k.get("dhchap", "off") != "off" and dhchap_secret else []
    return ["nvme", "connect", "-t", k.get("transport", "tcp"), "-a", address, "-s", str(port), "-n", job.nqn or "",
            f"--hostnqn={hostnqn}", f"--hostid={hostid}", f"--ctrl-loss-tmo={CTRL_LOSS_TMO_S}",
            *apply(HOST_KNOBS, "host", k), *secret]


def uses_named_host(knobs: dict[str, Any]) -> bool:
    """TLS (the PSK identity) and DH-HMAC-CHAP (the host entry) name the host: its NQN is the one
    the target holds the key for, not a fresh one."""
    return knobs.get("tls") == "on" or knobs.get("dhchap", "off") != "off"


def host_dhchap_secret(job: PerfJob, target: RunningTarget) -> str | None:
    """The secret the host authenticates with: the target's, or a fresh one that cannot match it for
    a point that checks a wrong key is refused (knob `wrong_key`, the security study's)."""
    if job.knobs.get("dhchap", "off") == "off":
        return None
    secret = getattr(target.setup, "dhchap_key", None)
    if not secret:
        raise StackError(f"dhchap = {job.knobs['dhchap']}: the target this job connects to has no DH-HMAC-CHAP secret")
    return random_secret() if job.knobs.get("wrong_key") else secret


def target_module(transport: str) -> str:
    """The nvmet transport module serving a port of this transport."""
    return "nvmet_rdma" if transport == "rdma" else "nvmet_tcp"


def host_module(transport: str) -> str:
    """The initiator driver `nvme connect -t TRANSPORT` needs."""
    return "nvme_rdma" if transport == "rdma" else "nvme_tcp"


def opens_direct(host: Host, path: str) -> bool:
    """Whether `path` on `host` can be read with O_DIRECT (tmpfs files cannot)."""
    done = host.run(["dd", f"if={path}", "of=/dev/null", "bs=4096", "count=1", "iflag=direct"], check=False,
                    timeout=30)
    return done.returncode == 0


class KernelStack(Stack):
    name = "kernel"
    target_knobs = TARGET_KNOBS
    host_knobs = HOST_KNOBS

    def __init__(self, root: str = "/", sudo: list[str] | None = None):
        self.root = root
        self._sudo: dict[str, list[str]] = {} if sudo is None else {"*": list(sudo)}
        self._held: dict[tuple[str, str], list[str]] = {}  # (host, path) -> [users, old, value]
        self._engines: dict[str, str] = {}

    def path(self, relative: str) -> str:
        """A kernel path under `root` ("sys/kernel/config/nvmet" -> "/sys/kernel/config/nvmet")."""
        return str(PurePosixPath(self.root) / relative)

    # -- target side ----------------------------------------------------------------------------
    def start_target(self, setup: TargetSetup, host: Host, workdir: Path) -> KernelTarget:
        try:
            self.clean_leftovers(host)
            return KernelTarget(self, setup, host)
        except HostError as err:
            raise StackError(str(err)) from None

    def plan_target(self, setup: TargetSetup, host: Host) -> list[str]:
        nvmet, port, lines = self.path("sys/kernel/config/nvmet"), 4420, []
        say = lambda argv: lines.append(host.describe(argv))  # noqa: E731
        write = lambda path, value: say(["sh", "-c", _WRITE, "sh", value, path])  # noqa: E731
        say(["modprobe", "nvmet"])  # each module only when it is not loaded yet
        say(["modprobe", target_module(setup.transport)])
        module_params, port_attrs = target_settings(setup)
        for param, value in module_params:
            write(self.path(f"sys/module/nvmet_tcp/parameters/{param}"), value)
        if setup.tls == "on":
            for hostnqn in tls_hosts(setup):
                for sub in setup.subsystems:
                    lines.extend(self._plan_tls(host, hostnqn, sub.nqn))
        for index, sub in enumerate(setup.subsystems):
            device = sub.path or "?"
            if sub.backend == "ram":
                device = self.path(f"dev/shm/nvmflab-{port}-{index}.img")
                say(["sh", "-c", _NEW_FILE, "sh", device, str(sub.size)])
            elif sub.backend == "null":
                nullb = self.path(f"sys/kernel/config/nullb/nvmflab-{port}-{index}")
                say(["modprobe", "null_blk", "nr_devices=0"])
                say(["mkdir", nullb])
                write(f"{nullb}/size", str(max(1, -(-sub.size // (1 << 20)))))
                write(f"{nullb}/blocksize", str(sub.block_size))
                write(f"{nullb}/power", "1")
                device = self.path(f"dev/nvmflab-{port}-{index}") + " (or dev/nullb$(cat INDEX) on older kernels)"
            sub_dir = f"{nvmet}/subsystems/{sub.nqn}"
            say(["mkdir", sub_dir])
            write(f"{sub_dir}/attr_allow_any_host", "0" if dhchap_hosts(setup) else "1")
            for hostnqn in dhchap_hosts(setup):
                say(["mkdir", f"{nvmet}/hosts/{hostnqn}", "(unless it exists)"])
                if setup.dhchap != "off":
                    for attr, value in dhchap_host_attrs(replace(setup, dhchap_key="RUN_DHCHAP_SECRET")):
                        write(f"{nvmet}/hosts/{hostnqn}/{attr}", value)
                say(["ln", "-s", f"{nvmet}/hosts/{hostnqn}", f"{sub_dir}/allowed_hosts/{hostnqn}"])
            say(["mkdir", f"{sub_dir}/namespaces/1"])
            write(f"{sub_dir}/namespaces/1/device_path", device)
            if sub.backend == "ram":
                write(f"{sub_dir}/namespaces/1/buffered_io", "1")
            write(f"{sub_dir}/namespaces/1/enable", "1")
        port_dir = f"{nvmet}/ports/1"
        say(["mkdir", port_dir])
        for attr, value in (("addr_trtype", setup.transport), ("addr_adrfam", "ipv4"),
                            ("addr_traddr", setup.listen_ip), ("addr_trsvcid", str(port)), *port_attrs):
            write(f"{port_dir}/{attr}", value)
        for sub in setup.subsystems:
            say(["ln", "-s", f"{nvmet}/subsystems/{sub.nqn}", f"{port_dir}/subsystems/{sub.nqn}"])
        lines.append("(teardown: the steps above undone in reverse order; module parameters restored)")
        return lines

    # -- host side ------------------------------------------------------------------------------
    def open_host(self, job: PerfJob, target: RunningTarget | None, host: Host, workdir: Path) -> KernelSession:
        try:
            self.clean_leftovers(host)
            return self._open(job, target, host)
        except HostError as err:
            raise StackError(str(err)) from None

    def _open(self, job: PerfJob, target: RunningTarget | None, host: Host) -> KernelSession:
        fio, engine = host.binary("fio"), self._engine(host)
        if job.knobs["completion"] == "poll" and engine != "io_uring":
            raise StackError(f"{host.name}: completion = poll needs fio's io_uring engine (hipri); it is unusable here")
        if job.local_path:  # the overhead study's local leg: fio on the file itself, no connect
            return KernelSession(self, job, host, job.local_path, fio, engine,
                                 direct=opens_direct(host, job.local_path))
        if target is None or job.nqn is None:
            raise StackError("a tcp job needs a running target and a subsystem NQN")
        session = KernelSession(self, job, host, "", fio, engine, sudo=self._sudo_for(host))
        try:
            self._load_module(host, host_module(job.knobs.get("transport", "tcp")), None)  # stays loaded
            # Both are read when a socket is made, so they are set before connecting.
            for path, value in ((self.path("sys/module/nvme_tcp/parameters/so_priority"), job.knobs["so_priority"]),
                                (self.path("proc/sys/net/core/busy_read"), job.knobs["busy_poll_us"])):
                if not value and not self._exists(host, path):
                    continue  # an older kernel without the setting runs as if it were 0
                self._hold(host, path, str(value))
                session.held.append(path)
            hostid = str(uuid.uuid4())
            # A host NQN of our own (unless the spec names one the target admits) finds exactly
            # our controllers again; with a given one, controllers that were there before stay out.
            # With TLS or DH-HMAC-CHAP it is the NQN the target holds a key for.
            hostnqn = job.hostnqn or (TLS_HOSTNQN if uses_named_host(job.knobs) else
                                      f"nqn.2014-08.org.nvmexpress:uuid:{hostid}")
            secret = host_dhchap_secret(job, target)
            if job.knobs.get("tls") == "on":
                key = getattr(target.setup, "tls_key", None)
                if not key:
                    raise StackError("tls = on: the target this job connects to has no TLS key")
                self._tls_ready(host, "host", session.undo)
                self._insert_tls_key(host, key, hostnqn, job.nqn, session.undo)
            session.preexisting = {c for c, _ in self._controllers(host, job.nqn, hostnqn)}
            session.hostnqn = hostnqn
            tls_before = self._tls_stat(host) if job.knobs.get("tls") == "on" else None
            self._connect(host, connect_argv(job, target.address, target.port, session.hostnqn, hostid, secret),
                          job.knobs)
            session.filename = self._wait_device(host, job.nqn, session.hostnqn, session.preexisting)
            if tls_before is not None:  # the connect's sockets are set up once the device is there
                tls_after = self._tls_stat(host)
                session.tls_records = kernel_tls.records(kernel_tls.delta(tls_before[0], tls_after[0]),
                                                         tls_before[1] or tls_after[1])
        except BaseException:
            session.close()
            raise
        return session

    def plan_host(self, job: PerfJob, address: str, port: int, host: Host, runtime: float = 10.0,
                  ramp_time: float = 2.0) -> list[str]:
        if job.local_path:
            return [host.describe(fio_argv("fio", job, job.local_path, "io_uring", runtime, ramp_time, "fio.json"))]
        hostid = "<uuid>"
        hostnqn = f"nqn.2014-08.org.nvmexpress:uuid:{hostid}"
        device = self.path("dev/nvmeXnY")
        return [
            host.describe(["sh", "-c", _WRITE, "sh", str(job.knobs["so_priority"]),
                           self.path("sys/module/nvme_tcp/parameters/so_priority")]),
            host.describe(["sh", "-c", _WRITE, "sh", str(job.knobs["busy_poll_us"]),
                           self.path("proc/sys/net/core/busy_read")]),
            *(self._plan_tls(host, TLS_HOSTNQN, job.nqn or "?") if job.knobs.get("tls") == "on" else []),
            host.describe(connect_argv(job, address, port, TLS_HOSTNQN if uses_named_host(job.knobs) else hostnqn,
                                       hostid, "RUN_DHCHAP_SECRET")),
            f"(wait for {device}: {self.path('sys/class/nvme')}/nvmeX with subsysnqn {job.nqn}, hostnqn "
            f"{hostnqn}, state live)",
            host.describe(fio_argv("fio", job, device, "io_uring", runtime, ramp_time, "fio.json")),
            host.describe(["nvme", "disconnect", "-d", "nvmeX"]),
            "(then the two settings above restored)",
        ]

    def _connect(self, host: Host, argv: list[str], knobs: dict[str, Any]) -> None:
        """`nvme connect`; with DH-HMAC-CHAP a refusal says so (nvmet rejects a wrong key at connect),
        without the command line, which holds the secret."""
        if knobs.get("dhchap", "off") == "off":
            self._run(host, argv)
            return
        done = self._run(host, argv, check=False)
        if done.returncode == 0:
            return
        said = " ".join((done.stderr or done.stdout or "").split())[:300]
        wrong = " (the point's wrong_key: a secret the target does not hold)" if knobs.get("wrong_key") else ""
        # nvme-cli says only that the write failed; the host kernel's log says whether authentication did.
        log = self._run(host, ["dmesg"], check=False).stdout or ""
        refused = [line for line in log.splitlines()[-40:] if "authentication failed" in line]
        if refused:
            raise StackError(f"dhchap = {knobs['dhchap']}: {host.name}: nvme connect refused: DH-HMAC-CHAP "
                             f"authentication failed{wrong} (kernel: {refused[-1].split('] ', 1)[-1][:120]})")
        raise StackError(f"dhchap = {knobs['dhchap']}: {host.name}: nvme connect exited {done.returncode} with "
                         f"DH-HMAC-CHAP on{wrong}: {said}")

    def _wait_device(self, host: Host, nqn: str, hostnqn: str, skip: set[str] = frozenset()) -> str:
        deadline = time.monotonic() + DEVICE_WAIT_S
        while True:
            for ctrl, namespaces in self._controllers(host, nqn, hostnqn, live=True):
                if ctrl in skip:
                    continue
                for name in namespaces:
                    device = self.path(f"dev/{name}")
                    if self._exists(host, device):
                        return device
            if time.monotonic() > deadline:
                raise StackError(f"{host.name}: no live controller with a namespace for {nqn} "
                                 f"{DEVICE_WAIT_S:.0f} s after nvme connect")
            time.sleep(0.2)

    def _controllers(self, host: Host, nqn: str, hostnqn: str, live: bool = False) -> list[tuple[str, list[str]]]:
        """Our controllers of `nqn` in sysfs: [(nvmeN, [block device names])]."""
        done = self._run(host, ["sh", "-c", _SCAN, "sh", self.path("sys/class/nvme")], check=False)
        return find_controllers(done.stdout, nqn, hostnqn, live)

    def _engine(self, host: Host) -> str:
        """io_uring where fio has it and the kernel allows it, else libaio."""
        if host.name not in self._engines:
            has = self._ask(host, [host.binary("fio"), "--enghelp=io_uring"]).returncode == 0
            disabled = self._ask(host, ["cat", self.path("proc/sys/kernel/io_uring_disabled")])
            off = disabled.returncode == 0 and disabled.stdout.strip() == "2"  # 2: disabled for everyone
            self._engines[host.name] = "io_uring" if has and not off else "libaio"
        return self._engines[host.name]

    # -- both -----------------------------------------------------------------------------------
    def clean_leftovers(self, host: Host) -> list[str]:
        """Once per machine and process, before anything else of the kernel stack there: remove what
        an earlier run left (only nvmflab's marked entries, kernel_leftovers.py) and say so on
        stderr. Returns what was found; a step that fails is said, and the start that follows
        refuses what is still there by name."""
        if host in _CLEANED:
            return []
        _CLEANED.add(host)
        found = leftovers.Leftovers()
        for script in (leftovers.SCAN_TARGET, leftovers.SCAN_KEYS):
            leftovers.parse(self._run(host, ["sh", "-c", script, "sh", self.root], check=False).stdout or "", found)
        if not found:
            return []
        failed = [" ".join(argv) for argv in found.steps(self.root) if self._run(host, argv, check=False).returncode]
        names = found.names()
        print(f"nvmflab: {host.name}: removed what an earlier nvmflab run left: {', '.join(names)}"
              + (f" ({len(failed)} step(s) failed, first: `{failed[0]}`)" if failed else ""), file=sys.stderr)
        return names

    def unavailable(self, host: Host, side) -> str | None:
        try:
            if not self._is_root(host):
                return f"{host.name}: the kernel {side} needs root (or passwordless sudo)"
            modules = ("nvmet", "nvmet_tcp") if side == "target" else ("nvme_tcp",)
            for module in modules:  # installed (kept for the run) asked before loaded (asked each time)
                if self._ask(host, ["modinfo", module]).returncode != 0 and \
                        not self._exists(host, self.path(f"sys/module/{module}")):
                    return f"{host.name}: kernel module {module} is neither loaded nor installed"
            if side == "target":
                nvmet = self.path("sys/kernel/config/nvmet")
                mounts = self._run(host, ["cat", self.path("proc/mounts")], check=False).stdout
                if not self._exists(host, nvmet) and " configfs " not in mounts:
                    return f"{host.name}: configfs is not mounted ({self.path('sys/kernel/config')})"
                return None
            for tool in ("nvme", "fio"):
                if host.which(tool) is None:
                    return f"{host.name}: {tool} not found ({'nvme-cli' if tool == 'nvme' else 'fio'} is needed)"
        except (HostError, StackError) as err:
            return str(err)
        return None

    def rdma_unavailable(self, host: Host, side) -> str | None:
        module = target_module("rdma") if side == "target" else host_module("rdma")
        try:
            if self._ask(host, ["modinfo", module]).returncode == 0 or \
                    self._exists(host, self.path(f"sys/module/{module}")):
                return None
        except (HostError, StackError) as err:
            return str(err)
        return f"{host.name}: kernel module {module} is neither loaded nor installed (CONFIG_NVME_{'TARGET_' if side == 'target' else ''}RDMA)"

    # The 6.12 host offers version 1 identities; nvmet finds either in the keyring (both inserted).
    tls_identities = frozenset({1})

    def host_tls_records(self, log: str) -> str | None:
        """What a session did not read over its connect (KernelSession.tls_records, which the
        runner prefers) is not guessed: nvme_tcp hands only the handshake to tlshd and has no
        userspace record layer, but whether the kernel's TLS carried the records is read, not assumed."""
        return f"{kernel_tls.UNKNOWN} (the kernel host's /proc/net/tls_stat was not read for this point)"

    def _tls_stat(self, host: Host) -> tuple[dict[str, int] | None, str]:
        return kernel_tls.read(lambda argv: self._run(host, argv, check=False, sudo=False), self.path(kernel_tls.FILE))

    def tls_unavailable(self, host: Host, side) -> str | None:
        """What the host lacks for kernel NVMe/TCP over TLS (topology/tls.py), or None."""
        why = tls_facts.kernel_unavailable(tls_facts.probe(host, self.path("")), side)
        return f"{host.name}: {why}" if why else None

    def _tls_ready(self, host: Host, side: str, undo: list[list[str]]) -> None:
        """Refuse a host that cannot do it, then load the kernel's TLS and have tlshd running (started
        through systemd when it is not, and stopped again at teardown)."""
        why = self.tls_unavailable(host, side)
        if why:
            raise StackError(f"tls = on: {why}")
        self._run(host, ["modprobe", "tls"], check=False)  # built in (CONFIG_TLS=y) is fine too
        if self._run(host, ["pgrep", "-x", "tlshd"], check=False, sudo=False).returncode == 0:
            return
        done = self._run(host, ["systemctl", "start", "tlshd"], check=False)
        if done.returncode != 0:
            raise StackError(f"tls = on: {host.name}: tlshd is not running and `systemctl start tlshd` failed: "
                             f"{' '.join((done.stderr or done.stdout or '').split())[:200]}")
        undo.append(["systemctl", "stop", "tlshd"])

    def _insert_tls_key(self, host: Host, key: str, hostnqn: str, subnqn: str, undo: list[list[str]]) -> None:
        """The configured PSK into the `.nvme` keyring for (host, subsystem), identity versions 0 and
        1 (the kernel host offers version 1; a peer may look up either); each key unlinked at teardown."""
        for identity in (0, 1):
            done = self._run(host, tls_key_argv(key, hostnqn, subnqn, identity), check=False)
            if done.returncode != 0:
                raise StackError(f"tls = on: {host.name}: nvme check-tls-key --insert failed: "
                                 f"{' '.join((done.stderr or done.stdout or '').split())[:200]}")
            serial = inserted_serial(done.stdout or "")
            if serial is not None:  # a key already there is updated in place: unlinking twice is harmless
                undo.append(["sh", "-c", 'keyctl unlink "$1" %:.nvme >/dev/null 2>&1 || true', "sh", str(serial)])

    def _plan_tls(self, host: Host, hostnqn: str, subnqn: str) -> list[str]:
        return [host.describe(["modprobe", "tls"]), "(tlshd running: else systemctl start tlshd)",
                *(host.describe(tls_key_argv("RUN_TLS_KEY", hostnqn, subnqn, v)) for v in (0, 1))]

    def versions(self, host: Host) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for key, argv in (("kernel", ["uname", "-r"]), ("nvme-cli", ["nvme", "version"]), ("fio", ["fio", "--version"])):
            try:
                done = self._ask(host, argv, sudo=False)
                lines = (done.stdout or done.stderr).strip().splitlines() if done.returncode == 0 else []
                out[key] = lines[0][:100] if lines else None
            except (HostError, StackError):
                out[key] = None
        return out

    # -- helpers: every command goes through the host, as root --------------------------------------
    def _sudo_for(self, host: Host) -> list[str]:
        if "*" in self._sudo:
            return self._sudo["*"]
        if host.name not in self._sudo:
            uid = checked(host.ask(["id", "-u"]), host.name, ["id", "-u"]).stdout.strip()
            self._sudo[host.name] = [] if uid == "0" else ["sudo", "-n"]
        return self._sudo[host.name]

    def _is_root(self, host: Host) -> bool:
        return self._ask(host, ["true"]).returncode == 0  # root, or sudo -n works: kept for the run

    def _ask(self, host: Host, argv: list[str], sudo: bool = True) -> subprocess.CompletedProcess[str]:
        """_run(check=False) of a read-only question whose answer the run does not change (an
        installed module, a tool's version): `Host.ask`, once per run and host."""
        prefix = self._sudo_for(host) if sudo else []
        try:
            return host.ask(prefix + argv)
        except HostError as err:
            raise StackError(" ".join(str(err).split())) from None

    def _run(self, host: Host, argv: list[str], check: bool = True, sudo: bool = True, timeout: float = 60):
        prefix = self._sudo_for(host) if sudo else []
        try:
            return host.run(prefix + argv, timeout=timeout, check=check)
        except HostError as err:
            raise StackError(" ".join(str(err).split())) from None

    def _exists(self, host: Host, path: str) -> bool:
        return self._run(host, ["test", "-e", path], check=False).returncode == 0

    def _read(self, host: Host, path: str) -> str:
        return self._run(host, ["cat", path]).stdout.strip()[:4096]

    def _write(self, host: Host, path: str, value: str) -> None:
        self._run(host, ["sh", "-c", _WRITE, "sh", value, path])

    def _set(self, host: Host, path: str, value: str, undo: list[list[str]], old: str | None = None) -> None:
        """Write `value`, recording how to put back the old value (read first unless given)."""
        old = self._read(host, path) if old is None else old
        if old == value:
            return
        self._write(host, path, value)
        undo.append(["sh", "-c", _WRITE, "sh", old, path])

    def _mkdir(self, host: Host, path: str, undo: list[list[str]], what: str | None = None) -> None:
        """mkdir that refuses an existing name: it is someone else's, and stays untouched."""
        if what and self._exists(host, path):
            raise StackError(f"{host.name}: {what} exists already ({path}); nvmflab does not reuse or touch it")
        self._run(host, ["mkdir", path])
        undo.append(["rmdir", path])

    def _load_module(self, host: Host, module: str, undo: list[list[str]] | None, args: tuple[str, ...] = ()) -> None:
        if self._exists(host, self.path(f"sys/module/{module}")):
            return
        self._run(host, ["modprobe", module, *args])
        if undo is not None:  # `modprobe -r nvmet_tcp` may have taken nvmet along already
            undo.append(["sh", "-c", '! test -e "$1" || modprobe -r "$2"', "sh",
                         self.path(f"sys/module/{module}"), module])

    def _free_port_id(self, host: Host, ports: str) -> int:
        done = self._run(host, ["ls", ports])
        used = {int(n) for n in done.stdout.split()[:65536] if n.isdigit() and len(n) < 6}
        return next(i for i in range(1, 65536) if i not in used)

    def _hold(self, host: Host, path: str, value: str) -> None:
        """A host-wide setting for one session; sessions on one host must agree, the last restores it."""
        key = (host.name, path)
        if key in self._held:
            users, old, held = self._held[key]
            if held != value:
                raise StackError(f"{host.name}: {path} is one value per host: another job holds {held}, "
                                 f"this one wants {value}")
            self._held[key][0] = str(int(users) + 1)
            return
        old = self._read(host, path)
        if old != value:
            self._write(host, path, value)
        self._held[key] = ["1", old, value]

    def _release(self, host: Host, path: str) -> None:
        key = (host.name, path)
        users, old, value = self._held[key]
        if int(users) > 1:
            self._held[key][0] = str(int(users) - 1)
            return
        del self._held[key]
        if old != value:
            self._write(host, path, old)


def find_controllers(scan: str, nqn: str, hostnqn: str, live: bool) -> list[tuple[str, list[str]]]:
    """Parse _SCAN's lines; a multipath path device (nvmeAcBnC) stands for its head nvmeAnC."""
    found = []
    for line in scan.splitlines()[:1024]:
        fields = line.split("\t")
        if len(fields) != 5 or not _CTRL.fullmatch(fields[0]):
            continue
        ctrl, subsysnqn, ctrl_hostnqn, state, entries = fields
        if subsysnqn.strip() != nqn or ctrl_hostnqn.strip() != hostnqn or (live and state.strip() != "live"):
            continue
        names = sorted({f"nvme{m[1]}n{m[2]}" for e in entries.split()[:256] if (m := _NS.fullmatch(e))})
        found.append((ctrl, names))
    return found


def _name(text: str, what: str) -> str:
    """A configfs directory name from outside input: one path component, nothing else."""
    if not text or len(text) > 223 or "/" in text or text in (".", "..") or not text.isprintable():
        raise StackError(f"{what} {text[:60]!r} cannot name a configfs directory")
    return text


STACK = KernelStack  # what get_stack('kernel') makes


def dhchap_hosts(setup: TargetSetup) -> tuple[str, ...]:
    """The host NQNs the subsystems admit: the spec's, or with DH-HMAC-CHAP the one the host connects
    with (nvmet authenticates only hosts in allowed_hosts; with any host allowed it asks none)."""
    return setup.allowed_hosts or (tls_hosts(setup) if setup.dhchap != "off" else ())


def dhchap_host_attrs(setup: TargetSetup) -> list[tuple[str, str]]:
    """The nvmet host entry's attributes for DH-HMAC-CHAP, in the order they are written."""
    return [("dhchap_hash", "hmac(sha256)"), ("dhchap_dhgroup", setup.dhchap), ("dhchap_key", setup.dhchap_key or "")]


def tls_hosts(setup: TargetSetup) -> tuple[str, ...]:
    """The host NQNs the target's keyring gets the run's TLS key for (as our target's [[host]])."""
    return setup.allowed_hosts or (TLS_HOSTNQN,)


def tls_key_argv(key: str, hostnqn: str, subnqn: str, identity: int) -> list[str]:
    """nvme-cli 2.x: derive the TLS PSK from the configured key and insert it into `.nvme`."""
    return ["nvme", "check-tls-key", "--keyring=.nvme", f"--hostnqn={hostnqn}", f"--subsysnqn={subnqn}",
            f"--keydata={key}", f"--identity={identity}", "--insert"]


_INSERTED = re.compile(r"Inserted TLS key ([0-9a-fA-F]{1,8})\b")


def inserted_serial(text: str) -> int | None:
    """The key serial `nvme check-tls-key --insert` printed (hex), or None."""
    match = _INSERTED.search(text[:4096])
    return int(match.group(1), 16) if match else None
