#!/usr/bin/env bash
# `ringraft append` from stdin against a local 3-node cluster (release
# build, tcp fabric, loopback): RECORDS lines of 63 bytes piped in, timed
# as a whole process by farm-bench (median of RUNS), optionally side by
# side with another `ringraft` binary against the same cluster (its
# `append` as the yardstick B: the ratio is pipelined / other).
#
#   scripts/append-stdin.sh RECORDS [OTHER_BIN] [serve flags...]
#
# Env: BASE_PORT (default 27700), RUNS (default 5), ENDPOINT (1..3: the
# client's only endpoint is that node; default: all three, in order).
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:?usage: scripts/append-stdin.sh RECORDS [OTHER_BIN] [serve flags...]}
shift
other=""
if [[ $# -gt 0 && $1 != -* ]]; then
    other=$(realpath "$1")
    shift
fi
BASE_PORT=${BASE_PORT:-27700}
RUNS=${RUNS:-5}
# shellcheck source=local-cluster.sh
. scripts/local-cluster.sh

local_cluster_start append-stdin "${TMPDIR:-/tmp}" "$BASE_PORT" --durability memory "$@"
input="$WORK/input"
# 63-byte records: a counter padded with x.
seq -f '%063g' 1 "$records" | tr ' ' x > "$input"
endpoints=$ENDPOINTS
if [[ -n ${ENDPOINT:-} ]]; then
    endpoints=127.0.0.1:$((BASE_PORT + 10 + ENDPOINT))
fi
run() { echo "sh -c 'exec $1 append --endpoints $endpoints < $input > /dev/null'"; }
echo "append-stdin: $records records of 63 B, leader $LEADER, endpoints $endpoints" >&2
if [[ -n $other ]]; then
    eval "farm-bench -n $RUNS --timeout 3600 --vs \"$(run "$other")\" -- $(run "$BIN")"
else
    eval "farm-bench -n $RUNS --timeout 3600 -- $(run "$BIN")"
fi
"$BIN" status --endpoints "$ENDPOINTS" --json | grep -o '"commit_index": *[0-9]*' >&2
