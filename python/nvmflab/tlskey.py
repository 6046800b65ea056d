"""TLS PSKs in NVMe's interchange format, `NVMeTLSkey-1:HH:<base64 of secret + CRC-32 LE>:`.

This is what `nvme gen-tls-key` prints and nvmf-target, nvmf-perf and SPDK read (docs/tls.md). The
harness makes one random key per run for `tls = "on"` points unless the spec gives one."""

from __future__ import annotations

import base64
import secrets
import zlib

# Hash identifier 01: SHA-256, a 32-byte configured PSK.
SHA256, SECRET_BYTES = 1, 32


def interchange_key(secret: bytes, hash_id: int = SHA256) -> str:
    """`secret` in the interchange format: base64 of the secret followed by its CRC-32, little endian."""
    crc = zlib.crc32(secret).to_bytes(4, "little")
    return f"NVMeTLSkey-1:{hash_id:02x}:{base64.b64encode(secret + crc).decode()}:"


def random_key() -> str:
    """A fresh 32-byte secret from the OS's CSPRNG, in the interchange format."""
    return interchange_key(secrets.token_bytes(SECRET_BYTES))


def check_key(key: str) -> str:
    """`key` if it is a well-formed interchange key (hash 01 with a 32-byte secret, 02 with 48) whose
    CRC-32 matches, else ValueError saying which part is wrong."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "NVMeTLSkey-1" or parts[3] != "" or parts[1] not in ("01", "02"):
        raise ValueError("expected NVMeTLSkey-1:01:<base64>: or NVMeTLSkey-1:02:<base64>:")
    try:
        raw = base64.b64decode(parts[2], validate=True)
    except ValueError:
        raise ValueError("the key's base64 does not decode") from None
    want = 32 if parts[1] == "01" else 48
    if len(raw) != want + 4:
        raise ValueError(f"hash {parts[1]} takes a {want}-byte secret, this key has {len(raw) - 4}")
    if int.from_bytes(raw[-4:], "little") != zlib.crc32(raw[:-4]):
        raise ValueError("the key's CRC-32 does not match its secret (mistyped?)")
    return key
