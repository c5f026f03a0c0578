#!/usr/bin/env bash
# Soft-RoCE VM lab — command-line front end to lib.sh (for people and for
# harnesses written in other languages). As root:
#
#   lab.sh setup
#   lab.sh loopback <cmd...>                      # one guest; exit status = cmd's
#   lab.sh multi <n> <cmd_1> ... <cmd_n>          # n guests, concurrently
#   lab.sh start <loopback|multi> <n> <cmd_1> ... # boot and return (prints LAB_RUN=...)
#   lab.sh wait [timeout_s] | stop [timeout_s] | kill
#   lab.sh exec [-t timeout_s] <i> <cmd...>       # run a command in running guest i
#   lab.sh cut <i> <j> | heal <i> <j> | isolate <i> | rejoin <i>
#   lab.sh hmp <i> <monitor command>              # e.g. "info network"
#   lab.sh crash <i> | boot <i> <cmd>             # power guest i off; boot it again
#   lab.sh status
#
# Commands on a running lab use $LAB_RUN if set, else the newest run folder
# in the cache that is not stopped. `start` leaves the guests running after
# this script exits (no trap; they are still bounded by LAB_TIMEOUT +
# LAB_BOOT_TIMEOUT + 120 s through timeout(1)); end them with stop or kill.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

find_run() {
    [ -n "${LAB_RUN:-}" ] && return 0
    local d
    for d in $(ls -1dt "$LAB_CACHE"/runs/*/ 2>/dev/null); do
        d=${d%/}
        if [ -f "$d/lab.env" ] && [ ! -e "$d/stopped" ]; then LAB_RUN=$d; export LAB_RUN; return 0; fi
    done
    echo "no running lab in $LAB_CACHE/runs (set LAB_RUN)" >&2
    exit 1
}

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
case "$cmd" in
    setup)    lab_setup ;;
    loopback) [ $# -ge 1 ] || usage; lab_run_loopback "$@" ;;
    multi)    [ $# -ge 2 ] || usage; lab_run_multi "$@" ;;
    start)    [ $# -ge 3 ] || usage
              LAB_NO_TRAP=1 lab_start "$@" || exit 1
              echo "LAB_RUN=$LAB_RUN" ;;
    wait)     find_run; lab_wait "${1:-$LAB_TIMEOUT}" ;;
    stop)     find_run; lab_stop "${1:-60}" ;;
    kill)     find_run; lab_kill ;;
    exec)     [ $# -ge 2 ] || usage; find_run; lab_exec "$@" ;;
    cut|heal) [ $# = 2 ] || usage; find_run; "lab_$cmd" "$1" "$2" ;;
    isolate|rejoin|crash) [ $# = 1 ] || usage; find_run; "lab_$cmd" "$1" ;;
    boot)     [ $# = 2 ] || usage; find_run; lab_boot "$1" "$2" ;;
    hmp)      [ $# = 2 ] || usage; find_run
              n0=$(wc -l < "$LAB_RUN/g$1.monitor.log")
              lab_hmp "$1" "$2" && sleep 1 &&       # the answer, without readline echo
                  tail -n +"$((n0 + 1))" "$LAB_RUN/g$1.monitor.log" | grep -v $'\e' | grep -v '^(qemu)' ;;
    status)   find_run; . "$LAB_RUN/lab.env"
              echo "LAB_RUN=$LAB_RUN topology=$LAB_TOPOLOGY n=$LAB_N share=$LAB_SHARE kernel=${LAB_KVER:-?}"
              for ((i = 1; i <= LAB_N; i++)); do
                  printf 'guest %d %s: %s\n' "$i" "$(_lab_ip "$i")" \
                      "$(_lab_alive "$i" && echo running || echo stopped)$([ -f "$LAB_SHARE/g$i/rc" ] && echo ", status $(cat "$LAB_SHARE/g$i/rc")")"
              done ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
