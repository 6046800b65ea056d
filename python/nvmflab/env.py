"""The machine a run happened on: stored with every run, printed by `nvmflab env`."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from .cores import available_cores
from .names import STACK_NAMES
from .topology import napi
from .tools import OUR_BINARIES, REPO_ROOT, VERSION_FLAGS, tools_found


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def git_rev() -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def collect(hosts=None) -> dict[str, Any]:
    """This machine's description for a run record; with the run's `hosts`, also its data path:
    the NAPI id of a probe connection and the busy-poll sysctls (topology/napi.py)."""
    return ({"data_path": data_path(hosts)} if hosts is not None else {}) | {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_allowed": available_cores(),
        "kernel": platform.release(),
        "memory_bytes": memory_bytes(),
        "python": platform.python_version(),
        "tools": tools_found(),
        "git_rev": git_rev(),
        "nics": nics(),
    }


def data_path(hosts) -> dict[str, Any]:
    """The run's data path as topology/napi.py measured it (never raises)."""
    return napi.probe(hosts.target, hosts.initiator(None), hosts.target.data_ip).as_dict()


def nics(root: str = "/sys/class/net") -> dict[str, dict[str, Any]]:
    """Network devices of this machine (interfaces backed by a device, not virtual links): driver and
    link speed in Mb/s where the kernel knows it. `nvmflab compare` shows them side by side."""
    out: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        base = os.path.join(root, name)
        if not os.path.exists(os.path.join(base, "device")):
            continue
        try:
            driver = os.path.basename(os.readlink(os.path.join(base, "device", "driver")))
        except OSError:
            driver = None
        try:
            with open(os.path.join(base, "speed")) as handle:
                speed = int(handle.read().strip())
        except (OSError, ValueError):
            speed = None
        out[name] = {"driver": driver, "speed_mbps": speed if speed and speed > 0 else None}
    return out


# Cores the full studies want apart: target reactor, a spare reactor, foreground and background load
# generators (interference); fewer and legs are skipped or processes share cores.
CORES_WANTED = 4


def reliability_warnings(host=None, sample_s: float = 0.5) -> list[str]:
    """What will make results unreliable on this machine (or `host`): sysstat.machine_warnings, and a
    sentence saying the check itself failed rather than nothing."""
    from . import sysstat

    try:
        return sysstat.machine_warnings(host, CORES_WANTED, sample_s)
    except Exception as err:  # a probe that fails must not hide the rest of `env`
        return [f"could not check for noise ({' '.join(str(err).split()) or type(err).__name__})"]


# -- hosts of a topology (`nvmflab env --topology FILE`) ------------------------------------------

STACK_SIDES = ("target", "host")


def topology_hosts(path: Path) -> list:
    """The hosts FILE names: every host of an inventory (.yml/.yaml, or TOML with [hosts.*]), or
    the target and initiators of a spec's `[topology]`."""
    from .spec import load_spec
    from .topology.inventory import load_inventory
    from .topology.ssh import SshHost, open_hosts

    path = Path(path)
    is_inventory = path.suffix in (".yml", ".yaml")
    if not is_inventory:
        try:
            is_inventory = "hosts" in tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            is_inventory = False  # load_spec reports it in its own words
    if is_inventory:
        return [SshHost(entry) for entry in load_inventory(path).values()]
    return open_hosts(load_spec(path).topology, path.parent).all()


def host_report(host) -> dict[str, Any]:
    """What a host is and what nvmflab can run there; every probe that fails says so in place."""
    from .topology.base import HostError

    def probe(argv: list[str]) -> str | None:
        try:
            done = host.ask(argv)  # read-only facts: a stack's own check asking again gets them kept
        except HostError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    report: dict[str, Any] = {"host": host.name, "data_ip": host.data_ip}
    try:
        host.run(["true"], timeout=30)
    except HostError as err:
        return report | {"error": str(err)}
    cpuinfo = probe(["grep", "-m1", "^model name", "/proc/cpuinfo"]) or ""
    report["cpu_model"] = cpuinfo.split(":", 1)[1].strip() if ":" in cpuinfo else "unknown"
    online = probe(["nproc", "--all"])
    report["cores"] = int(online) if online and online.isdigit() else None
    try:
        report["cores_usable"] = host.cores
    except HostError:
        report["cores_usable"] = None
    report["kernel"] = probe(["uname", "-r"]) or "unknown"
    report["nic"], report["nic_driver"] = nic_for(host, probe)
    tools: dict[str, Any] = {}
    for name, flag in VERSION_FLAGS.items():
        if name in OUR_BINARIES and host.remote:  # the `ours` stack line says whether they run there
            tools[name] = {"path": None, "version": None, "note": "copied from this machine at run time"}
            continue
        path = tool_path(host, name)
        version = probe([path, flag]) if path else None
        tools[name] = {"path": path, "version": version.splitlines()[0] if version else None}
    report["tools"] = tools
    report |= capabilities(host)
    report["warnings"] = reliability_warnings(host)
    return report


def capabilities(host, root: str = "") -> dict[str, Any]:
    """What `host` can run: each stack per side, the SPDK build found (or None), NVMe over RDMA
    (its devices) and TLS (userspace in ours and SPDK; the kernel's, kTLS, from its facts).
    `root`: a fake tree for the sysfs and /boot the RDMA and TLS probes read (tests)."""
    from .stacks.spdk import spdk_dir

    return {"stacks": stack_availability(host), "spdk_build": spdk_dir(host), "rdma": rdma_report(host, root),
            "tls": tls_report(host, root)}


def ktls_state(facts: dict[str, Any]) -> str:
    """Whether the kernel can do TLS records (kTLS): CONFIG_TLS=y, or the tls module loaded or loadable."""
    if facts.get("options", {}).get("CONFIG_TLS") == "y":
        return "yes: built into the kernel (CONFIG_TLS=y)"
    return {"loaded": "yes: the tls module is loaded",
            "available": "yes: the tls module is installed, not loaded (modprobe tls loads it)"}.get(
        facts.get("tls_module"), "no: no tls module (loaded or installed) and CONFIG_TLS is not y")


USERSPACE_TLS = "always: ours and SPDK do TLS 1.3 in the process, needing nothing of the kernel"


def capability_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(item, value) rows of capabilities(), the same for `env` and each host of `env --topology`."""
    rows = [(f"stack {stack} {side}", "usable" if why is None else f"missing: {why}")
            for stack, sides in r["stacks"].items() for side, why in sides.items()]
    if "spdk_build" in r:
        rows.append(("spdk build", r["spdk_build"] or "not found (make spdk builds it; NVMFLAB_SPDK_DIR names "
                                                     "another)"))
    if "rdma" in r:
        rows.append(("rdma devices", r["rdma"]["summary"]))
        rows += [(f"rdma {stack} {side}", "usable" if why is None else f"no: {why}")
                 for stack, sides in r["rdma"]["stacks"].items() for side, why in sides.items()]
    if "tls" in r:
        rows.append(("tls userspace", USERSPACE_TLS))
        rows.append(("ktls", ktls_state(r["tls"]["facts"])))
        rows.append(("tls (kernel)", r["tls"]["summary"]))
        rows += [(f"tls {stack} {side}", "usable" if why is None else f"no: {why}")
                 for stack, sides in r["tls"]["stacks"].items() for side, why in sides.items()]
    return rows


def tool_path(host, name: str) -> str | None:
    """Where `host` runs `name` from: our binaries as the stacks find them (Host.binary: on this
    machine NVMFLAB_BIN_DIR, then target/release, then PATH), other tools on its PATH."""
    from .topology.base import HostError

    if name not in OUR_BINARIES:
        return host.which(name)
    try:
        return host.binary(name)
    except HostError:
        return None


def nic_for(host, probe) -> tuple[str | None, str | None]:
    """The interface holding the data address, and its driver (sysfs, else ethtool)."""
    text = probe(["ip", "-o", "addr", "show"]) or ""
    device = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].split("/")[0] == host.data_ip:
            device = fields[1].split("@")[0]
            break
    if device is None or not all(c.isalnum() or c in "._-" for c in device):
        return None, None
    link = probe(["readlink", f"/sys/class/net/{device}/device/driver"])
    if link:
        return device, link.rsplit("/", 1)[-1]
    info = probe(["ethtool", "-i", device]) or ""
    for line in info.splitlines():
        if line.startswith("driver:"):
            return device, line.split(":", 1)[1].strip() or None
    return device, None


def stack_availability(host) -> dict[str, dict[str, str | None]]:
    """stack -> side -> None (usable) or what is missing; a stack that cannot even load says why."""
    out: dict[str, dict[str, str | None]] = {}
    for name in STACK_NAMES:
        try:
            from .stacks import get_stack

            stack = get_stack(name)
        except Exception as err:  # a stack module missing or broken must not hide the others
            out[name] = {side: f"not available: {' '.join(str(err).split()) or type(err).__name__}"
                         for side in STACK_SIDES}
            continue
        sides: dict[str, str | None] = {}
        for side in STACK_SIDES:
            try:
                sides[side] = stack.unavailable(host, side)
            except Exception as err:
                sides[side] = f"not available: {' '.join(str(err).split()) or type(err).__name__}"
        out[name] = sides
    return out


def rdma_report(host, root: str = "") -> dict[str, Any]:
    """The host's RDMA devices (topology/rdma.py) and, per stack and side, None where it can speak
    NVMe over RDMA there or why not (no device, a build without RDMA, a missing module)."""
    from .topology import rdma

    devices, notes = rdma.probe(host, root)
    up = rdma.usable(devices)
    stacks: dict[str, dict[str, str | None]] = {}
    for name in STACK_NAMES:
        sides: dict[str, str | None] = {}
        for side in STACK_SIDES:
            if not up:
                sides[side] = "no RDMA device with a port up"
                continue
            try:
                from .stacks import get_stack

                sides[side] = get_stack(name).rdma_unavailable(host, side)
            except Exception as err:  # one stack's probe must not hide the others
                sides[side] = f"not available: {' '.join(str(err).split()) or type(err).__name__}"
        stacks[name] = sides
    return {"devices": [d.as_dict() for d in devices], "summary": rdma.summary(devices), "notes": notes,
            "stacks": stacks}


def tls_report(host, root: str = "") -> dict[str, Any]:
    """The host's kernel TLS facts (topology/tls.py) and, per stack and side, None where it can do
    NVMe/TCP over TLS there or why not (stacks/*.py `tls_unavailable`)."""
    from .topology import tls

    facts = tls.probe(host, root)
    stacks: dict[str, dict[str, str | None]] = {}
    for name in STACK_NAMES:
        sides: dict[str, str | None] = {}
        for side in STACK_SIDES:
            try:
                from .stacks import get_stack

                sides[side] = get_stack(name).tls_unavailable(host, side)
            except Exception as err:  # one stack's check must not hide the others
                sides[side] = f"not available: {' '.join(str(err).split()) or type(err).__name__}"
        stacks[name] = sides
    return {"facts": facts.as_dict(), "summary": tls.summary(facts), "stacks": stacks}


def topology_report(path: Path) -> list[dict[str, Any]]:
    from concurrent.futures import ThreadPoolExecutor

    hosts = topology_hosts(path)
    try:
        # Each probe is a round trip; hosts are independent, so ask them all at once.
        with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
            return list(pool.map(host_report, hosts))
    finally:
        for host in hosts:
            host.close()


def topology_tables(reports: list[dict[str, Any]]) -> list:
    """One table per host for the terminal."""
    from rich.table import Table

    tables = []
    for r in reports:
        table = Table("item", "value", show_header=False, title=f"{r['host']} (data address {r['data_ip']})")
        if "error" in r:
            table.add_row("unreachable", r["error"])
            tables.append(table)
            continue
        usable = r["cores_usable"]
        table.add_row("cpu model", r["cpu_model"])
        table.add_row("cores", f"{r['cores']} (usable: {','.join(map(str, usable)) if usable else 'unknown'})")
        table.add_row("kernel", r["kernel"])
        driver = f" (driver {r['nic_driver']})" if r["nic_driver"] else ""
        table.add_row("nic", (r["nic"] or "no interface holds the data address") + driver)
        for item, value in capability_rows(r):
            table.add_row(item, value)
        for warning in r.get("warnings", []):
            table.add_row("[yellow]warning[/yellow]", warning)
        for name, tool in r["tools"].items():
            if tool.get("note"):
                table.add_row(name, tool["note"])
            else:
                table.add_row(name, f"{tool['version'] or '(no version)'}  {tool['path']}" if tool["path"]
                              else "not found")
        tables.append(table)
    return tables
