#!/usr/bin/env bash
# Where the time of one `fsync` append goes (issue 11's "a profile, not a
# guess"): 3 `ringraft serve` nodes on loopback (release build, tcp fabric,
# --durability fsync), one client appending --size byte records one at a
# time with `ringraft bench`, while `perf trace` times every system call of
# the three nodes (a summary per thread) and, in a second run, traces a
# short window of them with timestamps (the critical path of single
# appends, across the nodes), and `perf record` samples where the CPU goes.
#
#   scripts/profile.sh [--size 4096] [--secs 15] [--out DIR]
#
# Needs perf (linux-perf) and root (tracepoints). Writes into --out:
# bench*.txt (the load alone, then under each tool), counters.txt (perf
# stat: CPU time, context switches), flushes.txt (perf trace -s of
# fdatasync and pwritev only), syscalls.txt (perf trace -s of every call),
# timeline.txt (perf trace, 0.3 s of the load), cpu.txt (perf report).
# Each perf command is bounded (SIGINT after --secs + 30 s): perf trace was
# seen spinning instead of ending once.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=4096 SECS=15 OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) SIZE=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (--help)" >&2; exit 2 ;;
    esac
done
command -v perf > /dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }
[[ -n $OUT ]] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/ringraft-profile.XXXXXX")
mkdir -p "$OUT"
say() { printf '[profile] %s\n' "$*"; }

BASE=27600
# shellcheck source=local-cluster.sh
. scripts/local-cluster.sh
local_cluster_start profile "${TMPDIR:-/tmp}" "$BASE" --durability fsync
leader=$LEADER
pids=$(IFS=,; echo "${PIDS[*]}")
say "leader: node $leader; node pids ${PIDS[*]}; results in $OUT"

bench() { "$BIN" bench --endpoints "127.0.0.1:$((BASE + 10 + leader))" --clients 1 --size "$SIZE" --duration "$1" --quiet; }
bench 3 > /dev/null # warm-up

# 0. The load alone: the latency every other measurement disturbs.
bench "$SECS" > "$OUT/bench.txt"

# 1. Context switches and CPU time of the nodes (counters: cheap).
timeout -s INT "$((SECS + 30))" perf stat -e task-clock,context-switches,cpu-migrations -p "$pids" -o "$OUT/counters.txt" -- sleep "$SECS" &
tracer=$!
sleep 0.5
bench "$((SECS - 1))" > "$OUT/bench-counters.txt"
wait "$tracer" || true

# 2. The flushes alone (only these calls traced): their count and time.
timeout -s INT "$((SECS + 30))" perf trace -s -e fdatasync,pwritev -p "$pids" -o "$OUT/flushes.txt" -- sleep "$SECS" &
tracer=$!
sleep 0.5
bench "$((SECS - 1))" > "$OUT/bench-flushes.txt"
wait "$tracer" || true

# 3. Every system call, summed per thread (heavier: it slows the load).
timeout -s INT "$((SECS + 30))" perf trace -s -p "$pids" -o "$OUT/syscalls.txt" -- sleep "$SECS" &
tracer=$!
sleep 0.5
bench "$((SECS - 1))" > "$OUT/bench-syscalls.txt"
wait "$tracer" || true

# 4. A short window with timestamps: the path of single appends.
bench 4 > /dev/null &
load=$!
sleep 1.5
timeout -s INT "$((SECS + 30))" perf trace -p "$pids" -o "$OUT/timeline.txt" -- sleep 0.3 || true
wait "$load"

# 5. Where the CPU goes (all threads of the nodes).
timeout -s INT "$((SECS + 30))" perf record -q -F 2999 -g -p "$pids" -o "$OUT/perf.data" -- sleep "$SECS" 2> /dev/null &
recorder=$!
sleep 0.5
bench "$((SECS - 1))" > "$OUT/bench-cpu.txt"
wait "$recorder" || true
perf report -i "$OUT/perf.data" --no-children --sort comm,symbol -g none --stdio 2> /dev/null \
    | grep -v '^#' | grep -v '^$' | head -n 60 > "$OUT/cpu.txt" || true
for f in bench bench-counters bench-flushes bench-syscalls bench-cpu; do
    printf '%-16s %s\n' "$f" "$(grep 'commit latency' "$OUT/$f.txt")"
done
say "counters:"; grep -E 'task-clock|context-switches|cpu-migrations' "$OUT/counters.txt"
say "done: $OUT"
