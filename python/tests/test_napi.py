"""The data path's NAPI id (topology/napi.py): measured on a probe connection, never an exception,
and the busy-poll report says when busy polling was inert."""

import json
import os
import subprocess
import time

import pytest

from nvmflab.analysis import busy_poll
from nvmflab.env import collect
from nvmflab.store import ResultsStore
from nvmflab.topology import napi, netns
from nvmflab.topology.base import HostError, Hosts
from nvmflab.topology.local import LocalHost


def test_a_loopback_connection_has_no_napi_id():
    path = napi.probe(LocalHost(), LocalHost(), "127.0.0.1")
    # loopback has no NAPI: 0, unless this kernel lacks busy polling altogether (then it says so)
    assert path.napi_id == 0 or (path.napi_id is None and "unsupported" in path.why), path
    assert path.busy_poll and set(path.busy_poll) == {"local"}


def test_the_run_record_carries_the_data_path():
    env = collect(Hosts(LocalHost(), [LocalHost()]))
    assert env["data_path"]["address"] == "127.0.0.1" and "napi_id" in env["data_path"]
    assert "data_path" not in collect()  # `nvmflab env` alone has no run, so no data path


@pytest.mark.parametrize("text, expected", [
    ("napi_id 0\n", (0, "")), ("napi_id 8195", (8195, "")),
    ("unsupported 92", (None, "SO_INCOMING_NAPI_ID unsupported here (errno 92; a kernel without busy polling)")),
    ("napi_id -1", None), ("napi_id 99999999999", None), ("", None), ("x" * 10_000, None),
])
def test_probe_output_is_parsed_with_bounds(text, expected):
    found = napi.parse_probe(text)
    if expected is None:
        assert found[0] is None and found[1].startswith("the probe printed") and len(found[1]) < 120
    else:
        assert found == expected


class _Broken(LocalHost):
    def run(self, argv, timeout=60.0, check=True, **kw):
        raise HostError("broken: ssh connection refused")


def test_a_probe_that_cannot_run_is_a_reason_not_an_exception():
    started = time.monotonic()
    path = napi.probe(_Broken(), LocalHost(), "127.0.0.1", wait=1.0)
    assert path.napi_id is None and "broken" in path.why
    path = napi.probe(LocalHost(), LocalHost(), "192.0.2.1", wait=1.0)  # an address nothing here has
    assert path.napi_id is None and path.why.startswith("probe connection failed")
    assert time.monotonic() - started < 15


def _busy_poll_store(tmp_path, data_path):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("busy-poll", 'study = "busy-poll"', {"data_path": data_path} if data_path else {})
    for config, iops in (("off", 100_000), ("on", 120_000)):
        for repeat in range(2):
            knobs = {"config": config, "target_cpus": 1, "rw": "randread", "bs": 4096, "iodepth": 32, "numjobs": 3}
            store.save_point(run, f"{config}-{repeat}", "busy-poll", config, knobs, repeat, "ok", None,
                             [{"role": "main", "iops": iops + repeat, "lat_mean_ns": 1e9 / iops, "knobs": knobs}])
    return store


@pytest.mark.parametrize("napi_id, says", [
    (0, "Busy polling inert (no NAPI id): a connection on the data path (127.0.0.1) reports SO_INCOMING_NAPI_ID 0"),
    (8195, "reports NAPI id 8195: busy polling can poll its device queue (net.core.busy_poll 50 on local"),
    (None, "could not be measured: probe connection failed"),
])
def test_busy_poll_report_says_whether_busy_polling_could_poll(tmp_path, napi_id, says):
    path = {"address": "127.0.0.1", "napi_id": napi_id, "why": "probe connection failed" if napi_id is None else "",
            "busy_poll": {"local": 50}, "busy_read": {"local": 0}}
    store = _busy_poll_store(tmp_path, path)
    findings = busy_poll.analyze(store.measurements(), store.runs()).findings
    assert any(says in f for f in findings), findings
    assert json.loads(store.runs()["env_json"].iloc[0])["data_path"]["napi_id"] == napi_id


def test_an_older_run_without_a_data_path_says_it_was_not_measured(tmp_path):
    store = _busy_poll_store(tmp_path, None)
    findings = busy_poll.analyze(store.measurements(), store.runs()).findings
    assert any("NAPI id of the data path was not measured" in f for f in findings), findings


def _sysctl_dir(tmp_path, busy_poll="0", busy_read="7"):
    for name, value in (("busy_poll", busy_poll), ("busy_read", busy_read)):
        (tmp_path / name).write_text(value + "\n")
    return str(tmp_path), str(tmp_path / "state.json")


def test_sysctls_are_set_per_point_and_restored(tmp_path):
    root, state = _sysctl_dir(tmp_path)
    sysctls = napi.BusyPollSysctls(root, state)
    sysctls.set(50)
    assert (tmp_path / "busy_poll").read_text() == "50" and (tmp_path / "busy_read").read_text() == "50"
    sysctls.set(0)
    assert (tmp_path / "busy_read").read_text() == "0"
    sysctls.restore()
    assert (tmp_path / "busy_poll").read_text() == "0" and (tmp_path / "busy_read").read_text() == "7"
    assert not (tmp_path / "state.json").exists()


def test_runs_at_the_same_time_restore_the_values_found_before_the_first(tmp_path):
    root, state = _sysctl_dir(tmp_path)
    first, second = napi.BusyPollSysctls(root, state), napi.BusyPollSysctls(root, state)
    first.set(50)
    # a second run on the machine, here another process that is alive (pid 1)
    (tmp_path / "state.json").write_text(json.dumps({"original": {"busy_poll": "0", "busy_read": "7"},
                                                     "holders": [1, os.getpid()]}))
    second.set(30)
    first.restore()  # another holder is alive: the values stay for it
    assert (tmp_path / "busy_read").read_text() == "30"
    (tmp_path / "state.json").write_text(json.dumps({"original": {"busy_poll": "0", "busy_read": "7"},
                                                     "holders": [os.getpid()]}))
    second.restore()
    assert (tmp_path / "busy_poll").read_text() == "0" and (tmp_path / "busy_read").read_text() == "7"


def test_a_run_that_died_holding_the_sysctls_is_undone_by_the_next(tmp_path):
    root, state = _sysctl_dir(tmp_path, busy_poll="50", busy_read="50")  # left set by a killed run
    (tmp_path / "state.json").write_text(json.dumps({"original": {"busy_poll": "0", "busy_read": "7"},
                                                     "holders": [2 ** 22 + 12345]}))  # no such process
    sysctls = napi.BusyPollSysctls(root, state)
    sysctls.set(10)
    sysctls.restore()
    assert (tmp_path / "busy_poll").read_text() == "0" and (tmp_path / "busy_read").read_text() == "7"


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no network namespace here: {netns.unavailable()}")
def test_a_veth_with_napi_gives_its_connections_a_napi_id():
    with netns.EmulatedLink(0, None, napi=True) as link:
        inside = LocalHost(name="ns", data_ip=link.target_ip, netns=link.netns)
        path = napi.probe(inside, LocalHost(), link.target_ip)
        assert link.napi and "with NAPI" in link.emulation, link.napi_error
        assert path.napi_id and path.napi_id > 0, path  # measured here: 260-263
        plain = napi.probe(LocalHost(), LocalHost(), "127.0.0.1")
        assert plain.napi_id in (0, None)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert link.netns not in names  # the namespace is gone again


def test_busy_poll_report_uses_the_points_own_data_path(tmp_path):
    store = _busy_poll_store(tmp_path, {"address": "127.0.0.1", "napi_id": 0, "why": ""})
    run = store.start_run("busy-poll", 'study = "busy-poll"', {})
    knobs = {"config": "on", "target_cpus": 1, "rw": "randread", "bs": 4096, "iodepth": 32, "numjobs": 3,
             "link": "netns veth with NAPI", "napi_id": 263}
    store.save_point(run, "on-netns", "busy-poll", "on", knobs, 0, "ok", None,
                     [{"role": "main", "iops": 1000, "lat_mean_ns": 1e6, "knobs": knobs}])
    findings = busy_poll.analyze(store.measurements(), store.runs()).findings
    assert any("data path (netns veth with NAPI) reports NAPI id 263" in f and "each point's busy_poll_us" in f
               for f in findings), findings
