"""NVMe/TCP over TLS 1.3 between our stack and SPDK v24.01 (its `ssl` socket), on 127.0.0.1:

- our host (`nvmf-perf --tls`) -> SPDK's target with a secure-channel listener and the host's PSK:
  data written and read back at 4 KiB and 128 KiB; a wrong key is an authentication failure;
- spdk_nvme_perf with `-S ssl --psk-path` -> our target with `--tls required`; a wrong key and a
  plain connect are refused.

SPDK 24.01 offers and accepts only version 0 identities (`NVMe0R01 <hostnqn> <subnqn>`, the
specification's derivation), so our host is given `--tls-key-identity 0`. Its PSK derivation
needs scripts/build-spdk.sh's patch 5 (OpenSSL 3.0 refuses the empty HKDF salt SPDK sets).
Every process is stopped in a finally."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from nvmflab.procs import free_port
from nvmflab.stacks.spdk import core_mask, memory_args
from nvmflab.tlskey import interchange_key
from nvmflab.topology.local import LocalHost

BIN = Path(os.environ.get("NVMFLAB_BIN_DIR", Path(__file__).resolve().parents[2] / "target/release"))
SUBNQN = "nqn.2024-01.io.nvmflab:spdk-tls"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:5a1e2b3c-0d4e-4f60-8a7b-9c0d1e2f3a4b"
WAIT_S = 60


KEY = interchange_key(bytes(range(1, 33)))
WRONG_KEY = interchange_key(bytes(range(101, 133)))


def cores() -> tuple[int, int]:
    available = sorted(os.sched_getaffinity(0))
    return available[0], available[-1]


def key_file(tmp: Path, key: str, name: str) -> Path:
    path = tmp / name
    path.write_text(key)
    path.chmod(0o600)  # SPDK refuses a PSK file others can read
    return path


@pytest.fixture
def spdk_tls_target(spdk_root, tmp_path):
    """SPDK's nvmf_tgt with one TLS-only listener and our host's PSK; yields its port."""
    port, sock = free_port(), tmp_path / "spdk.sock"
    log = tmp_path / "nvmf_tgt.log"
    argv = [f"{spdk_root}/build/bin/nvmf_tgt", "-m", core_mask([cores()[0]]), "-r", str(sock), "--wait-for-rpc",
            "--disable-cpumask-locks", *memory_args(LocalHost(), 1024)]
    proc = subprocess.Popen(["sh", "-c", 'echo $$ >"$0.pid"; exec "$@"', str(tmp_path / "tgt"), *argv],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        calls = ["framework_start_init", "framework_wait_init", "nvmf_create_transport -t tcp",
                 "bdev_malloc_create -b m0 64 512", f"nvmf_create_subsystem {SUBNQN} -s NVMFLABTLS01",
                 f"nvmf_subsystem_add_ns {SUBNQN} m0",
                 f"nvmf_subsystem_add_listener {SUBNQN} -t tcp -f ipv4 -a 127.0.0.1 -s {port} --secure-channel",
                 f"nvmf_subsystem_add_host {SUBNQN} {HOSTNQN} --psk {key_file(tmp_path, KEY, 'psk.txt')}"]
        done = subprocess.run(["python3", f"{spdk_root}/scripts/rpc.py", "-s", str(sock), "-t", "30"],
                              input="\n".join(calls) + "\n", capture_output=True, text=True, timeout=WAIT_S)
        assert done.returncode == 0, done.stderr[-2000:] + log.read_text()[-2000:]
        yield port, log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pid = (tmp_path / "tgt.pid").read_text().strip() if (tmp_path / "tgt.pid").exists() else ""
        subprocess.run(["rm", "-rf", f"/var/run/dpdk/spdk_pid{pid}"] if pid else ["true"], check=False)


def our_perf(port: int, key: str, *extra: str) -> subprocess.CompletedProcess:
    argv = [str(BIN / "nvmf-perf"), "run", "-a", "127.0.0.1", "-s", str(port), "-n", SUBNQN, "-q", HOSTNQN,
            "--tls", "--tls-key", key, "--tls-key-identity", "0", "--cpus_allowed", str(cores()[1]), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S)


def test_our_host_writes_and_verifies_over_tls_on_spdk(spdk_tls_target, our_bins):
    port, log = spdk_tls_target
    for bs in ("4k", "128k"):
        done = our_perf(port, KEY, "--rw", "randwrite", "--bs", bs, "--iodepth", "4", "--size", "4m",
                        "--runtime", "3", "--verify")
        assert done.returncode == 0, f"{bs}: {done.stdout[-1500:]}{done.stderr[-1500:]}{log.read_text()[-1500:]}"
        assert "WRITE: IOPS=" in done.stdout
    wrong = our_perf(port, WRONG_KEY, "--rw", "randread", "--runtime", "1")
    assert wrong.returncode != 0
    assert "authentication failed" in wrong.stderr, wrong.stderr


@pytest.fixture
def our_tls_target(our_bins, tmp_path):
    port = free_port()
    log = tmp_path / "nvmf-target.log"
    proc = subprocess.Popen([str(BIN / "nvmf-target"), "--listen", f"127.0.0.1:{port}", "--nqn", SUBNQN,
                             "--ns", "ram:64m", "--cores", str(cores()[0]), "--tls", "required",
                             "--tls-key", f"{HOSTNQN}={KEY}"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("ready ") and "tls=required" in ready, ready + log.read_text()
        yield port, log
    finally:
        proc.terminate()
        proc.wait(20)


def spdk_perf(root: str, port: int, tmp: Path, *tls: str) -> subprocess.CompletedProcess:
    trid = f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{SUBNQN} hostnqn:{HOSTNQN}"
    argv = [f"{root}/build/bin/spdk_nvme_perf", *memory_args(LocalHost(), 1024), "-c", hex(1 << cores()[1]),
            "-q", "8", "-o", "4096", "-w", "randrw", "-M", "50", "-t", "2", "-r", trid, *tls]
    script = '"$@" & pid=$!; wait $pid; rc=$?; rm -rf "/var/run/dpdk/spdk_pid$pid"; exit $rc'
    return subprocess.run(["sh", "-c", script, "sh", *argv], capture_output=True, text=True, timeout=WAIT_S, cwd=tmp)


def total_iops(stdout: str) -> float:
    [line] = [x for x in stdout.splitlines() if x.startswith("Total")] or ["Total : 0"]
    return float(line.split(":")[1].split()[0])


def test_spdk_perf_over_tls_on_our_target(spdk_root, our_tls_target, tmp_path):
    port, log = our_tls_target
    good = spdk_perf(spdk_root, port, tmp_path, "-S", "ssl", "--psk-path", str(key_file(tmp_path, KEY, "k")))
    assert good.returncode == 0 and total_iops(good.stdout) > 100, good.stdout[-2000:] + good.stderr[-2000:]
    connected = log.read_text()
    assert "qid=1" in connected and HOSTNQN in connected
    wrong = spdk_perf(spdk_root, port, tmp_path, "-S", "ssl", "--psk-path", str(key_file(tmp_path, WRONG_KEY, "w")))
    assert wrong.returncode != 0 or total_iops(wrong.stdout) == 0
    plain = spdk_perf(spdk_root, port, tmp_path)
    assert plain.returncode != 0 or total_iops(plain.stdout) == 0
    # Both refusals were the TLS layer's, named as such in the target's log (with the host), and
    # the target served on: the good key still works.
    refusals = log.read_text()
    assert f'wrong key for PSK identity \'NVMe0R01 {HOSTNQN} {SUBNQN}\'' in refusals, refusals[-2000:]
    assert "plain NVMe/TCP (no TLS handshake) on a port that requires TLS" in refusals, refusals[-2000:]
    again = spdk_perf(spdk_root, port, tmp_path, "-S", "ssl", "--psk-path", str(key_file(tmp_path, KEY, "k2")))
    assert again.returncode == 0 and total_iops(again.stdout) > 100, again.stdout[-2000:]
