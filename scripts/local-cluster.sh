# shellcheck shell=bash
# Sourced by scripts/memory.sh and scripts/profile.sh: three `ringraft serve`
# nodes on loopback (release build, tcp fabric), torn down on exit.
#
#   local_cluster_start NAME PARENT BASE_PORT [serve flags...]
#
# builds the release binary, starts nodes 1..3 (listen BASE_PORT+i, client
# BASE_PORT+10+i) with data dirs in a new dir under PARENT and rings in a new
# dir under /dev/shm, waits (at most 30 s) until they agree on a leader, and
# sets BIN, WORK (data dirs n1..n3 and logs n1.log..), PIDS (node i is
# PIDS[i-1]), ENDPOINTS (the client addresses) and LEADER;
# local_cluster_node restarts a node. An EXIT trap stops
# the nodes and removes both dirs.

# json_num KEY: the first number for "KEY" in the JSON on stdin.
json_num() { grep -o "\"$1\": *[0-9.eE+-]*" | head -n 1 | sed 's/.*: *//'; }

local_cluster_stop() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
    rm -rf "$WORK" "$RING_DIR"
}

# local_cluster_node I [flags...]: (re)starts node I with the cluster's
# serve flags (appending to its log), as PIDS[I-1].
local_cluster_node() {
    local i=$1
    shift
    RUST_LOG=${RUST_LOG:-warn} "$BIN" serve --id "$i" --data-dir "$WORK/n$i" --ring-dir "$RING_DIR" \
        --listen "127.0.0.1:$((CLUSTER_BASE + i))" --client "127.0.0.1:$((CLUSTER_BASE + 10 + i))" \
        --peers "$CLUSTER_PEERS" --fabric tcp "${SERVE_ARGS[@]}" "$@" >> "$WORK/n$i.log" 2>&1 &
    PIDS[i - 1]=$!
}

local_cluster_start() {
    local name=$1 parent=$2 base=$3 i peers="" boot
    shift 3
    cargo build --release --locked -p ringraft-cli --bin ringraft >&2
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/ringraft
    WORK=$(mktemp -d "$parent/ringraft-$name.XXXXXX")
    RING_DIR=$(mktemp -d "/dev/shm/ringraft-$name.XXXXXX")
    PIDS=()
    trap local_cluster_stop EXIT
    ENDPOINTS=""
    for i in 1 2 3; do
        peers+="${peers:+,}$i=127.0.0.1:$((base + i))"
        ENDPOINTS+="${ENDPOINTS:+,}127.0.0.1:$((base + 10 + i))"
    done
    SERVE_ARGS=("$@")
    CLUSTER_BASE=$base CLUSTER_PEERS=$peers
    for i in 1 2 3; do
        boot=()
        [[ $i == 1 ]] && boot=(--bootstrap)
        local_cluster_node "$i" "${boot[@]}"
    done
    LEADER=""
    for _ in $(seq 150); do
        LEADER=$("$BIN" status --endpoints "$ENDPOINTS" --json --timeout-ms 500 2> /dev/null \
            | json_num leader_id || true)
        [[ $LEADER =~ ^[0-9]+$ ]] && return 0
        sleep 0.2
    done
    echo "the nodes agreed on no leader within 30 s (logs in $WORK)" >&2
    return 1
}
