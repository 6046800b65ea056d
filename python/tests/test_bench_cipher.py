"""bench/nvmfbench/cipher.py and bound.py: the AES-GCM rate from `openssl speed` (fake output and a
fake openssl), and each TLS row's cipher-bound limit, per-round interval and goal (issue 40 item 1)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from nvmfbench import bound, cipher, goals, report, stats  # noqa: E402

SPEED_MR = """Doing AES-128-GCM for 1s on 4096 size blocks: +DT:AES-128-GCM:1:4096
+R:515587:AES-128-GCM:0.740000
+H:4096
+F:25:AES-128-GCM:2853843718.92
"""


def test_the_rate_is_read_from_openssl_speeds_machine_readable_line():
    assert cipher.parse_speed(SPEED_MR) == pytest.approx(2853843718.92)
    with pytest.raises(cipher.CipherError, match=r"no rate line .*unknown option"):
        cipher.parse_speed("speed: unknown option '-aead'\nspeed: Use -help for summary.\n")
    with pytest.raises(cipher.CipherError, match="rate of 0"):
        cipher.parse_speed("+F:25:AES-128-GCM:0.00\n")


def test_the_measurement_is_pinned_to_the_core_in_a_tls_like_sequence():
    cmd = cipher.speed_command(3, 16384, "decrypt", 2)
    assert cmd[:3] == ["taskset", "-c", "3"]
    assert cmd[3:] == ["openssl", "speed", "-mr", "-aead", "-decrypt", "-evp", "aes-128-gcm", "-bytes", "16384",
                       "-seconds", "2"]
    assert "-decrypt" not in cipher.speed_command(0, 4096, "encrypt", 1)
    with pytest.raises(ValueError, match="sideways"):
        cipher.speed_command(0, 4096, "sideways", 1)


def _fake_tools(tmp_path: Path, openssl_body: str) -> str:
    """A PATH whose taskset runs its command unpinned and whose openssl is `openssl_body`."""
    for name, body in (("taskset", 'shift 2; exec "$@"'), ("openssl", openssl_body)):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


def test_a_round_measures_every_size_and_direction_and_records_failures(tmp_path, monkeypatch):
    # the fake's rate is the buffer size in MB/s, doubled for encryption: the records must match their size and op
    body = ('size=""; enc=2; while [ $# -gt 0 ]; do [ "$1" = -bytes ] && size=$2; [ "$1" = -decrypt ] && enc=1; '
            'shift; done; echo "+F:25:AES-128-GCM:$((size * 1000000 * enc))"')
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, body))
    found = cipher.measure_round(0, 4)
    assert [(r["size"], r["op"]) for r in found] == [(s, op) for s in cipher.SIZES for op in cipher.OPS]
    for r in found:
        assert r["round"] == 4 and r["rate_bps"] == r["size"] * 1e6 * (2 if r["op"] == "encrypt" else 1)
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, 'echo "Error setting cipher" >&2; exit 1'))
    failed = cipher.measure_round(0, 0)
    assert all("exited 1: Error setting cipher" in r["error"] and "rate_bps" not in r for r in failed)


def test_the_limit_is_the_plain_time_per_io_plus_the_cipher_time():
    # issue 40's Intel figures: 927 K plain at QD32, 3.9 GB/s at 4 KiB -> about 470 K
    rate4k = {"encrypt": 3.9e9, "decrypt": 3.9e9}
    assert cipher.limit_iops(927e3, cipher.cipher_seconds(4096, 32, rate4k)) == pytest.approx(470e3, rel=0.01)
    # at QD1 the sealing and the opening side take turns: 97 K plain -> about 81 K
    assert cipher.limit_iops(97e3, cipher.cipher_seconds(4096, 1, rate4k)) == pytest.approx(80.6e3, rel=0.01)
    # with many in flight the slower direction alone bounds it
    assert cipher.cipher_seconds(4096, 32, {"encrypt": 4e9, "decrypt": 2e9}) == pytest.approx(4096 / 2e9)
    # 128 KiB: 16 KiB records at 5.5 GB/s, 4.6 GiB/s plain -> about 2.5 GiB/s
    plain = 4.6 * (1 << 30) / 131072
    limit = cipher.limit_iops(plain, cipher.cipher_seconds(131072, 32, {"encrypt": 5.5e9, "decrypt": 5.5e9}))
    assert limit * 131072 / (1 << 30) == pytest.approx(2.43, abs=0.02)
    with pytest.raises(ValueError):
        cipher.limit_iops(0, 1e-6)


def _rates(rnd, r4k, r16k, r128k=9e9):
    return [{"round": rnd, "core": 0, "size": size, "op": op, "rate_bps": rate}
            for size, rate in ((4096, r4k), (16384, r16k), (131072, r128k)) for op in cipher.OPS]


def test_a_large_io_takes_the_rate_of_its_16_kib_records_as_the_median_over_rounds():
    records = _rates(0, 2e9, 4e9) + _rates(1, 3e9, 5e9) + _rates(2, 4e9, 6e9)
    records.append({"round": 2, "core": 0, "size": 4096, "op": "decrypt", "error": "killed"})
    assert cipher.rates(records, 131072) == {"encrypt": 5e9, "decrypt": 5e9}  # not the 9 GB/s of 128 KiB buffers
    assert cipher.rates(records, 4096) == {"encrypt": 3e9, "decrypt": 3e9}
    assert cipher.rates([r for r in records if r["op"] == "encrypt"], 4096) is None
    assert cipher.rates(records, 512) is None  # no size measured at or below its record


def run(target, host, work, iops, rnd, noisy=False):
    return {"target": target, "host": host, "work": work, "iops": iops, "bw_bytes": iops * 4096,
            "lat_mean_ns": 1000.0, "lat_p99_99_ns": None, "noisy": noisy, "noise_pct": 1.0, "round": rnd}


def test_tls_rows_against_their_limit_per_round_and_as_goals():
    write = "4k randwrite QD32"
    # cipher at 4.096 GB/s: 1 us per 4 KiB I/O; plain at 1 M IOPS (1 us): limit 500 K in every round
    records = [r for rnd in range(3) for r in _rates(rnd, 4.096e9, 8e9)]
    runs = []
    for rnd, tls in enumerate((470e3, 475e3, 465e3)):
        runs += [run("ours", "ours", write, 1e6, rnd), run("ours-tls", "ours-tls", write, tls, rnd)]
    runs += [run("ours", "ours", goals.QD32, 1e6, 0), run("ours-tls", "ours-tls", goals.QD32, 200e3, 0)]
    runs.append(run("ours-tls", "ours-tls", write, 10e3, 3, noisy=True))  # left out with its round
    table = stats.cells(runs)
    rows = {(b["pair"], b["work"]): b for b in bound.bound_rows(table, runs, records)}
    w = rows[("ours x ours", write)]
    assert w["limit_iops"] == pytest.approx(500e3) and w["value"] == pytest.approx(0.94)
    mean, low, high, n = w["per_round"]
    assert n == 3 and mean == pytest.approx((0.94 * 0.95 * 0.93) ** (1 / 3), abs=1e-4) and 0.9 < low < high < 1.0
    assert rows[("ours x ours", goals.QD32)]["per_round"] is None  # one round: no interval
    found = {g["goal"]: g for g in goals.goal_rows(table, {}, None, "", runs, list(rows.values()))}
    met = found[f"TLS: {write}, ours x ours / cipher-bound limit >= 0.9"]
    assert met["status"] == "met" and met["per_round"]["decided"] == "met"
    assert found[f"TLS: {goals.QD32}, ours x ours / cipher-bound limit >= 0.9"]["status"] == "missed by 55.6 %"
    # without a rate the row says why, and so does the goal
    bare = {b["work"]: b for b in bound.bound_rows(table, runs, [])}
    assert bare[write]["value"] is None and bare[write]["why_missing"] == bound.NO_RATE
    unmeasured = goals.goal_rows(table, {}, None, "", runs, list(bare.values()))
    assert next(g for g in unmeasured if g["goal"].startswith(f"TLS: {write}"))["status"] == \
        f"not measured ({bound.NO_RATE})"
    # spdk_nvme_perf's TLS writes go through SPDK's 4 KiB send buffer: the row and its goal say so
    runs += [run("ours", "spdk", write, 1e6, 0), run("ours-tls", "spdk-tls", write, 5e3, 0),
             run("ours", "spdk", goals.QD32, 1e6, 0), run("ours-tls", "spdk-tls", goals.QD32, 400e3, 0)]
    table = stats.cells(runs)
    spdk = {b["work"]: b for b in bound.bound_rows(table, runs, records) if b["pair"] == "our target x spdk_nvme_perf"}
    assert spdk[write]["why_missing"] == bound.SPDK_HOST_SEND and spdk[goals.QD32]["why_missing"] == ""
    marked = {g["goal"]: g for g in goals.goal_rows(table, {}, None, "", runs, list(spdk.values()))}
    assert marked[f"TLS: {write}, our target x spdk_nvme_perf / cipher-bound limit >= 0.9"]["status"] == \
        f"missed by 98.9 % ({bound.SPDK_HOST_SEND})"
    assert "(" not in marked[f"TLS: {goals.QD32}, our target x spdk_nvme_perf / cipher-bound limit >= 0.9"]["status"]


def test_the_report_shows_the_rates_and_each_tls_row_against_its_limit():
    large = "128k randwrite QD32"
    runs = [run("ours", "ours", large, 40e3, rnd) for rnd in range(2)]
    runs += [run("ours-tls", "ours-tls", large, 12e3, rnd) for rnd in range(2)]
    config = {"seconds": 3, "ramp": 1, "rounds": 2, "target_core": 0, "host_core": 1, "works": [large]}
    records = _rates(0, 3e9, 5e9) + _rates(1, 3e9, 5.2e9)
    results = report.assemble(runs, [], [large], config, None, [], [], 10.0, records)
    assert results["cipher"]["rates_bps"]["16384"] == {"encrypt": 5.1e9, "decrypt": 5.1e9}
    (row,) = results["tls_bound"]
    assert row["pair"] == "ours x ours" and 0 < row["limit_iops"] < 40e3
    text = report.markdown(results)
    assert "Cipher bound: TLS_AES_128_GCM_SHA256" in text and "16 KiB encrypt 5.10 GB/s" in text
    assert f"| ours x ours | {large} | 5.24 GB/s | 1.57 GB/s |" in text
    assert "TLS: 128k randwrite QD32, ours x ours / cipher-bound limit >= 0.9" in text
    plain = report.assemble(runs[:2], [], [large], config, None, [], [], 10.0)
    assert "Cipher bound" not in report.markdown(plain)
