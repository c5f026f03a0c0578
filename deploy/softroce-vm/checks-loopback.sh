#!/usr/bin/env bash
# Verbs checks on ONE rxe device (client and server on the same device):
# rxe port PORT_ACTIVE with atomics, then perftest write/read/atomic latency
# and write bandwidth. Run inside a loopback lab guest by run-tests.sh, or
# directly on a host with rdma_rxe by `softroce-host.sh --test`.
# Needs LAB_RXE, LAB_GID_INDEX, LAB_IP (an address of the rxe netdev) and
# LAB_RESULTS (where lab_check records PASS/FAIL lines).
# shellcheck source=guest-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/guest-lib.sh"
T=${PT_TIMEOUT:-60}
rc=0
lab_check devinfo           lab_devinfo_check                                || rc=1
lab_check ib_write_lat      pt_pair "$T" ib_write_lat                        || rc=1
lab_check ib_read_lat       pt_pair "$T" ib_read_lat                         || rc=1
lab_check ib_atomic_lat_cas pt_pair "$T" ib_atomic_lat -A CMP_AND_SWAP       || rc=1
lab_check ib_atomic_lat_fa  pt_pair "$T" ib_atomic_lat -A FETCH_AND_ADD      || rc=1
lab_check ib_write_bw       pt_pair "$T" ib_write_bw -n 1000                 || rc=1
exit "$rc"
