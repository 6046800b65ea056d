#!/bin/sh
# Regenerate python/tests/data/walk_results.sqlite.gz, the results database the findings gate and
# the figure checks walk (test_findings_gate.py, test_figures_honest.py): `nvmflab study all --quick`
# on the fake binaries, as test_cli.test_quick_studies_run_every_leg runs it (python/tests/fakebin,
# python/tests/fakepath first on PATH for a fake iperf3, FAKE_PERF_SLEEP=0, no SPDK build), with a
# fixed order seed, gzipped without a name or time stamp. Run it when the store's schema or a study's
# legs change; test_walk_fixture.py fails while the fixture's columns differ from the store's.
# Usage: scripts/regen-walk-fixture.sh   (PYTHON=... to use another interpreter than .venv's)
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
fixture=$repo/python/tests/data/walk_results.sqlite.gz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
mkdir "$work/no-spdk" "$work/pids"
cd "$repo"
env NVMFLAB_BIN_DIR="$repo/python/tests/fakebin" PATH="$repo/python/tests/fakepath:$PATH" FAKE_PERF_SLEEP=0 \
    NVMFLAB_SPDK_DIR="$work/no-spdk" FAKE_PID_DIR="$work/pids" FAKE_PERF_LOG="$work/perf.log" \
    FAKE_COUNTS="$work/counts" PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -c "from nvmflab.cli import main; main()" study all --quick --order-seed 37 --results "$work/r" \
    > "$work/study.log" 2>&1 || { tail -n 20 "$work/study.log" >&2; echo "regen-walk-fixture: the study run failed" >&2; exit 1; }
"$python" -c 'import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); db.execute("VACUUM"); db.close()' "$work/r/results.sqlite"
gzip -9 -n -c "$work/r/results.sqlite" > "$work/fixture.gz"
mv "$work/fixture.gz" "$fixture"
echo "regen-walk-fixture: wrote $fixture ($(wc -c < "$fixture") bytes)"
