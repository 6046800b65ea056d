"""Whether a host can do NVMe/TCP over TLS 1.3 with the Linux kernel (docs/tls.md): what `nvmflab
env --topology` lists per host and what the kernel stack checks before a `tls = "on"` point.

The kernel does the records (kTLS, the `tls` module or CONFIG_TLS=y) and hands the handshake to
`tlshd` (ktls-utils); nvme_tcp needs CONFIG_NVME_TCP_TLS, nvmet_tcp CONFIG_NVME_TARGET_TCP_TLS;
the PSK goes into the `.nvme` keyring with nvme-cli (`gen-tls-key`/`check-tls-key --insert`, 2.x),
whose `connect --tls` the host uses (Debian bookworm's 2.3 has neither). Our stack and SPDK do TLS
in userspace (OpenSSL) and need none of this.

One shell script gathers the facts as KEY=VALUE lines (config options as CONFIG_X=V); the parser
takes at most MAX_LINES lines of at most 512 characters and ignores anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .base import Host, HostError

Side = Literal["target", "host"]
OPTIONS = ("CONFIG_NVME_TCP_TLS", "CONFIG_NVME_TARGET_TCP_TLS", "CONFIG_TLS", "CONFIG_NVME_KEYRING")
MAX_LINES, MAX_LINE = 256, 512

# $1 is a root to read files under ("" on a real host, a fake tree in the tests); commands come
# from PATH. nvme-cli's subcommands are known by their help text: 2.13 exits 1 after printing it.
_SCRIPT = r"""r="$1"; k=$(uname -r)
echo "kernel=$k"
if [ -r "$r/boot/config-$k" ]; then
  echo "config_source=/boot/config-$k"; grep -E '^CONFIG_(NVME_TCP_TLS|NVME_TARGET_TCP_TLS|TLS|NVME_KEYRING)=' "$r/boot/config-$k"
elif [ -r "$r/proc/config.gz" ]; then
  echo "config_source=/proc/config.gz"; zcat "$r/proc/config.gz" | grep -E '^CONFIG_(NVME_TCP_TLS|NVME_TARGET_TCP_TLS|TLS|NVME_KEYRING)='
fi
if [ -d "$r/sys/module/tls" ]; then echo tls_module=loaded
elif modinfo -F filename tls >/dev/null 2>&1; then echo tls_module=available
else echo tls_module=missing; fi
echo "tlshd=$(command -v tlshd)"
if pgrep -x tlshd >/dev/null 2>&1; then echo tlshd_running=yes; else echo tlshd_running=no; fi
if command -v nvme >/dev/null 2>&1; then
  echo "nvme_version=$(nvme version 2>/dev/null | head -n 1)"
  if nvme connect --help 2>&1 | grep -q -- '--tls'; then echo nvme_connect_tls=yes; else echo nvme_connect_tls=no; fi
  if nvme check-tls-key --help 2>&1 | grep -q -- '--insert'; then echo nvme_tls_keys=yes; else echo nvme_tls_keys=no; fi
fi
echo "keyctl=$(command -v keyctl)"
"""
_KEY = re.compile(r"^([A-Za-z0-9_]{1,40})=(.*)$")
_VERSION = re.compile(r"\b(\d{1,3})\.(\d{1,3})")


@dataclass
class TlsFacts:
    kernel: str | None = None
    config_source: str | None = None  # where the options were read; None: no config readable
    options: dict[str, str] = field(default_factory=dict)  # CONFIG_X -> y / m (absent: not set)
    tls_module: str | None = None  # loaded | available | missing
    tlshd: str | None = None  # its path
    tlshd_running: bool = False
    nvme_version: str | None = None  # nvme-cli's first `nvme version` line
    nvme_connect_tls: bool = False  # `nvme connect` has --tls
    nvme_tls_keys: bool = False  # `nvme check-tls-key --insert` exists (gen-tls-key came with it)
    keyctl: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "config_source": self.config_source, "options": dict(self.options),
                "tls_module": self.tls_module, "tlshd": self.tlshd, "tlshd_running": self.tlshd_running,
                "nvme_version": self.nvme_version, "nvme_connect_tls": self.nvme_connect_tls,
                "nvme_tls_keys": self.nvme_tls_keys, "keyctl": self.keyctl, "notes": list(self.notes)}


def parse(text: str) -> TlsFacts:
    """The script's output as facts; lines that do not fit are skipped."""
    facts = TlsFacts()
    for line in text.splitlines()[:MAX_LINES]:
        match = _KEY.match(line.strip()[:MAX_LINE])
        if not match:
            continue
        key, value = match.group(1), match.group(2).strip()
        if key in OPTIONS:
            if value in ("y", "m"):
                facts.options[key] = value
        elif key == "kernel":
            facts.kernel = value or None
        elif key == "config_source":
            facts.config_source = value or None
        elif key == "tls_module" and value in ("loaded", "available", "missing"):
            facts.tls_module = value
        elif key in ("tlshd", "keyctl"):
            setattr(facts, key, value or None)
        elif key == "nvme_version":
            facts.nvme_version = value or None
        elif key in ("tlshd_running", "nvme_connect_tls", "nvme_tls_keys"):
            setattr(facts, key, value == "yes")
    return facts


def probe(host: Host, root: str = "") -> TlsFacts:
    """The host's TLS facts; a host the script cannot run on gets a note saying so. Asked once per
    run (`Host.ask`): what decides whether TLS can run stays true through it; `tls_module` and
    `tlshd_running` say how the run found the host (its own `modprobe tls` and tlshd start are
    decided by fresh checks in the kernel stack, never by these)."""
    try:
        done = host.ask(["sh", "-c", _SCRIPT, "sh", root])
    except HostError as err:
        return TlsFacts(notes=[f"cannot probe: {err}"])
    facts = parse(done.stdout or "")
    if done.returncode != 0:
        facts.notes.append(f"probe exited {done.returncode}")
    return facts


def nvme_cli_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of `nvme version 2.13 (git 2.13)`, or None."""
    match = _VERSION.search(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def kernel_unavailable(facts: TlsFacts, side: Side) -> str | None:
    """None when the kernel stack's `side` can do NVMe/TCP over TLS on this host, else every reason
    it cannot, in one sentence."""
    option = "CONFIG_NVME_TARGET_TCP_TLS" if side == "target" else "CONFIG_NVME_TCP_TLS"
    missing = []
    if facts.config_source is None:
        missing.append(f"no kernel config readable (/boot/config-{facts.kernel or '$(uname -r)'}, /proc/config.gz), "
                       f"so {option} cannot be checked")
    elif facts.options.get(option) != "y":
        missing.append(f"kernel {facts.kernel or '?'} without {option}=y")
    if facts.options.get("CONFIG_TLS") != "y" and facts.tls_module not in ("loaded", "available"):
        missing.append("no kernel TLS (the tls module is missing and CONFIG_TLS is not y)")
    if not facts.tlshd:
        missing.append("no tlshd (ktls-utils) to do the handshake")
    version = nvme_cli_version(facts.nvme_version)
    if version is None:
        missing.append("no nvme-cli to put the PSK into the .nvme keyring")
    elif not facts.nvme_tls_keys or (side == "host" and not facts.nvme_connect_tls):
        what = "gen-tls-key/check-tls-key" if side == "target" else "gen-tls-key and connect --tls"
        missing.append(f"nvme-cli {version[0]}.{version[1]} has no {what} (TLS needs a 2.x that has them)")
    return "; ".join(missing) or None


def summary(facts: TlsFacts) -> str:
    """One line of what was found, for the terminal."""
    options = ", ".join(f"{k}={v}" for k, v in sorted(facts.options.items())) or "none of the TLS options set"
    config = f"{options} (from {facts.config_source})" if facts.config_source else "kernel config not readable"
    tlshd = (f"tlshd {facts.tlshd}" + (" (running)" if facts.tlshd_running else " (not running)")
             if facts.tlshd else "no tlshd")
    nvme = facts.nvme_version or "no nvme-cli"
    return f"{config}; tls module {facts.tls_module or '?'}; {tlshd}; {nvme}"


class TlsCheck:
    """Why a `tls = "on"` point cannot run on its hosts, or None: each stack side asked once per
    host (`Stack.tls_unavailable`: the kernel stack probes the host, ours and SPDK need nothing)."""

    def __init__(self, runner: Any):
        self.runner = runner  # its hosts are looked at only for a point with TLS on
        self._sides: dict[tuple[int, str, str], str | None] = {}

    def refusal(self, point: Any, target_stack: Any, host_stack: Any) -> str | None:
        if "on" not in {point.knobs.get("tls")} | {j.knobs.get("tls") for j in point.jobs}:
            return None
        if getattr(self.runner, "planning", False):  # a plan looks at no host
            return None
        common = set(getattr(target_stack, "tls_identities", {0, 1})) & set(getattr(host_stack, "tls_identities", {0, 1}))
        if point.target is not None and not common:
            return (f"tls = on: the {host_stack.name} host offers PSK identity version(s) "
                    f"{sorted(host_stack.tls_identities)}, the {target_stack.name} target accepts "
                    f"{sorted(target_stack.tls_identities)}")
        hosts = self.runner.hosts
        sides = [(target_stack, "target", hosts.target)] if point.target is not None else []
        sides += [(host_stack, "host", hosts.initiator(job.host)) for job in point.jobs]
        for stack, side, host in sides:
            key = (id(host), stack.name, side)
            if key not in self._sides:
                self._sides[key] = stack.tls_unavailable(host, side)
            if self._sides[key]:
                return f"tls = on: {self._sides[key]}"
        return None
