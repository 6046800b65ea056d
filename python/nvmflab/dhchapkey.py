"""DH-HMAC-CHAP secrets in nvme-cli's format, `DHHC-1:00:<base64 of secret + CRC-32 LE>:`.

This is what `nvme gen-dhchap-key` prints and nvmf-target (`[[host]] dhchap_key`) and nvmf-perf
(`--dhchap-secret`) read. The harness makes one random secret per run for `dhchap` points. Hash
field 00: the secret is used as it is (no transformation with the host NQN)."""

from __future__ import annotations

import base64
import secrets
import zlib

SECRET_BYTES = 32
DH_GROUPS = ("null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192")


def dhchap_secret(secret: bytes) -> str:
    """`secret` (32, 48 or 64 bytes) in the DHHC-1 format."""
    if len(secret) not in (32, 48, 64):
        raise ValueError(f"a DH-HMAC-CHAP secret is 32, 48 or 64 bytes, not {len(secret)}")
    crc = zlib.crc32(secret).to_bytes(4, "little")
    return f"DHHC-1:00:{base64.b64encode(secret + crc).decode()}:"


def random_secret() -> str:
    """A fresh 32-byte secret from the OS's CSPRNG, in the DHHC-1 format."""
    return dhchap_secret(secrets.token_bytes(SECRET_BYTES))
