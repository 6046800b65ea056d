"""Which transports each knob holds on (issue 38 item 3): socket options, TLS and the digests do not
exist over RDMA on any stack, and a stack side may honour a knob over TCP only (ours sets no RDMA
service type for `tos`; nvmet's `idle_poll_us` is an nvmet_tcp parameter), so planning refuses such
a point by name. Our target's reactors serve RDMA queues as they serve TCP connections, so its mode,
idle polling, cores and placement plan over both. No RDMA runs: the device probe and the builds'
RDMA support are faked, so a refusal here can only come from the knob registry. Each plan sweeps
`transport` beside the knob, so one plan shows the RDMA point and the TCP one side by side."""

from __future__ import annotations

import json
import sys

import pytest

from nvmflab import knobs
from nvmflab.plan import PerfJob, Point, Subsystem, TargetSetup
from nvmflab.session import run_spec
from nvmflab.spec import validate_knobs
from nvmflab.stacks import get_stack
from nvmflab.study_spec import load_study_spec
from nvmflab.topology import rdma

NQN = "nqn.2024-01.io.nvmflab:s1"
NO_TOS = "a socket option of NVMe/TCP; ours sets no RDMA service type"
STACKS = ("ours", "kernel", "spdk")
# Knobs that act on a TCP socket, TCP itself or an NVMe/TCP PDU: no stack can honour them over RDMA.
TCP_ONLY = {"so_priority": 3, "busy_poll_us": 50, "tcp_congestion": "cubic", "tls": "on", "hdr_digest": True,
            "data_digest": True}
HEAD = ('runtime = 1\nramp_time = 0\nrepeats = 1\n[topology]\nkind = "local"\ntarget_cores = {cores}\n'
        'host_cores = [1]\n[backend]\nkind = "null"\nsize = "64MiB"\n')


@pytest.fixture
def rdma_here(monkeypatch):
    """An RDMA device whose port is up, and every stack side able to speak RDMA."""
    device = rdma.Device("rxe0", [rdma.Port(1, "Ethernet", "ACTIVE")])
    monkeypatch.setattr(rdma, "probe", lambda host, root="": ([device], []))
    for name in STACKS:
        monkeypatch.setattr(type(get_stack(name)), "rdma_unavailable", lambda self, host, side: None)


def plan(tmp_path, body: str, target_cores: str = "[0]", top: str = "") -> list[tuple[dict[str, str], str | None]]:
    """`nvmflab run --plan` of a spec (`top` keys, HEAD, then `body`): each point's knobs (as the
    plan prints them) and the reason it is not run, or None where it runs."""
    path = tmp_path / "k.toml"
    path.write_text(f'name = "k"\n{top}' + HEAD.format(cores=target_cores) + body)
    spec = load_study_spec(path)
    text = run_spec(spec, path, spec.study or "sweep", tmp_path / "r", quick=True, plan=True).text
    points: list[tuple[dict[str, str], str | None]] = []
    for line in text.splitlines():
        if line.startswith("# "):  # "# DESCRIPTION · LEG · repeat N · k=v, k=v, ..."
            pairs = line.rsplit(" · ", 1)[1].split(", ")
            points.append((dict(p.split("=", 1) for p in pairs if "=" in p), None))
        elif line.strip().startswith("(not run: "):
            points[-1] = (points[-1][0], line.strip()[len("(not run: "):-1])
    assert points, text
    return points


def by_transport(points) -> dict[str, list[tuple[dict[str, str], str | None]]]:
    out: dict[str, list] = {}
    for point in points:
        out.setdefault(point[0]["transport"], []).append(point)
    return out


def test_the_registry_names_the_transports_of_every_knob():
    assert set(knobs.TRANSPORTS) == {"tcp", "rdma"}
    for knob in [*knobs.KNOBS.values(), *knobs.SETUP.values()]:
        assert knob.transports and set(knob.transports) <= set(knobs.TRANSPORTS), knob.name
        assert knob.transports == knobs.TRANSPORTS or knob.why_not, f"{knob.name}: limited without a reason"
    assert {n for n, k in knobs.KNOBS.items() if k.transports == ("tcp",)} == set(TCP_ONLY)
    # a stack side narrows a knob only within the knob's own transports, and names only SETUP choices
    for name in STACKS:
        for side in knobs.SIDES:
            for knob_name, setting in get_stack(name).knob_map(side).items():
                if isinstance(setting, knobs.Setter):
                    assert set(setting.transports or ()) <= set(knobs.KNOBS[knob_name].transports), (name, knob_name)
                    assert set(setting.setup_tcp_only) <= set(knobs.SETUP), (name, knob_name)
                    assert not (setting.transports or setting.setup_tcp_only) or setting.why_not, (name, knob_name)


def test_the_knob_map_has_a_transports_column():
    table = knobs.markdown({n: get_stack(n) for n in STACKS})
    header, _, *body = table.splitlines()
    assert header.split(" | ")[2] == "transports"
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in body}
    assert set(rows) == set(knobs.KNOBS) | set(knobs.SETUP)
    for name, cells in rows.items():
        owner = knobs.KNOBS.get(name) or knobs.SETUP[name]
        assert cells[2] == ", ".join(owner.transports), name
    assert rows["target_mode"][3] == "config `mode`"  # the reactors serve RDMA queues too
    assert "over tcp only (" + NO_TOS + ")" in rows["tos"][3]


def test_busy_polling_is_refused_over_rdma_by_name_and_plans_over_tcp(tmp_path, fake_env, rdma_here):
    points = by_transport(plan(tmp_path, '[sweep]\ntransport = ["tcp", "rdma"]\nbusy_poll_us = [0, 50]\n'))
    assert [why for _, why in points["tcp"]] == [None, None]
    refused = {k["busy_poll_us"]: why for k, why in points["rdma"]}
    assert refused["0"] is None  # RDMA at the defaults plans
    assert refused["50"] == ('busy_poll_us = 50 with transport = "rdma": it holds over tcp only (a socket option, '
                             "and NVMe over RDMA has no socket)")


@pytest.mark.parametrize("name", sorted(TCP_ONLY))
@pytest.mark.parametrize("stack", STACKS)
def test_a_tcp_only_knob_is_refused_over_rdma_on_every_stack(stack, name):
    """Refused from the knob's own row, before any stack map is asked (a stack lacking the knob
    would refuse it anyway, but not by naming the transport)."""
    chosen = get_stack(stack)
    why = knobs.transport_refusal(point({name: TCP_ONLY[name]}), chosen, chosen)
    assert why == (f'{name} = {json.dumps(TCP_ONLY[name])} with transport = "rdma": it holds over tcp only '
                   f"({knobs.TCP_ONLY[name]})")


def test_our_target_takes_mode_and_idle_polling_over_rdma_but_not_tos(tmp_path, fake_env, rdma_here):
    points = by_transport(plan(tmp_path, '[sweep]\ntransport = ["tcp", "rdma"]\ntarget_mode = ["event", "poll"]\n'
                                         "idle_poll_us = [0, 50]\ntos = [0, 16]\n"))
    assert len(points["tcp"]) == 8 and all(why is None for _, why in points["tcp"])  # over TCP each plans
    for k, why in points["rdma"]:
        if k["tos"] == "0":  # the reactors serve RDMA queues: mode and idle polling hold
            assert why is None, (k, why)
        else:
            assert why == ('tos = 16 with transport = "rdma": the ours target honours it over tcp only '
                           f"({NO_TOS})"), (k, why)


def test_more_target_cores_than_one_plan_over_rdma(tmp_path, fake_env, rdma_here):
    points = by_transport(plan(tmp_path, '[sweep]\ntransport = ["tcp", "rdma"]\n', target_cores="[0, 1]"))
    assert points["tcp"][0][1] is None and points["rdma"][0][1] is None


def test_the_kernel_target_refuses_its_nvmet_tcp_parameter_over_rdma(tmp_path, fake_env, rdma_here):
    points = by_transport(plan(tmp_path, '[sweep]\ntransport = ["tcp", "rdma"]\nidle_poll_us = [0, 50]\n',
                               top='stack = "kernel"\n'))
    assert [why for _, why in points["tcp"]] == [None, None]
    refused = {k["idle_poll_us"]: why for k, why in points["rdma"]}
    assert refused["0"] is None
    assert refused["50"] == ('idle_poll_us = 50 with transport = "rdma": the kernel target honours it over tcp only '
                             "(an nvmet_tcp module parameter, which an nvmet rdma port does not use)")


def test_the_transports_study_plans_its_rdma_points(tmp_path, fake_env, rdma_here):
    """Its default knobs hold over RDMA on every stack, our target's second core too."""
    points = plan(tmp_path, '[params]\nconfigs = ["rdma"]\niodepth = [1]\nbs = ["4k"]\ncores = [1, 2]\n',
                  top='study = "transports"\n')
    refused = {(k["stack"], k["app"], k.get("cores")): why for k, why in points if why is not None}
    assert refused == {}
    assert ("ours", "2") in {(k["stack"], str(k.get("cores"))) for k, _ in points}
    assert {k["stack"] for k, _ in points} == set(STACKS) and all(k["transport"] == "rdma" for k, _ in points)


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`nvmflab ARGS` in this process (its imports are already paid for): exit status, stdout+stderr."""
    from nvmflab.cli import main

    monkeypatch.setattr(sys, "argv", ["nvmflab", *args])
    with pytest.raises(SystemExit) as done:
        main()
    said = capsys.readouterr()
    return done.value.code, said.out + said.err


REFUSED_SPEC = '[knobs]\ntransport = "rdma"\ntos = 16\n'


def test_the_plan_command_shows_the_refusal_without_a_traceback(tmp_path, fake_env, monkeypatch, capsys):
    spec = tmp_path / "rd.toml"
    spec.write_text('name = "rd"\n' + HEAD.format(cores="[0]") + REFUSED_SPEC)
    code, said = cli(monkeypatch, capsys, "run", str(spec), "--plan")
    assert code == 0, said
    # the knob is refused before any device is looked for, so the reason is the same with or without one
    assert '(not run: tos = 16 with transport = "rdma": the ours target' in said
    assert "Traceback" not in said and "internal error" not in said


@pytest.mark.long  # the run writes its report: 3-5 s on a busy 2-core VM; the plan test above is in make test
def test_a_run_where_every_point_is_refused_says_why_and_exits_2(tmp_path, fake_env, monkeypatch, capsys):
    spec = tmp_path / "rd.toml"
    spec.write_text('name = "rd"\n' + HEAD.format(cores="[0]") + REFUSED_SPEC)
    code, said = cli(monkeypatch, capsys, "run", str(spec), "--results", str(tmp_path / "r"))
    assert code == 2, said
    assert 'tos = 16 with transport = "rdma"' in said
    assert "Traceback" not in said and "internal error" not in said
    assert not (tmp_path / "perf.log").exists()  # no load generator ran


def point(stack_knobs: dict, cores=(0,), reactor=None) -> Point:
    k = validate_knobs({"transport": "rdma", "numjobs": 1} | stack_knobs)
    setup = TargetSetup(cores=cores, mode=k["target_mode"], idle_poll_us=k["idle_poll_us"], in_capsule_data_size=8192,
                        so_priority=0, tos=0, busy_poll_us=0, transport="rdma",
                        subsystems=(Subsystem(nqn=NQN, backend="null", size=1 << 20, reactor=reactor),))
    return Point(study="s", leg="l", knobs=k, repeat=0, jobs=[PerfJob("main", k, (1,), nqn=NQN)], runtime=1,
                 ramp_time=0, target=setup)


def test_only_what_does_not_apply_is_refused_per_stack():
    ours, kernel, spdk = (get_stack(n) for n in STACKS)
    # placement, several cores and polling: our reactors serve RDMA queues as they serve TCP connections
    assert knobs.transport_refusal(point({"target_mode": "poll", "idle_poll_us": 50}, cores=(0, 1), reactor=1),
                                   ours, ours) is None
    assert knobs.transport_refusal(point({"tos": 16}), ours, ours) == (
        f'tos = 16 with transport = "rdma": the ours target honours it over tcp only ({NO_TOS})')
    # SPDK's poll groups serve RDMA too: several cores, placement and its polling hold; nvme_rdma honours --tos
    polling = point({"target_mode": "poll", "completion": "poll"}, cores=(0, 1), reactor=1)
    assert knobs.transport_refusal(polling, spdk, spdk) is None
    assert knobs.transport_refusal(point({"tos": 16}), kernel, kernel) is None
    # our host's completion polling, in-capsule size, SQ flow control and DH-HMAC-CHAP hold over RDMA
    held = {"completion": "poll", "in_capsule_data_size": 4096, "sqflow": "off", "dhchap": "ffdhe2048"}
    assert knobs.transport_refusal(point(held), ours, ours) is None
