#!/usr/bin/env bash
# The project's test command (README: "Run the tests"):
#  1. every crate's unit, property and integration tests (cargo test),
#     among them the daemon's end-to-end tests and a Jepsen run on loopback
#     in which a planted bug must be caught; then the simulator
#     (ringraft-sim) with its planted bugs, each of which it must find;
#  2. the Soft-RoCE VM lab (deploy/softroce-vm/run-tests.sh): real verbs in
#     QEMU guests, the rdma backend's conformance suite in one guest and
#     across two, link cuts, the stale-leader scenario across three guests;
#  3. the quick Jepsen runs (jepsen/run.sh --quick): network namespaces with
#     the tcp fabric, one run on Soft-RoCE guests, the planted-bug run.
# 2 and 3 need root (bridges, namespaces, iptables, QEMU) and install nothing
# beyond what .ci/run installs. RINGRAFT_SKIP_LAB=1 skips them, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
# The simulator must find each of its planted bugs (a build with the
# test-only planted-bugs feature; release: a few seconds per bug).
cargo test --locked --release -p ringraft-sim --features planted-bugs --test planted
if [ "${RINGRAFT_SKIP_LAB:-0}" = 1 ]; then
    echo "WARNING: RINGRAFT_SKIP_LAB=1: the Soft-RoCE lab (rdma backend) and the Jepsen runs were NOT tested" >&2
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "the Soft-RoCE lab and the Jepsen runs need root; run as root, or set RINGRAFT_SKIP_LAB=1 to skip them" >&2
    exit 1
fi
deploy/softroce-vm/run-tests.sh
jepsen/run.sh --quick
