# Sourced by guest-check.sh inside the trixie guest when RDMA_CHECKS names "spdk": SPDK v24.01
# (built on this machine against bookworm's rdma-core 44, run here on trixie's rdma-core 56) over
# Soft-RoCE, on 2 MiB hugepages the guest reserves:
#   - SPDK's target (nvmf_tgt, nvmf_create_transport RDMA, a malloc bdev, set up from a JSON
#     config) served to the kernel host (discover, connect, identify, fio write+verify) and to
#     nvmf-perf -t rdma;
#   - SPDK's hosts against every target that is up (nvmet-rdma, ours, SPDK's): spdk_nvme_identify
#     on the discovery controller (discover) and on the subsystem (identify), bdevperf -w verify
#     at 4k, 128k and 1m (writes, reads back, compares), and spdk_nvme_perf trtype:RDMA.
# Uses pass/fail/exercise/perf_exercise, ADDR, NQN_*, NVMET_UP and OURS_PID from guest-check.sh.
SPDK=/usr/local/spdk
NQN_SPDK=nqn.2024-01.io.nvmflab:rdma-spdk
DISCOVERY_NQN=nqn.2014-08.org.nvmexpress.discovery
SPDK_PORT=4422
SPDK_PID=
# The iobuf pools of the target and of bdevperf (in their JSON configs). bdevperf's verify reads
# take a buffer of the I/O's size from the large pool, whose 132 KiB default refuses 1m; each of
# its channels (bdev, accel) caches some, so 32 such buffers are too few.
BDEVPERF_IOBUF='{"subsystem": "iobuf", "config": [{"method": "iobuf_set_options", "params": {"small_pool_count": 1024, "large_pool_count": 128, "large_bufsize": 1056768}}]}'
SPDK_IOBUF='{"subsystem": "iobuf", "config": [{"method": "iobuf_set_options", "params": {"small_pool_count": 2048, "large_pool_count": 256}}]}'

# bookworm's libaio.so.1 rides along in $SPDK/lib (trixie renamed it libaio.so.1t64); every
# other library is the guest's own. SPDK's env init loads OpenSSL's config and fails without one
# (the guest has libssl but not the openssl package's openssl.cnf): an empty one does. SPDK keeps
# its core locks in /var/tmp and DPDK its runtime in /var/run/dpdk.
: >/tmp/openssl.cnf
mkdir -p /var/tmp /var/run
# Hugepages: without them (--no-huge) SPDK's RDMA finds no memory registration for its own
# buffers ("No translation for ptr"; the target's poll group and the host's queue pairs fail), so
# the guest reserves 2 MiB pages for SPDK's processes (1200 MiB; the target and bdevperf take 384
# each, spdk_nvme_perf 256). The target runs on core 0, SPDK's hosts on core 1 (SPDK apps lock their cores).
if ! grep -q "^nodev /dev/hugepages hugetlbfs" /proc/mounts; then
  mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages
fi
echo 600 >/proc/sys/vm/nr_hugepages
# NVMFLAB_SPDK_HUGE: our build's spdk_nvme_identify runs on hugepages only when it is set
# (scripts/build-spdk.sh).
SPDK_ENV=(env OPENSSL_CONF=/tmp/openssl.cnf LD_LIBRARY_PATH=$SPDK/lib NVMFLAB_SPDK_HUGE=1)
# spdk SECONDS TOOL ARGS...: one of SPDK's tools, stopped after SECONDS.
spdk() { local limit=$1 tool=$2; shift 2; timeout "$limit" "${SPDK_ENV[@]}" "$SPDK/bin/$tool" "$@"; }

spdk_target_up() {
  # A 32 MiB malloc bdev (4 KiB blocks). SPDK's default buffer pools (iobuf: 8192 x 8 KiB and
  # 1024 x 132 KiB) leave it no room in 256 MiB: smaller pools, and a transport share that fits.
  # MDTS 1 MiB (max_io_size; default 128 KiB), so that nvmf-perf, which does not split an I/O,
  # can write 1m; at most 16 I/O units per I/O, so 64 KiB units, from iobuf's large pool.
  cat >/tmp/spdk-tgt.json <<EOF
{"subsystems": [
 $SPDK_IOBUF,
 {"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 8192, "block_size": 4096}}]},
 {"subsystem": "nvmf", "config": [
  {"method": "nvmf_create_transport", "params": {"trtype": "RDMA", "max_io_size": 1048576, "io_unit_size": 65536,
    "num_shared_buffers": 255, "buf_cache_size": 16}},
  {"method": "nvmf_create_subsystem", "params": {"nqn": "$NQN_SPDK", "allow_any_host": true, "serial_number": "SPDKRDMA0001"}},
  {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$NQN_SPDK", "namespace": {"bdev_name": "Malloc0"}}},
  {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$NQN_SPDK",
    "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "$ADDR", "trsvcid": "$SPDK_PORT"}}},
  {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$DISCOVERY_NQN",
    "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "$ADDR", "trsvcid": "$SPDK_PORT"}}}]}]}
EOF
  "${SPDK_ENV[@]}" $SPDK/bin/nvmf_tgt -s 384 -m 0x1 --json /tmp/spdk-tgt.json -r /tmp/spdk-tgt.sock >$OUT/spdk-target.log 2>&1 &
  local pid=$! end=$((SECONDS + 60))
  # Until it listens, exits, gives up (it may then hang in its shutdown) or 60 s pass.
  while [ $SECONDS -lt $end ] && kill -0 $pid 2>/dev/null; do
    grep -q -e "NVMe/RDMA Target Listening on $ADDR port $SPDK_PORT" -e "spdk_app_stop'd on non-zero" $OUT/spdk-target.log && break
    sleep 0.2
  done
  if ! grep -q "NVMe/RDMA Target Listening on $ADDR port $SPDK_PORT" $OUT/spdk-target.log; then
    fail "spdk start" "nvmf_tgt is not listening on RDMA $ADDR:$SPDK_PORT (spdk-target.log)"
    kill -9 $pid 2>/dev/null
    return 1
  fi
  SPDK_PID=$pid
  pass "spdk start"
}

spdk_target_down() {
  [ -n "$SPDK_PID" ] || return 0
  local end=$((SECONDS + 30))
  kill -INT $SPDK_PID; while [ $SECONDS -lt $end ] && kill -0 $SPDK_PID 2>/dev/null; do sleep 0.2; done
  if kill -0 $SPDK_PID 2>/dev/null; then fail "spdk stop" "nvmf_tgt still running 30 s after SIGINT"; kill -9 $SPDK_PID
  else wait $SPDK_PID; local rc=$?; [ $rc = 0 ] && pass "spdk stop" || fail "spdk stop" "nvmf_tgt exit $rc"; fi
}

# bdevperf -w verify result for the job of $2-byte I/Os in log $1: a result line with IOPS > 0 and
# no failed I/O (columns after "Nvme0n1 :": runtime, IOPS, MiB/s, Fail/s, TO/s, ...).
bdevperf_job_ok() {
  awk -v sz="$2" '
    /Job: .*IO size: / { cur = index($0, "IO size: " sz ")") > 0 }
    /ended in about .* with error/ { if (cur) bad = 1 }
    cur && /^[ \t]*Nvme0n1[ \t]*:/ { split($0, a, ":"); split(a[2], f, " "); if (f[2] > 0 && f[4] == 0) ok = 1; cur = 0 }
    END { exit !(ok && !bad) }' "$1"
}

# SPDK's hosts against target $1 (a tag) at port $2, subsystem $3.
spdk_host_exercise() {
  local tag=$1 port=$2 nqn=$3 log
  local trid="trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:$port"
  log=$OUT/discover-$tag.txt
  if spdk 90 spdk_nvme_identify -r "$trid subnqn:$DISCOVERY_NQN" >$log 2>&1 && grep -q "Discovery Log Page" $log \
     && grep -q "NVM Subsystem Qualified Name: *$nqn" $log && grep -q "Transport Type: *1 (RDMA)" $log; then
    pass "$tag discover"
  else
    fail "$tag discover" "no RDMA entry for $nqn (discover-$tag.txt)"
  fi
  log=$OUT/identify-$tag.txt
  if spdk 90 spdk_nvme_identify -r "$trid subnqn:$nqn" >$log 2>&1 && grep -q "^Subsystem NQN: *$nqn" $log; then
    pass "$tag identify"
  else
    fail "$tag identify" "spdk_nvme_identify (identify-$tag.txt)"
  fi
  # One bdevperf run, three verify jobs side by side on disjoint ranges (in blocks, so they stay
  # disjoint whatever the namespace's block size; each range holds at least depth I/Os at 512 B).
  cat >/tmp/bdevperf-$tag.json <<EOF
{"subsystems": [$BDEVPERF_IOBUF, {"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller", "params": {
  "name": "Nvme0", "trtype": "rdma", "adrfam": "ipv4", "traddr": "$ADDR", "trsvcid": "$port", "subnqn": "$nqn"}}]}]}
EOF
  cat >/tmp/bdevperf-$tag.jobs <<EOF
[global]
filename=Nvme0n1
rw=verify
[v-4k]
bs=4096
iodepth=8
offset=0
length=1024
[v-128k]
bs=131072
iodepth=4
offset=1024
length=1024
[v-1m]
bs=1048576
iodepth=2
offset=2048
length=4096
EOF
  log=$OUT/bdevperf-$tag.txt
  local rc=0
  spdk 120 bdevperf -s 384 -m 0x2 --json /tmp/bdevperf-$tag.json -j /tmp/bdevperf-$tag.jobs -t 2 >$log 2>&1 || rc=$?
  for spec in 4k:4096 128k:131072 1m:1048576; do
    if [ $rc = 0 ] && bdevperf_job_ok $log ${spec##*:}; then
      pass "$tag write+verify ${spec%%:*}"
    else
      fail "$tag write+verify ${spec%%:*}" "bdevperf exit $rc, ${spec%%:*} job not clean (bdevperf-$tag.txt)"
    fi
  done
}

spdk_checks() {
  local ntargets=0 perf_args=()
  spdk_target_up || return
  exercise spdk $SPDK_PORT $NQN_SPDK
  case "$CHECKS" in *perf*) perf_exercise perf-spdk $SPDK_PORT $NQN_SPDK ;; esac
  # SPDK's hosts: each target that is up, SPDK's own last.
  [ -n "$NVMET_UP" ] && spdk_host_exercise spdkhost-nvmet 4420 $NQN_KERNEL
  [ -n "$OURS_PID" ] && spdk_host_exercise spdkhost-ours 4421 $NQN_OURS
  spdk_host_exercise spdkhost-spdk $SPDK_PORT $NQN_SPDK
  # spdk_nvme_perf trtype:RDMA, one run against every target at once (its start-up costs seconds).
  [ -n "$NVMET_UP" ] && perf_args+=(-r "trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:4420 subnqn:$NQN_KERNEL")
  [ -n "$OURS_PID" ] && perf_args+=(-r "trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:4421 subnqn:$NQN_OURS")
  perf_args+=(-r "trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:$SPDK_PORT subnqn:$NQN_SPDK")
  local log=$OUT/spdk-perf.txt rc=0
  spdk 120 spdk_nvme_perf -s 256 -c 0x2 -q 8 -o 4096 -w randrw -M 50 -t 2 "${perf_args[@]}" >$log 2>&1 || rc=$?
  for t in 4420:$NQN_KERNEL 4421:$NQN_OURS $SPDK_PORT:$NQN_SPDK; do
    local nqn=${t#*:} tag=spdk-perf-${t%%:*}
    case " ${perf_args[*]} " in *"subnqn:$nqn"*) ;; *) continue ;; esac
    # The per-namespace line: "RDMA (addr:10.77.0.1 subnqn:NQN) NSID 1 from core 0:  IOPS  MiB/s ..."
    if [ $rc = 0 ] && awk -v n="subnqn:$nqn)" 'index($0, n) && /NSID 1 +from core/ { split($0, a, "from core +[0-9]+:"); split(a[2], f, " "); if (f[1] > 0) ok = 1 } END { exit !ok }' $log; then
      pass "$tag"
    else
      fail "$tag" "spdk_nvme_perf exit $rc, no IOPS for $nqn (spdk-perf.txt)"
    fi
  done
  spdk_target_down
}
