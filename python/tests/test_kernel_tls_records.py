"""The kernel stack's TLS record layer is read, not stated (issue 37): /proc/net/tls_stat before and
after the host's connect, and over each point on the target, says whether kTLS carried the records;
where it cannot be read, or nothing moved, the layer is "unknown", never a guess. The fake kernel of
test_stack_kernel stands in, with a tls_stat file its connect advances."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
from test_tls_stacks import KEY, TlsKernel, _tls_setup, job, tls_kernel  # noqa: F401  (tls_kernel: a fixture)
from test_stack_kernel import fake  # noqa: F401  (a fixture tls_kernel needs)

from nvmflab import counters
from nvmflab.analysis.security import records_text
from nvmflab.runner import _records_read
from nvmflab.stacks import get_stack, kernel_tls

STAT = ("TlsCurrTxSw                     \t{cur}\nTlsCurrRxSw                     \t{cur}\nTlsCurrTxDevice"
        "                 \t0\nTlsCurrRxDevice                 \t0\nTlsTxSw                         \t{sw}\n"
        "TlsRxSw                         \t{sw}\nTlsTxDevice                     \t{dev}\nTlsRxDevice"
        "                     \t{dev}\nTlsDecryptError                 \t0\n")


def stat(sw: int, dev: int = 0, cur: int = 0) -> str:
    return STAT.format(sw=sw, dev=dev, cur=cur)


class CountingKernel(TlsKernel):
    """The TLS fake kernel whose `nvme connect` sets up `sockets` kTLS sockets in software."""

    sockets = 2

    def _connect(self, argv):
        path = self.root / kernel_tls.FILE
        if path.exists():
            before = kernel_tls.parse(path.read_text())
            path.write_text(stat(before["TlsTxSw"] + self.sockets, cur=self.sockets))
        return super()._connect(argv)


def test_tls_stat_is_parsed_and_a_difference_names_the_layer_it_shows():
    assert kernel_tls.parse(stat(7, 1) + "garbage line\nTlsTxSw x\n")["TlsTxSw"] == 7
    moved = kernel_tls.delta(kernel_tls.parse(stat(5)), kernel_tls.parse(stat(8, 2)))
    assert kernel_tls.records(moved) == ("ktls (software: TlsTxSw +3, TlsRxSw +3; device offload: TlsTxDevice +2, "
                                         "TlsRxDevice +2 in this machine's /proc/net/tls_stat)")
    assert kernel_tls.records(kernel_tls.delta(kernel_tls.parse(stat(5)), kernel_tls.parse(stat(5)))).startswith(
        "unknown (/proc/net/tls_stat counted no kTLS socket")
    assert kernel_tls.records(None, "no file") == "unknown (no file)"


def _host(fake_kernel, tmp_path, with_file: bool):  # noqa: F811
    host, stack = fake_kernel
    counting = CountingKernel(host.root, tlshd_running=True)
    if with_file:
        (host.root / "proc/net").mkdir(parents=True, exist_ok=True)
        (host.root / kernel_tls.FILE).write_text(stat(40))
    target = SimpleNamespace(address="10.0.0.2", port=4420, setup=SimpleNamespace(tls_key=KEY))
    return counting, stack, stack.open_host(job(tls="on"), target, counting, tmp_path)


def test_the_kernel_host_reads_its_record_layer_over_the_connect_and_the_runner_stores_it(tls_kernel, tmp_path):
    host, stack, session = _host(tls_kernel, tmp_path, with_file=True)
    assert session.tls_records == ("ktls (software: TlsTxSw +2, TlsRxSw +2 in this machine's /proc/net/tls_stat)")
    report = session.parse_output(json.dumps({"jobs": []}))
    session.close()
    assert report["nvmflab"]["tls_records"] == session.tls_records
    assert _records_read({"parts": [{"json": report, "log": "x"}]}) == session.tls_records
    assert _records_read({"parts": [{"json": {"jobs": []}, "log": "x"}]}) is None  # then the stack's own word


def test_an_unreadable_tls_stat_gives_unknown_never_ktls(tls_kernel, tmp_path):
    _, stack, session = _host(tls_kernel, tmp_path, with_file=False)
    session.close()
    assert session.tls_records.startswith("unknown (") and "tls_stat not readable" in session.tls_records
    assert get_stack("kernel").host_tls_records("").startswith("unknown (")


def test_the_kernel_target_reads_tls_stat_at_each_end_of_a_point(tls_kernel, tmp_path):
    host, stack = tls_kernel
    (host.root / "proc/net").mkdir(parents=True, exist_ok=True)
    (host.root / kernel_tls.FILE).write_text(stat(10))
    target = stack.start_target(_tls_setup(), host, tmp_path)
    try:
        before = target.stats()
        (host.root / kernel_tls.FILE).write_text(stat(13))  # the host's connect: three sockets accepted
        point = counters.diff(before, target.stats())
    finally:
        target.stop()
    rows = pd.DataFrame({"target_stack": ["kernel"], "host_stack": ["kernel"],
                         "target_counters_json": [json.dumps(point)], "host_tls_records": [None]})
    assert records_text(rows) == ("records: target ktls (software: TlsTxSw +3, TlsRxSw +3 in this machine's "
                                  "/proc/net/tls_stat), host unknown (not read)")
    # read only after the point (its first read failed): the totals since boot are not a difference
    half = counters.diff(kernel_tls.snapshot(None, "not readable"), kernel_tls.snapshot({"TlsTxSw": 13}, ""))
    assert kernel_tls.target_records(half).startswith("unknown (") and "ktls" not in kernel_tls.target_records(half)
    assert kernel_tls.target_records({}).startswith("unknown (")
