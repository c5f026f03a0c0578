#!/usr/bin/env bash
# Soft-RoCE VM lab: the measurements quoted in README.md, reproducibly.
#
#   deploy/softroce-vm/bench.sh [loopback] [multi2] [multi2-smp2] [multi3]
#
# loopback     one guest (LAB_LOOPBACK_SMP vCPUs), client+server on rxe0:
#              ib_write_lat, ib_read_lat, ib_atomic_lat CAS and FETCH_ADD, ib_write_bw
# multi2       two guests (LAB_MULTI_SMP vCPUs each) on the host bridge:
#              ib_write_lat, ib_read_lat, ib_write_bw from guest 2 to guest 1
# multi2-smp2  the same with 2 vCPUs per guest
# multi3       boot time of three guests, ib_write_lat 3 -> 1
# Prints guest boot times (QEMU start to rxe0 ACTIVE + agent up) and, per
# test, perftest's t_typical / t_avg / t_99% (µs) or BW peak / average (MB/s).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
export LAB_QUIET=1
: "${LAB_TIMEOUT:=400}"

ROWS=()

parse() {   # <label> <file>: one summary row from a perftest output
    local label=$1 f=$2 line
    line=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$f" 2>/dev/null | tail -n1)
    if [ -z "$line" ]; then ROWS+=("$(printf '%-34s FAILED (see %s)' "$label" "$f")"); return; fi
    set -- $line
    if [ $# -ge 8 ]; then    # latency: bytes iters t_min t_max t_typical t_avg t_stdev 99% 99.9%
        ROWS+=("$(printf '%-34s typical %8s us  avg %8s us  99%% %9s us' "$label" "$5" "$6" "$8")")
    else                     # bandwidth: bytes iters peak avg msgrate
        ROWS+=("$(printf '%-34s peak %7s MB/s  avg %7s MB/s (%s B x %s)' "$label" "$3" "$4" "$1" "$2")")
    fi
}
boots() {   # <label>
    local i b=""
    for ((i = 1; i <= LAB_N; i++)); do b+=" g$i=$(cat "$LAB_RUN/g$i.boot" 2>/dev/null || echo ?)s"; done
    ROWS+=("$(printf '%-34s%s' "$1 boot (to ready)" "$b")")
}

bench_loopback() {
    lab_run_loopback '
        pt_pair 60 ib_write_lat > "$LAB_RESULTS/write_lat.txt" 2>&1
        pt_pair 60 ib_read_lat > "$LAB_RESULTS/read_lat.txt" 2>&1
        pt_pair 60 ib_atomic_lat -A CMP_AND_SWAP > "$LAB_RESULTS/cas_lat.txt" 2>&1
        pt_pair 60 ib_atomic_lat -A FETCH_AND_ADD > "$LAB_RESULTS/fa_lat.txt" 2>&1
        pt_pair 90 ib_write_bw -n 1000 > "$LAB_RESULTS/write_bw.txt" 2>&1
        pt_pair 90 ib_write_bw -n 2000 -s 4096 > "$LAB_RESULTS/write_bw4k.txt" 2>&1'
    local tag="loopback smp=$LAB_LOOPBACK_SMP"
    boots "$tag"
    for t in write_lat read_lat cas_lat fa_lat write_bw write_bw4k; do parse "$tag $t" "$LAB_SHARE/g1/$t.txt"; done
}

bench_multi() {   # <n> <label>
    local n=$1 tag=$2 cmds=() i
    local srv='pt_server 90 ib_write_lat; pt_server 90 ib_read_lat; pt_server 120 ib_write_bw -n 500'
    local cli='pt_client 90 $(lab_peer_ip 1) ib_write_lat > $LAB_RESULTS/write_lat.txt 2>&1
               pt_client 90 $(lab_peer_ip 1) ib_read_lat > $LAB_RESULTS/read_lat.txt 2>&1
               pt_client 120 $(lab_peer_ip 1) ib_write_bw -n 500 > $LAB_RESULTS/write_bw.txt 2>&1'
    cmds=("$srv")
    for ((i = 2; i < n; i++)); do cmds+=("true"); done
    cmds+=("$cli")
    lab_run_multi "$n" "${cmds[@]}"
    boots "$tag"
    for t in write_lat read_lat write_bw; do parse "$tag $t ($n->1)" "$LAB_SHARE/g$n/$t.txt"; done
}

sel=("$@"); [ ${#sel[@]} -gt 0 ] || sel=(loopback multi2 multi2-smp2 multi3)
lab_setup >/dev/null || exit 1
t0=$SECONDS
for s in "${sel[@]}"; do
    case "$s" in
        loopback)    bench_loopback ;;
        multi2)      bench_multi 2 "multi2 smp=$LAB_MULTI_SMP" ;;
        multi2-smp2) LAB_MULTI_SMP=2 bench_multi 2 "multi2 smp=2" ;;
        multi3)      bench_multi 3 "multi3 smp=$LAB_MULTI_SMP" ;;
        *) echo "unknown: $s" >&2; exit 2 ;;
    esac
done
echo
echo "==== Soft-RoCE VM lab measurements ($(nproc) host cores, load $(cut -d' ' -f1-3 /proc/loadavg), $((SECONDS - t0))s)"
printf '%s\n' "${ROWS[@]}"
