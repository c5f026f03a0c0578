#!/usr/bin/env bash
# Fuzzes every decoder of outside input: the targets of fuzz/ (handshake,
# frames, endpoints, control messages, entry batches, ring payloads,
# snapshot bodies, client requests) and of wal/fuzz (check, open, adopt,
# segments), each for a fixed budget, from a seed corpus made at run time
# of real traffic and the real encoders (fuzz/seed.sh, wal/fuzz/seed.sh).
# Prints per target the executions, the coverage (libFuzzer's final
# `#N DONE cov: X ft: Y` line) and the time, and exits non-zero if any
# target crashed (its input is then in CRATE/artifacts/TARGET/).
#
#   scripts/fuzz.sh                  short budget (CI): 10 s per target
#   scripts/fuzz.sh --long           600 s per target
#   scripts/fuzz.sh --seconds N      N s per target
#   scripts/fuzz.sh ... TARGET...    only these targets (names as below)
#
# Env: FUZZ_JOBS targets at once (default: the number of cores);
# FUZZ_NO_BUILD=1 runs the binaries built before (no seeds, no build).
# Needs a nightly toolchain (libFuzzer's instrumentation); without one it
# says so and exits 0. Installs cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=10
selected=()
while [ $# -gt 0 ]; do
    case "$1" in
        --long) seconds=600 ;;
        --seconds) seconds="$2"; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
        *) selected+=("$1") ;;
    esac
    shift
done

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "fuzz: no nightly toolchain (rustup toolchain install nightly): fuzzing skipped"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# crate directory : targets : libFuzzer's -max_len
plan=(
    "fuzz:handshake frames endpoints messages entries entry snapshot client_requests:65536"
    "wal/fuzz:check open adopt:65536"
    "wal/fuzz:segments:40000"
)

wanted() {
    [ ${#selected[@]} -eq 0 ] && return 0
    local t
    for t in "${selected[@]}"; do [ "$t" = "$1" ] && return 0; done
    return 1
}

logs="$root/fuzz/target/fuzz-logs"
rm -rf "$logs"
mkdir -p "$logs"

# Seeds and builds, once per crate; the targets then run as built (a
# source changed meanwhile does not rebuild them).
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
declare -A built=()
for entry in "${plan[@]}"; do
    IFS=: read -r dir targets _ <<<"$entry"
    for t in $targets; do
        wanted "$t" || continue
        if [ -z "${built[$dir]:-}" ] && [ -z "${FUZZ_NO_BUILD:-}" ]; then
            echo "fuzz: seeds and build of $dir"
            (cd "$dir" && ./seed.sh && cargo +nightly fuzz build)
        fi
        built[$dir]=1
    done
done

run_one() {
    local dir=$1 target=$2 max_len=$3
    local log="$logs/$target.log"
    local start end status=0
    start=$(date +%s)
    # Fresh inputs go to a scratch corpus (the seeds stay as made).
    local scratch="$root/$dir/target/fuzz-corpus/$target"
    rm -rf "$scratch"
    mkdir -p "$scratch" "$root/$dir/artifacts/$target"
    (cd "$dir" && "target/$triple/release/$target" \
        -artifact_prefix="$root/$dir/artifacts/$target/" \
        -max_total_time="$seconds" -max_len="$max_len" -timeout=20 \
        -print_final_stats=1 "$scratch" "corpus/$target") >"$log" 2>&1 || status=$?
    end=$(date +%s)
    echo "$status $((end - start))" >"$log.status"
}

jobs_max=${FUZZ_JOBS:-$(nproc)}
for entry in "${plan[@]}"; do
    IFS=: read -r dir targets max_len <<<"$entry"
    for t in $targets; do
        wanted "$t" || continue
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
        echo "fuzz: $dir $t (${seconds} s)"
        run_one "$dir" "$t" "$max_len" &
    done
done
wait
# A wal target that crashed left its scratch data directories behind (in
# /dev/shm: wal/fuzz/src/lib.rs, scratch_dir).
rm -rf /dev/shm/ringraft-wal-fuzz-*

failed=0
printf '\n%-16s %12s %8s %8s %6s  %s\n' target executions cov ft secs result
for entry in "${plan[@]}"; do
    IFS=: read -r dir targets _ <<<"$entry"
    for t in $targets; do
        wanted "$t" || continue
        log="$logs/$t.log"
        read -r status secs <"$log.status"
        done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
        execs=$(grep -oE '^stat::number_of_executed_units: [0-9]+' "$log" | awk '{print $2}' || true)
        cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
        ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$done_line")
        if [ "$status" -eq 0 ]; then
            result=ok
        else
            result="CRASH (exit $status): see $log and $dir/artifacts/$t/"
            failed=1
        fi
        printf '%-16s %12s %8s %8s %6s  %s\n' "$t" "${execs:--}" "${cov:--}" "${ft:--}" "$secs" "$result"
        [ -n "$done_line" ] && echo "    $done_line"
    done
done
if [ "$failed" -ne 0 ]; then
    echo "fuzz: a target crashed" >&2
    for log in "$logs"/*.log; do
        grep -qE '^(==[0-9]+==ERROR|.*panicked at)' "$log" || continue
        echo "---- $log" >&2
        grep -E -A12 'panicked at|==ERROR' "$log" | head -40 >&2
    done
    exit 1
fi
echo "fuzz: no crash"
