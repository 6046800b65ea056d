"""Choosing stacks: the [stack] table and CLI flags, the knob map and its refusals, --plan, and
the stack names and versions every measurement carries."""

import sqlite3
from pathlib import Path

import pytest
from conftest import nvmflab

from nvmflab.session import with_stack_defaults
from nvmflab.spec import Knobs, SpecError, load_spec
from nvmflab.knobs import Setter
from nvmflab.stacks import Fixed, StackError, get_stack
from nvmflab.stacks.ours import OurStack
from nvmflab.store import ResultsStore

DEFAULTS = Knobs().model_dump()


class PollingOnly(OurStack):
    """A stack like SPDK's: the host always polls, the target has no tos."""

    name = "polling-only"
    host_knobs = {k: v for k, v in OurStack.host_knobs.items() if k != "tos"} | {
        "completion": Fixed("poll", "its host always polls")}
    target_knobs = {k: v for k, v in OurStack.target_knobs.items() if k != "tos"}


def spec_with(tmp_path: Path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_spec(path)


def test_bare_stack_sets_both_sides_and_the_table_sets_each(tmp_path):
    assert spec_with(tmp_path, 'stack = "spdk"\n').stack.model_dump(exclude={"hostnqn", "tls_key"}) == {"target": "spdk", "host": "spdk"}
    assert spec_with(tmp_path, '[stack]\ntarget = "kernel"\n').stack.model_dump(exclude={"hostnqn", "tls_key"}) == {"target": "kernel",
                                                                                      "host": "ours"}
    assert spec_with(tmp_path, 'name = "x"\n').stack.model_dump(exclude={"hostnqn", "tls_key"}) == {"target": "ours", "host": "ours"}


def test_unknown_stack_is_refused_with_file_line_and_allowed_names(tmp_path):
    with pytest.raises(SpecError, match=r"s\.toml:2: stack\.host: .*'ours', 'kernel' or 'spdk'"):
        spec_with(tmp_path, '[stack]\nhost = "rdma"\n')


def test_a_knob_a_stack_lacks_is_refused_naming_knob_and_stack():
    stack = PollingOnly()
    stack.check_knobs(DEFAULTS | {"completion": "poll"}, "host", DEFAULTS)  # what it always does: fine
    with pytest.raises(StackError, match=r"knob completion = 'event': the polling-only host cannot do it "
                                         r"\(its host always polls\)"):
        stack.check_knobs(DEFAULTS | {"completion": "event"}, "host", DEFAULTS)
    with pytest.raises(StackError, match=r"knob tos = 16: the polling-only target has no such setting"):
        stack.check_knobs(DEFAULTS | {"tos": 16}, "target", DEFAULTS)
    stack.check_knobs(DEFAULTS, "target", DEFAULTS)  # defaults of knobs it lacks are accepted
    # a target-side knob is not the host's business
    stack.check_knobs(DEFAULTS | {"completion": "poll", "target_mode": "poll", "idle_poll_us": 40}, "host", DEFAULTS)


def test_unset_knobs_take_the_value_a_stack_always_has_and_set_ones_stay(tmp_path):
    ours, polling = OurStack(), PollingOnly()
    unset = spec_with(tmp_path, 'name = "x"\n')
    assert with_stack_defaults(unset, ours, polling).knobs.completion == "poll"
    assert with_stack_defaults(unset, ours, ours).knobs.completion == "event"
    explicit = spec_with(tmp_path, '[knobs]\ncompletion = "event"\n')
    assert with_stack_defaults(explicit, ours, polling).knobs.completion == "event"


def test_every_stack_maps_every_knob_it_has_to_a_setting_of_its_own():
    for name in ("ours", "kernel", "spdk"):
        try:
            stack = get_stack(name)
        except ImportError:
            pytest.skip(f"{name} stack module not present")
        for side in ("target", "host"):
            for knob, setting in stack.knob_map(side).items():
                assert knob in DEFAULTS, f"{name} {side} maps unknown knob {knob}"
                assert isinstance(setting, Fixed) or (isinstance(setting, Setter) and setting.doc), (name, knob)


def test_cli_stack_flags_reach_the_run_and_refusals_come_before_anything_runs(tmp_path, fake_env, tiny_spec):
    results = tmp_path / "r"
    # tiny sweeps completion = event, which SPDK's host cannot do: refused, nothing run, nothing made
    done = nvmflab("run", str(tiny_spec), "--results", str(results), "--host-stack", "spdk", env=fake_env)
    assert done.returncode == 2
    assert "knob completion = 'event': the spdk host cannot do it" in done.stderr and "nothing was run" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "perf.log").exists()
    bad = nvmflab("run", str(tiny_spec), "--stack", "rdma", env=fake_env)
    assert bad.returncode == 2 and "rdma" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_prints_every_command_and_runs_nothing(tmp_path, fake_env, tiny_spec):
    results = tmp_path / "r"
    done = nvmflab("run", str(tiny_spec), "--results", str(results), "--plan", env=fake_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    perf_lines = [line for line in lines if "nvmf-perf run" in line]
    assert len(perf_lines) == 8  # 2 iodepths x 2 completions x 2 repeats
    assert sum("--iodepth 4" in line and "--completion poll" in line for line in perf_lines) == 2
    assert any("[local] nvmf-target --config" in line for line in lines)
    assert not results.exists() and not (tmp_path / "perf.log").exists()


def test_rows_carry_both_stack_names_and_versions(tmp_path, fake_env, tiny_spec):
    done = nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), "--stack", "ours", env=fake_env)
    assert done.returncode == 0, done.stderr
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["target_stack"]) == {"ours"} and set(frame["host_stack"]) == {"ours"}
    assert frame["host_stack_version"].str.contains("nvmf-perf 0.0.0-fake").all()
    assert frame["target_stack_version"].str.contains("nvmf-target").all()


def test_a_store_from_before_stacks_gains_the_columns_and_reads_as_ours(tmp_path, fake_env, tiny_spec):
    assert nvmflab("run", str(tiny_spec), "--results", str(tmp_path / "r"), env=fake_env).returncode == 0
    db = sqlite3.connect(tmp_path / "r" / "results.sqlite")
    with db:  # make it look like a store written before stacks were chosen
        db.execute("ALTER TABLE measurements DROP COLUMN target_stack_version")
        db.execute("ALTER TABLE measurements DROP COLUMN host_stack_version")
        db.execute("UPDATE points SET knobs_json = json_remove(knobs_json, '$.target_stack', '$.host_stack')")
        db.execute("UPDATE measurements SET knobs_json = json_remove(knobs_json, '$.target_stack', '$.host_stack')")
    db.close()
    frame = ResultsStore(tmp_path / "r").measurements()
    assert set(frame["target_stack"]) == {"ours"} and frame["target_stack_version"].isna().all()


# -- a host NQN: targets admit only it, load generators connect as it ---------------------------

def test_hostnqn_must_look_like_an_nqn(tmp_path):
    assert spec_with(tmp_path, '[stack]\nhostnqn = "nqn.2024-01.io.lab:h1"\n').stack.hostnqn == "nqn.2024-01.io.lab:h1"
    with pytest.raises(SpecError, match=r"stack\.hostnqn"):
        spec_with(tmp_path, '[stack]\nhostnqn = "--hostnqn"\n')


def test_every_stack_admits_only_the_given_host_and_connects_as_it():
    from nvmflab.plan import PerfJob, Subsystem, TargetSetup
    from nvmflab.stacks import spdk
    from nvmflab.stacks.ours import render_config

    setup = TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(Subsystem("nqn.x:s", "null", 1 << 20),),
                        allowed_hosts=("nqn.x:h",))
    config = render_config(setup, 4420, 9100)
    assert "allow_any_host = false" in config and 'hosts = ["nqn.x:h"]' in config
    assert "allow_any_host = true" in render_config(TargetSetup(**{**setup.__dict__, "allowed_hosts": ()}), 1, 2)
    rpcs = spdk.target_rpcs(setup, 4420)
    create = next(c for c in rpcs if c[0] == "nvmf_create_subsystem")
    assert "-a" not in create and ["nvmf_subsystem_add_host", "nqn.x:s", "nqn.x:h"] in rpcs
    job = PerfJob("main", DEFAULTS | {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "rwmixread": 50,
                                      "rate_iops": 0, "size": None, "io_queues": 1, "completion": "poll"},
                  cpus=(1,), nqn="nqn.x:s", hostnqn="nqn.x:h")
    assert "hostnqn:nqn.x:h" in " ".join(spdk.perf_args(job, "127.0.0.1", 4420, 1, 0))
    argv = OurStack()._argv_head(job, "127.0.0.1", 4420, "nvmf-perf")
    assert argv[argv.index("--hostnqn") + 1] == "nqn.x:h"


def test_our_target_refuses_a_host_it_does_not_admit(tmp_path):
    import subprocess

    from nvmflab.plan import Subsystem, TargetSetup
    from nvmflab.tools import find_tool
    from nvmflab.topology.local import LocalHost

    perf = find_tool("nvmf-perf")
    if perf is None or "fakebin" in str(perf):
        pytest.skip("real nvmf-target/nvmf-perf not built")
    setup = TargetSetup(cores=(0,), mode="event", idle_poll_us=0, in_capsule_data_size=8192, so_priority=0, tos=0,
                        busy_poll_us=0, subsystems=(Subsystem("nqn.x:s", "ram", 1 << 20),),
                        allowed_hosts=("nqn.x:admitted",))
    target = OurStack().start_target(setup, LocalHost(workdir=tmp_path), tmp_path)
    try:
        def identify(hostnqn):
            return subprocess.run([str(perf), "identify", "-t", "tcp", "-a", "127.0.0.1", "-s", str(target.port),
                                   "-n", "nqn.x:s", "--hostnqn", hostnqn], capture_output=True, text=True, timeout=30)
        assert identify("nqn.x:admitted").returncode == 0
        refused = identify("nqn.x:stranger")
        assert refused.returncode != 0
    finally:
        target.stop()


# -- refusals a study turns into skipped points, and the ones that end a run before it starts -------

def test_spdk_host_refuses_local_jobs_and_fractional_seconds_before_running(tmp_path):
    from nvmflab.plan import PerfJob, Point
    from nvmflab.session import SessionError, check_points

    spdk = get_stack("spdk")
    knobs = DEFAULTS | {"rw": "randread", "bs": 4096, "iodepth": 1, "numjobs": 1, "rwmixread": 50, "completion": "poll"}
    local = PerfJob("main", knobs, (1,), local_path="/tmp/x.img")
    remote = PerfJob("main", knobs, (1,), nqn="nqn.x:s")
    assert "cannot drive a file" in spdk.job_refusal(local)
    assert spdk.job_refusal(remote) is None
    assert get_stack("ours").job_refusal(local) is None
    with pytest.raises(StackError, match="whole seconds"):
        spdk.check_timing(0.5, 0)
    spdk.check_timing(2, 1)

    class Planner:  # the one thing check_points asks of a runner
        def stacks_for(self, point):
            return get_stack("ours"), spdk

    point = Point(study="s", leg="l", knobs={}, repeat=0, jobs=[remote], runtime=0.3, ramp_time=0)
    with pytest.raises(SessionError, match="whole seconds.*nothing was run"):
        check_points([("d", point)], Planner())
    point.runtime, point.jobs = 1, [local]
    with pytest.raises(SessionError, match="cannot drive a file"):
        check_points([("d", point)], Planner())
    point.skip_reason = "skipped by the study"
    check_points([("d", point)], Planner())
