#!/usr/bin/env bash
# Failover as a client sees it, and spurious elections, on a local 3-node
# cluster (release build, tcp fabric, loopback).
#
#   scripts/failover.sh kills [ROUNDS] [serve flags...]
#       ROUNDS times (default 20): one closed-loop client appends
#       (`ringraft bench --clients 1`); 1 s in, the leader is killed with
#       SIGKILL and restarted once the bench is over. Per round: the
#       client's longest append, which spans the kill (an upper bound of
#       kill -> next acknowledged append, within one append's latency),
#       and the term before and after. Prints p50/p99/max over the rounds.
#   scripts/failover.sh elections SECONDS CLIENTS [serve flags...]
#       counts elections (term changes) over SECONDS with CLIENTS bench
#       clients appending (0: idle).
#
# Env: BASE_PORT (default 27600), OUT (JSON lines, default
# target/failover-<mode>.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/failover.sh kills [ROUNDS] | elections SECONDS CLIENTS}
shift
BASE_PORT=${BASE_PORT:-27600}
OUT=${OUT:-target/failover-$mode.jsonl}
# shellcheck source=local-cluster.sh
. scripts/local-cluster.sh

say() { echo "failover: $*" >&2; }

# The term and leader the nodes agree on (waits for one, at most 30 s).
agreed() {
    local s
    for _ in $(seq 300); do
        s=$("$BIN" status --endpoints "$ENDPOINTS" --json --timeout-ms 500 2> /dev/null || true)
        LEADER=$(json_num leader_id <<< "$s")
        TERM=$(json_num term <<< "$s")
        [[ $LEADER =~ ^[0-9]+$ && $TERM =~ ^[0-9]+$ ]] && return 0
        sleep 0.1
    done
    say "no leader within 30 s"
    return 1
}

# Waits until every node answers status with the same applied index as the
# leader's commit (a restarted node caught up), at most 30 s.
caught_up() {
    local i s applied=() ok
    for _ in $(seq 300); do
        ok=1
        applied=()
        for i in 1 2 3; do
            s=$("$BIN" status --endpoints "127.0.0.1:$((BASE_PORT + 10 + i))" --json \
                --timeout-ms 500 2> /dev/null || true)
            applied+=("$(json_num applied_index <<< "$s")")
            [[ ${applied[-1]} =~ ^[0-9]+$ ]] || ok=0
        done
        if ((ok)) && [[ ${applied[0]} == "${applied[1]}" && ${applied[1]} == "${applied[2]}" ]]; then
            return 0
        fi
        sleep 0.1
    done
    say "the nodes did not catch up within 30 s: applied ${applied[*]}"
    return 1
}

case $mode in
kills)
    rounds=${1:-20}
    [[ $# -gt 0 ]] && shift
    local_cluster_start failover "${TMPDIR:-/tmp}" "$BASE_PORT" --durability memory "$@"
    : > "$OUT"
    for r in $(seq "$rounds"); do
        caught_up
        agreed
        before=$TERM victim=$LEADER
        "$BIN" bench --endpoints "$ENDPOINTS" --clients 1 --duration 3 --json \
            > "$WORK/bench.json" 2> /dev/null &
        bench=$!
        sleep 1
        kill -KILL "${PIDS[victim - 1]}"
        wait "${PIDS[victim - 1]}" 2> /dev/null || true
        wait "$bench"
        max=$(grep -o '"latency_ms": *{[^}]*}' "$WORK/bench.json" | json_num max)
        errors=$(json_num errors < "$WORK/bench.json")
        local_cluster_node "$victim"
        agreed
        echo "{\"round\": $r, \"killed\": $victim, \"longest_append_ms\": $max, \"errors\": $errors, \"term_before\": $before, \"term_after\": $TERM, \"leader_after\": $LEADER}" | tee -a "$OUT"
    done
    python3 - "$OUT" << 'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = sorted(r["longest_append_ms"] for r in rows)
def q(p):
    return ms[min(len(ms) - 1, int(p * len(ms)))]
print(f"rounds {len(ms)}: longest append across the kill p50 {q(0.5):.1f} ms, "
      f"p99 {q(0.99):.1f} ms, max {ms[-1]:.1f} ms, min {ms[0]:.1f} ms; "
      f"errors {sum(r['errors'] for r in rows)}; "
      f"terms per kill {[r['term_after'] - r['term_before'] for r in rows]}")
EOF
    ;;
elections)
    seconds=${1:?SECONDS}
    clients=${2:?CLIENTS}
    shift 2
    local_cluster_start elections "${TMPDIR:-/tmp}" "$BASE_PORT" --durability memory "$@"
    agreed
    before=$TERM
    if ((clients > 0)); then
        "$BIN" bench --endpoints "$ENDPOINTS" --clients "$clients" --duration "$seconds" --json \
            > "$WORK/bench.json" 2> /dev/null
        acked=$(json_num acknowledged < "$WORK/bench.json")
    else
        sleep "$seconds"
        acked=0
    fi
    agreed
    echo "{\"seconds\": $seconds, \"clients\": $clients, \"acknowledged\": $acked, \"term_before\": $before, \"term_after\": $TERM, \"elections\": $((TERM - before))}" | tee -a "$OUT"
    ;;
*)
    say "unknown mode $mode"
    exit 2
    ;;
esac
