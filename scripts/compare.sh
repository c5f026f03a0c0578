#!/usr/bin/env bash
# ringraft and etcd 3.4 side by side on this machine (issue 11, item 7).
#
# Fetches etcd 3.4 from Debian's packages (apt-get download + dpkg -x into
# target/compare/, no system install; reused when present), builds ringraft
# and the load generator (crate compare/, ringraft-compare) in release, then,
# for every round, durability, client count and record size: starts 3 etcd
# members on loopback, runs the closed-loop workload, stops them; starts 3
# `ringraft serve` nodes on loopback (tcp fabric), runs the same workload,
# stops them (which of the two goes first alternates from round to round).
# Every workload gets fresh clusters and fresh data directories. Each round
# also measures the physical floor (one 4 KiB pwrite+fdatasync in the data
# directories' filesystem, one loopback TCP round trip).
#
# Prints the table (ringraft ÷ etcd ratios; a latency ratio below 1 and a
# throughput ratio above 1 mean ringraft is better) and writes it as
# markdown (path printed; the raw results sit beside it as .jsonl).
#
# Every process it started and its temp dir are removed on exit, error or
# Ctrl-C. Not run by CI (it takes ~10 minutes).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/compare.sh [options]

  --quick              a 1-2 minute smoke run (1 round, 1 s warm-up, 3 s measured,
                       fewer floor iterations); later options still override
  --rounds N           rounds (default 2)
  --warmup S           seconds of load before measuring, per workload (default 2)
  --duration S         seconds measured per workload (default 10)
  --clients "1 64"     client counts
  --sizes "64 4096"    record sizes, bytes (or 4KiB, ...)
  --durabilities "fsync memory"
                       fsync: ringraft --durability fsync vs etcd's default;
                       memory: ringraft --durability memory vs etcd --unsafe-no-fsync
  --dir PARENT         where the temp dir with the data dirs goes (default $TMPDIR or /tmp)
  --base-port P        ports P+1..P+33 on 127.0.0.1 are used (default 24100)
  --ready-timeout S    bound on a cluster coming up (default 60)
  --out FILE           markdown output (default target/compare/compare-<time>.md)
  --keep               keep the temp dir (data dirs and logs) afterwards
EOF
}

say() { printf '[compare] %s\n' "$*"; }
die() {
    printf '[compare] error: %s\n' "$*" >&2
    exit 1
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
CACHE="$ROOT/target/compare"
ORIGINAL_ARGS="$*"

ROUNDS=2
WARMUP=2
DURATION=10
CLIENTS="1 64"
SIZES="64 4096"
DURABILITIES="fsync memory"
PARENT="${TMPDIR:-/tmp}"
BASE_PORT=24100
READY_TIMEOUT=60
OUT=""
KEEP=0
FSYNC_ITERATIONS=2000
RTT_ITERATIONS=20000

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (--help)"; }
while [[ $# -gt 0 ]]; do
    case $1 in
    --quick)
        ROUNDS=1 WARMUP=1 DURATION=3 FSYNC_ITERATIONS=500 RTT_ITERATIONS=5000
        shift
        ;;
    --rounds | --warmup | --duration | --clients | --sizes | --durabilities | --dir | --base-port | --ready-timeout | --out)
        need_value "$@"
        case $1 in
        --rounds) ROUNDS=$2 ;;
        --warmup) WARMUP=$2 ;;
        --duration) DURATION=$2 ;;
        --clients) CLIENTS=$2 ;;
        --sizes) SIZES=$2 ;;
        --durabilities) DURABILITIES=$2 ;;
        --dir) PARENT=$2 ;;
        --base-port) BASE_PORT=$2 ;;
        --ready-timeout) READY_TIMEOUT=$2 ;;
        --out) OUT=$2 ;;
        esac
        shift 2
        ;;
    --keep)
        KEEP=1
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        usage >&2
        die "unknown argument: $1"
        ;;
    esac
done

is_count() { [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= $2)); }
is_count "$ROUNDS" 1 || die "--rounds $ROUNDS: a whole number >= 1"
is_count "$WARMUP" 0 || die "--warmup $WARMUP: a whole number of seconds"
is_count "$DURATION" 1 || die "--duration $DURATION: a whole number of seconds >= 1"
is_count "$READY_TIMEOUT" 1 || die "--ready-timeout $READY_TIMEOUT: a whole number of seconds >= 1"
is_count "$BASE_PORT" 1024 && ((BASE_PORT + 40 < 65536)) || die "--base-port $BASE_PORT: in 1024..65495"
for d in $DURABILITIES; do
    [[ $d == fsync || $d == memory ]] || die "--durabilities: $d is neither fsync nor memory"
done
[[ -d $PARENT ]] || die "--dir $PARENT is not a directory"

mkdir -p "$CACHE"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
[[ -n $OUT ]] || OUT="$CACHE/compare-$STAMP.md"
RESULTS="${OUT%.md}.jsonl"
mkdir -p "$(dirname "$OUT")"
: >"$RESULTS"

# --- processes and cleanup --------------------------------------------------

WORK=""
CLUSTER_PIDS=()
CLUSTER_DIR=""
CLUSTER_LOGS=()

# One member at a time: a stopping etcd leader first hands leadership to a
# live member, which takes 7 s to time out when every member stops at once.
stop_cluster() {
    local pid deadline
    for pid in "${CLUSTER_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "pid $pid did not exit within 15 s of SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    CLUSTER_PIDS=()
    if [[ -n $CLUSTER_DIR && $KEEP == 0 ]]; then
        rm -rf "$CLUSTER_DIR"
    fi
    # The rings live in shared memory, in a ring dir of this run's own.
    if [[ -n $RING_DIR ]]; then
        rm -rf "$RING_DIR"
        RING_DIR=""
    fi
    CLUSTER_DIR=""
    CLUSTER_LOGS=()
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_cluster
    if [[ -n $WORK ]]; then
        if [[ $KEEP == 1 ]]; then
            say "kept $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
    exit "$rc"
}
RING_DIR=""
trap cleanup EXIT
trap 'printf "\n[compare] interrupted\n" >&2; exit 130' INT TERM

show_logs() {
    local log
    for log in "${CLUSTER_LOGS[@]}"; do
        printf '[compare] --- last lines of %s\n' "$log" >&2
        tail -n 15 "$log" >&2 || true
    done
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_ports() {
    local port
    for port in "$@"; do
        if port_busy "$port"; then
            die "port $port on 127.0.0.1 is busy (something listens there); choose other ports with --base-port"
        fi
    done
}

check_alive() {
    local pid k=0
    for pid in "${CLUSTER_PIDS[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            show_logs
            die "a member (pid $pid, log ${CLUSTER_LOGS[$k]}) exited early"
        fi
        k=$((k + 1))
    done
}

# --- etcd 3.4 from Debian's packages ----------------------------------------

ETCD_DIR="$CACHE/etcd-3.4"
ETCD="$ETCD_DIR/usr/bin/etcd"
if [[ ! -x $ETCD ]]; then
    command -v apt-get >/dev/null || die "apt-get not found: etcd 3.4 comes from Debian's etcd-server package"
    command -v dpkg >/dev/null || die "dpkg not found"
    say "fetching etcd-server from Debian's packages into $ETCD_DIR"
    download="$(mktemp -d "$CACHE/download.XXXXXX")"
    if ! (cd "$download" && apt-get download etcd-server >apt.log 2>&1); then
        cat "$download/apt.log" >&2
        rm -rf "$download"
        die "apt-get download etcd-server failed (no package lists? run apt-get update)"
    fi
    rm -rf "$ETCD_DIR.partial"
    dpkg -x "$download"/etcd-server_*.deb "$ETCD_DIR.partial"
    rm -rf "$download"
    mv "$ETCD_DIR.partial" "$ETCD_DIR"
fi
ETCD_VERSION="$("$ETCD" --version | awk '/^etcd Version:/ {print $3}')"
[[ $ETCD_VERSION == 3.4.* ]] || die "$ETCD is etcd $ETCD_VERSION, not 3.4 (remove $ETCD_DIR to fetch again)"
say "etcd $ETCD_VERSION: $ETCD"

# --- ringraft and the load generator ----------------------------------------

say "building ringraft and ringraft-compare (release)"
(cd "$ROOT" && cargo build --release --locked -p ringraft-cli -p ringraft-compare)
RINGRAFT="$TARGET_DIR/release/ringraft"
COMPARE="$TARGET_DIR/release/ringraft-compare"
[[ -x $RINGRAFT && -x $COMPARE ]] || die "the build did not produce $RINGRAFT and $COMPARE"
RINGRAFT_VERSION="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"

# --- the run ----------------------------------------------------------------

WORK="$(mktemp -d "$PARENT/ringraft-compare.XXXXXX")"
FSTYPE="$(df --output=fstype "$WORK" | tail -n 1)"
DEVICE="$(df --output=source "$WORK" | tail -n 1)"
CPU_MODEL="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)"
MEM_GIB="$(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)"
LOAD_AT_START="$(cut -d' ' -f1-3 /proc/loadavg)"
say "work dir $WORK ($FSTYPE on $DEVICE)"

ETCD_CLIENT_PORTS=($((BASE_PORT + 1)) $((BASE_PORT + 2)) $((BASE_PORT + 3)))
ETCD_PEER_PORTS=($((BASE_PORT + 11)) $((BASE_PORT + 12)) $((BASE_PORT + 13)))
RAFT_PORTS=($((BASE_PORT + 21)) $((BASE_PORT + 22)) $((BASE_PORT + 23)))
CLIENT_PORTS=($((BASE_PORT + 31)) $((BASE_PORT + 32)) $((BASE_PORT + 33)))

join_endpoints() {
    local IFS=,
    local list=()
    local port
    for port in "$@"; do list+=("127.0.0.1:$port"); done
    echo "${list[*]}"
}

ENDPOINTS=""
start_etcd() { # durability tag
    local durability=$1 tag=$2 i cluster="" extra=()
    check_ports "${ETCD_CLIENT_PORTS[@]}" "${ETCD_PEER_PORTS[@]}"
    CLUSTER_DIR="$WORK/etcd-$tag"
    mkdir -p "$CLUSTER_DIR"
    for i in 0 1 2; do
        cluster+="${cluster:+,}m$((i + 1))=http://127.0.0.1:${ETCD_PEER_PORTS[$i]}"
    done
    [[ $durability == memory ]] && extra=(--unsafe-no-fsync)
    for i in 0 1 2; do
        local log="$CLUSTER_DIR/m$((i + 1)).log"
        "$ETCD" --name "m$((i + 1))" --data-dir "$CLUSTER_DIR/m$((i + 1))" \
            --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORTS[$i]}" \
            --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORTS[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORTS[$i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORTS[$i]}" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "compare-$$-$tag" \
            --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) \
            --logger zap --log-outputs stderr --log-level warn \
            "${extra[@]}" >"$log" 2>&1 &
        CLUSTER_PIDS+=($!)
        CLUSTER_LOGS+=("$log")
    done
    ENDPOINTS="$(join_endpoints "${ETCD_CLIENT_PORTS[@]}")"
}

start_ringraft() { # durability tag
    local durability=$1 tag=$2 i peers=""
    check_ports "${RAFT_PORTS[@]}" "${CLIENT_PORTS[@]}"
    CLUSTER_DIR="$WORK/ringraft-$tag"
    mkdir -p "$CLUSTER_DIR"
    for i in 0 1 2; do
        peers+="${peers:+,}$((i + 1))=127.0.0.1:${RAFT_PORTS[$i]}"
    done
    RING_DIR="$(mktemp -d /dev/shm/ringraft-compare.XXXXXX)"
    for i in 0 1 2; do
        local log="$CLUSTER_DIR/n$((i + 1)).log" bootstrap=()
        ((i == 0)) && bootstrap=(--bootstrap)
        RUST_LOG=warn "$RINGRAFT" serve --id $((i + 1)) --data-dir "$CLUSTER_DIR/n$((i + 1))" \
            --ring-dir "$RING_DIR" \
            --listen "127.0.0.1:${RAFT_PORTS[$i]}" --client "127.0.0.1:${CLIENT_PORTS[$i]}" \
            --peers "$peers" --fabric tcp --durability "$durability" \
            "${bootstrap[@]}" >"$log" 2>&1 &
        CLUSTER_PIDS+=($!)
        CLUSTER_LOGS+=("$log")
    done
    ENDPOINTS="$(join_endpoints "${CLIENT_PORTS[@]}")"
}

run_workload() { # system durability round clients size
    local system=$1 durability=$2 round=$3 clients=$4 size=$5
    local tag="$durability-r$round-c$clients-s$size" started=$SECONDS
    "start_$system" "$durability" "$tag"
    check_alive
    if ! "$COMPARE" load --system "$system" --durability "$durability" --round "$round" \
        --endpoints "$ENDPOINTS" --clients "$clients" --size "$size" \
        --warmup-secs "$WARMUP" --duration-secs "$DURATION" \
        --ready-timeout-secs "$READY_TIMEOUT" --out "$RESULTS"; then
        show_logs
        die "the $system workload ($tag) failed"
    fi
    check_alive
    stop_cluster
    say "  ($system $tag: $((SECONDS - started)) s with start and stop)"
}

check_ports "${ETCD_CLIENT_PORTS[@]}" "${ETCD_PEER_PORTS[@]}" "${RAFT_PORTS[@]}" "${CLIENT_PORTS[@]}"
workloads=0
for _ in $DURABILITIES; do for _ in $CLIENTS; do for _ in $SIZES; do workloads=$((workloads + 1)); done; done; done
say "$ROUNDS round(s) x $workloads workload(s) x 2 systems, ${WARMUP} s warm-up + ${DURATION} s measured each"

for round in $(seq 1 "$ROUNDS"); do
    say "round $round: floor in $WORK"
    "$COMPARE" floor --dir "$WORK" --round "$round" --out "$RESULTS" \
        --fsync-iterations "$FSYNC_ITERATIONS" --rtt-iterations "$RTT_ITERATIONS"
    if ((round % 2 == 1)); then order="etcd ringraft"; else order="ringraft etcd"; fi
    for durability in $DURABILITIES; do
        for clients in $CLIENTS; do
            for size in $SIZES; do
                for system in $order; do
                    run_workload "$system" "$durability" "$round" "$clients" "$size"
                done
            done
        done
    done
done

LOAD_AT_END="$(cut -d' ' -f1-3 /proc/loadavg)"
MACHINE="$(nproc) CPUs${CPU_MODEL:+ ($CPU_MODEL)}, ${MEM_GIB} GiB RAM, kernel $(uname -r); data dirs on $FSTYPE ($DEVICE) under $PARENT; load average $LOAD_AT_START at start, $LOAD_AT_END at end"
SYSTEMS="ringraft $RINGRAFT_VERSION (release, tcp fabric, 3 nodes on loopback); etcd $ETCD_VERSION (Debian's etcd-server, 3 members on loopback); ${WARMUP} s warm-up + ${DURATION} s measured per workload and round, fresh clusters for each"
"$COMPARE" table --results "$RESULTS" --markdown "$OUT" \
    --command "scripts/compare.sh${ORIGINAL_ARGS:+ $ORIGINAL_ARGS}" \
    --date "$(date -u '+%Y-%m-%d %H:%M UTC')" --machine "$MACHINE" --systems "$SYSTEMS"
say "table written to $OUT (raw results: $RESULTS)"
