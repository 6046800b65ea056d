"""Stack and study names are said once (names.py); everything else is built from them."""

import importlib
from pathlib import Path

import pytest

from nvmflab import names
from nvmflab.cli import StackOption, StudyName
from nvmflab.report import ANALYZERS
from nvmflab.spec import Spec
from nvmflab.stacks import STACKS, get_stack
from nvmflab.studies import STUDIES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", names.STACK_NAMES)
def test_every_stack_name_is_a_stack_module(name):
    assert get_stack(name).name == name


@pytest.mark.parametrize("name", names.STUDY_NAMES)
def test_every_study_name_has_its_study_analysis_and_spec(name):
    module = names.module_name(name)
    assert hasattr(importlib.import_module(f"nvmflab.studies.{module}"), "Params")
    assert (ROOT / "studies" / f"{name}.toml").is_file()
    assert Spec.model_validate({"study": name}).study == name


def test_spec_cli_report_and_stacks_take_the_names_from_one_place():
    assert tuple(STACKS) == names.STACK_NAMES and tuple(STUDIES) == names.STUDY_NAMES
    assert tuple(ANALYZERS) == names.STUDY_NAMES
    assert [s.value for s in StudyName] == [*names.STUDY_NAMES, "all"]
    assert [s.value for s in StackOption] == list(names.STACK_NAMES)
    # nobody lists them again
    for path in ("spec.py", "cli.py", "env.py", "report.py", "studies/__init__.py", "stacks/__init__.py"):
        text = (ROOT / "python" / "nvmflab" / path).read_text()
        assert '"kernel", "spdk"' not in text and '"busy-poll", "parallelism"' not in text, path
