"""The `transports` study (issue 21 item 5): a run with the fake binaries (TCP and TCP+TLS measured
in interleaved rounds, RDMA skipped with the reason on a machine without a device), its plan with a
shaped link, the analysis on synthetic stores (a software RDMA device named, Holm over the cells,
the cores to saturate), and the veth's rate and MTU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.analysis import transports
from nvmflab.store import ResultsStore
from nvmflab.topology import netns, rdma

TINY = """name = "t"
study = "transports"
repeats = 2
ramp_time = 0
runtime = 0.2
[topology]
kind = "local"
target_cores = [0]
host_cores = [1]
[backend]
kind = "null"
size = "64MiB"
[params]
stacks = ["ours"]
configs = ["tcp", "tls", "rdma"]
iodepth = [32]
bs = ["4k"]
cores = []
rates = []
"""


def test_a_run_measures_tcp_and_tls_side_by_side_and_skips_rdma_with_the_reason(tmp_path, fake_env):
    spec = tmp_path / "t.toml"
    spec.write_text(TINY)
    env = fake_env | {"FAKE_PERF_JITTER": "0.05"}
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=env)
    assert done.returncode == 0, done.stderr
    store = ResultsStore(tmp_path / "r")
    rows = store.measurements()
    rows = rows[rows["study"] == "transports"]
    status = {leg: set(g["status"]) for leg, g in rows.groupby("leg")}
    assert status["ours/tcp"] == {"ok"} and status["ours/tls"] == {"ok"}
    if not rdma.usable(rdma.probe(__import__("nvmflab.topology.local", fromlist=["LocalHost"]).LocalHost())[0]):
        assert status["ours/rdma"] == {"skipped"}
        assert "has no RDMA device" in rows[rows["leg"] == "ours/rdma"]["error"].iloc[0]
    else:  # a machine with RDMA: the fake binaries do not link librdmacm
        assert "built without RDMA" in rows[rows["leg"] == "ours/rdma"]["error"].iloc[0]
    # interleaved: round 0 of every configuration ran before round 1 of any
    ran = rows[rows["status"] == "ok"].sort_values("point_id")
    repeats = list(ran.drop_duplicates("point_id")["repeat"])
    assert repeats == sorted(repeats)
    # the TLS points reached nvmf-perf with --tls, the TCP points without
    log = (tmp_path / "perf.log").read_text().splitlines()
    assert any("--tls" in line for line in log) and any("--tls" not in line for line in log)
    assert all(" -t tcp " in f" {line} " for line in log)
    result = transports.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert "the study fell back to TCP against TCP+TLS" in text or "RDMA device:" in text
    # every comparison states its interval or why there is none (the fake perf's figures carry a
    # small jitter, so most have one; CPU per I/O is measured and may repeat exactly)
    assert "TCP+TLS vs TCP: L-app latency mean" in text and "TCP+TLS vs TCP: T-app IOPS QD32" in text
    assert all("95 % interval of the difference" in f or "no interval" in f or "cannot decide" in f
               for f in result.findings if "TCP+TLS vs TCP" in f)
    assert "T-app IOPS QD32" in text and "CPU per I/O at QD32" in text
    titles = [t.title for t in result.tables]
    assert any(t.startswith("Per stack and transport") for t in titles)
    assert not any("Cores to saturate" in t for t in titles)  # cores = []: no cores leg
    assert {f.name.split("_data")[0] for f in result.figures} >= {"transports_lapp_cdf", "transports_tapp_iops",
                                                                    "transports_bapp_bandwidth",
                                                                    "transports_cpu_per_io"}


def test_a_shaped_link_plan(tmp_path, fake_env):
    spec = tmp_path / "t.toml"
    spec.write_text(TINY.replace("rates = []", 'rates = ["10gbit"]\nmtus = [1500, 9000]'))
    done = nvmflab("run", str(spec), "--plan", env=fake_env)
    assert done.returncode == 0, done.stderr
    assert "link=netns 10gbit mtu 9000" in done.stdout and "link=netns 10gbit mtu 1500" in done.stdout
    assert "no RDMA device on the namespace's veth" in done.stdout
    assert "nvmf-perf" in done.stdout and "--tls" in done.stdout


def test_all_leaves_the_transports_study_out():
    """Its quick variant alone takes about two minutes here: `make run` (study all --quick) skips it."""
    from nvmflab import cli, names

    assert "transports" in names.STUDY_NAMES and "transports" not in names.IN_ALL
    assert "list(IN_ALL) if name is StudyName.all" in Path(cli.__file__).read_text()


# -- the analysis on synthetic stores ----------------------------------------------------------

HIST = json.dumps([[100_000, 90], [200_000, 9], [400_000, 1]])


def _row(iops, lat, bs=4096, host_cpu=2.0):
    return {"role": "main", "engine": "tcp", "iops": iops, "bw_bytes": iops * bs, "lat_mean_ns": lat,
            "lat_p90_ns": lat * 1.2, "lat_p99_ns": lat * 2, "lat_p99_99_ns": lat * 4, "usr_cpu": 10.0,
            "sys_cpu": 30.0, "total_ios": int(iops * 10), "runtime_ms": 10_000, "histogram_json": HIST}


def _store(tmp_path, rdma_status="ok"):
    store = ResultsStore(tmp_path / "r")
    run = store.start_run("transports", 'study = "transports"', {})
    device = "rxe0: software (rxe) (port 1 Ethernet ACTIVE over veth0)"
    for r in range(3):
        jitter = (r - 1) * 0.01
        for config, speed in (("tcp", 1.0), ("rdma", 1.5)):
            base = {"stack": "ours", "config": config, "link": "data path 10.0.0.2", "rate": None, "mtu": None}
            if config == "rdma":
                base["rdma_device"] = device
            status, error = ("ok", None) if config == "tcp" else (rdma_status, None if rdma_status == "ok" else
                                                                  "local has no RDMA device: none found")
            apps = [({"app": "L-app", "rw": "randread", "bs": 4096, "iodepth": 1}, 1, 4096),
                    ({"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": 1}, 1, 4096),
                    ({"app": "T-app", "rw": "randread", "bs": 4096, "iodepth": 32}, 20, 4096),
                    ({"app": "B-app", "rw": "randread", "bs": 131072, "iodepth": 32}, 5, 131072)]
            apps += [({"app": "cores", "rw": "randread", "bs": 4096, "iodepth": 32, "cores": n},
                      20 * (1 if n == 1 else 1.6), 4096) for n in (1, 2)]
            for app, scale, bs in apps:
                knobs = base | app
                iops = 10_000 * scale * speed * (1 + jitter)
                key = f"{json.dumps(knobs, sort_keys=True)}-{r}"
                rows = [_row(iops, 100_000 / speed * (1 + jitter), bs)] if status == "ok" else []
                store.save_point(run, key, "transports", f"ours/{config}", knobs, r, status, error,
                                 [{"knobs": knobs, **row} for row in rows])
    return store


def test_analysis_names_a_software_device_and_states_every_interval(tmp_path):
    store = _store(tmp_path)
    result = transports.analyze(store.measurements(), store.runs())
    text = "\n".join(result.findings)
    assert "RDMA device: rxe0: software (rxe)" in text and "software device (Soft-RoCE/siw), not RDMA hardware" in text
    assert "ours on data path 10.0.0.2: RDMA vs TCP: L-app latency mean -33.3 % (66.7 µs vs 100.0 µs; 95 % " \
           "interval of the difference −35.4 to −31.3 µs)" in text
    assert "ours RDMA: 2 cores to saturate (of 1, 2 tried)" in text
    # two queue depths tested in one finding: Holm over them, each with its interval
    tapp = next(f for f in result.findings if "T-app IOPS" in f)
    assert tapp.count("95 % interval of the difference") == 2 and "QD1 +50.0 %" in tapp
    cores = next(t for t in result.tables if "Cores to saturate" in t.title).frame
    assert list(cores["cores to saturate"]) == [2, 2]  # 1.6x with two cores: one is clearly below


def test_analysis_falls_back_with_the_reason(tmp_path):
    store = _store(tmp_path, rdma_status="skipped")
    result = transports.analyze(store.measurements(), store.runs())
    assert result.findings[0] == ("RDMA was not measured (local has no RDMA device: none found): the study fell back "
                                  "to TCP against TCP+TLS.")
    assert not any("RDMA vs TCP" in f for f in result.findings)


def test_an_empty_store_says_so(tmp_path):
    store = ResultsStore(tmp_path / "r")
    assert "no usable measurements" in transports.analyze(store.measurements(), store.runs()).findings[0]


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"netns: {netns.unavailable()}")
def test_the_veth_gets_the_rate_and_the_mtu():
    with netns.EmulatedLink(0, "10gbit", mtu=9000) as link:
        shown = subprocess.run(["ip", "link", "show", "dev", link.host_if], capture_output=True, text=True,
                               timeout=10).stdout
        assert "mtu 9000" in shown
        inside = subprocess.run(["ip", "-n", link.netns, "link", "show", "dev", link.target_if], capture_output=True,
                                text=True, timeout=10).stdout
        assert "mtu 9000" in inside
        assert link.emulation in ("tbf rate 10gbit", "netem delay 0us rate 10gbit"), link.emulation
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", link.host_if], capture_output=True, text=True,
                               timeout=10).stdout
        assert "rate 10Gbit" in qdisc


def test_tbf_bucket_follows_the_rate():
    assert netns.tbf_burst("10gbit") == 5_000_000 and netns.tbf_burst("40gbit") == 20_000_000
    assert netns.tbf_burst("100mbit") == 64 << 10  # the floor
    assert netns.tbf_burst("1gbps") == 4_000_000
    assert netns.tbf_burst("fast") is None and netns.tbf_burst("9" * 40 + "gbit") is None
