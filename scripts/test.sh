#!/usr/bin/env bash
# The project's test command (README: "Run the tests"):
#  1. every crate's unit, property and integration tests (cargo test);
#  2. the Soft-RoCE VM lab (deploy/softroce-vm/run-tests.sh): real verbs in
#     QEMU guests, the rdma backend's conformance suite in one guest and
#     across two, link cuts. It needs root (bridges, taps, QEMU) and installs
#     its Debian packages itself. RINGRAFT_SKIP_LAB=1 skips it, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
if [ "${RINGRAFT_SKIP_LAB:-0}" = 1 ]; then
    echo "WARNING: RINGRAFT_SKIP_LAB=1: the Soft-RoCE lab (rdma backend) was NOT tested" >&2
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "the Soft-RoCE lab needs root; run as root, or set RINGRAFT_SKIP_LAB=1 to skip it" >&2
    exit 1
fi
deploy/softroce-vm/run-tests.sh
