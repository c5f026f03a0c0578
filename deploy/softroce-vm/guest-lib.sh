# shellcheck shell=bash
# Helpers for commands run inside lab guests (sourced before every guest
# command and every agent command; plain bash, no state of its own).
# Variables set by the lab: see README.md ("Environment of guest commands").

# lab_idle [max_seconds]: keep the guest up until the host calls lab_stop
# (which creates $LAB_SHARE/stop) or max_seconds (default 3600) pass.
lab_idle() {
    local end=$((SECONDS + ${1:-3600})) tick f
    f=$(mktemp -u /tmp/lab-idle.XXXXXX); mkfifo "$f"; exec {tick}<> "$f"; rm -f "$f"
    while [ ! -e "$LAB_SHARE/stop" ] && [ "$SECONDS" -lt "$end" ]; do
        read -t 1 -u "$tick"              # sleeps without a fork (cheap under TCG)
    done
    exec {tick}<&-
    return 0
}

# lab_retry <deadline_seconds> <pattern> <cmd...>: run cmd; while it fails
# AND its output matches the extended regex <pattern> (e.g. "the server is not
# listening yet"), try again until the deadline. Output of the last try is
# printed; its status is returned.
lab_retry() {
    local deadline=$((SECONDS + $1)) pat=$2 out rc
    shift 2
    out=$(mktemp /tmp/lab-retry.XXXXXX)
    while :; do
        "$@" > "$out" 2>&1
        rc=$?
        if [ "$rc" = 0 ] || ! grep -Eq "$pat" "$out" || [ "$SECONDS" -ge "$deadline" ]; then
            cat "$out"; rm -f "$out"; return "$rc"
        fi
        sleep 0.5
    done
}

# Perftest (ib_*_lat/_bw) wrappers on the lab's rxe device and GID index.
# perftest sets retry_cnt=7 = retry forever on rxe: always give a timeout.
# pt_server <timeout_s> <tool> [args...]
pt_server() {
    local t=$1 tool=$2; shift 2
    timeout -k 5 "$t" "$tool" -d "$LAB_RXE" -x "$LAB_GID_INDEX" -F "$@"
}
# pt_client <timeout_s> <server_ip> <tool> [args...]   (retries while the
# server is not listening yet, within the same timeout)
pt_client() {
    local t=$1 ip=$2 tool=$3; shift 3
    local end=$((SECONDS + t))
    lab_retry "$t" "Couldn't connect|Unable to init the socket connection|Connection refused" \
        _lab_timeout_until "$end" "$tool" -d "$LAB_RXE" -x "$LAB_GID_INDEX" -F "$@" "$ip"
}
# _lab_timeout_until <end_SECONDS> cmd...: timeout with an absolute deadline.
_lab_timeout_until() {
    local left=$(($1 - SECONDS)); shift
    [ "$left" -gt 0 ] || left=1
    timeout -k 5 "$left" "$@"
}

# ibv_rc_pingpong wrappers (also retry_cnt=7: bounded only by the timeout).
# rc_server <timeout_s> [args...] ; rc_client <timeout_s> <server_ip> [args...]
rc_server() {
    local t=$1; shift
    timeout -k 5 "$t" ibv_rc_pingpong -d "$LAB_RXE" -g "$LAB_GID_INDEX" "$@"
}
rc_client() {
    local t=$1 ip=$2; shift 2
    local end=$((SECONDS + t))
    lab_retry "$t" "Couldn't connect|Connection refused" \
        _lab_timeout_until "$end" ibv_rc_pingpong -d "$LAB_RXE" -g "$LAB_GID_INDEX" "$@" "$ip"
}

# lab_peer_ip <index>: IP of guest <index> (1-based).
lab_peer_ip() { local a=($LAB_IPS); echo "${a[$(($1 - 1))]}"; }

# pt_pair <timeout_s> <tool> [args...]: server and client of one perftest
# tool on this guest's own rxe device (loopback); prints the client's
# output (and the server's on failure), returns 0 if both succeeded.
pt_pair() {
    local t=$1 tool=$2 srv rc=0; shift 2
    srv=$(mktemp /tmp/lab-pt-server.XXXXXX)
    pt_server "$t" "$tool" "$@" > "$srv" 2>&1 &
    local pid=$!
    pt_client "$t" "$LAB_IP" "$tool" "$@" || rc=$?
    local src=0
    wait "$pid" || src=$?
    if [ "$src" != 0 ]; then
        [ "$rc" = 0 ] && rc=$src
        echo "--- $tool server failed (status $src):"; cat "$srv"
    fi
    rm -f "$srv"
    return "$rc"
}

# lab_check <name> <cmd...>: run one named check; prints a header and the
# command's output, appends "PASS|FAIL <name> <seconds>s" to
# $LAB_RESULTS/checks (run-tests.sh puts those lines in its summary) and
# returns the command's status.
lab_check() {
    local name=$1 t0=$SECONDS rc=0; shift
    echo "----- check $name (guest $LAB_INDEX)"
    "$@" || rc=$?
    if [ "$rc" = 0 ]; then echo "PASS $name $((SECONDS - t0))s" >> "$LAB_RESULTS/checks"
    else echo "FAIL $name $((SECONDS - t0))s (status $rc)" >> "$LAB_RESULTS/checks"; fi
    echo "----- check $name: $([ "$rc" = 0 ] && echo PASS || echo "FAIL ($rc)")"
    return "$rc"
}

# lab_devinfo_check: rxe port PORT_ACTIVE and an atomic_cap other than NONE.
lab_devinfo_check() {
    local out
    out=$(ibv_devinfo -v -d "$LAB_RXE") || return 1
    grep -E 'hca_id|transport|atomic_cap|state:|link_layer|GID\[' <<< "$out"
    grep -q 'state:[[:space:]]*PORT_ACTIVE' <<< "$out" || { echo "not PORT_ACTIVE"; return 1; }
    grep -Eq 'atomic_cap:[[:space:]]*ATOMIC_(HCA|GLOB)' <<< "$out" || { echo "no atomic_cap"; return 1; }
}

# lab_ext4_loop <dir> [size_mib=256]: an ext4 file system on a loop device
# whose backing file lives on the guest's tmpfs, mounted at <dir>. Files
# there are page-cache files of a disk file system, as on a real host (on
# kernels >= 6.5 a shared mapping of one cannot be registered for remote
# write). The modules come from the unpacked kernel (built in or loadable).
lab_ext4_loop() {
    local dir=$1 mb=${2:-256} img
    img=/var/tmp/lab-ext4$(printf %s "$dir" | tr / _).img
    modprobe -a loop ext4 || return 1
    mkdir -p "$dir" /var/tmp || return 1
    truncate -s "${mb}M" "$img" && mkfs.ext4 -q -F "$img" && mount -o loop "$img" "$dir" || return 1
    echo "$dir: $(findmnt -n -o SOURCE,FSTYPE,OPTIONS "$dir")"
}

# lab_disk_mount <dir>: mount the guest's virtio data disk (/dev/vda, formatted
# ext4 by the host; lib.sh LAB_DISK_GUESTS) at <dir>. After a crash the mount
# replays the ext4 journal.
lab_disk_mount() {
    local dir=$1 dev=/dev/vda tick f n=0
    modprobe -a virtio_blk ext4 || return 1
    f=$(mktemp -u /tmp/lab-disk.XXXXXX); mkfifo "$f"; exec {tick}<> "$f"; rm -f "$f"
    while [ ! -b "$dev" ] && [ "$n" -lt 100 ]; do read -t 0.1 -u "$tick"; n=$((n + 1)); done
    exec {tick}<&-
    [ -b "$dev" ] || { echo "no $dev"; return 1; }
    mkdir -p "$dir" && mount -t ext4 "$dev" "$dir" || return 1
    echo "$dir: $(findmnt -n -o SOURCE,FSTYPE,OPTIONS "$dir")"
}

# lab_watch <pid> <name> <log>: in the background, once process <pid> is
# gone, copy <log> to $LAB_RESULTS/<name>.log and create
# $LAB_RESULTS/<name>.exited, so that the host sees at once that a daemon
# died (and why) without asking the agent.
lab_watch() {
    local pid=$1 name=$2 log=$3
    rm -f "$LAB_RESULTS/$name.exited"
    (
        f=$(mktemp -u /tmp/lab-watch.XXXXXX); mkfifo "$f"; exec {tick}<> "$f"; rm -f "$f"
        while kill -0 "$pid" 2> /dev/null; do read -t 0.5 -u "$tick"; done
        cp "$log" "$LAB_RESULTS/$name.log" 2> /dev/null
        date +%s > "$LAB_RESULTS/$name.exited"
    ) > /dev/null 2>&1 < /dev/null &
}
