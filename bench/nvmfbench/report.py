"""What a bench run found, as one JSON document (bench/results.json) and as Markdown tables
(printed, and written beside the JSON for bench/README.md). Pure: takes the runs, gives text."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nvmflab.sysstat import CONGESTION

from . import bound, cipher, goals, speed, stats
from .matrix import EVENT, EVENT_WORK
from .stacks import SPDK_SPEC

PAIRS = (("spdk", "spdk", "SPDK tgt x spdk_nvme_perf"), ("ours", "ours", "ours x nvmf-perf"),
         ("ours", "spdk", "ours tgt x spdk_nvme_perf"), ("spdk", "ours", "SPDK tgt x nvmf-perf"))
# SPDK's target with C2HData SUCCESS only where the specification allows it (stacks.SPDK_SPEC):
# shown when the bench ran it.
SPEC_PAIRS = ((SPDK_SPEC, "spdk", "SPDK-spec tgt x spdk_nvme_perf"), (SPDK_SPEC, "ours", "SPDK-spec tgt x nvmf-perf"))
# Both sides with TLS 1.3 (issue 20 item 5): shown when the bench ran them.
TLS_PAIRS = (("spdk-tls", "spdk-tls", "TLS: SPDK tgt x spdk_nvme_perf"), ("ours-tls", "ours-tls", "TLS: ours x nvmf-perf"),
             ("ours-tls", "spdk-tls", "TLS: ours tgt x spdk_nvme_perf"), ("spdk-tls", "ours-tls", "TLS: SPDK tgt x nvmf-perf"))


def pairs_run(table: dict[tuple[str, str, str], Any]) -> tuple[tuple[str, str, str], ...]:
    """The matrix's columns: the four pairs always, the SPDK-spec and TLS ones when they ran."""
    ran = {(t, h) for t, h, _ in table}
    return PAIRS + tuple(p for p in SPEC_PAIRS + TLS_PAIRS if (p[0], p[1]) in ran)


# /proc/cpuinfo's vendor_id, as bench/README.md names the machines it keeps figures for.
VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}
CPU_SIDES = ("host_usr", "host_sys", "target_usr", "target_sys")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def machine(cpuinfo: str | None = None, congestion: str | None = None) -> dict[str, Any]:
    """Where the numbers came from: the CPU model and vendor (from /proc/cpuinfo), cores, kernel, and
    the TCP congestion control every stack's sockets get (a pacing one, bbr, bounded 128 KiB writes
    on the development VM: bench/README.md)."""
    if cpuinfo is None:
        cpuinfo = _read("/proc/cpuinfo") or ""
    if congestion is None:
        congestion = (_read(CONGESTION) or "unknown").strip()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "vendor_id", "CPU implementer"):
            fields.setdefault(key.strip(), value.strip())
    vendor_id = fields.get("vendor_id") or fields.get("CPU implementer")
    return {"cpu": fields.get("model name"), "vendor": VENDORS.get(vendor_id or "", vendor_id or "unknown"),
            "cores": os.cpu_count(), "kernel": platform.release(), "hostname": platform.node(),
            "tcp_congestion": congestion}


def floor_summary(floor_runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for (mode,), runs in stats.group(floor_runs, ("mode",)).items():
        chosen, note = stats.pick_clean(runs)
        out[mode] = {"mean_ns": stats.median_of(chosen, "mean_ns"), "p50_ns": stats.median_of(chosen, "p50_ns"),
                     "p99_99_ns": stats.median_of(chosen, "p99_99_ns"),
                     "runs": len(runs), "used": len(chosen), "note": note}
    return out


def assemble(runs: list[dict[str, Any]], floor_runs: list[dict[str, Any]], works: list[str], config: dict[str, Any],
             spdk_missing: str | None, scaling: list[dict[str, Any]], memory: list[dict[str, Any]],
             noise_limit_pct: float | None, cipher_records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    table = stats.cells(runs)
    cipher_records = cipher_records or []
    bounds = bound.bound_rows(table, runs, cipher_records)
    floors = floor_summary(floor_runs)
    floor_means = {mode: f["mean_ns"] for mode, f in floors.items()}
    event = table.get((EVENT, EVENT, EVENT_WORK.name), {})
    qd1 = EVENT_WORK.name
    multiples = {}
    for t, h, label in pairs_run(table):
        mean = table.get((t, h, qd1), {}).get("lat_mean_ns")
        multiples[f"{label}, polling: QD1 mean / busy ping-pong"] = _r(stats.ratio(mean, floor_means.get("busy")))
    multiples["ours x nvmf-perf, event mode: QD1 mean / blocking ping-pong"] = \
        _r(stats.ratio(event.get("lat_mean_ns"), floor_means.get("blocking")))
    all_runs = stats.usable(runs + floor_runs + scaling)
    noisy = sum(1 for r in all_runs if r.get("noisy"))
    probes = [p for r in all_runs for p in r.get("probe_ns") or []]
    return {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": config,
        "spdk": spdk_missing or "built",
        "noise": {"limit_pct": noise_limit_pct, "runs": len(all_runs), "noisy": noisy,
                  "slow_machine": sum(1 for r in all_runs if r.get("slow_machine")),
                  "slow_limit": speed.SLOW_LIMIT, "fastest_probe_ns": _r(min(probes), 0) if probes else None,
                  "failed": len(runs + floor_runs + scaling) - len(all_runs)},
        "matrix": [{"target": k[0], "host": k[1], "work": k[2]} | _rounded(v) for k, v in sorted(table.items())],
        "ratios": stats.comparison_rows(table, works),
        "floor": floors,
        "qd1_over_floor": multiples,
        "goals": goals.goal_rows(table, floors, event or None, spdk_missing or "", runs, bounds),
        "cipher": cipher_summary(cipher_records),
        "tls_bound": [{k: v for k, v in b.items() if k != "cells"} for b in bounds],
        "cpu_per_gib": cpu_summary(runs),
        "scaling": scaling_summary(scaling),
        "memory": memory_summary(memory),
        "runs": runs,
        "floor_runs": floor_runs,
        "scaling_runs": scaling,
    }


def cipher_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite, the core, per size and direction the rate the limit takes (the faster
    implementation's median, slow-phase measurements left out as bound.bound_rows marked them)
    with each implementation's median and which one it took, what was slow, failures, every record."""
    rates, per_impl, took, all_slow, slow = {}, {}, {}, [], 0
    for size in sorted({r["size"] for r in records}):
        rates[str(size)], per_impl[str(size)], took[str(size)] = {}, {}, {}
        for op in cipher.OPS:
            medians, slow_only = cipher.by_impl(records, size, op)
            best = max(medians, key=medians.__getitem__) if medians else None
            rates[str(size)][op] = _r(medians[best], 0) if best else None
            per_impl[str(size)][op] = {impl: _r(v, 0) for impl, v in medians.items()}
            took[str(size)][op] = best
            if slow_only:
                all_slow.append(f"{size >> 10} KiB {op}")
            else:
                slow += sum(1 for r in records if r["size"] == size and r["op"] == op and r.get("slow_machine"))
    return {"suite": cipher.SUITE, "cores": sorted({r["core"] for r in records}), "rates_bps": rates,
            "by_impl_bps": per_impl, "limit_impl": took, "slow": slow, "all_slow": all_slow,
            "errors": sorted({r["error"] for r in records if r.get("error")}), "records": records}


def cpu_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (target, host, work) cell that recorded it (the 128 KiB ones, polling and event
    mode): the median over its clean runs of each side's user and system CPU seconds per GiB."""
    out = []
    for (t, h, work), group in sorted(stats.group(stats.usable(runs), ("target", "host", "work")).items()):
        chosen, _ = stats.pick_clean(group)
        values = {f"{side}_s_per_gib": _r(stats.median_of(chosen, f"{side}_s_per_gib"), 4) for side in CPU_SIDES}
        if work.startswith("128k") and any(v is not None for v in values.values()):
            out.append({"target": t, "host": h, "work": work, "used": len(chosen)} | values)
    return out


def scaling_summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for (reactors,), group in sorted(stats.group(runs, ("reactors",)).items()):
        c = stats.cell(group)
        out.append({"reactors": reactors, "numjobs": group[0].get("numjobs"), "iodepth": group[0].get("iodepth"),
                    "iops": _r(c["iops"], 0), "used": c["used"], "runs": c["runs"], "note": c["note"]})
    return out


def memory_summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The points, and bytes per queue for each target stack measured."""
    from .memory import bytes_per_queue

    slopes = {}
    for (stack,), group in stats.group(points, ("stack",)).items():
        ok = [p for p in group if p.get("rss_bytes") is not None and p.get("queues")]
        slopes[stack] = _r(bytes_per_queue([(p["queues"], p["rss_bytes"]) for p in ok]), 0)
    return {"points": points, "bytes_per_queue": slopes}


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(cell: dict[str, Any]) -> dict[str, Any]:
    return {k: (_r(v, 1) if isinstance(v, float) else v) for k, v in cell.items()}


# -- Markdown ------------------------------------------------------------------------------------

def _fmt_cell(c: dict[str, Any] | None, work: str) -> str:
    if not c or c.get("iops") is None:
        return "—"
    if work.startswith("128k"):
        text = f"{c['bw_bytes'] / 1e9:.2f} GB/s"
        lo, hi = c.get("bw_bytes_range") or (None, None)
        if lo is not None:
            text += f" ({lo / 1e9:.1f}–{hi / 1e9:.1f})"
    else:
        text = f"{c['iops'] / 1000:.0f} K, {c['lat_mean_ns'] / 1000:.1f} µs"
    if c.get("lat_p99_99_ns") is not None and work.endswith("QD1"):
        text += f", p99.99 {c['lat_p99_99_ns'] / 1000:.0f} µs"
    return text + _mark(c)


def _mark(c: dict[str, Any]) -> str:
    """* when every run of the cell was noisy, † when some noisy runs were left out."""
    if not c.get("noisy"):
        return ""
    return " *" if str(c.get("note", "")).startswith("all ") else " †"



def markdown(results: dict[str, Any]) -> str:
    """Every section the run has data for, as Markdown."""
    sections = [_header(results), _matrix(results), _ratios(results), _bound(results), _cpu(results), _floor(results),
                _goals(results), _scaling(results), _memory(results), _classic(results)]
    return "\n\n".join(s for s in sections if s) + "\n"


def _set_for_run(cfg: dict[str, Any]) -> str:
    """What --tcp-congestion changed: the machine's own setting is another one."""
    chosen, own = cfg.get("tcp_congestion_set"), cfg.get("tcp_congestion_machine")
    return f" set for this run with --tcp-congestion; the machine's own is {own}" if chosen and own != chosen else ""


def _header(results: dict[str, Any]) -> str:
    m, cfg, noise = results["machine"], results["config"], results["noise"]
    text = (f"Measured {results['when']} on {m['cpu']} ({m.get('vendor', 'unknown')}, {m['cores']} cores, "
            f"Linux {m['kernel']}, TCP congestion control {m.get('tcp_congestion', 'unknown')}{_set_for_run(cfg)}); "
            f"{cfg['rounds']} interleaved rounds of {cfg['seconds']} s (+{cfg['ramp']} s ramp), target busy-polling "
            f"on core {cfg['target_core']}, host on core {cfg['host_core']}, null namespace. SPDK: {results['spdk']}.\n\n")
    if noise["limit_pct"] is None:
        return text + ("Noise: recorded per run, no limit (NVMFLAB_NOISE_LIMIT_PCT=off): every run is in the medians. "
                       f"Failed runs: {noise['failed']}.")
    slow = ""
    if noise.get("fastest_probe_ns"):
        slow = (f" {noise['slow_machine']} of them ran while the machine itself was more than "
                f"{noise['slow_limit']:g}x slower than its fastest phase (speed probe: a {speed.PROBE_S:g} s busy "
                f"ping-pong before and after each run; fastest {noise['fastest_probe_ns'] / 1000:.1f} us; runs waited "
                f"{results['config'].get('waited_for_fast_phase_s', 0):g} s in all for a fast phase).")
    return text + (f"Noise: {noise['noisy']} of {noise['runs']} runs were noisy: other processes used more than "
                   f"{noise['limit_pct']:g} % of the two cores, or the machine was slow.{slow} † noisy runs left "
                   "out of the median; * every run of the cell was noisy, so the median is over all of them and is "
                   f"the busy machine's number as much as the stack's. Failed runs: {noise['failed']}.")


def _matrix(results: dict[str, Any]) -> str:
    if not results["matrix"]:
        return ""
    cells = {(c["target"], c["host"], c["work"]): c for c in results["matrix"]}
    pairs = pairs_run(cells)
    lines = ["| work | " + " | ".join(label for *_, label in pairs) + " |", "|---|" + "---|" * len(pairs)]
    for work in results["config"]["works"]:
        lines.append(f"| {work} | " + " | ".join(_fmt_cell(cells.get((t, h, work)), work) for t, h, _ in pairs) + " |")
    events = [f"{work}: {_fmt_cell(cells[(EVENT, EVENT, work)], work)}"
              for work in dict.fromkeys([EVENT_WORK.name, *results["config"]["works"]]) if (EVENT, EVENT, work) in cells]
    if events:
        lines += ["", "Event mode (our reactor and host sleep when idle), ours x nvmf-perf: " + "; ".join(events) + "."]
    failed = sorted({f"{r['target']} x {r['host']}, {r['work']}: {r['error']}" for r in results["runs"]
                     if r.get("error")})
    if failed:
        lines += ["", "Failed runs: " + "; ".join(failed) + "."]
    return "\n".join(lines)


def _ratios(results: dict[str, Any]) -> str:
    if not results["ratios"]:
        return ""
    lines = ["Ratios of medians (subject / baseline; throughput is IOPS and bandwidth alike; for latency below 1 is "
             "better):", "", "| comparison | work | throughput | mean latency | p99.99 |", "|---|---|---|---|---|"]
    for r in results["ratios"]:
        lines.append(f"| {r['comparison']} | {r['work']} | {_x(r['iops_ratio'])} | "
                     f"{_x(r['lat_mean_ns_ratio'])} | {_x(r['lat_p99_99_ns_ratio'])} |")
    return "\n".join(lines)


def _cpu(results: dict[str, Any]) -> str:
    rows = results.get("cpu_per_gib") or []
    if not rows:
        return ""
    labels = {(t, h): label for t, h, label in pairs_run({(r["target"], r["host"], r["work"]): r for r in rows})}
    labels[(EVENT, EVENT)] = "ours x nvmf-perf, event mode"
    lines = ["CPU seconds per GiB moved at 128 KiB (user / system, from each process's counters over the run; a "
             "polling process spins its core, so only event mode shows the work done):", "",
             "| pair | work | host user | host system | target user | target system |", "|---|---|---|---|---|---|"]
    for r in rows:
        label = labels.get((r["target"], r["host"]), f"{r['target']} x {r['host']}")
        lines.append(f"| {label} | {r['work']} | " + " | ".join(_s(r[f"{side}_s_per_gib"]) for side in CPU_SIDES) + " |")
    return "\n".join(lines)


def _bound(results: dict[str, Any]) -> str:
    """The TLS rows against the limit AES-GCM puts on them (nvmfbench.cipher), after the rates."""
    rows, found = results.get("tls_bound") or [], results.get("cipher") or {}
    if not rows:
        return ""
    cores = ", ".join(str(c) for c in found.get("cores") or []) or "—"
    lines = [f"Cipher bound: {found.get('suite', cipher.SUITE)}, per size and direction the faster of OpenSSL's EVP "
             f"(`openssl speed -aead`) and our record layer (`nvmf-bench aead`), CPU time, pinned to core {cores}, "
             f"each round before its targets start: {_cipher_rates(found) or 'not measured'}"
             + (f" (failed: {'; '.join(found['errors'])})" if found.get("errors") else "") + f". {_cipher_slow(found)}"
             "Limit = 1 / (1/plain IOPS + cipher time per I/O): records of up to 16 KiB, both directions at QD1 (the "
             "sealing and the opening side take turns), the slower direction alone at higher depths (each side on its "
             "core). The last two columns take OpenSSL's EVP rate alone, the bound as issue 40 states it: "
             "looser wherever our record layer's ring is the faster." + _sockbuf_note(results), "",
             "| pair | work | plain | TLS | limit | TLS / limit | per round (95 %) | limit, OpenSSL's EVP alone "
             "| TLS / it; per round (95 %) |", "|---|---|---|---|---|---|---|---|---|"]
    for b in rows:
        bs = bound.WORKS[b["work"]].bs
        lines.append(f"| {b['pair']} | {b['work']} | {_io(b['plain_iops'], bs)} | {_io(b['tls_iops'], bs)} | "
                     f"{_io(b['limit_iops'], bs)} | {_x(b['value'])}"
                     + (f" ({b['why_missing']})" if b["why_missing"] else "") + f" | {_interval(b['per_round'])} | "
                     f"{_io(b.get('evp_limit_iops'), bs)} | {_x(b.get('evp_value'))}; {_interval(b.get('evp_per_round'))} |")
    return "\n".join(lines)


def _sockbuf_note(results: dict[str, Any]) -> str:
    """What spdk_nvme_perf's TLS runs ran with, where any did (Bench.measure records it)."""
    floors = {r["host_sockbuf"] for r in results.get("runs") or [] if r.get("host_sockbuf")}
    if not floors:
        return ""
    return (f" spdk_nvme_perf over TLS ran with its ssl socket's buffers raised to {max(floors) >> 20} MiB, as its posix "
            "socket's (a preloaded shim, python/nvmflab/stacks/spdk_sockbuf.c: SPDK 24.01 fixes them at 4 and 64 KiB).")


def _cipher_rates(found: dict[str, Any]) -> str:
    """"4 KiB encrypt 3.10 GB/s (nvmf-tls; openssl-evp 2.50 GB/s), ...": the limit's rate, which
    implementation gave it, and the other's."""
    sizes = []
    for size, ops in (found.get("rates_bps") or {}).items():
        parts = []
        for op, rate in ops.items():
            took = (found.get("limit_impl") or {}).get(size, {}).get(op)
            each = (found.get("by_impl_bps") or {}).get(size, {}).get(op) or {}
            named = [took] + [f"{impl} {_gbps(v)}" for impl, v in each.items() if impl != took] if took else []
            parts.append(f"{op} {_gbps(rate)}" + (f" ({'; '.join(named)})" if named else ""))
        sizes.append(f"{int(size) >> 10} KiB " + ", ".join(parts))
    return "; ".join(sizes)


def _cipher_slow(found: dict[str, Any]) -> str:
    """How many cipher measurements a slow phase of the machine left out, and where all were slow."""
    text = f"{found['slow']} measurement(s) from a slow phase left out. " if found.get("slow") else ""
    if found.get("all_slow"):
        text += f"Every measurement slow, all used: {', '.join(found['all_slow'])}. "
    return text


def _interval(found: list[float] | tuple[float, ...] | None) -> str:
    """(mean, low, high, rounds) of bound.per_round, as the goals table writes it."""
    if not found:
        return "—"
    mean, low, high, n = found
    return f"{mean:.2f}× ({low:.2f}-{high:.2f}, {n} rounds)"


def _gbps(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e9:.2f} GB/s"


def _io(iops: float | None, bs: int) -> str:
    """IOPS at 4 KiB, bandwidth at 128 KiB, as the matrix shows them."""
    if iops is None:
        return "—"
    return f"{iops * bs / 1e9:.2f} GB/s" if bs >= 128 << 10 else f"{iops / 1000:.0f} K"


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def readme_with_latest(readme: str, vendor: str, block: str) -> str:
    """bench/README.md with `block` as the latest figures for `vendor`'s CPUs: replaces the block
    kept for that vendor, or adds one at the top of the latest results. Figures of other vendors'
    machines stay, so the README keeps the latest run of each."""
    start, end = f"<!-- latest {vendor} -->", f"<!-- end latest {vendor} -->"
    section = f"{start}\n### Latest on {vendor}\n\n{block.strip()}\n{end}"
    if start in readme and end in readme:
        head, rest = readme.split(start, 1)
        return head + section + rest.split(end, 1)[1]
    anchor = "## Latest results\n"
    if anchor in readme:
        head, rest = readme.split(anchor, 1)
        return f"{head}{anchor}\n{section}\n{rest}"
    return readme.rstrip("\n") + f"\n\n{anchor}\n{section}\n"


def _floor(results: dict[str, Any]) -> str:
    if not results["floor"]:
        return ""
    lines = ["Floor (nvmf-bench pingpong, 72-byte request, 4144-byte reply = a 4 KiB read on the wire):", ""]
    for mode, f in results["floor"].items():
        mean = "—" if f["mean_ns"] is None else f"{f['mean_ns'] / 1000:.1f} µs"
        p50 = "" if f.get("p50_ns") is None else f", p50 {f['p50_ns'] / 1000:.1f} µs"
        p9999 = "" if f.get("p99_99_ns") is None else f", p99.99 {f['p99_99_ns'] / 1000:.0f} µs"
        lines.append(f"- {mode} ping-pong: mean {mean}{p50}{p9999}" + (f" ({f['note']})" if f["note"] else ""))
    lines += ["", "| QD1 mean latency as a multiple of the floor | × |", "|---|---|"]
    lines += [f"| {label} | {_x(value)} |" for label, value in results["qd1_over_floor"].items()]
    return "\n".join(lines)


def _goals(results: dict[str, Any]) -> str:
    if not results["matrix"]:
        return ""
    lines = ["Goals (issues 9, 26, 20 and 40): the ratio of the medians decides the status; per round: the geometric "
             "mean of the ratios of each round's two runs, its 95 % interval, and which side of the goal the "
             "whole interval lies on (clean rounds only).", "",
             "| goal | measured | status | per round (95 %) |", "|---|---|---|---|"]
    lines += [f"| {g['goal']} | {_x(g['value'])} | {g['status']} | {_per_round(g.get('per_round'))} |"
              for g in results["goals"]]
    return "\n".join(lines)


def _per_round(p: dict[str, Any] | None) -> str:
    if not p:
        return "—"
    return f"{p['mean']:.2f}× ({p['low']:.2f}-{p['high']:.2f}, {p['rounds']} rounds): {p['decided']}"


def _scaling(results: dict[str, Any]) -> str:
    if not results["scaling"]:
        return ""
    lines = ["Scaling (our target, 4 KiB randread, polling):", "", "| reactors | host jobs x depth | IOPS |",
             "|---|---|---|"]
    for s in results["scaling"]:
        iops = "—" if s["iops"] is None else f"{s['iops'] / 1000:.0f} K"
        lines.append(f"| {s['reactors']} | {s['numjobs']} x {s['iodepth']} | {iops}"
                     + (f" ({s['note']})" if s["note"] else "") + " |")
    return "\n".join(lines)


def _memory(results: dict[str, Any]) -> str:
    mem = results["memory"]
    if not mem["points"]:
        return ""
    lines = ["Memory (the target's VmRSS, I/O queues connected at QD128 after one full-depth round; SPDK only up "
             "to 100 queues, its 1 GiB DPDK heap holds about 250):", "",
             "| target | I/O queues | RSS idle | RSS with queues |", "|---|---|---|---|"]
    for p in mem["points"]:
        if p.get("error"):
            lines.append(f"| {p['stack']} | {p.get('queues_wanted')} | — | failed: {p['error']} |")
        else:
            lines.append(f"| {p['stack']} | {p['queues']} | {_mib(p['rss_idle_bytes'])} | {_mib(p['rss_bytes'])} |")
    slopes = [f"{stack} {value / 1024:.0f} KiB" for stack, value in mem["bytes_per_queue"].items() if value is not None]
    if slopes:
        lines += ["", f"Bytes per queue (least-squares slope of RSS over queues): {', '.join(slopes)}."]
    return "\n".join(lines)


def _classic(results: dict[str, Any]) -> str:
    rows = results.get("classic") or []
    if not rows:
        return ""
    lines = ["Classic comparisons (subject / baseline):", "", "| comparison | IOPS | p99 |", "|---|---|---|"]
    lines += [f"| {r['comparison']} | {_x(r.get('iops_ratio'))} | {_x(r.get('p99_us_ratio'))} |" for r in rows]
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / (1 << 20):.1f} MiB"
