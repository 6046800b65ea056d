"""fio with our external ioengine over NVMe/TCP with TLS 1.3 (engine options tls, tls_key,
tls_key_identity, tls_compat; docs/tls.md), against our nvmf-target on a port that requires TLS:

- write then `--verify=crc32c` read-back over TLS with a SHA-256 key (identity versions 1 and 0,
  4 KiB and 128 KiB) and a SHA-384 key; the target's /stats must count the TLS sessions, so the
  data really went through TLS;
- `tls_compat=1` (keys derived as libnvme before 1.16 does) is accepted by our target for a
  version 1 identity;
- a wrong key fails fast with one `nvmf` line saying "authentication failed"; no key at all on the
  TLS-required port fails; `tls=1` without `tls_key` is refused before connecting.

Skipped like tests/fio/test_fio_engine.py when fio or the engine's fio support is missing."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from test_fio_engine import NQN, OurTarget, check_verified, engine, free_port, run_fio, verify_job  # noqa: F401 (engine: fixture)

HOST = "nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349"
# Keys in the interchange format (libnvme's test/psk.c secrets, as crates/nvmf-tls's key tests).
KEY_SHA256 = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
KEY_SHA384 = "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:"
OTHER_HOST = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"


class TlsTarget(OurTarget):
    """nvmf-target with tls=required holding KEY_SHA256 for HOST and KEY_SHA384 for OTHER_HOST."""

    def __init__(self):
        self.stats_port = free_port()
        super().__init__(extra=("--tls", "required", "--tls-key", f"{HOST}={KEY_SHA256}",
                                "--tls-key", f"{OTHER_HOST}={KEY_SHA384}", "--stats", f"127.0.0.1:{self.stats_port}"))

    def port_stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/stats", timeout=5) as r:
            return json.load(r)["ports"][0]


@pytest.fixture(scope="module")
def tls_target(engine):
    target = TlsTarget()
    try:
        yield target
    finally:
        target.stop()


def tls_args(key: str = KEY_SHA256, host: str = HOST, *extra: str) -> list[str]:
    return [f"--hostnqn={host}", f"--tls_key={key}", *extra]


def test_target_requires_tls(tls_target):
    # kTLS where the kernel has its tls module, else userspace records (nvmf-target --ktls auto).
    records = "ktls" if Path("/sys/module/tls").exists() else "userspace"
    assert tls_target.ready.rstrip().endswith(f"tls=required:{records}"), tls_target.ready


@pytest.mark.parametrize("bs,identity", [("4k", "1"), ("128k", "1"), ("4k", "0"), ("128k", "0")])
def test_verify_over_tls(engine, tls_target, bs, identity):
    before = tls_target.port_stats()["tls_connections"]
    done, _ = run_fio(engine, tls_target.address, tls_target.port,
                      *verify_job(bs, "--thread=1", *tls_args(KEY_SHA256, HOST, f"--tls_key_identity={identity}")))
    check_verified(done)
    # The size query and the job each connect (admin + I/O queue): all of them over TLS.
    assert tls_target.port_stats()["tls_connections"] >= before + 2


def test_verify_over_tls_sha384_with_processes_and_digests(engine, tls_target):
    done, _ = run_fio(engine, tls_target.address, tls_target.port,
                      *verify_job("128k", "--numjobs=2", "--offset_increment=32m", "--hdr_digest=1",
                                  "--data_digest=1", *tls_args(KEY_SHA384, OTHER_HOST, "--tls=1")))
    check_verified(done, expect_jobs=2)


def test_compat_derivation_is_accepted_by_our_target(engine, tls_target):
    """What Debian trixie's nvme-cli 2.13 (libnvme 1.13) derives; our target tells by the digest."""
    done, _ = run_fio(engine, tls_target.address, tls_target.port,
                      *verify_job("4k", "--thread=1", *tls_args(KEY_SHA256, HOST, "--tls_compat=1")))
    check_verified(done)


def nvmf_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [x for x in done.stderr.splitlines() if x.startswith("nvmf")]


def test_wrong_key_fails_fast_as_an_authentication_failure(engine, tls_target):
    before = tls_target.port_stats()["tls_handshake_failures"]
    done, elapsed = run_fio(engine, tls_target.address, tls_target.port, "--rw=read", "--bs=4k", "--size=1m",
                            "--thread=1", *tls_args(KEY_SHA384, HOST), timeout=60)
    assert done.returncode != 0
    lines = nvmf_lines(done)
    assert lines and "authentication failed" in lines[0], done.stderr
    assert elapsed < 20
    assert tls_target.port_stats()["tls_handshake_failures"] > before


def test_plain_connect_to_a_tls_required_port_fails(engine, tls_target):
    before = tls_target.port_stats()["plain_refused"]
    done, elapsed = run_fio(engine, tls_target.address, tls_target.port, "--rw=read", "--bs=4k", "--size=1m",
                            "--thread=1", f"--hostnqn={HOST}", timeout=60)
    assert done.returncode != 0 and nvmf_lines(done), done.stderr
    assert elapsed < 20
    assert tls_target.port_stats()["plain_refused"] > before


@pytest.mark.parametrize("args,expect", [
    (["--tls=1"], "tls=1 needs tls_key="),
    (["--tls_key_identity=1"], "tls_key_identity= needs tls_key="),
    (["--tls_compat=1"], "tls_compat=1 needs tls_key="),
    (["--tls_key=NVMeTLSkey-1:01:AAAA:"], "tls_key=:"),
])
def test_bad_tls_options_are_refused_before_connecting(engine, tls_target, args, expect):
    done, elapsed = run_fio(engine, tls_target.address, tls_target.port, "--rw=read", "--bs=4k", "--size=1m",
                            "--thread=1", f"--hostnqn={HOST}", *args, timeout=60)
    assert done.returncode != 0
    lines = nvmf_lines(done)
    assert lines and expect in lines[0], done.stderr
    assert elapsed < 20
