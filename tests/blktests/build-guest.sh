#!/usr/bin/env bash
# Builds the blktests guest (docs/conformance.md) into a cache, installing nothing on this machine:
#
#   $CACHE/apt/           apt's lists and downloaded .debs (Debian trixie; a sources list of its own)
#   $CACHE/base-KEY.cpio  the root filesystem: every package below with its dependencies, unpacked
#                         with dpkg-deb -x (no maintainer scripts), plus the modules the tests load
#   $CACHE/vmlinuz-VERSION the kernel
#
# KEY hashes the package list and this script, so the base is rebuilt only when either changes.
# The overlay (blktests' source, nvmf-target, the control script, /init) is packed by run.sh on
# every run as a second cpio appended to the base: the kernel unpacks both.
#
# Usage: build-guest.sh            prints "KERNEL BASE_CPIO" on its last line; exit 3: apt failed
set -euo pipefail

CACHE=${NVMFLAB_BLKTESTS_CACHE:-$HOME/.cache/nvmflab/blktests}
KVER=${NVMFLAB_BLKTESTS_KERNEL:-6.12.117+deb13-amd64}
SUITE=trixie
# What blktests' nvme group needs in the guest (check's own list: dd, gawk, blockdev, fio, udevadm,
# getconf; the nvme tests: nvme-cli with JSON output, losetup, mkfs.xfs, keyctl for the keyring).
PACKAGES=(bash coreutils util-linux mount udev kmod fio nvme-cli procps grep sed gawk findutils
          diffutils iproute2 xfsprogs e2fsprogs libc-bin keyutils gzip hostname dash bsdextrautils
          ktls-utils libibverbs1 ibverbs-providers ibverbs-utils librdmacm1t64 rdmacm-utils)
# ktls-utils (tlshd) serves the TLS interop checks, rdma-core's libraries and providers (rxe) the
# RDMA ones (docs/interop.md); blktests' tls and rdma variants need the same.
# Module directories copied into the guest (the rest of the 6.12 tree is drivers it never needs).
MODULE_DIRS=(drivers/nvme drivers/block drivers/virtio drivers/scsi drivers/md drivers/char
             fs crypto lib arch net block drivers/infiniband)

mkdir -p "$CACHE"
# One build at a time: make test boots trixie guests in two chains side by side (the bed beside
# the guest checks), and two builds into one cache would share apt's downloads and the base's
# temporary files. tests/bed/build-layer.sh takes the same lock.
exec 9>"$CACHE/.build.lock"
flock 9
APT_DIR=$CACHE/apt
apt_opts=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o Dir::Etc::sourceparts=-
          -o "Dir::State=$APT_DIR/state" -o "Dir::State::Lists=$APT_DIR/lists"
          -o "Dir::State::status=$APT_DIR/state/status" -o "Dir::Cache=$APT_DIR/cache"
          -o APT::Get::List-Cleanup=0 -o APT::Architecture=amd64 -o Debug::NoLocking=1
          -o APT::Install-Recommends=0 -o APT::Sandbox::User=root)

key=$( (printf '%s\n' "$KVER" "${PACKAGES[@]}" "${MODULE_DIRS[@]}"; cat "$0") | sha256sum | cut -c1-16)
base=$CACHE/base-$key.cpio
kernel=$CACHE/vmlinuz-$KVER
if [[ -s $base && -s $kernel ]]; then
    echo "$kernel $base"
    exit 0
fi

log() { echo "build-guest: $*" >&2; }

# 1. Packages: apt-get with an empty dpkg status resolves every dependency and downloads the
#    .debs into $APT_DIR/cache/archives; nothing is installed and /etc/apt is not read.
mkdir -p "$APT_DIR"/{lists/partial,cache/archives/partial,state}
: >"$APT_DIR/state/status"
cat >"$APT_DIR/sources.list" <<EOF
deb http://deb.debian.org/debian $SUITE main
deb http://deb.debian.org/debian-security $SUITE-security main
deb http://deb.debian.org/debian $SUITE-updates main
EOF
if [[ -z $(find "$APT_DIR/lists" -name '*_Packages*' -mmin -1440 2>/dev/null | head -1) ]]; then
    log "apt-get update ($SUITE lists into $APT_DIR)"
    timeout 300 apt-get "${apt_opts[@]}" -q update >&2 || { log "apt-get update failed (no network?)"; exit 3; }
fi
log "apt-get --download-only: ${PACKAGES[*]} linux-image-$KVER"
timeout 900 apt-get "${apt_opts[@]}" -qq -y --download-only install "${PACKAGES[@]}" "linux-image-$KVER" >&2 \
    || { log "apt-get could not download the guest's packages (no network?)"; exit 3; }
# The exact set of .debs this resolution needs (the cache may hold older versions too).
# (`-s` prints "Inst NAME (VERSION ...)"; the file is NAME_VERSION_ARCH.deb with ':' as %3a.)
mapfile -t debs < <(apt-get "${apt_opts[@]}" -q -s install "${PACKAGES[@]}" \
                    | sed -n -E 's/^Inst (\S+) \((\S+) .*/\1_\2/p' | sed 's/:/%3a/g')
(( ${#debs[@]} > 10 )) || { log "apt resolved only ${#debs[@]} packages"; exit 1; }

# 2. The kernel: its bzImage and module tree, from the .deb.
kdeb=$(ls "$APT_DIR"/cache/archives/linux-image-"$KVER"_*.deb | sort -V | tail -1)
kdir=$CACHE/kernel-$KVER
if [[ ! -s $kdir/boot/vmlinuz-$KVER ]]; then
    log "unpacking $(basename "$kdeb")"
    rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
    dpkg-deb -x "$kdeb" "$kdir.tmp"
    rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
fi

# 3. The root tree: merged /usr as Debian has it, every .deb unpacked, docs dropped.
tree=$CACHE/tree.tmp
rm -rf "$tree" && mkdir -p "$tree/usr"/{bin,sbin,lib,lib64}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$tree/$d"; done
log "unpacking ${#debs[@]} packages"
for deb in "${debs[@]}"; do
    f=$(ls "$APT_DIR"/cache/archives/"$deb"_*.deb | head -1)
    # --keep-directory-symlink: bin/ lib/ ... stay links into usr/ (packages still shipping /bin).
    dpkg-deb --fsys-tarfile "$f" | tar -x -C "$tree" --keep-directory-symlink
done
rm -rf "$tree"/usr/share/{doc,man,info,locale,lintian,bash-completion,zsh}
# Modules: the directories the tests need, indexed by depmod for modprobe.
moddir=usr/lib/modules/$KVER
mkdir -p "$tree/$moddir/kernel"
for d in "${MODULE_DIRS[@]}"; do
    [[ -d $kdir/$moddir/kernel/$d ]] || continue
    mkdir -p "$tree/$moddir/kernel/$(dirname "$d")"
    cp -a "$kdir/$moddir/kernel/$d" "$tree/$moddir/kernel/$d"
done
cp -a "$kdir/$moddir"/modules.{order,builtin,builtin.modinfo} "$tree/$moddir/"
depmod -b "$tree" "$KVER"
mkdir -p "$tree/boot" && cp "$kdir/boot/config-$KVER" "$tree/boot/"
# The little /etc a root shell, udev and blktests need.
mkdir -p "$tree"/{dev,proc,sys,tmp,run,root,mnt,etc}
echo "root:x:0:0:root:/root:/bin/bash" >"$tree/etc/passwd"
echo "root:x:0:" >"$tree/etc/group"
printf 'root:*::0:::::\n' >"$tree/etc/shadow"
echo "blktests-guest" >"$tree/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$tree/etc/hosts"
: >"$tree/etc/fstab"
ln -sf /proc/self/mounts "$tree/etc/mtab"
# What maintainer scripts would have made: the awk alternative and /bin/sh.
ln -sf gawk "$tree/usr/bin/awk"
[[ -e $tree/usr/bin/sh ]] || ln -s dash "$tree/usr/bin/sh"

log "packing $(du -sh "$tree" | cut -f1) into $(basename "$base")"
(cd "$tree" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$base.tmp"
mv "$base.tmp" "$base"
for old in "$CACHE"/base-*.cpio; do [[ $old == "$base" ]] || rm -f "$old"; done
cp "$kdir/boot/vmlinuz-$KVER" "$kernel"
rm -rf "$tree"
echo "$kernel $base"
