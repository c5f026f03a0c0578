//! The bootstrap handshake (`ringraft_transport::handshake`), the first
//! bytes any peer sends, before it proved anything: one side of it, server
//! or client, against a byte stream from the input (`input[0]` chooses the
//! side, and whether a real counterpart first proves the cluster secret so
//! that the input's bytes reach the messages after authentication; see
//! `ringraft_transport::fuzzing::run_handshake`).
//!
//! Must hold: no panic, no hang; nothing is accepted and nothing revealed
//! unless the peer proved the secret; what the side under test accepts is
//! what the proven peer sent; a server's endpoint decoders (both backends'
//! descriptions) take or refuse whatever a proven peer revealed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_fuzz::{decode_qp_endpoint, runtime};
use ringraft_transport::fuzzing::{
    COUNTERPART_NODE_ID, UNDER_TEST_REVEAL, decode_soft_endpoint, run_handshake,
};

fuzz_target!(|input: &[u8]| {
    let run = runtime().block_on(run_handshake(input));
    let leaked = run
        .wrote
        .windows(UNDER_TEST_REVEAL.len())
        .any(|w| w == UNDER_TEST_REVEAL);
    if !run.proven {
        assert!(
            run.accepted.is_none(),
            "accepted a peer that did not prove the secret: {run:?}"
        );
        assert!(!run.revealed, "revealed to an unproven peer: {run:?}");
        assert!(!leaked, "the reveal reached an unproven peer: {run:?}");
    }
    if run.client_side && !run.revealed {
        assert!(!leaked, "sent what it reveals without revealing: {run:?}");
    }
    if let Some((node_id, reveal)) = &run.accepted {
        assert!(run.error.is_none());
        if !run.client_side {
            // The proven counterpart's hello named it.
            assert_eq!(*node_id, COUNTERPART_NODE_ID, "{run:?}");
            // What a device does next with the client's endpoint.
            if let Ok(again) = decode_soft_endpoint(&reveal.endpoint) {
                assert_eq!(decode_soft_endpoint(&again).ok(), Some(again.clone()));
            }
            if let Ok(again) = decode_qp_endpoint(&reveal.endpoint) {
                assert_eq!(again, reveal.endpoint, "the rdma description is exact");
            }
        } else {
            assert!(run.revealed, "accepted before revealing: {run:?}");
        }
    } else {
        assert!(run.error.is_some(), "neither accepted nor failed: {run:?}");
    }
});
