"""The results database: `results.sqlite` plus `raw/` in one results directory.

Schema and column meanings: docs/results-schema.md. Each point is committed as soon as it is
measured, so an interrupted sweep keeps everything finished before the interruption.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .probes import PROBE_COLUMNS, PROBE_NAMES

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    study TEXT NOT NULL,
    spec_toml TEXT NOT NULL,
    env_json TEXT NOT NULL,
    git_rev TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE TABLE IF NOT EXISTS points (
    point_id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    point_key TEXT NOT NULL UNIQUE,
    study TEXT NOT NULL,
    leg TEXT NOT NULL,
    knobs_json TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'invalid', 'skipped')),
    error TEXT,
    fg_bg_shared_core INTEGER NOT NULL DEFAULT 0,
    started_at TEXT,
    finished_at TEXT
);
CREATE TABLE IF NOT EXISTS measurements (
    measurement_id INTEGER PRIMARY KEY,
    point_id INTEGER NOT NULL REFERENCES points(point_id) ON DELETE CASCADE,
    role TEXT NOT NULL {ROLE_CHECK},
    engine TEXT,
    knobs_json TEXT,
    iops REAL, bw_bytes REAL, read_iops REAL, write_iops REAL,
    total_ios INTEGER, runtime_ms INTEGER,
    lat_mean_ns REAL, lat_p50_ns REAL, lat_p90_ns REAL, lat_p99_ns REAL,
    lat_p99_9_ns REAL, lat_p99_99_ns REAL, lat_max_ns REAL,
    usr_cpu REAL, sys_cpu REAL, ctx INTEGER, voluntary_ctx INTEGER, involuntary_ctx INTEGER,
    perf_usr_s REAL, perf_sys_s REAL, target_usr_s REAL, target_sys_s REAL,
    histogram_json TEXT, target_counters_json TEXT,
    invariant_ok INTEGER, invariant_detail TEXT,
    target_stack_version TEXT, host_stack_version TEXT,
    intervals_json TEXT,
    outside_cpu_s REAL, steal_s REAL, noise_pct REAL, noisy INTEGER, noise_tries INTEGER,
    cpu_governor TEXT, throttle_events INTEGER, cpu_cores_json TEXT
);
CREATE INDEX IF NOT EXISTS measurements_point ON measurements(point_id);
"""
# main: a point's only load generator; fg/bg: the interference study's tenants; lg1, lg2, ...:
# further load generators of one point (busy-poll placement, contention's many storage apps).
ROLE_CHECK = "CHECK (role IN ('main', 'fg', 'bg') OR role GLOB 'lg[1-9]*')"
SCHEMA = SCHEMA.replace("{ROLE_CHECK}", ROLE_CHECK)

METRIC_COLUMNS = [
    "engine", "iops", "bw_bytes", "read_iops", "write_iops", "total_ios", "runtime_ms",
    "lat_mean_ns", "lat_p50_ns", "lat_p90_ns", "lat_p99_ns", "lat_p99_9_ns", "lat_p99_99_ns",
    "lat_max_ns", "usr_cpu", "sys_cpu", "ctx", "voluntary_ctx", "involuntary_ctx", "perf_usr_s",
    "perf_sys_s", "target_usr_s", "target_sys_s", "histogram_json", "target_counters_json",
    "invariant_ok", "invariant_detail", "target_stack_version", "host_stack_version", "intervals_json",
] + [
    # noise measured per point (sysstat.py)
    "outside_cpu_s", "steal_s", "noise_pct", "noisy", "noise_tries", "cpu_governor", "throttle_events",
    "cpu_cores_json",
]
NOISE_COLUMNS = ["outside_cpu_s REAL", "steal_s REAL", "noise_pct REAL", "noisy INTEGER", "noise_tries INTEGER",
                 "cpu_governor TEXT", "throttle_events INTEGER", "cpu_cores_json TEXT"]
# Columns added after the first release: stores made before them gain them on open.
LATER_COLUMNS = {"measurements": ["target_stack_version TEXT", "host_stack_version TEXT", "intervals_json TEXT"]
                 + NOISE_COLUMNS,
                 # what defined a point beyond its key: stack versions and hosts (Runner.identity)
                 "points": ["identity_json TEXT"]}
# Energy and network counters per point (probes.py, issue 24), appended after the noise columns.
METRIC_COLUMNS += PROBE_NAMES
LATER_COLUMNS["measurements"] += PROBE_COLUMNS
# Who made a TLS point's records on the host side (Stack.host_tls_records, issue 37), after those.
METRIC_COLUMNS += ["host_tls_records"]
LATER_COLUMNS["measurements"] += ["host_tls_records TEXT"]
# Knob columns of measurements(): spec names, in the order of docs/results-schema.md.
KNOB_COLUMNS = [
    "rw", "bs", "iodepth", "numjobs", "rwmixread", "rate_iops", "completion", "target_mode",
    "idle_poll_us", "hdr_digest", "data_digest", "so_priority", "tos", "busy_poll_us",
    "in_capsule_data_size", "io_queues", "backend", "backend_size", "bg_load_pct", "target_stack", "host_stack",
]
# Columns appended after fg_bg_shared_core, so the earlier ones keep their places.
APPENDED_COLUMNS = ["intervals_json"] + [c.split()[0] for c in NOISE_COLUMNS] + PROBE_NAMES + ["host_tls_records"]
FRAME_COLUMNS = (
    ["run_id", "study", "leg", "point_id", "point_key", "repeat", "role", "status", "error"]
    + ["engine"] + KNOB_COLUMNS + ["knobs_json"]
    + [c for c in METRIC_COLUMNS if c != "engine" and c not in APPENDED_COLUMNS] + ["fg_bg_shared_core"]
    + APPENDED_COLUMNS
)
DONE_STATUSES = ("ok", "invalid", "skipped")
# Before points could run more than three load generators, roles were limited to these.
OLD_ROLE_CHECK = "CHECK (role IN ('main', 'fg', 'bg'))"


class StoreError(Exception):
    """A results directory that cannot be used; the message names its path."""


class StoreBusy(StoreError):
    """Another run holds the results directory."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ResultsStore:
    """One results directory. Cheap to open; every write commits at once."""

    FILENAME = "results.sqlite"
    LOCKNAME = "results.lock"

    def __init__(self, directory: Path | str, read_only: bool = False):
        """`read_only`: for commands that only read (report, results, compare): the database is opened
        without writing, so a directory on a read-only mount or owned by another user works; only a
        database an older nvmflab wrote is opened for writing, to add the columns it lacks."""
        self.dir = Path(directory)
        self.path = self.dir / self.FILENAME
        self._lock_file = None
        # Stored points this session measures again (their stack version or host changed): not done.
        self.stale: set[str] = set()
        if self.path.exists():
            check_database(self.path)  # before anything is written into a file that may be another's
        if read_only and self._open_read_only():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.raw_dir = self.dir / "raw"
        self.raw_dir.mkdir(exist_ok=True)
        self._db = sqlite3.connect(self.path)
        try:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.executescript(SCHEMA)
            self._add_later_columns()
            self._widen_roles()
        except sqlite3.Error as error:
            self._db.close()
            raise StoreError(f"{self.path}: cannot use this results database ({error})") from None

    def _open_read_only(self) -> bool:
        """Open without writing; False when the schema must be made or upgraded first."""
        self.raw_dir = self.dir / "raw"
        try:
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)  # quotes odd names
        except sqlite3.Error as error:
            raise StoreError(f"{self.path}: cannot open the results database ({error})") from None
        try:
            tables = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            current = {"runs", "points", "measurements"} <= tables
            for table, columns in LATER_COLUMNS.items() if current else ():
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                current = current and all(column.split()[0] in have for column in columns)
        except sqlite3.Error as error:
            self._db.close()
            raise StoreError(f"{self.path}: not a usable results database ({error})") from None
        if current:
            return True
        self._db.close()  # empty or made by an older nvmflab: the writable open makes or upgrades it
        return False

    def lock(self) -> None:
        """Hold the directory for this run (flock on results.lock, released on close or exit): a
        second run into the same directory is refused at once instead of measuring beside it."""
        handle = open(self.dir / self.LOCKNAME, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise StoreBusy(f"{self.dir}: another nvmflab run ({holder}) is writing to this results directory; "
                            "wait for it to finish or give another --results") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {now()}\n")
        handle.flush()
        self._lock_file = handle

    def _add_later_columns(self) -> None:
        for table, columns in LATER_COLUMNS.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            with self._db:
                for column in columns:
                    if column.split()[0] not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    def _widen_roles(self) -> None:
        """Stores made when roles were only main/fg/bg get the wider check (extra load generators
        `lg1`, `lg2`, ...). SQLite cannot alter a CHECK, so the table is rebuilt with its rows."""
        (sql,) = self._db.execute("SELECT sql FROM sqlite_master WHERE name = 'measurements'").fetchone()
        if OLD_ROLE_CHECK not in sql:
            return
        with self._db:
            self._db.execute("ALTER TABLE measurements RENAME TO measurements_before_roles")
            self._db.execute(sql.replace(OLD_ROLE_CHECK, ROLE_CHECK))
            self._db.execute("INSERT INTO measurements SELECT * FROM measurements_before_roles")
            self._db.execute("DROP TABLE measurements_before_roles")  # and its index, made again below
            self._db.execute("CREATE INDEX measurements_point ON measurements(point_id)")

    def close(self) -> None:
        self._db.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def start_run(self, study: str, spec_toml: str, env: dict[str, Any]) -> int:
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO runs (study, spec_toml, env_json, git_rev, started_at) VALUES (?, ?, ?, ?, ?)",
                (study, spec_toml, json.dumps(env, sort_keys=True), env.get("git_rev"), now()))
        return int(cursor.lastrowid)

    def finish_run(self, run_id: int) -> None:
        with self._db:
            self._db.execute("UPDATE runs SET finished_at = ? WHERE run_id = ?", (now(), run_id))

    def done_keys(self) -> set[str]:
        """Keys of points that need no re-run (failed points are retried; stale ones are measured
        again, see `stale`)."""
        return set(self.done_identities()) - self.stale

    def done_identities(self) -> dict[str, dict[str, Any] | None]:
        """Each point that needs no re-run by key, with the identity it was measured under (None for
        points stored before identities were kept)."""
        marks = ",".join("?" * len(DONE_STATUSES))
        rows = self._db.execute(f"SELECT point_key, identity_json FROM points WHERE status IN ({marks})",
                                DONE_STATUSES)
        return {key: json.loads(ident) if ident else None for key, ident in rows}

    def study_spec(self, study: str) -> dict[str, Any] | None:
        """The effective spec of the latest run of `study` here (what filled the directory), or None."""
        rows = self._db.execute("SELECT env_json FROM runs WHERE study = ? ORDER BY run_id DESC", (study,))
        for (env_json,) in rows:
            try:
                spec = json.loads(env_json).get("spec_effective")
            except (ValueError, AttributeError):
                continue
            if spec is not None:
                return spec
        return None

    def save_point(self, run_id: int, key: str, study: str, leg: str, knobs: dict[str, Any], repeat: int,
                   status: str, error: str | None, measurements: list[dict[str, Any]],
                   fg_bg_shared_core: bool = False, started_at: str | None = None,
                   raw: dict[str, Any] | None = None, identity: dict[str, Any] | None = None) -> int:
        """Store one point with its measurements atomically, replacing an earlier failed attempt."""
        self.stale.discard(key)
        if raw is not None:
            (self.raw_dir / f"{key}.json").write_text(json.dumps(raw, indent=1, sort_keys=True))
        with self._db:
            self._db.execute("DELETE FROM measurements WHERE point_id IN "
                             "(SELECT point_id FROM points WHERE point_key = ?)", (key,))
            self._db.execute("DELETE FROM points WHERE point_key = ?", (key,))
            cursor = self._db.execute(
                "INSERT INTO points (run_id, point_key, study, leg, knobs_json, repeat, status, error, "
                "fg_bg_shared_core, started_at, finished_at, identity_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, key, study, leg, json.dumps(knobs, sort_keys=True, default=_json_default), repeat,
                 status, error, int(fg_bg_shared_core), started_at or now(), now(),
                 json.dumps(identity, sort_keys=True, default=_json_default) if identity is not None else None))
            point_id = int(cursor.lastrowid)
            for m in measurements:
                columns = ["point_id", "role", "knobs_json"] + [c for c in METRIC_COLUMNS if c in m]
                values = [point_id, m["role"], json.dumps(m.get("knobs", knobs), sort_keys=True,
                                                          default=_json_default)]
                values += [_sql_value(m[c]) for c in columns[3:]]
                self._db.execute(f"INSERT INTO measurements ({', '.join(columns)}) "
                                 f"VALUES ({', '.join('?' * len(columns))})", values)
        return point_id

    # -- reading -------------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        return pd.read_sql_query(
            "SELECT run_id, study, spec_toml, env_json, git_rev, started_at, finished_at FROM runs "
            "ORDER BY run_id", self._db)

    def points(self) -> pd.DataFrame:
        return pd.read_sql_query("SELECT * FROM points ORDER BY point_id", self._db)

    def measurements(self) -> pd.DataFrame:
        """One row per measurement; points without one appear once with NaN metrics."""
        metric_sql = ", ".join(f"m.{c}" for c in METRIC_COLUMNS)
        frame = pd.read_sql_query(
            "SELECT p.run_id, p.study, p.leg, p.point_id, p.point_key, p.repeat, "
            "COALESCE(m.role, 'main') AS role, p.status, p.error, p.knobs_json AS knobs_json, "
            "m.knobs_json AS m_knobs_json, p.fg_bg_shared_core, " + metric_sql + " "
            "FROM points p LEFT JOIN measurements m ON m.point_id = p.point_id "
            "ORDER BY p.point_id, m.measurement_id", self._db)
        knob_rows = [_knob_row(point, own) for point, own in zip(frame["knobs_json"], frame["m_knobs_json"])]
        knobs = pd.DataFrame(knob_rows, columns=KNOB_COLUMNS, index=frame.index)
        frame = pd.concat([frame.drop(columns=["m_knobs_json"]), knobs], axis=1)
        frame["bg_load_pct"] = pd.to_numeric(frame["bg_load_pct"], errors="coerce").astype(float)
        frame["invariant_ok"] = frame["invariant_ok"].map(lambda v: None if pd.isna(v) else bool(v)).astype(object)
        frame["noisy"] = frame["noisy"].map(lambda v: None if pd.isna(v) else bool(v)).astype(object)
        frame["fg_bg_shared_core"] = frame["fg_bg_shared_core"].astype(bool)
        for column in ("hdr_digest", "data_digest"):
            frame[column] = frame[column].map(lambda v: None if v is None or pd.isna(v) else bool(v)).astype(object)
        return frame[FRAME_COLUMNS]


def check_database(path: Path) -> None:
    """Refuse a file that is not an nvmflab results database (StoreError naming the path)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise StoreError(f"{path}: cannot read ({error.strerror})") from None
    if not head:
        return  # empty: a database made just now; the schema fills it
    if head != b"SQLite format 3\x00":
        raise StoreError(f"{path}: not a results database (not an SQLite file); move it away or give "
                         "another results directory")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error as error:
        raise StoreError(f"{path}: not a usable results database ({error})") from None
    if tables and not {"runs", "points", "measurements"} <= tables:
        raise StoreError(f"{path}: an SQLite database of something else (tables: {', '.join(sorted(tables))}), "
                         "not nvmflab results; give another results directory")


def _knob_row(point_json: str, own_json: str | None) -> list[Any]:
    knobs = json.loads(point_json)
    if isinstance(own_json, str):  # NULL comes back as NaN
        knobs |= json.loads(own_json)
    if "io_queues" not in knobs and "numjobs" in knobs:
        knobs["io_queues"] = knobs["numjobs"]
    for side in ("target_stack", "host_stack"):
        knobs.setdefault(side, "ours")  # points stored before stacks were chosen ran on ours
    row = [knobs.get(c) for c in KNOB_COLUMNS]
    bg = knobs.get("bg_load_pct")
    row[KNOB_COLUMNS.index("bg_load_pct")] = math.inf if bg == "max" else (math.nan if bg is None else float(bg))
    return row


def _sql_value(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)
