#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test nvmflab.
# Idempotent: installs only missing packages. Needs root (or sudo) for apt.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config iproute2 procps
  python3 python3-venv
  chromium                                   # headless check of the HTML report
)
# Kernel interop under qemu (tests/interop) needs these too.
INTEROP_PACKAGES=(qemu-system-x86 linux-image-amd64 busybox-static nvme-cli fio kmod cpio lz4)

want=("${APT_PACKAGES[@]}")
if [ "${NVMFLAB_SKIP_INTEROP:-0}" != "1" ]; then want+=("${INTEROP_PACKAGES[@]}"); fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  missing+=(cargo rustc)
fi

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: ok"
