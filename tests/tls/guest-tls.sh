#!/bin/bash
# Runs inside the trixie guest (tests/guest/trixie.py) as root: NVMe/TCP over TLS 1.3 between our
# stack and Linux 6.12's (tlshd from ktls-utils, nvme-cli 2.13, keyutils), both directions, on the
# guest's own loopback. tests/tls/test_tls_interop.py boots it and asserts each check.
#
# Every check writes one line "NAME<TAB>pass|fail<TAB>detail" to $OUT/checks.tsv; the evidence
# (command output, logs, /stats, the keyring) goes to $OUT/*.txt. The script itself exits 0 when it
# ran to its end, whatever the checks said.
#
# Needs in the guest: /usr/local/bin/nvmf-target and /usr/local/bin/nvmf-perf, HOSTNQN and OUT set.
set -u
export PATH=/usr/local/bin:$PATH
SUB=nqn.2024-01.io.nvmflab:tls
DISC=nqn.2014-08.org.nvmexpress.discovery
OUR_PORT=4420      # nvmf-target, tls=required
NVMET_PORT=4421    # nvmet-tcp, addr_tsas=tls1.3, addr_treq=required
STATS=9100
TPID=
say() { echo "@@ $*"; }
check() { # NAME pass|fail DETAIL...
    local name=$1 result=$2; shift 2
    printf '%s\t%s\t%s\n' "$name" "$result" "$*" >>"$OUT/checks.tsv"
    say "CHECK $name $result [${SECONDS}s] $*"
}
# Runs a command with a time limit, its output appended to $OUT/NAME.txt; returns its status.
logged() { # NAME SECONDS CMD...
    local name=$1 secs=$2; shift 2
    { echo "\$ $*"; timeout -k 5 "$secs" "$@"; echo "[exit $?]"; } >>"$OUT/$name.txt" 2>&1
    tail -1 "$OUT/$name.txt" | grep -q '^\[exit 0\]$'
}
stats() { # GET /stats of our target (no curl in the guest)
    local body
    exec 3<>/dev/tcp/127.0.0.1/$STATS || return 1
    printf 'GET /stats HTTP/1.0\r\nHost: x\r\n\r\n' >&3
    body=$(timeout 5 cat <&3)
    exec 3>&-
    printf '%s\n' "${body#*$'\r\n\r\n'}"
}
stat_field() { # PORT-COUNTER NAME: the number in /stats' ports[] (one port here)
    stats | grep -o "\"$1\": *[0-9]*" | head -1 | grep -o '[0-9]*$'
}

# ---- the guest's TLS plumbing: modules, tlshd with the .nvme keyring ------------------------------
for m in tls nvme-tcp nvmet nvmet-tcp; do modprobe "$m" || say "modprobe $m failed"; done
cat >/etc/tlshd.conf <<'EOF'
[debug]
loglevel=1
tls=0
nl=0
[authenticate]
keyrings=.nvme
[authenticate.client]
[authenticate.server]
EOF
tlshd --stderr >"$OUT/tlshd.txt" 2>&1 &
sleep 1
{
    uname -r; nvme version; tlshd --version 2>&1; keyctl --version 2>&1 | head -1
    grep -E 'CONFIG_(NVME_TCP_TLS|NVME_TARGET_TCP_TLS|TLS)=' /boot/config-"$(uname -r)"
    grep -E '^(tls|nvme_tcp|nvmet_tcp|nvme_keyring) ' /proc/modules
} >"$OUT/versions.txt" 2>&1
if pgrep -x tlshd >/dev/null; then check guest-tlshd pass "tlshd running"; else check guest-tlshd fail "tlshd did not start: $(tail -3 "$OUT/tlshd.txt")"; fi

# Keys: one configured PSK per host NQN (what our target holds), inserted into .nvme for each
# identity a kernel peer may look up: subsystem and discovery NQN, identity versions 0 and 1.
gen_key() { nvme gen-tls-key --hmac=1 2>>"$OUT/keys.txt" | grep -o 'NVMeTLSkey-1:0[0-2]:[A-Za-z0-9+/=]*:' | head -1; }
insert_key() { # KEY: into .nvme for SUB and DISC, versions 0 and 1
    local nqn v
    for nqn in "$SUB" "$DISC"; do
        for v in 0 1; do
            logged keys 20 nvme check-tls-key --keyring=.nvme --hostnqn="$HOSTNQN" --subsysnqn="$nqn" \
                --keydata="$1" --identity=$v --insert || return 1
        done
    done
}
KEY=$(gen_key)
WRONG=$(gen_key)
if [[ -n $KEY && -n $WRONG && $KEY != "$WRONG" ]] && insert_key "$KEY"; then
    check keys pass "nvme gen-tls-key made two keys; $KEY inserted for 4 identities"
else
    check keys fail "key generation or insertion failed (keys.txt)"
fi
keyctl show %:.nvme >"$OUT/keyring.txt" 2>&1

# ---- kernel host -> nvmf-target (tls = required) ---------------------------------------------------
start_target() { # KEY-FOR-HOSTNQN LOGNAME KTLS(auto|on|off)
    RUST_LOG=info,nvmf_target::wire=debug nvmf-target --listen 127.0.0.1:$OUR_PORT --nqn "$SUB" \
        --ns ram:64MiB --tls required --tls-key "$HOSTNQN=$1" --stats 127.0.0.1:$STATS --ktls "$3" \
        >"$OUT/$2.txt" 2>&1 &
    TPID=$!
    for _ in $(seq 50); do grep -q '^ready' "$OUT/$2.txt" && return 0; sleep 0.2; done
    return 1
}
stop_target() { [[ -n $TPID ]] && kill "$TPID" 2>/dev/null; wait "$TPID" 2>/dev/null; TPID=; }
ctrl_of() { # the /sys/class/nvme controller connected to SUB
    local c
    for c in /sys/class/nvme/nvme*; do
        [[ -e $c/subsysnqn && $(cat "$c/subsysnqn") == "$SUB" ]] && { basename "$c"; return 0; }
    done
    return 1
}
say "kernel host -> nvmf-target"
# kTLS forced on: the records of the connections below (discovery, connect, fio) are the kernel's
# on both sides.
if start_target "$KEY" target-right on && grep -q '^ready.*tls=required:ktls$' "$OUT/target-right.txt"; then
    check k2o-target-start pass "$(grep '^ready' "$OUT/target-right.txt")"
else
    check k2o-target-start fail "no ready line: $(tail -3 "$OUT/target-right.txt")"
fi

if logged k2o-discover 60 nvme discover -t tcp -a 127.0.0.1 -s $OUR_PORT --tls; then
    entry=$(grep -A12 "subnqn: *$SUB" "$OUT/k2o-discover.txt" | head -12)
    sectype=$(awk '/^subnqn: *'"${SUB//./\\.}"'/{f=1} f&&/^sectype:/{print $2; exit}' "$OUT/k2o-discover.txt")
    treq=$(grep -B8 "subnqn: *$SUB" "$OUT/k2o-discover.txt" | grep '^treq:' | tail -1 | sed 's/^treq: *//')
    if grep -q 'sectype: *tls13' "$OUT/k2o-discover.txt" && [[ $treq == *required* && $treq != *"not required"* ]]; then
        check k2o-discover-tsas pass "discovery over TLS: treq '$treq', sectype $sectype"
    else
        check k2o-discover-tsas fail "treq '$treq' sectype '$sectype': $(echo "$entry" | tr '\n' ' ')"
    fi
else
    check k2o-discover-tsas fail "nvme discover --tls failed: $(tail -3 "$OUT/k2o-discover.txt" | tr '\n' ' ')"
fi

if logged k2o-connect 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB" --tls; then
    sleep 1
    ctrl=$(ctrl_of)
    serial=$(cat "/sys/class/nvme/$ctrl/tls_key" 2>/dev/null)
    established=$(grep -c 'TLS established' "$OUT/target-right.txt")
    idline=$(grep 'TLS established' "$OUT/target-right.txt" | tail -1 | grep -o 'identity=[^ ]* [^ ]* [^ ]*[^ ]*' | head -1)
    suite=$(grep 'TLS established' "$OUT/target-right.txt" | tail -1 | grep -o 'suite="[^"]*"\|suite=[^ ]*')
    if [[ -n $ctrl && -n $serial ]]; then
        check k2o-connect pass "$ctrl tls_key $serial ($(keyctl describe "0x$serial" 2>/dev/null || keyctl describe "$serial" 2>/dev/null)); target: $established TLS sessions, $suite"
    else
        check k2o-connect fail "connected but no controller with a tls_key ($ctrl/$serial)"
    fi
    echo "$idline" >>"$OUT/k2o-connect.txt"
    dev=$(nvme list -o json 2>/dev/null | grep -o '"DevicePath" *: *"/dev/nvme[0-9]*n[0-9]*"' | grep -o '/dev/[a-z0-9]*' | head -1)
    [[ -b ${dev:-} ]] || dev=$(ls /dev/nvme*n1 2>/dev/null | head -1)
    for bs in 4k 128k 1m; do
        case $bs in 4k) size=4m rw=randwrite ;; 128k) size=16m rw=write ;; 1m) size=16m rw=write ;; esac
        if [[ -b ${dev:-} ]] && logged "k2o-fio-$bs" 150 fio --name=tls-$bs --filename="$dev" --ioengine=libaio \
                --direct=1 --rw=$rw --bs=$bs --size=$size --iodepth=8 --verify=crc32c --do_verify=1 \
                --verify_fatal=1 --output-format=terse --terse-version=3; then
            # terse v3: field 6 read KiB, 47 write KiB (the verify reads back all that was written).
            kib=$(grep -E '^3;' "$OUT/k2o-fio-$bs.txt" | awk -F';' '{print $6"/"$47}')
            check "k2o-fio-$bs" pass "fio verify on $dev over TLS: read/write KiB $kib"
        else
            check "k2o-fio-$bs" fail "fio verify failed on '${dev:-no device}': $(grep -iE 'verify|error|bad' "$OUT/k2o-fio-$bs.txt" | head -3 | tr '\n' ' ')"
        fi
    done
    ktls_conns=$(stat_field ktls_connections) tls_conns=$(stat_field tls_connections)
    if (( ${ktls_conns:-0} > 0 && ktls_conns == tls_conns )); then
        check k2o-ktls pass "target --ktls on: all $tls_conns TLS connections had kernel records (ktls_connections $ktls_conns)"
    else
        check k2o-ktls fail "ktls_connections ${ktls_conns:-?} of tls_connections ${tls_conns:-?}"
    fi
    logged k2o-disconnect 30 nvme disconnect -n "$SUB"
else
    check k2o-connect fail "nvme connect --tls failed: $(tail -3 "$OUT/k2o-connect.txt" | tr '\n' ' ')"
    for bs in 4k 128k 1m; do check "k2o-fio-$bs" fail "no connection"; done
    check k2o-ktls fail "no connection"
fi
stats >"$OUT/target-right-stats.json"
stop_target
# The rest of the kernel-host checks against userspace records (--ktls off).
start_target "$KEY" target-user off || say "the userspace-records target did not start: $(tail -3 "$OUT/target-user.txt")"

# Only version 0 identities left for the subsystem, as `nvme gen-tls-key --insert` makes them by
# default: the kernel then offers NVMe0R01, which names no digest, so our target cannot tell the
# derivation from the identity.
for serial in $(keyctl show %:.nvme | awk -v nqn="$SUB" '/psk: NVMe1R/ && index($0, " " nqn " ") {print $1}'); do
    keyctl unlink "$serial" %:.nvme >>"$OUT/keys.txt" 2>&1
done
keyctl show %:.nvme >"$OUT/keyring-v0.txt" 2>&1
if logged k2o-connect-v0 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB" --tls; then
    sleep 1
    ctrl=$(ctrl_of)
    serial=$(cat "/sys/class/nvme/$ctrl/tls_key" 2>/dev/null)
    desc=$(keyctl describe "0x$serial" 2>/dev/null)
    dev=/dev/${ctrl}n1
    if [[ $desc == *"psk: NVMe0R01 "* ]] && logged k2o-connect-v0 120 fio --name=tls-user --filename="$dev" \
            --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --size=2m --iodepth=8 --verify=crc32c \
            --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3; then
        check k2o-connect-v0 pass "$ctrl over TLS with ${desc##*psk: }, userspace records ($(grep -o 'tls=[a-z:]*' "$OUT/target-user.txt")): fio verify 2 MiB at 4k"
    else
        check k2o-connect-v0 fail "connected, but with key '$desc' ($ctrl/$serial), not a version 0 one"
    fi
    logged k2o-connect-v0 30 nvme disconnect -n "$SUB"
else
    check k2o-connect-v0 fail "nvme connect --tls with only NVMe0R01 keys failed: $(grep 'WARN' "$OUT/target-user.txt" | tail -1 | cut -c1-250)"
fi

insert_key "$KEY" || say "re-inserting the version 1 keys failed"   # nvmet's checks need them

# A plain connect to the TLS-required port: refused by the target, logged and counted.
before=$(stat_field plain_refused)
if logged k2o-plain 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB"; then
    check k2o-plain fail "a plain nvme connect to a TLS-required port succeeded"
    logged k2o-plain 30 nvme disconnect -n "$SUB"
else
    after=$(stat_field plain_refused)
    if grep -q 'requires TLS' "$OUT/target-user.txt" && (( ${after:-0} > ${before:-0} )); then
        check k2o-plain pass "refused: nvme connect failed, target counted plain_refused ${before:-?} -> $after and logged it"
    else
        check k2o-plain fail "nvme connect failed but the target did not log/count a refused plain connect (${before:-?} -> ${after:-?})"
    fi
fi
stats >"$OUT/target-user-stats.json"
stop_target

# The wrong key: the target holds another PSK for this host than the one in the host's keyring.
if start_target "$WRONG" target-wrong auto; then
    if logged k2o-wrong 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB" --tls; then
        check k2o-wrong-key fail "nvme connect --tls with the wrong key succeeded"
        logged k2o-wrong 30 nvme disconnect -n "$SUB"
    else
        failures=$(stat_field tls_handshake_failures)
        line=$(grep -m1 'closing the connection' "$OUT/target-wrong.txt")
        if (( ${failures:-0} > 0 )) && [[ $line == *"$HOSTNQN"* ]]; then
            check k2o-wrong-key pass "refused; target: $failures handshake failure(s), log names the host: ${line:0:300}"
        else
            check k2o-wrong-key fail "connect failed but target log/counter do not show a handshake failure naming the host (failures ${failures:-?}): ${line:0:300}"
        fi
    fi
    stats >"$OUT/target-wrong-stats.json"
else
    check k2o-wrong-key fail "the target did not start: $(tail -3 "$OUT/target-wrong.txt")"
fi
stop_target

# SHA-384 (hash field 02, TLS_AES_256_GCM_SHA384). Inserted last: the 6.12 host prefers SHA-384
# identities, which would change what the checks above offered. Debian's tlshd 1.0.0 is linked
# against gnutls_psk_allocate_client/server_credentials, not the ...credentials2 that take the
# PSK's hash, so GnuTLS makes and expects SHA-256 binders for every PSK: with a spec-following
# peer a SHA-384 PSK cannot work. Each SHA-384 check passes when it works with the SHA-384 suite,
# or when it fails in exactly that known way (a newer tlshd turns it into the first case).
TLSHD_SHA256_BINDER="known incompatibility: Debian's tlshd 1.0.0 uses SHA-256 binders for SHA-384 PSKs"
KEY384=$(nvme gen-tls-key --hmac=2 2>>"$OUT/keys.txt" | grep -o 'NVMeTLSkey-1:02:[A-Za-z0-9+/=]*:' | head -1)
if [[ -n $KEY384 ]] && insert_key "$KEY384" && start_target "$KEY384" target-384 auto; then
    if logged k2o-sha384 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB" --tls; then
        sleep 1
        ctrl=$(ctrl_of)
        desc=$(keyctl describe "0x$(cat "/sys/class/nvme/$ctrl/tls_key" 2>/dev/null)" 2>/dev/null)
        suite=$(grep 'TLS established' "$OUT/target-384.txt" | tail -1 | grep -o 'suite="[^"]*"\|suite=[^ ]*')
        dev=/dev/${ctrl}n1
        if [[ $desc == *"psk: NVMe1R02 "* && $suite == *SHA384* ]] && logged k2o-sha384 120 fio --name=tls-384 \
                --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --size=2m --iodepth=8 \
                --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3; then
            check k2o-sha384 pass "$ctrl with ${desc##*psk: }, $suite, fio verify 2 MiB at 4k"
        else
            check k2o-sha384 fail "key '${desc##*psk: }', $suite, on $dev (k2o-sha384.txt)"
        fi
        logged k2o-sha384 30 nvme disconnect -n "$SUB"
    elif grep -q "bad extension.*identity=\"NVMe1R02 " "$OUT/target-384.txt"; then
        # OpenSSL says "bad extension" when the binder is not as long as the PSK's hash (48 bytes).
        check k2o-sha384 pass "$TLSHD_SHA256_BINDER; our target refused the NVMe1R02 ClientHello (bad extension)"
    else
        check k2o-sha384 fail "nvme connect --tls with a SHA-384 key failed: $(grep 'WARN' "$OUT/target-384.txt" | tail -1 | cut -c1-250)"
    fi
else
    check k2o-sha384 fail "no SHA-384 key or the target did not start (keys.txt, target-384.txt)"
fi
stop_target

# ---- our host (nvmf-perf) -> nvmet-tcp with TLS ----------------------------------------------------
say "nvmf-perf -> nvmet"
CFS=/sys/kernel/config/nvmet
nvmet_setup() {
    truncate -s 64M /tmp/nvmet-ns.img || return 1
    mkdir "$CFS/hosts/$HOSTNQN" || return 1
    mkdir "$CFS/subsystems/$SUB" || return 1
    echo 0 >"$CFS/subsystems/$SUB/attr_allow_any_host"
    ln -s "$CFS/hosts/$HOSTNQN" "$CFS/subsystems/$SUB/allowed_hosts/$HOSTNQN" || return 1
    mkdir "$CFS/subsystems/$SUB/namespaces/1" || return 1
    echo /tmp/nvmet-ns.img >"$CFS/subsystems/$SUB/namespaces/1/device_path"
    echo 1 >"$CFS/subsystems/$SUB/namespaces/1/enable" || return 1
    mkdir "$CFS/ports/1" || return 1
    echo tcp >"$CFS/ports/1/addr_trtype"
    echo ipv4 >"$CFS/ports/1/addr_adrfam"
    echo 127.0.0.1 >"$CFS/ports/1/addr_traddr"
    echo $NVMET_PORT >"$CFS/ports/1/addr_trsvcid"
    echo tls1.3 >"$CFS/ports/1/addr_tsas" || return 1
    echo required >"$CFS/ports/1/addr_treq" || return 1
    ln -s "$CFS/subsystems/$SUB" "$CFS/ports/1/subsystems/$SUB" || return 1
}
if nvmet_setup >"$OUT/nvmet-setup.txt" 2>&1; then
    check o2k-nvmet-setup pass "port 1: tsas $(cat $CFS/ports/1/addr_tsas), treq $(cat $CFS/ports/1/addr_treq)"
else
    check o2k-nvmet-setup fail "configfs setup failed: $(tail -3 "$OUT/nvmet-setup.txt" | tr '\n' ' ')"
fi
# trixie's libnvme 1.13 derived the keyring's PSKs the pre-1.16 way: our host derives likewise.
PERF=(-t tcp -a 127.0.0.1 -s $NVMET_PORT -q "$HOSTNQN" --tls-compat)

if logged o2k-discover 60 nvmf-perf discover "${PERF[@]}" --tls-key "$KEY"; then
    if grep -q 'sectype: *tls13' "$OUT/o2k-discover.txt" && grep -q "$SUB" "$OUT/o2k-discover.txt"; then
        check o2k-discover pass "nvmf-perf discover over TLS: $(grep -E '^(treq|sectype):' "$OUT/o2k-discover.txt" | head -2 | tr '\n' ' ')"
    else
        check o2k-discover fail "discovery answered without $SUB or sectype tls13"
    fi
else
    check o2k-discover fail "$(tail -3 "$OUT/o2k-discover.txt" | tr '\n' ' ')"
fi

if logged o2k-identify 60 nvmf-perf identify "${PERF[@]}" -n "$SUB" --tls-key "$KEY"; then
    check o2k-identify pass "$(grep -iE 'model|mn|nsze' "$OUT/o2k-identify.txt" | head -2 | tr '\n' ' ')"
else
    check o2k-identify fail "$(tail -3 "$OUT/o2k-identify.txt" | tr '\n' ' ')"
fi

# Records: the kernel's (--ktls on) for version 1, userspace for version 0; nvmf-perf says which.
for run in 1-4k-on 1-128k-on 0-4k-off; do   # identity version - block size - kTLS
    v=${run%%-*} rest=${run#*-}; bs=${rest%-*} ktls=${rest#*-} name=o2k-verify-v${run%-*}
    if [[ $ktls == on ]]; then records='TLS records: ktls on [1-9][0-9]* connection(s), userspace on 0'
    else records='TLS records: ktls on 0 connection(s), userspace on [1-9]'; fi
    if logged "$name" 120 nvmf-perf run "${PERF[@]}" -n "$SUB" --tls-key "$KEY" --tls-key-identity $v \
            --rw randwrite --bs $bs --iodepth 8 --size 8MiB --runtime 2 --verify --ktls $ktls &&
            grep -q "$records" "$OUT/$name.txt"; then
        check "$name" pass "identity version $v, --ktls $ktls: $(grep -o 'TLS records: .*' "$OUT/$name.txt"); $(grep -E '^ *(write:|verify)' "$OUT/$name.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"
    else
        check "$name" fail "$(tail -4 "$OUT/$name.txt" | tr '\n' ' ')"
    fi
done

tlshd_lines=$(wc -l <"$OUT/tlshd.txt")
if logged o2k-sha384 60 nvmf-perf run "${PERF[@]}" -n "$SUB" --tls-key "$KEY384" --rw randwrite --bs 4k \
        --iodepth 8 --size 4MiB --runtime 2 --verify; then
    check o2k-sha384 pass "SHA-384 key: $(grep -E '^ *(write:|verify)' "$OUT/o2k-sha384.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"
elif grep -q "holds no PSK for identity 'NVMe1R02 " "$OUT/o2k-sha384.txt" &&
     tail -n +"$((tlshd_lines + 1))" "$OUT/tlshd.txt" | grep -q 'unhandled error -55' &&
     ! tail -n +"$((tlshd_lines + 1))" "$OUT/tlshd.txt" | grep -q 'failed to search'; then
    # tlshd found the NVMe1R02 key (no "failed to search") and GnuTLS refused the binder (-55).
    check o2k-sha384 pass "$TLSHD_SHA256_BINDER; tlshd found the key and refused our SHA-384 binder (GnuTLS -55)"
else
    check o2k-sha384 fail "$(tail -3 "$OUT/o2k-sha384.txt" | tr '\n' ' ')"
fi

# A wrong key: with a version 1 identity its digest names no key in nvmet's keyring; with version
# 0 tlshd finds the identity and GnuTLS fails on the binder. Either way tlshd gives up and the
# kernel closes the socket without an alert, so our host can only report the close, naming the
# identity it offered (not an "authentication failed" as against our target, which sends one).
if logged o2k-wrong-v1 60 nvmf-perf identify "${PERF[@]}" -n "$SUB" --tls-key "$WRONG"; then
    check o2k-wrong-key-v1 fail "identify with the wrong key succeeded"
elif grep -q "holds no PSK for identity 'NVMe1R01 " "$OUT/o2k-wrong-v1.txt"; then
    check o2k-wrong-key-v1 pass "$(grep -m1 'holds no PSK' "$OUT/o2k-wrong-v1.txt" | cut -c1-300)"
else
    check o2k-wrong-key-v1 fail "failed, but not naming the identity: $(tail -2 "$OUT/o2k-wrong-v1.txt" | tr '\n' ' ')"
fi
if logged o2k-wrong-v0 60 nvmf-perf identify "${PERF[@]}" -n "$SUB" --tls-key "$WRONG" --tls-key-identity 0; then
    check o2k-wrong-key-v0 fail "identify with the wrong key succeeded"
elif grep -q "holds no PSK for identity 'NVMe0R01 " "$OUT/o2k-wrong-v0.txt"; then
    check o2k-wrong-key-v0 pass "$(grep -m1 'holds no PSK' "$OUT/o2k-wrong-v0.txt" | cut -c1-300)"
else
    check o2k-wrong-key-v0 fail "failed, but not naming the version 0 identity: $(tail -2 "$OUT/o2k-wrong-v0.txt" | tr '\n' ' ')"
fi

if logged o2k-plain 60 nvmf-perf identify -t tcp -a 127.0.0.1 -s $NVMET_PORT -q "$HOSTNQN" -n "$SUB"; then
    check o2k-plain fail "a plain connect to nvmet's TLS-required port succeeded"
else
    check o2k-plain pass "refused: $(grep -v '^\[exit' "$OUT/o2k-plain.txt" | tail -1 | cut -c1-300)"
fi

# ---- the key workflow as a user follows it: only the interchange key on our side ------------------
# No --tls-key-identity, no --tls-compat: nvmf-perf must find what the keyring holds by itself and
# name it (crates/nvmf-host/src/tls.rs, KEYRING_ORDER).
say "nvmf-perf -> nvmet, keys as nvme gen-tls-key --insert makes them"
keyring_entries() { # NQN: the .nvme keyring's "SERIAL IDENTITY" lines for subsystem NQN
    keyctl show %:.nvme | awk -v nqn="$1" '/psk: NVMe/ && (index($0, " " nqn " ") || $NF == nqn) {
        s = $0; sub(/.*psk: /, "", s); print $1, s }'
}
keyed_run() { # NAME HOSTNQN SUBNQN KEY: run --verify with the key alone; 0 when it read back
    logged "$1" 120 nvmf-perf run -t tcp -a 127.0.0.1 -s $NVMET_PORT -q "$2" -n "$3" --tls-key "$4" \
        --rw randwrite --bs 4k --iodepth 8 --size 2MiB --runtime 1 --verify --ktls off &&
        grep -q 'verify *: [1-9][0-9]* I/Os read back, all blocks correct' "$OUT/$1.txt"
}
keyed_detail() { # NAME: what nvmf-perf said it found, and the I/O it read back
    echo "$(grep -o 'TLS PSK: .*' "$OUT/$1.txt" | tail -1 | cut -c1-260); $(grep -o 'verify *: .*' "$OUT/$1.txt" | tr -s ' ')"
}
# nvme-cli 2.13 with its defaults (--identity=0; libnvme 1.13 knows only the old derivation): the
# subsystem's keys above are unlinked first, so the keyring holds only what this command put there.
for serial in $(keyring_entries "$SUB" | cut -d' ' -f1); do keyctl unlink "$serial" %:.nvme >>"$OUT/keys-default.txt" 2>&1; done
logged keys-default 20 nvme gen-tls-key --subsysnqn="$SUB" --insert
DEFAULT_KEY=$(grep -o 'NVMeTLSkey-1:01:[A-Za-z0-9+/=]*:' "$OUT/keys-default.txt" | head -1)
entries=$(keyring_entries "$SUB" | cut -d' ' -f2-)
if [[ -z $DEFAULT_KEY || $entries != "NVMe0R01 $HOSTNQN $SUB" ]]; then
    check o2k-gen-tls-key-2.13 fail "gen-tls-key --insert: key '${DEFAULT_KEY:-none}', keyring entries for $SUB: '$entries' (keys-default.txt)"
elif keyed_run o2k-gen-tls-key-2.13 "$HOSTNQN" "$SUB" "$DEFAULT_KEY" &&
     grep -q 'TLS PSK: identity version 0, compat derivation .*accepted after 3 refused' "$OUT/o2k-gen-tls-key-2.13.txt"; then
    check o2k-gen-tls-key-2.13 pass "keyring: $entries; $(keyed_detail o2k-gen-tls-key-2.13)"
else
    check o2k-gen-tls-key-2.13 fail "keyring: $entries; $(grep -vE '^\[exit 0' "$OUT/o2k-gen-tls-key-2.13.txt" | tail -3 | tr '\n' ' ' | cut -c1-400)"
fi

# What a current nvme-cli (2.16, 3.0: libnvme 1.16 or later) inserts by default: identity version 0,
# derived as the specification says. The guest has only 2.13, so the entry is added as libnvme adds
# it (add_key "psk"), with the TLS PSK libnvme derives for its own test key (test/psk.c's 32-byte key
# as NVMeTLSkey-1:01, host nqn.psk-test-host, subsystem nqn.psk-test-subsys; the bytes are libnvme's
# result, also reproduced with `openssl kdf HKDF`), for a second nvmet subsystem on the same port.
PSK_HOST=nqn.psk-test-host PSK_SUB=nqn.psk-test-subsys
PSK_KEY='NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:'
PSK_V0=05c6503551ad136e6ee32e6eeb3f6d500b69701d84ec71e328f65c7f51566f68
nvmet_second() {
    truncate -s 16M /tmp/nvmet-ns2.img && mkdir "$CFS/hosts/$PSK_HOST" "$CFS/subsystems/$PSK_SUB" &&
    echo 0 >"$CFS/subsystems/$PSK_SUB/attr_allow_any_host" &&
    ln -s "$CFS/hosts/$PSK_HOST" "$CFS/subsystems/$PSK_SUB/allowed_hosts/$PSK_HOST" &&
    mkdir "$CFS/subsystems/$PSK_SUB/namespaces/1" &&
    echo /tmp/nvmet-ns2.img >"$CFS/subsystems/$PSK_SUB/namespaces/1/device_path" &&
    echo 1 >"$CFS/subsystems/$PSK_SUB/namespaces/1/enable" &&
    ln -s "$CFS/subsystems/$PSK_SUB" "$CFS/ports/1/subsystems/$PSK_SUB" &&
    printf "$(echo $PSK_V0 | sed 's/../\\x&/g')" | keyctl padd psk "NVMe0R01 $PSK_HOST $PSK_SUB" %:.nvme
}
if ! nvmet_second >>"$OUT/keys-current.txt" 2>&1; then
    check o2k-gen-tls-key-current fail "second subsystem or keyring entry: $(tail -2 "$OUT/keys-current.txt" | tr '\n' ' ')"
elif keyed_run o2k-gen-tls-key-current "$PSK_HOST" "$PSK_SUB" "$PSK_KEY" &&
     grep -q "TLS PSK: identity version 0, the specification's derivation .*accepted after 2 refused" "$OUT/o2k-gen-tls-key-current.txt"; then
    check o2k-gen-tls-key-current pass "keyring: $(keyring_entries "$PSK_SUB" | cut -d' ' -f2-); $(keyed_detail o2k-gen-tls-key-current)"
else
    check o2k-gen-tls-key-current fail "$(grep -vE '^\[exit 0' "$OUT/o2k-gen-tls-key-current.txt" | tail -3 | tr '\n' ' ' | cut -c1-400)"
fi
keyctl show %:.nvme >"$OUT/keyring-default.txt" 2>&1

# A current nvme-cli itself, when the test was given one (NVMFLAB_NVME_CLI_CURRENT, built as
# docs/tls.md says): its `gen-tls-key --insert` with the defaults, then our host (nvmet) and the
# kernel's host (our target) with only that keyring entry.
CURRENT=/usr/local/bin/nvme-current
if [[ -x $CURRENT ]]; then
    # Built with meson's default prefix, it reads the host NQN from /usr/local/etc/nvme.
    mkdir -p /usr/local/etc/nvme && cp /etc/nvme/hostnqn /etc/nvme/hostid /usr/local/etc/nvme/
    for serial in $(keyring_entries "$SUB" | cut -d' ' -f1); do keyctl unlink "$serial" %:.nvme; done
    logged keys-nvme-cli-current 20 $CURRENT version
    logged keys-nvme-cli-current 20 $CURRENT gen-tls-key --subsysnqn="$SUB" --insert
    CURRENT_KEY=$(grep -o 'NVMeTLSkey-1:01:[A-Za-z0-9+/=]*:' "$OUT/keys-nvme-cli-current.txt" | head -1)
    entries=$(keyring_entries "$SUB" | cut -d' ' -f2-)
    made_by=$(grep -E '^(nvme|libnvme) version' "$OUT/keys-nvme-cli-current.txt" | tr '\n' ' ')
    if [[ -z $CURRENT_KEY || $entries != "NVMe0R01 $HOSTNQN $SUB" ]]; then
        check o2k-nvme-cli-current fail "$made_by gen-tls-key --insert: key '${CURRENT_KEY:-none}', keyring entries: '$entries'"
    elif keyed_run o2k-nvme-cli-current "$HOSTNQN" "$SUB" "$CURRENT_KEY" &&
         grep -q "TLS PSK: identity version 0, the specification's derivation .*accepted after 2 refused" "$OUT/o2k-nvme-cli-current.txt"; then
        check o2k-nvme-cli-current pass "$made_by; keyring: $entries; $(keyed_detail o2k-nvme-cli-current)"
    else
        check o2k-nvme-cli-current fail "$made_by; $(grep -vE '^\[exit 0' "$OUT/o2k-nvme-cli-current.txt" | tail -3 | tr '\n' ' ' | cut -c1-400)"
    fi
    if start_target "$CURRENT_KEY" target-current off &&
            logged k2o-nvme-cli-current 60 nvme connect -t tcp -a 127.0.0.1 -s $OUR_PORT -n "$SUB" --tls; then
        sleep 1
        ctrl=$(ctrl_of)
        desc=$(keyctl describe "0x$(cat "/sys/class/nvme/$ctrl/tls_key" 2>/dev/null)" 2>/dev/null)
        if [[ $desc == *"psk: NVMe0R01 "* ]]; then
            check k2o-nvme-cli-current pass "$ctrl over TLS with ${desc##*psk: } from $made_by"
        else
            check k2o-nvme-cli-current fail "connected, but with key '$desc' ($ctrl)"
        fi
        logged k2o-nvme-cli-current 30 nvme disconnect -n "$SUB"
    else
        check k2o-nvme-cli-current fail "$(tail -2 "$OUT/k2o-nvme-cli-current.txt" 2>/dev/null | tr '\n' ' ') $(grep WARN "$OUT/target-current.txt" | tail -1 | cut -c1-250)"
    fi
    stop_target
fi

# ---- ours <-> ours, kernel records on one side and userspace records on the other ----------------
# Each side encrypts and decrypts with its own sequence numbers: a mismatch fails the first record.
say "nvmf-perf <-> nvmf-target, kTLS against userspace"
# One block size per pairing (CI time): 128k I/O spans many records each way.
O2O=(-t tcp -a 127.0.0.1 -s $OUR_PORT -q "$HOSTNQN" -n "$SUB" --tls-key "$KEY" --rw randwrite --iodepth 8 --size 4MiB --runtime 1 --verify)
o2o_run() { # NAME TARGET-LOG HOST-KTLS HOST-RECORDS-REGEX TARGET-KTLS-CONNS(zero|some) BS
    local name=$1 ok=1 bs=$6
    logged "$name" 90 nvmf-perf run "${O2O[@]}" --bs $bs --ktls "$3" && grep -q "$4" "$OUT/$name.txt" || ok=0
    local k=$(stat_field ktls_connections) t=$(stat_field tls_connections)
    if [[ $5 == zero ]]; then (( ${k:-1} == 0 )) || ok=0; else (( ${k:-0} > 0 )) || ok=0; fi
    if (( ok )); then
        check "$name" pass "run --verify at $bs, host --ktls $3 ($(grep -o 'TLS records: .*' "$OUT/$name.txt" | tail -1)); target $(grep -o 'tls=[a-z:]*' "$OUT/$2.txt"), ktls_connections $k of $t"
    else
        check "$name" fail "host --ktls $3, target ktls_connections ${k:-?} of ${t:-?}: $(grep -vE '^\[exit 0' "$OUT/$name.txt" | tail -3 | tr '\n' ' ')"
    fi
}
if start_target "$KEY" target-o2o-ktls on; then
    o2o_run o2o-userspace-host-ktls-target target-o2o-ktls off 'TLS records: ktls on 0 connection(s), userspace on [1-9]' some 128k
    o2o_run o2o-ktls-both target-o2o-ktls on 'TLS records: ktls on [1-9][0-9]* connection(s), userspace on 0' some 4k
    # Our userspace host says close_notify when it closes: the kTLS target gets an alert record
    # (EIO, then its type by cmsg) and ends the connection with a log line.
    if grep -q 'kTLS: the host sent close_notify' "$OUT/target-o2o-ktls.txt"; then
        check o2o-ktls-alert pass "$(grep -c 'kTLS: the host sent close_notify' "$OUT/target-o2o-ktls.txt") close_notify alerts read by the kTLS target and logged"
    else
        check o2o-ktls-alert fail "no 'the host sent close_notify' line in the kTLS target's log"
    fi
else
    for c in o2o-userspace-host-ktls-target o2o-ktls-both o2o-ktls-alert; do check $c fail "the --ktls on target did not start: $(tail -2 "$OUT/target-o2o-ktls.txt" | tr '\n' ' ')"; done
fi
stop_target
if start_target "$KEY" target-o2o-user off; then
    o2o_run o2o-ktls-host-userspace-target target-o2o-user on 'TLS records: ktls on [1-9][0-9]* connection(s), userspace on 0' zero 128k
else
    check o2o-ktls-host-userspace-target fail "the --ktls off target did not start"
fi
stop_target

dmesg >"$OUT/dmesg.txt"
kill %1 2>/dev/null
say "TLS-INTEROP-DONE"
exit 0
