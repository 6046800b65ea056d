#!/usr/bin/env bash
# Build SPDK v24.01 (nvmf_tgt, spdk_nvme_perf, bdevperf, scripts/rpc.py) into a cache outside the
# clone, against Debian 12's DPDK, with its NVMe over RDMA transport (rdma-core's librdmacm and
# libibverbs: docs/rdma.md); the facts behind every step are in ../shared/peers/README.md.
#
#   bash scripts/build-spdk.sh [SOURCE]
#
# SOURCE (or NVMFLAB_SPDK_SRC): an SPDK tarball, a source tree or a git checkout; default the
# tarball in ../shared/peers/. The build lands in NVMFLAB_SPDK_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/nvmflab/spdk-24.01) and is reused while its stamp matches the
# source. With NVMFLAB_SPDK_DIR set (an existing build) there is nothing to do. make runs with
# $(nproc) jobs, or NVMFLAB_SPDK_JOBS.
# Without any source it says so on one line and exits 0: callers then skip SPDK with that reason.
set -euo pipefail

SHA256=ffbc65b1e906b45cd58db0c64cfef48ef9f0ddba0848d0f4d919fc1f7a3d0d25
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${NVMFLAB_SPDK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmflab/spdk-24.01}
say() { echo "build-spdk: $*"; }

if [ -n "${NVMFLAB_SPDK_DIR:-}" ]; then
  say "NVMFLAB_SPDK_DIR=$NVMFLAB_SPDK_DIR is set: using that build, nothing to do"
  exit 0
fi

src=${1:-${NVMFLAB_SPDK_SRC:-}}
if [ -n "$src" ] && [ ! -e "$src" ]; then
  say "$src does not exist (the SPDK source given as argument or NVMFLAB_SPDK_SRC)" >&2
  exit 1
fi
if [ -z "$src" ]; then
  for cand in "$repo/../shared/peers/spdk-24.01.tar.gz" /work/shared/peers/spdk-24.01.tar.gz; do
    if [ -f "$cand" ]; then src=$cand; break; fi
  done
fi
if [ -z "$src" ]; then
  say "no SPDK source found (give a tarball or tree as argument or NVMFLAB_SPDK_SRC, or put spdk-24.01.tar.gz in ../shared/peers/): SPDK not built"
  exit 0
fi
src=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")

# What the stamp records: the tarball's digest, or the tree's path and git revision.
if [ -f "$src" ]; then
  sum=$(sha256sum "$src" | awk '{print $1}')
  if [ "$(basename "$src")" = spdk-24.01.tar.gz ] && [ "$sum" != "$SHA256" ]; then
    say "$src: sha256 $sum is not the documented $SHA256; refusing to build it" >&2
    exit 1
  fi
  ident="tarball $sum"
else
  ident="tree $src $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unversioned)"
fi
# The patches below are part of what was built: a build from before a patch was added is redone.
PATCH_LEVEL=2
# So is RDMA: a cache built without it (before RDMA was on) is built once more.
ident="$ident patches $PATCH_LEVEL rdma"
stamp=$dest/.nvmflab-built
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$ident" ] && [ -x "$dest/build/bin/nvmf_tgt" ]; then
  say "reusing the build in $dest"
  exit 0
fi

for header in rdma/rdma_cma.h infiniband/verbs.h; do
  [ -f /usr/include/$header ] || {
    say "/usr/include/$header is missing: SPDK's RDMA transport needs rdma-core's development files (librdmacm-dev, libibverbs-dev; bash scripts/install-deps.sh --for spdk installs them)" >&2
    exit 1
  }
done

say "building SPDK from $src into $dest (takes minutes)"
# Only ever delete a previous build of ours (or an empty folder), never whatever the cache path names.
if [ -d "$dest" ] && [ -n "$(ls -A "$dest")" ] && [ ! -f "$dest/configure" ] && [ ! -f "$stamp" ]; then
  say "$dest exists and is not an SPDK build of this script; move it away or set NVMFLAB_SPDK_CACHE" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
if [ -f "$src" ]; then
  say "unpacking"
  tar -xzf "$src" -C "$dest" --strip-components=1
else
  say "copying the source tree"
  (cd "$src" && tar --exclude=./.git -cf - .) | tar -xf - -C "$dest"
fi
cd "$dest"
[ -x configure ] || { say "$src does not look like an SPDK source (no configure)" >&2; exit 1; }

say "patching for Debian 12's DPDK (peers/README.md, obstacles 1-3 and spdk_nvme_identify)"
# 1. configure insists on the isa-l submodule on x86_64/aarch64; take the "no ISA-L" branch when
#    the submodule is absent (crypto and compression are off anyway).
sed -i 's/^if \[\[ \$arch == x86_64\* \]\] || \[\[ \$arch == aarch64\* \]\]; then$/if [[ -f "$rootdir"\/isa-l\/autogen.sh ]] \&\& { [[ $arch == x86_64* ]] || [[ $arch == aarch64* ]]; }; then/' configure
# 2. Debian ships DPDK 22.11.x with x > 4, whose private ABI is the one 22.11's table describes.
sed -i 's/if (minor > 4) {/if (minor > 99) {/' lib/env_dpdk/pci_dpdk.c
# 3. The static DPDK EAL needs libnuma, which env.mk only adds when it finds DPDK's build config.
grep -q '^DPDK_PRIVATE_LINKER_ARGS = -lnuma' lib/env_dpdk/env.mk ||
  sed -i 's/^DPDK_PRIVATE_LINKER_ARGS =$/DPDK_PRIVATE_LINKER_ARGS = -lnuma/' lib/env_dpdk/env.mk
# spdk_nvme_identify has no --no-huge in v24.01; it must run on hosts without hugepages too, so it
# runs without them unless NVMFLAB_SPDK_HUGE is set (SPDK's RDMA initiator needs hugepages:
# docs/rdma.md).
grep -q 'opts.no_huge = ' app/spdk_nvme_identify/identify.c ||
  sed -i 's/^\topts.iova_mode = g_iova_mode;$/&\n\topts.no_huge = getenv("NVMFLAB_SPDK_HUGE") == NULL;/' app/spdk_nvme_identify/identify.c

# 5. OpenSSL 3.0 (Debian 12) refuses EVP_PKEY_CTX_set1_hkdf_salt(ctx, NULL, 0), so every TLS PSK
#    derivation fails ("Unable to set salt for HKDF!") and no TLS host can be added or connect.
#    HKDF without a salt uses the same all-zero salt (RFC 5869 2.2): drop the call.
sed -i 's/if (EVP_PKEY_CTX_set1_hkdf_salt(ctx, NULL, 0) != 1) {/if (0) { \/\* no salt: HKDF'"'"'s default, zeros \*\//' include/spdk_internal/nvme_tcp.h

say "configuring"
./configure --with-dpdk=/usr --without-shared --disable-tests --disable-unit-tests --without-crypto \
  --without-vhost --without-virtio --without-fuse --without-nvme-cuse --without-fio --without-xnvme \
  --with-rdma --without-uring --without-ocf --without-idxd > configure.log 2>&1 ||
  { tail -20 configure.log; say "configure failed (log: $dest/configure.log)" >&2; exit 1; }
# 4. Debian's DPDK links IPsec_MB, so configure turns IPSEC_MB on, which would build the absent
#    intel-ipsec-mb submodule; crypto is off, so it is not needed.
sed -i 's/^CONFIG_IPSEC_MB?=y$/CONFIG_IPSEC_MB?=n/' mk/config.mk

jobs=${NVMFLAB_SPDK_JOBS:-$(nproc)}
say "make -j$jobs (log: $dest/make.log)"
start=$(date +%s)
make -j"$jobs" > make.log 2>&1 || { tail -30 make.log; say "make failed (log: $dest/make.log)" >&2; exit 1; }
for bin in build/bin/nvmf_tgt build/bin/spdk_nvme_perf; do
  [ -x "$bin" ] || { say "make finished without $bin" >&2; exit 1; }
done
echo "$ident" > "$stamp"
say "done in $(( $(date +%s) - start )) s: $dest/build/bin/nvmf_tgt, spdk_nvme_perf, build/examples/bdevperf"
