"""DH-HMAC-CHAP with peers we did not write.

1. Keys from nvme-cli (`nvme gen-dhchap-key`, every transformation hash and key length) configured
   on `nvmf-target` and given to `nvmf-perf --dhchap-secret`: nvme-cli's encoder and
   transformation against ours, through the binaries' real options, on loopback. No VM.
2. The kernel host and target under qemu need a kernel built with CONFIG_NVME_AUTH (host) and
   CONFIG_NVME_TARGET_AUTH (nvmet). Debian 12's stock 6.1 kernel has neither
   (`test_installed_kernel_lacks_auth_or_has_it` records which), so the tests here boot Debian's
   bookworm-backports 6.12 kernel, downloaded once into `.cache/interop/kernels/` and unpacked
   without installing it (kernels.py), as the SSH guest (guest/init-sshd), once per module:
   a. the kernel host (`nvme connect --dhchap-secret`, `--dhchap-ctrl-secret`) against our
      nvmf-target in the bed's namespace: right keys connect and fio writes and reads back
      4 MiB; a wrong host key and a wrong controller key are refused;
   b. our host (`nvmf-perf --dhchap-secret`, `--dhchap-ctrl-secret`) against the kernel's nvmet
      with `hosts/<nqn>/dhchap_key` (and `dhchap_ctrl_key`): right keys connect and a verified
      write+read-back runs; wrong keys are refused.
   SHA-256 with the NULL group unidirectional, ffdhe2048 bidirectional, both ways.
   They skip (with the reason) only when the backports kernel cannot be had, e.g. no network.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import initramfs
import kernels
from vm import GUEST_IP, HOST_IP, BedError, TestBed

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("NVMFLAB_BIN_DIR", REPO / "target/release"))
NQN = "nqn.2024-01.io.nvmflab:auth-interop"
HOST = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6c61-4200-8000-0000000000a{}"
# Secrets given to nvme-cli in hex, so the test is repeatable: (hmac, key length).
VARIANTS = [(0, 32), (1, 32), (2, 48), (3, 64)]


def _gen_key(hmac: int, length: int, hostnqn: str, seed: int) -> str:
    secret = bytes((seed * 17 + i * 5) & 0xFF for i in range(length)).hex()
    argv = ["nvme", "gen-dhchap-key", f"--secret={secret}", f"--hmac={hmac}", f"--key-length={length}", f"--nqn={hostnqn}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    assert re.fullmatch(rf"DHHC-1:0{hmac}:[A-Za-z0-9+/=]+:", out), out
    return out


@pytest.fixture(scope="module")
def keyed_target(tmp_path_factory):
    """nvmf-target with one host per nvme-cli variant, the last one also with a controller key."""
    if not shutil.which("nvme"):
        pytest.skip("nvme-cli is not installed (scripts/install-deps.sh --for test installs it)")
    for name in ["nvmf-target", "nvmf-perf"]:
        if not (BIN_DIR / name).exists():
            pytest.fail(f"{BIN_DIR / name} missing: run `make build` first")
    keys = {HOST.format(i): _gen_key(h, n, HOST.format(i), i) for i, (h, n) in enumerate(VARIANTS)}
    ctrl_host = HOST.format(len(VARIANTS) - 1)
    ctrl_key = _gen_key(1, 32, NQN, 99)
    hosts = "".join(
        f'[[host]]\nnqn = "{nqn}"\ndhchap_key = "{key}"\n'
        + (f'dhchap_ctrl_key = "{ctrl_key}"\ndhchap_dhgroup = "ffdhe2048"\n' if nqn == ctrl_host else "")
        for nqn, key in keys.items()
    )
    config = tmp_path_factory.mktemp("auth") / "target.toml"
    config.write_text(
        f'[[port]]\naddr = "127.0.0.1:0"\n\n{hosts}\n[[subsystem]]\nnqn = "{NQN}"\n'
        '  [[subsystem.namespace]]\n  nsid = 1\n  backend = "ram"\n  size = "4MiB"\n'
    )
    proc = subprocess.Popen([str(BIN_DIR / "nvmf-target"), "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().strip()
        m = re.search(r"listen=127\.0\.0\.1:(\d+)", ready)
        if not m:
            proc.kill()
            pytest.fail(f"nvmf-target did not start: {ready} {proc.stderr.read()}")
        yield {"port": m.group(1), "keys": keys, "ctrl_host": ctrl_host, "ctrl_key": ctrl_key}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _identify(port: str, hostnqn: str, *secrets: str) -> subprocess.CompletedProcess:
    argv = [str(BIN_DIR / "nvmf-perf"), "identify", "-a", "127.0.0.1", "-s", port, "-n", NQN, "-q", hostnqn, *secrets]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[f"hmac{h}-{n}B" for h, n in VARIANTS])
def test_nvme_cli_keys_authenticate_our_host(keyed_target, index: int):
    host = HOST.format(index)
    r = _identify(keyed_target["port"], host, "--dhchap-secret", keyed_target["keys"][host])
    assert r.returncode == 0, r.stderr
    assert NQN in r.stdout


def test_bidirectional_with_an_nvme_cli_controller_key(keyed_target):
    host, key, ctrl = keyed_target["ctrl_host"], keyed_target["keys"][keyed_target["ctrl_host"]], keyed_target["ctrl_key"]
    r = _identify(keyed_target["port"], host, "--dhchap-secret", key, "--dhchap-ctrl-secret", ctrl)
    assert r.returncode == 0, r.stderr
    wrong_ctrl = keyed_target["keys"][HOST.format(0)]
    r = _identify(keyed_target["port"], host, "--dhchap-secret", key, "--dhchap-ctrl-secret", wrong_ctrl)
    assert r.returncode != 0 and "does not match --dhchap-ctrl-secret" in r.stderr, r.stderr


def test_wrong_and_missing_keys_are_refused(keyed_target):
    port, keys = keyed_target["port"], keyed_target["keys"]
    r = _identify(port, HOST.format(0), "--dhchap-secret", keys[HOST.format(1)])
    assert r.returncode != 0 and "refused authentication: authentication failed" in r.stderr, r.stderr
    r = _identify(port, HOST.format(0))
    assert r.returncode != 0 and "--dhchap-secret" in r.stderr, r.stderr
    r = _identify(port, HOST.format(0), "--dhchap-secret", "DHHC-1:01:not-a-key:")
    assert r.returncode != 0 and "--dhchap-secret" in r.stderr and "base64" in r.stderr, r.stderr


def _kernel_auth_support() -> str | None:
    """None when the installed kernel can do DH-HMAC-CHAP both ways, else why not."""
    try:
        version, _ = initramfs.find_kernel()
    except initramfs.BuildError as e:
        return str(e)
    config = Path(f"/boot/config-{version}")
    if not config.exists():
        return f"{config} is missing: cannot tell whether kernel {version} has NVMe authentication"
    text = config.read_text()
    missing = [opt for opt in ["CONFIG_NVME_AUTH", "CONFIG_NVME_TARGET_AUTH"] if not re.search(rf"^{opt}=[ym]$", text, re.M)]
    if missing:
        return f"installed kernel {version} is built without {' and '.join(missing)} (Debian 12's stock kernel lacks both)"
    return None


def test_installed_kernel_lacks_auth_or_has_it():
    """Why the guest below boots the backports kernel: records what the installed one lacks, and
    checks that verdict against the kernel's module tree (a second source): CONFIG_NVME_AUTH builds
    nvme-auth, as a module (modules.dep) or into the kernel (modules.builtin)."""
    try:
        version, _ = initramfs.find_kernel()
    except initramfs.BuildError as e:
        pytest.skip(str(e))
    reason = _kernel_auth_support()
    tree = Path("/lib/modules") / version
    listed = "".join((tree / name).read_text() for name in ("modules.dep", "modules.builtin")
                     if (tree / name).exists())
    has_module = re.search(r"(^|/)nvme-auth\.ko", listed, re.M) is not None
    if reason is None:
        assert has_module, f"kernel {version}: config says NVMe authentication, but no nvme-auth in {tree}"
    elif re.search(r"without CONFIG_NVME_AUTH\b", reason):
        assert reason.startswith(f"installed kernel {version} is built without"), reason
        assert not has_module, f"kernel {version}: said to lack CONFIG_NVME_AUTH, but {tree} lists nvme-auth"
    else:
        assert reason.startswith(f"installed kernel {version} is built without CONFIG_NVME_TARGET_AUTH") or \
            reason == f"/boot/config-{version} is missing: cannot tell whether kernel {version} has NVMe authentication", reason


# ---- the kernel under qemu (bookworm-backports 6.12) ----

KERNEL_CACHE = REPO / ".cache/interop/kernels"
PORT = 4420
OUR_NQN = "nqn.2024-01.io.nvmflab:auth-ours"
KERNEL_NQN = "nqn.2024-01.io.nvmflab:auth-kernel"
UNI = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6c61-4200-8000-0000000000c1"  # sha256, NULL group
BI = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6c61-4200-8000-0000000000c2"  # ffdhe2048, controller key
NVMET = "/sys/kernel/config/nvmet"
BOOT_TIMEOUT_S = 240


@dataclass
class AuthGuest:
    bed: TestBed
    key: Path
    keys: dict[str, str]  # host key per host NQN, and "ctrl" / "wrong"
    version: str

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR", f"root@{GUEST_IP}", command]
        return self.bed.run_in_ns(argv, timeout=timeout)

    def ok(self, command: str, timeout: float = 60) -> str:
        r = self.ssh(command, timeout)
        assert r.returncode == 0, f"guest: {command!r} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r.stdout


def _our_target_config(keys: dict[str, str]) -> str:
    return (
        f'[[port]]\naddr = "{HOST_IP}:{PORT}"\n\n'
        f'[[host]]\nnqn = "{UNI}"\ndhchap_key = "{keys[UNI]}"\ndhchap_hash = "sha256"\ndhchap_dhgroup = "null"\n\n'
        f'[[host]]\nnqn = "{BI}"\ndhchap_key = "{keys[BI]}"\ndhchap_ctrl_key = "{keys["ctrl"]}"\n'
        f'dhchap_hash = "sha256"\ndhchap_dhgroup = "ffdhe2048"\n\n'
        f'[[subsystem]]\nnqn = "{OUR_NQN}"\nallow_any_host = false\nhosts = ["{UNI}", "{BI}"]\n'
        '  [[subsystem.namespace]]\n  nsid = 1\n  backend = "ram"\n  size = "16MiB"\n'
    )


def _nvmet_config(keys: dict[str, str]) -> str:
    """nvmet in the guest: a brd namespace, hosts UNI (sha256, NULL) and BI (ffdhe2048 with a
    controller key) allowed with their keys, on GUEST_IP:PORT."""
    return f"""set -e
modprobe brd rd_nr=1 rd_size=16384
modprobe -a nvmet nvmet_tcp
cd {NVMET}
mkdir subsystems/{KERNEL_NQN}
echo 0 > subsystems/{KERNEL_NQN}/attr_allow_any_host
mkdir subsystems/{KERNEL_NQN}/namespaces/1
echo -n /dev/ram0 > subsystems/{KERNEL_NQN}/namespaces/1/device_path
echo 1 > subsystems/{KERNEL_NQN}/namespaces/1/enable
mkdir hosts/{UNI} hosts/{BI}
echo '{keys[UNI]}' > hosts/{UNI}/dhchap_key
echo 'hmac(sha256)' > hosts/{UNI}/dhchap_hash
echo null > hosts/{UNI}/dhchap_dhgroup
echo '{keys[BI]}' > hosts/{BI}/dhchap_key
echo '{keys['ctrl']}' > hosts/{BI}/dhchap_ctrl_key
echo 'hmac(sha256)' > hosts/{BI}/dhchap_hash
echo ffdhe2048 > hosts/{BI}/dhchap_dhgroup
ln -s {NVMET}/hosts/{UNI} subsystems/{KERNEL_NQN}/allowed_hosts/{UNI}
ln -s {NVMET}/hosts/{BI} subsystems/{KERNEL_NQN}/allowed_hosts/{BI}
mkdir ports/1
echo tcp > ports/1/addr_trtype
echo ipv4 > ports/1/addr_adrfam
echo {GUEST_IP} > ports/1/addr_traddr
echo {PORT} > ports/1/addr_trsvcid
ln -s {NVMET}/subsystems/{KERNEL_NQN} ports/1/subsystems/{KERNEL_NQN}
"""


def _start_our_target(bed: TestBed, config: Path) -> None:
    bed.spawn_in_ns([str(BIN_DIR / "nvmf-target"), "--config", str(config)], "nvmf-target.log")
    log = bed.log_dir / "nvmf-target.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if f"listen={HOST_IP}:{PORT}" in log.read_text(errors="replace"):
            return
        if bed.procs[-1].poll() is not None:
            break
        time.sleep(0.1)
    raise BedError(f"nvmf-target did not start:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def auth_guest(tmp_path_factory):
    """The backports kernel booted once as the SSH guest, with nvmet configured with our keys and
    our nvmf-target serving in the bed's namespace."""
    if not shutil.which("nvme"):
        pytest.skip("nvme-cli is not installed (scripts/install-deps.sh --for test installs it)")
    for name in ["nvmf-target", "nvmf-perf"]:
        if not (BIN_DIR / name).exists():
            pytest.fail(f"{BIN_DIR / name} missing: run `make build` first")
    try:
        kernel = kernels.backports_kernel(KERNEL_CACHE)
    except kernels.KernelUnavailable as e:
        pytest.skip(f"kernel DH-HMAC-CHAP interop needs Debian's bookworm-backports kernel, which cannot be had here: {e}")
    missing = kernels.config_has(kernel, "CONFIG_NVME_AUTH", "CONFIG_NVME_HOST_AUTH", "CONFIG_NVME_TARGET_AUTH")
    assert not missing, f"backports kernel {kernel.version} lacks {missing}"
    try:
        boot = initramfs.build(KERNEL_CACHE / kernel.version / "boot-files", ssh=True, kernel=kernel)
    except initramfs.BuildError as e:
        pytest.fail(f"cannot build the SSH guest for {kernel.version}: {e}")
    keys = {UNI: _gen_key(1, 32, UNI, 41), BI: _gen_key(0, 32, BI, 42), "ctrl": _gen_key(1, 32, OUR_NQN, 43),
            "wrong": _gen_key(1, 32, UNI, 44)}
    log_dir = Path(os.environ.get("NVMFLAB_INTEROP_LOGS") or tmp_path_factory.mktemp("interop-auth")) / "auth-guest"
    log_dir.mkdir(parents=True, exist_ok=True)
    key = log_dir / "id_ed25519"
    key.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmflab-auth", "-f", str(key)], check=True, timeout=30)
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    config = log_dir / "target.toml"
    config.write_text(_our_target_config(keys))
    bed = TestBed(boot, log_dir)
    try:
        bed.create_netns()
        _start_our_target(bed, config)
        bed.boot_guest({"authkey": f"{kind}:{blob}"})
        bed.expect("@@SSHD-READY", timeout=BOOT_TIMEOUT_S)
        guest = AuthGuest(bed, key, keys, kernel.version)
        # Native multipath off: /dev/nvmeXn1 belongs to controller nvmeX.
        guest.ok("modprobe nvme_core multipath=N && modprobe nvme_tcp")
        guest.ok(_nvmet_config(keys))
        yield guest
    except BedError as e:
        pytest.fail(f"auth guest failed (logs in {log_dir}): {e}")
    finally:
        with contextlib.suppress(BedError, OSError, ValueError):
            bed.tell_guest("poweroff")
            bed.wait_guest_exit(30)
        bed.close()


def test_guest_runs_the_backports_kernel(auth_guest: AuthGuest):
    assert auth_guest.ok("uname -r").strip() == auth_guest.version


# a. the kernel host against nvmf-target

# Connects, finds the controller and its namespace, writes 4 MiB with fio and reads it back
# verified, disconnects. Exit status: connect's, else fio's, else disconnect's.
KERNEL_HOST_IO = """set -e
nvme connect -t tcp -a {addr} -s {port} -n {nqn} -q {host} {secrets}
ctrl=
for _ in $(seq 100); do
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = {nqn} ] && [ "$(cat $c/state)" = live ] && [ -b /dev/$(basename $c)n1 ] && ctrl=$(basename $c)
    done
    [ -n "$ctrl" ] && break
    sleep 0.1
done
[ -n "$ctrl" ] || {{ echo "no live controller for {nqn}"; nvme disconnect -n {nqn}; exit 1; }}
echo "controller $ctrl"
fio --name=auth --filename=/dev/${{ctrl}}n1 --direct=1 --ioengine=libaio --iodepth=8 --rw=write --bs=64k \
    --size=4m --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse || {{ nvme disconnect -n {nqn}; exit 2; }}
nvme disconnect -n {nqn}
"""


def _kernel_connect(guest: AuthGuest, host: str, *secrets: str, io: bool = True) -> subprocess.CompletedProcess:
    # The host ID from the NQN's UUID: the kernel refuses one host ID under two host NQNs.
    opts = " ".join([f"--hostid={host.rsplit(':', 1)[1]}", *(f"'{s}'" for s in secrets)])
    if io:
        script = KERNEL_HOST_IO.format(addr=HOST_IP, port=PORT, nqn=OUR_NQN, host=host, secrets=opts)
    else:  # the kernel's log of the attempt follows "@@DMESG" in stdout
        script = (f"dmesg -c >/dev/null; nvme connect -t tcp -a {HOST_IP} -s {PORT} -n {OUR_NQN} -q {host} {opts}; rc=$?; "
                  f"nvme disconnect -n {OUR_NQN} >/dev/null 2>&1; echo @@DMESG; dmesg; exit $rc")
    return guest.ssh(script, timeout=120)


def _refused(r: subprocess.CompletedProcess, *kernel_says: str) -> None:
    """The connect failed, and the kernel host's log says why, in one of `kernel_says`."""
    log = r.stdout.partition("@@DMESG")[2]
    assert r.returncode != 0, f"connected:\n{r.stdout}\n{r.stderr}"
    assert any(k in log for k in kernel_says), f"refused, but not for the reason expected ({kernel_says}):\n{r.stdout}\n{r.stderr}"


def test_kernel_host_sha256_null_connects_and_does_io(auth_guest: AuthGuest):
    r = _kernel_connect(auth_guest, UNI, f"--dhchap-secret={auth_guest.keys[UNI]}")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{_target_log(auth_guest)}"
    assert "controller nvme" in r.stdout


def test_kernel_host_with_a_wrong_key_is_refused(auth_guest: AuthGuest):
    before = _target_refusals(auth_guest)
    r = _kernel_connect(auth_guest, UNI, f"--dhchap-secret={auth_guest.keys['wrong']}", io=False)
    _refused(r, "ret=-129")  # EKEYREJECTED: our target answered Failure1
    assert _target_refusals(auth_guest) == before + 1, _target_log(auth_guest)
    assert auth_guest.ok(f"grep -l {OUR_NQN} /sys/class/nvme/nvme*/subsysnqn 2>/dev/null; true").strip() == ""
    r = _kernel_connect(auth_guest, UNI, io=False)  # no key at all: the kernel host gives up itself
    _refused(r, "no key", "ret=-126")


def test_kernel_host_bidirectional_ffdhe2048_connects_and_does_io(auth_guest: AuthGuest):
    k = auth_guest.keys
    r = _kernel_connect(auth_guest, BI, f"--dhchap-secret={k[BI]}", f"--dhchap-ctrl-secret={k['ctrl']}")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{_target_log(auth_guest)}"
    assert "controller nvme" in r.stdout


def test_kernel_host_refuses_our_target_with_a_wrong_controller_key(auth_guest: AuthGuest):
    k = auth_guest.keys
    r = _kernel_connect(auth_guest, BI, f"--dhchap-secret={k[BI]}", f"--dhchap-ctrl-secret={k['wrong']}", io=False)
    _refused(r, "controller authentication failed")


def _target_refusals(guest: AuthGuest) -> int:
    """How many authentications our target has refused so far (its log)."""
    return (guest.bed.log_dir / "nvmf-target.log").read_text(errors="replace").count("closing queue after failed authentication")


def _target_log(guest: AuthGuest) -> str:
    dmesg = guest.ssh("dmesg | tail -20", timeout=30).stdout
    return f"nvmf-target log:\n{(guest.bed.log_dir / 'nvmf-target.log').read_text(errors='replace')[-2000:]}\nguest dmesg:\n{dmesg}"


# b. our host against the kernel's nvmet

def _perf(guest: AuthGuest, host: str, *args: str) -> subprocess.CompletedProcess:
    argv = [str(BIN_DIR / "nvmf-perf"), args[0], "-t", "tcp", "-a", GUEST_IP, "-s", str(PORT), "-n", KERNEL_NQN,
            "-q", host, *args[1:]]
    return guest.bed.run_in_ns(argv, timeout=120)


def _verified_run(guest: AuthGuest, host: str, *secrets: str) -> subprocess.CompletedProcess:
    return _perf(guest, host, "run", "--rw", "write", "--bs", "64k", "--size", "4MiB", "--iodepth", "4", "--verify",
                 "--runtime", "30", "--output-format", "json", *secrets)


def test_our_host_sha256_null_against_nvmet(auth_guest: AuthGuest):
    r = _verified_run(auth_guest, UNI, "--dhchap-secret", auth_guest.keys[UNI])
    assert r.returncode == 0, f"{r.stderr}\n{_target_log(auth_guest)}"
    _assert_verified(r)


def _assert_verified(r: subprocess.CompletedProcess) -> None:
    """nvmf-perf's JSON report shows blocks written, read back and found correct (a wrong block
    fails the run)."""
    report = json.loads(r.stdout[r.stdout.find("{"):])
    verified = []

    def walk(v):
        if isinstance(v, dict):
            verified.extend(x for k, x in v.items() if k == "verified_ios")
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(report)
    assert verified and sum(verified) > 0, f"no verified I/O in the report:\n{r.stdout}"


def test_our_host_with_a_wrong_or_missing_key_is_refused_by_nvmet(auth_guest: AuthGuest):
    r = _perf(auth_guest, UNI, "identify", "--dhchap-secret", auth_guest.keys["wrong"])
    assert r.returncode != 0 and "refused authentication" in r.stderr, f"{r.stderr}\n{_target_log(auth_guest)}"
    r = _perf(auth_guest, UNI, "identify")
    assert r.returncode != 0 and "--dhchap-secret" in r.stderr, r.stderr


def test_our_host_bidirectional_ffdhe2048_against_nvmet(auth_guest: AuthGuest):
    k = auth_guest.keys
    r = _verified_run(auth_guest, BI, "--dhchap-secret", k[BI], "--dhchap-ctrl-secret", k["ctrl"])
    assert r.returncode == 0, f"{r.stderr}\n{_target_log(auth_guest)}"
    _assert_verified(r)
    r = _perf(auth_guest, BI, "identify", "--dhchap-secret", k[BI], "--dhchap-ctrl-secret", k["wrong"])
    assert r.returncode != 0 and "does not match --dhchap-ctrl-secret" in r.stderr, r.stderr
