"""A run whose spec description starts with FUNCTIONAL (the two-guest bed's specs: emulated guests)
gets a label above everything in the report: timings are not performance (issue 39 item 3)."""

from __future__ import annotations

import json

import pandas as pd

from nvmflab.report import build_report, functional_runs

BED = "FUNCTIONAL run on emulated guests (qemu TCG), not performance: TCP and RDMA"


def runs(*descriptions: str | None) -> pd.DataFrame:
    env = [json.dumps({"hostname": "lab", "spec_effective": {"description": d}}) for d in descriptions]
    return pd.DataFrame({"run_id": [f"r{i}" for i in range(len(env))], "study": "transports", "git_rev": None,
                         "started_at": None, "finished_at": None, "env_json": env, "spec_toml": ""})


def test_only_runs_declared_functional_are_labelled():
    assert functional_runs(runs(BED, "a real lab run", None, BED)) == [BED]
    assert functional_runs(runs("measured on two servers (not functional)")) == []
    bad = runs(BED)
    bad.loc[0, "env_json"] = "{not json"
    assert functional_runs(bad) == []


def test_the_report_shows_the_label_for_a_functional_run_and_not_otherwise(tmp_path):
    page = build_report(pd.DataFrame(), runs(BED), tmp_path / "bed").read_text()
    assert 'id="functional"' in page and "Functional run (emulation): timings are not performance." in page
    assert page.index('id="functional"') < page.index('id="runs"')  # above the results, not in the details
    assert BED in page.split('id="functional"', 1)[1].split("</p>", 1)[0]
    plain = build_report(pd.DataFrame(), runs("two servers in the lab"), tmp_path / "lab").read_text()
    assert 'id="functional"' not in plain
