#!/bin/bash
# Stage 2 of a lab guest: PID 1 after switch_root, run by the host's bash from
# the read-only 9p root (+ tmpfs overlay). Brings up the network and rxe0,
# starts the command agent, runs the caller's command with its output on guest
# tmpfs, copies output and exit status to the run share, and powers off.
# Reads its settings from <guest dir>/guest.env (lab.guest=<dir> on the
# kernel command line); see lib.sh for the variables.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8
T0=$(cut -d' ' -f1 /proc/uptime)

say() { echo "lab-guest: $*" > /dev/console; }
step() { say "[$(cut -d' ' -f1 /proc/uptime)] $*"; }   # boot timeline on the console log
poweroff_now() {
    sync
    echo o > /proc/sysrq-trigger
    sleep 30
}
die() { say "FATAL: $*"; [ -n "${LAB_RESULTS:-}" ] && echo "lab-guest: FATAL: $*" >> "$LAB_RESULTS/boot-error.log"; poweroff_now; }

# ----------------------------------------------------------- base system
# No fresh tmpfs on /tmp or /run: the overlay's upper layer is tmpfs already,
# and a new mount there would hide a run share or lab folder under /tmp.
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd          # bash process substitution
[ -e /dev/stdin ] || ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || ln -s /proc/self/fd/2 /dev/stderr
echo 1 > /proc/sys/kernel/sysrq
ulimit -l unlimited 2>/dev/null                        # verbs memory registration

GUEST_DIR=
for arg in $(cat /proc/cmdline); do
    case "$arg" in lab.guest=*) GUEST_DIR=${arg#lab.guest=} ;; esac
done
[ -n "$GUEST_DIR" ] && [ -f "$GUEST_DIR/guest.env" ] || die "no lab.guest= or guest.env"
# Files are copied to tmpfs before use (9p reads from the guest were seen truncated).
mkdir -p /tmp/lab
cp "$GUEST_DIR/guest.env" /tmp/lab/guest.env && cp "$GUEST_DIR/cmd.sh" /tmp/lab/cmd.sh || die "copy guest.env/cmd.sh"
set -a; . /tmp/lab/guest.env; set +a
hostname "lab$LAB_INDEX"
echo "127.0.0.1 localhost lab$LAB_INDEX" > /tmp/hosts 2>/dev/null
mount --bind /tmp/hosts /etc/hosts 2>/dev/null

# --------------------------------------------------------------- network
step "network ($LAB_TOPOLOGY)"
ip link set lo up
case "$LAB_TOPOLOGY" in
    loopback)
        modprobe dummy numdummies=0 || die "modprobe dummy"
        ip link add "$LAB_NETDEV" type dummy || die "ip link add $LAB_NETDEV"
        ;;
    multi)
        modprobe virtio_net || die "modprobe virtio_net"
        for _ in $(seq 50); do [ -e "/sys/class/net/$LAB_NETDEV" ] && break; sleep 0.1; done
        ;;
esac
ip addr add "$LAB_IP/$LAB_PREFIXLEN" dev "$LAB_NETDEV" || die "address $LAB_NETDEV"
ip link set "$LAB_NETDEV" up || die "up $LAB_NETDEV"

# ------------------------------------------------------------------- rxe
step "rdma modules"
modprobe -a rdma_rxe ib_uverbs rdma_ucm || die "modprobe rdma_rxe ib_uverbs rdma_ucm"
rdma link add "$LAB_RXE" type rxe netdev "$LAB_NETDEV" || die "rdma link add $LAB_RXE"
step "waiting for $LAB_RXE PORT_ACTIVE"
for _ in $(seq 100); do
    ibv_devinfo -d "$LAB_RXE" 2>/dev/null | grep -q PORT_ACTIVE && break
    sleep 0.2
done
# The IPv4-mapped GID (reading sysfs gids one by one is very slow under TCG).
LAB_GID_INDEX=$(ibv_devinfo -v -d "$LAB_RXE" 2>/dev/null \
    | sed -n 's/^[[:space:]]*GID\[[[:space:]]*\([0-9]*\)\]:[[:space:]]*::ffff:.*/\1/p' | head -n1)
export LAB_GID_INDEX=${LAB_GID_INDEX:-1}
ibv_devinfo -d "$LAB_RXE" 2>/dev/null | grep -q PORT_ACTIVE || say "warning: $LAB_RXE not PORT_ACTIVE"

# ----------------------------------------------------------------- agent
# Host -> guest command channel: the host drops <id>.cmd files in
# $LAB_RESULTS/agent/ (atomically, by rename); the first line is
# "#timeout <seconds>". Each runs in the background under timeout, output on
# tmpfs, then <id>.out and <id>.rc are written back (rc last, by rename).
mkdir -p /tmp/lab/agent "$LAB_RESULTS/agent"
agent() {
    local f id t tick
    mkfifo /tmp/lab/tick
    exec {tick}<> /tmp/lab/tick             # read -t on it = sleep without fork
    shopt -s nullglob
    while :; do
        for f in "$LAB_RESULTS"/agent/*.cmd; do
            id=$(basename "$f" .cmd)
            cp "$f" "/tmp/lab/agent/$id.sh" && rm -f "$f" || continue
            t=$(sed -n '1s/^#timeout \([0-9]*\).*/\1/p' "/tmp/lab/agent/$id.sh")
            (
                cd "${LAB_CWD:-/}" 2>/dev/null || cd /
                timeout -k 5 "${t:-120}" bash "/tmp/lab/agent/$id.sh" \
                    > "/tmp/lab/agent/$id.out" 2>&1 < /dev/null
                rc=$?
                cp "/tmp/lab/agent/$id.out" "$LAB_RESULTS/agent/$id.out"
                echo "$rc" > "$LAB_RESULTS/agent/$id.rc.tmp"
                mv "$LAB_RESULTS/agent/$id.rc.tmp" "$LAB_RESULTS/agent/$id.rc"
            ) &
        done
        read -t "${LAB_AGENT_POLL:-0.5}" -u "$tick"
    done
}
agent &
AGENT_PID=$!

T1=$(cut -d' ' -f1 /proc/uptime)
{ echo "LAB_GID_INDEX=$LAB_GID_INDEX"; echo "BOOT_SECONDS=$T1"; } > "$LAB_RESULTS/ready.tmp"
mv "$LAB_RESULTS/ready.tmp" "$LAB_RESULTS/ready"
say "ready after ${T1}s (stage 2 took $(echo "$T1 $T0" | awk '{printf "%.1f", $1-$2}')s), gid index $LAB_GID_INDEX"

# --------------------------------------------------------- the command
cd "${LAB_CWD:-/}" 2>/dev/null || cd /
if [ "${LAB_LIVE:-0}" = 1 ]; then     # also stream to the console log on the host
    bash /tmp/lab/cmd.sh < /dev/null 2>&1 | tee /tmp/lab/output.log > /dev/console
    rc=${PIPESTATUS[0]}
else
    bash /tmp/lab/cmd.sh > /tmp/lab/output.log 2>&1 < /dev/null
    rc=$?
fi
say "command exited with status $rc"
kill "$AGENT_PID" 2>/dev/null
cp /tmp/lab/output.log "$LAB_RESULTS/output.log"
echo "$rc" > "$LAB_RESULTS/rc.tmp"
mv "$LAB_RESULTS/rc.tmp" "$LAB_RESULTS/rc"
poweroff_now
