#!/usr/bin/env bash
# Soft-RoCE directly on a host whose own kernel has rdma_rxe (no VM).
#
#   deploy/softroce-host.sh [--netdev IF] [--rxe NAME] [--test] [--remove]
#
#   --netdev IF  create the rxe device on IF (default: a dummy device
#                "rxedummy0" with 10.79.0.1/24, created if missing)
#   --rxe NAME   rxe device name (default rxe0)
#   --test       then run the loopback verbs checks of the VM lab
#                (softroce-vm/checks-loopback.sh: PORT_ACTIVE + atomic_cap,
#                ib_write_lat, ib_read_lat, ib_atomic_lat, ib_write_bw)
#   --remove     delete the rxe device (and the dummy device if we made it)
#
# Loads rdma_rxe, ib_uverbs and rdma_ucm, creates the device, waits for
# PORT_ACTIVE and prints ibv_devinfo. Installs rdma-core, ibverbs-utils,
# ibverbs-providers, perftest, iproute2 and kmod with apt-get if missing.
# Exits 3 with a clear message when the running kernel has no rdma_rxe: then
# use deploy/softroce-vm/ (QEMU guests under TCG) instead.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETDEV="" RXE=rxe0 TEST=0 REMOVE=0
DUMMY=rxedummy0 DUMMY_IP=10.79.0.1
while [ $# -gt 0 ]; do
    case "$1" in
        --netdev) NETDEV=$2; shift 2 ;;
        --rxe) RXE=$2; shift 2 ;;
        --test) TEST=1; shift ;;
        --remove) REMOVE=1; shift ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { printf '[softroce-host] %s\n' "$*" >&2; }
die() { printf '[softroce-host] ERROR: %s\n' "$1" >&2; exit "${2:-1}"; }
[ "$(id -u)" = 0 ] || die "run as root"

if [ "$REMOVE" = 1 ]; then
    rdma link delete "$RXE" 2>/dev/null && log "removed $RXE"
    ip link show "$DUMMY" >/dev/null 2>&1 && ip link del "$DUMMY" && log "removed $DUMMY"
    exit 0
fi

# ------------------------------------------------------------ packages
missing=()
for p in rdma-core ibverbs-utils ibverbs-providers perftest iproute2 kmod; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
        { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; } ||
        die "apt-get install ${missing[*]} failed"
fi

# ------------------------------------------------------- kernel support
KVER=$(uname -r)
has_rxe() {
    [ -d /sys/module/rdma_rxe ] && return 0
    modprobe rdma_rxe 2>/dev/null && return 0
    return 1
}
if ! has_rxe; then
    why="modprobe rdma_rxe failed"
    if [ -r /proc/config.gz ]; then
        cfg=$(zcat /proc/config.gz | grep -E '^(# )?CONFIG_(INFINIBAND|RDMA_RXE)[ =]' | tr '\n' ' ')
        why="$why; kernel config: ${cfg:-no CONFIG_INFINIBAND/CONFIG_RDMA_RXE}"
    elif [ ! -d "/lib/modules/$KVER" ]; then
        why="$why; no /lib/modules/$KVER"
    fi
    die "the running kernel ($KVER) has no rdma_rxe ($why).
  Soft-RoCE cannot run directly on this host: use the QEMU lab instead,
  deploy/softroce-vm/run-tests.sh (see deploy/softroce-vm/README.md)." 3
fi
modprobe -a ib_uverbs rdma_ucm 2>/dev/null || [ -d /sys/module/ib_uverbs ] || die "cannot load ib_uverbs"

# -------------------------------------------------------------- device
if [ -z "$NETDEV" ]; then
    NETDEV=$DUMMY
    if ! ip link show "$DUMMY" >/dev/null 2>&1; then
        modprobe dummy numdummies=0 2>/dev/null
        ip link add "$DUMMY" type dummy || die "cannot create dummy device (CONFIG_DUMMY?)"
        ip addr add "$DUMMY_IP/24" dev "$DUMMY"
    fi
    ip link set "$DUMMY" up
fi
ip link show "$NETDEV" >/dev/null 2>&1 || die "no netdev $NETDEV"
if ! rdma link show "$RXE/1" >/dev/null 2>&1; then
    rdma link add "$RXE" type rxe netdev "$NETDEV" || die "rdma link add $RXE type rxe netdev $NETDEV failed"
    log "created $RXE on $NETDEV"
fi
for _ in $(seq 50); do
    ibv_devinfo -d "$RXE" 2>/dev/null | grep -q PORT_ACTIVE && break
    sleep 0.2
done
ibv_devinfo -d "$RXE" || die "ibv_devinfo -d $RXE failed"
ibv_devinfo -d "$RXE" | grep -q PORT_ACTIVE || die "$RXE is not PORT_ACTIVE (is $NETDEV up, with an IPv4 address?)"
GID_INDEX=$(ibv_devinfo -v -d "$RXE" | sed -n 's/^[[:space:]]*GID\[[[:space:]]*\([0-9]*\)\]:[[:space:]]*::ffff:.*/\1/p' | head -n1)
IP=$(ip -4 -o addr show dev "$NETDEV" | awk '{split($4, a, "/"); print a[1]; exit}')
log "$RXE on $NETDEV: IPv4 $IP, RoCE v2 GID index ${GID_INDEX:-?}"
log "note: rxe retries forever at retry_cnt=7 (perftest's value): keep timeouts on clients"

if [ "$TEST" = 1 ]; then
    [ -n "$GID_INDEX" ] && [ -n "$IP" ] || die "no IPv4 GID on $RXE: give $NETDEV an IPv4 address"
    results=$(mktemp -d /tmp/softroce-host.XXXXXX)
    LAB_RXE=$RXE LAB_GID_INDEX=$GID_INDEX LAB_IP=$IP LAB_RESULTS=$results LAB_INDEX=host \
        bash "$HERE/softroce-vm/checks-loopback.sh"
    rc=$?
    echo "==== summary"; cat "$results/checks"; rm -rf "$results"
    exit "$rc"
fi
