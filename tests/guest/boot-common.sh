# Sourced by the guests' /init scripts (tests/guest/init, tests/blktests/guest-init): mounts what
# the tests expect, starts udev, writes the host NQN and ID (exported as HOSTNQN, HOSTID), and arms
# poweroff on exit, so PID 1 never returns.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8

say() { echo "@@ $*" >/dev/console; }
off() {
    sync
    echo o >/proc/sysrq-trigger
    sleep 30
}
trap off EXIT

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug
modprobe configfs && mount -t configfs configfs /sys/kernel/config
echo 1 >/proc/sys/kernel/sysrq
echo "${GUEST_HOSTNAME:-nvmflab-guest}" >/proc/sys/kernel/hostname
ip link set lo up
modprobe virtio_blk

/usr/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add >/dev/null 2>&1
udevadm settle -t 30
mkdir -p /etc/nvme
export HOSTID=0f01fb42-9f7f-4856-b0b3-51e60b8de349
export HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
echo "$HOSTNQN" >/etc/nvme/hostnqn
echo "$HOSTID" >/etc/nvme/hostid
