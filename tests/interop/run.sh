#!/usr/bin/env bash
# Kernel interop suite: the stock Debian kernel under qemu as NVMe/TCP host and target.
# Installs what it needs, expects the release binaries built (make build), runs tests/interop.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/install-deps.sh >/dev/null
exec .venv/bin/pytest -q -p no:cacheprovider tests/interop "$@"
