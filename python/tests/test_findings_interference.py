"""interference's and saturation's findings pass the gate of issue 37 item 1: every sentence that
states a number carries a decision (a Difference, a decided statement) or says it is descriptive."""

from test_analysis_fixtures import interference_measurements, runs_frame, saturation_measurements

from nvmflab import findings_data
from nvmflab.analysis import interference, saturation


def structured(study, module, data):
    with findings_data.recording() as notes:
        result = module.analyze(data, runs_frame([study]))
    return findings_data.structure(study, result.findings, notes, data)


def test_interference_findings_are_decided_or_labelled():
    found = structured("interference", interference, interference_measurements())
    assert not [f.text for f in found if findings_data.untested(f)]
    guideline = next(f for f in found if f.text.startswith("Guideline (shared target core, L-app): keep"))
    assert guideline.is_decided  # safe loads by the Fieller intervals
    jump = next(f for f in found if f.text.startswith("Largest jump"))
    assert jump.descriptive and not jump.is_decided


def test_saturation_findings_are_decided_or_labelled():
    found = structured("saturation", saturation, saturation_measurements())
    assert not [f.text for f in found if findings_data.untested(f)]
    order = found[-1] if "saturates first" in found[-1].text else next(f for f in found if "saturates first" in f)
    assert order.evidence, order.text  # the peaks' Welch comparison, not '±' figures alone
