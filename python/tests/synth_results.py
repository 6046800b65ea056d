"""Small results directories written through the real ResultsStore, for compare and findings tests."""

from __future__ import annotations

from pathlib import Path

from nvmflab.store import ResultsStore


def write_results(path: Path, points: list[dict], study: str = "sweep-x", env: dict | None = None,
                  stack_version: str = "nvmf-target 0.1.0") -> Path:
    """points: dicts with `knobs`, `repeats` (list of {iops, lat_mean_ns, lat_p99_ns, ...} per repeat,
    or None for a failed repeat), optional `leg` (default sweep) and `role` (main)."""
    env = {"cpu_model": "Synthetic CPU", "cores": 4, "kernel": "6.1.0", "hostname": "lab",
           **(env or {})}
    with ResultsStore(path) as store:
        run_id = store.start_run(study, f'[study]\nname = "{study}"\n', env)
        for i, point in enumerate(points):
            knobs = {"target_stack": "ours", "host_stack": "ours", "rw": "randread", "bs": 4096,
                     **point["knobs"]}
            for r, values in enumerate(point["repeats"]):
                key = f"{study}-{point.get('leg', 'sweep')}-{i}-{r}-{abs(hash(str(sorted(knobs.items())))) % 10**8}"
                if values is None:
                    store.save_point(run_id, key, study, point.get("leg", "sweep"), knobs, r, "failed",
                                     "perf exited 1", [])
                    continue
                row = {"role": point.get("role", "main"), "knobs": knobs, "engine": "tcp",
                       "bw_bytes": values["iops"] * 4096, "target_stack_version": stack_version,
                       "host_stack_version": "nvmf-perf 0.1.0", **values}
                store.save_point(run_id, key, study, point.get("leg", "sweep"), knobs, r, "ok", None, [row])
        store.finish_run(run_id)
    return path


def repeats(iops: list[float], lat_us: float = 50.0, lat_scale: list[float] | None = None) -> list[dict]:
    """One dict per repeat: the given IOPS, latency inversely following IOPS (mean) and p99 = 2× mean."""
    out = []
    for i, v in enumerate(iops):
        scale = (lat_scale[i] if lat_scale else 1.0)
        mean = lat_us * 1e3 * scale
        out.append({"iops": float(v), "lat_mean_ns": mean, "lat_p99_ns": 2 * mean + 10 * i})
    return out
