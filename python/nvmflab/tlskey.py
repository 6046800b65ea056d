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
