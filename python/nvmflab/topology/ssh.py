"""Real hosts over plain OpenSSH, so the user's ~/.ssh/config (aliases, keys, ProxyJump) applies.

One control master per host (our own child, in a private directory) carries every command, so a
command costs a round trip, not a handshake. `BatchMode` makes a missing key an error instead of
a password prompt that would hang the run.

A spawned command runs on the host under a small sh wrapper: in its own session (setsid), pinned
with taskset; the wrapper reports its PID, exit code and CPU times (`times`) on stderr behind a
random marker. A watchdog on the host reads the ssh channel's stdin, which we keep open: when the
harness dies in any way (Ctrl-C, SIGKILL, a lost network), the channel closes, the watchdog reads
EOF and kills the command's process group. So nothing the run started outlives it on any host.
"""

from __future__ import annotations

import atexit
import ctypes
import getpass
import os
import platform
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .. import procs
from ..tools import OUR_BINARIES, ToolMissing, require_tool
from .base import Host, HostError, HostProcess, Hosts, checked
from .inventory import HostEntry, load_inventory

CONNECT_TIMEOUT_S = 10  # ssh's ConnectTimeout unless the inventory's ssh_options give one
CONTROL_PREFIX = "nvmflab-ssh-"
STOP_GRACE_S = 5
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_WORKDIR = re.compile(r"^/tmp/nvmflab-run\.[A-Za-z0-9]{6,}$")
_TIMES = re.compile(r"^(\d+)m([\d.]+)s\s+(\d+)m([\d.]+)s$")

# $1 = marker, $2 = cpu list ("" = not pinned), then the command. The command gets /dev/null as
# stdin; the ssh channel's stdin goes to the watchdog only (fd 3), which kills the command's group
# when it reads EOF. (`kill -SIG -PGID` without `--`: the one spelling dash, bash and busybox all
# take.) Both run under setsid: a background job of a non-interactive sh is not a
# group leader, so setsid makes it one without forking and $! is the command's PID and group.
_WRAPPER = r"""
export LC_ALL=C
exec 3<&0
mark=$1; cpus=$2; shift 2
if [ -n "$cpus" ]; then setsid taskset -c "$cpus" "$@" </dev/null & else setsid "$@" </dev/null & fi
pid=$!
echo "$mark pid $pid" >&2
setsid sh -c 'cat >/dev/null; kill -TERM -"$1"; sleep 3; kill -KILL -"$1"' watchdog "$pid" \
    <&3 >/dev/null 2>&1 &
dog=$!
exec 3<&-
wait "$pid"; rc=$?
kill -KILL -"$dog" 2>/dev/null
echo "$mark exit $rc" >&2
echo "$mark times" >&2
times >&2
exit "$rc"
"""


def _die_with_parent() -> None:
    # Our ssh clients die with the harness, even on SIGKILL: the remote watchdogs then see EOF.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class SshProcess(HostProcess):
    def __init__(self, host: "SshHost", argv: list[str], cpus, log: Path, stdout: Path | None):
        self.host, self.argv = host, argv
        self.marker = f"@@nvmflab-{secrets.token_hex(8)}"
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.times: tuple[float, float] | None = None
        self._seen_pid = threading.Event()
        self._log = open(log, "ab")
        self._out = open(stdout, "wb") if stdout else self._log
        cpulist = ",".join(str(c) for c in cpus) if cpus else ""
        command = shlex.join(["sh", "-c", _WRAPPER, "nvmflab-wrapper", self.marker, cpulist, *argv])
        try:
            self.proc = subprocess.Popen(host.ssh_argv() + [command], stdin=subprocess.PIPE, stdout=self._out,
                                         stderr=subprocess.PIPE, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        except OSError as err:
            self._close_files()
            raise HostError(f"{host.name}: cannot start ssh ({err.strerror})") from None
        # Registered like a local child, so procs.stop_all() (Ctrl-C, exit) ends the ssh client,
        # which closes the channel and lets the remote watchdog kill the command.
        procs.track(self.proc)
        self._pump = threading.Thread(target=self._read_stderr, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S + 5
        while not self._seen_pid.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise HostError(f"{host.name}: could not start {Path(argv[0]).name}: {self._log_tail(log)}")

    def _read_stderr(self) -> None:
        """Copy the command's stderr to the log, keeping the wrapper's marked lines for us."""
        times_next: list[str] | None = None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if times_next is not None:
                times_next.append(line.strip())
                if len(times_next) == 2:  # line 1: the wrapper's own times; line 2: its children's
                    match = _TIMES.match(times_next[1])
                    if match:
                        m_u, s_u, m_s, s_s = match.groups()
                        self.times = (int(m_u) * 60 + float(s_u), int(m_s) * 60 + float(s_s))
                    times_next = None
                continue
            if line.startswith(self.marker + " "):
                word, _, value = line[len(self.marker) + 1:].partition(" ")
                if word == "pid" and value.isdigit() and int(value) > 1:
                    self.pid = int(value)
                    self._seen_pid.set()
                elif word == "exit" and value.lstrip("-").isdigit():
                    self.exit_code = int(value)
                elif word == "times":
                    times_next = []
                continue
            try:
                self._log.write(raw)
                self._log.flush()
            except ValueError:  # closed by stop(); nothing more worth keeping
                pass

    def wait(self, timeout: float) -> tuple[int | None, float, float]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, 0.0, 0.0
        self._finish()
        if self.exit_code is None:
            raise HostError(f"{self.host.name}: lost the ssh connection while {Path(self.argv[0]).name} ran "
                            f"(ssh exited {self.proc.returncode})")
        user, system = self.times or (0.0, 0.0)
        return self.exit_code, user, system

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None and self.pid is not None:
            # TERM the remote group, KILL it after the grace period; then the wrapper (and ssh) exit.
            script = (f"kill -TERM -{self.pid} 2>/dev/null; i=0; "
                      f"while kill -0 -{self.pid} 2>/dev/null && [ $i -lt {STOP_GRACE_S * 10} ]; "
                      f"do sleep 0.1; i=$((i+1)); done; kill -KILL -{self.pid} 2>/dev/null; true")
            try:
                self.host.run(["sh", "-c", script], timeout=STOP_GRACE_S + 10, check=False)
            except HostError:
                pass  # connection gone: closing our end below still lets the watchdog kill it
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # EOF to the watchdog
                self.proc.wait(timeout=STOP_GRACE_S)
            except (subprocess.TimeoutExpired, OSError):
                pass
        procs.stop(self.proc, grace=2.0)
        self._finish()

    def cpu_seconds(self) -> tuple[float, float]:
        if self.pid is None or not self.alive():
            return 0.0, 0.0
        done = self.host.run(["cat", f"/proc/{self.pid}/stat"], check=False, timeout=10)
        try:
            fields = done.stdout[done.stdout.rindex(")") + 2:].split()
            ticks = self.host.clock_ticks()
            return int(fields[11]) / ticks, int(fields[12]) / ticks
        except (ValueError, IndexError):
            return 0.0, 0.0

    def _finish(self) -> None:
        self._pump.join(timeout=5)
        procs.untrack(self.proc)
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._close_files()

    def _close_files(self) -> None:
        for f in {id(self._log): self._log, id(self._out): self._out}.values():
            f.close()

    @staticmethod
    def _log_tail(log: Path) -> str:
        lines = Path(log).read_text(errors="replace").strip().splitlines() if Path(log).exists() else []
        return lines[-1] if lines else "(no output)"


_open_hosts: set["SshHost"] = set()


class SshHost(Host):
    remote = True

    def __init__(self, entry: HostEntry):
        self.entry = entry
        self.name, self.data_ip = entry.name, entry.data_ip
        self._cores = list(entry.cores) if entry.cores else None
        self._control_dir: Path | None = None
        self._master: subprocess.Popen | None = None
        self._workdir: str | None = None
        self._janitor: subprocess.Popen | None = None
        self._binaries: dict[str, str] = {}
        self._ports_given: set[int] = set()
        self._forwards: dict[tuple[str, int], int] = {}  # (address, port) on the host -> local port
        self._clock_ticks: int | None = None
        self._login_deadline = 0.0
        self._lock = threading.Lock()

    # -- connection ------------------------------------------------------------------------------

    def ssh_argv(self, master: bool = False) -> list[str]:
        """ssh and its options up to the destination; the remote command string comes after."""
        assert self._control_dir is not None
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ControlPath={self._control_dir / 'master'}",
                "-o", f"ControlMaster={'yes' if master else 'no'}"]
        argv += self.entry.ssh_options  # after ours (ssh keeps the first value), before the defaults
        argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=5",
                 "-o", "ServerAliveCountMax=3"]
        if self.entry.user:
            argv += ["-l", self.entry.user]
        if self.entry.port:
            argv += ["-p", str(self.entry.port)]
        return argv + ["--", self.entry.ssh]

    def connect(self) -> None:
        """Start the control master (once); HostError with ssh's own words when it cannot log in."""
        with self._lock:
            if self._start_master():
                self._await_master()

    def _start_master(self) -> bool:
        """Start the control master unless it runs; True when one was started. Called from a
        thread that outlives it (the run's): PR_SET_PDEATHSIG kills a child when the thread that
        forked it ends, so a worker thread must not start it."""
        if self._master is not None and self._master.poll() is None:
            return False
        if shutil.which("ssh") is None:
            raise HostError(f"{self.name}: ssh not found on this machine (install openssh-client)")
        if self._control_dir is None:
            _remove_stale_control_dirs()
            # A short private path: unix socket paths are limited to ~100 bytes.
            self._control_dir = Path(tempfile.mkdtemp(prefix=CONTROL_PREFIX))
            (self._control_dir / "owner").write_text(str(os.getpid()))
        (self._control_dir / "master").unlink(missing_ok=True)
        self.forget_answers()  # a new connection: the host may have rebooted or changed since
        with open(self._control_dir / "master.err", "wb") as err_file:
            self._master = subprocess.Popen(
                self.ssh_argv(master=True)[:-2] + ["-N", "-o", "ControlPersist=no", "--", self.entry.ssh],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file,
                start_new_session=True, preexec_fn=_die_with_parent)
        self._login_deadline = time.monotonic() + login_limit_s(self.entry.ssh_options)
        _open_hosts.add(self)
        return True

    def _await_master(self) -> None:
        """Wait until the started master has logged in; HostError naming the host when it cannot."""
        assert self._master is not None and self._control_dir is not None
        while not (self._control_dir / "master").exists():
            if self._master.poll() is not None or time.monotonic() > self._login_deadline:
                self._stop_master()
                lines = (self._control_dir / "master.err").read_text(errors="replace").strip().splitlines()
                why = lines[-1] if lines else "no answer"
                raise HostError(f"{self.name}: cannot log in with `ssh {self.entry.ssh}`: {why}")
            time.sleep(0.02)

    def _stop_master(self) -> None:
        if self._master is not None:
            procs.stop(self._master, grace=2.0)
            self._master = None

    # -- Host ------------------------------------------------------------------------------------

    @property
    def cores(self) -> list[int] | None:  # type: ignore[override]
        """The inventory's cores, or every online core of the host."""
        if self._cores is None:
            text = self.run(["cat", "/sys/devices/system/cpu/online"], timeout=20).stdout.strip()
            try:
                self._cores = parse_cpulist(text)
            except ValueError:
                raise HostError(f"{self.name}: unreadable online CPU list {text[:80]!r}") from None
        return self._cores

    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        self.connect()
        # A host whose inventory allows a slow login (an emulated or loaded server) is as slow to
        # answer a short command: none gets less than its ConnectTimeout (10 s by default).
        timeout = max(timeout, connect_timeout_s(self.entry.ssh_options))
        try:
            done = subprocess.run(self.ssh_argv() + [shlex.join(argv)], capture_output=True, text=True,
                                  errors="replace", timeout=timeout, input=input,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: `{shlex.join(argv)}` still running after {timeout:.0f} s") from None
        return checked(done, self.name, argv) if check else done

    def ask(self, argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        self.connect()  # a lost connection is made again before anything kept is used (and forgotten)
        return super().ask(argv, timeout)

    def spawn(self, argv: list[str], cpus, log: Path, stdout: Path | None = None) -> SshProcess:
        self.connect()
        return SshProcess(self, argv, cpus, log, stdout)

    def workdir(self) -> str:
        if self._workdir is None:
            path = self.run(["mktemp", "-d", "/tmp/nvmflab-run.XXXXXXXX"], timeout=20).stdout.strip()
            if not _WORKDIR.match(path):
                raise HostError(f"{self.name}: mktemp answered {path[:80]!r}, not a directory under /tmp")
            # A janitor on the host removes the directory when its channel closes: at close(), or
            # when the harness dies without running any cleanup (SIGKILL, lost network).
            command = shlex.join(["sh", "-c", 'cat >/dev/null; rm -rf -- "$1"', "nvmflab-janitor", path])
            self._janitor = subprocess.Popen(self.ssh_argv() + [command], stdin=subprocess.PIPE,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True, preexec_fn=_die_with_parent)
            self._workdir = path
        return self._workdir

    def put(self, local: Path, remote: str, mode: str | None = None) -> None:
        """Copy `local` to `remote` on the host; with `mode`, chmod it in the same round trip."""
        self.connect()
        script = 'cat > "$1"' + (' && chmod "$2" "$1"' if mode else "")
        argv = ["sh", "-c", script, "put", remote, *([mode] if mode else [])]
        try:
            with open(local, "rb") as source:
                done = subprocess.run(self.ssh_argv() + [shlex.join(argv)], stdin=source, capture_output=True,
                                      timeout=300)
        except OSError as err:
            raise HostError(f"{self.name}: cannot read {local} to copy it ({err.strerror})") from None
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: copying {local} to {remote} took over 300 s") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            raise HostError(f"{self.name}: cannot write {remote}: {why[-1] if why else 'no reason given'}")

    def read_text(self, path: str) -> str:
        done = self.run(["cat", "--", path], check=False, timeout=120)
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()
            raise HostError(f"{self.name}: cannot read {path}: {why[-1] if why else 'no reason given'}")
        return done.stdout

    def free_port(self) -> int:
        """A random port in 20000-32767 (below Linux's ephemeral range) that nothing listens on."""
        done = self.run(["ss", "-Htln"], check=False, timeout=20)
        if done.returncode != 0:
            raise HostError(f"{self.name}: `ss -Htln` failed (is iproute2 installed?): "
                            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        busy = set(self._ports_given)
        for line in done.stdout.splitlines():
            fields = line.split()
            match = re.search(r":(\d+)$", fields[3]) if len(fields) >= 4 else None
            if match:
                busy.add(int(match.group(1)))
        for _ in range(200):
            port = random.randint(20000, 32767)
            if port not in busy:
                self._ports_given.add(port)
                return port
        raise HostError(f"{self.name}: no free TCP port found in 20000-32767")

    def forward(self, address: str, port: int) -> tuple[str, int]:
        """A local port on 127.0.0.1 forwarded by the control master to `address:port` as the host
        sees it: the data network may have no route from here (a lab's private link, the test bed)."""
        if (address, port) not in self._forwards:
            self.connect()
            with socket.socket() as probe:  # a free local port; ssh binds it right after
                probe.bind(("127.0.0.1", 0))
                local = probe.getsockname()[1]
            self._mux("forward", local, address, port)
            self._forwards[(address, port)] = local
        return "127.0.0.1", self._forwards[(address, port)]

    def unforward(self, address: str, port: int) -> None:
        local = self._forwards.pop((address, port), None)
        if local is not None and self._master is not None and self._master.poll() is None:
            try:
                self._mux("cancel", local, address, port)
            except HostError:
                pass  # the master is going away: its forwards go with it

    def _mux(self, command: str, local: int, address: str, port: int) -> None:
        """`ssh -O forward|cancel -L` on the control master."""
        spec = f"127.0.0.1:{local}:{f'[{address}]' if ':' in address else address}:{port}"
        argv = self.ssh_argv()[:-2] + ["-O", command, "-L", spec, "--", self.entry.ssh]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=30,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: ssh -O {command} -L {spec} took over 30 s") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise HostError(f"{self.name}: cannot {command} the local port {spec} through ssh: {why}")

    def binary(self, name: str) -> str:
        if name not in OUR_BINARIES:
            return super().binary(name)
        if name not in self._binaries:
            try:
                local = require_tool(name)
            except ToolMissing as err:
                raise HostError(f"{self.name}: {err}") from None
            remote = f"{self.workdir()}/{name}"
            self.put(local, remote, mode="755")
            done = self.ask([remote, "--version"])  # kept: the stack's versions() asks it again
            if done.returncode != 0:
                why = (done.stderr or done.stdout).strip().splitlines()
                raise HostError(f"{self.name}: {name} (copied from {local}) does not run there: "
                                f"{why[-1] if why else f'exit {done.returncode}'} (built for "
                                f"{platform.machine()} with this machine's C library)")
            self._binaries[name] = remote
        return self._binaries[name]

    def clock_ticks(self) -> int:
        if self._clock_ticks is None:
            text = self.run(["getconf", "CLK_TCK"], check=False, timeout=10).stdout.strip()
            self._clock_ticks = int(text) if text.isdigit() and 0 < int(text) < 100000 else 100
        return self._clock_ticks

    def describe(self, argv: list[str]) -> str:
        return f"[{self.name}: ssh {self.entry.ssh}] {shlex.join(argv)}"

    def close(self) -> None:
        """Remove this run's directory on the host and stop the control master."""
        if self._janitor is not None:
            try:
                self._janitor.stdin.close()  # EOF: the janitor removes the directory and exits
                self._janitor.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            procs.stop(self._janitor, grace=1.0)
            self._janitor = None
        self._workdir, self._binaries, self._forwards = None, {}, {}
        self.forget_answers()
        self._stop_master()
        if self._control_dir is not None:
            shutil.rmtree(self._control_dir, ignore_errors=True)
            self._control_dir = None
        _open_hosts.discard(self)


def connect_timeout_s(ssh_options: list[str]) -> int:
    """The ConnectTimeout ssh uses: the inventory's (ssh keeps the first value given, and the
    inventory's options come before ours), else CONNECT_TIMEOUT_S."""
    for option in ssh_options:  # "ConnectTimeout=60" after "-o", or "-oConnectTimeout 60"
        words = option.removeprefix("-o").replace("=", " ").split()
        if len(words) == 2 and words[0].lower() == "connecttimeout" and words[1].isdigit():
            return int(words[1])
    return CONNECT_TIMEOUT_S


def login_limit_s(ssh_options: list[str]) -> int:
    """How long a login may take before it is a failure: ssh's ConnectTimeout covers the TCP connect
    and, again, the SSH handshake, so twice that and 5 s for authentication. A slow host (an emulated
    guest on a loaded machine) gets more with `ssh_options = ["-o", "ConnectTimeout=60"]`; a refused
    connection or key still fails at once, as ssh exits."""
    return 2 * connect_timeout_s(ssh_options) + 5


def _remove_stale_control_dirs() -> None:
    """Control directories of harnesses that died without cleanup (SIGKILL): their owner is gone."""
    for folder in Path(tempfile.gettempdir()).glob(CONTROL_PREFIX + "*"):
        try:
            owner = int((folder / "owner").read_text())
            if folder.owner() != getpass.getuser() or Path(f"/proc/{owner}").exists():
                continue
        except (OSError, ValueError, KeyError):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _close_all() -> None:
    for host in list(_open_hosts):
        host.close()


atexit.register(_close_all)


def parse_cpulist(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]; ValueError on anything else."""
    cores: list[int] = []
    for part in text.split(","):
        if not re.fullmatch(r"\d+(-\d+)?", part):
            raise ValueError(text)
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if not 0 <= first <= last < 65536:
            raise ValueError(text)
        cores += range(first, last + 1)
    return cores


def login_all(hosts: Hosts) -> None:
    """Log in to every SSH host of a run at once (each login is a handshake: seconds on a slow
    host), before anything else uses them; the first host in the run's order (target, then
    initiators) that cannot log in raises its own one-line HostError. Local hosts are skipped."""
    started = [host for host in hosts.all() if isinstance(host, SshHost) and host._start_master()]
    errors: list[HostError] = []
    for host in started:  # the masters log in side by side while we wait for each in turn
        try:
            host._await_master()
        except HostError as err:
            errors.append(err)
    if errors:
        raise errors[0]


def open_hosts(topology, spec_dir: Path) -> Hosts:
    """The hosts a spec's `[topology]` names: SshHosts from its inventory (local ones for `local`)."""
    if topology.kind != "ssh":
        from .local import LocalHost

        local = LocalHost()
        return Hosts(local, [local])
    path = Path(spec_dir) / topology.inventory
    entries = load_inventory(path)
    wanted = [topology.target, *topology.initiators]
    for name in wanted:
        if name not in entries:
            raise HostError(f"{path}: no host named {name!r} (it has: {', '.join(sorted(entries))})")
    hosts = {name: SshHost(entries[name]) for name in dict.fromkeys(wanted)}
    return Hosts(hosts[topology.target], [hosts[name] for name in topology.initiators])
