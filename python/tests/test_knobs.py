"""The knob registry (knobs.py): built from spec.Knobs, applied by the stacks, documented from the table."""

from pathlib import Path

import pytest

from nvmflab import knobs
from nvmflab.plan import PerfJob
from nvmflab.spec import Knobs, validate_knobs
from nvmflab.stacks import STACKS, StackError, get_stack
from nvmflab.stacks.__main__ import knob_table, main
from nvmflab.stacks.kernel import connect_argv
from nvmflab.stacks.ours import HOST_KNOBS, OurStack, render_config
from nvmflab.stacks.spdk import perf_args

DOCS = Path(__file__).resolve().parents[2] / "docs" / "stacks.md"
# A value other than the default for every knob, each one a value some stack can set.
OTHER = {"completion": "poll", "target_mode": "poll", "idle_poll_us": 50, "hdr_digest": True, "data_digest": True,
         "so_priority": 3, "tos": 16, "busy_poll_us": 40, "in_capsule_data_size": 4096, "io_queues": 2,
         "tls": "on", "dhchap": "ffdhe2048", "transport": "rdma", "sqflow": "off",
         "tcp_congestion": "cubic"}


def test_the_registry_is_the_spec_knobs_with_their_sides():
    assert list(knobs.KNOBS) == list(Knobs.model_fields)
    assert set(OTHER) == set(knobs.KNOBS)
    assert knobs.KNOBS["completion"].sides == ("host",) and knobs.KNOBS["tos"].sides == ("target", "host")
    for stack in map(get_stack, STACKS):
        for side in knobs.SIDES:
            assert set(stack.knob_map(side)) <= {n for n, k in knobs.KNOBS.items() if side in k.sides}, stack.name


def test_docs_knob_map_is_the_generated_table():
    section = knobs.generated_section(DOCS.read_text())
    assert section is not None, "docs/stacks.md lost its generated knob map section"
    assert section == knob_table(), "docs/stacks.md's knob map differs from the code: run " \
                                    "`python -m nvmflab.stacks docs/stacks.md`"


def test_the_doc_writer_replaces_only_its_section(tmp_path):
    path = tmp_path / "stacks.md"
    path.write_text(f"before\n{knobs.BEGIN}\nold table\n{knobs.END}\nafter\n")
    assert main([str(path)]) == 0
    text = path.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    assert knobs.generated_section(text) == knob_table()
    (tmp_path / "plain.md").write_text("no section\n")
    assert main([str(tmp_path / "plain.md")]) == 2


def ours_host_argv(**over):
    k = validate_knobs({"numjobs": 2} | over)
    job = PerfJob(role="main", knobs=k, cpus=(1, 2), nqn="nqn.2024-01.io.nvmflab:s1")
    return OurStack().plan_host(job, "127.0.0.1", 4420, _Local())[0]


class _Local:
    def describe(self, argv):
        return " ".join(argv)


@pytest.mark.parametrize("knob", [k for k in HOST_KNOBS if k != "io_queues"])
def test_every_ours_host_knob_reaches_nvmf_perf(knob):
    assert ours_host_argv(**{knob: OTHER[knob]}) != ours_host_argv(), f"{knob} changes nothing nvmf-perf is given"


def test_ours_io_queues_is_carried_by_numjobs_and_a_different_count_refused():
    assert "--numjobs 2" in ours_host_argv(io_queues=2)
    with pytest.raises(StackError, match="one I/O queue pair per job"):
        knobs.apply(HOST_KNOBS, "host", {"io_queues": 3, "numjobs": 2})


def test_every_ours_target_knob_is_a_config_line():
    from nvmflab.plan import Subsystem, TargetSetup

    setup = TargetSetup(cores=(0,), mode="poll", idle_poll_us=50, in_capsule_data_size=4096, so_priority=3, tos=16,
                        busy_poll_us=40, subsystems=(Subsystem(nqn="nqn.2024-01.io.nvmflab:s1", backend="null",
                                                               size=1 << 20, block_size=512),), tcp_congestion="cubic")
    config = render_config(setup, 4420, 9100)
    for line in ('mode = "poll"', "idle_poll_us = 50", "in_capsule_data_size = 4096", "so_priority = 3",
                 "tos = 16", "busy_poll_us = 40", 'tcp_congestion = "cubic"'):
        assert f"\n{line}\n" in config
    system = render_config(TargetSetup(**{**setup.__dict__, "tcp_congestion": "system"}), 4420, 9100)
    assert "tcp_congestion" not in system, "the machine's congestion control is the target's own default"


@pytest.mark.parametrize("value", ["Cubic", "cubic;reno", "", "a_name_of_16_byt"])
def test_tcp_congestion_takes_kernel_names_only(value):
    with pytest.raises(ValueError, match="tcp_congestion"):
        validate_knobs({"tcp_congestion": value})
    assert "--tcp_congestion" not in ours_host_argv(), "no option at the default: the machine's choice stands"
    assert "--tcp_congestion bbr" in ours_host_argv(tcp_congestion="bbr")


def test_kernel_and_spdk_hosts_take_their_options_from_the_setters():
    k = validate_knobs({"numjobs": 2, "completion": "poll", "tos": 16, "hdr_digest": True, "data_digest": True})
    job = PerfJob(role="main", knobs=k, cpus=(1, 2), nqn="nqn.2024-01.io.nvmflab:s1")
    argv = connect_argv(job, "127.0.0.1", 4420, "nqn.h", "id")
    assert {"--nr-io-queues=2", "--nr-poll-queues=2", "--tos=16", "--hdr-digest", "--data-digest"} <= set(argv)
    spdk = perf_args(PerfJob(role="main", knobs=k | {"io_queues": 4}, cpus=(1, 2), nqn="nqn.x"), "a", 1, 5, 0)
    assert spdk[spdk.index("-P") + 1] == "2" and {"-H", "-I"} <= set(spdk)


def test_kernel_target_module_parameters_and_port_attribute_come_from_the_setters():
    from nvmflab.plan import TargetSetup
    from nvmflab.stacks.kernel import target_settings

    setup = TargetSetup(cores=(0,), mode="event", idle_poll_us=50, in_capsule_data_size=4096, so_priority=3, tos=0,
                        busy_poll_us=0, subsystems=())
    assert target_settings(setup) == ([("idle_poll_period_usecs", "50"), ("so_priority", "3")],
                                      [("param_inline_data_size", "4096")])


def test_a_knob_added_later_keeps_older_point_keys_at_its_default():
    from nvmflab.plan import KEYLESS_DEFAULTS, point_key

    assert all(Knobs().model_dump()[k] == v for k, v in KEYLESS_DEFAULTS.items()), "KEYLESS_DEFAULTS drifted"
    before = {k: v for k, v in Knobs().model_dump().items() if k not in KEYLESS_DEFAULTS}
    key = point_key("overhead", "ours", before, 0, 10.0, 2.0)
    assert point_key("overhead", "ours", Knobs().model_dump(), 0, 10.0, 2.0) == key
    assert point_key("overhead", "ours", Knobs(sqflow="off").model_dump(), 0, 10.0, 2.0) != key
    assert point_key("overhead", "ours", Knobs(tcp_congestion="cubic").model_dump(), 0, 10.0, 2.0) != key
