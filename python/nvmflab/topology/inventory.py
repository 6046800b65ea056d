"""Inventories of real hosts: nvmflab's TOML, or an Ansible YAML inventory a lab already has.

nvmflab TOML:

    [hosts.server1]
    ssh = "server1"            # what you would type after `ssh` (an alias from ~/.ssh/config works)
    data_ip = "192.168.50.1"   # the address NVMe/TCP traffic uses
    cores = [2, 3, 4, 5]       # usable cores (optional; all online cores when left out)
    ssh_options = ["-o", "ProxyJump=bastion"]   # optional, extra arguments for ssh
    user = "root"              # optional
    port = 22                  # optional

Ansible YAML: hosts under `all` (and groups with `children`), with `ansible_host`, `ansible_user`,
`ansible_port`, `ansible_ssh_private_key_file`, `ansible_ssh_common_args`/`ansible_ssh_extra_args`,
and nvmflab's own `nvmflab_data_ip`, `nvmflab_cores` as host or group vars. The data address
defaults to `ansible_host` when that is an address.

Every error is one line naming the file, the host and the field (`InventoryError`, a `HostError`).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .base import HostError

MAX_INVENTORY_BYTES = 1 << 20  # an inventory is a few KiB; refuse anything that could be a bomb
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# A destination, user or ssh argument starting with "-" would be read by ssh as an option.
_DEST = re.compile(r"^[A-Za-z0-9_.@:\[\]%-]+$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$")


class InventoryError(HostError):
    pass


class HostEntry(BaseModel):
    """One host of an inventory, whichever format it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ssh: str
    data_ip: str
    cores: list[Annotated[int, Field(ge=0, le=65535)]] | None = Field(default=None, min_length=1)
    ssh_options: list[str] = []
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("a host name is letters, digits, '.', '_' or '-' (ranges like web[1:3] are not supported)")
        return value

    @field_validator("ssh")
    @classmethod
    def _ssh(cls, value: str) -> str:
        if not value or value.startswith("-") or not _DEST.match(value):
            raise ValueError(f"{value!r} is not an ssh destination (host, alias or user@host)")
        return value

    @field_validator("data_ip")
    @classmethod
    def _data_ip(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None

    @field_validator("cores")
    @classmethod
    def _cores(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("a core is listed twice")
        return value

    @field_validator("ssh_options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for arg in value:
            if "\0" in arg or "\n" in arg:
                raise ValueError(f"{arg!r} contains a control character")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.match(value):
            raise ValueError(f"{value!r} is not a user name")
        return value


def load_inventory(path: Path) -> dict[str, HostEntry]:
    """Hosts by name; the format follows the suffix (.yml/.yaml: Ansible, anything else: TOML)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_INVENTORY_BYTES:
            raise InventoryError(f"{path}: larger than {MAX_INVENTORY_BYTES} bytes; not an inventory")
        text = path.read_text()
    except OSError as err:
        raise InventoryError(f"{path}: cannot read inventory ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: not UTF-8 text") from None
    if path.suffix in (".yml", ".yaml"):
        raw = _ansible_hosts(text, path)
    else:
        raw = _toml_hosts(text, path)
    if not raw:
        raise InventoryError(f"{path}: no hosts")
    return {name: _entry(path, name, fields) for name, fields in raw.items()}


def _entry(path: Path, name: str, fields: dict[str, Any]) -> HostEntry:
    try:
        return HostEntry(name=name, **fields)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "host"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        raise InventoryError(f"{path}: host {name}: {field}: {message}") from None


def _toml_hosts(text: str, path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InventoryError(f"{path}: not valid TOML ({err})") from None
    unknown = set(data) - {"hosts"}
    if unknown:
        raise InventoryError(f"{path}: unknown table {sorted(unknown)[0]!r} (an inventory has only [hosts.NAME])")
    hosts = data.get("hosts", {})
    if not isinstance(hosts, dict):
        raise InventoryError(f"{path}: `hosts` must be tables [hosts.NAME]")
    out = {}
    for name, fields in hosts.items():
        if not isinstance(fields, dict):
            raise InventoryError(f"{path}: host {name}: must be a table [hosts.{name}]")
        out[name] = fields
    return out


# -- Ansible ---------------------------------------------------------------------------------

_ANSIBLE_KEYS = ("ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file",
                 "ansible_ssh_common_args", "ansible_ssh_extra_args", "nvmflab_data_ip", "nvmflab_cores")


def _ansible_hosts(text: str, path: Path) -> dict[str, dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InventoryError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: an Ansible inventory is a mapping of groups (all: hosts: ...)")
    # host -> (vars of its groups, its own vars); its own vars win wherever it appears.
    merged: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for group, body in data.items():
        _walk_group(path, str(group), body, {}, merged, depth=0)
    return {name: _from_ansible(path, name, group_vars | own) for name, (group_vars, own) in merged.items()}


def _walk_group(path: Path, group: str, body: Any, inherited: dict[str, Any],
                merged: dict[str, tuple[dict[str, Any], dict[str, Any]]], depth: int) -> None:
    """A group's vars apply to its hosts and, below them, to its children's (outer first)."""
    if depth > 32:
        raise InventoryError(f"{path}: group {group}: groups nested more than 32 deep")
    if body is None:
        return
    if not isinstance(body, dict):
        raise InventoryError(f"{path}: group {group}: must be a mapping with hosts, children or vars")
    unknown = set(body) - {"hosts", "children", "vars"}
    if unknown:
        raise InventoryError(f"{path}: group {group}: unknown key {sorted(map(str, unknown))[0]!r}")
    for key in ("hosts", "children", "vars"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise InventoryError(f"{path}: group {group}: `{key}` must be a mapping")
    group_vars = inherited | (body.get("vars") or {})
    for name, hostvars in (body.get("hosts") or {}).items():
        if hostvars is not None and not isinstance(hostvars, dict):
            raise InventoryError(f"{path}: host {name}: its vars must be a mapping")
        before_groups, before_own = merged.get(str(name), ({}, {}))
        merged[str(name)] = (before_groups | group_vars, before_own | (hostvars or {}))
    for child, child_body in (body.get("children") or {}).items():
        _walk_group(path, str(child), child_body, group_vars, merged, depth + 1)


def _from_ansible(path: Path, name: str, hostvars: dict[str, Any]) -> dict[str, Any]:
    def text(key: str) -> str | None:
        value = hostvars.get(key)
        if value is not None and not isinstance(value, (str, int)):
            raise InventoryError(f"{path}: host {name}: {key}: must be a string")
        return None if value is None else str(value)

    fields: dict[str, Any] = {"ssh": text("ansible_host") or name}
    data_ip = text("nvmflab_data_ip")
    if data_ip is None:
        try:
            data_ip = str(ipaddress.ip_address(fields["ssh"]))
        except ValueError:
            raise InventoryError(f"{path}: host {name}: nvmflab_data_ip: needed, since ansible_host "
                                 f"{fields['ssh']!r} is not an address") from None
    fields["data_ip"] = data_ip
    if hostvars.get("nvmflab_cores") is not None:
        fields["cores"] = hostvars["nvmflab_cores"]
    if hostvars.get("ansible_user") is not None:
        fields["user"] = text("ansible_user")
    if hostvars.get("ansible_port") is not None:
        fields["port"] = hostvars["ansible_port"]
    options: list[str] = []
    if hostvars.get("ansible_ssh_private_key_file") is not None:
        options += ["-i", text("ansible_ssh_private_key_file")]
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if hostvars.get(key):
            try:
                options += shlex.split(text(key))
            except ValueError as err:
                raise InventoryError(f"{path}: host {name}: {key}: {err}") from None
    fields["ssh_options"] = options
    return fields
