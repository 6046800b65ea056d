"""Findings as data (issue 24 item 2): report.html and findings.json come from the same Finding
objects; comparison findings carry metric, values, interval, decision and their points."""

import json
import re
from pathlib import Path

import pytest
from test_analysis_fixtures import overhead_measurements, polling_measurements
from test_report import store_frame

from nvmflab import findings_data
from nvmflab.analysis.common import Difference, compare_values, corrected
from nvmflab.report import write_report
from nvmflab.store import ResultsStore


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    with ResultsStore(results) as store:
        store_frame(store, polling_measurements(), "polling")
        store_frame(store, overhead_measurements(("local", "loopback", "netns")), "overhead")
        points = set(store.measurements()["point_key"])
    out = tmp_path_factory.mktemp("report")
    page = write_report(results, out)
    return results, page, json.loads((out / "findings.json").read_text()), points


def test_every_finding_of_the_page_is_in_the_json_with_its_study(written):
    _, page, doc, _ = written
    assert doc["format"] == findings_data.FORMAT
    html = page.read_text()
    items = re.findall(r'<li id="[^"]+" data-kind="(\w+)" data-decision="([^"]*)">', html)
    assert len(items) == len(doc["findings"]) > 0
    # Same objects: kind and decision on the page equal those in the JSON, in the same order.
    assert [(k, d) for k, d in items] == [(f["kind"], f["decision"]) for f in doc["findings"]]
    assert {f["study"] for f in doc["findings"]} == {"polling", "overhead"}


def test_comparison_findings_carry_metric_values_interval_decision_and_points(written):
    _, _, doc, points = written
    comparisons = [f for f in doc["findings"] if f["kind"] == "comparison"]
    assert comparisons, "the overhead and polling findings compare configurations"
    for f in comparisons:
        assert f["decision"] in {"clear increase", "clear decrease", "no clear difference",
                                 "cannot decide", "not clear after Holm", "no difference could be formed"}
        assert f["points"] and set(f["points"]) <= points
        assert f["points_scope"] == "comparison"
        for e in f["evidence"]:
            assert e["text"] in f["text"]
            if e["interval"] is not None:
                iv = e["interval"]
                assert iv["low"] <= iv["difference"] <= iv["high"]
                clear = iv["low"] > 0 or iv["high"] < 0
                if e["decision"].startswith("clear"):
                    assert clear and (e["decision"] == "clear increase") == (iv["difference"] > 0)
                elif e["decision"] == "no clear difference":
                    assert not clear
    with_metric = [f for f in comparisons if f["metric"]]
    assert with_metric, "comparisons made through compare()/compare_frames() name their metric"
    assert any(f["values"]["a"].get("mean") is not None for f in with_metric)


def test_statements_point_to_the_study_points(written):
    _, _, doc, points = written
    statements = [f for f in doc["findings"] if f["kind"] == "statement"]
    for f in statements:
        assert f["decision"] in ("statement", "decided statement", "descriptive") and f["interval"] is None
        assert f["decided"] == (f["decision"] == "decided statement")
        assert f["points_scope"] == "study" and set(f["points"]) <= points


def test_read_finds_the_json_from_a_results_directory(written, tmp_path):
    _, page, doc, _ = written
    assert findings_data.read(page.parent) == doc["findings"]
    (tmp_path / "findings.json").write_text(json.dumps({"format": "other", "findings": []}))
    with pytest.raises(ValueError):
        findings_data.read(tmp_path)


def test_structure_attaches_only_noted_intervals_to_the_finding_that_shows_them():
    fmt = lambda v: f"{v:.1f} u"  # noqa: E731
    with findings_data.recording() as notes:
        up = compare_values([1.0, 1.1, 0.9], [5.0, 5.2, 4.8])
        same = compare_values([1.0, 1.5, 0.5], [1.1, 1.6, 0.4])
        texts = [f"up: {up.interval(fmt)}", f"same: {same.interval(fmt)}", "a plain statement"]
    found = findings_data.structure("x", texts, notes, __import__("pandas").DataFrame())
    assert [f.kind for f in found] == ["comparison", "comparison", "statement"]
    assert found[0].decision == "clear increase" and found[1].decision == "no clear difference"
    assert found[0].evidence[0]["a"]["repeats"] == [1.0, 1.1, 0.9]
    assert str(found[0]) == texts[0]  # still the sentence
    # Outside recording nothing is collected.
    compare_values([1.0, 2.0], [3.0, 4.0]).interval(fmt)
    assert len(notes) == 2


def test_holm_correction_is_reflected_in_the_decision():
    strong = compare_values([1.0, 1.1, 0.9], [1.5, 1.6, 1.4])
    family = corrected([strong] + [compare_values([1.0, 1.2, 0.8], [1.0, 1.2, 0.8 + i / 100]) for i in range(1, 9)])
    kept = family[0]
    assert isinstance(kept, Difference) and kept.source == strong.source
    assert findings_data.decision_of(kept) in {"clear increase", "not clear after Holm"}
    assert (findings_data.decision_of(kept) == "clear increase") == kept.clear


def test_cli_report_json_prints_the_document(written, tmp_path):
    import os
    import subprocess
    import sys
    results, _, doc, _ = written
    proc = subprocess.run([str(Path(sys.executable).parent / "nvmflab"), "report", str(results), "--out",
                           str(tmp_path / "r"), "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert [f["text"] for f in printed["findings"]] == [f["text"] for f in doc["findings"]]


def test_the_report_opens_with_decided_then_undecided_each_linking_to_its_finding(written):
    _, page, doc, _ = written
    html = page.read_text()
    summary = html.split('<section id="summary">')[1].split("</section>")[0]
    assert html.index('<section id="summary">') < html.index('<section id="polling">')
    decided = summary.split("<h3>Decided</h3>")[1].split("<h3>Could not be decided")[0]
    undecided = summary.split("<h3>Could not be decided")[1]
    clear = [f for f in doc["findings"] if f["decision"] in findings_data.CLEAR]
    assert clear, "the fixtures hold clear differences"
    for f in clear:  # every clear finding is listed, linked to its own item on the page
        anchors = re.findall(r'<li id="([^"]+)"[^>]*>' + re.escape(html_escape(f["text"])), html)
        assert anchors and f'href="#{anchors[0]}"' in decided
    for f in doc["findings"]:
        if f["decision"] in ("cannot decide", "no difference could be formed"):
            assert html_escape(f["text"]) in undecided
    for anchor in re.findall(r'href="#([^"]+)"', summary):
        assert f'id="{anchor}"' in html
    assert undecided.count("<li>") == undecided.count("Why: ")


def html_escape(text: str) -> str:
    """As the page's template escapes (markupsafe: ' is &#39;, which html.escape writes otherwise)."""
    from markupsafe import escape

    return str(escape(text))


def test_the_summary_says_when_other_processes_took_the_cores():
    import pandas as pd

    busy = pd.DataFrame({"point_key": ["a", "a", "b", "c"], "noise_pct": [60.0, 60.0, 80.0, 5.0]})
    text = findings_data.noise_sentence(busy)
    assert text.startswith("Other processes (or steal) took a median 60 % of the experiment's cores")
    assert "up to 80 %" in text
    assert findings_data.noise_sentence(busy.assign(noise_pct=[1.0, 1.0, 2.0, 3.0])) is None
    assert findings_data.noise_sentence(pd.DataFrame()) is None


def test_stacks_and_interference_comparisons_name_their_metric():
    """The stacks and interference analyses build their differences themselves (per-repeat IOPS,
    poll − event per cell); their evidence still names the metric and both sides' repeats."""
    import pandas as pd

    from nvmflab.analysis.interference import mode_difference
    from nvmflab.analysis.stacks import welch_difference

    stacks = findings_data.evidence(welch_difference([100.0, 110.0, 105.0], [150.0, 160.0, 155.0]), "x",
                                    pd.DataFrame())
    assert stacks["metric"] == "iops" and stacks["a"]["repeats"] == [100.0, 110.0, 105.0]
    assert stacks["decision"] == "clear increase" and stacks["b"]["mean"] == 155.0
    cells = pd.DataFrame({"completion": ["event"] * 3 + ["poll"] * 3,
                          "latency_interference": [1.0, 1.2, 1.1, 2.0, 2.2, 2.1]})
    polling = findings_data.evidence(mode_difference(cells, "latency_interference"), "y", pd.DataFrame())
    assert polling["metric"] == "latency_interference"
    assert polling["a"]["repeats"] == [1.0, 1.2, 1.1] and polling["b"]["repeats"] == [2.0, 2.2, 2.1]
    assert polling["difference"] == pytest.approx(1.0)
