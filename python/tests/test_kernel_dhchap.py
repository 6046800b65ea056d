"""The kernel stack's `dhchap` knob on the fake kernel (test_stack_kernel's FakeKernel): nvmet host
entries keyed with the run's secret, only that host admitted, `nvme connect --dhchap-secret`, a
wrong-key point connecting with another secret, and a refusal named from the host's kernel log.
The real nvmet and nvme-cli run it on the two-guest bed (tests/bed/test_bed_studies.py)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from types import SimpleNamespace

import pytest

from nvmflab.dhchapkey import random_secret
from nvmflab.plan import PerfJob, Subsystem
from nvmflab.stacks.base import StackError
from nvmflab.stacks.ours import TLS_HOSTNQN
from test_stack_kernel import NQN, _attrs, fake, knobs, setup_for, snapshot  # noqa: F401 (fake: a fixture)

SECRET = random_secret()


def dhchap_setup(**over):
    return replace(setup_for(Subsystem(NQN, "ram", 1 << 20)), dhchap="ffdhe2048", dhchap_key=SECRET, **over)


def test_target_keys_a_host_entry_of_its_own_and_admits_only_it(fake, tmp_path):
    host, stack = fake
    nvmet = host.root / "sys/kernel/config/nvmet"
    before = snapshot(host.root)
    target = stack.start_target(dhchap_setup(), host, tmp_path)
    entry, sub = nvmet / "hosts" / TLS_HOSTNQN, nvmet / "subsystems" / NQN
    assert {a: (entry / a).read_text() for a in ("dhchap_hash", "dhchap_dhgroup", "dhchap_key")} == {
        "dhchap_hash": "hmac(sha256)", "dhchap_dhgroup": "ffdhe2048", "dhchap_key": SECRET}
    assert (sub / "attr_allow_any_host").read_text() == "0"  # nvmet authenticates only admitted hosts
    assert [p.name for p in (sub / "allowed_hosts").iterdir()] == [TLS_HOSTNQN]
    target.stop()
    assert target.teardown_errors == [] and snapshot(host.root) == before


def test_target_refuses_to_rekey_a_host_entry_it_did_not_make(fake, tmp_path):
    # A host NQN of the user's (the spec's hostnqn); one with nvmflab's own NQN is a leftover of a
    # killed run, removed first (test_bed_faults_unit.py).
    host, stack = fake
    nvmet, theirs = host.root / "sys/kernel/config/nvmet", "nqn.2026-01.example:theirs"
    _attrs(nvmet / "hosts" / theirs, {"dhchap_key": "theirs"}, [])
    before = snapshot(host.root)
    with pytest.raises(StackError, match="does not change the DH-HMAC-CHAP key of an entry it did not make"):
        stack.start_target(dhchap_setup(allowed_hosts=(theirs,)), host, tmp_path)
    assert snapshot(host.root) == before  # rolled back; their key untouched


def test_host_connects_with_the_targets_secret_or_a_wrong_one(fake, tmp_path):
    host, stack = fake
    target = SimpleNamespace(address="10.0.0.1", port=4420, setup=dhchap_setup())
    for wrong in (False, True):
        host.commands.clear()
        session = stack.open_host(PerfJob("main", knobs(dhchap="ffdhe2048", wrong_key=wrong), cpus=(1,), nqn=NQN),
                                  target, host, tmp_path)
        connect = next(c for c in host.commands if c[:2] == ["nvme", "connect"])
        secrets = [a.split("=", 1)[1] for a in connect if a.startswith("--dhchap-secret=")]
        assert f"--hostnqn={TLS_HOSTNQN}" in connect and len(secrets) == 1
        assert (secrets[0] == SECRET) != wrong and secrets[0].startswith("DHHC-1:00:")
        session.close()


def test_a_refused_connect_is_named_from_the_kernel_log_without_the_secret(fake, tmp_path, monkeypatch):
    host, stack = fake
    run = host.run

    def refusing(argv, timeout=60.0, check=True, input=None):
        if argv[:2] == ["nvme", "connect"]:
            return subprocess.CompletedProcess(argv, 1, "", "could not add new controller: failed to write")
        if argv == ["dmesg"]:
            return subprocess.CompletedProcess(argv, 0, "[ 1.0] nvme nvme0: qid 0: authentication failed, "
                                                        "error -129\n", "")
        return run(argv, timeout, check, input)

    monkeypatch.setattr(host, "run", refusing)
    target = SimpleNamespace(address="10.0.0.1", port=4420, setup=dhchap_setup())
    with pytest.raises(StackError) as refused:
        stack.open_host(PerfJob("main", knobs(dhchap="ffdhe2048", wrong_key=True), cpus=(1,), nqn=NQN),
                        target, host, tmp_path)
    said = str(refused.value)
    assert "DH-HMAC-CHAP authentication failed (the point's wrong_key" in said and "error -129" in said
    assert "DHHC-1" not in said
    assert stack._held == {}  # the settings held for the session were given back
