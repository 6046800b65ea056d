"""Which transports each knob holds on (issue 38 item 3): our RDMA transport is one thread per port
that ignores cores, target mode, idle polling and placement, and socket options do not exist over
RDMA on any stack, so planning refuses such a point by name instead of comparing a pinned, polling
TCP target with an unpinned RDMA thread. No RDMA runs: the device probe and the builds' RDMA
support are faked, so a refusal here can only come from the knob registry."""

from __future__ import annotations

import pytest

from nvmflab import knobs
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.session import run_spec
from nvmflab.spec import validate_knobs
from nvmflab.stacks import get_stack
from nvmflab.study_spec import load_study_spec
from nvmflab.topology import rdma

NQN = "nqn.2024-01.io.nvmflab:s1"
ISSUE = "our RDMA transport runs one thread per port and ignores cores/mode/placement: issue 38"


@pytest.fixture
def rdma_here(monkeypatch):
    """An RDMA device whose port is up, and every stack side able to speak RDMA."""
    device = rdma.Device("rxe0", [rdma.Port(1, "Ethernet", "ACTIVE")])
    monkeypatch.setattr(rdma, "probe", lambda host, root="": ([device], []))
    for name in ("ours", "kernel", "spdk"):
        monkeypatch.setattr(type(get_stack(name)), "rdma_unavailable", lambda self, host, side: None)


def plan(tmp_path, knobs_toml: str, target_cores: str = "[0]") -> str:
    """`nvmflab run --plan` of a one-point sweep with these [knobs]; the plan's text."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "k.toml"
    path.write_text(f'name = "k"\nruntime = 0.2\nramp_time = 0\nrepeats = 2\n[topology]\nkind = "local"\n'
                    f'target_cores = {target_cores}\nhost_cores = [1]\n[backend]\nkind = "null"\nsize = "64MiB"\n'
                    f"[knobs]\n{knobs_toml}\n")
    return run_spec(load_study_spec(path), path, "sweep", tmp_path / "r", quick=False, plan=True).text


def refusal(plan_text: str) -> str | None:
    """The reason the plan's points are not run (each the same here), or None when they run."""
    reasons = {line.strip()[len("(not run: "):-1] for line in plan_text.splitlines() if "(not run: " in line}
    assert len(reasons) <= 1, reasons
    return reasons.pop() if reasons else None


@pytest.mark.parametrize("setting", ['target_mode = "poll"', "idle_poll_us = 50", "tos = 16"])
def test_a_knob_our_rdma_thread_ignores_is_refused_by_name(tmp_path, fake_env, rdma_here, setting):
    why = refusal(plan(tmp_path, f'transport = "rdma"\n{setting}'))
    assert why is not None and why.startswith(f'{setting} with transport = "rdma": the ours target honours it '
                                              "over tcp only ("), why
    if not setting.startswith("tos"):
        assert why.endswith(f"({ISSUE})")
    assert refusal(plan(tmp_path / "tcp", setting)) is None  # over TCP the same knob plans


def test_more_target_cores_than_one_are_refused_over_rdma(tmp_path, fake_env, rdma_here):
    why = refusal(plan(tmp_path, 'transport = "rdma"', target_cores="[0, 1]"))
    assert why == f'cores = 2 with transport = "rdma": the ours target honours it over tcp only ({ISSUE})'
    assert refusal(plan(tmp_path / "tcp", "", target_cores="[0, 1]")) is None


def test_a_run_where_every_point_is_refused_runs_nothing(tmp_path, fake_env):
    from conftest import nvmflab

    spec = tmp_path / "rd.toml"
    spec.write_text('name = "rd"\nruntime = 0.2\nramp_time = 0\n[topology]\nkind = "local"\ntarget_cores = [0]\n'
                    'host_cores = [1]\n[backend]\nkind = "null"\nsize = "64MiB"\n[knobs]\ntransport = "rdma"\n'
                    'target_mode = "poll"\n')
    done = nvmflab("run", str(spec), "--results", str(tmp_path / "r"), env=fake_env)
    assert done.returncode == 2, done.stderr
    # the knob is refused before any device is looked for, so the reason is the same with or without one
    assert 'target_mode = "poll" with transport = "rdma"' in done.stdout + done.stderr
    assert not (tmp_path / "perf.log").exists()  # no load generator ran


def test_rdma_at_the_defaults_plans(tmp_path, fake_env, rdma_here):
    text = plan(tmp_path, 'transport = "rdma"')
    assert refusal(text) is None and " -t rdma " in text


def test_socket_options_are_refused_over_rdma_on_every_stack(tmp_path, fake_env, rdma_here):
    assert refusal(plan(tmp_path, 'transport = "rdma"\nso_priority = 3')) == (
        'so_priority = 3 with transport = "rdma": it holds over tcp only (a socket option, and NVMe over RDMA has '
        "no socket)")
    for name in ("ours", "kernel", "spdk"):
        stack = get_stack(name)
        for side in knobs.SIDES:
            assert knobs.limit(stack.knob_map(side), knobs.KNOBS["busy_poll_us"], "rdma") is not None
            assert knobs.limit(stack.knob_map(side), knobs.KNOBS["tcp_congestion"], "rdma") is not None


def point(stack_knobs: dict, cores=(0,), reactor=None) -> Point:
    k = validate_knobs({"transport": "rdma", "numjobs": 1} | stack_knobs)
    setup = TargetSetup(cores=cores, mode=k["target_mode"], idle_poll_us=k["idle_poll_us"], in_capsule_data_size=8192,
                        so_priority=0, tos=0, busy_poll_us=0, transport="rdma",
                        subsystems=(Subsystem(nqn=NQN, backend="null", size=1 << 20, reactor=reactor),))
    return Point(study="s", leg="l", knobs=k, repeat=0, jobs=[PerfJob("main", k, (1,), nqn=NQN)], runtime=1,
                 ramp_time=0, target=setup)


def test_only_what_does_not_apply_is_refused_per_stack():
    ours, kernel, spdk = (get_stack(n) for n in ("ours", "kernel", "spdk"))
    # placement: ours binds nothing to a reactor over RDMA
    assert "placement = true" in knobs.transport_refusal(point({}, reactor=0), ours, ours)
    # nvmet_tcp's idle polling is a module parameter an nvmet rdma port does not use
    assert "nvmet_tcp module parameter" in knobs.transport_refusal(point({"idle_poll_us": 50}), kernel, kernel)
    # SPDK's poll groups serve RDMA too: several cores and its polling hold; nvme_rdma honours --tos
    polling = point({"target_mode": "poll", "completion": "poll"}, cores=(0, 1))
    assert knobs.transport_refusal(polling, spdk, spdk) is None
    assert knobs.transport_refusal(point({"tos": 16}), kernel, kernel) is None
    # our host's completion polling and in-capsule size hold over RDMA
    assert knobs.transport_refusal(point({"completion": "poll", "in_capsule_data_size": 4096}), ours, ours) is None


def test_the_knob_map_says_which_transports_each_knob_holds_on():
    table = knobs.markdown({n: get_stack(n) for n in ("ours", "kernel", "spdk")})
    rows = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines()[2:]}
    assert " | tcp | " in rows["so_priority"] and " | tcp, rdma | " in rows["target_mode"]
    assert "config `mode`; over tcp only (" + ISSUE + ")" in rows["target_mode"]
    assert {"cores", "placement"} <= set(rows) and ISSUE in rows["cores"]
