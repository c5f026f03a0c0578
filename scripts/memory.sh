#!/usr/bin/env bash
# Memory and disk under a long load with retention (issue 11's memory
# target): 3 `ringraft serve` nodes on loopback (release build, tcp fabric)
# with --retain-bytes, `ringraft bench` appending 4 KiB records from 16
# clients until about --gib GiB went in. Every second it samples each
# node's RSS (VmRSS: the touched shared-memory ring and mapped pages count)
# and the bytes of its data directory, then prints, per node, the RSS after
# the first 10 s of load, the largest RSS after that, their ratio, and the
# largest data directory as a multiple of the retention.
#
#   scripts/memory.sh [--gib 1.5] [--retain 256MiB|none] [--durability memory|fsync]
#                     [--dir PARENT] [--base-port 27400]
#
# --retain none runs without retention (the log grows; the data directory
# column is then against 256 MiB).
#
# A measurement, not a test: it exits 0 whatever the numbers (non-zero only
# when the cluster or the load fails).
set -euo pipefail
cd "$(dirname "$0")/.."

GIB=1.5 RETAIN=256MiB DURABILITY=memory PARENT=${TMPDIR:-/tmp} BASE_PORT=27400
while [[ $# -gt 0 ]]; do
    case $1 in
    --gib) GIB=$2; shift 2 ;;
    --retain) RETAIN=$2; shift 2 ;;
    --durability) DURABILITY=$2; shift 2 ;;
    --dir) PARENT=$2; shift 2 ;;
    --base-port) BASE_PORT=$2; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (--help)" >&2; exit 2 ;;
    esac
done
say() { printf '[memory] %s\n' "$*"; }

retain_flag=(--retain-bytes "$RETAIN")
if [[ $RETAIN == none ]]; then retain_flag=(); RETAIN=256MiB; fi
# shellcheck source=local-cluster.sh
. scripts/local-cluster.sh
local_cluster_start memory "$PARENT" "$BASE_PORT" --durability "$DURABILITY" "${retain_flag[@]}"
endpoints=$ENDPOINTS

# The load: a first bench of 10 s (the baseline), then one that appends the
# rest; bench reports how many records went in.
bench() { "$BIN" bench --endpoints "$endpoints" --clients 16 --size 4096 --duration "$1" --json --quiet; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
dir_bytes() { du -sb "$1" 2> /dev/null | cut -f1; }
sample() { # -> "rss1 rss2 rss3 dir1 dir2 dir3"
    local i out=()
    for i in 0 1 2; do out+=("$(rss_kib "${PIDS[$i]}")"); done
    for i in 1 2 3; do out+=("$(dir_bytes "$WORK/n$i")"); done
    echo "${out[*]}"
}
say "3 nodes, $DURABILITY, ${retain_flag[*]:-no retention}; 16 clients x 4 KiB records; target $GIB GiB"
first=$(bench 10)
base=($(sample))
rate=$(json_num records_per_s <<< "$first")
done_bytes=$(($(json_num acknowledged <<< "$first") * 4096))
target=$(awk -v g="$GIB" 'BEGIN {printf "%d", g * 1024 * 1024 * 1024}')
secs=$(awk -v t="$target" -v d="$done_bytes" -v r="$rate" 'BEGIN {s = (t - d) / (r * 4096); if (s < 10) s = 10; printf "%d", s}')
say "after 10 s: $rate records/s; RSS (KiB) ${base[0]} ${base[1]} ${base[2]}; running $secs s more"
bench "$secs" > "$WORK/second.json" &
bench_pid=$!
max=("${base[@]}")
while kill -0 "$bench_pid" 2> /dev/null; do
    now=($(sample))
    for k in 0 1 2 3 4 5; do ((now[k] > max[k])) && max[k]=${now[k]}; done
    sleep 1
done
wait "$bench_pid"
end=($(sample))
total=$(($(json_num acknowledged < "$WORK/second.json") * 4096 + done_bytes))
retain=$(numfmt --from=auto "${RETAIN%B}")
say "appended $(awk -v b="$total" 'BEGIN {printf "%.2f", b / 2^30}') GiB in all"
printf '| node | RSS after 10 s | largest RSS after | ratio | RSS at end | largest data dir | ÷ retention (%s) |\n' "$RETAIN"
printf '|---|---|---|---|---|---|---|\n'
for i in 0 1 2; do
    awk -v n=$((i + 1)) -v b="${base[$i]}" -v m="${max[$i]}" -v e="${end[$i]}" -v d="${max[$((i + 3))]}" -v r="$retain" \
        'BEGIN {printf "| %d | %.0f MiB | %.0f MiB | %.2fx | %.0f MiB | %.0f MiB | %.2fx |\n", n, b/1024, m/1024, m/b, e/1024, d/2^20, d/r}'
done
first_index=$("$BIN" status --endpoints "$endpoints" --json | json_num first_index || true)
say "first index kept at the end: ${first_index:-(not reported)}"
