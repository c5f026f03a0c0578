//! The endpoint descriptions a peer reveals in the handshake (after it
//! proved the secret): the software RNIC's (`SoftEndpoint::decode`,
//! bincode) and the rdma backend's (`QpEndpoint::decode`, 33 fixed bytes).
//!
//! Must hold: no panic; what is accepted is within the documented bounds
//! and encodes back: the software description to bytes that decode to the
//! same, the rdma description to exactly the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_fuzz::{QP_ENDPOINT_BYTES, decode_qp_endpoint, qp_endpoint_fields};
use ringraft_transport::fuzzing::decode_soft_endpoint;

fuzz_target!(|input: &[u8]| {
    if let Ok(again) = decode_soft_endpoint(input) {
        assert!(again.len() <= input.len(), "canonical bytes are no longer");
        assert_eq!(decode_soft_endpoint(&again).ok(), Some(again.clone()));
    }
    if let Ok(again) = decode_qp_endpoint(input) {
        assert_eq!(again, input, "the rdma description is exact");
        assert_eq!(input.len(), QP_ENDPOINT_BYTES);
        let (qpn, psn, mtu, recv_buffer_bytes, rd_atomic) =
            qp_endpoint_fields(input).expect("decoded once");
        assert!(
            (1..=0xFF_FFFF).contains(&qpn) && psn <= 0xFF_FFFF,
            "{qpn} {psn}"
        );
        assert!((1..=5).contains(&mtu) && rd_atomic > 0);
        assert!((1..=16 << 20).contains(&recv_buffer_bytes));
    }
});
