"""Property test of the spec and CLI surface (issue 25, item 8): any field given a wrong type, an
out-of-range value or an unknown key ends in one line naming that field in the spec's own names
(never pydantic's `repeats.constrained-int`), exit 2, no traceback."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nvmflab.spec import Spec, SpecError
from nvmflab.study_spec import load_study_spec

# Every leaf field of a spec (table, key), with the study whose [params] it belongs to.
TABLES = {"topology": ["kind", "target_cores", "host_cores"], "backend": ["kind", "size", "block_size", "path"],
          "workload": ["rw", "bs", "iodepth", "numjobs", "rwmixread", "rate_iops", "size"],
          "knobs": ["completion", "target_mode", "idle_poll_us", "hdr_digest", "data_digest", "so_priority", "tos",
                    "busy_poll_us", "in_capsule_data_size", "io_queues"],
          "stack": ["target", "host", "hostnqn"]}
TOP = ["name", "repeats", "min_repeats", "max_repeats", "ci_within_pct", "ramp_time", "runtime", "study"]
POLLING_PARAMS = ["iodepth", "idle_poll_us", "high_iodepth", "io_queues"]
FIELDS = [(t, k) for t, keys in TABLES.items() for k in keys] + [(None, k) for k in TOP] + \
         [("params", k) for k in POLLING_PARAMS]
# Spec-level checks relate two fields; a wrong value of one may be reported at its partner.
PARTNERS = {"backend.size": {"workload.bs", "workload.size"}, "backend.block_size": {"workload.bs", "backend.size"},
            "workload.numjobs": {"knobs.io_queues"}, "knobs.io_queues": {"workload.numjobs"},
            "min_repeats": {"max_repeats"}, "max_repeats": {"min_repeats"}, "study": {"params", "sweep"}}
PYDANTIC_TAGS = re.compile(r"constrained-|function-(after|before|wrap|plain)|literal\[|\.int\b|\.str\b|\.float\b|"
                           r"\.bool\b|\.list\[")

BASE = {"name": "prop", "repeats": 1, "ramp_time": 0, "runtime": 1, "study": "polling",
        "params": {"iodepth": [1], "idle_poll_us": [0], "high_iodepth": 2, "io_queues": []}}

bad_values = st.one_of(
    st.text(max_size=12), st.integers(min_value=-10**12, max_value=10**12), st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True), st.lists(st.one_of(st.integers(-5, 5000), st.text(max_size=4)),
                                                            max_size=3),
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers(-3, 3), max_size=2),
    st.sampled_from([0, -1, 4097, 10**9, "4x", "", "inf", "-4k", "99999TiB", [0, -1], [], {"a": 1}]),
)
identifiers = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML forbids a raw DEL
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml(spec: dict) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in spec.items() if not isinstance(v, dict)]
    for table, body in spec.items():
        if isinstance(body, dict):
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def with_value(table: str | None, key: str, value) -> dict:
    spec = json.loads(json.dumps(BASE))
    if table is None:
        spec[key] = value
    else:
        spec.setdefault(table, {})[key] = value
    return spec


def field_path(table: str | None, key: str) -> str:
    return f"{table}.{key}" if table else key


def spec_file_with(tmp_path: Path, table: str | None, key: str, value) -> Path:
    """The base spec with one value set, written to a file; values TOML cannot write are not drawn."""
    try:
        text = toml(with_value(table, key, value))
    except (TypeError, ValueError):
        assume(False)
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def named_field(message: str, path: Path) -> str:
    """The field a one-line spec error names: `FILE[:LINE]: FIELD: ...`."""
    match = re.match(re.escape(str(path)) + r"(?::\d+)?: ([^:]+): ", message)
    assert match, message
    return match.group(1)


def check_refusal(message: str, path: Path, expected: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message
    assert not PYDANTIC_TAGS.search(message.split(": ", 2)[1] if ": " in message else message), message
    field = named_field(message, path)
    base = re.sub(r"\[\d+\]$", "", field)
    assert base == expected or base.startswith(expected + ".") or base in PARTNERS.get(expected, set()), \
        (expected, message)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=bad_values)
def test_any_bad_value_names_its_field(tmp_path, field, value):
    path = spec_file_with(tmp_path, *field, value)
    try:
        load_study_spec(path, study="polling")
    except SpecError as error:
        check_refusal(str(error), path, field_path(*field))
    else:
        assert isinstance(load_study_spec(path, study="polling"), Spec)  # the value happened to be valid


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from([None, *TABLES, "params"]), key=identifiers, value=st.integers(0, 3))
def test_any_unknown_key_is_named_with_its_table(tmp_path, table, key, value):
    known = set(Spec.model_fields) if table is None else set(POLLING_PARAMS) if table == "params" else \
        set(getattr(Spec.model_fields[table].annotation, "model_fields", {}) or TABLES[table])
    assume(key not in known)
    path = spec_file_with(tmp_path, table, key, value)
    with pytest.raises(SpecError) as raised:
        load_study_spec(path, study="polling")
    message = str(raised.value)
    assert named_field(message, path) == field_path(table, key), message
    assert "unknown field; allowed: " in message and "\n" not in message


def test_union_fields_say_every_allowed_form_without_type_tags(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text('repeats = "often"\n')
    with pytest.raises(SpecError) as raised:
        load_study_spec(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:1: repeats: ") and "'auto'" in message and "integer" in message
    assert "constrained" not in message and "literal" not in message


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=bad_values, extra=st.sampled_from([[], ["--quick"], ["--stack", "x"],
                                                                              ["--results"], ["--plan", "--nope"]]))
def test_the_cli_answers_bad_specs_and_arguments_with_one_line_and_exit_2(tmp_path, field, value, extra,
                                                                         capfd, monkeypatch):
    from nvmflab.cli import main

    path = spec_file_with(tmp_path, *field, value)
    try:
        load_study_spec(path)
        spec_ok = True
    except SpecError:
        spec_ok = False
    assume(not spec_ok or extra)  # a valid spec with good arguments would plan: not this test's business
    monkeypatch.setattr("sys.argv", ["nvmflab", "run", str(path), "--plan", *extra])
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capfd.readouterr()
    assert exited.value.code == 2, (exited.value.code, captured.err)
    line = captured.err.strip()
    assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
    assert line.startswith("nvmflab: error: "), line
    if not extra:
        check_refusal(line.removeprefix("nvmflab: error: "), path, field_path(*field))
