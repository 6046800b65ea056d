"""NVMe/TCP over TLS 1.3 between our stack and Linux 6.12's, under qemu (docs/tls.md, "Interop").

One boot of the Debian trixie guest (tests/guest/trixie.py: kernel 6.12, tlshd from ktls-utils
1.0.0, nvme-cli 2.13 / libnvme 1.13, keyutils) runs tests/tls/guest-tls.sh, which checks both
directions on the guest's own loopback and writes one line per check; each check below is one
test, and a check that never reported fails. About four and a half minutes on 2 cores (TCG).

- kernel host -> nvmf-target (tls = required): `nvme discover --tls` showing TREQ required and
  sectype tls13, `nvme connect --tls` with the v1 identity (kernel's first choice), fio verify at
  4k, 128k and 1m, all with the target's records in the kernel (`--ktls on`, every connection
  counted in ktls_connections); with userspace records (`--ktls off`): only v0 identities in the
  keyring and a fio verify, a plain connect refused; a wrong key refused with a target log line
  naming the host; a SHA-384 key (TLS_AES_256_GCM_SHA384);
- nvmf-perf -> nvmet-tcp (addr_tsas=tls1.3, addr_treq=required, keys in the .nvme keyring):
  discover, identify, run --verify (identity version 1 at 4k and 128k with `--ktls on`, version 0
  at 4k with `--ktls off`, a SHA-384 key), wrong key (v1 and v0 identities: reported as a close
  naming the identity, since tlshd sends no alert), a plain connect refused;
- nvmf-perf -> nvmet with the interchange key alone (no identity version, no compat flag) where
  the keyring holds what `nvme gen-tls-key --insert` puts there by default: nvme-cli 2.13's
  (version 0, derived the old way), run in the guest, and a current nvme-cli's (version 0, the
  specification's derivation; added as libnvme adds it, with libnvme's own test vector); run
  --verify passes and nvmf-perf names the identity and derivation that worked; with
  NVMFLAB_NVME_CLI_CURRENT=PATH (an nvme binary of 2.16 or later, built as docs/tls.md says), that
  release itself makes the keyring entry, and our host (to nvmet) and the kernel's host (to our
  target) connect with it; those two checks are skipped without it;
- nvmf-perf <-> nvmf-target with kTLS on one side and userspace records on the other (both ways)
  and on both, run --verify (128k for the mixed pairs, 4k for kTLS on both); the kTLS target logs the userspace host's
  close_notify alert.

Skipped with the reason when the guest cannot be built (no network for its packages) unless
NVMFLAB_TLS_INTEROP_REQUIRE=1; NVMFLAB_TLS_INTEROP_LOGS=DIR keeps the guest's console and $OUT.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(os.environ.get("NVMFLAB_BIN_DIR", ROOT / "target/release"))
GUEST_TIMEOUT_S = 420
CURRENT_NVME_CLI = os.environ.get("NVMFLAB_NVME_CLI_CURRENT")

CHECKS = [
    "guest-tlshd", "keys",
    "k2o-target-start", "k2o-discover-tsas", "k2o-connect", "k2o-fio-4k", "k2o-fio-128k", "k2o-fio-1m",
    "k2o-ktls", "k2o-connect-v0", "k2o-plain", "k2o-wrong-key", "k2o-sha384",
    "o2k-nvmet-setup", "o2k-discover", "o2k-identify",
    "o2k-verify-v1-4k", "o2k-verify-v1-128k", "o2k-verify-v0-4k", "o2k-sha384",
    "o2k-wrong-key-v1", "o2k-wrong-key-v0", "o2k-plain", "o2k-gen-tls-key-2.13", "o2k-gen-tls-key-current",
    "o2o-userspace-host-ktls-target", "o2o-ktls-both", "o2o-ktls-alert", "o2o-ktls-host-userspace-target",
]  # fmt: skip
# Reported only when the guest was given a current nvme-cli (NVMFLAB_NVME_CLI_CURRENT).
CURRENT_NVME_CLI_CHECKS = ["o2k-nvme-cli-current", "k2o-nvme-cli-current"]


def parse_checks(text: str) -> dict[str, tuple[str, str]]:
    """checks.tsv -> {name: (result, detail)}; a name reported twice keeps its first result."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[1] in ("pass", "fail"):
            found.setdefault(parts[0], (parts[1], parts[2]))
    return found


@pytest.fixture(scope="module")
def guest_checks() -> dict[str, tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "tests/guest"))
    try:
        import trixie
    except ImportError as err:
        pytest.fail(f"tests/guest/trixie.py is not importable: {err}")
    finally:
        sys.path.pop(0)
    for name in ("nvmf-target", "nvmf-perf"):
        if not (BIN / name).is_file():
            pytest.fail(f"{BIN / name} missing (make build)")
    files = {"/usr/local/bin/nvmf-target": BIN / "nvmf-target", "/usr/local/bin/nvmf-perf": BIN / "nvmf-perf"}
    if CURRENT_NVME_CLI:
        if not os.access(CURRENT_NVME_CLI, os.X_OK):
            pytest.fail(f"NVMFLAB_NVME_CLI_CURRENT={CURRENT_NVME_CLI} is not an executable file")
        files["/usr/local/bin/nvme-current"] = Path(CURRENT_NVME_CLI)
    try:
        trixie.build()
    except trixie.GuestUnavailable as why:
        if os.environ.get("NVMFLAB_TLS_INTEROP_REQUIRE") == "1":
            raise
        pytest.skip(f"TLS interop skipped: {why} (NVMFLAB_TLS_INTEROP_REQUIRE=1 makes this an error)")
    logs = os.environ.get("NVMFLAB_TLS_INTEROP_LOGS")
    keep = Path(logs) if logs else Path(tempfile.mkdtemp(prefix="tls-interop-"))
    try:
        # trixie.boot boots once more when the guest never came up (the kernel under TCG now and
        # then oopses while it boots on a loaded machine).
        run = trixie.run_script(
            (HERE / "guest-tls.sh").read_text(),
            files,
            timeout_s=GUEST_TIMEOUT_S, keep=keep, memory_mb=2048,
            progress=lambda line: print(f"tls-guest: {line}", flush=True),
        )
        tsv = run.out / "checks.tsv"
        checks = parse_checks(tsv.read_text(errors="replace")) if tsv.is_file() else {}
        if not checks:
            pytest.fail(f"the guest reported no checks ({run.why}, script rc {run.rc}); console tail:\n"
                        + "\n".join(run.console.splitlines()[-30:]))
        if not run.finished:
            checks.setdefault("guest-finished", ("fail", run.why))
        return checks
    finally:
        if not logs:
            shutil.rmtree(keep, ignore_errors=True)


@pytest.mark.parametrize("name", CHECKS)
def test_guest_check(guest_checks, name):
    result, detail = guest_checks.get(name, ("fail", "never reported (the script stopped before it)"))
    assert result == "pass", f"{name}: {detail}"


@pytest.mark.skipif(
    not CURRENT_NVME_CLI, reason="NVMFLAB_NVME_CLI_CURRENT is not set: no current nvme-cli to run in the guest (docs/tls.md)"
)
@pytest.mark.parametrize("name", CURRENT_NVME_CLI_CHECKS)
def test_current_nvme_cli_check(guest_checks, name):
    result, detail = guest_checks.get(name, ("fail", "never reported (the script stopped before it)"))
    assert result == "pass", f"{name}: {detail}"


def test_guest_finished(guest_checks):
    assert "guest-finished" not in guest_checks, guest_checks.get("guest-finished")


def test_every_reported_check_is_known(guest_checks):
    """A check the script reports but this list lacks would never be asserted."""
    assert set(guest_checks) - {"guest-finished"} <= set(CHECKS) | set(CURRENT_NVME_CLI_CHECKS)


def test_parse_checks_takes_the_first_result_and_ignores_junk():
    text = "a\tpass\tok\nb\tfail\twhy\ta tab\nnoise\na\tfail\tlater\nc\tmaybe\tx\n"
    assert parse_checks(text) == {"a": ("pass", "ok"), "b": ("fail", "why\ta tab")}
