"""fio with our external ioengine (crates/nvmf-fio, target/release/libnvmf_fio.so), for real:

- against our nvmf-target (RAM namespace on 127.0.0.1): write then `--verify=crc32c` read-back at
  4 KiB, 128 KiB and 1 MiB; threads and forked processes, poll and event completion, digests;
- against SPDK's nvmf_tgt (malloc bdev) the same, when the SPDK build is there;
- a null namespace (drops writes) must fail the verify: the check is real;
- a wrong traddr / subnqn / filename fails fast with one clear `nvmf` line, no hang.

fio's JSON output is parsed. Every fio run has a time limit; every target is stopped in a finally.
Skipped with the reason when fio is not installed or the engine was built without fio headers
(`make fio-engine` explains)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("NVMFLAB_BIN_DIR", REPO / "target" / "release"))
ENGINE = Path(os.environ.get("NVMFLAB_FIO_ENGINE", BIN / "libnvmf_fio.so"))
NQN = "nqn.2024-01.io.nvmflab:fio-test"
FIO_TIMEOUT_S = 90  # any one fio run, start to finish
SIZES = {"4k": "16m", "128k": "32m", "1m": "64m"}  # bs -> bytes written then verified


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine() -> Path:
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (Debian: apt-get install fio)")
    if not ENGINE.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "nvmf-fio"], cwd=REPO, check=True, timeout=1800)
    # --enghelp loads the engine the way a job does and lists its options.
    done = subprocess.run(["fio", f"--enghelp={ENGINE}"], capture_output=True, text=True, timeout=30)
    if "traddr" not in done.stdout:
        reason = (done.stderr + done.stdout).strip().splitlines()
        pytest.skip(f"{ENGINE} has no fio support: {reason[0] if reason else 'no output'}")
    return ENGINE


class OurTarget:
    """nvmf-target with one namespace on 127.0.0.1, in its own session so stop() takes it all."""

    def __init__(self, backend: str = "ram:128MiB", extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.address = "127.0.0.1"
        cmd = [str(BIN / "nvmf-target"), "--listen", f"127.0.0.1:{self.port}", "--nqn", NQN, "--ns", backend, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.ready = self.proc.stdout.readline()  # the target prints `ready ...` or exits
        if not self.ready.startswith("ready"):
            self.stop()
            raise RuntimeError(f"nvmf-target did not start: {self.ready!r} {self.proc.stderr.read()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def our_target(engine):
    if not (BIN / "nvmf-target").exists():
        subprocess.run(["cargo", "build", "--release", "--workspace", "--bins"], cwd=REPO, check=True, timeout=1800)
    target = OurTarget()
    try:
        yield target
    finally:
        target.stop()


def parse_json(stdout: str) -> dict:
    """fio's JSON document; fio may print warnings on stdout before it."""
    start = stdout.find("\n{") + 1 if not stdout.startswith("{") else 0
    return json.loads(stdout[start:])


def run_fio(engine: Path, address: str, port: int, *args: str, job_file: Path | None = None,
            timeout: float = FIO_TIMEOUT_S) -> tuple[subprocess.CompletedProcess, float]:
    # fio saves verify state files into its cwd when a job fails: neither in the repo nor at all.
    argv = ["fio", "--output-format=json", "--verify_state_save=0"]
    if job_file is not None:
        argv.append(str(job_file))
    else:
        argv += ["--name=nvmf", f"--ioengine=external:{engine}", f"--traddr={address}", f"--trsvcid={port}",
                 f"--subnqn={NQN}", "--filename=ns1", *args]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nvmf-fio-") as cwd:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return done, time.monotonic() - start


def verify_job(bs: str, *extra: str) -> list[str]:
    rw = "randwrite" if bs == "4k" else "write"
    return [f"--rw={rw}", f"--bs={bs}", f"--size={SIZES[bs]}", "--iodepth=8", "--verify=crc32c",
            "--do_verify=1", "--verify_fatal=1", *extra]


def check_verified(done: subprocess.CompletedProcess, expect_jobs: int = 1) -> list[dict]:
    assert done.returncode == 0, f"fio exited {done.returncode}: {done.stderr[-3000:]}{done.stdout[-2000:]}"
    doc = parse_json(done.stdout)
    jobs = doc["jobs"]
    assert len(jobs) == expect_jobs
    for job in jobs:
        assert job["error"] == 0, job
        write, read = job["write"], job["read"]
        assert write["iops"] > 0 and write["total_ios"] > 0
        # The verify phase read back every byte written (a mismatch would have set error EILSEQ).
        assert read["io_bytes"] == write["io_bytes"] > 0
        assert read["iops"] > 0
    return jobs


@pytest.mark.parametrize("bs", ["4k", "128k", "1m"])
def test_write_then_verify_on_our_target(engine, our_target, bs):
    done, _ = run_fio(engine, our_target.address, our_target.port, *verify_job(bs, "--thread=1"))
    check_verified(done)


def test_processes_poll_mode_and_digests(engine, our_target):
    """numjobs=2 as forked processes (fio's default), each with its own connection, on disjoint
    halves, spinning for completions, with header and data digests."""
    done, _ = run_fio(engine, our_target.address, our_target.port,
                      *verify_job("128k", "--numjobs=2", "--offset_increment=32m", "--completion=poll",
                                  "--hdr_digest=1", "--data_digest=1"))
    check_verified(done, expect_jobs=2)


def test_timed_random_read_reports_latency(engine, our_target):
    done, elapsed = run_fio(engine, our_target.address, our_target.port, "--rw=randread", "--bs=4k",
                            "--iodepth=16", "--time_based", "--runtime=2", "--thread=1", "--numjobs=2",
                            "--group_reporting")
    assert done.returncode == 0, done.stderr[-3000:]
    [job] = parse_json(done.stdout)["jobs"]
    assert job["error"] == 0 and job["read"]["iops"] > 100
    assert job["read"]["clat_ns"]["percentile"]["99.000000"] > 0
    assert elapsed < 30


def test_null_namespace_fails_verify(engine):
    """A null namespace drops writes: fio's verify must report it, so the passes above mean something."""
    target = OurTarget("null:64MiB")
    try:
        done, _ = run_fio(engine, target.address, target.port, *verify_job("4k", "--thread=1"))
    finally:
        target.stop()
    assert done.returncode != 0
    assert "verify" in (done.stderr + done.stdout).lower()


@pytest.mark.parametrize("case", ["closed-port", "unknown-host", "wrong-subnqn", "no-namespace"])
def test_bad_job_file_fails_fast_and_clearly(engine, our_target, tmp_path, case):
    traddr, port, subnqn, filename = "127.0.0.1", our_target.port, NQN, "ns1"
    expect = {"closed-port": "Connection refused", "unknown-host": "no.such.host.invalid",
              "wrong-subnqn": "nqn.2024-01.io.nvmflab:nope", "no-namespace": "namespace 7"}[case]
    if case == "closed-port":
        port = free_port()
    elif case == "unknown-host":
        traddr = "no.such.host.invalid"
    elif case == "wrong-subnqn":
        subnqn = "nqn.2024-01.io.nvmflab:nope"
    else:
        filename = "ns7"
    job = tmp_path / "bad.fio"
    job.write_text(f"[global]\nioengine=external:{engine}\ntraddr={traddr}\ntrsvcid={port}\nsubnqn={subnqn}\n"
                   f"thread=1\n\n[bad]\nfilename={filename}\nrw=read\nbs=4k\nsize=1m\n")
    done, elapsed = run_fio(engine, "", 0, job_file=job, timeout=60)
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("nvmf")]
    assert lines and expect in lines[0], done.stderr
    assert elapsed < 20


# -- SPDK's nvmf_tgt ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spdk_target(engine, tmp_path_factory):
    try:
        from nvmflab.plan import Subsystem, TargetSetup
        from nvmflab.stacks import spdk
        from nvmflab.topology.local import LocalHost
    except ImportError as err:
        pytest.skip(f"the nvmflab harness is not importable ({err}); run through .venv/bin/pytest")
    host = LocalHost(workdir=tmp_path_factory.mktemp("spdk"))
    if spdk.spdk_dir(host) is None:
        pytest.skip(f"no SPDK build in {spdk.DEFAULT_DIR} (or NVMFLAB_SPDK_DIR): `make spdk` builds it")
    core = sorted(os.sched_getaffinity(0))[0]
    setup = TargetSetup(cores=(core,), mode="poll", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0,
                        tos=0, busy_poll_us=0, subsystems=(Subsystem(NQN, "ram", 128 << 20, block_size=512),))
    # SPDK's TCP transport takes 128 KiB per command by default (MDTS); 1 MiB I/Os need max_io_size.
    original = spdk.target_rpcs

    def rpcs(setup, port, *rest):  # rest: what newer harnesses pass on (the PSK path)
        calls = original(setup, port, *rest)
        return [c + ["-i", str(1 << 20)] if c[:1] == ["nvmf_create_transport"] else c for c in calls]

    spdk.target_rpcs = rpcs
    try:
        target = spdk.SpdkStack().start_target(setup, host, tmp_path_factory.mktemp("spdk-target"))
    finally:
        spdk.target_rpcs = original
    try:
        yield target
    finally:
        target.stop()


@pytest.mark.parametrize("bs", ["4k", "128k", "1m"])
def test_write_then_verify_on_spdk_target(engine, spdk_target, bs):
    done, _ = run_fio(engine, spdk_target.address, spdk_target.port,
                      *verify_job(bs, "--thread=1", "--hdr_digest=1", "--data_digest=1"))
    check_verified(done)
