"""`study security` (issue 20 item 4): the `dhchap` knob on our stack, the modes and apps each pair
runs, the analysis's comparisons with their intervals, and a real tiny run on our binaries that
connects with TLS and DH-HMAC-CHAP (nvmf-perf --connects)."""

from __future__ import annotations

import base64
import json
import os
import tomllib
import zlib
from pathlib import Path

import pytest
from conftest import nvmflab
from tiny_specs import head

from nvmflab.analysis import security as analysis
from nvmflab.dhchapkey import dhchap_secret, random_secret
from nvmflab.plan import PerfJob, Subsystem, TargetSetup
from nvmflab.stacks import get_stack
from nvmflab.stacks.base import StackError
from nvmflab.stacks.ours import TLS_HOSTNQN, OurSession, render_config
from nvmflab.store import ResultsStore
from nvmflab.studies import security
from nvmflab.tlskey import interchange_key
from nvmflab.tools import find_tool

BINARIES = [find_tool(n) for n in ("nvmf-target", "nvmf-perf")]
SECRET = dhchap_secret(bytes(range(32)))
KEY = interchange_key(bytes(range(1, 33)))


def test_secrets_are_dhhc1_with_their_crc_and_random_per_call():
    body = base64.b64decode(SECRET.split(":")[2])
    assert SECRET.startswith("DHHC-1:00:") and body[:32] == bytes(range(32))
    assert int.from_bytes(body[32:], "little") == zlib.crc32(bytes(range(32)))
    assert random_secret() != random_secret()
    with pytest.raises(ValueError, match="32, 48 or 64"):
        dhchap_secret(b"short")


def _setup(dhchap: str, secret: str | None, tls: str = "off") -> TargetSetup:
    sub = Subsystem("nqn.2024-01.io.nvmflab:main", "ram", 16 << 20)
    return TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                       busy_poll_us=0, subsystems=(sub,), tls=tls, tls_key=KEY if tls == "on" else None,
                       dhchap=dhchap, dhchap_key=secret)


def test_our_target_gives_the_host_its_secret_and_group_beside_its_tls_key():
    config = tomllib.loads(render_config(_setup("ffdhe3072", SECRET), 4420, 9100))
    assert config["host"] == [{"nqn": TLS_HOSTNQN, "dhchap_key": SECRET, "dhchap_hash": "sha256",
                               "dhchap_dhgroup": "ffdhe3072"}]
    both = tomllib.loads(render_config(_setup("null", SECRET, tls="on"), 4420, 9100))
    assert both["host"] == [{"nqn": TLS_HOSTNQN, "tls_key": KEY, "dhchap_key": SECRET, "dhchap_hash": "sha256",
                             "dhchap_dhgroup": "null"}]
    assert "host" not in tomllib.loads(render_config(_setup("off", None), 4420, 9100))
    with pytest.raises(StackError, match="no DH-HMAC-CHAP secret"):
        render_config(_setup("ffdhe2048", None), 4420, 9100)


def _job(**knobs) -> PerfJob:
    base = {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "rwmixread": 50, "rate_iops": 0,
            "completion": "event", "so_priority": 0, "tos": 0, "busy_poll_us": 0, "hdr_digest": False,
            "data_digest": False, "io_queues": None, "tls": "off", "dhchap": "off"}
    return PerfJob("main", base | knobs, (1,), nqn="nqn.2024-01.io.nvmflab:main")


def test_nvmf_perf_authenticates_with_the_targets_secret_and_measures_connects_when_asked():
    ours = get_stack("ours")
    argv = ours._argv_head(_job(dhchap="ffdhe2048"), "127.0.0.1", 4420, "nvmf-perf", None, SECRET)
    assert argv[argv.index("--dhchap-secret") + 1] == SECRET
    assert argv[argv.index("--hostnqn") + 1] == TLS_HOSTNQN
    both = ours._argv_head(_job(dhchap="null", tls="on"), "127.0.0.1", 4420, "nvmf-perf", KEY, SECRET)
    assert "--dhchap-secret" in both and "--tls" in both and both.count("--hostnqn") == 1
    assert "--dhchap-secret" not in ours._argv_head(_job(), "127.0.0.1", 4420, "nvmf-perf", None, None)
    with pytest.raises(StackError, match="no DH-HMAC-CHAP secret"):
        ours._argv_head(_job(dhchap="ffdhe2048"), "127.0.0.1", 4420, "nvmf-perf", None, None)
    job = _job(connects=True)
    assert "--connects" in OurSession(["nvmf-perf", "run"], job).perf_argv(1, 0, "out.json")
    assert "--connects" not in OurSession(["nvmf-perf", "run"], _job()).perf_argv(1, 0, "out.json")


@pytest.mark.parametrize("name", ["spdk"])  # the kernel stack has it (test_kernel_dhchap.py)
def test_stacks_without_dhchap_in_the_harness_refuse_it(name):
    for side in ("target", "host"):
        with pytest.raises(StackError, match=f"knob dhchap = 'ffdhe2048': the {name} {side}"):
            get_stack(name).check_knobs({"dhchap": "ffdhe2048"}, side, {"dhchap": "off"})


def test_each_round_measures_every_app_in_every_mode_and_connects_per_dh_group():
    params = security.Params(iodepth=[32, 128], dhgroups=["null", "ffdhe8192"])
    settings = security.point_settings(params)
    data = [s for s in settings if s["app"] != "connect"]
    assert len(data) == 4 * 4  # L-app, T-app x2, B-app, each in four modes
    assert {security.mode_of(s) for s in data} == set(security.MODES)
    connects = [(s["tls"], s["dhchap"]) for s in settings if s["app"] == "connect"]
    assert connects == [("off", "off"), ("on", "off"), ("off", "null"), ("off", "ffdhe8192"), ("on", "ffdhe2048")]


def test_wrong_key_adds_one_dhchap_lapp_point_per_pair_that_must_be_refused():
    plain = security.point_settings(security.Params(iodepth=[32]))
    settings = security.point_settings(security.Params(iodepth=[32], wrong_key=True, data_dhgroup="null"))
    wrong = [s for s in settings if s.get("wrong_key")]
    assert len(settings) == len(plain) + 1 and not any(s.get("wrong_key") for s in plain)
    assert wrong == [{"app": "L-app", "rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "tls": "off",
                      "dhchap": "null", "wrong_key": True}]


def _store(tmp_path, values):
    """A security run: per (app, iodepth, bs, tls, dhchap) the IOPS of each repeat, latency 1/IOPS."""
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("security", 'study = "security"\n', {})
    for (app, qd, bs, tls, dhchap), per_repeat in values.items():
        for repeat, iops in enumerate(per_repeat):
            knobs = {"app": app, "rw": "randread", "bs": bs, "iodepth": qd, "numjobs": 1, "tls": tls,
                     "dhchap": dhchap, "target_stack": "ours", "host_stack": "ours"}
            store.save_point(run, f"{app}-{qd}-{tls}-{dhchap}-{repeat}", "security", "ours/ours", knobs, repeat,
                             "ok", None, [{"role": "main", "iops": iops, "bw_bytes": iops * bs, "total_ios": iops,
                                           "lat_mean_ns": 1e9 / iops, "lat_p99_ns": 2e9 / iops, "knobs": knobs}])
    store.save_point(run, "kernel-skipped", "security", "kernel/ours",
                     {"app": "L-app", "bs": 4096, "iodepth": 1, "tls": "on", "dhchap": "off"}, 0, "skipped",
                     "knob tls = 'on': the kernel target has no such setting", [])
    return store


def test_analysis_compares_each_mode_with_plain_with_intervals(tmp_path):
    store = _store(tmp_path, {
        ("T-app", 32, 4096, "off", "off"): [100_000, 101_000, 99_000],
        ("T-app", 32, 4096, "on", "off"): [60_000, 61_000, 59_000],  # TLS: 40 % fewer IOPS
        ("T-app", 32, 4096, "off", "ffdhe2048"): [100_500, 99_500, 100_000],  # auth: only at connect
        ("connect", 32, 4096, "off", "off"): [2_000, 2_050, 1_950],  # 0.5 ms per connect
        ("connect", 32, 4096, "off", "ffdhe2048"): [50, 51, 49],  # 20 ms
        ("connect", 32, 4096, "on", "off"): [1_000, 1_010, 990],
    })
    result = analysis.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    tls = next(f for f in result.findings if "T-app QD32: tls vs plain" in f)
    assert "IOPS -40.0 %" in tls and "95 % interval of the difference" in tls
    auth = next(f for f in result.findings if "T-app QD32: dhchap vs plain" in f)
    assert "no clear difference" in auth
    group = next(f for f in result.findings if "DH-HMAC-CHAP ffdhe2048 takes" in f)
    assert "20.005 ms" in group and "39.99× a plain connect" in group and "95 % interval" in group
    assert "kernel target × ours host: some points skipped (knob tls = 'on'" in text
    titles = [t.title for t in result.tables]
    assert "ours target × ours host: security modes side by side" in titles
    assert "ours target × ours host: connect time" in titles
    assert {f.name for f in result.figures} == {"security_ours_ours_ratio", "security_ours_ours_connect"}


SPEC = 'study = "security"\n' + head() + """[params]
targets = ["ours"]
hosts = ["ours"]
iodepth = [4]
bapp_iodepth = 4
dhgroups = ["ffdhe2048"]
polling = "spec"
"""


@pytest.mark.skipif(any(b is None or "fakebin" in str(b) for b in BINARIES), reason="nvmf-target/nvmf-perf not built")
def test_a_tiny_run_connects_with_tls_and_dhchap_and_reports_their_cost(tmp_path):
    spec = tmp_path / "security.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, NVMFLAB_BIN_DIR=str(Path(BINARIES[0]).parent))
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    main = frame[frame["role"] == "main"]
    assert (main["status"] == "ok").all(), main[["leg", "status", "error"]].to_string()
    # 3 apps x 4 modes + 4 connect settings (intervals are checked on the synthetic store above)
    assert len(main) == 16 and (main["total_ios"] > 0).all()
    for raw in (tmp_path / "r" / "raw").glob("*.json"):
        record = json.loads(raw.read_text())
        knobs, argv = record["knobs"], " ".join(map(str, record["argv"]["main"]))
        port = record["target_stats_after"]["ports"][0]
        if knobs["tls"] == "on":
            assert port["tls"] == "required" and port["tls_connections"] > 0, raw
        assert ("--connects" in argv) == (knobs.get("app") == "connect"), argv
        assert ("--dhchap-secret" in argv) == (knobs["dhchap"] != "off"), argv
    data = analysis.prepared(main)
    connect = data[data["app"] == "connect"]
    plain = connect[connect["mode"] == "plain"]["lat_mean_ns"].mean()
    dh = connect[connect["mode"] == "dhchap"]["lat_mean_ns"].mean()
    assert dh > plain, (dh, plain)  # a 2048-bit DH exchange on both sides costs more than none
    html = Path(done.stdout.strip().splitlines()[-1]).read_text()
    assert "connect time" in html and "tls vs plain" in html
