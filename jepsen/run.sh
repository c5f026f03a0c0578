#!/usr/bin/env bash
# Jepsen-style runs of ringraft (see jepsen/README.md). As root.
#
#   jepsen/run.sh --quick     # ~10 min: netns x 2 nemesis mixes, softroce x 1 (skip with
#                             # RINGRAFT_SKIP_LAB=1), planted bug (must be caught)
#   jepsen/run.sh --long      # longer runs, every nemesis, 5 nodes on netns
#
# Builds (release, one target dir): ringraft-jepsen, and the daemon three
# ways (normal; with the planted bugs; for softroce with rdma), copied to
# target/jepsen-bins. Runs go to $RINGRAFT_JEPSEN_OUT (default target/jepsen/<date>).
# Exit status: 0 when every normal run is valid and the planted run is
# flagged; 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=${1:---quick}
case "$MODE" in --quick|--long) ;; *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (network namespaces, iptables, the lab)" >&2; exit 2; }
OUT=${RINGRAFT_JEPSEN_OUT:-$ROOT/target/jepsen/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

build() { echo "+ cargo build --release --locked $*" >&2; cargo build --release --locked "$@" >&2 || exit 1; }
# One target directory for every variant (they share all dependencies); each
# variant's daemon is copied out before the next build overwrites it.
BINS=$ROOT/target/jepsen-bins
mkdir -p "$BINS"
build -p ringraft-cli --bin ringraft --features ringraft/planted-bugs
cp target/release/ringraft "$BINS/ringraft-planted"
# The softroce substrate needs the lab (root, QEMU): RINGRAFT_SKIP_LAB=1 skips it.
SOFTROCE=1
if [ "${RINGRAFT_SKIP_LAB:-0}" = 1 ]; then SOFTROCE=0; fi
if [ $SOFTROCE = 1 ]; then
    build -p ringraft-cli --bin ringraft --features rdma
    cp target/release/ringraft "$BINS/ringraft-rdma"
fi
build -p ringraft-jepsen -p ringraft-cli
cp target/release/ringraft "$BINS/ringraft"
JEPSEN=$ROOT/target/release/ringraft-jepsen
NORMAL=$BINS/ringraft
PLANTED=$BINS/ringraft-planted
RDMA=$BINS/ringraft-rdma

SUMMARY=()
FAILED=0
# run <name> <expect: valid|flagged> <args...>
run() {
    local name=$1 expect=$2; shift 2
    local dir=$OUT/$name
    echo "=== $name: ringraft-jepsen run $* --out $dir" >&2
    timeout 1800 "$JEPSEN" run "$@" --out "$dir" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr"
    local rc=$?
    local verdict ops
    case $rc in 0) verdict=valid ;; 1) verdict=INVALID ;; *) verdict="ERROR($rc)" ;; esac
    ops=$(grep -m1 '^Checked:' "$dir/report.txt" 2>/dev/null || echo "no report")
    local anomalies
    anomalies=$(grep -m1 '^Anomalies' "$dir/report.txt" 2>/dev/null || echo "")
    local ok=no
    if [ "$expect" = valid ] && [ $rc = 0 ]; then ok=yes; fi
    if [ "$expect" = flagged ] && [ $rc = 1 ]; then ok=yes; fi
    [ $ok = yes ] || FAILED=1
    SUMMARY+=("$(printf '%-22s %-9s expect %-7s -> %-10s %s | %s | %s' "$name" \
        "$(sed -n 's/.*"substrate": *"\([a-z]*\)".*/\1/p' "$dir/run.json" 2>/dev/null | head -1)" \
        "$expect" "$verdict" "$(tr -d '\n ' <"$dir/run.json" 2>/dev/null | sed -n 's/.*"nemeses":\(\[[^]]*\]\).*/\1/p')" \
        "$ops" "$anomalies")")
    tail -3 "$OUT/$name.stderr" >&2
}

if [ "$MODE" = --quick ]; then
    run netns-partition-kill valid --substrate netns --nodes 3 --duration 30 --clients 4 --seed 11 \
        --nemesis partition,kill,pause --ringraft-bin "$NORMAL"
    run netns-mixed valid --substrate netns --nodes 3 --duration 30 --clients 4 --seed 12 \
        --nemesis partition,corrupt,membership,transfer --ringraft-bin "$NORMAL"
    if [ $SOFTROCE = 1 ]; then
        run softroce-kill-partition valid --substrate softroce --nodes 3 --duration 60 --clients 2 --seed 13 \
            --nemesis partition,kill,pause --ringraft-bin "$RDMA" --converge-timeout 180
        # The stale leader on real verbs (the freeze nemesis) runs in the lab:
        # deploy/softroce-vm/run-tests.sh multi3_stale_leader(_current).
    fi
    # (with the bug the nodes never agree: don't wait long for it)
    run planted-ack-before-repl flagged --substrate netns --nodes 3 --duration 20 --clients 4 --seed 14 \
        --nemesis kill,partition --ringraft-bin "$PLANTED" --planted-bug ack-before-replication \
        --converge-timeout 15
else
    for seed in 21 22 23; do
        run "netns-all-$seed" valid --substrate netns --nodes 5 --duration 300 --clients 8 --seed $seed \
            --nemesis all --ringraft-bin "$NORMAL"
    done
    if [ $SOFTROCE = 1 ]; then
        run softroce-all valid --substrate softroce --nodes 3 --duration 300 --clients 3 --seed 24 \
            --nemesis all --ringraft-bin "$RDMA" --converge-timeout 300
    fi
    run planted-ack-before-repl flagged --substrate netns --nodes 3 --duration 60 --clients 4 --seed 25 \
        --nemesis kill,partition,pause --ringraft-bin "$PLANTED" --planted-bug ack-before-replication
fi

echo
echo "ringraft-jepsen $MODE summary (runs in $OUT):"
printf '  %s\n' "${SUMMARY[@]}"
if [ $FAILED = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $FAILED
