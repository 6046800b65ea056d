"""The `dimensions` study (commodity-networks paper): pattern × size at QD128, scaling with cores,
latency CDF per core count, and concurrency = IOPS(transport, QD) / IOPS(local, QD1).

Host CPU user/system/idle is the load generator's own share (its usr_cpu and sys_cpu over the
measured phase) per host core it ran on; idle is what is left of those cores. The CPU per I/O the
kernel counted over each side's cores (user + system + softirq, `cores_used`) stands beside it, and
the cores axis names the distinct cores each side used; a point whose roles shared a core is
flagged and left out of the scaling finding.
"""

from __future__ import annotations

import math

import pandas as pd

from .. import plots, plots_extra
from .common import Difference, compare_frames, corrected, excluded_points, missing_leg, stated, study_rows
from .cores_used import shared, used_text, with_cores
from .extra import means, r1, ratio, spread, with_knobs
from .formulas import concurrency
from .result import Figure, StudyResult, Table
from .stats import merge_histograms, usable
from .text import kiops, mbps, size, times, us

STUDY = "dimensions"


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Four dimensions: transport × I/O pattern × I/O size × cores")
    out.excluded = excluded_points(rows)
    data = usable(rows)
    data = with_cores(data)
    data = with_knobs(data[data["role"] == "main"] if not data.empty else data, ["transport", "cores", "host_cpus"])
    if data.empty:
        out.findings.append("The dimensions study has no usable measurements"
                            + (f": {missing_leg(rows, 'pattern', 'no table can be drawn')}" if not rows.empty else "."))
        return out
    _transports(rows, out)
    _pattern(rows, data[data["leg"] == "pattern"], out)
    _cores(rows, data[data["leg"] == "cores"], out)
    _concurrency(rows, data[data["leg"] == "local"], data[data["leg"] == "concurrency"], out)
    return out


def _transports(rows: pd.DataFrame, out: StudyResult) -> None:
    others = sorted({leg.split("_", 1)[1] for leg in rows["leg"] if "_" in leg})
    for transport in others:
        out.findings.append(missing_leg(rows, f"pattern_{transport}",
                                        f"{transport.upper()} is not compared with TCP"))
    if not others:
        out.findings.append("Transport: NVMe/TCP only (no RDMA leg was asked for: `transports = [\"tcp\", \"rdma\"]` "
                            "adds one; the transports study compares TCP, RDMA and TLS in full).")


def _cpu(row: pd.Series, cores: float) -> tuple[float, float, float]:
    cores = cores if cores and not math.isnan(cores) else 1.0
    usr, sys = row["usr_cpu"] / cores, row["sys_cpu"] / cores
    return usr, sys, max(0.0, 100.0 - usr - sys)


def _pattern(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        out.findings.append(missing_leg(rows, "pattern", "there is no pattern × size table"))
        return
    med = means(data, ["rw", "bs", "iodepth"], ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns",
                                                "lat_p99_99_ns", "usr_cpu", "sys_cpu", "host_cpu_us_per_io",
                                                "target_cpu_us_per_io"])
    records = []
    for _, row in med.iterrows():
        usr, sys, idle = _cpu(row, 1)
        records.append({"pattern": row["rw"], "I/O size": size(row["bs"]), "QD": int(row["iodepth"]),
                        "MB/s": r1(row["bw_bytes"], 1e6, 0), "KIOPS": r1(row["iops"], 1e3),
                        "mean (µs)": r1(row["lat_mean_ns"], 1e3), "p90 (µs)": r1(row["lat_p90_ns"], 1e3),
                        "p99 (µs)": r1(row["lat_p99_ns"], 1e3), "p99.99 (µs)": r1(row["lat_p99_99_ns"], 1e3),
                        "host usr %": r1(usr), "host sys %": r1(sys), "host idle %": r1(idle),
                        "host cores µs/IO": r1(row["host_cpu_us_per_io"], 1, 2),
                        "target cores µs/IO": r1(row["target_cpu_us_per_io"], 1, 2),
                        "repeats": int(row["repeats"])})
    out.tables.append(Table("Pattern × I/O size (NVMe/TCP, one host core, one target core)", pd.DataFrame(records),
                            "Means over repeats; rw and randrw mix reads and writes as the spec's rwmixread says "
                            "(70 % reads by default). Host CPU: the load generator's share of its core. µs/IO: "
                            "user + system + softirq of each side's cores per I/O (per-core /proc/stat), "
                            f"cores used: {used_text(data) or 'not recorded'}."))
    series = {rw: (list(g["bs"]), list(g["bw_bytes"] / 1e6)) for rw, g in med.groupby("rw")}
    if len(set(med["bs"])) > 1:
        out.figures.append(Figure("dimensions_bandwidth_vs_size", plots_extra.lines(
            series, title="Bandwidth vs I/O size per pattern (NVMe/TCP)", xlabel="I/O size (bytes, log2)",
            ylabel="Bandwidth (MB/s)", log2_x=True, xticklabels={float(b): size(b) for b in med["bs"]}),
            "Mean bandwidth per pattern and I/O size at the study's queue depth."))
    best = med.loc[med["bw_bytes"].idxmax()]
    out.findings.append(f"Highest bandwidth: {best['rw']} at {size(best['bs'])} with {mbps(best['bw_bytes'])}"
                        f"{spread(best['bw_bytes'], best['bw_ci95'])}.")
    small = med[med["bs"] == med["bs"].min()]
    if len(small) > 1:
        top, low = small.loc[small["iops"].idxmax()], small.loc[small["iops"].idxmin()]

        def pick(r: pd.Series) -> pd.DataFrame:
            return data[(data["rw"] == r["rw"]) & (data["bs"] == r["bs"]) & (data["iodepth"] == r["iodepth"])]

        # The highest and lowest of several patterns are picked from the data: every pair of the
        # patterns is compared, Holm over the pairs, and the top-vs-low pair is read from that.
        labels = list(small.index)
        pairs = [(i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))]
        family = corrected([compare_frames(pick(small.loc[labels[i]]), pick(small.loc[labels[j]]), "iops")
                            for i, j in pairs])
        i_low, i_top = labels.index(small["iops"].idxmin()), labels.index(small["iops"].idxmax())
        if i_low == i_top:  # every pattern at the same IOPS (or none known): any other one will do
            i_top = next(i for i in range(len(labels)) if i != i_low)
        d = family[pairs.index((min(i_low, i_top), max(i_low, i_top)))]
        diff = d if i_low < i_top else Difference(-d.diff, d.half, d.n, d.p, d.family, d.holm)
        out.findings.append(f"At {size(top['bs'])}, {top['rw']} reached {kiops(top['iops'])} and {low['rw']} "
                            f"{kiops(low['iops'])}: "
                            + stated(diff, kiops, f"{times(ratio(top['iops'], low['iops']))} the IOPS",
                                     same="no significant difference in IOPS") + ".")


def _cores(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        out.findings.append(missing_leg(rows, "cores", "scaling with cores and the per-core CDF are not shown"))
        return
    data = data.assign(cores=pd.to_numeric(data["cores"]), host_cpus=pd.to_numeric(data["host_cpus"]))
    med = means(data, ["cores", "host_cpus"], ["iops", "bw_bytes", "lat_mean_ns", "lat_p90_ns", "lat_p99_ns",
                                               "lat_p99_99_ns", "usr_cpu", "sys_cpu", "host_cpu_us_per_io",
                                               "target_cpu_us_per_io", "cpu_us_per_io"])
    records = []
    for _, row in med.iterrows():
        usr, sys, idle = _cpu(row, row["host_cpus"])
        mine = data[(data["cores"] == row["cores"]) & (data["host_cpus"] == row["host_cpus"])]
        records.append({"cores asked (host = target)": int(row["cores"]), "cores used": used_text(mine) or "—",
                        "roles shared a core": "yes" if shared(mine).any() else "no",
                        "KIOPS": r1(row["iops"], 1e3),
                        "MB/s": r1(row["bw_bytes"], 1e6, 0), "mean (µs)": r1(row["lat_mean_ns"], 1e3),
                        "p99 (µs)": r1(row["lat_p99_ns"], 1e3), "p99.99 (µs)": r1(row["lat_p99_99_ns"], 1e3),
                        "host usr %": r1(usr), "host sys %": r1(sys), "host idle %": r1(idle),
                        "host cores µs/IO": r1(row["host_cpu_us_per_io"], 1, 2),
                        "target cores µs/IO": r1(row["target_cpu_us_per_io"], 1, 2),
                        "all cores µs/IO": r1(row["cpu_us_per_io"], 1, 2),
                        "repeats": int(row["repeats"])})
    out.tables.append(Table("Scaling with cores (4 KiB random read)", pd.DataFrame(records),
                            "N host cores (one job each) against N target reactors; where the machine has fewer "
                            "distinct cores than asked, fewer are used (host usr/sys/idle are per core used). "
                            "Cores used: the distinct cores each side was pinned to. µs/IO: user + system + softirq "
                            "of those cores per I/O (per-core /proc/stat; not split where the sides shared a core)."))
    hists = {f"{int(n)} core{'s' if n > 1 else ''}": merge_histograms(g["histogram_json"])
             for n, g in data.groupby("cores")}
    out.figures.append(Figure("dimensions_latency_cdf_per_cores", plots.latency_cdf(
        hists, title="Latency CDF per core count (4 KiB random read)"),
        "Histograms merged over repeats, one line per core count."))
    flagged = shared(data)
    if flagged.any():
        counts = sorted({int(n) for n in data.loc[flagged, "cores"]})
        out.findings.append(f"At {', '.join(map(str, counts))} core(s) asked, roles shared a core "
                            f"({used_text(data[flagged])}): those points are flagged in the table and left out of "
                            "the scaling finding, which is about host and target on cores of their own.")
        data = data[~flagged]
        med = med[med["cores"].isin(set(data["cores"]))].reset_index(drop=True)
    if len(med) > 1:
        first, last = med.iloc[0], med.iloc[-1]

        def pick(r: pd.Series) -> pd.DataFrame:
            return data[(data["cores"] == r["cores"]) & (data["host_cpus"] == r["host_cpus"])]

        gain = compare_frames(pick(first), pick(last), "iops")
        tail = compare_frames(pick(first), pick(last), "lat_p99_ns")
        verb = stated(gain, kiops, f"gave {times(ratio(last['iops'], first['iops']))} the IOPS of {int(first['cores'])}",
                      f"{kiops(last['iops'])} vs {kiops(first['iops'])}",
                      f"gave no significant difference in IOPS from {int(first['cores'])}")
        p99 = stated(tail, us, "higher" if tail.diff > 0 else "lower" if tail.diff < 0 else "the same",
                     f"{us(last['lat_p99_ns'])} vs {us(first['lat_p99_ns'])}")
        used = [(int(r["cores"]), used_text(pick(r))) for r in (first, last)]
        named = "; ".join(f"{n} → {text}" for n, text in used if text)
        out.findings.append(f"{int(last['cores'])} cores {verb}; p99 {p99}."
                            + (f" Cores used: {named}." if named else ""))


def _concurrency(rows: pd.DataFrame, local: pd.DataFrame, remote: pd.DataFrame, out: StudyResult) -> None:
    if local.empty or remote.empty:
        leg = "local" if local.empty else "concurrency"
        out.findings.append(missing_leg(rows, leg, "concurrency (IOPS at QD over local IOPS at QD1) is not computed"))
        return
    base = float(means(local, ["iodepth"])["iops"].iloc[0])
    med = means(remote, ["iodepth"])
    med["concurrency"] = [concurrency(v, base) for v in med["iops"]]
    out.tables.append(Table("Concurrency: IOPS(NVMe/TCP, QD) / IOPS(local, QD1)", pd.DataFrame({
        "QD": med["iodepth"].astype(int), "KIOPS": [r1(v, 1e3) for v in med["iops"]],
        "p99 (µs)": [r1(v, 1e3) for v in med["lat_p99_ns"]],
        "concurrency": [r1(v, 1, 2) for v in med["concurrency"]]}),
        f"Local QD1 (same kind of file, no network stack): {kiops(base)}."))
    out.figures.append(Figure("dimensions_concurrency", plots_extra.lines(
        {"NVMe/TCP": (list(med["iodepth"]), list(med["concurrency"]))},
        title="Concurrency vs queue depth: IOPS(TCP, QD) / IOPS(local, QD1)", xlabel="Queue depth", ylabel="concurrency",
        log2_x=True), "Above 1, the transport with that many I/Os in flight outruns local storage at QD1."))
    reach = med[med["concurrency"] >= 1]
    if len(reach):
        out.findings.append(f"NVMe/TCP matched local QD1 throughput ({kiops(base)}) from QD{int(reach['iodepth'].iloc[0])}"
                            f"; at QD{int(med['iodepth'].iloc[-1])} concurrency is {med['concurrency'].iloc[-1]:.2f}.")
    else:
        out.findings.append(f"NVMe/TCP never reached local QD1 throughput ({kiops(base)}); the best concurrency "
                            f"was {med['concurrency'].max():.2f} at QD{int(med.loc[med['concurrency'].idxmax(), 'iodepth'])}.")
