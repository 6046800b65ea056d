"""`nvmflab.load(dir)`: a results directory as one tidy pandas DataFrame, for notebooks.

One row per point, role and repeat (several processes of one role in a point are combined as the
analysis combines them: throughput adds up, latency takes the worst, docs/analysis.md), every knob
its own column (also the study-specific ones kept only in knobs_json, such as `app` or
`resource`), both stack names, and units in the column names. Built on
`ResultsStore.measurements()`, whose columns stay as they are (docs/results-schema.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .analysis.stats import collapse_jobs
from .store import KNOB_COLUMNS, ResultsStore
from .units import parse_size

# measurements() column -> (tidy name, factor): the unit goes into the name.
RENAMED = {
    "bs": ("bs_bytes", 1), "backend_size": ("backend_size_bytes", 1),
    "in_capsule_data_size": ("in_capsule_data_size_bytes", 1),
    "bw_bytes": ("bw_MBps", 1e-6),
    "lat_mean_ns": ("lat_mean_us", 1e-3), "lat_p50_ns": ("lat_p50_us", 1e-3), "lat_p90_ns": ("lat_p90_us", 1e-3),
    "lat_p99_ns": ("lat_p99_us", 1e-3), "lat_p99_9_ns": ("lat_p99_9_us", 1e-3),
    "lat_p99_99_ns": ("lat_p99_99_us", 1e-3), "lat_max_ns": ("lat_max_us", 1e-3),
    "usr_cpu": ("usr_cpu_pct", 1), "sys_cpu": ("sys_cpu_pct", 1),
}
IDENTITY = ["study", "leg", "point_key", "repeat", "role", "status", "error", "run_id", "point_id"]
METRICS = ["iops", "read_iops", "write_iops", "bw_MBps", "total_ios", "runtime_ms", "lat_mean_us", "lat_p50_us",
           "lat_p90_us", "lat_p99_us", "lat_p99_9_us", "lat_p99_99_us", "lat_max_us", "usr_cpu_pct",
           "sys_cpu_pct", "ctx", "voluntary_ctx", "involuntary_ctx", "perf_usr_s", "perf_sys_s", "target_usr_s",
           "target_sys_s", "outside_cpu_s", "steal_s", "noise_pct", "throttle_events", "noise_tries",
           "invariant_ok", "invariant_detail", "noisy", "cpu_governor", "fg_bg_shared_core", "engine",
           "target_stack_version", "host_stack_version"]
# Text blobs left out unless asked for: histograms, counter diffs, per-interval records.
BLOBS = ["histogram_json", "target_counters_json", "intervals_json", "cpu_cores_json", "knobs_json"]


class NoResults(FileNotFoundError):
    """The directory holds no results database, or one without any point."""


def load(results_dir: str | Path, blobs: bool = False) -> pd.DataFrame:
    """The tidy frame of a results directory (module docstring); `blobs` keeps the JSON columns."""
    directory = Path(results_dir)
    if not (directory / ResultsStore.FILENAME).is_file():
        raise NoResults(f"{directory}: no {ResultsStore.FILENAME} here; run `nvmflab study ... --results "
                        f"{directory}` (or `make run`, which writes results/quick) first")
    with ResultsStore(directory) as store:
        raw = store.measurements()
    if raw.empty:
        raise NoResults(f"{directory}: the results database holds no point yet (interrupted before the first?)")
    return tidy(raw, blobs)


def tidy(measurements: pd.DataFrame, blobs: bool = False) -> pd.DataFrame:
    """measurements() → the tidy frame (see load)."""
    frame = collapse_jobs(measurements).reset_index(drop=True)
    extra = _extra_knobs(frame)
    for column, (name, factor) in RENAMED.items():
        frame[name] = frame[column] * factor if factor != 1 else frame[column]
    knobs = [RENAMED.get(k, (k, 1))[0] for k in KNOB_COLUMNS] + sorted(extra)
    frame = pd.concat([frame, pd.DataFrame(extra, index=frame.index)], axis=1) if extra else frame
    for column in METRICS[:METRICS.index("invariant_ok")]:  # all-NULL columns come back as None
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    columns = IDENTITY + knobs + METRICS + (BLOBS if blobs else [])
    return frame[[c for c in columns if c in frame.columns]]


def _extra_knobs(frame: pd.DataFrame) -> dict[str, list]:
    """Knobs kept only in knobs_json (per study: app, resource, netns_link, host_cores, ...)."""
    parsed = [json.loads(text) if isinstance(text, str) else {} for text in frame["knobs_json"]]
    names = {k for knobs in parsed for k in knobs} - set(KNOB_COLUMNS) - set(frame.columns)
    extra = {name: [knobs.get(name) for knobs in parsed] for name in names}
    if "size" in extra:  # the per-job I/O size, "64MiB" in specs: bytes like bs
        extra["size_bytes"] = [None if v is None else parse_size(v) for v in extra.pop("size")]
    return extra


def intervals(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-interval records of a frame loaded with blobs=True: one row per measurement row and
    interval, its identity columns plus t_s, iops and the latency percentiles in µs."""
    if "intervals_json" not in frame:
        raise KeyError("intervals_json is not in this frame: load it with nvmflab.load(dir, blobs=True)")
    rows = []
    for _, row in frame.iterrows():
        text = row["intervals_json"]
        for record in (json.loads(text) if isinstance(text, str) else []):
            rows.append({**{c: row[c] for c in IDENTITY if c in frame},
                         "t_s": record["t_ms"] / 1e3, "iops": record.get("iops"),
                         **{k.replace("_ns", "_us"): (None if record.get(k) is None else record[k] / 1e3)
                            for k in ("lat_mean_ns", "lat_p50_ns", "lat_p99_ns", "lat_p99_9_ns")}})
    return pd.DataFrame(rows)
