# shellcheck shell=bash disable=SC2034
# Soft-RoCE VM lab — host-side library. Source it from bash (as root):
#
#   source deploy/softroce-vm/lib.sh
#   lab_run_loopback 'ibv_devinfo -v'                 # one guest, rxe0 on dummy0
#   lab_run_multi 2 'cmd for guest 1' 'cmd for guest 2'   # N guests on a bridge
#
# or, to act on the guests while they run (cuts, host-side clients):
#
#   lab_start multi 3 lab_idle lab_idle lab_idle      # returns once all are up
#   lab_exec 2 'ping -c1 -W2 $(lab_peer_ip 1)'       # run a command in guest 2
#   lab_cut 1 2; ...; lab_heal 1 2                    # partition a pair
#   lab_isolate 3; ...; lab_rejoin 3                  # cut a guest off entirely
#   lab_stop                                          # end lab_idle, wait, clean up
#
# Guests run under TCG (never KVM), boot Debian's kernel from the cache that
# setup.sh fills, use the host's / read-only over 9p (+ tmpfs overlay), and
# a read-write 9p share ($LAB_SHARE) to return results. See README.md.
#
# Every function returns a status; none calls exit. lab_start installs an
# EXIT/INT/TERM trap (keeping an EXIT trap you set before) that kills the
# guests and removes taps, bridge and filter rules. State of the running lab
# is in $LAB_RUN/lab.env, so lab_cut/lab_exec/... also work from another
# process that has LAB_RUN set (see lab.sh).

# ------------------------------------------------------------ settings
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${LAB_CACHE:=$LAB_DIR/cache}"
: "${LAB_BRIDGE:=rrlab0}"            # host bridge of the multi topology
: "${LAB_NET:=10.77.0}"              # /24: host .1, guest i .(10+i)
: "${LAB_RXE:=rxe0}"
: "${LAB_LOOPBACK_SMP:=2}"  ; : "${LAB_LOOPBACK_MEM:=2G}"
: "${LAB_MULTI_SMP:=1}"     ; : "${LAB_MULTI_MEM:=1G}"   # 1 vCPU: measured faster here (README)
: "${LAB_QEMU_CPU:=max}"
: "${LAB_TIMEOUT:=600}"              # lab_run_*: seconds for the guest commands
: "${LAB_BOOT_TIMEOUT:=180}"         # seconds until every guest is ready
: "${LAB_CUT_METHOD:=bridge}"        # lab_cut: bridge (host ebtables) | guest (iptables via agent)
: "${LAB_CUT_SCOPE:=all}"            # lab_cut: all (every frame/packet) | roce (UDP 4791 only)
: "${LAB_ISOLATE_METHOD:=tap}"       # lab_isolate: tap (host tap down: silent loss) | link (carrier off)
: "${LAB_KEEP_RUNS:=20}"             # run folders kept in $LAB_CACHE/runs
: "${LAB_QUIET:=0}"                  # 1: lab_wait does not print guest output
: "${LAB_PASS_ENV:=}"                # names of host variables copied into the guests
: "${LAB_LOCK_WAIT:=600}"            # seconds to wait while another multi lab runs
: "${LAB_GUEST_KERNEL:=default}"     # default (6.1) | current (6.12): see setup.sh
: "${LAB_DISK_GUESTS:=}"             # guests that get a virtio data disk (indexes)
: "${LAB_DISK_MB:=256}"              # its size (a sparse host file, ext4)
: "${LAB_DISK_CACHE:=}"              # QEMU cache mode of the disk (empty: none, else writeback)

_lab_log() { printf '[lab %s] %s\n' "$(date +%T)" "$*" >&2; }

# lab_setup: run setup.sh (idempotent; it prepares every kernel) and load
# the env file of the kernel LAB_GUEST_KERNEL names (default | current).
lab_setup() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    if [ -z "${_LAB_SETUP_DONE:-}" ]; then
        "$LAB_DIR/setup.sh" || return 1
        _LAB_SETUP_DONE=1
    fi
    [ -f "$LAB_CACHE/kernel-$LAB_GUEST_KERNEL.env" ] || {
        _lab_log "no kernel '$LAB_GUEST_KERNEL' prepared (LAB_KERNELS of setup.sh)"; return 1; }
    # shellcheck disable=SC1091
    . "$LAB_CACHE/kernel-$LAB_GUEST_KERNEL.env"
}

# ------------------------------------------------------------ run state
# lab.env in the run folder holds what other processes need.
_lab_load() {
    [ -n "${LAB_RUN:-}" ] && [ -f "$LAB_RUN/lab.env" ] || { _lab_log "no running lab (LAB_RUN unset or stale)"; return 1; }
    # shellcheck disable=SC1091
    . "$LAB_RUN/lab.env"
}
_lab_ip() { echo "$LAB_NET.$((10 + $1))"; }
_lab_tap() { echo "${LAB_BRIDGE}t$1"; }

# ------------------------------------------------------------ network
_lab_net_up() {   # <n>
    local n=$1 i tap
    [ ${#LAB_BRIDGE} -le 12 ] || { _lab_log "LAB_BRIDGE too long"; return 1; }
    if ! ip link show "$LAB_BRIDGE" >/dev/null 2>&1; then
        ip link add "$LAB_BRIDGE" type bridge forward_delay 0 stp_state 0 || return 1
    fi
    ip addr flush dev "$LAB_BRIDGE"
    ip addr add "$LAB_NET.1/24" dev "$LAB_BRIDGE" || return 1
    ip link set "$LAB_BRIDGE" up || return 1
    for ((i = 1; i <= n; i++)); do
        tap=$(_lab_tap "$i")
        ip link del "$tap" >/dev/null 2>&1
        ip tuntap add dev "$tap" mode tap || return 1
        ip link set "$tap" master "$LAB_BRIDGE" || return 1
        ip link set "$tap" up || return 1
    done
    # With br_netfilter active, bridged frames go through the host's iptables
    # FORWARD chain: let ours pass if its policy is not ACCEPT (Docker hosts).
    if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] &&
       ! iptables -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD ACCEPT'; then
        iptables -I FORWARD -i "$LAB_BRIDGE" -o "$LAB_BRIDGE" -j ACCEPT &&
            echo "iptables -D FORWARD -i $LAB_BRIDGE -o $LAB_BRIDGE -j ACCEPT" >> "$LAB_RUN/undo"
    fi
}
_lab_net_down() {
    local l i
    if [ -f "$LAB_RUN/undo" ]; then        # host filter rules still in place
        while read -r l; do [ -n "$l" ] && eval "$l" >/dev/null 2>&1; done < "$LAB_RUN/undo"
        : > "$LAB_RUN/undo"
    fi
    [ "${LAB_TOPOLOGY:-}" = multi ] || return 0
    for ((i = 1; i <= LAB_N; i++)); do ip link del "$(_lab_tap "$i")" >/dev/null 2>&1; done
    ip link del "$LAB_BRIDGE" >/dev/null 2>&1
    return 0
}

# ------------------------------------------------------------ guests
_lab_write_guest() {   # <i> <cmd>
    local i=$1 cmd=$2 g="$LAB_SHARE/g$1" ips="" peers="" k v
    for ((k = 1; k <= LAB_N; k++)); do
        ips+="${ips:+ }$(_lab_ip "$k")"
        [ "$k" = "$i" ] || peers+="${peers:+ }$(_lab_ip "$k")"
    done
    mkdir -p "$g/agent"
    {
        printf 'LAB_INDEX=%q\nLAB_N=%q\nLAB_TOPOLOGY=%q\n' "$i" "$LAB_N" "$LAB_TOPOLOGY"
        printf 'LAB_IP=%q\nLAB_PREFIXLEN=24\nLAB_IPS=%q\nLAB_PEERS=%q\n' "$(_lab_ip "$i")" "$ips" "$peers"
        if [ "$LAB_TOPOLOGY" = multi ]; then
            printf 'LAB_HOST_IP=%q\nLAB_NETDEV=eth0\n' "$LAB_NET.1"
        else
            printf 'LAB_HOST_IP=\nLAB_NETDEV=dummy0\n'
        fi
        printf 'LAB_RXE=%q\nLAB_RESULTS=%q\nLAB_SHARE=%q\nLAB_DIR=%q\nLAB_CWD=%q\n' \
            "$LAB_RXE" "$g" "$LAB_SHARE" "$LAB_DIR" "$PWD"
        printf 'LAB_LIVE=%q\n' "${LAB_LIVE:-0}"
        printf 'PATH=%q\n' "$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        for k in $LAB_PASS_ENV; do
            v=${!k-}; printf '%s=%q\n' "$k" "$v"
        done
    } > "$g/guest.env"
    printf 'source %q\n%s\n' "$LAB_DIR/guest-lib.sh" "$cmd" > "$g/cmd.sh"
}

_lab_qemu() {   # <i> <hard_timeout_s>: start guest i in the background
    local i=$1 hard=$2 smp mem net=()
    if [ "$LAB_TOPOLOGY" = multi ]; then
        smp=$LAB_MULTI_SMP; mem=$LAB_MULTI_MEM
        net=(-netdev "tap,id=n0,ifname=$(_lab_tap "$i"),script=no,downscript=no"
             -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:$(printf %02x "$i")")
    else
        smp=$LAB_LOOPBACK_SMP; mem=$LAB_LOOPBACK_MEM
    fi
    if _lab_has_disk "$i"; then
        net+=(-drive "file=$LAB_RUN/g$i.disk.img,if=none,id=d0,format=raw,cache=$LAB_DISK_CACHE,aio=threads"
              -device "virtio-blk-pci,drive=d0,serial=labdisk")
    fi
    rm -f "$LAB_RUN/g$i.mon.in" "$LAB_RUN/g$i.mon.out"
    mkfifo "$LAB_RUN/g$i.mon.in" "$LAB_RUN/g$i.mon.out"
    # QEMU opens both FIFOs read-write; drain its monitor output.
    cat "$LAB_RUN/g$i.mon.out" > "$LAB_RUN/g$i.monitor.log" 2>/dev/null < /dev/null &
    echo "$!" > "$LAB_RUN/g$i.drain.pid"
    # timeout(1) bounds the guest's life even if this shell is SIGKILLed.
    timeout -k 10 "$hard" qemu-system-x86_64 -name "lab-g$i" \
        -accel tcg,thread=multi -machine pc -cpu "$LAB_QEMU_CPU" -smp "$smp" -m "$mem" \
        -nodefaults -no-user-config -display none -no-reboot \
        -kernel "$LAB_KERNEL" -initrd "$LAB_INITRD" \
        -append "console=ttyS0 quiet loglevel=4 panic=-1 lab.share=$LAB_SHARE lab.stage2=$LAB_DIR/guest-init.sh lab.moddir=$LAB_MODDIR lab.guest=$LAB_SHARE/g$i" \
        -serial "file:$LAB_RUN/g$i.console.log" -pidfile "$LAB_RUN/g$i.qemu.pid" \
        -chardev "pipe,id=mon,path=$LAB_RUN/g$i.mon" -mon chardev=mon,mode=readline \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$LAB_SHARE,mount_tag=labshare,security_model=none,multidevs=remap" \
        "${net[@]}" \
        > "$LAB_RUN/g$i.qemu.log" 2>&1 < /dev/null &
    echo "$!" > "$LAB_RUN/g$i.pid"
}

_lab_alive() { local p; p=$(cat "$LAB_RUN/g$1.pid" 2>/dev/null) && kill -0 "$p" 2>/dev/null; }
_lab_has_disk() { [[ " $LAB_DISK_GUESTS " == *" $1 "* ]]; }

# A data disk for guest i: a sparse host file formatted ext4 on the host,
# attached as virtio-blk (/dev/vda in the guest; guest-lib's lab_disk_mount).
# Cache mode: `none` (O_DIRECT: no host page cache, the guest's flushes
# become fdatasync of the file) where the host file system takes O_DIRECT,
# else `writeback` (host page cache; flushes still honoured). Never
# `unsafe` (ignores flushes) nor `writethrough`/`directsync` (every write
# stable: a guest that forgets to flush would not be caught).
_lab_make_disk() {   # <i>
    local img="$LAB_RUN/g$1.disk.img"
    truncate -s "${LAB_DISK_MB}M" "$img" || return 1
    mkfs.ext4 -q -F -L "labdisk$1" "$img" || return 1
    if [ -z "$LAB_DISK_CACHE" ]; then
        if dd if="$img" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
            LAB_DISK_CACHE=none
        else
            LAB_DISK_CACHE=writeback
        fi
    fi
    printf 'LAB_DISK_GUESTS=%q\nLAB_DISK_CACHE=%q\n' "$LAB_DISK_GUESTS" "$LAB_DISK_CACHE" >> "$LAB_RUN/lab.env"
    _lab_log "guest $1: data disk $img (${LAB_DISK_MB} MiB, ext4, cache=$LAB_DISK_CACHE)"
}

_lab_trap_install() {
    [ "${LAB_NO_TRAP:-0}" = 1 ] && return 0
    local prev
    prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
    case "$prev" in *_lab_on_exit*) return 0 ;; esac
    _LAB_PREV_EXIT_TRAP=$prev
    trap '_lab_on_exit' EXIT
    trap '_lab_on_exit; trap - INT; kill -INT $$' INT
    trap '_lab_on_exit; trap - TERM; kill -TERM $$' TERM
}
_lab_on_exit() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    [ -n "${LAB_RUN:-}" ] && [ -f "$LAB_RUN/lab.env" ] && [ ! -e "$LAB_RUN/stopped" ] && lab_kill
    if [ -n "${_LAB_PREV_EXIT_TRAP:-}" ]; then eval "$_LAB_PREV_EXIT_TRAP"; fi
}

# lab_start <loopback|multi> <n> <cmd_1> ... <cmd_n>
#   Boots n guests (loopback: n=1) in the background, each running its
#   command (a bash script text; guest-lib.sh is sourced first), and returns
#   once every guest has rxe0 up and its agent running (status 0), or after
#   LAB_BOOT_TIMEOUT (guests killed, status 1). Sets and exports LAB_RUN (host
#   run folder) and LAB_SHARE (the read-write share, $LAB_SHARE_DIR if set,
#   else $LAB_RUN/share; mounted at the same path in the guests).
lab_start() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    local topo=$1 n=$2 i t0 now hard ready
    shift 2
    case "$topo" in loopback) [ "$n" = 1 ] || { _lab_log "loopback takes n=1"; return 2; } ;;
                    multi) [ "$n" -ge 1 ] && [ "$n" -le 40 ] || { _lab_log "bad n=$n"; return 2; } ;;
                    *) _lab_log "topology must be loopback or multi"; return 2 ;; esac
    [ $# = "$n" ] || { _lab_log "lab_start $topo $n needs $n commands, got $#"; return 2; }
    [ "$(id -u)" = 0 ] || { _lab_log "must run as root"; return 1; }
    lab_setup || return 1
    if [ -n "${LAB_RUN:-}" ] && [ -f "$LAB_RUN/lab.env" ] && [ ! -e "$LAB_RUN/stopped" ]; then
        _lab_log "a lab is already running in this shell ($LAB_RUN): lab_stop it first"; return 1
    fi
    mkdir -p "$LAB_CACHE/runs"
    # keep the newest LAB_KEEP_RUNS run folders (older ones only once stopped
    # or a day old: another lab may be using them)
    local old
    for old in $(ls -1dt "$LAB_CACHE"/runs/*/ 2>/dev/null | tail -n +"$((LAB_KEEP_RUNS + 1))"); do
        if [ -e "$old/stopped" ] || [ -n "$(find "$old" -maxdepth 0 -mmin +1440)" ]; then rm -rf "$old"; fi
    done
    LAB_RUN=$(mktemp -d "$LAB_CACHE/runs/$(date +%Y%m%d-%H%M%S)-$topo-XXXX")
    LAB_SHARE=${LAB_SHARE_DIR:-$LAB_RUN/share}
    mkdir -p "$LAB_SHARE"; rm -rf "$LAB_SHARE/stop" "$LAB_SHARE"/g[0-9]*   # a reused LAB_SHARE_DIR
    case "$LAB_RUN$LAB_SHARE$LAB_DIR$LAB_MODDIR" in *[[:space:]]*)
        _lab_log "paths with spaces are not supported"; return 1 ;; esac
    export LAB_RUN LAB_SHARE
    LAB_TOPOLOGY=$topo LAB_N=$n
    : > "$LAB_RUN/undo"
    {
        printf 'LAB_TOPOLOGY=%q\nLAB_N=%q\nLAB_SHARE=%q\nLAB_BRIDGE=%q\nLAB_NET=%q\n' \
            "$topo" "$n" "$LAB_SHARE" "$LAB_BRIDGE" "$LAB_NET"
        printf 'LAB_GUEST_KERNEL=%q\nLAB_KVER=%q\nLAB_KERNEL=%q\nLAB_INITRD=%q\nLAB_MODDIR=%q\n' \
            "$LAB_GUEST_KERNEL" "$LAB_KVER" "$LAB_KERNEL" "$LAB_INITRD" "$LAB_MODDIR"
    } > "$LAB_RUN/lab.env"
    _lab_trap_install
    if [ "$topo" = multi ]; then
        # One multi lab per bridge name on this host (its taps and addresses
        # are fixed), whatever the cache: a host-wide lock file.
        local lock=/run/lock/ringraft-lab-$LAB_BRIDGE.lock
        [ -d /run/lock ] && [ -w /run/lock ] || lock=/tmp/ringraft-lab-$LAB_BRIDGE.lock
        exec {_LAB_LOCK_FD}>> "$lock"
        if ! flock -n "$_LAB_LOCK_FD"; then
            _lab_log "waiting up to ${LAB_LOCK_WAIT:-600}s for the multi lab of: $(tail -n1 "$lock")"
            if ! flock -w "${LAB_LOCK_WAIT:-600}" "$_LAB_LOCK_FD"; then
                _lab_log "another multi lab still holds $lock"
                exec {_LAB_LOCK_FD}>&-; _LAB_LOCK_FD=; touch "$LAB_RUN/stopped"; return 1
            fi
        fi
        echo "pid $$ run $LAB_RUN since $(date +%T)" > "$lock"
        _lab_net_up "$n" || { _lab_log "network setup failed"; lab_kill; return 1; }
    fi
    for ((i = 1; i <= n; i++)); do
        if _lab_has_disk "$i"; then _lab_make_disk "$i" || { lab_kill; return 1; }; fi
    done
    hard=$((LAB_BOOT_TIMEOUT + ${LAB_HARD_TIMEOUT:-$((LAB_TIMEOUT + 120))}))
    t0=$(date +%s.%N)
    for ((i = 1; i <= n; i++)); do
        _lab_write_guest "$i" "${!i}"
        _lab_qemu "$i" "$hard"
    done
    _lab_log "started $n $topo guest(s) in $LAB_RUN, kernel $LAB_KVER"
    _lab_wait_ready "$t0" $(seq 1 "$n") || { lab_kill; return 1; }
}

# _lab_wait_ready <t0> <i...>: until guests i... are ready (0), or one died
# or LAB_BOOT_TIMEOUT passed since t0 (1, consoles printed).
_lab_wait_ready() {
    local t0=$1 i ready now; shift
    while :; do
        ready=0
        for i in "$@"; do
            if [ -f "$LAB_SHARE/g$i/ready" ]; then
                if [ ! -f "$LAB_RUN/g$i.boot" ]; then
                    now=$(date +%s.%N)
                    awk -v a="$t0" -v b="$now" 'BEGIN{printf "%.1f\n", b-a}' > "$LAB_RUN/g$i.boot"
                    _lab_log "guest $i ready after $(cat "$LAB_RUN/g$i.boot")s"
                fi
                ready=$((ready + 1))
            elif ! _lab_alive "$i"; then
                _lab_log "guest $i died while booting"; _lab_dump_console "$i"; return 1
            fi
        done
        [ "$ready" = "$#" ] && return 0
        if awk -v a="$t0" -v b="$(date +%s.%N)" -v t="$LAB_BOOT_TIMEOUT" 'BEGIN{exit !(b-a > t)}'; then
            _lab_log "guests not ready after ${LAB_BOOT_TIMEOUT}s"
            for i in "$@"; do [ -f "$LAB_SHARE/g$i/ready" ] || _lab_dump_console "$i"; done
            return 1
        fi
        sleep 0.2
    done
}

# lab_crash <i>: power guest i off at once, as a machine crash would: QEMU
# quits through its monitor (HMP `quit`) without telling the guest, so the
# guest's RAM (its page cache, dirty pages not yet written back) is gone;
# what reached its virtual disk stays in the host file. SIGKILL if QEMU is
# still there after 10 s. The guest's console log and share folder are kept
# (renamed *.crash<k>) for lab_boot.
lab_crash() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    local i=$1 k end p
    _lab_load || return 1
    _lab_alive "$i" || { _lab_log "lab_crash $i: guest not running"; return 1; }
    lab_hmp "$i" quit
    end=$((SECONDS + 10))
    while _lab_alive "$i" && [ "$SECONDS" -lt "$end" ]; do sleep 0.05; done
    if _lab_alive "$i"; then
        _lab_log "lab_crash $i: QEMU still up after quit: SIGKILL"
        p=$(cat "$LAB_RUN/g$i.qemu.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null
        p=$(cat "$LAB_RUN/g$i.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null
    fi
    p=$(cat "$LAB_RUN/g$i.drain.pid" 2>/dev/null) && kill "$p" 2>/dev/null
    k=1; while [ -e "$LAB_RUN/g$i.console.log.crash$k" ]; do k=$((k + 1)); done
    mv "$LAB_RUN/g$i.console.log" "$LAB_RUN/g$i.console.log.crash$k" 2>/dev/null
    mv "$LAB_RUN/g$i.boot" "$LAB_RUN/g$i.boot.crash$k" 2>/dev/null
    mv "$LAB_SHARE/g$i" "$LAB_SHARE/crash$k-g$i"
    _lab_log "crashed guest $i (QEMU quit; share folder kept as $LAB_SHARE/crash$k-g$i)"
}

# lab_boot <i> <cmd>: boot guest i again (after lab_crash) in the running
# lab, same network place, same data disk, with a new command; returns once
# it is ready (0) or it failed to boot (1).
lab_boot() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    local i=$1 cmd=$2 hard t0
    _lab_load || return 1                   # the run's kernel and disks come from lab.env
    _lab_alive "$i" && { _lab_log "lab_boot $i: guest is running"; return 1; }
    hard=$((LAB_BOOT_TIMEOUT + ${LAB_HARD_TIMEOUT:-$((LAB_TIMEOUT + 120))}))
    t0=$(date +%s.%N)
    _lab_write_guest "$i" "$cmd"
    _lab_qemu "$i" "$hard"
    _lab_log "booting guest $i again (kernel $LAB_KVER)"
    _lab_wait_ready "$t0" "$i"
}

_lab_dump_console() {
    _lab_log "--- guest $1 console (tail) ---"
    tail -n 30 "$LAB_RUN/g$1.console.log" >&2 2>/dev/null
    tail -n 5 "$LAB_RUN/g$1.qemu.log" >&2 2>/dev/null
    cat "$LAB_SHARE/g$1/boot-error.log" >&2 2>/dev/null
}

# lab_wait [timeout_s]: wait until every guest has run its command and
# powered off (default LAB_TIMEOUT). On timeout the guests are killed and
# count as failed with status 124 (125: guest died without a status).
# Prints each guest's output (unless LAB_QUIET=1; it stays in
# $LAB_SHARE/g<i>/output.log), cleans up, and returns 0 if every command
# succeeded, else the first non-zero status. LAB_RCS[i] holds each status.
lab_wait() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    local timeout=${1:-$LAB_TIMEOUT} end i alive rc=0 r
    _lab_load || return 1
    end=$((SECONDS + timeout))
    while :; do
        alive=0
        for ((i = 1; i <= LAB_N; i++)); do _lab_alive "$i" && alive=$((alive + 1)); done
        [ "$alive" = 0 ] && break
        if [ "$SECONDS" -ge "$end" ]; then
            _lab_log "TIMEOUT: $alive guest(s) still running after ${timeout}s: killing them"
            # keep what the commands printed so far (the agent may still answer)
            local pids=()
            for ((i = 1; i <= LAB_N; i++)); do
                if _lab_alive "$i" && [ -f "$LAB_SHARE/g$i/ready" ]; then
                    lab_exec -t 5 "$i" 'cp /tmp/lab/output.log "$LAB_RESULTS/output.log"' > /dev/null 2>&1 &
                    pids+=("$!")
                fi
            done
            [ ${#pids[@]} = 0 ] || wait "${pids[@]}"   # not a plain wait: QEMU is our child too
            break
        fi
        sleep 0.3
    done
    _lab_kill_qemus
    LAB_RCS=()
    for ((i = 1; i <= LAB_N; i++)); do
        if [ -f "$LAB_SHARE/g$i/rc" ]; then r=$(cat "$LAB_SHARE/g$i/rc")
        elif [ -f "$LAB_SHARE/g$i/ready" ] && [ "$alive" != 0 ]; then r=124
        else r=125; fi
        LAB_RCS[$i]=$r
        if [ "$LAB_QUIET" != 1 ]; then
            echo "===== guest $i ($(_lab_ip "$i")) exit status $r ====="
            cat "$LAB_SHARE/g$i/output.log" 2>/dev/null
        fi
        [ "$r" = 125 ] && _lab_dump_console "$i"
        [ "$r" != 0 ] && [ "$rc" = 0 ] && rc=$r
    done
    _lab_cleanup
    return "$rc"
}

_lab_kill_qemus() {
    local i j p
    for ((i = 1; i <= LAB_N; i++)); do
        p=$(cat "$LAB_RUN/g$i.pid" 2>/dev/null) && kill -TERM "$p" 2>/dev/null
    done
    for ((i = 1; i <= 50; i++)); do
        p=0
        for ((j = 1; j <= LAB_N; j++)); do _lab_alive "$j" && p=1; done
        [ "$p" = 0 ] && break
        sleep 0.1
    done
    for ((i = 1; i <= LAB_N; i++)); do
        if _lab_alive "$i"; then       # QEMU ignored SIGTERM: kill it and its timeout(1)
            p=$(cat "$LAB_RUN/g$i.qemu.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null
            p=$(cat "$LAB_RUN/g$i.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null
        fi
        p=$(cat "$LAB_RUN/g$i.drain.pid" 2>/dev/null) && kill "$p" 2>/dev/null
    done
    return 0
}
_lab_cleanup() {
    _lab_net_down
    touch "$LAB_RUN/stopped"
    if [ -n "${_LAB_LOCK_FD:-}" ]; then exec {_LAB_LOCK_FD}>&-; _LAB_LOCK_FD=; fi
    return 0
}

# lab_stop [timeout_s]: tell lab_idle guest commands to finish ($LAB_SHARE/stop),
# then lab_wait (default 60 s).
lab_stop() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    touch "$LAB_SHARE/stop"
    lab_wait "${1:-60}"
}

# lab_kill: kill the guests at once and clean up (used by the trap).
lab_kill() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    _lab_kill_qemus
    _lab_cleanup
}

# lab_run_loopback <cmd...>: one guest with rxe0 on dummy0; runs the command
# (words joined by spaces, like ssh), prints its output, returns its status.
lab_run_loopback() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    lab_start loopback 1 "$*" || return 1
    lab_wait "$LAB_TIMEOUT"
}

# lab_run_multi <n> <cmd_1> ... <cmd_n>: n guests on the host bridge, the
# commands run concurrently; returns 0 if all succeeded (see lab_wait).
lab_run_multi() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    lab_start multi "$@" || return 1
    lab_wait "$LAB_TIMEOUT"
}

# lab_exec [-t timeout_s] <i> <cmd...>: run a command in running guest i
# through its agent (the guest's own command keeps running); prints its
# output, returns its status (124 on timeout, 125 if the guest is gone).
# Several lab_exec may run at once (e.g. one in the background).
lab_exec() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    local t=120 i id d rc end
    if [ "${1:-}" = -t ]; then t=$2; shift 2; fi
    i=$1; shift
    _lab_load || return 1
    d="$LAB_SHARE/g$i/agent"
    [ -d "$d" ] || { _lab_log "no guest $i"; return 125; }
    id="$(date +%s%N)-$BASHPID-$RANDOM"
    printf '#timeout %s\nsource %q\n%s\n' "$t" "$LAB_DIR/guest-lib.sh" "$*" > "$d/$id.tmp"
    mv "$d/$id.tmp" "$d/$id.cmd"
    end=$((SECONDS + t + 20))
    while [ ! -f "$d/$id.rc" ]; do
        if ! _lab_alive "$i" || [ "$SECONDS" -ge "$end" ]; then
            _lab_log "lab_exec $i: no answer (guest gone or agent stuck)"; rm -f "$d/$id.cmd"; return 125
        fi
        sleep 0.1
    done
    rc=$(cat "$d/$id.rc")
    cat "$d/$id.out" 2>/dev/null
    rm -f "$d/$id.rc" "$d/$id.out"
    return "$rc"
}

# lab_hmp <i> <monitor command>: send an HMP command to guest i's QEMU
# (e.g. "set_link n0 off"); its answer lands in $LAB_RUN/g<i>.monitor.log.
lab_hmp() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    _lab_alive "$1" || return 1
    timeout 5 bash -c 'printf "%s\n" "$2" > "$1"' _ "$LAB_RUN/g$1.mon.in" "$2"
}

# ------------------------------------------------------------ faults
# Pair partition: lab_cut <i> <j> / lab_heal <i> <j>. Method LAB_CUT_METHOD:
#   bridge: host ebtables rules drop frames between tap i and tap j (both
#           directions, ARP included); both keep talking to others and the host.
#   guest:  iptables DROP inside both guests (through the agent).
# Scope LAB_CUT_SCOPE: all, or roce (only UDP 4791: TCP/ping still pass).
_lab_cut_rules() {   # <i> <j> -> ebtables rule specs (without -A/-D)
    local a b m=""
    [ "$LAB_CUT_SCOPE" = roce ] && m="-p IPv4 --ip-proto udp --ip-dport 4791 "
    a=$(_lab_tap "$1"); b=$(_lab_tap "$2")
    echo "FORWARD -i $a -o $b ${m}-j DROP"
    echo "FORWARD -i $b -o $a ${m}-j DROP"
}
_lab_guest_rules() {  # <peer ip> <A|D> -> iptables commands
    local m=""
    [ "$LAB_CUT_SCOPE" = roce ] && m="-p udp --dport 4791 "
    echo "iptables -$2 INPUT -s $1 ${m}-j DROP && iptables -$2 OUTPUT -d $1 ${m}-j DROP"
}
# _lab_pair_rules <A|D> <i> <j> <log line>: adds (A, a cut) or deletes (D, a
# heal) the rules between guests i and j; logs <log line> if every rule took.
_lab_pair_rules() {
    local op=$1 i=$2 j=$3 r rc=0
    if [ "$LAB_CUT_METHOD" = guest ]; then
        lab_exec -t 20 "$i" "$(_lab_guest_rules "$(_lab_ip "$j")" "$op")" || rc=1
        lab_exec -t 20 "$j" "$(_lab_guest_rules "$(_lab_ip "$i")" "$op")" || rc=1
    else
        # An ebtables rule added is listed in $LAB_RUN/undo (what the cleanup
        # deletes) until it is deleted.
        while read -r r; do
            # shellcheck disable=SC2086
            ebtables -"$op" $r || rc=1
            if [ "$op" = A ]; then
                ( flock 7; echo "ebtables -D $r" >> "$LAB_RUN/undo" ) 7>> "$LAB_RUN/undo.lock"
            else
                ( flock 7; grep -vxF "ebtables -D $r" "$LAB_RUN/undo" > "$LAB_RUN/undo.new"
                  mv "$LAB_RUN/undo.new" "$LAB_RUN/undo" ) 7>> "$LAB_RUN/undo.lock"
            fi
        done < <(_lab_cut_rules "$i" "$j")
    fi
    [ "$rc" = 0 ] && _lab_log "$4"
    return "$rc"
}
lab_cut() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    [ "$LAB_TOPOLOGY" = multi ] || { _lab_log "lab_cut needs the multi topology"; return 1; }
    _lab_pair_rules A "$1" "$2" "cut $1 <-> $2 ($LAB_CUT_METHOD, $LAB_CUT_SCOPE)"
}
lab_heal() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    _lab_pair_rules D "$1" "$2" "healed $1 <-> $2"
}

# Isolation of one guest from everyone (guests and host): lab_isolate <i> /
# lab_rejoin <i>. Method LAB_ISOLATE_METHOD:
#   tap:  host `ip link set <tap> down`: frames are silently lost, the guest
#         keeps its carrier (rxe port stays ACTIVE; QPs time out / retry).
#   link: QEMU `set_link n0 off`: the guest sees carrier loss, rxe port goes
#         DOWN (posted work fails at once) and ACTIVE again on rejoin.
lab_isolate() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    [ "$LAB_TOPOLOGY" = multi ] || { _lab_log "lab_isolate needs the multi topology"; return 1; }
    if [ "$LAB_ISOLATE_METHOD" = link ]; then lab_hmp "$1" "set_link n0 off" || return 1
    else ip link set "$(_lab_tap "$1")" down || return 1; fi
    _lab_log "isolated guest $1 ($LAB_ISOLATE_METHOD)"
}
lab_rejoin() {
    local -; set +e +u +o pipefail          # callers may run with set -euo pipefail
    _lab_load || return 1
    if [ "$LAB_ISOLATE_METHOD" = link ]; then lab_hmp "$1" "set_link n0 on" || return 1
    else ip link set "$(_lab_tap "$1")" up || return 1; fi
    _lab_log "rejoined guest $1"
}
