"""Interoperability with the Linux kernel's NVMe/TCP host and target, booted under qemu.

One guest boot serves every scenario (boot costs seconds under emulation):
1. control: the kernel host against the kernel target, inside the guest;
2. our host (`nvmf-perf`) against the kernel target (nvmet, brd namespace);
3. the kernel host (nvme-cli, fio) against our `nvmf-target`.
The bed runs them in that order and records every output; the tests below judge them.
Timings from the emulated guest mean nothing and are never asserted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import initramfs
from vm import GUEST_IP, HOST_IP, BedError, Section, TestBed

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("NVMFLAB_BIN_DIR", REPO / "target/release"))
PORT = 4420
PORT2 = 4421  # our second target, which takes no in-capsule data
OUR_NQN = "nqn.2024-01.io.nvmflab:interop"
OUR_NQN2 = "nqn.2024-01.io.nvmflab:interop-no-incapsule"
KERNEL_NQN = "nqn.2024-01.io.nvmflab:kernel-target"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6c61-4200-8000-000000000001"
BAD_HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6c61-4200-8000-0000000000bd"
SERIAL = "NVMFLABINTEROP01"
MODEL = "nvmflab interop target"
NS_BYTES = 64 << 20
KERNEL_NS_BYTES = 64 << 20  # brd rd_size=65536 KiB

TARGET_CONFIG = f"""
[target]
stats = "127.0.0.1:0"

[[port]]
addr = "{HOST_IP}:{PORT}"

[[subsystem]]
nqn = "{OUR_NQN}"
serial = "{SERIAL}"
model = "{MODEL}"
allow_any_host = false
hosts = ["{HOSTNQN}"]
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = {NS_BYTES}
  block_size = 512
"""

TARGET_CONFIG_NO_INCAPSULE = f"""
[target]
in_capsule_data_size = 0

[[port]]
addr = "{HOST_IP}:{PORT2}"

[[subsystem]]
nqn = "{OUR_NQN2}"
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "16MiB"
"""

# Our host against the kernel target: name -> nvmf-perf run arguments after the address.
# (nvmet's inline_data_size=0 is not among them: the 6.1 kernel host cannot connect to it either,
# since hosts send Fabrics commands' data in the capsule whatever IOCCSZ says.)
def _verify_run(bs: str, *extra: str) -> list[str]:
    args = ["run", "-n", KERNEL_NQN, "--rw", "write", "--bs", bs, "--size", "4MiB", "--iodepth", "4", "--verify"]
    return args + ["--runtime", "30", "--output-format", "json", *extra]


VERIFY_RUNS = {
    "verify-4k": _verify_run("4k"),
    "verify-4k-digests": _verify_run("4k", "--hdr_digest", "--data_digest"),
    "verify-128k": _verify_run("128k"),
    "verify-128k-digests": _verify_run("128k", "--hdr_digest", "--data_digest"),
    # Two I/O queues, completions polled.
    "verify-4k-2jobs-poll": _verify_run("4k", "--numjobs", "2", "--completion", "poll"),
}

@dataclass
class Results:
    sections: dict[str, Section]
    our_host: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    target_log: str = ""
    target_stats: dict = field(default_factory=dict)
    console: str = ""
    log_dir: Path = Path(".")

    def section(self, name: str) -> Section:
        if name not in self.sections:
            pytest.fail(f"the guest never ran section {name!r}; console tail:\n{self.console}")
        return self.sections[name]

    def ok(self, name: str) -> str:
        s = self.section(name)
        assert s.rc == 0, f"guest section {name} exited {s.rc}:\n{s.output}"
        return s.output


def _json(text: str) -> dict:
    """The JSON document in a section's output (tools may print a line before it)."""
    start = text.find("{")
    assert start >= 0, f"no JSON in:\n{text}"
    return json.loads(text[start:])


def _perf(bed: TestBed, args: list[str], port: int) -> subprocess.CompletedProcess:
    argv = [str(BIN_DIR / "nvmf-perf"), args[0], "-t", "tcp", "-a", GUEST_IP, "-s", str(port), "-q", HOSTNQN, *args[1:]]
    return bed.run_in_ns(argv, timeout=180)


def _start_target(bed: TestBed, name: str, config: str) -> str:
    """Starts nvmf-target with `config`, logging to NAME.log; returns its ready line."""
    cfg = bed.log_dir / f"{name}.toml"
    cfg.write_text(config)
    argv = [str(BIN_DIR / "nvmf-target"), "--config", str(cfg)]
    target = bed.spawn_in_ns(argv, f"{name}.log", stdout=subprocess.PIPE, env={**os.environ, "RUST_LOG": "info"})
    ready = target.stdout.readline().decode().strip()
    if not ready.startswith("ready "):
        raise BedError(f"nvmf-target did not start: {(bed.log_dir / f'{name}.log').read_text()}")
    return ready


def _stats(bed: TestBed, addr: str) -> dict:
    code = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    r = bed.run_in_ns([sys.executable, "-c", code, f"http://{addr}/stats"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Results:
    for name in ["nvmf-target", "nvmf-perf"]:
        if not (BIN_DIR / name).exists():
            pytest.fail(f"{BIN_DIR / name} missing: run `make build` first")
    try:
        boot = initramfs.build(REPO / ".cache/interop")
    except initramfs.BuildError as e:
        pytest.fail(f"cannot build the guest: {e}")
    log_dir = Path(os.environ.get("NVMFLAB_INTEROP_LOGS") or tmp_path_factory.mktemp("interop"))
    log_dir.mkdir(parents=True, exist_ok=True)
    bed = TestBed(boot, log_dir)
    try:
        bed.create_netns()
        stats_addr = re.search(r"stats=(\S+)", _start_target(bed, "target", TARGET_CONFIG)).group(1)
        _start_target(bed, "target-no-incapsule", TARGET_CONFIG_NO_INCAPSULE)
        bed.boot_guest({
            "port": str(PORT), "port2": str(PORT2), "our_nqn": OUR_NQN, "our_nqn2": OUR_NQN2,
            "kernel_nqn": KERNEL_NQN, "hostnqn": HOSTNQN, "bad_hostnqn": BAD_HOSTNQN,
        })  # fmt: skip
        bed.expect("@@READY", timeout=240)
        res = Results(bed.sections, log_dir=log_dir)
        res.our_host["discover"] = _perf(bed, ["discover", "--output-format", "json"], PORT)
        res.our_host["identify"] = _perf(bed, ["identify", "-n", KERNEL_NQN, "--output-format", "json"], PORT)
        for name, args in VERIFY_RUNS.items():
            res.our_host[name] = _perf(bed, args, PORT)
        bed.tell_guest("go")
        bed.expect("@@DONE", timeout=900)
        bed.wait_guest_exit(60)
        res.target_stats = _stats(bed, stats_addr)
    except BedError as e:
        pytest.fail(f"interop bed failed (logs in {log_dir}): {e}")
    finally:
        bed.close()
    res.target_log = (log_dir / "target.log").read_text()
    res.console = bed.console.tail(60)
    return res


# ---- 4. control: kernel host against kernel target ----

def test_control_kernel_host_against_kernel_target(results: Results):
    disc = _json(results.ok("control-discover"))
    assert any(r["subnqn"] == KERNEL_NQN for r in disc["records"]), disc
    results.ok("control-connect")
    fio = _json(results.ok("control-fio-4k"))
    assert fio["jobs"][0]["error"] == 0
    results.ok("control-disconnect")


# ---- 3. our host against the kernel target ----

def test_our_discover_lists_the_kernel_subsystem(results: Results):
    r = results.our_host["discover"]
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["records"]
    match = [e for e in entries if e["subnqn"] == KERNEL_NQN]
    assert match, r.stdout
    assert match[0]["traddr"] == GUEST_IP and str(match[0]["trsvcid"]) == str(PORT), match[0]


def test_our_identify_reads_the_kernel_controller_and_namespace(results: Results):
    r = results.our_host["identify"]
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["controller"]["subnqn"] == KERNEL_NQN, doc["controller"]
    ns = doc["namespaces"][0]
    assert ns["capacity_bytes"] == KERNEL_NS_BYTES, ns


@pytest.mark.parametrize("name", list(VERIFY_RUNS))
def test_our_verify_run_against_the_kernel_target(results: Results, name: str):
    r = results.our_host[name]
    assert r.returncode == 0, f"nvmf-perf {name} exited {r.returncode}:\n{r.stderr}"
    doc = json.loads(r.stdout)
    written = sum(job["write"]["io_bytes"] for job in doc["jobs"])
    assert written >= 4 << 20, doc["jobs"]
    bs = 4096 if name.startswith("verify-4k") else 128 << 10
    verified = sum(job["verified_ios"] for job in doc["nvmflab"]["jobs"])
    assert verified * bs >= 4 << 20, f"the verify phase read back {verified} blocks of {bs} B"


# ---- 2. kernel host against our target ----

def test_kernel_discover_lists_our_subsystem(results: Results):
    disc = _json(results.ok("discover"))
    ours = [r for r in disc["records"] if r["subnqn"] == OUR_NQN]
    assert len(ours) == 1, disc
    rec = ours[0]
    assert rec["trtype"] == "tcp" and rec["adrfam"] == "ipv4", rec
    assert rec["traddr"] == HOST_IP and str(rec["trsvcid"]) == str(PORT), rec
    assert rec["subtype"] == "nvme subsystem", rec
    assert rec["treq"] == "not specified, sq flow control disable supported", rec


def test_kernel_connect_and_identify_show_what_we_configured(results: Results):
    results.ok("connect-default")
    ctrl = _json(results.ok("id-ctrl"))
    assert ctrl["sn"].strip() == SERIAL
    assert ctrl["mn"].strip() == MODEL
    assert ctrl["subnqn"] == OUR_NQN
    ns = _json(results.ok("id-ns"))
    lbaf = ns["lbafs"][ns["flbas"] & 0xF]
    assert ns["nsze"] << lbaf["ds"] == NS_BYTES, ns


@pytest.mark.parametrize("section", [
    "fio-4k", "fio-128k", "fio-1m", "digests-fio-4k", "digests-fio-128k", "queues-1-fio-4k", "queues-2-fio-4k",
    "no-incapsule-fio-4k", "no-sqflow-fio-4k", "no-sqflow-fio-128k",
])  # fmt: skip
def test_kernel_fio_verify_on_our_namespace(results: Results, section: str):
    fio = _json(results.ok(section))
    job = fio["jobs"][0]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] > 0 and job["read"]["io_bytes"] > 0, "written and read back for verify"


def test_kernel_connect_with_digests(results: Results):
    results.ok("connect-digests")
    assert re.search(r"queue connected.*hdgst=true ddgst=true", results.target_log), "target saw digests negotiated"


@pytest.mark.parametrize("n", [1, 2])
def test_kernel_connect_with_io_queue_count(results: Results, n: int):
    results.ok(f"connect-queues-{n}")
    assert int(results.ok(f"queue-count-{n}").split()[-1]) == n + 1, "admin queue plus the I/O queues asked for"


def test_kernel_host_keeps_two_controllers_on_one_subsystem(results: Results):
    results.ok("connect-twice-1")
    results.ok("connect-twice-2")
    assert results.ok("controllers-twice").split()[-1] == "2"
    assert "disconnected 2 controller" in results.ok("disconnect-twice")


def test_kernel_host_connects_without_in_capsule_data(results: Results):
    """IOCCSZ 4: Connect's data still comes in the capsule (Fabrics commands may always carry
    8 KiB there), every write by R2T."""
    results.ok("connect-no-incapsule")
    assert "disconnected 1 controller" in results.ok("disconnect-no-incapsule")


def test_kernel_keep_alive_keeps_an_idle_controller(results: Results):
    """KATO 2 s and 5 s without I/O: only Keep Alive commands keep the controller."""
    results.ok("connect-keep-alive")
    assert results.ok("keep-alive-state").split()[-1] == "live"
    assert "keep-alive timeout" not in results.target_log, results.target_log


def test_kernel_connects_with_sq_flow_control_disabled(results: Results):
    results.ok("connect-no-sqflow")
    assert "disconnected 1 controller" in results.ok("disconnect-no-sqflow")


def test_kernel_disconnects_cleanly(results: Results):
    for name in ["disconnect-default", "disconnect-digests", "disconnect-queues-1", "disconnect-queues-2"]:
        out = results.ok(name)
        assert "disconnected 1 controller" in out, out
    for log in ["target.log", "target-no-incapsule.log"]:
        text = (results.log_dir / log).read_text()
        assert "WARN" not in text and "ERROR" not in text, f"{log}:\n{text}"


def test_kernel_host_not_on_the_allow_list_is_refused(results: Results):
    assert results.section("refused").rc != 0, results.section("refused").output
    assert re.search(rf"not allowed.*{re.escape(BAD_HOSTNQN)}|{re.escape(BAD_HOSTNQN)}.*not allowed", results.target_log, re.I), results.target_log


def test_our_target_counted_the_kernel_hosts_commands(results: Results):
    stats = results.target_stats
    namespaces = [n for r in stats["reactors"] for n in r["namespaces"] if n["subnqn"] == OUR_NQN]
    reads = sum(n["reads"] for n in namespaces)
    writes = sum(n["writes"] for n in namespaces)
    # fio-4k alone wrote and read back 4 MiB in 4 KiB commands.
    assert writes >= 1024 and reads >= 1024, (reads, writes, stats)
