"""Synthetic measurements shaped like ResultsStore.measurements(), shared by the analysis tests.

Each point is repeated three times at -1 %, 0 % and +1 % of the given values, so the mean over
repeats is exactly the value given and findings can be asserted to the digit.
"""

from __future__ import annotations

import json
import math

import pandas as pd

REPEAT_FACTORS = (0.99, 1.0, 1.01)

DEFAULTS = {
    "status": "ok", "error": None, "engine": "tcp", "rw": "randread", "bs": 4096,
    "iodepth": 1, "numjobs": 1, "rate_iops": None, "completion": "event",
    "target_mode": "event", "idle_poll_us": 0, "hdr_digest": False, "data_digest": False,
    "io_queues": 1, "bg_load_pct": math.nan, "knobs_json": "{}", "role": "main",
    "usr_cpu": 10.0, "sys_cpu": 20.0, "target_usr_s": 0.1, "target_sys_s": 0.2,
    "invariant_ok": None, "invariant_detail": None,
}


def histogram(p99_ns: float) -> list[list[float]]:
    """A small latency histogram whose 99th percentile is p99_ns."""
    return [[p99_ns * 0.5, 90], [p99_ns * 0.8, 9], [p99_ns, 1], [p99_ns * 1.5, 0]]


def rows(study: str, leg: str, points: list[dict], run_id: str = "run1") -> list[dict]:
    """Expand points (knobs plus iops and p99_ns) into one row per repeat."""
    out = []
    for index, point in enumerate(points):
        point = dict(point)
        iops = point.pop("iops")
        p99 = point.pop("p99_ns", 100_000.0)
        ctx = point.pop("ctx", 1000.0)
        point_id = point.pop("point_id", f"{leg}-{index}")
        for repeat, factor in enumerate(REPEAT_FACTORS):
            row = {**DEFAULTS, **point, "run_id": run_id, "study": study, "leg": leg,
                   "point_id": point_id, "point_key": json.dumps(point, sort_keys=True, default=str),
                   "repeat": repeat}
            bs = row["bs"]
            row.update({
                "iops": iops * factor, "bw_bytes": iops * factor * bs,
                "lat_mean_ns": p99 * 0.6 * factor, "lat_p50_ns": p99 * 0.5 * factor,
                "lat_p90_ns": p99 * 0.8 * factor, "lat_p99_ns": p99 * factor,
                "lat_p99_9_ns": p99 * 1.2 * factor, "lat_p99_99_ns": p99 * 1.4 * factor,
                "lat_max_ns": p99 * 2 * factor, "ctx": ctx * factor,
                "voluntary_ctx": ctx * 0.9 * factor, "involuntary_ctx": ctx * 0.1 * factor,
                "histogram_json": json.dumps(histogram(p99 * factor)),
            })
            out.append(row)
    return out


def frame(*row_lists: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([r for rs in row_lists for r in rs])


def runs_frame(studies: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{
        "run_id": "run1", "study": s, "spec_toml": f'[study]\nname = "{s}"\n',
        "env_json": json.dumps({"cpu_model": "Synthetic CPU", "cores": 4, "kernel": "6.1"}),
        "git_rev": "abc123", "started_at": "2024-01-01T00:00:00", "finished_at": "2024-01-01T00:10:00",
    } for s in studies])


QDS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def polling_measurements() -> pd.DataFrame:
    """Completion polling: p99 127.14 → 115.20 µs; peak 114.22 → 130.73 KIOPS (thesis 4.1)."""
    event_iops = [30e3, 55e3, 80e3, 100e3, 110e3, 113e3, 114.22e3, 114e3, 113e3]
    poll_iops = [33e3, 60e3, 90e3, 115e3, 125e3, 129e3, 130.73e3, 130e3, 129e3]
    completion = (
        [{"completion": "event", "iodepth": q, "iops": i, "p99_ns": 127_140.0 if q == 1 else 127_140.0 * q,
          "ctx": 50_000.0 * q} for q, i in zip(QDS, event_iops)]
        + [{"completion": "poll", "iodepth": q, "iops": i, "p99_ns": 115_200.0 if q == 1 else 115_200.0 * q,
            "ctx": 500.0 * q} for q, i in zip(QDS, poll_iops)]
    )
    idle = []
    for period, p99 in [(0, 116_000.0), (10, 106_800.0), (20, 105_000.0), (40, 103_710.0),
                        (80, 103_800.0), (160, 104_000.0)]:
        idle.append({"idle_poll_us": period, "iodepth": 1, "iops": 8e3, "p99_ns": p99})
        idle.append({"idle_poll_us": period, "iodepth": 128, "iops": 130e3, "p99_ns": 1e6})
    matrix = []
    cells = {("poll", "poll"): (106_660.0, 122_760.0), ("event", "poll"): (121_340.0, 118_700.0),
             ("poll", "event"): (102_220.0, 124_380.0), ("event", "event"): (124_410.0, 112_790.0)}
    for (completion_mode, target_mode), (p99, iops) in cells.items():
        matrix.append({"completion": completion_mode, "target_mode": target_mode, "iodepth": 1,
                       "iops": 9e3, "p99_ns": p99})
        matrix.append({"completion": completion_mode, "target_mode": target_mode, "iodepth": 128,
                       "iops": iops, "p99_ns": 1e6})
    return frame(rows("polling", "completion", completion), rows("polling", "idle_poll", idle),
                 rows("polling", "matrix", matrix))


def overhead_measurements(legs=("local", "loopback", "netns")) -> pd.DataFrame:
    """L-app p99 82.5 / 88.64 / 106.04 µs; T-app peaks 332.68 K (QD256) local, 128.24 K (QD128)."""
    p99 = {"local": 82_500.0, "loopback": 88_640.0, "netns": 106_040.0}
    curves = {
        "local": [40e3, 75e3, 130e3, 200e3, 260e3, 300e3, 320e3, 325e3, 332.68e3],
        "loopback": [20e3, 38e3, 65e3, 95e3, 115e3, 125e3, 130e3, 134e3, 133e3],
        "netns": [12e3, 24e3, 45e3, 80e3, 105e3, 118e3, 123e3, 128.24e3, 128e3],
    }
    bw_share = {"local": 1.0, "loopback": 0.8, "netns": 0.6}
    out = []
    for leg in legs:
        engine = "local" if leg == "local" else "tcp"
        points = [{"iodepth": q, "iops": i, "p99_ns": p99[leg] if q == 1 else p99[leg] * q,
                   "engine": engine} for q, i in zip(QDS, curves[leg])]
        for bs in (16384, 65536, 131072, 1 << 20):
            # Remote approaches local as blocks grow: the gap closes at 1m.
            share = 1.0 if bs == 1 << 20 else bw_share[leg]
            points.append({"rw": "read", "bs": bs, "iodepth": 32, "engine": engine,
                           "iops": 2e9 * share / bs})
        out += rows("overhead", leg, points)
    return frame(out)


def saturation_measurements(legs=("initiator", "target")) -> pd.DataFrame:
    """Initiator plateau 128.24 K at P1.QD128; target 180.30 K at P2.QD128."""
    curves = {
        "initiator": {1: [12e3, 24e3, 45e3, 80e3, 105e3, 118e3, 123e3, 128.24e3, 128e3],
                      2: [22e3, 44e3, 80e3, 110e3, 122e3, 126e3, 127e3, 127.5e3, 127e3]},
        "target": {1: [12e3, 24e3, 45e3, 80e3, 105e3, 118e3, 123e3, 128.24e3, 128e3],
                   2: [24e3, 48e3, 90e3, 150e3, 160e3, 165e3, 170e3, 180.30e3, 181e3]},
    }
    out = []
    for leg in legs:
        points = [{"numjobs": n, "iodepth": q, "iops": i}
                  for n, curve in curves[leg].items() for q, i in zip(QDS, curve)]
        out += rows("saturation", leg, points)
    return frame(out)
