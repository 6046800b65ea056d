#!/usr/bin/env bash
# Kernel interop suite: the stock Debian kernel under qemu as NVMe/TCP host and target.
# Installs what it needs, expects the release binaries built (make build), runs tests/interop.
#
# It runs from a copy of the release binaries (NVMFLAB_BIN_DIR, unless already set): `make test`
# runs it beside the trixie guests, whose RDMA check links RDMA builds at target/release for a
# moment (tests/rdma/check.py) before putting the TCP-only ones back.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/install-deps.sh >/dev/null
if [ -z "${NVMFLAB_BIN_DIR:-}" ]; then
    copy=.cache/interop-bin
    rm -rf "$copy" && mkdir -p "$copy"
    for name in nvmf-target nvmf-perf nvmf-target-ctl; do
        [ -x "target/release/$name" ] || { echo "interop: target/release/$name missing: run make build first" >&2; exit 1; }
        cp "target/release/$name" "$copy/"
    done
    export NVMFLAB_BIN_DIR=$PWD/$copy
fi
exec .venv/bin/pytest -q -p no:cacheprovider --durations=15 tests/interop "$@"
