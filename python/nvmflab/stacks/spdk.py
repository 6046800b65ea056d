"""SPDK: nvmf_tgt configured over JSON-RPC (the build's scripts/rpc.py) and spdk_nvme_perf.

The build is found through NVMFLAB_SPDK_DIR, else the cache scripts/build-spdk.sh fills
(${XDG_CACHE_HOME:-~/.cache}/nvmflab/spdk-24.01), evaluated on the host that runs it. Every SPDK
process runs without hugepages (`--no-huge -s MB`) when the host has too few free ones, except over
RDMA, which needs them: there the point is refused with the reason (`rdma_hugepages_refusal`).

spdk_nvme_perf prints text: a per-(namespace, core) table and, with -LL, a latency histogram per
(namespace, core). `parse_output` turns that into fio-layout JSON with `nvmflab.histogram`.
Its histogram does not separate reads from writes; for mixed workloads the I/O counts are split by
rwmixread (recorded as `nvmflab.direction_split = "rwmixread"`) and the histogram is kept whole.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path
from typing import Any

from ..plan import PerfJob, TargetSetup
from ..topology.base import Host, HostError, HostProcess
from ..knobs import KnobMap, Setter, apply
from .base import Fixed, HostSession, RunningTarget, Stack, StackError, error_line, links_rdma
from .ours import TLS_HOSTNQN, tls_hosts
from . import spdk_sockbuf

DEFAULT_DIR = "${XDG_CACHE_HOME:-$HOME/.cache}/nvmflab/spdk-24.01"
BUILD_HINT = "build it with `make spdk` (scripts/build-spdk.sh) or point NVMFLAB_SPDK_DIR at an SPDK build"
READY_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 60.0
BASE_MEM_MB = 1024  # DPDK memory an SPDK process gets besides malloc bdevs (peers/README.md)
IO_UNIT_SIZE = 131072  # SPDK's TCP default; in-capsule data must not exceed it
MAX_REPORT_CHARS = 8 << 20
MAX_HISTOGRAM_ROWS = 100_000
TIMES_MARK = "nvmflab-times"

def _in_capsule(size: int, _knobs: dict) -> list[str]:
    if size % 16 or not 0 <= size <= IO_UNIT_SIZE:
        raise StackError(f"SPDK in-capsule data size must be a multiple of 16 up to {IO_UNIT_SIZE}; got {size}")
    return ["-c", str(size)]


ACCEPTED = "accepted: negotiated by the host"
TARGET_KNOBS: KnobMap = {
    "target_mode": Fixed("poll", "SPDK's reactors always busy-poll their poll groups"),
    # Options of target_rpcs's nvmf_create_transport call.
    "in_capsule_data_size": Setter("`nvmf_create_transport -c` (multiple of 16, ≤ 128 KiB)", _in_capsule),
    "so_priority": Setter("`nvmf_create_transport --sock-priority`", lambda v, _k: ["-y", str(v)]),
    # v24.01 has no busy-poll microseconds; ADQ-style steering is the posix sock placement id
    # (NAPI), the kernel's net.core.busy_poll/busy_read sysctls do the rest.
    "busy_poll_us": Setter("`sock_impl_set_options --enable-placement-id 1` when > 0 (v24.01 has no µs "
                           "setting; the kernel's `net.core.busy_poll`/`busy_read` apply)"),
    "hdr_digest": Setter(ACCEPTED),
    "data_digest": Setter(ACCEPTED),
    "transport": Setter("`nvmf_create_transport -t TCP|RDMA` (RDMA only in a build with it: "
                        "scripts/build-spdk.sh configures `--with-rdma`)"),
    "tls": Setter("`nvmf_subsystem_add_listener --secure-channel`, `nvmf_subsystem_add_host NQN --psk FILE` (the "
                  "run's key, mode 0600) for the host NQN, and the ssl socket's buffers at the posix socket's 2 MiB "
                  "(`sock_impl_set_options -i ssl`: SPDK 24.01's 4 KiB ones stall large reads)"),
}
HOST_KNOBS: KnobMap = {
    "completion": Fixed("poll", "spdk_nvme_perf always polls its queue pairs"),
    "io_queues": Setter("spdk_nvme_perf `-P` (queue pairs per core: io_queues / numjobs)",
                        lambda v, k: ["-P", str(v // int(k.get("numjobs", 1)))]),
    "hdr_digest": Setter("spdk_nvme_perf `-H`", lambda v, _k: ["-H"] if v else []),
    "data_digest": Setter("spdk_nvme_perf `-I`", lambda v, _k: ["-I"] if v else []),
    "transport": Setter("spdk_nvme_perf `-r 'trtype:TCP|RDMA ...'` (RDMA as on the target side)"),
    "tls": Setter("spdk_nvme_perf `-S ssl --psk-path FILE` (the run's key, mode 0600) and `hostnqn:` in `-r`, "
                  "with a preloaded shim that raises its ssl socket's 4 and 64 KiB buffers to 2 MiB "
                  "(stacks/spdk_sockbuf.c, built with the host's cc: spdk_nvme_perf has no option for them)"),
    # sqflow is absent: SPDK's host library has no way to ask for SQ flow control to be disabled.
}
# The PSK file SPDK reads (it refuses one others can read), written with umask 077.
_KEY_FILE = 'umask 077; printf "%s" "$1" > "$2"'

RW = {"read": "read", "write": "write", "randread": "randread", "randwrite": "randwrite",
      "rw": "rw", "randrw": "randrw"}


# -- locating the build ---------------------------------------------------------------------------

def spdk_dir(host: Host) -> str | None:
    """The SPDK build on `host` (NVMFLAB_SPDK_DIR there, else the default cache), or None."""
    script = (f'd="${{NVMFLAB_SPDK_DIR:-{DEFAULT_DIR}}}"; '
              'test -x "$d/build/bin/nvmf_tgt" && test -f "$d/scripts/rpc.py" && echo "$d"')
    try:
        done = host.run(["sh", "-c", script], check=False, timeout=20)
    except HostError:
        return None
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else None


def _require_dir(host: Host) -> str:
    found = spdk_dir(host)
    if found is None:
        raise StackError(f"{host.name}: no SPDK build found; {BUILD_HINT}")
    return found


def free_hugepages_mb(host: Host) -> int:
    """MiB of free hugepages on `host` (/proc/meminfo); 0 when it cannot be read."""
    try:
        meminfo = host.read_text("/proc/meminfo")
    except HostError:
        meminfo = ""
    fields = dict(re.findall(r"^(HugePages_Free|Hugepagesize):\s+(\d+)", meminfo, re.M))
    return int(fields.get("HugePages_Free", 0)) * int(fields.get("Hugepagesize", 0)) // 1024


def memory_args(host: Host, need_mb: int) -> list[str]:
    """`-s MB`, plus `--no-huge` when the host's free hugepages cannot hold MB."""
    return ["-s", str(need_mb)] if free_hugepages_mb(host) >= need_mb else ["--no-huge", "-s", str(need_mb)]


def rdma_hugepages_refusal(host: Host, need_mb: int) -> str | None:
    """Why SPDK cannot speak RDMA on `host` with `need_mb` of memory, or None: over RDMA it needs
    hugepages. With --no-huge its buffers get no RDMA memory registration and every queue fails
    ("No translation for ptr"; tests/rdma/spdk-check.sh met it in the trixie guest)."""
    free = free_hugepages_mb(host)
    if free >= need_mb:
        return None
    return (f"{host.name}: SPDK over RDMA needs hugepages (with --no-huge its buffers get no RDMA memory "
            f"registration); {free} MiB of hugepages are free there and SPDK takes {need_mb} MiB: reserve "
            f"them (2 MiB pages: sysctl vm.nr_hugepages={-(-need_mb // 2)})")


def missing_libraries(host: Host, program: str) -> list[str]:
    """The shared libraries `program` needs that `host` lacks (ldd's "not found"); [] where ldd
    is missing or says nothing: the program's start then names what failed."""
    script = 'ldd "$1" 2>/dev/null | sed -n -E "s/^[[:space:]]*([^ ]+) => not found.*/\\1/p"'
    try:
        done = host.run(["sh", "-c", script, "sh", program], check=False, timeout=20)
    except HostError:
        return []
    return done.stdout.split()


def start_error(log: str) -> str:
    """Why an SPDK app ended at its start: its first error line, the cause (OpenSSL without its
    configuration file, say); what follows is what gave up because of it, down to its shutdown's
    "Failed to unlink lock fd"."""
    for line in log.splitlines():
        if "error" in line.lower() or "failed" in line.lower():
            return line.strip()
    return error_line(log)


def core_mask(cores: list[int] | tuple[int, ...]) -> str:
    if not cores or any(c < 0 or c > 1023 for c in cores):
        raise StackError(f"SPDK needs a core list of 0..1023, got {list(cores)}")
    return hex(sum(1 << c for c in set(cores)))


def _mib(size: int, what: str) -> int:
    if size <= 0 or size % (1 << 20):
        raise StackError(f"SPDK {what} sizes are whole MiB; {size} bytes is not")
    return size >> 20


# -- target ---------------------------------------------------------------------------------------

# SPDK 24.01's `ssl` socket sets SO_RCVBUF and SO_SNDBUF to 4 KiB unless told (its `posix` socket:
# 2 MiB); the listener's small send buffer passes to every accepted socket and stops the kernel's
# autotuning, so a 64-128 KiB read left in 8 KiB pieces, each waiting for a delayed ACK: 80-90 ms
# per read (bench/README.md, "SPDK's TLS baseline stalled"). A TLS target gets the posix socket's
# sizes; its host, which has no such RPC, gets them from spdk_sockbuf's shim.
SSL_SOCKET_BUFFERS = ["sock_impl_set_options", "-i", "ssl", "--recv-buf-size", str(spdk_sockbuf.FLOOR_BYTES),
                      "--send-buf-size", str(spdk_sockbuf.FLOOR_BYTES)]


def target_rpcs(setup: TargetSetup, port: int, psk_path: str = "PSK_FILE") -> list[list[str]]:
    """The rpc.py calls that configure a freshly started `nvmf_tgt --wait-for-rpc` (with TLS on:
    a secure-channel listener and each admitted host with the PSK in `psk_path`)."""
    calls: list[list[str]] = []
    if setup.busy_poll_us > 0:
        calls.append(["sock_impl_set_options", "-i", "posix", "--enable-placement-id", "1"])
    if setup.tls == "on":
        calls.append(SSL_SOCKET_BUFFERS)
    calls += [["framework_start_init"], ["framework_wait_init"]]
    transport = {"in_capsule_data_size": setup.in_capsule_data_size, "so_priority": setup.so_priority}
    calls.append(["nvmf_create_transport", "-t", setup.transport, "-u", str(IO_UNIT_SIZE),
                  *apply(TARGET_KNOBS, "target", transport)])  # -y, -c from the registry's setters
    for index, sub in enumerate(setup.subsystems):
        bdev = bdev_name(index)
        if sub.backend == "null":
            calls.append(["bdev_null_create", bdev, str(_mib(sub.size, "null")), str(sub.block_size)])
        elif sub.backend == "ram":
            calls.append(["bdev_malloc_create", "-b", bdev, str(_mib(sub.size, "ram")), str(sub.block_size)])
        elif sub.backend == "file":
            if not sub.path:
                raise StackError("a file backend needs a path")
            calls.append(["bdev_aio_create", sub.path, bdev, str(sub.block_size)])
        else:
            raise StackError(f"backend {sub.backend!r} has no SPDK bdev here")
        # SPDK refuses a secure channel on a subsystem that admits any host: TLS lists the host.
        any_host = [] if setup.allowed_hosts or setup.tls == "on" else ["-a"]
        calls += [["nvmf_create_subsystem", sub.nqn, *any_host, "-s", f"NVMFLAB{index + 1:04d}"]]
        tls = ["--psk", psk_path] if setup.tls == "on" else []
        calls += [["nvmf_subsystem_add_host", sub.nqn, h, *tls] for h in (tls_hosts(setup) if tls else
                                                                           setup.allowed_hosts)]
        calls += [["nvmf_subsystem_add_ns", sub.nqn, bdev],
                  ["nvmf_subsystem_add_listener", sub.nqn, "-t", setup.transport, "-f", "ipv4", "-a", setup.listen_ip,
                   "-s", str(port), *(["--secure-channel"] if tls else [])]]
    return calls


def bdev_name(index: int) -> str:
    return f"nvmflab{index}"


def target_mem_mb(setup: TargetSetup) -> int:
    return BASE_MEM_MB + sum(s.size >> 20 for s in setup.subsystems if s.backend == "ram")


def rpc_error(stderr: str) -> str:
    """The one line that says why rpc.py failed (the JSON-RPC error message when there is one)."""
    found = re.findall(r'"message":\s*"([^"]{0,300})"', stderr)
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return found[-1] if found else (lines[-1][:300] if lines else "(no output)")


def parse_json_stream(text: str, expected: int) -> list[Any]:
    """rpc.py's batch output: `expected` JSON documents printed one after another."""
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while len(docs) < expected:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise StackError(f"SPDK RPC answer {len(docs) + 1} of {expected} is not JSON: {err}") from None
        docs.append(doc)
    return docs


def stats_from_rpc(reactors: dict, threads: dict, nvmf: dict, iostats: list[tuple[str, dict]]) -> dict[str, Any]:
    """framework_get_reactors, thread_get_stats, nvmf_get_stats and per-channel bdev_get_iostat
    in the layout of nvmf-target's /stats (CONTRACTS.md §2). `iostats` pairs a subsystem NQN (nsid 1)
    with its bdev's per-channel statistics. Queues are not counted by SPDK: `queues` stays empty."""
    def ns(ticks: Any, rate: Any) -> int:
        if not isinstance(ticks, (int, float)) or not isinstance(rate, (int, float)) or rate <= 0:
            raise StackError("SPDK stats carry no usable tick counts")
        return int(ticks * 1_000_000_000 // rate)

    rate = reactors.get("tick_rate")
    groups = {g.get("name"): g for g in nvmf.get("poll_groups", []) if isinstance(g, dict)}
    out_reactors = []
    for index, reactor in enumerate(reactors.get("reactors", [])):
        thread_ids = {t.get("id") for t in reactor.get("lw_threads", [])}
        names = [t.get("name") for t in reactor.get("lw_threads", [])]
        namespaces = []
        for subnqn, stat in iostats:
            chans = [c for c in stat.get("channels", []) if c.get("thread_id") in thread_ids]
            reads = sum(int(c.get("num_read_ops", 0)) for c in chans)
            writes = sum(int(c.get("num_write_ops", 0)) for c in chans)
            other = sum(int(c.get("num_unmap_ops", 0)) + int(c.get("num_copy_ops", 0)) for c in chans)
            namespaces.append({"subnqn": subnqn, "nsid": 1, "commands": reads + writes + other, "reads": reads,
                               "writes": writes, "other": other,
                               "bytes_read": sum(int(c.get("bytes_read", 0)) for c in chans),
                               "bytes_written": sum(int(c.get("bytes_written", 0)) for c in chans)})
        out_reactors.append({
            "index": index, "core": reactor.get("lcore"), "mode": "poll", "idle_poll_us": 0,
            "busy_ns": ns(reactor.get("busy", 0), rate), "idle_ns": ns(reactor.get("idle", 0), rate), "wakeups": 0,
            "commands": sum(int(groups[n].get("completed_nvme_io", 0)) for n in names if n in groups),
            "bytes_read": sum(n["bytes_read"] for n in namespaces),
            "bytes_written": sum(n["bytes_written"] for n in namespaces),
            "namespaces": namespaces, "queues": []})
    thread_rate = threads.get("tick_rate", rate)
    poll_groups = [{"index": i, "name": t.get("name"), "busy_ns": ns(t.get("busy", 0), thread_rate),
                    "idle_ns": ns(t.get("idle", 0), thread_rate),
                    "completed_nvme_io": int(groups.get(t.get("name"), {}).get("completed_nvme_io", 0)),
                    "io_qpairs": int(groups.get(t.get("name"), {}).get("io_qpairs", 0))}
                   for i, t in enumerate(threads.get("threads", [])) if t.get("name") in groups]
    return {"version": 1, "stack": "spdk", "reactors": out_reactors, "poll_groups": poll_groups}


class SpdkTarget(RunningTarget):
    tls_identity = 0  # the PSK identity version a host must offer it (SpdkStack.tls_identities)

    def __init__(self, setup: TargetSetup, host: Host, workdir: Path, root: str):
        self.setup, self.host, self.root = setup, host, root
        self.address, self.port = setup.listen_ip, host.free_port()
        remote = host.workdir()
        self.sock = f"{remote}/spdk-{self.port}.sock"
        self.pidfile = f"{remote}/spdk-{self.port}.pid"
        self.log_path = workdir / f"spdk-target-{self.port}.log"
        self.pid: int | None = None
        self.psk_path = f"{remote}/spdk-{self.port}.psk"
        if setup.tls == "on":
            if not setup.tls_key:
                raise StackError("tls = on: the target setup carries no TLS key")
            host.run(["sh", "-c", _KEY_FILE, "sh", setup.tls_key, self.psk_path], timeout=20)
        self.rpcs = target_rpcs(setup, self.port, self.psk_path)
        argv = [f"{root}/build/bin/nvmf_tgt", "-m", core_mask(setup.cores), "-r", self.sock, "--wait-for-rpc",
                # the harness owns core placement; lock files would refuse a target started right
                # after another on the same cores (or beside a user's own SPDK app)
                "--disable-cpumask-locks", *memory_args(host, target_mem_mb(setup))]
        # The shell's pid is nvmf_tgt's after exec: it names the DPDK runtime dir stop() removes.
        self.proc: HostProcess = host.spawn(["sh", "-c", f'echo $$ > {shlex.quote(self.pidfile)}; exec "$@"', "sh",
                                             *argv], setup.cores, log=self.log_path)
        try:
            self._wait_socket()
            self.rpc(self.rpcs)
        except BaseException:
            self.stop()
            raise

    def _wait_socket(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise StackError(f"nvmf_tgt exited: {self._log_tail()}")
            if self.host.run(["test", "-S", self.sock], check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.1)
        raise StackError(f"nvmf_tgt made no RPC socket in {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return start_error(self.log_path.read_text(errors="replace") if self.log_path.exists() else "")

    def rpc(self, calls: list[list[str]]) -> str:
        """Run rpc.py calls as one batch (one command per line on stdin); stdout, or StackError."""
        argv = ["python3", f"{self.root}/scripts/rpc.py", "-s", self.sock, "-t", "30"]
        try:
            done = self.host.run(argv, check=False, timeout=RPC_TIMEOUT_S,
                                 input="".join(shlex.join(c) + "\n" for c in calls))
        except HostError as err:
            raise StackError(str(err)) from None
        if done.returncode != 0:
            raise StackError(f"SPDK RPC failed: {rpc_error(done.stderr)}")
        return done.stdout[:MAX_REPORT_CHARS]

    def stats(self) -> dict[str, Any]:
        calls = [["framework_get_reactors"], ["thread_get_stats"], ["nvmf_get_stats"]]
        calls += [["bdev_get_iostat", "-b", bdev_name(i), "-c"] for i in range(len(self.setup.subsystems))]
        docs = parse_json_stream(self.rpc(calls), len(calls))
        if not all(isinstance(d, dict) for d in docs):
            raise StackError("SPDK stats RPC returned something other than objects")
        iostats = [(sub.nqn, docs[3 + i]) for i, sub in enumerate(self.setup.subsystems)]
        return stats_from_rpc(docs[0], docs[1], docs[2], iostats)

    def cpu_seconds(self) -> tuple[float, float]:
        return self.proc.cpu_seconds()

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        if self.pid is None:
            try:
                self.pid = int(self.host.read_text(self.pidfile).strip() or 0) or None
            except (HostError, ValueError):
                pass
        self.proc.stop()
        leftovers = [self.sock, self.pidfile]
        if self.pid:
            leftovers += [f"/var/run/dpdk/spdk_pid{self.pid}"]
        try:
            self.host.run(["rm", "-rf", "--", *leftovers], check=False, timeout=20)
        except HostError:
            pass


# -- host -----------------------------------------------------------------------------------------

def check_whole_seconds(runtime: float, ramp_time: float) -> None:
    """The measured time must be whole seconds; the warm-up is rounded up (`warmup_seconds`): a
    longer warm-up measures the same thing, a longer or shorter runtime would not."""
    if float(runtime) < 1 or not float(runtime).is_integer():
        raise StackError(f"spdk_nvme_perf takes whole seconds (runtime {runtime}, ramp_time {ramp_time})")


def warmup_seconds(ramp_time: float) -> int:
    """spdk_nvme_perf's `-a` for a ramp_time: whole seconds, rounded up (0.5 s ramps 1 s)."""
    return int(math.ceil(float(ramp_time)))


def perf_args(job: PerfJob, address: str, port: int, runtime: float, ramp_time: float,
              psk_path: str = "PSK_FILE") -> list[str]:
    """spdk_nvme_perf's options for one job (without binary and memory options)."""
    k = job.knobs
    if job.local_path:
        raise StackError("spdk_nvme_perf cannot drive a file or kernel block device here; "
                         "use the ours host stack for local jobs")
    if job.nqn is None:
        raise StackError("an SPDK host job needs a subsystem NQN")
    if k.get("rw") not in RW:
        raise StackError(f"rw {k.get('rw')!r}: spdk_nvme_perf knows {', '.join(RW)}")
    for knob, why in (("rate_iops", "has no rate limit"), ("size", "always spans the whole namespace"),
                      ("verify", "does not verify data")):
        if k.get(knob):
            raise StackError(f"{knob} = {k[knob]!r}: spdk_nvme_perf {why}")
    numjobs = int(k.get("numjobs", 1))
    cpus = list(job.cpus)
    if len(cpus) < numjobs:
        raise StackError(f"spdk_nvme_perf runs one job per core: numjobs {numjobs} needs {numjobs} cpus, "
                         f"got {cpus}")
    queues = k.get("io_queues") or numjobs
    if queues % numjobs:
        raise StackError(f"io_queues {queues}: spdk_nvme_perf opens the same number of queue pairs (-P) on "
                         f"each of its {numjobs} cores")
    check_whole_seconds(runtime, ramp_time)
    trid = f"trtype:{k.get('transport', 'tcp').upper()} adrfam:IPv4 traddr:{address} trsvcid:{port} subnqn:{job.nqn}"
    tls = k.get("tls", "off") == "on"
    if job.hostnqn or tls:  # the PSK identity names the host: the NQN the target holds the key for
        trid += f" hostnqn:{job.hostnqn or TLS_HOSTNQN}"
    argv = ["-r", trid, "-c", core_mask(cpus[:numjobs]), "-q", str(k["iodepth"]), "-o", str(k["bs"]),
            "-w", RW[k["rw"]], "-t", str(int(runtime)), "-LL"]
    if ramp_time:
        argv += ["-a", str(warmup_seconds(ramp_time))]
    if k["rw"] in ("rw", "randrw"):
        argv += ["-M", str(k["rwmixread"])]
    argv += ["-S", "ssl", "--psk-path", psk_path] if tls else []
    return argv + apply(HOST_KNOBS, "host", k | {"io_queues": queues})  # -P, -H, -I


def wrap_output(argv: list[str], output: str) -> list[str]:
    """sh runs the tool with stdout to `output`, removes the DPDK runtime dir it leaves, and appends
    the children's CPU times (`times`) so the report carries usr/sys CPU like fio's."""
    script = ('out="$1"; shift; "$@" > "$out" & pid=$!; wait $pid; rc=$?; '
              'rm -rf "/var/run/dpdk/spdk_pid$pid"; '
              f'{{ echo {TIMES_MARK}; times; }} >> "$out"; exit $rc')
    return ["sh", "-c", script, "sh", output, *argv]


_ROW = re.compile(r"^(?P<name>.*\S)\s*:\s+(?P<iops>[\d.]+)\s+(?P<mibs>[\d.]+)\s+(?P<avg>[\d.]+)\s+"
                  r"(?P<min>[\d.]+)\s+(?P<max>[\d.]+)\s*$")
_BUCKET = re.compile(r"^\s*(?P<lo>[\d.]+)\s+-\s+(?P<hi>[\d.]+):\s+[\d.]+%\s+\(\s*(?P<count>\d+)\)\s*$")
_TIME = re.compile(r"(\d+)m([\d.]+)s")


def parse_perf_text(text: str, rw: str, rwmixread: int, bs: int, runtime: float,
                    ramp_time: float = 0.0) -> dict[str, Any]:
    """spdk_nvme_perf's text report (with -LL) as fio-layout JSON plus `nvmflab.histogram`.
    CPU percentages are over runtime + ramp_time: `times` counts the whole process."""
    if len(text) > MAX_REPORT_CHARS:
        raise StackError(f"spdk_nvme_perf report is {len(text)} characters, more than {MAX_REPORT_CHARS}")
    rows, total, hist, cpu = [], None, {}, None
    in_table, lines = False, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Device Information"):
            in_table = True
            continue
        if in_table and line.startswith("Total"):
            m = _ROW.match(line)
            total, in_table = (m.groupdict() if m else None), False
            continue
        if in_table and not line.startswith("====="):
            m = _ROW.match(line)
            if not m:
                raise StackError(f"spdk_nvme_perf: unreadable result row: {line[:120]!r}")
            rows.append(m.groupdict())
        m = _BUCKET.match(line)
        if m:
            if len(hist) >= MAX_HISTOGRAM_ROWS:
                raise StackError(f"spdk_nvme_perf histogram has more than {MAX_HISTOGRAM_ROWS} buckets")
            # A bucket's value is its upper end, as SPDK's own percentile summary reports it.
            value = round(float(m["hi"]) * 1000)
            hist[value] = hist.get(value, 0) + int(m["count"])
        if line.strip() == TIMES_MARK:
            found = [_TIME.findall(x) for x in lines[i + 1:i + 3]]
            if len(found) == 2 and len(found[1]) == 2:
                cpu = tuple(int(mn) * 60 + float(s) for mn, s in found[1])
    if total is None or not rows:
        raise StackError("spdk_nvme_perf printed no result table (did it connect? see its log)")
    iops, mibs = float(total["iops"]), float(total["mibs"])
    avg_ns, max_ns = float(total["avg"]) * 1000, float(total["max"]) * 1000
    min_ns = float(total["min"]) * 1000
    histogram = [[v, hist[v]] for v in sorted(hist) if hist[v] > 0]
    if iops > 0 and not histogram:
        raise StackError("spdk_nvme_perf printed no latency histogram (run it with -LL)")
    total_ios = sum(c for _, c in histogram) if histogram else int(round(iops * runtime))
    read_share = {"read": 1.0, "randread": 1.0, "write": 0.0, "randwrite": 0.0}.get(rw, rwmixread / 100.0)
    percentiles = {f"{p:.6f}": _percentile(histogram, p) for p in (1, 5, 10, 50, 90, 95, 99, 99.9, 99.99)} \
        if histogram else {}

    def side(share: float) -> dict[str, Any]:
        ios = int(round(total_ios * share))
        bw = mibs * (1 << 20) * share
        return {"io_bytes": ios * bs, "io_kbytes": ios * bs // 1024, "bw_bytes": int(bw), "bw": int(bw // 1024),
                "iops": iops * share, "runtime": int(runtime * 1000), "total_ios": ios,
                "lat_ns": {"min": min_ns if ios else 0, "max": max_ns if ios else 0, "mean": avg_ns if ios else 0.0,
                           "stddev": 0.0},
                "clat_ns": {"min": min_ns if ios else 0, "max": max_ns if ios else 0, "mean": avg_ns if ios else 0.0,
                            "stddev": 0.0, "percentile": percentiles if ios else {}}}

    wall = max(float(runtime) + float(ramp_time), 1e-9)
    job = {"jobname": "spdk_nvme_perf", "groupid": 0, "error": 0, "job_runtime": int(runtime * 1000),
           "read": side(read_share), "write": side(1.0 - read_share),
           "usr_cpu": 100.0 * cpu[0] / wall if cpu else 0.0, "sys_cpu": 100.0 * cpu[1] / wall if cpu else 0.0,
           "ctx": 0, "majf": 0, "minf": 0}
    # The merged histogram goes under the direction that dominates (metrics merges both anyway).
    key = "read" if read_share >= 0.5 else "write"
    return {"fio version": "spdk_nvme_perf", "timestamp": int(time.time()), "jobs": [job],
            "nvmflab": {"engine": "spdk", "histogram": {key: histogram},
                        "direction_split": "rwmixread" if 0 < read_share < 1 else "exact",
                        "devices": [{"name": r["name"], "iops": float(r["iops"])} for r in rows],
                        "cpu_seconds": list(cpu) if cpu else None}}


def _percentile(histogram: list[list[int]], pct: float) -> int:
    total, seen = sum(c for _, c in histogram), 0
    rank = pct / 100.0 * total
    for value, count in histogram:
        seen += count
        if seen >= rank:
            return value
    return histogram[-1][0]


class SpdkSession(HostSession):
    def __init__(self, job: PerfJob, address: str, port: int, binary: str, memory: list[str],
                 psk_path: str = "PSK_FILE", preload: list[str] | None = None):
        self.job, self.address, self.port, self.binary, self.memory = job, address, port, binary, memory
        self.runtime, self.ramp_time, self.psk_path = 0.0, 0.0, psk_path
        self.preload = preload or []  # over TLS: spdk_sockbuf's shim

    def perf_argv(self, runtime: float, ramp_time: float, output: str) -> list[str]:
        self.runtime, self.ramp_time = float(runtime), float(warmup_seconds(ramp_time))
        args = perf_args(self.job, self.address, self.port, runtime, ramp_time, self.psk_path)
        return wrap_output([*self.preload, self.binary, *self.memory, *args], output)

    def parse_output(self, text: str) -> dict[str, Any]:
        k = self.job.knobs
        return parse_perf_text(text, k["rw"], int(k.get("rwmixread", 50)), int(k["bs"]), self.runtime,
                               self.ramp_time)


class SpdkStack(Stack):
    name = "spdk"
    # SPDK 24.01 makes and accepts only version 0 PSK identities (NVMe0R01 <hostnqn> <subnqn>).
    tls_identities = frozenset({0})
    target_knobs = TARGET_KNOBS
    host_knobs = HOST_KNOBS

    def start_target(self, setup: TargetSetup, host: Host, workdir: Path) -> SpdkTarget:
        root = _require_dir(host)
        if setup.transport == "rdma":  # planning checked BASE_MEM_MB; a RAM backend takes more
            refusal = rdma_hugepages_refusal(host, target_mem_mb(setup))
            if refusal:
                raise StackError(refusal)
        try:
            return SpdkTarget(setup, host, workdir, root)
        except HostError as err:
            raise StackError(str(err)) from None

    def plan_target(self, setup: TargetSetup, host: Host) -> list[str]:
        root, sock = spdk_dir(host) or "SPDK_DIR", "WORKDIR/spdk.sock"
        lines = [host.describe([f"{root}/build/bin/nvmf_tgt", "-m", core_mask(setup.cores), "-r", sock,
                                "--wait-for-rpc", "--disable-cpumask-locks", *memory_args(host, target_mem_mb(setup))])]
        lines += [host.describe(["python3", f"{root}/scripts/rpc.py", "-s", sock, *call])
                  for call in target_rpcs(setup, 4420)]
        return lines

    def open_host(self, job: PerfJob, target: RunningTarget | None, host: Host, workdir: Path) -> SpdkSession:
        if job.local_path:
            perf_args(job, "", 0, 1, 0)  # raises the clear reason
        if target is None:
            raise StackError("an SPDK host job needs a running target")
        root = _require_dir(host)
        psk_path = f"{host.workdir()}/spdk-perf-{target.port}.psk"
        preload: list[str] = []
        if job.knobs.get("tls", "off") == "on":
            key = getattr(target.setup, "tls_key", None)
            if not key:
                raise StackError("tls = on: the target this job connects to has no TLS key")
            try:
                host.run(["sh", "-c", _KEY_FILE, "sh", key, psk_path], timeout=20)
            except HostError as err:
                raise StackError(str(err)) from None
            preload = spdk_sockbuf.prefix(spdk_sockbuf.build(host))
        session = SpdkSession(job, target.address, target.port, f"{root}/build/bin/spdk_nvme_perf",
                              memory_args(host, BASE_MEM_MB), psk_path, preload)
        perf_args(job, target.address, target.port, 1, 0)  # refuse a job it cannot run before it starts
        return session

    def plan_host(self, job: PerfJob, address: str, port: int, host: Host, runtime: float = 10.0,
                  ramp_time: float = 2.0) -> list[str]:
        root = spdk_dir(host) or "SPDK_DIR"
        tls = job.knobs.get("tls", "off") == "on"
        preload = spdk_sockbuf.prefix(f"WORKDIR/{spdk_sockbuf.LIBRARY}") if tls else []
        argv = [*preload, f"{root}/build/bin/spdk_nvme_perf", *memory_args(host, BASE_MEM_MB),
                *perf_args(job, address, port, runtime, ramp_time)]
        return [host.describe(argv) + " > perf.txt"]

    def check_timing(self, runtime: float, ramp_time: float) -> None:
        check_whole_seconds(runtime, ramp_time)

    def job_refusal(self, job: PerfJob) -> str | None:
        try:
            perf_args(job, "127.0.0.1", 4420, 1, 0)
        except StackError as error:
            return str(error)
        return None

    def unavailable(self, host: Host, side) -> str | None:
        root = spdk_dir(host)
        if root is None:
            return f"{host.name}: no SPDK build found; {BUILD_HINT}"
        program = f"{root}/build/bin/{'nvmf_tgt' if side == 'target' else 'spdk_nvme_perf'}"
        missing = missing_libraries(host, program)
        if missing:  # e.g. a Debian 12 build on trixie, which renamed libaio.so.1 libaio.so.1t64
            return (f"{host.name}: {program} does not run there: {', '.join(missing)} not found (a build for "
                    "another distribution?); build SPDK on that host (scripts/build-spdk.sh) or point "
                    "NVMFLAB_SPDK_DIR at a build for it")
        return None

    def rdma_unavailable(self, host: Host, side) -> str | None:
        refusal = self.unavailable(host, side)
        if refusal:
            return refusal
        program = f"{spdk_dir(host)}/build/bin/{'nvmf_tgt' if side == 'target' else 'spdk_nvme_perf'}"
        if links_rdma(host, program):
            return rdma_hugepages_refusal(host, BASE_MEM_MB)
        return (f"{host.name}: this SPDK build has no RDMA ({program} does not link librdmacm): "
                "build it again with scripts/build-spdk.sh, which configures --with-rdma (it needs "
                "librdmacm-dev and libibverbs-dev)")

    def host_tls_records(self, log: str) -> str | None:
        """spdk_nvme_perf -S ssl: SPDK's ssl sock layer makes the records through OpenSSL in the
        process (its enable_ktls option is not set)."""
        return "userspace (SPDK ssl sock)"

    def versions(self, host: Host) -> dict[str, str | None]:
        root = spdk_dir(host)
        if root is None:
            return {"spdk": None}
        try:
            done = host.run([f"{root}/build/bin/nvmf_tgt", "--version"], check=False, timeout=20)
        except HostError:
            return {"spdk": None}
        found = re.findall(r"SPDK v[\w.\-]+", done.stdout + done.stderr)
        return {"spdk": found[-1] if found else None}


STACK = SpdkStack  # what get_stack('spdk') makes
