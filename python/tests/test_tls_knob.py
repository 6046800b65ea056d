"""The `tls` knob (issue 20 item 3): per-run keys in NVMe's interchange format, our target's config
and nvmf-perf's options for `tls = "on"` (the kernel's and SPDK's: test_tls_stacks.py), and a real sweep
over it."""

from __future__ import annotations

import base64
import json
import os
import tomllib
import zlib
from pathlib import Path

import pytest
from conftest import nvmflab
from pydantic import ValidationError

from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.spec import StackChoice
from nvmflab.stacks import get_stack
from nvmflab.stacks.base import StackError
from nvmflab.stacks.ours import TLS_HOSTNQN, render_config
from nvmflab.tlskey import interchange_key, random_key
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
KEY = interchange_key(bytes(range(1, 33)))


def _decode(key: str) -> bytes:
    head, hash_id, body, tail = key.split(":")
    assert (head, hash_id, tail) == ("NVMeTLSkey-1", "01", "")
    raw = base64.b64decode(body, validate=True)
    secret, crc = raw[:-4], raw[-4:]
    assert int.from_bytes(crc, "little") == zlib.crc32(secret)
    return secret


def test_keys_are_interchange_format_with_their_crc_and_random_per_call():
    assert _decode(KEY) == bytes(range(1, 33))
    first, second = random_key(), random_key()
    assert len(_decode(first)) == 32 and first != second
    assert StackChoice(tls_key=first).tls_key == first
    body = base64.b64decode(first.split(":")[2])
    flipped = base64.b64encode(bytes([body[0] ^ 1]) + body[1:]).decode()
    for bad, words in [("NVMeTLSkey-1:01:short:", "does not decode"), ("DHHC-1:01:" + first.split(":")[2] + ":",
                        "expected NVMeTLSkey-1"), (first[:-1], "expected"), (f"NVMeTLSkey-1:01:{flipped}:", "CRC-32"),
                       ("NVMeTLSkey-1:02:" + first.split(":")[2] + ":", "48-byte secret")]:
        with pytest.raises(ValidationError, match=words):
            StackChoice(tls_key=bad)


def _setup(tls: str, key: str | None, hosts: tuple[str, ...] = ()) -> TargetSetup:
    sub = Subsystem("nqn.2024-01.io.nvmflab:main", "ram", 16 << 20)
    return TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                       busy_poll_us=0, subsystems=(sub,), allowed_hosts=hosts, tls=tls, tls_key=key)


def test_our_config_requires_tls_and_gives_the_key_to_the_host():
    config = tomllib.loads(render_config(_setup("on", KEY), 4420, 9100))
    assert config["port"][0]["tls"] == "required"
    assert config["host"] == [{"nqn": TLS_HOSTNQN, "tls_key": KEY}]
    named = tomllib.loads(render_config(_setup("on", KEY, ("nqn.2014-08.org.x:h1",)), 4420, 9100))
    assert named["host"] == [{"nqn": "nqn.2014-08.org.x:h1", "tls_key": KEY}]
    plain = tomllib.loads(render_config(_setup("off", None), 4420, 9100))
    assert "tls" not in plain["port"][0] and "host" not in plain
    with pytest.raises(StackError, match="no TLS key"):
        render_config(_setup("on", None), 4420, 9100)


def _job(tls: str, hostnqn: str | None = None) -> PerfJob:
    knobs = {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "rwmixread": 50, "rate_iops": 0,
             "completion": "event", "so_priority": 0, "tos": 0, "busy_poll_us": 0, "hdr_digest": False,
             "data_digest": False, "io_queues": None, "tls": tls}
    return PerfJob("main", knobs, (1,), nqn="nqn.2024-01.io.nvmflab:main", hostnqn=hostnqn)


def test_nvmf_perf_connects_with_the_targets_key_and_a_host_nqn_it_knows():
    ours = get_stack("ours")
    argv = ours._argv_head(_job("on"), "127.0.0.1", 4420, "nvmf-perf", KEY)
    at = argv.index("--tls")
    assert argv[at:at + 5] == ["--tls", "--tls-key", KEY, "--hostnqn", TLS_HOSTNQN]
    named = ours._argv_head(_job("on", "nqn.2014-08.org.x:h1"), "127.0.0.1", 4420, "nvmf-perf", KEY)
    assert named[named.index("--hostnqn") + 1] == "nqn.2014-08.org.x:h1"
    assert "--tls" not in ours._argv_head(_job("off"), "127.0.0.1", 4420, "nvmf-perf", None)
    with pytest.raises(StackError, match="no TLS key"):
        ours._argv_head(_job("on"), "127.0.0.1", 4420, "nvmf-perf", None)


@pytest.mark.parametrize("name", ["kernel", "spdk"])
@pytest.mark.parametrize("side", ["target", "host"])
def test_the_kernel_and_spdk_stacks_take_the_knob_too(name, side):
    get_stack(name).check_knobs({"tls": "on"}, side, {"tls": "off"})  # their hosts are checked at run time


SPEC = """
repeats = 1
ramp_time = 0
runtime = 1
[topology]
target_cores = [0]
host_cores = [1]
[backend]
kind = "ram"
size = "16MiB"
[workload]
rw = "randread"
[sweep]
tls = ["off", "on"]
"""


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="nvmf-target/nvmf-perf not built")
def test_a_sweep_over_tls_runs_both_points_and_the_on_point_uses_tls(tmp_path):
    spec = tmp_path / "tls.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    ports = {}
    for raw in (tmp_path / "r" / "raw").glob("*.json"):
        record = json.loads(raw.read_text())
        assert record["perf"], raw
        ports[record["knobs"]["tls"]] = record["target_stats_after"]["ports"][0]
    assert set(ports) == {"off", "on"}
    assert ports["on"]["tls"] == "required" and ports["on"]["tls_connections"] > 0
    assert ports["on"]["tls_handshake_failures"] == 0 and ports["on"]["plain_connections"] == 0
    assert ports["off"]["tls"] == "none" and ports["off"]["tls_connections"] == 0
    ready = {p.read_text().split("\n", 1)[0] for p in (tmp_path / "r" / "work").glob("target-*.out")}
    # kTLS where the kernel has its tls module (loaded by the target's probe when it may), else
    # userspace records: the ready line says which.
    records = "ktls" if Path("/sys/module/tls").exists() else "userspace"
    assert any(line.endswith(f"tls=required:{records}") for line in ready), ready


def test_a_run_uses_the_specs_key_else_one_random_key_throughout():
    from nvmflab.spec import Spec
    from nvmflab.studies.common import Context

    given = Context(Spec(stack={"tls_key": KEY}), "sweep", None, None)
    assert given.tls_key() == KEY
    made = Context(Spec(), "sweep", None, None)
    assert made.tls_key() == made.tls_key() != KEY and len(_decode(made.tls_key())) == 32
