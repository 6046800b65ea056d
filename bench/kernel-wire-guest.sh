#!/bin/bash
# Runs inside the trixie guest (tests/guest/trixie.py) as root, booted by bench/kernel_wire.py:
# Linux 6.12's nvme-tcp host (nvme connect, fio with libaio direct I/O on the namespace) against
# our nvmf-target on the guest's loopback, set up as the bench sets it (null namespace, in-capsule
# size 8192, one polling reactor). For each work: a tcpdump capture of every connection from
# before connect, and the target's successful system calls while fio ran (a hist trigger on
# raw_syscalls:sys_exit, keyed by thread: the kernel's tracing, no strace or perf in the guest)
# with the I/O commands the target's /stats counted over the same window (issue 40 item 3).
#
# WORKS: keys as bench/nvmfbench/stacks.py names them (4k-randread-qd32), each optionally with
# +digest and/or +batch (see the loop). Writes to $OUT, per work W: W.pcap, W.hist.txt (the
# histogram as the kernel prints it), W.tids.txt (the target's threads), W.ios.txt (I/O commands
# before and after), W.fio.json, W.summary.json (bench/wire.py's reader, run here so large
# captures need not come back; captures over KEEP_PCAP_MB are then deleted). Needs /usr/local/bin/nvmf-target, tcpdump and libpcap, and
# /usr/local/lib/nvmflab/wire.py (bench/nvmfbench/wire.py).
set -u
export PATH=/usr/local/bin:$PATH
NQN=nqn.2024-01.io.nvmflab:kernel-wire
PORT=4420
STATS=9100
WORKS=${WORKS:-4k-randread-qd1 4k-randread-qd32 4k-randread-qd128 4k-randwrite-qd32 128k-randread-qd32 128k-randwrite-qd32}
RAMP=${RAMP:-1}
RUNTIME=${RUNTIME:-3}
PACKETS=${PACKETS:-3000}
KEEP_PCAP_MB=${KEEP_PCAP_MB:-16}
# The kernel host's I/O queue works on CPU 0 (nvme-tcp's io_cpu for queue 1); fio submits there
# too, and the polling reactor has CPU 1 to itself.
TARGET_CPU=1
HOST_CPU=0
HIST='hist:keys=common_pid,id.syscall:vals=hitcount:size=4096 if ret >= 0'
say() { echo "@@ $*"; }

stats() { # GET /stats of our target (no curl in the guest)
    local body
    exec 3<>/dev/tcp/127.0.0.1/$STATS || return 1
    printf 'GET /stats HTTP/1.0\r\nHost: x\r\n\r\n' >&3
    body=$(timeout 5 cat <&3)
    exec 3>&-
    printf '%s\n' "${body#*$'\r\n\r\n'}"
}
io_count() { # reads + writes of every namespace, from /stats
    stats | python3 -c 'import json, sys
print(sum(n["reads"] + n["writes"] for r in json.load(sys.stdin)["reactors"] for n in r["namespaces"]))'
}
namespace_dev() { # the block device of NQN's namespace (the multipath head node)
    local s
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [[ $(cat "$s/subsysnqn" 2>/dev/null) == "$NQN" ]] || continue
        ls "$s" | grep -E '^nvme[0-9]+n[0-9]+$' | head -1
        return
    done
}

modprobe nvme-tcp || say "modprobe nvme-tcp failed"
TRACING=/sys/kernel/tracing
[[ -d $TRACING/events ]] || mount -t tracefs tracefs $TRACING
EVENT=$TRACING/events/raw_syscalls/sys_exit
{
    uname -r; nvme version | head -1; fio --version; tcpdump --version 2>&1 | head -2; python3 --version
    grep -E 'CONFIG_HIST_TRIGGERS=' /boot/config-"$(uname -r)"
} >"$OUT/versions.txt" 2>&1

nvmf-target --listen 127.0.0.1:$PORT --nqn $NQN --ns null:1g --in-capsule-data-size 8192 --stats $STATS \
    --cores $TARGET_CPU --mode poll --idle-poll-us 0 >"$OUT/target.txt" 2>&1 &
TPID=$!
trap 'kill $TPID 2>/dev/null' EXIT
for _ in $(seq 60); do grep -q '^ready' "$OUT/target.txt" && break; sleep 1; done
grep -q '^ready' "$OUT/target.txt" || { say "the target did not start: $(tail -3 "$OUT/target.txt")"; exit 1; }
say "target: $(grep '^ready' "$OUT/target.txt")"

for work in $WORKS; do
    # A work may carry variants: +digest (nvme connect asks for header and data digests), +batch
    # (fio hands the kernel up to QD I/Os per io_submit instead of one).
    IFS=- read -r size rw qd <<<"${work%%+*}"
    qd=${qd#qd}
    connect_more=() fio_more=()
    [[ $work == *+digest* ]] && connect_more+=(--hdr-digest --data-digest)
    [[ $work == *+batch* ]] && fio_more+=(--iodepth_batch_submit="$qd" --iodepth_batch_complete_max="$qd")
    tcpdump -Z root -i lo -s 0 -B 262144 -c "$PACKETS" -w "$OUT/$work.pcap" "tcp port $PORT" \
        2>"$OUT/$work.tcpdump.txt" &
    cap=$!
    for _ in $(seq 30); do grep -q 'listening on' "$OUT/$work.tcpdump.txt" && break; sleep 1; done
    sleep 1  # the line comes a little before the first packet is taken
    if ! timeout 60 nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN --nr-io-queues=1 "${connect_more[@]}" >"$OUT/$work.connect.txt" 2>&1; then
        say "$work: nvme connect failed: $(tail -2 "$OUT/$work.connect.txt" | tr '\n' ' ')"
        kill $cap 2>/dev/null; wait $cap
        continue
    fi
    dev=
    for _ in $(seq 30); do dev=$(namespace_dev); [[ -n $dev && -b /dev/$dev ]] && break; sleep 1; done
    # One hardware queue would get mq-deadline; the bench's hosts have no scheduler either.
    for q in /sys/block/nvme*/queue/scheduler; do echo none >"$q" 2>/dev/null; done
    before=$(io_count)
    echo "$HIST" >"$EVENT/trigger" || say "$work: the hist trigger was refused: $(cat "$TRACING/error_log" 2>/dev/null | tail -2)"
    timeout $((RAMP + RUNTIME + 120)) fio --name="$work" --filename="/dev/$dev" --ioengine=libaio --direct=1 \
        --rw="$rw" --bs="$size" --iodepth="$qd" --time_based --ramp_time="$RAMP" --runtime="$RUNTIME" \
        --cpus_allowed=$HOST_CPU "${fio_more[@]}" --output-format=json --output="$OUT/$work.fio.json" >"$OUT/$work.fio.txt" 2>&1
    fio_rc=$?
    cat "$EVENT/hist" >"$OUT/$work.hist.txt"
    echo "!$HIST" >"$EVENT/trigger"
    after=$(io_count)
    echo "$before $after" >"$OUT/$work.ios.txt"
    ls /proc/$TPID/task >"$OUT/$work.tids.txt"
    # A clocksource without a vDSO mode (TSC found unstable under TCG) turns clock_gettime into a
    # system call, which the histogram then counts.
    clock=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)
    echo "$clock" >"$OUT/$work.clocksource.txt"
    timeout 60 nvme disconnect -n $NQN >>"$OUT/$work.connect.txt" 2>&1
    sleep 1  # the last segments reach the capture
    kill -INT $cap 2>/dev/null
    wait $cap
    say "$work: /dev/$dev fio exit $fio_rc, I/O commands $before -> $after, clocksource $clock, capture $(stat -c %s "$OUT/$work.pcap" 2>/dev/null) bytes"
done
kill $TPID
wait $TPID
dmesg | grep -i clocksource >"$OUT/clocksource.txt"
grep -q '^hist' "$EVENT/trigger" && say "a hist trigger was left on: $(grep '^hist' "$EVENT/trigger")"

# The captures are read here, with the target stopped; only the small ones come back.
for work in $WORKS; do
    [[ -s $OUT/$work.pcap ]] || continue
    python3 -c 'import json, sys
sys.path.insert(0, "/usr/local/lib/nvmflab")
from wire import summarize_capture
print(json.dumps(summarize_capture(open(sys.argv[1], "rb").read()), indent=1))' "$OUT/$work.pcap" \
        >"$OUT/$work.summary.json" 2>"$OUT/$work.summary.err"
    (( $(stat -c %s "$OUT/$work.pcap") > KEEP_PCAP_MB << 20 )) && rm -f "$OUT/$work.pcap"
    say "$work: summarized ($(wc -c <"$OUT/$work.summary.json") bytes)"
done
exit 0
