"""The `security` study: what TLS and DH-HMAC-CHAP cost, per target × host pair.

Per pair, every security mode (plain, dhchap, tls, tls+dhchap) is compared with plain on the
app's own metric (L-app: mean and p99 latency; T-app: IOPS; B-app: bandwidth) and on CPU per I/O on
each side's cores (/proc/stat, softirq included: analysis/cores_used.py). The connect app (nvmf-perf
`--connects`) compares the mean time of a whole connect with TLS and with DH-HMAC-CHAP per DH group
against a plain connect. Every difference comes with its 95 % Welch interval over the interleaved
repeats; Holm's correction is taken over each pair's family of data-path comparisons (modes × apps ×
metrics), over its CPU comparisons, and over its connect comparisons.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from .. import plots_extra
from ..stacks import kernel_tls
from .common import claim, compare_frames, corrected, excluded_points, stated, study_rows
from .cores_used import with_cores
from .extra import r1, ratio, with_knobs
from .result import Figure, StudyResult, Table
from .stats import usable
from .text import kiops, mbps, pct, us

STUDY = "security"
MODES = ("plain", "dhchap", "tls", "tls+dhchap")
CPU = (("host_cpu_us_per_io", "host"), ("target_cpu_us_per_io", "target"))


def mode_of(tls: object, dhchap: object) -> str:
    on, auth = tls == "on", dhchap not in (None, "off")
    return {(False, False): "plain", (False, True): "dhchap", (True, False): "tls", (True, True): "tls+dhchap"}[
        (on, auth)]


def app_label(app: str, iodepth: int, bs: int) -> str:
    if app == "T-app":
        return f"T-app QD{iodepth}"
    if app == "B-app":
        return f"B-app {bs // 1024} KiB QD{iodepth}"
    return app


def metrics_of(app: str) -> list[tuple[str, str, object, bool]]:
    """(column, name, formatter, higher is better) compared for an app."""
    if app == "L-app":
        return [("lat_mean_ns", "mean latency", us, False), ("lat_p99_ns", "p99 latency", us, False)]
    if app == "B-app":
        return [("bw_bytes", "bandwidth", mbps, True)]
    return [("iops", "IOPS", kiops, True)]


def prepared(rows: pd.DataFrame) -> pd.DataFrame:
    """Usable main rows with their app, security mode, DH group and CPU per I/O columns."""
    data = usable(rows)
    data = data[data["role"] == "main"] if not data.empty else data
    if data.empty:
        return data
    data = with_cores(with_knobs(data, ["app", "tls", "dhchap"]))
    data = data.assign(mode=[mode_of(t, d) for t, d in zip(data["tls"], data["dhchap"])],
                       group=[d if d not in (None, "off") else "—" for d in data["dhchap"]],
                       label=[app_label(str(a), int(q), int(b)) for a, q, b in
                              zip(data["app"], data["iodepth"], data["bs"])])
    return data


def analyze(measurements: pd.DataFrame, runs: pd.DataFrame) -> StudyResult:
    rows = study_rows(measurements, STUDY)
    out = StudyResult(STUDY, "Security: what TLS 1.3 and DH-HMAC-CHAP cost")
    out.excluded = excluded_points(rows)
    data = prepared(rows)
    if data.empty:
        out.findings.append("The security study has no usable measurements for any pair.")
        _skipped(rows, data, out)
        return out
    for pair in dict.fromkeys(data["leg"]):
        mine = data[data["leg"] == pair]
        _data_path(pair, mine[mine["app"] != "connect"], out)
        _connects(pair, mine[mine["app"] == "connect"], out)
    _skipped(rows, data, out)
    return out


def _mean(frame: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(frame[column], errors="coerce").dropna() if column in frame else pd.Series(dtype=float)
    return float(values.mean()) if len(values) else math.nan


def _data_path(pair: str, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        return
    target, _, host = pair.partition("/")
    title = f"{target} target × {host} host"
    labels = list(dict.fromkeys(data.sort_values(["app", "iodepth", "bs"], key=_app_order)["label"]))
    modes = [m for m in MODES if m in set(data["mode"])]
    records, ratios = [], {m: [] for m in modes if m != "plain"}
    for label in labels:
        for mode in modes:
            sel = data[(data["label"] == label) & (data["mode"] == mode)]
            if sel.empty:
                continue
            app = str(sel["app"].iloc[0])
            column = metrics_of(app)[0][0]
            plain = data[(data["label"] == label) & (data["mode"] == "plain")]
            records.append({"app": label, "mode": mode,
                            "mean (µs)": r1(_mean(sel, "lat_mean_ns"), 1e3), "p99 (µs)": r1(_mean(sel, "lat_p99_ns"), 1e3),
                            "KIOPS": r1(_mean(sel, "iops"), 1e3), "MB/s": r1(_mean(sel, "bw_bytes"), 1e6),
                            "host CPU µs/IO": r1(_mean(sel, "host_cpu_us_per_io"), 1.0, 2),
                            "target CPU µs/IO": r1(_mean(sel, "target_cpu_us_per_io"), 1.0, 2),
                            "÷ plain": round(ratio(_mean(sel, column), _mean(plain, column)), 3),
                            "repeats": len(sel)})
            if mode != "plain":
                ratios[mode].append(ratio(_mean(sel, column), _mean(plain, column)))
    out.tables.append(Table(f"{title}: security modes side by side", pd.DataFrame(records),
                            "Means over interleaved repeats. '÷ plain' is the app's own metric (latency for the "
                            "L-app: lower is better; IOPS or bandwidth otherwise: higher is better) over plain's. "
                            "CPU per I/O: user + system + softirq seconds of each side's cores (/proc/stat)."))
    if ratios:
        out.figures.append(Figure(
            f"security_{_file(pair)}_ratio", plots_extra.grouped_bars(
                labels, {m: v for m, v in ratios.items()}, title=f"{title}: each mode ÷ plain",
                ylabel="metric ÷ plain (L-app: latency; others: IOPS or MB/s)",
                better=["lower" if str(label).startswith("L-app") else "higher" for label in labels]),
            "1.0 is plain's value; below 1 for IOPS/bandwidth and above 1 for latency is a cost."))
    _findings(title, data, labels, modes, out)


# What the stacks that cannot say per point make of TLS records (stacks/*.py, host_tls_records); the
# kernel's is read per point (stacks/kernel_tls.py), and where it was not, it is unknown.
FIXED_RECORDS = {"kernel": "unknown (not read)", "spdk": "userspace (SPDK ssl sock)"}


def _target_records(stack: object, counters: object) -> str:
    """One TLS point's target-side record layer: ours from its /stats delta (ports[].tls_records and
    the connections kTLS took), the kernel's from the point's /proc/net/tls_stat difference, SPDK's
    by what it always does."""
    try:
        found = json.loads(counters) if isinstance(counters, str) else {}
    except ValueError:
        found = {}
    found = found if isinstance(found, dict) else {}
    if stack == "kernel":
        return kernel_tls.target_records(found)
    if stack in FIXED_RECORDS:
        return FIXED_RECORDS[str(stack)]
    ports = found.get("ports") or []
    ports = [p for p in ports if isinstance(p, dict) and p.get("tls_records")]
    if not ports:
        return "not recorded"
    chosen = "/".join(sorted({str(p["tls_records"]) for p in ports}))
    fallbacks = sum(int(p.get("ktls_fallbacks") or 0) for p in ports)
    return chosen + (f" ({fallbacks} connection(s) fell back to userspace)" if fallbacks else "")


def records_text(rows: pd.DataFrame) -> str:
    """'records: target ktls, host userspace' over TLS rows; ours runs --ktls auto, so the text says
    what auto became there instead of leaving the fallback silent."""
    if rows.empty:
        return "records: not recorded"
    target = sorted({_target_records(s, c) for s, c in zip(rows.get("target_stack", pd.Series(dtype=object)),
                                                           rows.get("target_counters_json", pd.Series(dtype=object)))})
    hosts = rows.get("host_tls_records", pd.Series(dtype=object))
    host = sorted({str(v) for v in hosts.dropna()}) or [FIXED_RECORDS.get(str(s), "not recorded")
                                                      for s in sorted(set(rows.get("host_stack", ["?"])))]
    auto = [side for side, stack in (("target", "target_stack"), ("host", "host_stack"))
            if "ours" in set(rows.get(stack, []))]
    note = f"; ours' --ktls auto chose this on the {' and '.join(auto)}" if auto else ""
    return f"records: target {' or '.join(target)}, host {' or '.join(host)}{note}"


def busy_loop_note(rows: pd.DataFrame) -> str:
    """Where a side is SPDK, its CPU per I/O is reactor polling time, not work done."""
    sides = [side for side, stack in (("target", "target_stack"), ("host", "host_stack"))
             if "spdk" in set(rows.get(stack, []))]
    if not sides:
        return ""
    return (f" On the SPDK {' and '.join(sides)} side CPU per I/O is busy-loop time: the reactor polls its core "
            "flat out whatever it serves, so it falls as throughput rises and is not the CPU TLS costs.")


def _findings(title: str, data: pd.DataFrame, labels: list[str], modes: list[str], out: StudyResult) -> None:
    """Each mode against plain per app: the app's metrics (one Holm family) and CPU per I/O on each
    side (another)."""
    cells, cpu_cells = [], []
    for mode in modes:
        if mode == "plain":
            continue
        for label in labels:
            a = data[(data["label"] == label) & (data["mode"] == "plain")]
            b = data[(data["label"] == label) & (data["mode"] == mode)]
            if a.empty or b.empty:
                continue
            app = str(b["app"].iloc[0])
            for column, name, fmt, _ in metrics_of(app):
                cells.append((mode, label, column, name, fmt, a, b, compare_frames(a, b, column)))
            for column, side in CPU:
                cpu_cells.append((mode, label, side, a, b, compare_frames(a, b, column)))
    main = corrected([c[-1] for c in cells])
    cpu = corrected([c[-1] for c in cpu_cells])
    cpu_text: dict[tuple[str, str], list[str]] = {}
    for (mode, label, side, a, b, _), d in zip(cpu_cells, cpu):
        mean_a, mean_b = _mean(a, f"{side}_cpu_us_per_io"), _mean(b, f"{side}_cpu_us_per_io")
        if math.isnan(mean_a) or math.isnan(mean_b):
            continue
        cpu_text.setdefault((mode, label), []).append(
            f"{side} CPU per I/O " + stated(d, _cpu_us, f"{pct(100 * (ratio(mean_b, mean_a) - 1))}",
                                            f"{mean_b:.2f} vs {mean_a:.2f} µs", "no clear difference"))
    said: dict[tuple[str, str], list[str]] = {}
    for (mode, label, column, name, fmt, a, b, _), d in zip(cells, main):
        mean_a, mean_b = _mean(a, column), _mean(b, column)
        said.setdefault((mode, label), []).append(
            f"{name} " + stated(d, fmt, pct(100 * (ratio(mean_b, mean_a) - 1)), f"{fmt(mean_b)} vs {fmt(mean_a)}",
                                "no clear difference"))
    for key, parts in said.items():
        mode, label = key
        extra = cpu_text.get(key, [])
        tls = data[(data["label"] == label) & (data["mode"] == mode)]
        records = f" ({records_text(tls)})" if mode.startswith("tls") else ""
        out.findings.append(f"{title}, {label}: {mode} vs plain{records}: " + "; ".join(parts + extra) + "."
                            + (busy_loop_note(data) if extra else ""))


def _connects(pair: str, data: pd.DataFrame, out: StudyResult) -> None:
    if data.empty:
        return
    target, _, host = pair.partition("/")
    title = f"{target} target × {host} host"
    data = data.assign(setting=[_setting(m, g) for m, g in zip(data["mode"], data["group"])])
    settings = list(dict.fromkeys(sorted(data["setting"], key=_setting_order)))
    records = []
    for setting in settings:
        sel = data[data["setting"] == setting]
        records.append({"connect": setting, "mean (ms)": r1(_mean(sel, "lat_mean_ns"), 1e6, 3),
                        "p99 (ms)": r1(_mean(sel, "lat_p99_ns"), 1e6, 3),
                        "connects/s": r1(_mean(sel, "iops"), 1.0),
                        "host CPU µs/connect": r1(_mean(sel, "host_cpu_us_per_io"), 1.0),
                        "target CPU µs/connect": r1(_mean(sel, "target_cpu_us_per_io"), 1.0),
                        "repeats": len(sel)})
    out.tables.append(Table(f"{title}: connect time", pd.DataFrame(records),
                            "nvmf-perf --connects: each operation connects the admin queue and one I/O queue "
                            "(TCP, TLS handshake, ICReq, Fabrics Connect, DH-HMAC-CHAP) and is timed until the I/O "
                            "queue is ready; the disconnect after it is in the CPU figures, not in the time."))
    out.figures.append(Figure(
        f"security_{_file(pair)}_connect",
        plots_extra.grouped_bars(settings, {"mean connect time": [
            _mean(data[data["setting"] == s], "lat_mean_ns") / 1e6 for s in settings]},
            title=f"{title}: time to connect a controller with one I/O queue", ylabel="mean connect time (ms)"),
        "What each controller of a reconnect storm pays, per security setting and DH group."))
    plain = data[data["setting"] == "plain"]
    if plain.empty:
        out.findings.append(f"{title}: no plain connects were measured, so connect costs cannot be compared.")
        return
    others = [s for s in settings if s != "plain"]
    diffs = corrected([compare_frames(plain, data[data["setting"] == s], "lat_mean_ns") for s in others])
    base = _mean(plain, "lat_mean_ns")
    held = f"; Holm over the {len(others)} settings" if len(others) > 1 else ""
    for setting, d in zip(others, diffs):
        mine = data[data["setting"] == setting]
        mean = _mean(mine, "lat_mean_ns")
        records = f"; {records_text(mine)}" if setting.startswith("TLS") else ""
        out.findings.append(f"{title}: " + claim(
            d, _ms, f"A connect with {setting} takes {_ms(mean)}, {ratio(mean, base):.2f}× a plain connect",
            f"connect time with {setting} against a plain connect",
            f"{_ms(mean)} vs {_ms(base)} plain{records}{held}") + ".")


def _setting(mode: str, group: str) -> str:
    if mode == "dhchap":
        return f"DH-HMAC-CHAP {group}"
    if mode == "tls+dhchap":
        return f"TLS + DH-HMAC-CHAP {group}"
    return "TLS" if mode == "tls" else "plain"


def _setting_order(setting: str) -> tuple[int, int]:
    groups = ["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]
    rank = next((i for i, g in enumerate(groups) if setting.endswith(g)), -1)
    kind = 0 if setting == "plain" else 1 if setting == "TLS" else 2 if setting.startswith("DH") else 3
    return kind, rank


def _app_order(column: pd.Series) -> pd.Series:
    if column.name == "app":
        return column.map({"L-app": 0, "T-app": 1, "B-app": 2}).fillna(3)
    return column


def _file(pair: str) -> str:
    return pair.replace("/", "_")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _cpu_us(value: float) -> str:
    return f"{value:.2f} µs"


def _skipped(rows: pd.DataFrame, data: pd.DataFrame, out: StudyResult) -> None:
    """Pairs (or their TLS/DH-HMAC-CHAP points) that did not run, with the first reason of each."""
    if rows.empty:
        return
    bad = rows[rows["status"] != "ok"] if "status" in rows else rows.iloc[0:0]
    seen: set[str] = set()
    for _, row in bad.iterrows():
        reason = row.get("error")
        key = f"{row.get('leg')}: {reason}"
        if key in seen or not isinstance(reason, str):
            continue
        seen.add(key)
        target, _, host = str(row.get("leg")).partition("/")
        out.findings.append(f"{target} target × {host} host: some points {row.get('status')} ({reason}).")
