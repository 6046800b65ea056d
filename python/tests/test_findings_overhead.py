"""overhead's findings (issue 37): the decomposition is one Holm family, no effect is stated where
no interval could be formed, the peak is decided, and the NVMe/TCP job names its conditions."""

from test_analysis_fixtures import overhead_measurements
from test_analysis_studies import runs_frame

from nvmflab.analysis import overhead

# per repeat, the p99 at QD1 (µs): software +2.6 µs (Welch p ≈ 0.03 alone), network and total unclear
P99_US = {"local": [100.0, 101.0, 102.0], "loopback": [102.6, 103.6, 104.6], "netns": [102.0, 104.6, 106.0]}


def _findings(data):
    return overhead.analyze(data, runs_frame(["overhead"])).findings


def test_the_decomposition_is_one_holm_family():
    data = overhead_measurements()
    for leg, values in P99_US.items():
        for repeat, value in enumerate(values):
            at = (data["leg"] == leg) & (data["iodepth"] == 1) & (data["repeat"] == repeat)
            data.loc[at, "lat_p99_ns"] = value * 1e3
    decomposition = next(f for f in _findings(data) if f.startswith("L-app p99 at QD1"))
    assert "(Holm over the decomposition's 4 comparisons)" in decomposition, decomposition
    # clear alone, so without Holm the sentence would state a software overhead of +2.60 µs
    assert "the software overhead is +2.60 µs" not in decomposition, decomposition
    assert "no clear software overhead over local (" in decomposition, decomposition
    assert "over 4 comparisons" in decomposition.split("no clear software overhead")[1].split(";")[0]


def test_no_effect_is_stated_without_an_interval():
    data = overhead_measurements()
    data = data[data["repeat"] == 0]  # one repeat: no interval anywhere
    findings = _findings(data)
    peak = next(f for f in findings if "peak IOPS" in f and "NVMe/TCP" in f)
    assert peak.startswith("Cannot tell whether peak IOPS between one local job and one NVMe/TCP (netns) job "
                           "changed"), peak
    assert "2.59×" not in peak
    decomposition = next(f for f in findings if f.startswith("L-app p99 at QD1"))
    assert "the total overhead is" not in decomposition and "cannot decide" in decomposition, decomposition


def test_the_peak_is_decided_and_the_tcp_job_names_its_conditions():
    findings = _findings(overhead_measurements())
    netns = next(f for f in findings if f.startswith("T-app, netns:"))
    assert "reaches its peak from QD128 on" in netns and "Holm over the 9 depths" in netns, netns
    local = next(f for f in findings if f.startswith("T-app, local:"))
    assert "still clearly rising at the deepest queue tried (QD256" in local, local
    peak = next(f for f in findings if f.startswith("One local job delivers 2.59× the peak IOPS"))
    assert "The NVMe/TCP job ran with" in peak and "host completion" in peak and "jobs 1" in peak, peak


def test_every_overhead_finding_is_decided_or_labelled():
    from nvmflab import findings_data

    data = overhead_measurements()
    netns = data["leg"] == "netns"
    data.loc[netns, "knobs_json"] = '{"netns_delay_us": 20, "netns_link": "none", "netns_rate": "10gbit"}'
    with findings_data.recording() as notes:
        result = overhead.analyze(data, runs_frame(["overhead"]))
    found = findings_data.structure("overhead", result.findings, notes, data)
    assert not [f.text for f in found if findings_data.untested(f)]
    assert next(f for f in found if f.text.startswith("T-app, netns")).is_decided
