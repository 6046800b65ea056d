"""The transports study's mixed pairs (`pairs = ["ours/kernel", ...]`, issue 39 item 3): each runs
beside the stacks that are their own target and host, its points labelled TARGET/HOST (knob
`stack`) with each side's stack; a malformed pair is a named input error. The real pairs run on the
two-guest bed (tests/bed/test_bed_studies.py)."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from nvmflab.studies import transports
from test_study_transports import TINY


def test_pairs_run_beside_the_stacks_with_each_sides_stack():
    chosen = transports.pairs(transports.Params(stacks=["ours"], pairs=["ours/kernel", "kernel/ours"]))
    assert [(label, t.name, h.name) for label, t, h in chosen] == [
        ("ours", "ours", "ours"), ("ours/kernel", "ours", "kernel"), ("kernel/ours", "kernel", "ours")]


@pytest.mark.parametrize("bad", ["ours", "ours/kernel/spdk", "ours/nvme"])
def test_a_malformed_pair_is_refused_by_name(bad):
    with pytest.raises(ValidationError, match=f"each of pairs must be TARGET/HOST .*got '{bad}'"):
        transports.Params(pairs=[bad])


def test_a_mixed_pair_plans_our_target_and_the_kernel_host(tmp_path, fake_env, monkeypatch, capsys):
    from nvmflab import cli

    spec = tmp_path / "t.toml"
    spec.write_text(TINY.replace('configs = ["tcp", "tls", "rdma"]', 'configs = ["tcp"]\npairs = ["ours/kernel"]')
                    .replace("repeats = 2", "repeats = 1"))
    monkeypatch.setattr(sys, "argv", ["nvmflab", "run", str(spec), "--plan"])  # in this process: no start-up
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.err
    points = out.out.split("\n# ")  # one block per point: its header, then what it runs
    mixed = [" ".join(p.split()) for p in points if "· ours/kernel/tcp ·" in p]  # lines may be wrapped
    assert len(mixed) == 3, done.stdout[-2000:]  # L-app, T-app, B-app of the pair
    assert all("host_stack=kernel" in p and "target_stack=ours" in p and "stack=ours/kernel" in p for p in mixed)
    assert all("nvme connect -t tcp" in p and "fio " in p and "nvmf-perf" not in p for p in mixed)
