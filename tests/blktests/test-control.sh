#!/usr/bin/env bash
# The NVME_TARGET_CONTROL script on this machine, without qemu or blktests (a few seconds):
# blktests' config answers, setup with blktests' spellings (--ctrkey), a served subsystem with the
# UUID and host asked for, a refused key leaving the other subsystem served, cleanup stopping the
# target. Uses target/release/nvmf-target and nvmf-perf on 127.0.0.1, a port of its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/blktests/nvmf-target-control
BIN=target/release
export NVMFLAB_CONTROL_DIR
NVMFLAB_CONTROL_DIR=$(mktemp -d /tmp/nvmflab-control-test.XXXXXX)
export NVMFLAB_TARGET_BIN=$PWD/$BIN/nvmf-target NVMFLAB_TRSVCID=$((20000 + $$ % 20000)) NVMFLAB_IMG_SIZE=16M
H=nqn.2014-08.org.nvmexpress:uuid:0f01fb42-9f7f-4856-b0b3-51e60b8de349
fail() { echo "test-control: FAIL: $*" >&2; exit 1; }
cleanup() {
    "$C" cleanup --subsysnqn blktests-subsystem-1 >/dev/null 2>&1 || true
    "$C" cleanup --subsysnqn blktests-subsystem-2 >/dev/null 2>&1 || true
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

key=$(python3 -c 'import base64,os,zlib; k=os.urandom(32); print("DHHC-1:00:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":")')
$C setup --subsysnqn blktests-subsystem-1 --subsys-uuid 91fdba0d-f87b-4c25-b80f-db7be1418b9e \
    --hostnqn "$H" --hostkey "$key" --ctrkey "$key" || fail "setup"
grep -q 'uuid = "91fdba0d-f87b-4c25-b80f-db7be1418b9e"' "$NVMFLAB_CONTROL_DIR/target.toml" || fail "uuid not configured"
grep -q 'dhchap_ctrl_key' "$NVMFLAB_CONTROL_DIR/target.toml" || fail "--ctrkey (blktests' spelling) dropped"
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

$C cleanup --subsysnqn blktests-subsystem-1 || fail "cleanup"
[[ ! -e $NVMFLAB_CONTROL_DIR/target.pid ]] || fail "target still recorded after the last cleanup"
if "${id[@]}" --dhchap-secret "$key" >/dev/null 2>&1; then fail "still served after cleanup"; fi
echo "test-control: ok (config answers, setup with --ctrkey, keys and allowed host enforced, refused key, cleanup)"
