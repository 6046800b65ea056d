#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to run or to test nvmflab.
#
#   bash scripts/install-deps.sh --for run    # build the Rust stack, run the harness (`make run`)
#   bash scripts/install-deps.sh --for spdk   # run + what building SPDK needs (`make spdk`)
#   bash scripts/install-deps.sh --for test   # everything `make test` uses (the default)
#
# Idempotent: installs only missing packages, and says which and why before it does. Needs root
# (or sudo) for apt. NVMFLAB_SKIP_INTEROP=1 and NVMFLAB_SKIP_SPDK=1 leave those groups out of `test`.
set -euo pipefail

purpose=test
while [ $# -gt 0 ]; do
  case "$1" in
    --for) purpose=${2:-}; shift 2 || true ;;
    --for=*) purpose=${1#--for=}; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument $1 (use --for run|spdk|test)" >&2; exit 2 ;;
  esac
done
case "$purpose" in run|spdk|test) ;; *) echo "install-deps: --for takes run, spdk or test, not '$purpose'" >&2; exit 2 ;; esac
say() { echo "install-deps: $*"; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

# One at a time: `make -j2 build venv spdk` on a fresh machine runs this twice at once, and apt
# refuses the second run while the first holds its lock (the make then fails). The second waits.
LOCK=${NVMFLAB_DEPS_LOCK:-${TMPDIR:-/tmp}/nvmflab-install-deps.lock}
exec 9>>"$LOCK"
if ! flock -n 9; then
  say "another install-deps run holds $LOCK; waiting for it"
  flock 9
fi

# Running: compile the stack (build-essential, pkg-config), the harness's process and network
# plumbing (iproute2 for namespaces, procps), Python with venv for the harness, and iperf3 for the
# network applications of the contention study. libssl-dev: OpenSSL 3's headers and libssl, which the
# `openssl` crate of crates/nvmf-tls (NVMe/TCP over TLS 1.3) links against through pkg-config.
RUN_PACKAGES=(build-essential pkg-config iproute2 procps python3 python3-venv iperf3 libssl-dev)
# Testing only: a headless browser checks that the HTML report's figures render (python/tests/test_report.py);
# tshark reads what our TLS connections put on the wire (tests/tls/test_tls_capture.py).
TEST_PACKAGES=(chromium tshark)
# Kernel interop under qemu (tests/interop) and the SSH topology tests (sshd in namespaces); nvme-cli
# and fio also let `study stacks` drive the kernel host where nvmet is loaded.
INTEROP_PACKAGES=(qemu-system-x86 linux-image-amd64 busybox-static nvme-cli fio kmod cpio lz4
                  openssh-server openssh-client)
# rdma-core's development files: nvmf-target's `rdma` feature (NVMe over RDMA, make test-rdma)
# compiles a C shim against rdma_cma.h and verbs.h and links librdmacm and libibverbs.
RDMA_PACKAGES=(librdmacm-dev libibverbs-dev)
# Building SPDK from ../shared/peers (scripts/build-spdk.sh); see ../shared/peers/README.md. It is
# built with its RDMA transport, hence rdma-core's development files.
SPDK_PACKAGES=(dpdk-dev libdpdk-dev pkg-config libnuma-dev libaio-dev uuid-dev libssl-dev libjson-c-dev
               libcunit1-dev python3-pyelftools meson ninja-build libncurses-dev librdmacm-dev libibverbs-dev)

# Each group with why it is wanted, for the lines printed before installing.
groups=("RUN_PACKAGES|to build and run (make run)")
if [ "$purpose" = spdk ]; then groups+=("SPDK_PACKAGES|to build SPDK (make spdk)"); fi
if [ "$purpose" = test ]; then
  groups+=("TEST_PACKAGES|to check the report in a browser and read TLS captures (make test)")
  groups+=("RDMA_PACKAGES|to build the target with NVMe over RDMA for its guest check (make test-rdma)")
  if [ "${NVMFLAB_SKIP_INTEROP:-0}" != "1" ]; then
    groups+=("INTEROP_PACKAGES|for kernel interop under qemu and the SSH topology tests (make test; NVMFLAB_SKIP_INTEROP=1 leaves them out)")
  fi
  if [ "${NVMFLAB_SKIP_SPDK:-0}" != "1" ]; then
    groups+=("SPDK_PACKAGES|to build SPDK for its tests (make test; NVMFLAB_SKIP_SPDK=1 leaves them out)")
  fi
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for group in "${groups[@]}"; do
  name=${group%%|*}; why=${group#*|}
  declare -n list=$name
  lacking=()
  for p in "${list[@]}"; do
    installed "$p" || [[ " ${missing[*]} " == *" $p "* ]] || lacking+=("$p")
  done
  unset -n list
  if [ ${#lacking[@]} -gt 0 ]; then
    say "will install ${lacking[*]} -- $why"
    missing+=("${lacking[@]}")
  fi
done

# Rust: a rustup toolchain in ~/.cargo if there is one; otherwise Debian's. Debian 12's `cargo`
# (1.63) is older than the workspace's rust-version, so take `cargo-web`/`rustc-web` (newer
# toolchains Debian ships for its browsers; they install /usr/bin/cargo and /usr/bin/rustc).
# The minimum is the workspace's rust-version (Cargo.toml), the one place it is stated.
MIN_RUST=$(sed -n -E 's/^rust-version *= *"([0-9.]+)".*/\1/p' "$(dirname "$0")/../Cargo.toml" | head -1)
version_at_least() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
rust_ok() {
  local v
  v=$(PATH="$HOME/.cargo/bin:$PATH" rustc --version 2>/dev/null | awk '{print $2}') || return 1
  [ -n "$v" ] && version_at_least "$MIN_RUST" "$v"
}
if ! rust_ok; then
  say "will install rustc-web cargo-web -- no Rust >= $MIN_RUST found (Debian's plain cargo is 1.63)"
  missing+=(rustc-web cargo-web)
fi

if [ ${#missing[@]} -gt 0 ]; then
  say "apt-get update (refreshing the package lists)"
  $SUDO apt-get update -qq
  say "apt-get install ${#missing[@]} package(s); one line per package downloaded and set up"
  # apt's own output is long; keep the lines that show it moving (download, unpack, configure).
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" \
    | sed -u -n -E '/^(Get:|Setting up )/s/^/  apt: /p'
else
  say "nothing to install for '$purpose'"
fi
# Testing: Debian 12's own Rust at the workspace's rust-version, beside any rustup toolchain, so
# `make test-msrv` proves the lockfile builds where no rustup exists (a debootstrap root without
# bookworm-security gets exactly this rustc-web). Downgrades a newer rustc-web if one is installed.
if [ "$purpose" = test ]; then
  [ -n "$(apt-cache madison rustc-web 2>/dev/null)" ] || $SUDO apt-get update -qq
  have=$(dpkg-query -W -f='${Version}' rustc-web 2>/dev/null || true)
  want=$(apt-cache madison rustc-web | awk -v m="$MIN_RUST" '$3 ~ "^" m "\\." {print $3}' | sort -V | tail -1)
  if [ -z "$want" ]; then
    say "no rustc-web $MIN_RUST.x in the apt sources; make test-msrv will say so and fail"
  elif [ "$have" != "$want" ] || [ "$(dpkg-query -W -f='${Version}' cargo-web 2>/dev/null)" != "$want" ]; then
    pkgs=(rustc-web="$want" cargo-web="$want" libstd-rust-web-dev="$want" "libstd-rust-web-$MIN_RUST=$want")
    say "will install ${pkgs[*]} -- Debian's Rust at the workspace's rust-version, for make test-msrv"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends --allow-downgrades "${pkgs[@]}" \
      | sed -u -n -E '/^(Get:|Setting up )/s/^/  apt: /p'
  fi
fi
# Testing: cargo-nextest runs the Rust test binaries side by side (make test-rust; they mostly wait on
# sockets and timers). Built once into ~/.cargo/bin, a few minutes; where the toolchain cannot build it
# (Debian's 1.85 alone is too old for it), make test-rust runs cargo test instead and says so.
NEXTEST_VERSION=0.9.151
if [ "$purpose" = test ] && ! PATH="$HOME/.cargo/bin:$PATH" cargo nextest --version >/dev/null 2>&1; then
  say "will build cargo-nextest $NEXTEST_VERSION into ~/.cargo/bin (cargo install --locked, once: a few minutes) -- runs the Rust test binaries side by side in make test"
  PATH="$HOME/.cargo/bin:$PATH" cargo install --locked --quiet --version "$NEXTEST_VERSION" cargo-nextest \
    || say "cargo-nextest could not be built with this toolchain: make test-rust runs cargo test instead"
fi
say "ok ($purpose)"
