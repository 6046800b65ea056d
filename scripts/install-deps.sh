#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test nvmflab.
# Idempotent: installs only missing packages. Needs root (or sudo) for apt.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config iproute2 procps
  python3 python3-venv
  chromium                                   # headless check of the HTML report
)
# Kernel interop under qemu (tests/interop) and the SSH topology tests (sshd in namespaces) need these too.
INTEROP_PACKAGES=(qemu-system-x86 linux-image-amd64 busybox-static nvme-cli fio kmod cpio lz4
                  openssh-server openssh-client)
# Building SPDK from ../shared/peers (scripts/build-spdk.sh); see ../shared/peers/README.md.
SPDK_PACKAGES=(dpdk-dev libdpdk-dev pkg-config libnuma-dev libaio-dev uuid-dev libssl-dev libjson-c-dev
               libcunit1-dev python3-pyelftools meson ninja-build libncurses-dev)

want=("${APT_PACKAGES[@]}")
if [ "${NVMFLAB_SKIP_INTEROP:-0}" != "1" ]; then want+=("${INTEROP_PACKAGES[@]}"); fi
if [ "${NVMFLAB_SKIP_SPDK:-0}" != "1" ]; then want+=("${SPDK_PACKAGES[@]}"); fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Rust: a rustup toolchain in ~/.cargo if there is one; otherwise Debian's. Debian 12's `cargo`
# (1.63) is older than the workspace's rust-version, so take `cargo-web`/`rustc-web` (newer
# toolchains Debian ships for its browsers; they install /usr/bin/cargo and /usr/bin/rustc).
MIN_RUST=1.75
rust_ok() {
  local v
  v=$(PATH="$HOME/.cargo/bin:$PATH" rustc --version 2>/dev/null | awk '{print $2}') || return 1
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$MIN_RUST" "$v" | sort -V | head -1)" = "$MIN_RUST" ]
}
if ! rust_ok; then
  missing+=(rustc-web cargo-web)
fi

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: ok"
