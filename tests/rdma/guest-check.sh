#!/bin/bash
# Runs inside the trixie guest (tests/rdma/check.py boots it): NVMe over RDMA on Soft-RoCE.
#   1. control: the kernel host (nvme-cli) against the kernel target (nvmet-rdma);
#   2. the kernel host against our target (/usr/local/bin/nvmf-target, built with --features rdma);
#   3. our host (/usr/local/bin/nvmf-perf, --features rdma) against nvmet-rdma, and 4. against our target.
# Kernel host: discover, connect, identify, fio write+verify at 4k, 128k and 1m, disconnect.
# Our host: nvmf-perf discover, identify, and run --verify (write, then read back) at 4k, 128k, 1m.
# Every step writes "PASS name" or "FAIL name: why" to $OUT/results.txt; the exit status is the
# number of failures. Everything is bounded by `timeout`.
set -u
ADDR=10.77.0.1
NQN_KERNEL=nqn.2024-01.io.nvmflab:rdma-nvmet
NQN_OURS=nqn.2024-01.io.nvmflab:rdma-ours
CTL_SOCK=/tmp/nvmf-target.sock
RESULTS=$OUT/results.txt
FAILS=0
: >"$RESULTS"
say() { echo "@@ [$(cut -d" " -f1 /proc/uptime)s] $*"; }
pass() { echo "PASS $1" >>"$RESULTS"; say "PASS $1"; }
fail() { echo "FAIL $1: $2" >>"$RESULTS"; say "FAIL $1: $2"; FAILS=$((FAILS + 1)); }

setup_rxe() {
  say "script started"
  for m in rdma_rxe nvme-rdma nvmet nvmet-rdma; do modprobe $m || { fail setup "modprobe $m"; return 1; }; done
  # rxe needs an Ethernet device with an address; traffic to its own address takes rxe's
  # loopback path inside the device, so one veth end is enough.
  modprobe veth 2>/dev/null || insmod /root/veth.ko.xz || { fail setup "no veth module"; return 1; }
  ip link add rv0 type veth peer name rv1 && ip addr add $ADDR/24 dev rv0 && ip link set rv0 up && ip link set rv1 up \
    || { fail setup "veth"; return 1; }
  rdma link add rxe0 type rxe netdev rv0 || { fail setup "rdma link add"; return 1; }
  rdma link show >$OUT/rdma-link.txt 2>&1
  ibv_devices >$OUT/ibv_devices.txt 2>&1
  pass setup
}

# Hundredths of a second since boot, in UPTIME_CS. Here and in ns_dev only builtins: under TCG
# every fork costs a tenth of a second or more, and a wait loop of forks took 29 s for 25 tries.
uptime_cs() {
  local u rest
  read -r u rest </proc/uptime
  UPTIME_CS=$((10#${u/./}))
}

# Hundredths $1 as seconds with two decimals.
secs() { printf "%d.%02d" $(($1 / 100)) $(($1 % 100)); }

# The block device of namespace $2 (default 1) of subsystem $1, if there is one now, in NS_DEV:
# under native multipath its head nvmeXnN sits in the subsystem's sysfs directory; without it,
# nvmeYnN sits in the controller's. A controller's nvmeXcYnN is a multipath path, hidden (no
# /dev node), and can appear before its head: it is not the device.
ns_dev() {
  local nqn=$1 nsid=${2:-1} d b n
  NS_DEV=
  for d in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
    { read -r n <$d/subsysnqn; } 2>/dev/null || continue
    [ "$n" = "$nqn" ] || continue
    for b in $d/nvme*n$nsid; do
      [[ ${b##*/} == nvme*c*n* ]] && continue
      [ -e "$b" ] && { NS_DEV=/dev/${b##*/}; return 0; }
    done
  done
  return 1
}

# Waits at most $3 seconds for namespace $2 of subsystem $1 to have a block device (printed), or
# with $4 = gone, to have none.
wait_ns() {
  local nqn=$1 nsid=$2 end want=${4:-there}
  uptime_cs; end=$((UPTIME_CS + $3 * 100))
  while :; do
    if ns_dev $nqn $nsid; then
      [ $want = there ] && { echo $NS_DEV; return 0; }
    else
      [ $want = gone ] && return 0
    fi
    uptime_cs; [ $UPTIME_CS -lt $end ] || return 1
    sleep 0.1
  done
}

# The block device of namespace 1 of subsystem $1, waiting up to 10 s for it.
find_ns() { wait_ns $1 1 10; }

# A namespace added to the connected subsystem $2 through our target's control surface, then
# removed: the target completes the kernel host's Asynchronous Event Request (Namespace
# Attribute Changed), the host reads log page 04h and rescans ("rescanning namespaces"), and
# its block device for NSID 2 appears, then goes. Each within 5 s; how long it took goes to
# ns-events-$1.txt.
ns_events() {
  local tag=$1 nqn=$2 t0 dev
  local ctl=(nvmf-target-ctl --socket $CTL_SOCK --timeout 10)
  uptime_cs; t0=$UPTIME_CS
  if ! timeout 20 "${ctl[@]}" "{\"op\":\"add_namespace\",\"subsystem\":\"$nqn\",\"nsid\":2,\"backend\":\"ram\",\"size\":16777216}" \
       >$OUT/ctl-$tag.txt 2>&1; then
    fail "$tag namespace added" "nvmf-target-ctl add_namespace (ctl-$tag.txt)"
    return
  fi
  if ! dev=$(wait_ns $nqn 2 5); then
    fail "$tag namespace added" "no block device for NSID 2 within 5 s of add_namespace"
    fail "$tag namespace removed" "not checked: NSID 2 never appeared"
    return
  fi
  uptime_cs; echo "added $dev after $(secs $((UPTIME_CS - t0))) s" >>$OUT/ns-events-$tag.txt
  pass "$tag namespace added"
  uptime_cs; t0=$UPTIME_CS
  if ! timeout 20 "${ctl[@]}" "{\"op\":\"remove_namespace\",\"subsystem\":\"$nqn\",\"nsid\":2}" >>$OUT/ctl-$tag.txt 2>&1; then
    fail "$tag namespace removed" "nvmf-target-ctl remove_namespace (ctl-$tag.txt)"
  elif wait_ns $nqn 2 5 gone; then
    uptime_cs; echo "removed $dev after $(secs $((UPTIME_CS - t0))) s" >>$OUT/ns-events-$tag.txt
    pass "$tag namespace removed"
  else
    fail "$tag namespace removed" "$dev still there 5 s after remove_namespace"
  fi
}

verify_io() {
  local tag=$1 dev=$2 bs log=$OUT/fio-$tag.txt rc=0
  # One fio run, the sizes one after the other (stonewall): fio's start-up costs seconds under TCG.
  timeout 240 fio --filename=$dev --rw=write --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c \
    --do_verify=1 --verify_fatal=1 --offset=0 --name=v-4k --bs=4k --size=2M \
    --name=v-128k --bs=128k --size=4M --stonewall --name=v-1m --bs=1m --size=8M --stonewall >$log 2>&1 || rc=$?
  for bs in 4k 128k 1m; do
    if grep -q "^v-$bs: (groupid=[0-9]*, jobs=1): err= 0" $log; then
      pass "$tag write+verify $bs"
    else
      fail "$tag write+verify $bs" "fio exit $rc, job v-$bs not clean (fio-$tag.txt)"
    fi
  done
  [ $rc = 0 ] || fail "$tag fio" "fio exit $rc (fio-$tag.txt)"
}

# discover, connect, identify, I/O, disconnect against $ADDR:$2 subsystem $3; $4, if given, is
# run with the tag and NQN while connected, after the I/O.
exercise() {
  local tag=$1 port=$2 nqn=$3 more=${4:-} dev
  if timeout 60 nvme discover -t rdma -a $ADDR -s $port >$OUT/discover-$tag.txt 2>&1 && grep -q "subnqn: *$nqn" $OUT/discover-$tag.txt \
     && grep -q "trtype: *rdma" $OUT/discover-$tag.txt; then
    pass "$tag discover"
  else
    fail "$tag discover" "no rdma entry for $nqn (discover-$tag.txt)"
  fi
  if ! timeout 60 nvme connect -t rdma -a $ADDR -s $port -n $nqn >$OUT/connect-$tag.txt 2>&1; then
    fail "$tag connect" "nvme connect failed (connect-$tag.txt)"
    return
  fi
  if ! dev=$(find_ns $nqn); then
    fail "$tag connect" "no namespace device appeared"
    timeout 30 nvme disconnect -n $nqn >/dev/null 2>&1
    return
  fi
  pass "$tag connect ($dev)"
  local ctrl
  ctrl=$(for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn)" = "$nqn" ] && basename $c; done | head -1)
  if timeout 30 nvme id-ctrl /dev/$ctrl >$OUT/id-ctrl-$tag.txt 2>&1 && grep -q "^subnqn *: *$nqn" $OUT/id-ctrl-$tag.txt \
     && [ "$(cat /sys/class/nvme/$ctrl/transport)" = rdma ]; then
    pass "$tag identify"
  else
    fail "$tag identify" "id-ctrl (id-ctrl-$tag.txt)"
  fi
  verify_io $tag $dev
  [ -z "$more" ] || $more $tag $nqn
  if timeout 60 nvme disconnect -n $nqn >$OUT/disconnect-$tag.txt 2>&1; then pass "$tag disconnect"; else fail "$tag disconnect" "exit $?"; fi
}

# Our host (nvmf-perf -t rdma) against $ADDR:$2, subsystem $3: discover, identify, write+verify.
perf_exercise() {
  local tag=$1 port=$2 nqn=$3 bs size
  local T=(-t rdma -a $ADDR -s $port)
  if timeout 60 nvmf-perf discover "${T[@]}" >$OUT/discover-$tag.txt 2>&1 && grep -q "subnqn: *$nqn" $OUT/discover-$tag.txt \
     && grep -q "trtype: *rdma" $OUT/discover-$tag.txt; then
    pass "$tag discover"
  else
    fail "$tag discover" "no rdma entry for $nqn (discover-$tag.txt)"
  fi
  if timeout 60 nvmf-perf identify "${T[@]}" -n $nqn >$OUT/identify-$tag.txt 2>&1 && grep -qi "$nqn" $OUT/identify-$tag.txt; then
    pass "$tag identify"
  else
    fail "$tag identify" "identify (identify-$tag.txt)"
  fi
  for spec in 4k:2MiB 128k:4MiB 1m:8MiB; do
    bs=${spec%%:*}; size=${spec##*:}
    # One pass of writes over the region, then every block read back and checked.
    if timeout 120 nvmf-perf run "${T[@]}" -n $nqn --rw write --bs $bs --size $size --iodepth 8 --verify \
         >$OUT/perf-$tag-$bs.txt 2>&1 && grep -q "all blocks correct" $OUT/perf-$tag-$bs.txt; then
      pass "$tag write+verify $bs"
    else
      fail "$tag write+verify $bs" "nvmf-perf exit $? (perf-$tag-$bs.txt)"
    fi
  done
}

control_nvmet() {
  local cfs=/sys/kernel/config/nvmet
  truncate -s 256M /tmp/nvmet-ns.img
  mkdir $cfs/subsystems/$NQN_KERNEL && echo 1 >$cfs/subsystems/$NQN_KERNEL/attr_allow_any_host \
    && mkdir $cfs/subsystems/$NQN_KERNEL/namespaces/1 && echo /tmp/nvmet-ns.img >$cfs/subsystems/$NQN_KERNEL/namespaces/1/device_path \
    && echo 1 >$cfs/subsystems/$NQN_KERNEL/namespaces/1/enable && mkdir $cfs/ports/1 \
    && echo rdma >$cfs/ports/1/addr_trtype && echo ipv4 >$cfs/ports/1/addr_adrfam && echo $ADDR >$cfs/ports/1/addr_traddr \
    && echo 4420 >$cfs/ports/1/addr_trsvcid && ln -s $cfs/subsystems/$NQN_KERNEL $cfs/ports/1/subsystems/$NQN_KERNEL \
    || { fail "nvmet setup" "configfs"; return; }
  NVMET_UP=1
  exercise nvmet 4420 $NQN_KERNEL
  case "$CHECKS" in *perf*) perf_exercise perf-nvmet 4420 $NQN_KERNEL ;; esac
}

nvmet_down() {
  local cfs=/sys/kernel/config/nvmet
  [ -n "$NVMET_UP" ] || return 0
  rm -f $cfs/ports/1/subsystems/$NQN_KERNEL; rmdir $cfs/ports/1
  echo 0 >$cfs/subsystems/$NQN_KERNEL/namespaces/1/enable; rmdir $cfs/subsystems/$NQN_KERNEL/namespaces/1 $cfs/subsystems/$NQN_KERNEL
}

ours() {
  say "starting our target"
  # 4 MiB of command buffers in all: the 1 MiB writes at queue depth 8 (fio's and nvmf-perf's)
  # must wait for buffer memory, and still verify (/stats shows the waits and the peak). Two
  # reactors in event mode: the queues are placed round robin on both, which sleep on their
  # completion channels (/stats shows each reactor's queues and wake-ups).
  /usr/local/bin/nvmf-target --listen rdma:$ADDR:4421 --nqn $NQN_OURS --ns ram:64MiB --control $CTL_SOCK \
    --stats 127.0.0.1:9100 --buffer-memory 4MiB --cores 0,1 --mode event >$OUT/target.log 2>&1 &
  local pid=$!
  for i in $(seq 100); do grep -q "^ready" $OUT/target.log && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if ! grep -q "^ready.* rdma=$ADDR:4421" $OUT/target.log; then
    fail "ours start" "no ready line with rdma= (target.log)"
    kill $pid 2>/dev/null
    return
  fi
  pass "ours start"
  OURS_PID=$pid
  exercise ours 4421 $NQN_OURS ns_events
  case "$CHECKS" in *perf*) perf_exercise perf-ours 4421 $NQN_OURS ;; esac
}

# GET /stats of the target whose stats listen on 127.0.0.1:PORT, the whole HTTP response into
# $OUT/FILE (no curl in the guest: bash's /dev/tcp).
fetch_stats() { # PORT FILE
  timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'GET /stats HTTP/1.0\r\n\r\n' >&3 && cat <&3" \
    >$OUT/$2 2>&1
}

# Our target's /stats once every host has used it: its reactors list the RDMA queues they
# served (transport "rdma") with their counters (test_rdma_guest.py reads them).
ours_stats() {
  fetch_stats 9100 stats-ours.txt
  if grep -q '"transport":"rdma"' $OUT/stats-ours.txt; then pass "ours stats"; else fail "ours stats" "no rdma queue (stats-ours.txt)"; fi
}

ours_down() {
  local pid=$OURS_PID rc
  [ -n "$pid" ] || return 0
  ours_stats
  kill -INT $pid; for i in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then fail "ours stop" "still running 5 s after SIGINT"; kill -9 $pid; else
    wait $pid; rc=$?; [ $rc = 0 ] && pass "ours stop" || fail "ours stop" "exit $rc"; fi
}

# Our host rides through a restart of our target (test_reconnect.py reads what this leaves): nvmf-perf
# -t rdma writes 1 MiB in 4k writes at 100 IOPS at most (about 70 under TCG) with --verify and
# reconnect options; once its I/O queue is connected the target is stopped (so the queue's commands
# stay in flight), killed, and started again half a second later on the same file. The run must end
# with every write done once and every block read back correct (perf-reconnect.json). With 4 MiB at
# 400 IOPS the check took 38 s of guest time under TCG (about 70 IOPS there), hence 1 MiB.
RECONNECT_PORT=4423
NQN_RECONNECT=nqn.2024-01.io.nvmflab:rdma-reconnect

# Starts our target for the reconnect check, logging to reconnect-target-$1.log; its pid in
# RECONNECT_PID. The reactor modes the TCP tests cover apply to RDMA too: the first target runs in
# event mode with idle polling (--idle-poll-us), the restarted one in poll mode; each keeps
# /stats on port 910$1 (stats-reconnect-$1.txt, read by test_reconnect.py).
reconnect_target() {
  local log=$OUT/reconnect-target-$1.log i mode
  case $1 in 1) mode="--mode event --idle-poll-us 2000" ;; *) mode="--mode poll" ;; esac
  /usr/local/bin/nvmf-target --listen rdma:$ADDR:$RECONNECT_PORT --nqn $NQN_RECONNECT --ns file:/tmp/reconnect-ns.img \
    --stats 127.0.0.1:910$1 $mode >$log 2>&1 &
  RECONNECT_PID=$!
  for i in $(seq 100); do grep -q "^ready" $log && return 0; kill -0 $RECONNECT_PID 2>/dev/null || return 1; sleep 0.1; done
  return 1
}

# /stats of reconnect target $1 into stats-reconnect-$1.txt.
reconnect_stats() {
  fetch_stats 910$1 stats-reconnect-$1.txt
}

reconnect_check() {
  local perf i rc
  truncate -s 16M /tmp/reconnect-ns.img
  reconnect_target 1 || { fail "reconnect start" "no ready line (reconnect-target-1.log)"; return; }
  pass "reconnect start"
  timeout 90 nvmf-perf run -t rdma -a $ADDR -s $RECONNECT_PORT -n $NQN_RECONNECT --rw write --bs 4k --size 1MiB --iodepth 4 \
    --verify --rate_iops 100 --reconnect-delay 200ms --ctrl-loss-tmo 30 --output-format json \
    >$OUT/perf-reconnect.json 2>$OUT/perf-reconnect.err &
  perf=$!
  for i in $(seq 200); do grep -q "qid=1" $OUT/reconnect-target-1.log && break; sleep 0.1; done
  sleep 0.3
  reconnect_stats 1
  kill -STOP $RECONNECT_PID; sleep 0.3; kill -KILL $RECONNECT_PID; wait $RECONNECT_PID 2>/dev/null
  say "reconnect: target killed"
  sleep 0.5
  if reconnect_target 2; then pass "reconnect restart"; else fail "reconnect restart" "no ready line (reconnect-target-2.log)"; fi
  wait $perf; rc=$?
  reconnect_stats 2
  if [ $rc = 0 ] && grep -q reconnected $OUT/perf-reconnect.err; then
    pass "reconnect perf"
  else
    fail "reconnect perf" "nvmf-perf exit $rc (perf-reconnect.err)"
  fi
  kill -INT $RECONNECT_PID 2>/dev/null; wait $RECONNECT_PID 2>/dev/null
}

CHECKS=${RDMA_CHECKS:-control ours perf}
NVMET_UP= OURS_PID=
setup_rxe || exit 1
case "$CHECKS" in *control*) control_nvmet ;; esac
case "$CHECKS" in *ours*) ours ;; esac
case "$CHECKS" in *reconnect*) reconnect_check ;; esac
# SPDK's hosts go to every target still up, so the targets above stop only after it.
case "$CHECKS" in *spdk*) . /etc/nvmflab/spdk-check.sh; spdk_checks ;; esac
ours_down
nvmet_down
dmesg >$OUT/dmesg.txt
exit $FAILS
