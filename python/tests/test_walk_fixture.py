"""The walk fixture (data/walk_results.sqlite.gz, made by scripts/regen-walk-fixture.sh) has the
current store's schema: a column the store gained since it was made (say host_tls_records) would
leave the findings gate and the figure checks walking data without it, so a stale fixture fails
here, with the command that regenerates it."""

import gzip
import shutil
import sqlite3
from pathlib import Path

from nvmflab.store import ResultsStore

FIXTURE = Path(__file__).parent / "data" / "walk_results.sqlite.gz"
REGENERATE = "run scripts/regen-walk-fixture.sh to regenerate it"


def columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's column names."""
    tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")} for table in tables}


def test_the_walk_fixture_has_the_current_stores_schema(tmp_path):
    with gzip.open(FIXTURE, "rb") as packed, open(tmp_path / "fixture.sqlite", "wb") as out:
        shutil.copyfileobj(packed, out)
    fixture = sqlite3.connect(tmp_path / "fixture.sqlite")
    try:
        have = columns(fixture)
    finally:
        fixture.close()
    with ResultsStore(tmp_path / "fresh") as store:  # what the store makes today
        want = columns(store._db)
    assert set(have) == set(want), f"the fixture's tables {sorted(have)} are not the store's {sorted(want)}: {REGENERATE}"
    stale = {table: sorted(want[table] ^ have[table]) for table in want if want[table] != have[table]}
    assert not stale, f"the walk fixture's columns differ from the store's ({stale}): {REGENERATE}"
