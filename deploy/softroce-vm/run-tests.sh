#!/usr/bin/env bash
# Soft-RoCE VM lab: the test entry point (CI calls this as root).
#
#   deploy/softroce-vm/run-tests.sh              # all tests in TESTS order
#   deploy/softroce-vm/run-tests.sh multi_cut    # only the named test(s)
#
# Runs setup.sh, then each test function; prints a summary; exits non-zero if
# any test failed. To add a test: write a function test_<name> that returns
# 0 on success (typically one lab_run_loopback / lab_run_multi call, or a
# lab_start ... lab_stop session) and add <name> to TESTS. Inside guest
# commands, `lab_check <name> <cmd...>` records sub-results that end up in
# the summary too. Environment: see lib.sh / README.md (LAB_TIMEOUT, ...).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

: "${LAB_TIMEOUT:=300}"     # per lab session (boot excluded)
PROBE_T=${PROBE_T:-12}     # seconds a bounded probe may take

TESTS=(loopback_verbs rdma_conformance_loopback multi_perftest rdma_conformance_multi multi_cut multi3_cut multi3_stale_leader
       multi3_stale_leader_current multi3_serve_current multi3_crash_fsync_current)

REPO=$(cd "$HERE/../.." && pwd)
# The project's binaries with the rdma backend, built on the host and run
# in the guests in place.
RR_TARGET=${RR_TARGET:-$REPO/target}
RR_BIN=$RR_TARGET/release
_build_rdma_bins() {
    [ -n "${_RDMA_BUILT:-}" ] && return 0
    echo "building the rdma binaries (cargo build --release --features rdma,tools)"
    (cd "$REPO" && CARGO_TARGET_DIR="$RR_TARGET" cargo build --release --locked \
        -p ringraft-transport --features rdma,tools --bins) || return 1
    _RDMA_BUILT=1
}
# The Jepsen runner (its softroce substrate drives the stale-leader
# scenario) and the daemon it runs in the guests.
_build_jepsen() {
    [ -n "${_JEPSEN_BUILT:-}" ] && return 0
    _build_cli || return 1
    echo "building ringraft-jepsen (cargo build --release -p ringraft-jepsen)"
    (cd "$REPO" && CARGO_TARGET_DIR="$RR_TARGET" cargo build --release --locked \
        -p ringraft-jepsen --bin ringraft-jepsen) || return 1
    _JEPSEN_BUILT=1
}

# --------------------------------------------------------------- tests

# (a) one guest, rxe0 on dummy0: device state and perftest on the same device.
test_loopback_verbs() {
    lab_run_loopback 'bash "$LAB_DIR/checks-loopback.sh"'
}

# (a2) the transport conformance suite with the rdma backend, both sides in
# one process on the one rxe device of a loopback guest.
test_rdma_conformance_loopback() {
    _build_rdma_bins || return 1
    lab_run_loopback "'$RR_BIN/ringraft-conformance' --backend rdma --device \"\$LAB_RXE\" local --listen \"\$LAB_IP:0\""
}

# (b0) the same suite across two guests: side B serves in guest 1, side A
# runs the checks from guest 2 over the host bridge.
test_rdma_conformance_multi() {
    _build_rdma_bins || return 1
    lab_run_multi 2 \
        "'$RR_BIN/ringraft-conformance' --backend rdma --device \"\$LAB_RXE\" serve --control \"\$LAB_IP:7470\" --advertise \"\$LAB_IP\"" \
        "'$RR_BIN/ringraft-conformance' --backend rdma --device \"\$LAB_RXE\" remote --control \"\$(lab_peer_ip 1):7470\""
}

# (b1) two guests on the host bridge: perftest across guests, run
# concurrently (server in guest 1, client in guest 2).
test_multi_perftest() {
    lab_run_multi 2 '
        rc=0
        lab_check write_lat_server pt_server 90 ib_write_lat           || rc=1
        lab_check write_bw_server  pt_server 90 ib_write_bw -n 300   || rc=1
        exit $rc' '
        rc=0
        lab_check host_reachable busybox ping -c1 -W5 "$LAB_HOST_IP" || rc=1
        lab_check write_lat_client pt_client 90 "$(lab_peer_ip 1)" ib_write_lat         || rc=1
        lab_check write_bw_client  pt_client 90 "$(lab_peer_ip 1)" ib_write_bw -n 300 || rc=1
        exit $rc'
}

# (b2) link cutting while the guests run: a bounded-time probe (ping over
# eth0 + ibv_rc_pingpong under a timeout, since rxe retries forever at
# retry_cnt=7) succeeds, fails under lab_cut 1 2, succeeds after lab_heal;
# same with only RoCE cut inside the guests (ping passes, verbs fail); and
# lab_isolate/lab_rejoin seen from the host.
_probe_ping() {   # <from> <to>
    lab_exec -t 10 "$1" "busybox ping -c1 -W3 \$(lab_peer_ip $2)" > /dev/null
}
_host_ping() {    # <guest>: from the host over the bridge
    busybox ping -c1 -W3 "$(_lab_ip "$1")" > /dev/null
}
_probe_rc() {     # <server guest> <client guest>: ibv_rc_pingpong, bounded
    local out pid rc=0
    out=$(mktemp)
    lab_exec -t $((PROBE_T + 10)) "$1" "rc_server $PROBE_T -n 5" > "$out" 2>&1 &
    pid=$!
    lab_exec -t $((PROBE_T + 10)) "$2" "rc_client $PROBE_T \$(lab_peer_ip $1) -n 5" >> "$out" 2>&1 || rc=$?
    wait "$pid" || { [ "$rc" = 0 ] && rc=1; }
    [ "$rc" = 0 ] || sed 's/^/    | /' "$out" | tail -n 6
    rm -f "$out"
    return "$rc"
}
_expect() {       # <ok|fail> <label> <cmd...>
    local want=$1 label=$2 t0=$SECONDS rc=0 res; shift 2
    "$@" || rc=$?
    if { [ "$want" = ok ] && [ "$rc" = 0 ]; } || { [ "$want" = fail ] && [ "$rc" != 0 ]; }; then
        res=PASS; else res=FAIL; _CUT_FAILED=1; fi
    printf '  %s  %-44s (expected %s, status %s, %ss)\n' "$res" "$label" "$want" "$rc" "$((SECONDS - t0))"
    _sub "$res" "$label" "$((SECONDS - t0))"
}
test_multi_cut() {
    _CUT_FAILED=0
    lab_start multi 2 lab_idle lab_idle || return 1
    _expect ok   "ping 2->1 before cut"                _probe_ping 2 1
    _expect ok   "rc_pingpong 1<-2 before cut"         _probe_rc 1 2
    lab_cut 1 2 || _CUT_FAILED=1
    _expect fail "ping 2->1 while cut (bridge)"        _probe_ping 2 1
    _expect fail "rc_pingpong 1<-2 while cut (bridge)" _probe_rc 1 2
    _expect ok   "host reaches guest 1 while cut"      _host_ping 1
    lab_heal 1 2 || _CUT_FAILED=1
    _expect ok   "ping 2->1 after heal"                _probe_ping 2 1
    _expect ok   "rc_pingpong 1<-2 after heal"         _probe_rc 1 2
    LAB_CUT_METHOD=guest LAB_CUT_SCOPE=roce lab_cut 1 2 || _CUT_FAILED=1
    _expect ok   "ping 2->1 while RoCE-only cut"       _probe_ping 2 1
    _expect fail "rc_pingpong while RoCE-only cut"     _probe_rc 1 2
    LAB_CUT_METHOD=guest LAB_CUT_SCOPE=roce lab_heal 1 2 || _CUT_FAILED=1
    _expect ok   "rc_pingpong after RoCE-only heal"    _probe_rc 1 2
    lab_isolate 2 || _CUT_FAILED=1
    _expect fail "host ping guest 2 while isolated"    _host_ping 2
    _expect fail "ping 1->2 while isolated"            _probe_ping 1 2
    lab_rejoin 2 || _CUT_FAILED=1
    _expect ok   "ping 1->2 after rejoin"              _probe_ping 1 2
    lab_stop 60 > /dev/null || _CUT_FAILED=1
    return "$_CUT_FAILED"
}

# (b3) three guests: partition one pair while both keep talking to the
# third (verbs included), and isolation with carrier loss (rxe port DOWN).
_port_state() {   # <guest> <PORT_ACTIVE|PORT_DOWN>
    lab_exec -t 20 "$1" "ibv_devinfo -d \$LAB_RXE | grep -q 'state:[[:space:]]*$2'"
}
test_multi3_cut() {
    _CUT_FAILED=0
    lab_start multi 3 lab_idle lab_idle lab_idle || return 1
    lab_cut 1 2 || _CUT_FAILED=1
    _expect fail "ping 1->2 while 1-2 cut"             _probe_ping 1 2
    _expect ok   "ping 1->3 while 1-2 cut"             _probe_ping 1 3
    _expect ok   "ping 2->3 while 1-2 cut"             _probe_ping 2 3
    _expect ok   "rc_pingpong 1<-3 while 1-2 cut"      _probe_rc 1 3
    _expect ok   "rc_pingpong 2<-3 while 1-2 cut"      _probe_rc 2 3
    lab_heal 1 2 || _CUT_FAILED=1
    _expect ok   "rc_pingpong 1<-2 after heal"         _probe_rc 1 2
    LAB_ISOLATE_METHOD=link lab_isolate 3 || _CUT_FAILED=1
    _expect ok   "guest 3 rxe port DOWN (link off)"    _port_state 3 PORT_DOWN
    _expect fail "ping 1->3 while 3 isolated"          _probe_ping 1 3
    LAB_ISOLATE_METHOD=link lab_rejoin 3 || _CUT_FAILED=1
    sleep 2
    _expect ok   "guest 3 rxe port ACTIVE (link on)"   _port_state 3 PORT_ACTIVE
    _expect ok   "ping 1->3 after rejoin"              _probe_ping 1 3
    lab_stop 60 > /dev/null || _CUT_FAILED=1
    return "$_CUT_FAILED"
}

# (c) the stale leader on real verbs: faults.rs's
# a_stale_leader_writes_nothing_valid_and_steps_down with one
# `ringraft serve --fabric rdma` per guest, run by the Jepsen runner's
# softroce substrate with its `freeze` nemesis (jepsen/src/nemesis.rs):
#   1. a leader is elected and clients append (2 clients, the whole run);
#   2. the nemesis cuts the leader off from the other guests (lab.sh cut),
#      sends it 8 appends at once, and a watcher next to the daemon in its
#      guest SIGSTOPs it 100 ms after they arrived (its in-flight gauge):
#      its WRITEs now sit in rxe's send queue being retransmitted by the
#      kernel, and the process cannot give up on them. The stop must come
#      before the leader's own reply timeout (one heartbeat: openraft's
#      per-RPC timeout) tears the queue pairs down; a stop sent from the
#      host through the guest agent came 0.3-0.5 s after the cut, too late,
#      and the watcher's came 1.1 s after it (2026-12-04, this host), past a
#      1 s heartbeat: the scenario runs with a 3 s heartbeat
#      (STALE_HEARTBEAT_MS) and 6-9 s election timeouts;
#   3. the other two elect a leader, which takes their fences (their rkeys
#      rotate), and commits the clients' appends;
#   4. heal: at its next retransmission timeout rxe in the stopped guest
#      resends the old WRITEs and they reach the followers with revoked
#      rkeys: their NICs must refuse them. A responder that refuses a
#      request moves its queue pair to the error state, which the daemon's
#      log records ("the device put the queue pair in the error state", at
#      debug) for its connection from the old leader. The nemesis polls the
#      followers' logs for that (bounded), then SIGCONTs the old leader;
#   5. the runner heals everything, waits for the nodes to agree, reads
#      every node's log and `wal check`s every ring; the checker judges the
#      history: every acknowledged append applied once and in order, the
#      logs agree, no stale-leader acknowledgement and no record of the
#      frozen leader's term after a later term's (jepsen/README.md); and the
#      run must show (`--require-nic-refusal`) that a follower's NIC refused
#      the stale WRITEs while the old leader was stopped (nothing but those
#      retransmissions came from it then), and (`--require-fences`) that at
#      the end every follower's fence names the leader and its term.
# The QPs' retry window must outlast steps 2-4: --rdma-retry-count 6 (rxe
# retries forever at 7) and --rdma-ack-timeout-exp STALE_ACK_EXP (21:
# 8.6 s per try, 7 tries = 60 s; the heal, which comes after an election
# timeout, a new leader's connections and 2-4 s of its commits, must come
# before the last retransmission).
STALE_ACK_EXP=${STALE_ACK_EXP:-21}
STALE_HEARTBEAT_MS=${STALE_HEARTBEAT_MS:-3000}
STALE_ELECTION_MS=${STALE_ELECTION_MS:-6000,9000}
STALE_DURATION_S=${STALE_DURATION_S:-60}          # the workload; one freeze fits (a second may start)
STALE_SEED=${STALE_SEED:-31}
STALE_REQUIRE_REFUSAL=${STALE_REQUIRE_REFUSAL:-1}  # 1: the test fails unless a follower's NIC refused
_now() { date +%s.%N; }
_since() { awk -v a="$1" -v b="$(_now)" 'BEGIN{printf "%.1f", b-a}'; }
# _step <label> <cmd...>: runs a scenario step; PASS/FAIL line + summary entry.
_step() {
    local label=$1 t0 rc=0 res; shift
    t0=$(_now)
    "$@" || rc=$?
    if [ "$rc" = 0 ]; then res=PASS; else res=FAIL; _STALE_FAILED=1; fi
    printf '  %s  %-52s (status %s, %ss, at %ss)\n' "$res" "$label" "$rc" "$(_since "$t0")" "$(_since "$_STALE_T0")"
    _sub "$res" "$label" "$(_since "$t0")"
    return "$rc"
}
# _lab_or_fail <cmd...>: a lab operation of a scenario (cut, heal, stop)
# whose failure fails the test with a summary line of its own: CI shows the
# summary, not the lab's log.
_lab_or_fail() {
    "$@" && return 0
    _sub FAIL "$* failed (lab log above)" 0
    _STALE_FAILED=1
    return 1
}
# _stop_guests: lab_stop; when a guest did not end cleanly, says which and
# how (124: still running after 60 s, 125: died without a status), with the
# end of what the guests printed.
_stop_guests() {
    local out rc=0 i
    out=$(mktemp)
    lab_stop 60 > "$out" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        for i in "${!LAB_RCS[@]}"; do
            [ "${LAB_RCS[$i]}" = 0 ] || _sub FAIL "guest $i stopped with status ${LAB_RCS[$i]}" 0
        done
        echo "  the guests did not all stop cleanly; the end of the lab's output:"
        tail -n 60 "$out" | sed 's/^/    | /'
    fi
    rm -f "$out"
    return "$rc"
}
_stale_wait_pid() {    # <pid> <timeout_s>: wait for a background job, kill it at the deadline
    local end=$((SECONDS + $2))
    while kill -0 "$1" 2> /dev/null; do
        if [ "$SECONDS" -ge "$end" ]; then kill "$1" 2> /dev/null; wait "$1" 2> /dev/null; return 124; fi
        sleep 0.2
    done
    wait "$1"
}
test_multi3_stale_leader() {
    _STALE_FAILED=0
    _build_jepsen || return 1
    local out rc require=(--require-fences --require-clean-wal) freezes
    out=$RR_TARGET/lab-jepsen/stale-${LAB_GUEST_KERNEL:-default}-${STALE_DATA_FS:-tmpfs}-$(date +%Y%m%d-%H%M%S)
    [ "$STALE_REQUIRE_REFUSAL" = 1 ] && require+=(--require-nic-refusal)
    mkdir -p "$(dirname "$out")" || return 1
    echo "  the run (history, report, node logs): $out"
    _STALE_T0=$(_now)
    # The runner boots and kills its own lab (lab.sh start multi / kill);
    # LAB_GUEST_KERNEL (the guests' kernel) reaches lab.sh through the
    # environment.
    _step "ringraft-jepsen: freeze nemesis on 3 guests, valid history" \
        env LAB_GUEST_KERNEL="$LAB_GUEST_KERNEL" \
        timeout $((STALE_DURATION_S + 1500)) "$RR_BIN/ringraft-jepsen" run --substrate softroce \
        --nodes 3 --clients 2 --duration "$STALE_DURATION_S" --seed "$STALE_SEED" --nemesis freeze \
        --ringraft-bin "$RR_BIN/ringraft" --lab-sh "$HERE/lab.sh" --converge-timeout 180 \
        --lab-data-fs "${STALE_DATA_FS:-tmpfs}" \
        --node-log 'info,openraft=warn,ringraft_transport::rdma::conn=debug' \
        --serve-arg=--rdma-retry-count --serve-arg=6 \
        --serve-arg=--rdma-ack-timeout-exp --serve-arg="$STALE_ACK_EXP" \
        --serve-arg=--heartbeat-ms --serve-arg="$STALE_HEARTBEAT_MS" \
        --serve-arg=--election-timeout-ms --serve-arg="$STALE_ELECTION_MS" \
        "${require[@]}" --out "$out" > "$out.stdout" 2> "$out.stderr"
    rc=$?
    tail -n 12 "$out.stderr" | sed 's/^/    | /'
    grep -E '^(Checked|Anomalies)' "$out/report.txt" 2> /dev/null | sed 's/^/    | /'
    grep '^REQUIREMENT NOT MET' "$out.stdout" | sed 's/^/    | /'
    # What each freeze saw (runner summary, one JSON object on stdout).
    freezes=$(grep -o '"freezes":\[[^]]*\]' "$out.stdout" | head -n 1)
    echo "    | ${freezes:-no freeze summary}"
    if grep -q '"frozen":true' <<< "$freezes"; then
        _sub PASS "the leader was frozen with WRITEs in flight" 0
    else
        _sub FAIL "the leader was never frozen" 0; _STALE_FAILED=1
    fi
    [ "$rc" = 0 ] || _STALE_FAILED=1
    return "$_STALE_FAILED"
}

# The stale-leader scenario on the current kernel, data dirs on ext4.
test_multi3_stale_leader_current() {
    LAB_GUEST_KERNEL=$STORAGE_KERNEL STALE_DATA_FS=ext4 test_multi3_stale_leader
}

# ------------------------------------------------ the current kernel (6.12)
# The storage tests run on Debian 12's current security kernel (setup.sh's
# "current" kernel, 6.12) with the nodes' data directories on ext4, where a
# ring that is a page-cache mapping of a file cannot be registered for remote
# write (>= 6.5: `rxe_reg_user_mr: returned err = -14`). /dev/shm is a tmpfs
# in every guest (guest-init.sh). STORAGE_KERNEL=default runs these tests on
# the default kernel (6.1) instead, where such a registration still works.
STORAGE_KERNEL=${STORAGE_KERNEL:-current}

# _nodes_up <port> <name> <timeout_s>: every guest's daemon accepts TCP on
# <port>; fails at once when one died ($LAB_SHARE/g<i>/<name>.exited, written
# by lab_watch in the guest).
_nodes_up() {
    local port=$1 name=$2 end=$((SECONDS + $3)) i up
    while :; do
        up=0
        for ((i = 1; i <= LAB_N; i++)); do
            if [ -e "$LAB_SHARE/g$i/$name.exited" ]; then
                echo "  node $i exited; the end of its log:"
                tail -n 15 "$LAB_SHARE/g$i/$name.log" 2>/dev/null | sed 's/^/    | /'
                return 1
            fi
            timeout 2 bash -c "exec 3<>/dev/tcp/$(_lab_ip "$i")/$port" 2>/dev/null && up=$((up + 1))
        done
        [ "$up" = "$LAB_N" ] && return 0
        [ "$SECONDS" -lt "$end" ] || { echo "  $up of $LAB_N daemons listen on port $port after $3 s"; return 1; }
        sleep 1
    done
}
# _evidence <name>: after a failure, what the guests' kernels and daemons said
# about memory registration (the console carries the kernel's messages).
_evidence() {
    local i
    echo "  guest consoles (kernel $LAB_KVER), registration errors:"
    grep -H -E 'rxe_reg_user_mr|reg_user_mr|err = -14' "$LAB_RUN"/g*.console.log* 2>/dev/null \
        | sed 's/^/    | /' | head -n 12
    for ((i = 1; i <= LAB_N; i++)); do
        if [ -e "$LAB_SHARE/g$i/$1.log" ]; then
            echo "  node $i log (tail):"; tail -n 6 "$LAB_SHARE/g$i/$1.log" | sed 's/^/    | /'
        fi
    done
}


# ------------------------------------------- a daemon cluster on the current kernel
# `ringraft serve --fabric rdma` in three guests, data directories on ext4,
# driven from the host with the CLI over gRPC (the bridge).
SERVE_RAFT_PORT=7100 SERVE_CLIENT_PORT=7101
SERVE_HEARTBEAT_MS=${SERVE_HEARTBEAT_MS:-1000}     # as jepsen's softroce substrate:
SERVE_ELECTION_MS=${SERVE_ELECTION_MS:-3000,6000}  # rdma connections are slow to set up under TCG
# For trying the tests' own pass and fail paths: SERVE_FABRIC=tcp (the
# software NIC: a follower's process copies the leader's records into its
# ring) and SERVE_RING_ON_DATA=1 (--ring-dir inside the data directory, a
# page-cache file there, as before the ring moved to /dev/shm).
SERVE_FABRIC=${SERVE_FABRIC:-rdma}
SERVE_RING_ON_DATA=${SERVE_RING_ON_DATA:-0}
_build_cli() {
    [ -n "${_CLI_BUILT:-}" ] && return 0
    echo "building ringraft (cargo build --release --features rdma -p ringraft-cli)"
    (cd "$REPO" && CARGO_TARGET_DIR="$RR_TARGET" cargo build --release --locked \
        -p ringraft-cli --features rdma --bin ringraft) || return 1
    _CLI_BUILT=1
}
# _serve_script <data_dir> <durability>: prints the text of the guest's
# /tmp/rr/serve.sh, run as `serve.sh start|kill9|stop|wal-check`. Node 1
# bootstraps the cluster on its first start. The daemon's log is
# /tmp/rr/serve.log (copied to $LAB_RESULTS/serve.log when the daemon exits,
# and by stop).
_serve_script() {
    local data=$1 durability=$2 peers="" i extra=
    for i in 1 2 3; do peers+="${peers:+,}$i=$(_lab_ip "$i"):$SERVE_RAFT_PORT"; done
    [ "$SERVE_FABRIC" = rdma ] && extra+=' --rdma-device "$LAB_RXE"'
    [ "$SERVE_RING_ON_DATA" = 1 ] && extra+=" --ring-dir $data/ring-dir"
    cat <<EOF
#!/bin/bash
source '$LAB_DIR/guest-lib.sh'
D='$data/node'; mkdir -p /tmp/rr "\$D" '$data/ring-dir'
pid() { cat /tmp/rr/serve.pid 2>/dev/null; }
case "\$1" in
start)
    p=\$(pid) && kill -0 "\$p" 2>/dev/null && exit 0
    boot=; [ "\$LAB_INDEX" = 1 ] && [ ! -e "\$D/.lab-bootstrapped" ] && boot=--bootstrap && touch "\$D/.lab-bootstrapped"
    NO_COLOR=1 RUST_LOG=warn,ringraft=info setsid nohup '$RR_BIN/ringraft' serve --id "\$LAB_INDEX" --data-dir "\$D" \\
        --listen "\$LAB_IP:$SERVE_RAFT_PORT" --client "\$LAB_IP:$SERVE_CLIENT_PORT" --peers '$peers' \\
        --fabric $SERVE_FABRIC$extra --durability $durability --ring-capacity $((8 << 20)) \\
        --max-record 65536 --heartbeat-ms $SERVE_HEARTBEAT_MS --election-timeout-ms $SERVE_ELECTION_MS \\
        \$boot >> /tmp/rr/serve.log 2>&1 < /dev/null &
    p=\$!
    echo \$p > /tmp/rr/serve.pid
    lab_watch \$p serve /tmp/rr/serve.log
    echo "started node \$LAB_INDEX (pid \$p) on \$D (\$(findmnt -n -o FSTYPE -T "\$D")), kernel \$(uname -r)" ;;
kill9)
    p=\$(pid) || exit 1; kill -9 "\$p"; while kill -0 "\$p" 2>/dev/null; do sleep 0.1; done; rm -f /tmp/rr/serve.pid ;;
stop)
    p=\$(pid) || exit 0; kill -TERM "\$p"
    for _ in \$(seq 150); do kill -0 "\$p" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "\$p" 2>/dev/null; then kill -9 "\$p"; echo "node \$LAB_INDEX ignored SIGTERM"; rc=1; fi
    rm -f /tmp/rr/serve.pid; cp /tmp/rr/serve.log "\$LAB_RESULTS/serve.log"; exit \${rc:-0} ;;
wal-check)
    '$RR_BIN/ringraft' wal check --data-dir "\$D" ;;
esac
EOF
}
# _serve_guest_cmd <ext4|disk> <data_dir> <durability> [start=1] [pre]: the
# guest command of a serve test: /tmp/rr/serve.sh written, the data directory
# mounted (an ext4 loop, or the virtio disk), the command <pre> run (its
# output in $LAB_RESULTS/pre.out, its status in pre.rc), the daemon started
# unless start=0, idle until lab_stop, the daemon stopped.
_serve_guest_cmd() {
    local how=$1 data=$2 durability=$3 start=${4:-1} pre=${5:-}
    cat <<EOF
mkdir -p /tmp/rr
cat > /tmp/rr/serve.sh <<'SERVE_SH'
$(_serve_script "$data" "$durability")
SERVE_SH
$([ "$how" = disk ] && echo "lab_disk_mount $data || exit 1" || echo "lab_ext4_loop $data || exit 1")
echo "/dev/shm: \$(findmnt -n -o FSTYPE,SIZE /dev/shm)"
$([ -n "$pre" ] && printf '{ %s; } > "$LAB_RESULTS/pre.out" 2>&1; echo $? > "$LAB_RESULTS/pre.rc"\n' "$pre")
$([ "$start" = 1 ] && echo 'bash /tmp/rr/serve.sh start || exit 1')
lab_idle $((LAB_TIMEOUT + 60))
bash /tmp/rr/serve.sh stop
EOF
}
_rr() { timeout 180 "$RR_BIN/ringraft" "$@"; }
_ep() { echo "$(_lab_ip "$1"):$SERVE_CLIENT_PORT"; }
_eps() { local i e=""; for i in "$@"; do e+="${e:+,}$(_ep "$i")"; done; echo "$e"; }
# _leader_of <i>: "<leader node i names> <node i's own state>" (leader empty if none).
_leader_of() {
    _rr status --endpoints "$(_ep "$1")" --timeout-ms 2000 --deadline-ms 3000 2>/dev/null \
        | awk '/^node /{st=$3} /^leader [0-9]/{l=$2} END{gsub(/[(),]/, "", st); print l, tolower(st)}'
}
# _serve_wait_leader <timeout_s> <not> <i...>: until nodes i... name the same
# leader L among them (L != <not>; 0: any) and L says it leads; prints L.
_serve_wait_leader() {
    local end=$((SECONDS + $1)) not=$2 i l first st ok; shift 2
    while :; do
        ok=1; first=
        for i in "$@"; do
            if [ -e "$LAB_SHARE/g$i/serve.exited" ]; then
                echo "  node $i exited" >&2; tail -n 10 "$LAB_SHARE/g$i/serve.log" >&2; return 1
            fi
            read -r l st <<< "$(_leader_of "$i")"
            if [ -z "$l" ] || [ "$l" = "$not" ] || [[ " $* " != *" $l "* ]]; then ok=0; break; fi
            [ -z "$first" ] && first=$l
            [ "$l" = "$first" ] || { ok=0; break; }
            [ "$i" != "$l" ] || [ "$st" = leader ] || { ok=0; break; }
        done
        [ "$ok" = 1 ] && { echo "$first"; return 0; }
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 1
    done
}
# _append <eps> <prefix> <count> <out>: appends <prefix>-1..count, one request
# each (the CLI retries through leader changes); writes "<index> <value>" per
# acknowledged record to <out>.
_append() {
    local eps=$1 prefix=$2 count=$3 out=$4 k idx
    : > "$out"
    for ((k = 1; k <= count; k++)); do
        idx=$(_rr append --endpoints "$eps" "$prefix-$k") || { echo "  append $prefix-$k failed"; return 1; }
        echo "$idx $prefix-$k" >> "$out"
    done
}
# _read_check <i> <acked...>: node i alone (a linearizable read, which a node
# serves from its own log) returns every acknowledged record at its index.
# A follower first asks the leader for its read index over the fabric; right
# after a restart it has no connection to the leader yet, and a Soft-RoCE
# connection under TCG takes seconds to set up (CI, 2026-12-03: a read 6 s
# after node 1 restarted got no answer within the CLI's default 2 s per
# attempt, twice), so the read gets 10 s per attempt and 30 s in all.
_read_check() {
    local i=$1 from to got missing w=$LAB_RUN/serve; shift
    sort -n -u "$@" > "$w/want.$i"
    from=$(head -n1 "$w/want.$i" | cut -d' ' -f1); to=$(tail -n1 "$w/want.$i" | cut -d' ' -f1)
    _rr read --endpoints "$(_ep "$i")" --timeout-ms 10000 --deadline-ms 30000 \
        --from "$from" --to "$to" --format json > "$w/read.$i" || return 1
    sed -n 's/.*"data":"\([^"]*\)".*"index":\([0-9]*\).*/\2 \1/p' "$w/read.$i" | sort -n > "$w/got.$i"
    missing=$(comm -23 "$w/want.$i" "$w/got.$i" | wc -l)
    got=$(wc -l < "$w/got.$i")
    echo "  node $i: $got records read in $from..=$to, $missing acknowledged ones missing or different"
    [ "$missing" = 0 ] || { comm -23 "$w/want.$i" "$w/got.$i" | head -n 5 | sed 's/^/    want /'; return 1; }
}
# _wait_applied <i> <index> <timeout_s>: node i applied up to <index>.
_wait_applied() {
    local end=$((SECONDS + $3)) a
    while :; do
        a=$(_rr status --endpoints "$(_ep "$1")" --timeout-ms 2000 --deadline-ms 3000 2>/dev/null \
            | awk '/^commit /{gsub(/,/, ""); print $4}')
        [ -n "$a" ] && [ "$a" -ge "$2" ] && return 0
        [ "$SECONDS" -lt "$end" ] || { echo "  node $1 applied ${a:-?} < $2 after $3 s"; return 1; }
        sleep 1
    done
}
# _wal_check_all <i...>: stop each node (SIGTERM, it must exit) and run the
# offline `ringraft wal check` on its data directory: no corruption.
_wal_check_all() {
    local i rc=0
    for i in "$@"; do
        lab_exec -t 60 "$i" 'bash /tmp/rr/serve.sh stop && bash /tmp/rr/serve.sh wal-check' \
            > "$LAB_RUN/serve/walcheck.$i" 2>&1 || rc=1
        echo "  node $i: $(grep -E '^(valid range|verdict)' "$LAB_RUN/serve/walcheck.$i" | tr -s ' ' | paste -sd';')"
    done
    return "$rc"
}
# _serve_start_lab <durability> <cmd_1> <cmd_2> <cmd_3>: boots three guests
# (on LAB_GUEST_KERNEL), each starting its daemon; waits until they listen.
_serve_start_lab() {
    local durability=$1; shift
    _build_cli || return 1
    lab_start multi 3 "$@" || return 1
    mkdir -p "$LAB_RUN/serve"
    echo "  kernel $LAB_KVER, durability $durability; artifacts in $LAB_RUN/serve, the share in $LAB_SHARE"
    _STALE_T0=$(_now)
    _step "the daemons are up (client ports answer)" _nodes_up "$SERVE_CLIENT_PORT" serve 120
}

test_multi3_serve_current() {
    _STALE_FAILED=0
    local LAB_GUEST_KERNEL=$STORAGE_KERNEL old new i w others=() cmd
    cmd=$(_serve_guest_cmd ext4 /mnt/rr-ext4 memory)
    _serve_start_lab memory "$cmd" "$cmd" "$cmd" || { _evidence serve; lab_stop 60 > /dev/null; return 1; }
    w=$LAB_RUN/serve
    _step "/dev/shm is a tmpfs, the data dirs are on ext4" lab_exec 1 \
        'findmnt -n -o FSTYPE /dev/shm | grep -qx tmpfs && findmnt -n -o FSTYPE -T /mnt/rr-ext4/node | grep -qx ext4'
    old=$(_serve_wait_leader 120 0 1 2 3)
    _step "a leader is elected (${old:-none})" test -n "$old" || { _evidence serve; lab_stop 60 > /dev/null; return 1; }
    _step "20 records appended through the CLI" _append "$(_eps 1 2 3)" first 20 "$w/first.acked"
    for i in 1 2 3; do _step "node $i reads them back" _read_check "$i" "$w/first.acked"; done
    _step "kill -9 the leader (node $old)" lab_exec -t 30 "$old" 'bash /tmp/rr/serve.sh kill9'
    for i in 1 2 3; do [ "$i" = "$old" ] || others+=("$i"); done
    new=$(_serve_wait_leader 120 "$old" "${others[@]}")
    _step "the survivors elect a new leader (${new:-none})" test -n "$new"
    _step "20 more records, committed by the new leader" _append "$(_eps "${others[@]}")" second 20 "$w/second.acked"
    _step "node $old restarts" lab_exec -t 30 "$old" 'bash /tmp/rr/serve.sh start'
    _step "node $old catches up" _wait_applied "$old" "$(tail -n1 "$w/second.acked" | cut -d' ' -f1)" 120
    for i in 1 2 3; do _step "node $i holds all 40 records" _read_check "$i" "$w/first.acked" "$w/second.acked"; done
    _step "every node stops on SIGTERM; wal check: no corruption" _wal_check_all 1 2 3
    [ "$_STALE_FAILED" = 0 ] || _evidence serve
    _lab_or_fail _stop_guests
    return "$_STALE_FAILED"
}

# ------------------------------------------- a machine crash on rdma (current kernel)
# Guest 2's data directory is on its own virtio disk (a host file, ext4;
# lib.sh LAB_DISK_GUESTS, cache=none: the guest must flush, and its flushes
# reach the file), guests 1 and 3 on ext4 loops; `fsync` durability.
#   1. node 1 leads; 20 records committed by all three;
#   2. node 3 stops: from now on a commit needs node 2's acknowledgement
#      (2 of 3), i.e. node 2 made the entry durable before the client got
#      its index;
#   3. records are appended one by one; right after the CRASH_AFTER-th is
#      acknowledged, guest 2 is powered off through the QEMU monitor
#      (lab_crash: `quit`, the guest's RAM and page cache are gone) while
#      the next append is in flight;
#   4. guest 2 boots again on the same disk (journal replay) and, before its
#      node starts (the leader would re-send what it lacks), `ringraft wal
#      check` reads its data directory: no corruption, and the valid range
#      holds every acknowledged index;
#   5. nodes 2 and 3 restart; node 2 catches up and returns every
#      acknowledged record, byte for byte.
# The crash comes milliseconds after the last acknowledgement, but the guest
# kernel may write back dirty pages on its own before (measured: 4 MiB of
# unflushed ext4 data reached the disk within 12 s, even with periodic
# writeback off), so a node that forgets a flush is caught only when the
# crash beats that: CRASH_DURABILITY=memory runs the same test without
# flushes.
CRASH_AFTER=${CRASH_AFTER:-30}
CRASH_DURABILITY=${CRASH_DURABILITY:-fsync}
# _crash_appender <eps> <out> <crash_after> <guest>: appends crash-1, crash-2,
# ... one at a time; crashes <guest> right after the <crash_after>-th is
# acknowledged and goes on until an append fails.
_crash_appender() {
    local eps=$1 out=$2 after=$3 guest=$4 k idx
    : > "$out"
    for ((k = 1; ; k++)); do
        idx=$(timeout 30 "$RR_BIN/ringraft" append --endpoints "$eps" --deadline-ms 15000 "crash-$k") || break
        echo "$idx crash-$k" >> "$out"
        if [ "$k" = "$after" ]; then
            date +%s.%N > "$out.crash-at"
            lab_crash "$guest" > "$out.crash" 2>&1
        fi
    done
}
# _crash_disk_check <walcheck output> <acked...>: the crashed node's own log
# holds every acknowledged index and is not corrupt.
_crash_disk_check() {
    local report=$1 first last lo hi acked_word; shift
    sed 's/^/    | /' "$report"
    read -r first last <<< "$(sed -n 's/^valid range[[:space:]]*index \([0-9]*\)\.\.=\([0-9]*\).*/\1 \2/p' "$report")"
    # After the crash the ring (shared memory) is gone: the log is the
    # segments, whose line names the range.
    [ -n "$last" ] || read -r first last <<< "$(sed -n 's/^segments[[:space:]].*: index \([0-9]*\)\.\.=\([0-9]*\).*/\1 \2/p' "$report")"
    lo=$(cat "$@" | cut -d' ' -f1 | sort -n | head -n1); hi=$(cat "$@" | cut -d' ' -f1 | sort -n | tail -n1)
    acked_word=$(sed -n 's/^acknowledged[[:space:]]*//p' "$report")
    echo "  acknowledged to clients: indexes $lo..=$hi; the crashed node's log: ${first:-?}..=${last:-?} (its own watermark: ${acked_word:-?})"
    [ "$(cat "$report.rc" 2>/dev/null)" = 0 ] || { echo "  wal check failed (status $(cat "$report.rc" 2>/dev/null))"; return 1; }
    [ -n "$last" ] || { echo "  no valid range of indexes in the wal check's report"; return 1; }
    [ "$first" -le "$lo" ] && [ "$last" -ge "$hi" ]
}
test_multi3_crash_fsync_current() {
    _STALE_FAILED=0
    local LAB_GUEST_KERNEL=$STORAGE_KERNEL LAB_DISK_GUESTS=2 dur=$CRASH_DURABILITY w cmd cmd2 leader job end n t_crash
    cmd=$(_serve_guest_cmd ext4 /mnt/rr-ext4 "$dur")
    cmd2=$(_serve_guest_cmd disk /mnt/rr-disk "$dur")
    _serve_start_lab "$dur" "$cmd" "$cmd2" "$cmd" || { _evidence serve; lab_stop 60 > /dev/null; return 1; }
    w=$LAB_RUN/serve
    leader=$(_serve_wait_leader 120 0 1 2 3)
    _step "a leader is elected (${leader:-none})" test -n "$leader" || { _evidence serve; lab_stop 60 > /dev/null; return 1; }
    if [ "$leader" != 1 ]; then
        _step "node 1 takes the lead" _rr transfer 1 --endpoints "$(_eps 1 2 3)"
        leader=$(_serve_wait_leader 60 0 1 2 3)
        _step "node 1 leads (${leader:-none})" test "$leader" = 1 || { lab_stop 60 > /dev/null; return 1; }
    fi
    _step "20 records committed by all three" _append "$(_eps 1 2 3)" first 20 "$w/first.acked"
    _step "node 2 applied them" _wait_applied 2 "$(tail -n1 "$w/first.acked" | cut -d' ' -f1)" 60
    _step "node 3 stops: a commit now needs node 2" lab_exec -t 60 3 'bash /tmp/rr/serve.sh stop'
    _crash_appender "$(_ep 1)" "$w/crash.acked" "$CRASH_AFTER" 2 &
    job=$!
    _stale_wait_pid "$job" 300
    n=$(wc -l < "$w/crash.acked")
    sed 's/^/    | /' "$w/crash.acked.crash" 2>/dev/null
    t_crash=$(cat "$w/crash.acked.crash-at" 2>/dev/null)
    _step "guest 2 crashed right after $CRASH_AFTER acknowledged appends ($n acknowledged in all)" \
        test -n "$t_crash" -a "$n" -ge "$CRASH_AFTER"
    _step "guest 2 boots again on the same disk" \
        lab_boot 2 "$(_serve_guest_cmd disk /mnt/rr-disk "$dur" 0 'bash /tmp/rr/serve.sh wal-check')"
    end=$((SECONDS + 120))
    while [ ! -e "$LAB_SHARE/g2/pre.rc" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.5; done
    cp "$LAB_SHARE/g2/pre.out" "$w/walcheck.crashed" 2>/dev/null; cp "$LAB_SHARE/g2/pre.rc" "$w/walcheck.crashed.rc" 2>/dev/null
    _step "its disk holds every acknowledged entry (wal check, node not started)" \
        _crash_disk_check "$w/walcheck.crashed" "$w/first.acked" "$w/crash.acked"
    _step "nodes 2 and 3 start again" lab_exec -t 60 2 'bash /tmp/rr/serve.sh start' \
        && lab_exec -t 60 3 'bash /tmp/rr/serve.sh start'
    _step "node 2 catches up" _wait_applied 2 "$(tail -n1 "$w/crash.acked" | cut -d' ' -f1)" 120
    _step "node 2 returns every acknowledged record" _read_check 2 "$w/first.acked" "$w/crash.acked"
    _step "every node stops on SIGTERM; wal check: no corruption" _wal_check_all 1 2 3
    [ "$_STALE_FAILED" = 0 ] || _evidence serve
    _lab_or_fail _stop_guests
    return "$_STALE_FAILED"
}

# --------------------------------------------------------------- driver
SUMMARY=()
_sub() { SUMMARY+=("$(printf '    %s  %-46s %5ss' "$1" "$2" "$3")"); }

main() {
    local t_all=$SECONDS t0 rc name failed=0 f line
    local selected=("$@")
    [ ${#selected[@]} -gt 0 ] || selected=("${TESTS[@]}")
    for name in "${selected[@]}"; do
        declare -F "test_$name" > /dev/null || { echo "unknown test: $name (have: ${TESTS[*]})" >&2; exit 2; }
    done
    t0=$SECONDS
    if ! lab_setup; then echo "setup.sh failed" >&2; exit 1; fi
    SUMMARY+=("$(printf '%s  %-50s %5ss' PASS setup "$((SECONDS - t0))")")
    for name in "${selected[@]}"; do
        echo
        echo "################ test $name"
        t0=$SECONDS
        local mark=${#SUMMARY[@]}
        "test_$name"; rc=$?
        local subs=("${SUMMARY[@]:$mark}")
        SUMMARY=("${SUMMARY[@]:0:$mark}")
        SUMMARY+=("$(printf '%s  %-50s %5ss' "$([ "$rc" = 0 ] && echo PASS || echo "FAIL")" "$name" "$((SECONDS - t0))")")
        SUMMARY+=("${subs[@]}")
        # sub-results that guest commands recorded with lab_check
        if [ -n "${LAB_RUN:-}" ]; then
            for f in "$LAB_SHARE"/g*/checks; do
                [ -f "$f" ] || continue
                while read -r line; do
                    set -- $line
                    SUMMARY+=("$(printf '    %s  %-46s %5s' "$1" "g$(basename "$(dirname "$f")" | tr -d g): $2" "${3:-}")")
                done < "$f"
            done
        fi
        # a test that returned without stopping its lab: kill it
        if [ -n "${LAB_RUN:-}" ] && [ ! -e "$LAB_RUN/stopped" ]; then lab_kill; fi
        LAB_RUN=
        [ "$rc" = 0 ] || failed=$((failed + 1))
    done
    echo
    echo "================ Soft-RoCE VM lab summary ================"
    printf '%s\n' "${SUMMARY[@]}"
    echo "total $((SECONDS - t_all))s, $failed failed test(s)"
    [ "$failed" = 0 ]
}

main "$@"
