"""Synthetic measurements shaped like ResultsStore.measurements(), shared by the analysis tests.

Each point is repeated three times at -1 %, 0 % and +1 % of the given values (in another order for
points with a background load), so the mean over repeats is exactly the value given and findings can
be asserted to the digit.
"""

from __future__ import annotations

import json
import math

import pandas as pd

REPEAT_FACTORS = (0.99, 1.0, 1.01)
# Points with a background load take the same factors in another order: the means stay exact, but a
# per-repeat ratio (loaded repeat over the same round's isolated repeat) keeps a spread instead of
# being identical in every round, which would be no interval at all.
LOADED_FACTORS = (1.01, 0.99, 1.0)

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
        loaded = point.get("bg_load_pct") is not None and not math.isnan(float(point["bg_load_pct"]))
        for repeat, factor in enumerate(LOADED_FACTORS if loaded else REPEAT_FACTORS):
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
                   "engine": engine, "knobs_json": json.dumps({"app": "L-app" if q == 1 else "T-app"})}
                  for q, i in zip(QDS, curves[leg])]
        for bs in (16384, 65536, 131072, 1 << 20):
            # Remote approaches local as blocks grow: the gap closes at 1m.
            share = 1.0 if bs == 1 << 20 else bw_share[leg]
            points.append({"rw": "read", "bs": bs, "iodepth": 32, "engine": engine,
                           "iops": 2e9 * share / bs, "knobs_json": json.dumps({"app": "B-app"})})
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


SATURATION_IOPS = {"initiator": 128_240.0, "target": 180_300.0, "control": 180_300.0}
ISOLATED_P99 = 100_000.0
ISOLATED_IOPS = 128_000.0
# (leg, fg iodepth) -> {bg_load_pct: (interference factor, achieved share of the cap)}
INTERFERENCE = {
    ("initiator", 1): {20: 38.0, 40: 38.2, math.inf: 38.4},
    ("initiator", 128): {20: 0.49, 40: 0.49, math.inf: 0.49},
    ("target", 1): {10: 1.5, 20: 1.8, 40: 2.4, 60: 3.2, 70: 6.8, 80: 6.8, math.inf: 7.0},
    ("target", 128): {10: 1.0, 20: 0.95, 40: 0.9, 50: 0.75, 60: 0.6, math.inf: 0.55},
    ("control", 1): {math.inf: 1.02},
    ("control", 128): {math.inf: 0.99},
}
MAX_ACHIEVED_PCT = {"initiator": 40.0, "target": 85.0, "control": 100.0}


def interference_measurements(invalid_target_load: float | None = 50) -> pd.DataFrame:
    """Shapes of thesis figs 6.1-6.4; the target L-app point at `invalid_target_load` % also
    appears with a broken invariant (interference 99×) and must be left out."""
    out = []
    for (leg, qd), loads in INTERFERENCE.items():
        bg_procs = 2 if leg == "target" else 1
        out += rows("interference", leg, [{"role": "fg", "iodepth": qd, "iops": ISOLATED_IOPS if qd > 1 else 9e3,
                                          "p99_ns": ISOLATED_P99, "point_id": f"{leg}-{qd}-iso"}])
        for load, factor in loads.items():
            pid = f"{leg}-{qd}-{load}"
            lat = factor if qd == 1 else 1.0
            tput = factor if qd > 1 else 1.0
            out += rows("interference", leg, [{"role": "fg", "iodepth": qd, "bg_load_pct": load,
                                              "iops": (ISOLATED_IOPS if qd > 1 else 9e3) * tput,
                                              "p99_ns": ISOLATED_P99 * lat, "point_id": pid}])
            capped = not math.isinf(load)
            requested = SATURATION_IOPS[leg] * (load if capped else 100) / 100
            achieved = min(requested, SATURATION_IOPS[leg] * MAX_ACHIEVED_PCT[leg] / 100)
            for _ in range(bg_procs):
                out += rows("interference", leg, [{
                    "role": "bg", "iodepth": 32, "bg_load_pct": load, "point_id": pid,
                    "rate_iops": requested / bg_procs if capped else 0,
                    "iops": achieved / bg_procs}])
    if invalid_target_load is not None:
        broken = rows("interference", "target", [{
            "role": "fg", "iodepth": 1, "bg_load_pct": invalid_target_load, "iops": 9e3,
            "p99_ns": ISOLATED_P99 * 99, "point_id": "target-broken"}])
        for row in broken:
            row.update(status="invalid", invariant_ok=False,
                       invariant_detail="fg completions 1000 != target reactor 0 commands 900")
        out += broken
    return frame(out)
