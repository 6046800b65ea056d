"""Our stack: nvmf-target (config TOML, ready line, /stats) and nvmf-perf (fio-layout JSON)."""

from __future__ import annotations

import json
import select
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from .. import procs
from ..cores import cpulist
from ..plan import PerfJob, TargetSetup
from ..tools import require_tool, tool_version
from ..units import format_size
from .base import RunningTarget, Stack, StackError

READY_TIMEOUT_S = 15.0


def render_config(setup: TargetSetup, port: int, stats_port: int) -> str:
    """The target's TOML config (CONTRACTS.md §2)."""
    lines = [
        "[target]",
        f"cores = [{', '.join(str(c) for c in setup.cores)}]",
        f'mode = "{setup.mode}"',
        f"idle_poll_us = {setup.idle_poll_us}",
        f"in_capsule_data_size = {setup.in_capsule_data_size}",
        f"so_priority = {setup.so_priority}",
        f"tos = {setup.tos}",
        f"busy_poll_us = {setup.busy_poll_us}",
        f'stats = "{setup.listen_ip}:{stats_port}"',
        "",
        "[[port]]",
        f'addr = "{setup.listen_ip}:{port}"',
    ]
    for index, sub in enumerate(setup.subsystems, start=1):
        lines += ["", "[[subsystem]]", f'nqn = "{sub.nqn}"', f'serial = "NVMFLAB{index:04d}"',
                  "allow_any_host = true"]
        if sub.reactor is not None:
            lines.append(f"reactor = {sub.reactor}")
        lines += ["", "  [[subsystem.namespace]]", "  nsid = 1", f'  backend = "{sub.backend}"',
                  f"  block_size = {sub.block_size}"]
        if sub.backend == "file":
            lines.append(f"  path = {json.dumps(sub.path)}")
        else:
            lines.append(f'  size = "{format_size(sub.size)}"')
    return "\n".join(lines) + "\n"


class OurTarget(RunningTarget):
    def __init__(self, setup: TargetSetup, workdir: Path):
        self.setup = setup
        self.address = setup.listen_ip
        self.port = procs.free_port()
        self.stats_port = procs.free_port()
        config = workdir / f"target-{self.port}.toml"
        config.write_text(render_config(setup, self.port, self.stats_port))
        self.log_path = workdir / f"target-{self.port}.log"
        self._log = open(self.log_path, "wb")
        prefix = ["ip", "netns", "exec", setup.netns] if setup.netns else None
        self.proc = procs.spawn([str(require_tool("nvmf-target")), "--config", str(config)], setup.cores,
                                stdout=subprocess.PIPE, stderr=self._log, prefix=prefix)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        buffer = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = self.proc.stdout.read1(4096)
                buffer += chunk
                if b"\n" in buffer:
                    line = buffer.split(b"\n", 1)[0].decode(errors="replace")
                    if line.startswith("ready "):
                        return
                    raise StackError(f"nvmf-target printed {line!r} instead of its ready line")
                if not chunk and self.proc.poll() is not None:
                    break
            elif self.proc.poll() is not None:
                break
        if self.proc.poll() is not None:
            raise StackError(f"nvmf-target exited with {self.proc.returncode}: {self._log_tail()}")
        raise StackError(f"nvmf-target not ready after {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return text[-1] if text else "(no output)"

    def stats(self) -> dict[str, Any]:
        url = f"http://{self.address}:{self.stats_port}/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def cpu_seconds(self) -> tuple[float, float]:
        return procs.cpu_seconds(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        procs.stop(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()


class OurStack(Stack):
    name = "ours"

    def start_target(self, setup: TargetSetup, workdir: Path) -> OurTarget:
        return OurTarget(setup, workdir)

    def perf_argv(self, job: PerfJob, target: RunningTarget | None, runtime: float, ramp_time: float,
                  output: Path) -> list[str]:
        k = job.knobs
        argv = [str(require_tool("nvmf-perf")), "run"]
        if job.local_path:
            argv += ["--local", job.local_path]
        else:
            if target is None or job.nqn is None:
                raise StackError("a tcp job needs a running target and a subsystem NQN")
            argv += ["-t", "tcp", "-a", target.address, "-s", str(target.port), "-n", job.nqn,
                     "--completion", k["completion"], "--so_priority", str(k["so_priority"]),
                     "--tos", str(k["tos"]), "--busy_poll_us", str(k["busy_poll_us"])]
            argv += ["--hdr_digest"] if k["hdr_digest"] else []
            argv += ["--data_digest"] if k["data_digest"] else []
        argv += ["--rw", k["rw"], "--bs", format_size(k["bs"]), "--iodepth", str(k["iodepth"]),
                 "--numjobs", str(k["numjobs"]), "--runtime", _seconds(runtime),
                 "--ramp_time", _seconds(ramp_time), "--cpus_allowed", cpulist(list(job.cpus)),
                 "--output-format", "json", "--output", str(output)]
        if k["rw"] in ("rw", "randrw"):
            argv += ["--rwmixread", str(k["rwmixread"])]
        if k["rate_iops"]:
            argv += ["--rate_iops", str(k["rate_iops"])]
        if k.get("size"):
            argv += ["--size", str(k["size"])]
        return argv

    def versions(self) -> dict[str, str | None]:
        return {name: tool_version(require_tool(name), name) for name in ("nvmf-target", "nvmf-perf")}


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
