"""Issue 41 item 5: plain `nvmflab env` says which stacks this machine can run (and whether an SPDK
build is there), TLS (userspace, kTLS) and RDMA devices, as the README promises; `env --topology`
finds our binaries as the harness does (NVMFLAB_BIN_DIR first)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from conftest import FAKEBIN, REPO, nvmflab
from test_transport_knob import IBV, RDMA_LINK, fake_sysfs, fake_tool

from nvmflab.env import capabilities, capability_rows, ktls_state
from nvmflab.topology.local import LocalHost


def fake_spdk_build(folder: Path) -> Path:
    (folder / "build" / "bin").mkdir(parents=True)
    (folder / "scripts").mkdir()
    (folder / "scripts" / "rpc.py").write_text("")
    fake_tool(folder / "build" / "bin", "nvmf_tgt", "plain")
    fake_tool(folder / "build" / "bin", "spdk_nvme_perf", "plain")
    return folder


def test_capabilities_list_stacks_spdk_build_rdma_devices_and_ktls(tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    fake_tool(tools, "rdma", RDMA_LINK)
    fake_tool(tools, "ibv_devices", IBV)
    fake_tool(tools, "modinfo", "", rc=1)  # no tls module installed unless the fake /sys says loaded
    root = tmp_path / "root"
    fake_sysfs(root)
    (root / "sys/module/tls").mkdir(parents=True)
    monkeypatch.setenv("NVMFLAB_BIN_DIR", str(FAKEBIN))
    spdk = fake_spdk_build(tmp_path / "spdk")
    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(spdk))

    found = capabilities(LocalHost(), str(root))
    assert set(found["stacks"]) == {"ours", "kernel", "spdk"}
    assert found["stacks"]["ours"] == {"target": None, "host": None}
    assert found["stacks"]["spdk"] == {"target": None, "host": None} and found["spdk_build"] == str(spdk)
    assert "rxe0: software (rxe)" in found["rdma"]["summary"] and "mlx5_0" in found["rdma"]["summary"]
    assert ktls_state(found["tls"]["facts"]) == "yes: the tls module is loaded"
    rows = dict(capability_rows(found))
    assert rows["spdk build"] == str(spdk) and rows["stack spdk target"] == "usable"
    assert rows["rdma devices"] == found["rdma"]["summary"]
    assert rows["tls userspace"].startswith("always") and rows["tls ours target"] == "usable"
    assert rows["ktls"].startswith("yes") and "tls kernel host" in rows

    monkeypatch.setenv("NVMFLAB_SPDK_DIR", str(tmp_path / "no-spdk"))
    fake_tool(tools, "rdma", "")
    fake_tool(tools, "ibv_devices", "No IB devices found", rc=1)
    bare = capabilities(LocalHost(), str(tmp_path / "empty"))
    rows = dict(capability_rows(bare))
    assert bare["spdk_build"] is None and rows["spdk build"].startswith("not found (make spdk")
    assert rows["stack spdk host"].startswith("missing: local: no SPDK build found")
    assert rows["rdma devices"] == "none" and rows["rdma ours target"] == "no: no RDMA device with a port up"
    assert rows["ktls"].startswith("no: no tls module")
    fake_tool(tools, "modinfo", "/lib/modules/x/tls.ko")  # installed, not loaded
    assert dict(capability_rows(capabilities(LocalHost(), str(tmp_path / "empty"))))["ktls"].startswith(
        "yes: the tls module is installed, not loaded")
    assert ktls_state({"options": {"CONFIG_TLS": "y"}, "tls_module": "missing"}).startswith("yes: built into")


def test_plain_env_on_this_machine_prints_every_section_the_readme_names(fake_env):
    done = nvmflab("env", env=fake_env)
    assert done.returncode == 0 and "Traceback" not in done.stderr + done.stdout, done.stderr
    items = {line.split("│")[1].strip() for line in done.stdout.splitlines() if line.count("│") >= 3}
    for item in ("cpu model", "cores", "nvmf-target", "fio", "stack ours target", "stack kernel host",
                 "stack spdk target", "spdk build", "rdma devices", "rdma ours host", "tls userspace", "ktls",
                 "tls kernel target"):
        assert item in items, (item, sorted(items))
    readme = (REPO / "README.md").read_text()
    (promise,) = re.findall(r"^\.venv/bin/nvmflab env +# (.*)$", readme, re.M)
    for word, item in (("stacks", "stack ours host"), ("SPDK", "spdk build"), ("TLS", "ktls"),
                       ("RDMA", "rdma devices"), ("tools", "fio")):
        assert word in promise and item in items, (word, promise)
    as_json = json.loads(nvmflab("env", "--json", env=fake_env).stdout)
    assert {"tools", "stacks", "spdk_build", "rdma", "tls", "warnings"} <= set(as_json)
    assert as_json["stacks"]["ours"] == {"target": None, "host": None}  # the fakes in NVMFLAB_BIN_DIR


def test_env_topology_finds_our_binaries_where_the_harness_does(tmp_path, fake_env):
    spec = tmp_path / "local.toml"  # a spec without an ssh [topology]: this machine
    spec.write_text('name = "here"\n[sweep]\niodepth = [1]\n')
    done = nvmflab("env", "--topology", str(spec), "--json", env=fake_env)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["stacks"]["ours"] == {"target": None, "host": None}
    for name in ("nvmf-target", "nvmf-perf"):
        assert report["tools"][name]["path"] == str(FAKEBIN / name)
        assert report["tools"][name]["version"]
