"""The `parallelism` study (Arm study): numjobs scaling with host and target CPU, CPU cost per I/O
remote vs local with its user/kernel split by request size, and the queue depth's effect on tail
latency local vs remote.

Host CPU per I/O is the load generator's usr_cpu + sys_cpu over the measured phase divided by the
I/Os it completed there; target CPU per I/O is the target's CPU seconds over the whole point
divided by the I/Os of ramp and run (IOPS × (ramp_time + runtime)). Beside them, the CPU per I/O the
kernel counted over each side's cores (user + system + softirq from per-core /proc/stat,
`cores_used`), which includes softirq and kworker time the processes' own counters miss; tables
and findings name the distinct cores each side used."""

from __future__ import annotations

import json
import math

import pandas as pd

from .. import plots_extra
from .common import claim, compare_frames, corrected, descriptive, excluded_points, missing_leg, stated, study_rows
from .cores_used import shared, used_text, with_cores
from .extra import means, r1, ratio
from .result import Figure, StudyResult, Table
from .stats import usable
from .text import kiops, mbps, pct, size, us

STUDY = "parallelism"


def _ramps(runs: pd.DataFrame) -> dict[int, float]:
    out = {}
    for _, run in (runs.iterrows() if not runs.empty else []):
        try:
            out[int(run["run_id"])] = float(json.loads(run["env_json"]).get("spec_effective", {}).get("ramp_time", 0))
        except (TypeError, ValueError, json.JSONDecodeError):
            continue
    return out


def cpu_columns(frame: pd.DataFrame, ramps: dict[int, float]) -> pd.DataFrame:
    """Host and target CPU microseconds per I/O, and the host's kernel share, per row."""
    seconds = frame["runtime_ms"] / 1000
    host_s = (frame["usr_cpu"] + frame["sys_cpu"]) / 100 * seconds
    ios = frame["total_ios"].where(frame["total_ios"] > 0)
    ramp = frame["run_id"].map(lambda r: ramps.get(int(r), 0.0))
    target_s = frame["target_usr_s"] + frame["target_sys_s"]
    return frame.assign(
        host_usr_us_per_io=frame["usr_cpu"] / 100 * seconds / ios * 1e6,
        host_sys_us_per_io=frame["sys_cpu"] / 100 * seconds / ios * 1e6,
        host_us_per_io=host_s / ios * 1e6,
        kernel_share=100 * frame["sys_cpu"] / (frame["usr_cpu"] + frame["sys_cpu"]),
        target_us_per_io=target_s / (frame["iops"] * (seconds + ramp)) * 1e6)


SPLIT_MISSING_NOTE = ("A hatched column marked ✗ has no value: for the host and target cores, every point of "
                      "that size had the host and the target on a shared core, so the kernel's count cannot be "
                      "split between the sides (the table gives no split either); otherwise no per-core count "
                      "was taken or the points failed.")


EXTRA = ["host_usr_us_per_io", "host_sys_us_per_io", "host_us_per_io", "kernel_share", "target_us_per_io",
         "iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns", "lat_p99_99_ns", "usr_cpu", "sys_cpu",
         "host_cpu_us_per_io", "target_cpu_us_per_io", "cpu_us_per_io", "host_softirq_us_per_io",
         "target_softirq_us_per_io", "host_cswitch_per_io", "target_cswitch_per_io"]


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Parallelism and CPU cost: jobs, request size and queue depth, local vs remote")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    if data.empty:
        out.findings.append("The parallelism study has no usable measurements"
                            + (f": {missing_leg(rows, 'numjobs', 'nothing can be shown')}" if not rows.empty else "."))
        return out
    data = cpu_columns(with_cores(data)[lambda d: d["role"] == "main"], _ramps(runs))
    _numjobs(rows, data[data["leg"] == "numjobs"], out)
    _size(rows, data, out)
    _depth(rows, data, out)
    return out


def _numjobs(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        out.findings.append(missing_leg(rows, "numjobs", "scaling with jobs is not shown"))
        return
    med = means(data, ["numjobs"], EXTRA)
    out.tables.append(Table("Jobs: latency, bandwidth and CPU (NVMe/TCP, 4 KiB)", pd.DataFrame({
        "numjobs": med["numjobs"].astype(int), "KIOPS": [r1(v, 1e3) for v in med["iops"]],
        "MB/s": [r1(v, 1e6, 0) for v in med["bw_bytes"]], "mean (µs)": [r1(v, 1e3) for v in med["lat_mean_ns"]],
        "p99 (µs)": [r1(v, 1e3) for v in med["lat_p99_ns"]],
        "host CPU %": [r1(u + s) for u, s in zip(med["usr_cpu"], med["sys_cpu"])],
        "host µs/IO": [r1(v, 1, 2) for v in med["host_us_per_io"]],
        "target µs/IO": [r1(v, 1, 2) for v in med["target_us_per_io"]],
        "host cores µs/IO (kernel count)": [r1(v, 1, 2) for v in med["host_cpu_us_per_io"]],
        "target cores µs/IO (kernel count)": [r1(v, 1, 2) for v in med["target_cpu_us_per_io"]],
        "cores used": [used_text(data[data["numjobs"] == n]) for n in med["numjobs"]],
        "repeats": med["repeats"].astype(int)}),
        "Host CPU % is summed over jobs (100 % = one core busy). µs/IO: the load generator's and the target's "
        "own CPU; kernel count: user + system + softirq of each side's cores (per-core /proc/stat)."))
    out.figures.append(Figure("parallelism_numjobs", plots_extra.lines(
        {"bandwidth (MB/s)": (list(med["numjobs"]), list(med["bw_bytes"] / 1e6)),
         "p99 latency (µs)": (list(med["numjobs"]), list(med["lat_p99_ns"] / 1e3))},
        title="Bandwidth and p99 latency vs numjobs (NVMe/TCP, 4 KiB random read)", xlabel="numjobs",
        ylabel="MB/s | µs"), "Means over repeats."))
    if len(med) > 1:
        a, b = med.iloc[0], med.iloc[-1]
        first, last = data[data["numjobs"] == a["numjobs"]], data[data["numjobs"] == b["numjobs"]]
        # two tests in one finding: Holm over them
        bw, tail = corrected([compare_frames(first, last, "bw_bytes"), compare_frames(first, last, "lat_p99_ns")])
        out.findings.append(
            f"{int(b['numjobs'])} jobs gave {mbps(b['bw_bytes'])} vs {mbps(a['bw_bytes'])} with {int(a['numjobs'])}: "
            + stated(bw, mbps, f"bandwidth {pct(100 * (ratio(b['bw_bytes'], a['bw_bytes']) - 1))}", "Holm over 2",
                     same="no clear difference in bandwidth")
            + f"; p99 {us(b['lat_p99_ns'])} vs {us(a['lat_p99_ns'])}: "
            + stated(tail, us, "higher" if tail.diff > 0 else "lower", "Holm over 2", same="no clear difference") + ".")


def _size(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    local, remote = data[data["leg"] == "size_local"], data[data["leg"] == "size_remote"]
    if local.empty or remote.empty:
        leg = "size_local" if local.empty else "size_remote"
        out.findings.append(missing_leg(rows, leg, "the CPU cost of remote against local I/O is not compared"))
        return
    ml, mr = means(local, ["bs"], EXTRA).set_index("bs"), means(remote, ["bs"], EXTRA).set_index("bs")
    sizes = sorted(set(ml.index) & set(mr.index))
    table = pd.DataFrame({
        "I/O size": [size(b) for b in sizes],
        "local host µs/IO": [r1(ml.at[b, "host_us_per_io"], 1, 2) for b in sizes],
        "remote host µs/IO": [r1(mr.at[b, "host_us_per_io"], 1, 2) for b in sizes],
        "remote ÷ local": [r1(ratio(mr.at[b, "host_us_per_io"], ml.at[b, "host_us_per_io"]), 1, 2) for b in sizes],
        "local kernel %": [r1(ml.at[b, "kernel_share"]) for b in sizes],
        "remote kernel %": [r1(mr.at[b, "kernel_share"]) for b in sizes],
        "target µs/IO": [r1(mr.at[b, "target_us_per_io"], 1, 2) for b in sizes],
        "local host cores µs/IO (kernel count)": [r1(ml.at[b, "host_cpu_us_per_io"], 1, 2) for b in sizes],
        "remote host cores µs/IO (kernel count)": [r1(mr.at[b, "host_cpu_us_per_io"], 1, 2) for b in sizes],
        "remote target cores µs/IO (kernel count)": [r1(mr.at[b, "target_cpu_us_per_io"], 1, 2) for b in sizes],
        "remote softirq µs/IO host | target": [f"{r1(mr.at[b, 'host_softirq_us_per_io'], 1, 2)} | "
                                                f"{r1(mr.at[b, 'target_softirq_us_per_io'], 1, 2)}" for b in sizes],
        "remote context switches/IO host | target (perf stat)": [
            f"{r1(mr.at[b, 'host_cswitch_per_io'], 1, 3)} | {r1(mr.at[b, 'target_cswitch_per_io'], 1, 3)}"
            for b in sizes]})
    out.tables.append(Table("CPU cost per I/O by request size, remote vs local", table,
                            "Host: the load generator's CPU over the measured phase per completed I/O; kernel % "
                            "is its system share. Target: the target's CPU per I/O (remote only). Kernel count: "
                            "user + system + softirq of each side's cores from per-core /proc/stat per I/O, "
                            "context switches per I/O from perf stat where perf could count (empty otherwise); "
                            f"softirq kernel receive work included (local {used_text(local)}; remote "
                            f"{used_text(remote)})."))
    labels = [size(b) for b in sizes]
    out.figures.append(Figure("parallelism_cpu_per_io", plots_extra.grouped_bars(labels, {
        "local user": [ml.at[b, "host_usr_us_per_io"] for b in sizes],
        "local kernel": [ml.at[b, "host_sys_us_per_io"] for b in sizes],
        "remote user": [mr.at[b, "host_usr_us_per_io"] for b in sizes],
        "remote kernel": [mr.at[b, "host_sys_us_per_io"] for b in sizes],
        "local host cores": [ml.at[b, "host_cpu_us_per_io"] for b in sizes],
        "remote host cores": [mr.at[b, "host_cpu_us_per_io"] for b in sizes],
        "remote target cores": [mr.at[b, "target_cpu_us_per_io"] for b in sizes]},
        title="CPU per I/O by request size, local vs remote", ylabel="CPU µs per I/O",
        missing_note=SPLIT_MISSING_NOTE),
        "Means over repeats. user / kernel: the load generator's own CPU; host / target cores: user + system + "
        "softirq of each side's cores (per-core /proc/stat), kernel receive work included."))
    b = sizes[0]
    text, metric = cpu_cost_finding(local[local["bs"] == b], remote[remote["bs"] == b], size(b))
    out.findings.append(text)
    own = ("" if metric == "host_us_per_io" else
           f"the load generator's own CPU (its rusage, which misses softirq and kworker time) was "
           f"{mr.at[b, 'host_us_per_io']:.2f} µs per I/O remote and {ml.at[b, 'host_us_per_io']:.2f} µs local; ")
    out.findings.append(descriptive(
        f"At {size(b)} {own}the load generator's kernel share was {ml.at[b, 'kernel_share']:.1f} % local and "
        f"{mr.at[b, 'kernel_share']:.1f} % remote") + ".")
    if metric != "host_us_per_io":
        out.findings.append(kernel_count_finding(local[local["bs"] == b], remote[remote["bs"] == b], size(b)))


def _values(frame: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(frame[column], errors="coerce").dropna() if column in frame else pd.Series(dtype=float)


def cpu_cost_finding(local: pd.DataFrame, remote: pd.DataFrame, label: str) -> tuple[str, str]:
    """The source's finding 2 (remote I/O costs the host more CPU per I/O than local), tested on the
    CPU the kernel counted over the host's cores (user + system + softirq, per-core /proc/stat), so
    receive processing in softirq counts; points whose roles shared a core are left out. Where no
    point has the host's cores apart, the CPU of all the point's cores (both sides together); where
    no per-core count exists (an older run), the load generator's own CPU, which misses softirq.
    Returns the sentence and the metric it tested."""
    apart = remote[~shared(remote)] if len(remote) else remote
    if len(_values(local, "host_cpu_us_per_io")) and len(_values(apart, "host_cpu_us_per_io")):
        metric, sides, what = "host_cpu_us_per_io", (local, apart), "host CPU per I/O (the host's cores: user + system + softirq)"
    elif len(_values(local, "cpu_us_per_io")) and len(_values(remote, "cpu_us_per_io")):
        metric, sides, what = ("cpu_us_per_io", (local, remote),
                               "CPU per I/O of all the point's cores (user + system + softirq; remote host and target "
                               "shared a core, so both sides together)")
    else:
        metric, sides, what = ("host_us_per_io", (local, remote),
                               "host CPU per I/O (the load generator's own: no per-core count, softirq missed)")
    d = compare_frames(sides[0], sides[1], metric)
    a, b = _values(sides[0], metric).mean(), _values(sides[1], metric).mean()
    more = "more" if b >= a else "less"
    left = len(remote) - len(sides[1])
    detail = f"{b:.2f} vs {a:.2f} µs" + (f"; {left} remote point(s) whose roles shared a core left out" if left else "")
    return claim(d, lambda v: f"{v:.2f} µs", f"At {label}, remote I/O used {100 * abs(ratio(b, a) - 1):.1f} % {more} "
                 f"{what} than local", f"{what} between remote and local I/O at {label}", detail) + ".", metric


def kernel_count_finding(local: pd.DataFrame, remote: pd.DataFrame, label: str) -> str:
    """CPU per I/O counted by the kernel over each side's cores, naming them, and where softirq
    (receive processing) landed; points whose roles shared a core give only their total."""
    def mean(frame: pd.DataFrame, column: str) -> float:
        values = pd.to_numeric(frame[column], errors="coerce").dropna() if column in frame else pd.Series(dtype=float)
        return float(values.mean()) if len(values) else math.nan

    apart = remote[~shared(remote)]
    return descriptive(_kernel_count_text(local, remote, apart, label, mean))


def _kernel_count_text(local, remote, apart, label, mean) -> str:
    text = (f"Counted by the kernel over each side's cores (user + system + softirq, per-core /proc/stat) at "
            f"{label}: local I/O {mean(local, 'host_cpu_us_per_io'):.2f} µs per I/O on {used_text(local) or 'its cores'}")
    if apart.empty:
        return (text + f"; remote I/O {mean(remote, 'cpu_us_per_io'):.2f} µs per I/O in all, not split between the "
                f"sides: the host and the target shared a core ({used_text(remote)}).")
    text += (f"; remote I/O {mean(apart, 'host_cpu_us_per_io'):.2f} µs on the host's cores and "
             f"{mean(apart, 'target_cpu_us_per_io'):.2f} µs on the target's ({used_text(apart)}), of which softirq "
             f"(kernel receive processing) {mean(apart, 'host_softirq_us_per_io'):.2f} µs and "
             f"{mean(apart, 'target_softirq_us_per_io'):.2f} µs. Over loopback or a veth the receive path runs on "
             "the sending side's core, so each side's figure holds part of the other side's receive work.")
    if len(apart) < len(remote):
        text += f" {len(remote) - len(apart)} point(s) whose roles shared a core are left out of the split."
    return text


def _depth(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    local, remote = data[data["leg"] == "depth_local"], data[data["leg"] == "depth_remote"]
    if local.empty or remote.empty:
        leg = "depth_local" if local.empty else "depth_remote"
        out.findings.append(missing_leg(rows, leg, "tail latency vs queue depth is not compared"))
        return
    ml, mr = means(local, ["iodepth"], EXTRA), means(remote, ["iodepth"], EXTRA)
    out.figures.append(Figure("parallelism_p99_vs_qd", plots_extra.lines(
        {"local p99": (list(ml["iodepth"]), list(ml["lat_p99_ns"] / 1e3)),
         "remote p99": (list(mr["iodepth"]), list(mr["lat_p99_ns"] / 1e3)),
         "local p99.99": (list(ml["iodepth"]), list(ml["lat_p99_99_ns"] / 1e3)),
         "remote p99.99": (list(mr["iodepth"]), list(mr["lat_p99_99_ns"] / 1e3))},
        title="Tail latency vs queue depth, local vs remote (4 KiB)", xlabel="Queue depth", ylabel="latency (µs)",
        log2_x=True), "Means over repeats."))
    joined = ml.merge(mr, on="iodepth", suffixes=("_local", "_remote"))
    out.tables.append(Table("Tail latency vs queue depth", pd.DataFrame({
        "QD": joined["iodepth"].astype(int),
        "local KIOPS": [r1(v, 1e3) for v in joined["iops_local"]],
        "remote KIOPS": [r1(v, 1e3) for v in joined["iops_remote"]],
        "local p99 (µs)": [r1(v, 1e3) for v in joined["lat_p99_ns_local"]],
        "remote p99 (µs)": [r1(v, 1e3) for v in joined["lat_p99_ns_remote"]],
        "remote ÷ local p99": [r1(ratio(r, l), 1, 2) for r, l in zip(joined["lat_p99_ns_remote"],
                                                                  joined["lat_p99_ns_local"])]})))
    if len(joined):
        lo, hi = joined.iloc[0], joined.iloc[-1]

        ends = [lo, hi] if len(joined) > 1 else [lo]

        def at_qd(frame: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
            return frame[frame["iodepth"] == row["iodepth"]]

        # p99 at the lowest and the highest queue depth and IOPS at the highest: one family, Holm over it.
        family = corrected([compare_frames(at_qd(local, r), at_qd(remote, r), "lat_p99_ns") for r in ends]
                           + [compare_frames(at_qd(local, hi), at_qd(remote, hi), "iops")])
        held = dict(zip([float(r["iodepth"]) for r in ends], family))
        holm = f"Holm over {len(family)}"

        def at(row: pd.Series) -> str:
            d = held[float(row["iodepth"])]
            return stated(d, us, f"{ratio(row['lat_p99_ns_remote'], row['lat_p99_ns_local']):.2f}× local",
                          f"{us(row['lat_p99_ns_remote'])} vs {us(row['lat_p99_ns_local'])}; {holm}",
                          "no clear difference from local")

        out.findings.append(
            f"Remote p99 at QD{int(lo['iodepth'])}: {at(lo)}"
            + (f"; at QD{int(hi['iodepth'])}: {at(hi)}" if len(joined) > 1 else "")
            + f". Throughput at QD{int(hi['iodepth'])}, remote vs local: "
            + stated(family[-1], kiops, f"{ratio(hi['iops_remote'], hi['iops_local']):.2f}× local",
                     f"{kiops(hi['iops_remote'])} vs {kiops(hi['iops_local'])}; {holm}", "no clear difference") + ".")
