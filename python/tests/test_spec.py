import subprocess
import sys
from pathlib import Path

import pytest

from nvmflab.spec import SpecError, check_congestion
from nvmflab.study_spec import load_study_spec

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_bad_value_names_field_file_line_and_allowed_values(tmp_path):
    path = write(tmp_path, 'name = "x"\n\n[workload]\nbs = "4k"\nrw = "sideways"\n')
    with pytest.raises(SpecError) as err:
        load_study_spec(path)
    message = str(err.value)
    assert f"{path}:5:" in message
    assert "workload.rw" in message
    assert "'randread'" in message and "sideways" in message


def test_unknown_field_lists_the_allowed_ones(tmp_path):
    path = write(tmp_path, "[knobs]\ncompletion = \"poll\"\nidle_poll = 40\n")
    with pytest.raises(SpecError, match=r":3: knobs.idle_poll: unknown field; allowed: .*idle_poll_us"):
        load_study_spec(path)


def test_bad_sweep_value_names_the_sweep_key(tmp_path):
    path = write(tmp_path, "[sweep]\niodepth = [1, 0]\n")
    with pytest.raises(SpecError, match=r":2: sweep.iodepth: .*greater than or equal to 1"):
        load_study_spec(path)


def test_sweep_key_must_be_a_workload_or_knob_field(tmp_path):
    path = write(tmp_path, "[sweep]\nqueue_depth = [1, 2]\n")
    with pytest.raises(SpecError, match=r"sweep.queue_depth: not a workload or knob field; allowed: rw, bs"):
        load_study_spec(path)


def test_bad_size_is_explained(tmp_path):
    path = write(tmp_path, "[workload]\nbs = \"4q\"\n")
    with pytest.raises(SpecError, match=r":2: workload.bs: .*512, 4k, 128k"):
        load_study_spec(path)


def test_study_params_are_validated_before_running(tmp_path):
    path = write(tmp_path, 'study = "interference"\n[params]\nbg_load_pct = [10, "most"]\n')
    with pytest.raises(SpecError, match=r":3: params.bg_load_pct: 'most' is not allowed; allowed: integers 1..100 and \"max\"$"):
        load_study_spec(path)


@pytest.mark.parametrize("study, field, value, allowed", [
    ("polling", "iodepth", "[1, 0]", "greater than or equal to 1"),
    ("polling", "high_iodepth", "-1", "greater than or equal to 1"),
    ("overhead", "bapp_iodepth", "[0]", "greater than or equal to 1"),
    ("saturation", "numjobs", "[2, -3]", "greater than or equal to 1"),
    ("saturation", "resources", '["disk"]', "'initiator' or 'target'"),
    ("interference", "calibrate_iodepth", "[8, 0]", "greater than or equal to 1"),
    ("interference", "tapp_iodepth", "0", "greater than or equal to 1"),
])
def test_study_params_out_of_range_name_file_field_and_what_is_allowed(tmp_path, study, field, value, allowed):
    path = write(tmp_path, f'study = "{study}"\n[params]\n{field} = {value}\n')
    with pytest.raises(SpecError) as err:
        load_study_spec(path)
    assert str(err.value).startswith(f"{path}:3: params.{field}")
    assert allowed in str(err.value)


def test_a_bad_size_in_params_reads_cleanly(tmp_path):
    path = write(tmp_path, 'study = "overhead"\n[params]\nbs = ["4k", "4q"]\n')
    with pytest.raises(SpecError) as err:
        load_study_spec(path)
    assert str(err.value) == f"{path}:3: params.bs[1]: invalid size '4q': use bytes or 512, 4k, 128k, 1m, 64MiB, 1GiB"


def test_a_study_spec_refuses_a_sweep_table(tmp_path):
    path = write(tmp_path, 'study = "polling"\n[sweep]\niodepth = [1, 2]\n')
    with pytest.raises(SpecError, match=rf"^{path}:2: sweep: the polling study takes its swept values from \[params\]"):
        load_study_spec(path)
    path = write(tmp_path, '[sweep]\niodepth = [1, 2]\n')  # no `study`, but run as one
    with pytest.raises(SpecError, match=r":1: sweep: the saturation study"):
        load_study_spec(path, study="saturation")


def test_a_spec_for_another_study_is_refused(tmp_path):
    path = write(tmp_path, 'study = "polling"\n')
    with pytest.raises(SpecError, match=r":1: study: this spec is for 'polling', but `nvmflab study overhead` was asked"):
        load_study_spec(path, study="overhead")


def test_quick_without_a_quick_table_is_an_error(tmp_path):
    path = write(tmp_path, "runtime = 30\n")
    with pytest.raises(SpecError, match=r"--quick .* has no \[quick\] table"):
        load_study_spec(path, quick=True)


def test_sweep_is_the_cross_product_in_spec_order(tmp_path):
    path = write(tmp_path, '[workload]\nbs = "8k"\n[sweep]\niodepth = [1, 32]\ncompletion = ["poll", "event"]\n')
    points = load_study_spec(path).points()
    assert [(p["iodepth"], p["completion"]) for p in points] == [(1, "poll"), (1, "event"), (32, "poll"), (32, "event")]
    assert all(p["bs"] == 8192 and p["io_queues"] == 1 for p in points)


def test_quick_overrides_merge_deeply(tmp_path):
    path = write(tmp_path, "runtime = 30\n[backend]\nkind = \"ram\"\nsize = \"1GiB\"\n"
                           "[quick]\nruntime = 2\nbackend = { size = \"64MiB\" }\n")
    assert load_study_spec(path).runtime == 30
    quick = load_study_spec(path, quick=True)
    assert (quick.runtime, quick.backend.kind, quick.backend.size) == (2, "ram", 64 << 20)


@pytest.mark.parametrize("name", ["polling", "overhead", "saturation", "interference"])
def test_ready_study_specs_load(name):
    spec = load_study_spec(REPO / "studies" / f"{name}.toml", quick=True)
    # a quick run repeats a fixed number of times (item 12 of issue 22 sets how many), briefly
    assert spec.study == name and not spec.auto_repeats and spec.runtime <= 2


def test_spec_does_not_import_the_studies():
    # studies import spec for their types; spec importing studies back would be a cycle
    code = ("import sys, nvmflab.spec; "
            "print(sorted(m for m in sys.modules if m.startswith('nvmflab.studies')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_io_queues_rule_names_the_line_of_the_base_knob_and_of_a_swept_value(tmp_path):
    path = write(tmp_path, "[workload]\nnumjobs = 2\n[knobs]\nio_queues = 3\n")
    with pytest.raises(SpecError, match=rf"^{path}:4: knobs.io_queues: .* must equal numjobs \(2\)"):
        load_study_spec(path)
    path = write(tmp_path, "[knobs]\nio_queues = 1\n[sweep]\nnumjobs = [1, 4]\n")
    with pytest.raises(SpecError, match=rf"^{path}:4: sweep.numjobs: .* must equal numjobs \(4\)"):
        load_study_spec(path)


def test_congestion_names_follow_the_rust_rule():
    # The cases of nvmf_proto::congestion's test: 1-15 of a-z, 0-9, _ (TCP_CA_NAME_MAX is 16 with
    # the NUL). bench's --tcp-congestion calls this same check (test_bench_stats).
    for good in ["system", "cubic", "bbr", "reno", "h_tcp2", "abcdefghijklmno"]:
        assert check_congestion(good) == good
    for bad in ["", "Cubic", "bb r", "a-b", "cubic\n", "abcdefghijklmnop", "bbr;rm", "\u00e9"]:
        with pytest.raises(ValueError, match="kernel congestion control"):
            check_congestion(bad)
