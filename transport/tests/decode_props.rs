//! Property tests of the transport's decoders of outside input, on stable
//! (`fuzz/` runs the same decoders under libFuzzer): the bootstrap
//! handshake (either side, against arbitrary bytes, before and after a
//! real counterpart proved the secret), the `tcp` backend's frames, and
//! the endpoint descriptions of both backends. Arbitrary bytes and
//! mutated valid encodings never panic; nothing is accepted or revealed
//! without the secret; valid encodings round-trip.

use proptest::prelude::*;
use ringraft_transport::ConnConfig;
use ringraft_transport::fuzzing::{
    COUNTERPART_NODE_ID, HANDSHAKE_CLIENT, HANDSHAKE_FRAMES, HANDSHAKE_PROVEN,
    MAX_WIRE_FRAME_BYTES, Recorded, UNDER_TEST_REVEAL, WireFrame, decode_soft_endpoint,
    example_frames, read_frame_stream, record_handshake, record_tcp_traffic, run_handshake,
    soft_endpoint, split_after_frames,
};
use ringraft_transport::handshake::Reveal;

/// The names `rdma/endpoint.rs` uses from its crate.
mod error {
    pub use ringraft_transport::error::{Result, TransportError};
}

/// The rdma backend's endpoint description (a pure function, in a
/// private module behind the `rdma` feature), compiled here as it is.
#[path = "../src/rdma/endpoint.rs"]
#[allow(dead_code)]
mod qp_endpoint;

use qp_endpoint::{ENDPOINT_BYTES, QpEndpoint};

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// `bytes` with byte `at` (mod its length) xored with `flip` and cut to
/// `keep` bytes (mod its length + 1).
fn mutate(bytes: &[u8], at: usize, flip: u8, keep: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if !out.is_empty() {
        let at = at % out.len();
        out[at] ^= flip;
    }
    out.truncate(keep % (bytes.len() + 1));
    out
}

/// The frames of a recorded stream, one slice each.
fn frames_of(stream: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut rest = stream;
    while let Some((frame, after)) = split_after_frames(rest, 1) {
        frames.push(frame);
        rest = after;
    }
    frames
}

/// What must hold after any run of the handshake harness.
fn check_handshake(
    input: &[u8],
) -> Result<ringraft_transport::fuzzing::HandshakeRun, TestCaseError> {
    let run = paused().block_on(run_handshake(input));
    let leaked = run
        .wrote
        .windows(UNDER_TEST_REVEAL.len())
        .any(|w| w == UNDER_TEST_REVEAL);
    if !run.proven {
        prop_assert!(
            run.accepted.is_none(),
            "accepted without the secret: {run:?}"
        );
        prop_assert!(
            !run.revealed && !leaked,
            "revealed without the secret: {run:?}"
        );
    }
    if run.client_side && !run.revealed {
        prop_assert!(!leaked, "{run:?}");
    }
    prop_assert_eq!(run.accepted.is_some(), run.error.is_none(), "{:?}", run);
    if let (Some((node_id, _)), false) = (&run.accepted, run.client_side) {
        prop_assert_eq!(*node_id, COUNTERPART_NODE_ID);
    }
    Ok(run)
}

/// A handshake between the real client and server, recorded.
fn recorded_handshake() -> Recorded {
    paused().block_on(record_handshake(
        Reveal {
            endpoint: soft_endpoint(&ConnConfig::default()),
            app_data: b"client data".to_vec(),
        },
        Reveal {
            endpoint: soft_endpoint(&ConnConfig::default()),
            app_data: b"server data".to_vec(),
        },
    ))
}

proptest! {
    #[test]
    fn the_handshake_takes_any_bytes_and_reveals_nothing_without_the_secret(
        flags in 0u8..4,
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let input = [&[flags][..], &bytes].concat();
        check_handshake(&input)?;
    }

    #[test]
    fn a_recorded_handshake_replayed_or_mutated_is_not_accepted(
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let recorded = recorded_handshake();
        // The whole of a real client's side, replayed to a server with a
        // fresh nonce: its proof is stale.
        let replay = [&[0u8][..], &recorded.from_client].concat();
        let run = check_handshake(&replay)?;
        prop_assert!(run.error.is_some());
        let replay = [&[HANDSHAKE_CLIENT][..], &recorded.from_server].concat();
        let run = check_handshake(&replay)?;
        prop_assert!(!run.revealed, "a replayed challenge convinced the client");
        for (flags, stream) in [(0, &recorded.from_client), (HANDSHAKE_CLIENT, &recorded.from_server)] {
            let input = [&[flags][..], &mutate(stream, at, flip, keep)].concat();
            check_handshake(&input)?;
        }
    }

    #[test]
    fn after_the_proof_real_messages_are_accepted_and_mutations_never_panic(
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let recorded = recorded_handshake();
        let client = frames_of(&recorded.from_client);
        let server = frames_of(&recorded.from_server);
        prop_assert_eq!((client.len(), server.len()), HANDSHAKE_FRAMES);
        // The client's endpoint message, after a proven hello and proof.
        let run = check_handshake(&[&[HANDSHAKE_PROVEN][..], client[2]].concat())?;
        let (_, reveal) = run.accepted.expect("the real endpoint message is accepted");
        prop_assert_eq!(&reveal.app_data, b"client data");
        prop_assert!(decode_soft_endpoint(&reveal.endpoint).is_ok());
        // The server's answer, after a proven challenge.
        let run = check_handshake(&[&[HANDSHAKE_CLIENT | HANDSHAKE_PROVEN][..], server[1]].concat())?;
        prop_assert!(run.revealed);
        prop_assert_eq!(run.accepted.map(|(_, r)| r.app_data), Some(b"server data".to_vec()));
        for (flags, frame) in [(HANDSHAKE_PROVEN, client[2]), (HANDSHAKE_CLIENT | HANDSHAKE_PROVEN, server[1])] {
            check_handshake(&[&[flags][..], &mutate(frame, at, flip, keep)].concat())?;
        }
    }

    #[test]
    fn frames_round_trip_and_any_stream_splits_without_a_panic(
        addr in any::<u64>(),
        rkey in any::<u32>(),
        word in any::<u64>(),
        data in proptest::collection::vec(any::<u8>(), 0..64),
        garbage in proptest::collection::vec(any::<u8>(), 0..256),
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let frames = example_frames(addr, rkey, word, &data);
        let mut stream = Vec::new();
        for frame in &frames {
            prop_assert_eq!(&WireFrame::decode(&frame.encode()).unwrap(), frame);
            frame.encode_framed(&mut stream);
        }
        let (read, why) = read_frame_stream(&stream);
        prop_assert_eq!(&read, &frames);
        prop_assert_eq!(why, "end of stream");
        for input in [garbage, mutate(&stream, at, flip, keep)] {
            let (read, why) = read_frame_stream(&input);
            prop_assert!(!why.is_empty());
            for frame in read {
                prop_assert_eq!(WireFrame::decode(&frame.encode()), Ok(frame));
            }
        }
    }

    #[test]
    fn soft_endpoints_within_bounds_round_trip_and_others_are_refused(
        rnr_retry in any::<u8>(),
        rnr_delay_ms in 0u64..20_000,
        bytes in proptest::collection::vec(any::<u8>(), 0..24),
    ) {
        let config = ConnConfig {
            rnr_retry,
            rnr_delay: std::time::Duration::from_millis(rnr_delay_ms),
            ..ConnConfig::default()
        };
        let encoded = soft_endpoint(&config);
        let in_bounds = rnr_retry <= ConnConfig::MAX_RETRY && rnr_delay_ms <= 10_000;
        prop_assert_eq!(decode_soft_endpoint(&encoded).ok(), in_bounds.then(|| encoded.clone()));
        if let Ok(again) = decode_soft_endpoint(&bytes) {
            prop_assert_eq!(decode_soft_endpoint(&again).ok(), Some(again));
        }
    }

    #[test]
    fn rdma_endpoints_decode_exactly_or_are_refused(
        bytes in proptest::collection::vec(any::<u8>(), ENDPOINT_BYTES..=ENDPOINT_BYTES),
        other_len in (0usize..64).prop_filter("not the length", |l| *l != ENDPOINT_BYTES),
        qpn in 1u32..=0xFF_FFFF,
        psn in 0u32..=0xFF_FFFF,
        mtu in 1u8..=5,
        recv_buffer_bytes in 1u32..=16 << 20,
        max_dest_rd_atomic in 1u8..,
    ) {
        if let Ok(endpoint) = QpEndpoint::decode(&bytes, "p") {
            prop_assert_eq!(endpoint.encode(), bytes);
            prop_assert!(endpoint.qpn >= 1 && endpoint.qpn <= 0xFF_FFFF);
            prop_assert!(endpoint.psn <= 0xFF_FFFF && (1..=5).contains(&endpoint.mtu));
        }
        prop_assert!(QpEndpoint::decode(&vec![1; other_len], "p").is_err());
        let valid = QpEndpoint {
            qpn,
            psn,
            gid: [7; 16],
            lid: 0,
            mtu,
            recv_buffer_bytes,
            max_dest_rd_atomic,
        };
        prop_assert_eq!(QpEndpoint::decode(&valid.encode(), "p").ok(), Some(valid));
    }
}

#[test]
fn a_frame_above_the_limit_ends_the_stream() {
    let mut stream = Vec::new();
    example_frames(1, 2, 3, b"x")[0].encode_framed(&mut stream);
    stream.extend_from_slice(&(MAX_WIRE_FRAME_BYTES as u32 + 1).to_le_bytes());
    let (read, why) = read_frame_stream(&stream);
    assert_eq!(read.len(), 1);
    assert!(why.contains("above the limit"), "{why}");
}

/// Real traffic of the tcp backend (two devices on loopback, through a
/// recording relay) splits and decodes frame by frame, and every frame
/// encodes back to the bytes that were sent: the frame codec of
/// `fuzzing` is the backend's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tcp_traffic_decodes_frame_by_frame() {
    let recorded = record_tcp_traffic(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    for (stream, handshake_frames) in [
        (&recorded.from_client, HANDSHAKE_FRAMES.0),
        (&recorded.from_server, HANDSHAKE_FRAMES.1),
    ] {
        let (_, frames) = split_after_frames(stream, handshake_frames).expect("a handshake");
        let (read, why) = read_frame_stream(frames);
        assert_eq!(why, "end of stream");
        assert!(read.len() >= 3, "{read:?}");
        let mut again = Vec::new();
        for frame in &read {
            frame.encode_framed(&mut again);
        }
        assert_eq!(again, frames, "the frames re-encode as sent");
    }
}
