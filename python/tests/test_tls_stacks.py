"""TLS for the kernel and SPDK stacks (issue 20 item 3): what `env --topology` finds on a host
(topology/tls.py, a fake root and fake commands on PATH), the kernel stack's nvmet port attributes,
keyring inserts and tlshd with the fake kernel of test_stack_kernel, the refusals in planning, and
SPDK's RPCs and perf options."""

from __future__ import annotations

import gzip
import os
import platform
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_stack_kernel import NQN, FakeKernel, fake, job, setup_for  # noqa: F401  (fake: a fixture)

from nvmflab.env import tls_report
from nvmflab.plan import PerfJob, Subsystem
from nvmflab.spec import Knobs
from nvmflab.stacks import get_stack, kernel
from nvmflab.stacks.base import StackError
from nvmflab.stacks.ours import TLS_HOSTNQN, OurStack
from nvmflab.stacks.spdk import SpdkStack, perf_args, target_rpcs
from nvmflab.tlskey import interchange_key
from nvmflab.topology import tls
from nvmflab.topology.local import LocalHost

KEY = interchange_key(bytes(range(1, 33)))
TRIXIE = "CONFIG_NVME_TCP_TLS=y\nCONFIG_NVME_TARGET_TCP_TLS=y\nCONFIG_TLS=m\nCONFIG_NVME_KEYRING=m\n# CONFIG_X is not set\n"
NVME_213 = """#!/bin/sh
case "$1" in
  version) echo "nvme version 2.13 (git 2.13)";;
  connect) echo "  --tls                      enable TLS";;
  gen-tls-key) echo 'Usage: nvme gen-tls-key <device> [OPTIONS]'; exit 1;;
  check-tls-key) printf 'Usage: nvme check-tls-key <device> [OPTIONS]\n  [  --insert, -i ]   --- Insert retained key\n'
                 exit 1;;  # as nvme-cli 2.13 does after its help (seen on the two-guest bed, tests/bed)
esac
"""
NVME_23 = """#!/bin/sh
case "$1" in
  version) echo "nvme version 2.3 (git 2.3)";;
  connect) echo "  --hostnqn=<STR>";;
  *) echo "unknown command" >&2; exit 1;;
esac
"""


def _tool(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    (folder / name).chmod(0o755)


def _host(tmp_path, monkeypatch, config: str | None, nvme: str | None, tlshd: bool, gz: bool = False,
          module: bool = True):
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    if config is not None:
        if gz:
            (root / "proc").mkdir(parents=True)
            (root / "proc/config.gz").write_bytes(gzip.compress(config.encode()))
        else:
            (root / "boot").mkdir(parents=True)
            (root / f"boot/config-{platform.release()}").write_text(config)
    if module:
        (root / "sys/module/tls").mkdir(parents=True)
    if nvme:
        _tool(bin_dir, "nvme", nvme)
    if tlshd:
        _tool(bin_dir, "tlshd", "#!/bin/sh\nexit 0\n")
    _tool(bin_dir, "modinfo", "#!/bin/sh\nexit 1\n")  # no tls module unless /sys/module/tls says loaded
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return LocalHost(workdir=tmp_path / "work"), str(root)


def test_a_trixie_like_host_can_do_kernel_tls_on_both_sides(tmp_path, monkeypatch):
    host, root = _host(tmp_path, monkeypatch, TRIXIE, NVME_213, tlshd=True)
    facts = tls.probe(host, root)
    assert facts.options == {"CONFIG_NVME_TCP_TLS": "y", "CONFIG_NVME_TARGET_TCP_TLS": "y", "CONFIG_TLS": "m",
                             "CONFIG_NVME_KEYRING": "m"}
    assert facts.config_source == f"/boot/config-{platform.release()}" and facts.tls_module == "loaded"
    assert facts.tlshd.endswith("/tlshd") and facts.nvme_connect_tls and facts.nvme_tls_keys
    assert tls.nvme_cli_version(facts.nvme_version) == (2, 13)
    assert tls.kernel_unavailable(facts, "target") is None and tls.kernel_unavailable(facts, "host") is None
    assert "CONFIG_NVME_TCP_TLS=y" in tls.summary(facts) and "nvme version 2.13" in tls.summary(facts)


def test_a_bookworm_like_host_is_refused_with_every_reason(tmp_path, monkeypatch):
    host, root = _host(tmp_path, monkeypatch, "CONFIG_TLS=m\n", NVME_23, tlshd=False, module=False)
    facts = tls.probe(host, root)
    why = tls.kernel_unavailable(facts, "host")
    assert "without CONFIG_NVME_TCP_TLS=y" in why and "no kernel TLS" in why and "no tlshd" in why
    assert "nvme-cli 2.3 has no gen-tls-key and connect --tls" in why
    assert "CONFIG_NVME_TARGET_TCP_TLS=y" in tls.kernel_unavailable(facts, "target")


def test_the_config_comes_from_proc_config_gz_or_its_absence_is_named(tmp_path, monkeypatch):
    host, root = _host(tmp_path, monkeypatch, TRIXIE, NVME_213, tlshd=True, gz=True)
    facts = tls.probe(host, root)
    assert facts.config_source == "/proc/config.gz" and facts.options["CONFIG_NVME_TARGET_TCP_TLS"] == "y"
    bare, bare_root = _host(tmp_path / "bare", monkeypatch, None, None, tlshd=False)
    why = tls.kernel_unavailable(tls.probe(bare, bare_root), "target")
    assert "no kernel config readable" in why and "no nvme-cli" in why


def test_hostile_probe_output_is_bounded_and_skipped():
    text = "kernel=6.12\nCONFIG_NVME_TCP_TLS=y\nCONFIG_NVME_TCP_TLS=maybe\nrm -rf /\n" + "x=" + "y" * 10_000 + "\n"
    facts = tls.parse(text + "tls_module=evil\n" * 10_000)
    assert facts.kernel == "6.12" and facts.options == {"CONFIG_NVME_TCP_TLS": "y"} and facts.tls_module is None
    assert tls.nvme_cli_version("no digits here") is None


def test_env_reports_tls_per_stack_and_side(tmp_path, monkeypatch):
    host, root = _host(tmp_path, monkeypatch, "CONFIG_TLS=m\n", NVME_23, tlshd=False)
    monkeypatch.setattr(tls, "probe", lambda h, r="": tls.parse("kernel=6.1\nconfig_source=/boot/config-6.1\n"))
    report = tls_report(host)
    assert report["stacks"]["ours"] == {"target": None, "host": None}
    assert "CONFIG_NVME_TARGET_TCP_TLS=y" in report["stacks"]["kernel"]["target"]
    assert report["facts"]["kernel"] == "6.1" and "kernel config" not in report["summary"]


# -- the kernel stack --------------------------------------------------------------------------------

class TlsKernel(FakeKernel):
    """The fake kernel with nvme-cli's key insert, pgrep and systemctl."""

    def __init__(self, root: Path, tlshd_running: bool = True):
        super().__init__(root)
        self.tlshd_running, self.serial = tlshd_running, 0x1a2b

    def run(self, argv, timeout=60.0, check=True, input=None):
        if argv[:2] == ["nvme", "check-tls-key"]:
            self.commands.append(list(argv))
            self.serial += 1
            return self._done(argv, 0, f"Inserted TLS key {self.serial:08x}\n")
        if argv[:2] in (["pgrep", "-x"], ["systemctl", "start"], ["systemctl", "stop"]):
            self.commands.append(list(argv))
            return self._done(argv, 0 if argv[0] == "systemctl" or self.tlshd_running else 1)
        if argv[:2] == ["sh", "-c"] and "keyctl unlink" in argv[2]:
            self.commands.append(list(argv))
            return self._done(argv)
        return super().run(argv, timeout, check, input)


@pytest.fixture
def tls_kernel(fake, monkeypatch):  # noqa: F811
    host, stack = fake
    monkeypatch.setattr(tls, "probe", lambda h, r="": tls.parse(
        "kernel=6.12\nconfig_source=/boot/config-6.12\nCONFIG_NVME_TCP_TLS=y\nCONFIG_NVME_TARGET_TCP_TLS=y\n"
        "tls_module=available\ntlshd=/usr/sbin/tlshd\nnvme_version=nvme version 2.13\nnvme_connect_tls=yes\n"
        "nvme_tls_keys=yes\n"))
    return TlsKernel(host.root, tlshd_running=False), stack


def _tls_setup():
    setup = setup_for(Subsystem(NQN, "null", 64 << 20))
    return type(setup)(**{**setup.__dict__, "tls": "on", "tls_key": KEY})


def test_kernel_target_requires_tls_on_its_port_with_the_key_in_the_keyring(tls_kernel, tmp_path):
    host, stack = tls_kernel
    target = stack.start_target(_tls_setup(), host, tmp_path)
    port = host.root / "sys/kernel/config/nvmet/ports/1"
    assert (port / "addr_tsas").read_text() == "tls1.3" and (port / "addr_treq").read_text() == "required"
    inserts = [c for c in host.commands if c[:2] == ["nvme", "check-tls-key"]]
    assert [c[-2] for c in inserts] == ["--identity=0", "--identity=1"]
    assert all(f"--hostnqn={TLS_HOSTNQN}" in c and f"--subsysnqn={NQN}" in c and f"--keydata={KEY}" in c
               for c in inserts)
    assert ["systemctl", "start", "tlshd"] in host.commands  # it was not running
    assert host.commands.index(inserts[0]) < next(i for i, c in enumerate(host.commands) if "addr_trtype" in " ".join(c))
    target.stop()
    assert target.teardown_errors == []
    unlinked = [c[-1] for c in host.commands if c[:2] == ["sh", "-c"] and "keyctl unlink" in c[2]]
    assert unlinked == [str(0x1a2d), str(0x1a2c)] and ["systemctl", "stop", "tlshd"] in host.commands


def test_kernel_host_connects_with_tls_as_the_host_the_target_holds_a_key_for(tls_kernel, tmp_path):
    host, stack = tls_kernel
    target = SimpleNamespace(address="10.0.0.2", port=4420, setup=SimpleNamespace(tls_key=KEY))
    session = stack.open_host(job(tls="on"), target, host, tmp_path)
    connect = next(c for c in host.commands if c[:2] == ["nvme", "connect"])
    assert "--tls" in connect and f"--hostnqn={TLS_HOSTNQN}" in connect
    assert sum(c[:2] == ["nvme", "check-tls-key"] for c in host.commands) == 2
    session.close()
    assert session.close_errors == [] and sum("keyctl unlink" in " ".join(c) for c in host.commands) == 2
    plan = "\n".join(stack.plan_host(job(tls="on"), "10.0.0.2", 4420, host))
    assert "check-tls-key" in plan and "--tls" in plan


def test_a_kernel_host_that_cannot_do_tls_is_refused_before_anything_changes(fake, tmp_path, monkeypatch):  # noqa: F811
    host, stack = fake
    monkeypatch.setattr(tls, "probe", lambda h, r="": tls.parse("kernel=6.1\nconfig_source=/boot/config-6.1\n"))
    with pytest.raises(StackError, match="tls = on: .*without CONFIG_NVME_TARGET_TCP_TLS=y"):
        stack.start_target(_tls_setup(), host, tmp_path)
    assert not list((host.root / "sys/kernel/config/nvmet/subsystems").iterdir())
    assert "without CONFIG_NVME_TCP_TLS=y" in stack.tls_unavailable(host, "host")


def test_kernel_tls_key_serials_are_read_with_bounds():
    assert kernel.inserted_serial("Inserted TLS key 0a0b0c0d\n") == 0x0a0b0c0d
    assert kernel.inserted_serial("error: no keyring\n") is None
    assert kernel.inserted_serial("x" * 10_000 + "Inserted TLS key 1\n") is None


# -- planning: which pairs can talk ------------------------------------------------------------------

def _point(tls_value: str):
    knobs = {"tls": tls_value}
    return SimpleNamespace(knobs=knobs, target=object(), jobs=[SimpleNamespace(knobs=knobs, host=None)])


def test_tls_check_refuses_pairs_without_a_common_identity_and_hosts_that_cannot():
    hosts = SimpleNamespace(target="t", initiator=lambda _name: "i")
    check = tls.TlsCheck(SimpleNamespace(hosts=hosts))
    assert check.refusal(_point("off"), get_stack("spdk"), get_stack("kernel")) is None
    why = check.refusal(_point("on"), get_stack("spdk"), get_stack("kernel"))
    assert "the kernel host offers PSK identity version(s) [1], the spdk target accepts [0]" in why
    lacking = SimpleNamespace(name="kernel", tls_identities=frozenset({0, 1}),
                              tls_unavailable=lambda host, side: f"{host}: no tlshd")
    assert check.refusal(_point("on"), lacking, OurStack()) == "tls = on: t: no tlshd"
    assert tls.TlsCheck(SimpleNamespace(hosts=hosts, planning=True)).refusal(
        _point("on"), get_stack("spdk"), get_stack("kernel")) is None


# -- SPDK ----------------------------------------------------------------------------------------

def test_spdk_target_has_a_secure_channel_listener_and_the_hosts_psk():
    setup = _tls_setup()
    calls = target_rpcs(setup, 4420, "/w/spdk.psk")
    listener = next(c for c in calls if c[0] == "nvmf_subsystem_add_listener")
    assert listener[-1] == "--secure-channel"
    assert ["nvmf_subsystem_add_host", NQN, TLS_HOSTNQN, "--psk", "/w/spdk.psk"] in calls
    assert "-a" not in next(c for c in calls if c[0] == "nvmf_create_subsystem")  # SPDK: no secure any-host
    plain = target_rpcs(setup_for(Subsystem(NQN, "null", 64 << 20)), 4420)
    assert not any("--secure-channel" in c or "--psk" in c for c in plain)


def test_spdk_perf_uses_its_ssl_socket_with_the_psk_file_and_names_the_host():
    knobs = {"rw": "randread", "bs": 4096, "iodepth": 8, "numjobs": 1, "rwmixread": 50, "rate_iops": 0,
             "size": None} | Knobs().model_dump() | {"completion": "poll", "tls": "on"}
    argv = perf_args(PerfJob("main", knobs, (1,), nqn=NQN), "127.0.0.1", 4420, 2, 0, "/w/perf.psk")
    assert argv[argv.index("-S"):argv.index("-S") + 4] == ["-S", "ssl", "--psk-path", "/w/perf.psk"]
    assert f"hostnqn:{TLS_HOSTNQN}" in argv[argv.index("-r") + 1]
    assert SpdkStack.tls_identities == frozenset({0})


def test_our_host_offers_spdk_the_version_0_identity_it_takes():
    knobs = Knobs().model_dump() | {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "tls": "on"}
    argv = OurStack()._argv_head(PerfJob("main", knobs, (1,), nqn=NQN), "127.0.0.1", 4420, "nvmf-perf", KEY,
                                 None, 0)
    assert argv[argv.index("--tls-key-identity") + 1] == "0"
    assert "--tls-key-identity" not in OurStack()._argv_head(PerfJob("main", knobs, (1,), nqn=NQN), "127.0.0.1",
                                                             4420, "nvmf-perf", KEY)


def test_probe_script_runs_under_sh_without_a_root(tmp_path):
    # the script itself, on this machine: no crash, every line it prints parses or is skipped
    done = subprocess.run(["sh", "-c", tls._SCRIPT, "sh", str(tmp_path)], capture_output=True, text=True,
                          timeout=20, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert tls.parse(done.stdout).kernel == platform.release()
