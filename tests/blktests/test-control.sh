#!/usr/bin/env bash
# The NVME_TARGET_CONTROL script on this machine, without qemu or blktests (a few seconds):
# blktests' config answers, setup with blktests' spellings (--ctrkey), a served subsystem with the
# UUID and host asked for, a refused key leaving the other subsystem served, the configfs shim
# (a key, hash and namespace enable written to its files reach the running target), cleanup
# stopping the target. Uses target/release/nvmf-target, nvmf-target-ctl and nvmf-perf on
# 127.0.0.1, a port of its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/blktests/nvmf-target-control
BIN=target/release
export NVMFLAB_CONTROL_DIR
NVMFLAB_CONTROL_DIR=$(mktemp -d /tmp/nvmflab-control-test.XXXXXX)
SHIM_PID=
export NVMFLAB_CONFIGFS_SHIM=$NVMFLAB_CONTROL_DIR/configfs/nvmet
mkdir -p "$NVMFLAB_CONFIGFS_SHIM"/{hosts,subsystems}
export NVMFLAB_TARGET_BIN=$PWD/$BIN/nvmf-target NVMFLAB_CTL_BIN=$PWD/$BIN/nvmf-target-ctl NVMFLAB_TRSVCID=$((20000 + $$ % 20000)) NVMFLAB_IMG_SIZE=16M
H=nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349
fail() { echo "test-control: FAIL: $*" >&2; exit 1; }
cleanup() {
    [[ -n $SHIM_PID ]] && kill "$SHIM_PID" 2>/dev/null
    "$C" cleanup --subsysnqn blktests-subsystem-1 >/dev/null 2>&1 || true
    "$C" cleanup --subsysnqn blktests-subsystem-2 >/dev/null 2>&1 || true
    "$C" cleanup --subsysnqn blktests-subsystem-3 >/dev/null 2>&1 || true
    rm -rf "$NVMFLAB_CONTROL_DIR"
}
trap cleanup EXIT

[[ $($C config --show-trtype) == tcp ]] || fail "trtype"
[[ $($C config --show-hostnqn) == "$H" ]] || fail "hostnqn"
[[ $($C config --show-subsysnqn) == blktests-subsystem-1 ]] || fail "subsysnqn"
[[ $($C config --show-subsys-uuid) == 91fdba0d-f87b-4c25-b80f-db7be1418b9e ]] || fail "subsys uuid"
[[ $($C config --show-trsvid) == "$NVMFLAB_TRSVCID" ]] || fail "trsvid"
[[ $($C config --show-blkdev-type) == file ]] || fail "blkdev type"
if $C config --show-nonsense 2>/dev/null; then fail "an unknown question was answered"; fi

# NVMe/RDMA (make conformance-rdma): the trtype and address blktests asks for, and an RDMA port in
# the config setup writes. No RDMA device here, so the start must fail and say RDMA: a TCP-only
# nvmf-target refuses the port (built without RDMA), an RDMA one cannot listen on the address.
rdma=(env NVMFLAB_TRTYPE=rdma NVMFLAB_TRADDR=10.77.0.1 NVMFLAB_CONTROL_DIR=$NVMFLAB_CONTROL_DIR/rdma
      NVMFLAB_CONFIGFS_SHIM= NVMFLAB_START_TIMEOUT_S=10)
[[ $("${rdma[@]}" $C config --show-trtype) == rdma ]] || fail "rdma: trtype"
[[ $("${rdma[@]}" $C config --show-traddr) == 10.77.0.1 ]] || fail "rdma: traddr"
if NVMFLAB_TRTYPE=fc $C config --show-trtype >/dev/null 2>&1; then fail "a trtype other than tcp or rdma was accepted"; fi
if err=$("${rdma[@]}" $C setup --subsysnqn blktests-subsystem-1 --hostnqn "$H" 2>&1); then
    fail "rdma: setup succeeded with no RDMA device"
fi
grep -q '^trtype = "rdma"' "$NVMFLAB_CONTROL_DIR/rdma/target.toml" || fail "rdma: no RDMA port in target.toml"
[[ $err == *"exited at start"*RDMA* ]] || fail "rdma: setup's error does not name RDMA: $err"
[[ ! -e $NVMFLAB_CONTROL_DIR/rdma/target.pid ]] || fail "rdma: a failed start left a pid"

key=$(python3 -c 'import base64,os,zlib; k=os.urandom(32); print("DHHC-1:00:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":")')
$C setup --subsysnqn blktests-subsystem-1 --subsys-uuid 91fdba0d-f87b-4c25-b80f-db7be1418b9e \
    --hostnqn "$H" --hostkey "$key" --ctrkey "$key" || fail "setup"
show() { "$BIN/nvmf-target-ctl" --socket "$NVMFLAB_CONTROL_DIR/control.sock" '{"op":"show"}'; }
show | grep -q '"uuid":"91fdba0d-f87b-4c25-b80f-db7be1418b9e"' || fail "uuid not configured"
show | grep -q '"dhchap_ctrl_key":true' || fail "--ctrkey (blktests' spelling) dropped"
pid=$(cat "$NVMFLAB_CONTROL_DIR/target.pid")
id=(timeout 20 "$BIN/nvmf-perf" identify -a 127.0.0.1 -s "$NVMFLAB_TRSVCID" -n blktests-subsystem-1 -q "$H")
"${id[@]}" --dhchap-secret "$key" | grep -q "subnqn *: blktests-subsystem-1" || fail "not served with the key"
if "${id[@]}" >/dev/null 2>&1; then fail "served without the key"; fi
if timeout 20 "$BIN/nvmf-perf" identify -a 127.0.0.1 -s "$NVMFLAB_TRSVCID" -n blktests-subsystem-1 \
    -q nqn.2014-08.org.nvmexpress:uuid:other >/dev/null 2>&1; then fail "a host not allowed was served"; fi

# A refused key: setup exits 1, the first subsystem is served again.
if $C setup --subsysnqn blktests-subsystem-2 --subsys-uuid 91fdba0d-f87b-4c25-b80f-db7be1418b9f \
    --hostnqn nqn.2014-08.org.nvmexpress:uuid:other --hostkey "DHHC-1:00:bad:" 2>/dev/null; then
    fail "a bad key was accepted"
fi
"${id[@]}" --dhchap-secret "$key" | grep -q "subnqn *: blktests-subsystem-1" || fail "not served after a refused setup"

[[ $(cat "$NVMFLAB_CONTROL_DIR/target.pid") == "$pid" ]] || fail "the target was restarted by a setup"

# The configfs shim: what blktests writes into nvmet's files reaches the running target.
tests/blktests/configfs-shim "$NVMFLAB_CONFIGFS_SHIM" "$NVMFLAB_CONTROL_DIR" &
SHIM_PID=$!
hostdir=$NVMFLAB_CONFIGFS_SHIM/hosts/$H
[[ -f $hostdir/dhchap_key && -f $NVMFLAB_CONFIGFS_SHIM/subsystems/blktests-subsystem-1/namespaces/1/enable ]] ||
    fail "setup made no shim files"
key2=$(python3 -c 'import base64,os,zlib; k=os.urandom(48); print("DHHC-1:02:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":")')
printf '%s' "$key2" >"$hostdir/dhchap_ctrl_key"   # first, so the old controller key is never unpaired
printf '%s' "$key2" >"$hostdir/dhchap_key"
printf '%s' "hmac(sha512)" >"$hostdir/dhchap_hash"
printf '%s' "ffdhe2048" >"$hostdir/dhchap_dhgroup"
# The shim sends one request per file, in its own order (dhchap_key last), and logs each once
# the target took it: wait for both keys' requests too, not only for the hash and group to show
# (a connect between the group's request and the key's met the old key under CI load).
shim_took() { grep -qF "\"$1\":\"$key2\"" "$NVMFLAB_CONTROL_DIR/configfs-shim.log"; }
for ((i = 0; i < 50; i++)); do
    show | grep -q '"dhchap_dhgroup":"ffdhe2048","dhchap_hash":"hmac(sha512)"' &&
        shim_took dhchap_key && shim_took dhchap_ctrl_key && break
    sleep 0.1
done
"${id[@]}" --dhchap-secret "$key2" | grep -q "subnqn *: blktests-subsystem-1" || fail "a key written to the shim did not reach the target"
if "${id[@]}" --dhchap-secret "$key" >/dev/null 2>&1; then fail "the old key still served after the shim's change"; fi
printf 0 >"$NVMFLAB_CONFIGFS_SHIM/subsystems/blktests-subsystem-1/namespaces/1/enable"
for ((i = 0; i < 50; i++)); do show | grep -q '"enabled":false' && break; sleep 0.1; done
show | grep -q '"enabled":false' || fail "namespace enable=0 in the shim did not disable it"
# nvme/048: attr_qid_max reaches the target.
sub1=$NVMFLAB_CONFIGFS_SHIM/subsystems/blktests-subsystem-1
[[ $(cat "$sub1/attr_qid_max") == 128 ]] || fail "setup wrote no attr_qid_max"
printf 2 >"$sub1/attr_qid_max"
for ((i = 0; i < 50; i++)); do show | grep -q '"qid_max":2' && break; sleep 0.1; done
show | grep -q '"qid_max":2' || fail "attr_qid_max=2 in the shim did not reach the target"
# nvme/058: a namespace made by mkdir, then remapped (new UUID while disabled).
[[ -f $NVMFLAB_CONFIGFS_SHIM/ports/0/subsystems/blktests-subsystem-1 && -d $NVMFLAB_CONFIGFS_SHIM/ports/0/ana_groups/1 ]] ||
    fail "setup made no port 0 stand-in"
truncate -s 8M "$NVMFLAB_CONTROL_DIR/ns2.img"
n2=$sub1/namespaces/2
mkdir "$n2"
printf '%s' "$NVMFLAB_CONTROL_DIR/ns2.img" >"$n2/device_path"
printf '%s' 11111111-2222-4333-8444-555555555555 >"$n2/device_uuid"
printf 1 >"$n2/enable"
wait_show() { for ((i = 0; i < 50; i++)); do show | grep -q "$1" && return 0; sleep 0.1; done; return 1; }
wait_show '"nsid":2,"uuid":"11111111-2222-4333-8444-555555555555"' || fail "a namespace made in the shim did not reach the target"
printf 0 >"$n2/enable"
wait_show '"enabled":false,"nsid":2' || fail "namespace 2 not disabled"
printf '%s' 66666666-2222-4333-8444-555555555555 >"$n2/device_uuid"
printf 1 >"$n2/enable"
wait_show '"enabled":true,"nsid":2,"uuid":"66666666-2222-4333-8444-555555555555"' || fail "the remapped UUID did not reach the target"
kill "$SHIM_PID"; SHIM_PID=
grep -q "not followed" "$NVMFLAB_CONTROL_DIR/configfs-shim.log" && fail "the shim met files it does not follow"

# blktests' "--blkdev none" (no image file in its TMPDIR): a subsystem without a namespace.
mkdir -p "$NVMFLAB_CONTROL_DIR/tmpdir.nvme.058.x"
TMPDIR=$NVMFLAB_CONTROL_DIR/tmpdir.nvme.058.x $C setup --subsysnqn blktests-subsystem-3 --hostnqn "$H" || fail "setup (none)"
show | grep -q '"namespaces":\[\],"nqn":"blktests-subsystem-3"' || fail "blkdev none: setup made a namespace"
[[ ! -e $NVMFLAB_CONFIGFS_SHIM/subsystems/blktests-subsystem-3/namespaces/1 ]] || fail "blkdev none: shim files for nsid 1"
$C cleanup --subsysnqn blktests-subsystem-3 || fail "cleanup 3"

$C cleanup --subsysnqn blktests-subsystem-1 || fail "cleanup"
[[ ! -e $NVMFLAB_CONFIGFS_SHIM/subsystems/blktests-subsystem-1 && ! -e $hostdir ]] || fail "cleanup left shim files"
[[ ! -e $NVMFLAB_CONFIGFS_SHIM/ports/0 ]] || fail "cleanup left the port stand-in"
[[ ! -e $NVMFLAB_CONTROL_DIR/target.pid ]] || fail "target still recorded after the last cleanup"
if "${id[@]}" --dhchap-secret "$key" >/dev/null 2>&1; then fail "still served after cleanup"; fi
# configfs-dirops (mkdir/rmdir in the guest): blktests' own port made and removed as nvme/031 and
# 038 do, a subsystem made by mkdir -p and removed (038), a linked port refused, plain elsewhere.
dirops=$NVMFLAB_CONTROL_DIR/dirops-bin
mkdir -p "$dirops"
ln -sf "$PWD/tests/blktests/configfs-dirops" "$dirops/mkdir"
ln -sf "$PWD/tests/blktests/configfs-dirops" "$dirops/rmdir"
(
    export PATH=$dirops:$PATH
    cfs=$NVMFLAB_CONFIGFS_SHIM
    mkdir "$cfs/ports/5" && printf tcp >"$cfs/ports/5/addr_trtype" && printf 4425 >"$cfs/ports/5/addr_trsvcid"
    [[ -d $cfs/ports/5/ana_groups/1 && -d $cfs/ports/5/subsystems && -d $cfs/ports/5/referrals ]] ||
        fail "dirops: mkdir of a port made no default groups"
    for a in "$cfs/ports/5/ana_groups/"*; do [[ ${a##*/} == 1 ]] && continue; rmdir "$a"; done
    mkdir "$cfs/ports/5/ana_groups/2"
    rmdir "$cfs/ports/5" 2>/dev/null && fail "dirops: removed a port holding a user's ANA group"
    rmdir "$cfs/ports/5/ana_groups/2" && rmdir "$cfs/ports/5" || fail "dirops: rmdir of a port"
    [[ ! -e $cfs/ports/5 ]] || fail "dirops: the port is still there"
    mkdir -p "$cfs/subsystems/dirops-nqn" && [[ -d $cfs/subsystems/dirops-nqn/namespaces ]] ||
        fail "dirops: mkdir -p of a subsystem made no default groups"
    mkdir "$cfs/subsystems/dirops-nqn/namespaces/1"
    rmdir "$cfs/subsystems/dirops-nqn" 2>/dev/null && fail "dirops: removed a subsystem holding a namespace"
    rmdir "$cfs/subsystems/dirops-nqn/namespaces/1" "$cfs/subsystems/dirops-nqn" || fail "dirops: rmdir of a subsystem"
    mkdir "$NVMFLAB_CONTROL_DIR/plain" && [[ ! -e $NVMFLAB_CONTROL_DIR/plain/ana_groups ]] || fail "dirops: not plain outside the shim"
    : >"$NVMFLAB_CONTROL_DIR/plain/f"
    rmdir "$NVMFLAB_CONTROL_DIR/plain" 2>/dev/null && fail "dirops: plain rmdir removed a non-empty directory"
    true
) || exit 1

echo "test-control: ok (configfs mkdir/rmdir semantics, config answers, setup with --ctrkey, keys and allowed host enforced, refused key, configfs shim: keys, enable, attr_qid_max, namespaces made and remapped; blkdev none, cleanup)"
