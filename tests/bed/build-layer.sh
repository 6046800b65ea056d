#!/usr/bin/env bash
# The test bed's layer over the trixie guest's base (tests/guest/trixie.py, built by
# tests/blktests/build-guest.sh): trixie's OpenSSH server with the libraries it needs, and the
# virtio_net driver (the base's module tree has no drivers/net). Nothing is installed on this
# machine: the .debs come through the base's own apt directory and sources list and are unpacked
# into a cpio that bed.py appends to the base.
#
# Usage: build-layer.sh KERNEL_VERSION   prints the layer's path on its last line; exit 3: apt failed
set -euo pipefail

KVER=$1
CACHE=${NVMFLAB_BLKTESTS_CACHE:-$HOME/.cache/nvmflab/blktests}
APT_DIR=$CACHE/apt
# build-guest.sh's lock: its apt-get and ours share the apt directory.
exec 9>"$CACHE/.build.lock"
flock 9
# The same apt setup as build-guest.sh (its lists are fresh: the base was just built or checked).
apt_opts=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o Dir::Etc::sourceparts=-
          -o "Dir::State=$APT_DIR/state" -o "Dir::State::Lists=$APT_DIR/lists"
          -o "Dir::State::status=$APT_DIR/state/status" -o "Dir::Cache=$APT_DIR/cache"
          -o APT::Get::List-Cleanup=0 -o APT::Architecture=amd64 -o Debug::NoLocking=1
          -o APT::Install-Recommends=0 -o APT::Sandbox::User=root)
PACKAGES=(openssh-server openssh-sftp-server)
# Of what apt resolves for them, only OpenSSH itself and libraries are unpacked: the rest
# (systemd, perl, adduser...) serves maintainer scripts and init systems the guest does not run.
keep() { [[ $1 == openssh-* || ( $1 == lib* && $1 != libsystemd-shared ) ]]; }
NET_MODULES=(drivers/net/net_failover.ko.xz drivers/net/virtio_net.ko.xz)

key=$( (printf '%s\n' "$KVER" "${PACKAGES[@]}"; cat "$0") | sha256sum | cut -c1-16)
layer=$CACHE/bed-layer-$key.cpio
if [[ -s $layer ]]; then
    echo "$layer"
    exit 0
fi
log() { echo "build-layer: $*" >&2; }

log "apt-get --download-only: ${PACKAGES[*]}"
timeout 600 apt-get "${apt_opts[@]}" -qq -y --download-only install "${PACKAGES[@]}" >&2 \
    || { log "apt-get could not download OpenSSH (no network?)"; exit 3; }
mapfile -t debs < <(apt-get "${apt_opts[@]}" -q -s install "${PACKAGES[@]}" \
                    | sed -n -E 's/^Inst (\S+) \((\S+) .*/\1_\2/p' | sed 's/:/%3a/g')

tree=$(mktemp -d "$CACHE/bed-layer.XXXXXX")
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/usr"/{bin,sbin,lib,lib64}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$tree/$d"; done
for deb in "${debs[@]}"; do
    keep "${deb%%_*}" || continue
    f=$(ls "$APT_DIR"/cache/archives/"$deb"_*.deb | head -1)
    dpkg-deb --fsys-tarfile "$f" | tar -x -C "$tree" --keep-directory-symlink
done
[[ -x $tree/usr/sbin/sshd ]] || { log "no sshd among the unpacked packages"; exit 1; }
rm -rf "$tree"/usr/share/{doc,man,info,locale,lintian} "$tree"/etc/ssh/sshd_config
moddir=usr/lib/modules/$KVER/kernel
for m in "${NET_MODULES[@]}"; do
    mkdir -p "$tree/$moddir/$(dirname "$m")"
    cp "$CACHE/kernel-$KVER/$moddir/$m" "$tree/$moddir/$m"
done
(cd "$tree" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$layer.tmp"
mv "$layer.tmp" "$layer"
for old in "$CACHE"/bed-layer-*.cpio; do [[ $old == "$layer" ]] || rm -f "$old"; done  # as build-guest.sh
echo "$layer"
