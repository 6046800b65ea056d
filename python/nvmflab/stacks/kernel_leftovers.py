"""What an earlier nvmflab run left on a machine's kernel when it could not tear down (SIGKILL, a
power cut on this machine, a lost SSH connection): nvmet subsystems, ports, host entries, null_blk
devices, /dev/shm files, `.nvme` keyring keys. The kernel stack removes them
before its first target or host on that machine (KernelStack._clean_once).

Only what carries nvmflab's marks goes, so a user's own entries are never touched:
- subsystems and host entries whose NQN starts with MARK (every study's subsystem NQN, and the
  host NQN the TLS and DH-HMAC-CHAP points connect with);
- ports whose subsystem links are all marked subsystems (a port also serving a user's subsystem
  only loses the marked links);
- null_blk devices and /dev/shm files named `nvmflab-…` (KernelTarget._backend);
- keys whose description names a marked NQN (the PSKs `nvme check-tls-key --insert` made).
A leftover controller on a host is not disconnected: it may be someone's own connection to a
marked subsystem, and once its target is gone the kernel drops it after ctrl-loss-tmo (10 s).
So two nvmflab runs must not share a machine at the same time (measurements could not anyway):
the second one's start would remove the first one's target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MARK = "nqn.2024-01.io.nvmflab:"
FILE_MARK = "nvmflab-"

# $1 = the kernel root ("/" on a real machine). One line per item, tab-separated:
#   port ID LINKS | sub NQN NAMESPACES HOST-LINKS | host NQN | nullb NAME | shm FILE
SCAN_TARGET = r"""n="$1/sys/kernel/config/nvmet"
for p in "$n"/ports/*/; do p=${p%/}; [ -d "$p/subsystems" ] || continue
  printf 'port\t%s\t%s\n' "${p##*/}" "$(ls "$p/subsystems" | tr '\n' ' ')"; done
for s in "$n"/subsystems/*/; do s=${s%/}; [ -d "$s/namespaces" ] || continue
  printf 'sub\t%s\t%s\t%s\n' "${s##*/}" "$(ls "$s/namespaces" | tr '\n' ' ')" \
    "$(ls "$s/allowed_hosts" 2>/dev/null | tr '\n' ' ')"; done
for h in "$n"/hosts/*/; do h=${h%/}; [ -d "$h" ] && printf 'host\t%s\n' "${h##*/}"; done
for b in "$1"/sys/kernel/config/nullb/nvmflab-*/; do b=${b%/}; [ -d "$b" ] && printf 'nullb\t%s\n' "${b##*/}"; done
for f in "$1"/dev/shm/nvmflab-*.img; do [ -f "$f" ] && printf 'shm\t%s\n' "${f##*/}"; done
true"""
# Keys in the `.nvme` keyring: key SERIAL DESCRIPTION (keyctl rdescribe: type;uid;gid;perm;description).
SCAN_KEYS = r"""command -v keyctl >/dev/null 2>&1 || exit 0
for k in $(keyctl rlist %:.nvme 2>/dev/null); do printf 'key\t%s\t%s\n' "$k" "$(keyctl rdescribe "$k" 2>/dev/null)"; done
true"""


def marked(nqn: str) -> bool:
    return nqn.startswith(MARK)


@dataclass
class Leftovers:
    """Marked items found on one machine; `steps` turns them into the commands that remove them."""

    ports: dict[str, list[str]] = field(default_factory=dict)  # port id -> every subsystem it links
    subsystems: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # nqn -> (nsids, hosts)
    hosts: list[str] = field(default_factory=list)
    nullb: list[str] = field(default_factory=list)
    shm: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # key serials (decimal, as keyctl prints them)

    def names(self) -> list[str]:
        """What was found, for the message that says what the run removes."""
        return ([f"port {p}" for p, links in self.ports.items() if any(marked(s) for s in links)]
                + [f"subsystem {s}" for s in self.subsystems] + [f"host entry {h}" for h in self.hosts]
                + [f"null_blk {b}" for b in self.nullb] + [f"/dev/shm/{f}" for f in self.shm]
                + [f"key {k}" for k in self.keys])

    def steps(self, root: str) -> list[list[str]]:
        """The commands, in an order configfs accepts: port links (and ports that served only
        marked subsystems), namespaces, subsystems, host entries, null_blk, files, keys."""
        nvmet, out = f"{root.rstrip('/')}/sys/kernel/config/nvmet", []
        for port, links in self.ports.items():
            ours = [s for s in links if marked(s)]
            out += [["rm", f"{nvmet}/ports/{port}/subsystems/{s}"] for s in ours]
            if ours and len(ours) == len(links):
                out.append(["rmdir", f"{nvmet}/ports/{port}"])
        for nqn, (namespaces, hosts) in self.subsystems.items():
            sub = f"{nvmet}/subsystems/{nqn}"
            for ns in namespaces:
                out += [write("0", f"{sub}/namespaces/{ns}/enable"), ["rmdir", f"{sub}/namespaces/{ns}"]]
            out += [["rm", f"{sub}/allowed_hosts/{h}"] for h in hosts]
            out.append(["rmdir", sub])
        out += [["rmdir", f"{nvmet}/hosts/{h}"] for h in self.hosts]
        for name in self.nullb:
            nullb = f"{root.rstrip('/')}/sys/kernel/config/nullb/{name}"
            out += [write("0", f"{nullb}/power"), ["rmdir", nullb]]
        out += [["rm", "-f", f"{root.rstrip('/')}/dev/shm/{f}"] for f in self.shm]
        out += [["keyctl", "unlink", k, "%:.nvme"] for k in self.keys]
        return out

    def __bool__(self) -> bool:
        return bool(self.names())


def write(value: str, path: str) -> list[str]:
    return ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", value, path]


def parse(scan: str, found: Leftovers | None = None) -> Leftovers:
    """SCAN_TARGET's and SCAN_KEYS's lines -> the marked items among them."""
    found = Leftovers() if found is None else found
    for line in scan.splitlines()[:4096]:
        kind, _, rest = line.partition("\t")
        fields = rest.split("\t")
        if kind == "port" and len(fields) == 2 and fields[0].isdigit():
            links = fields[1].split()
            if any(marked(s) for s in links):
                found.ports[fields[0]] = links
        elif kind == "sub" and len(fields) == 3 and marked(fields[0]):
            found.subsystems[fields[0]] = ([n for n in fields[1].split() if n.isdigit()], fields[2].split())
        elif kind == "host" and len(fields) == 1 and marked(fields[0]):
            found.hosts.append(fields[0])
        elif kind == "nullb" and len(fields) == 1 and fields[0].startswith(FILE_MARK) and "/" not in fields[0]:
            found.nullb.append(fields[0])
        elif kind == "shm" and len(fields) == 1 and fields[0].startswith(FILE_MARK) and "/" not in fields[0]:
            found.shm.append(fields[0])
        elif kind == "key" and len(fields) == 2 and fields[0].isdigit() and _marked_key(fields[1]):
            found.keys.append(fields[0])
    return found


def _marked_key(description: str) -> bool:
    """A PSK's description (after type;uid;gid;perm;) names its host and subsystem NQNs:
    'NVMe0R01 HOSTNQN SUBNQN' (identity 1 adds the digest)."""
    parts = description.split(";", 4)
    return len(parts) == 5 and parts[0] == "psk" and any(marked(w) for w in parts[4].split())

