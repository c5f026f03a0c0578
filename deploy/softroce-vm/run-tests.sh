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

TESTS=(loopback_verbs rdma_conformance_loopback multi_perftest rdma_conformance_multi multi_cut multi3_cut)

REPO=$(cd "$HERE/../.." && pwd)
# The project's binaries with the rdma backend, built on the host and run
# in the guests in place.
RR_TARGET=${RR_TARGET:-$REPO/target}
RR_BIN=$RR_TARGET/release
_build_rdma_bins() {
    [ -n "${_RDMA_BUILT:-}" ] && return 0
    echo "building the rdma binaries (cargo build --release --features rdma)"
    (cd "$REPO" && CARGO_TARGET_DIR="$RR_TARGET" cargo build --release --locked \
        -p ringraft-transport --features rdma --bins) || return 1
    _RDMA_BUILT=1
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
