//! The control plane's messages (`ringraft::protocol::decode`), what a
//! peer SENDs over an authenticated connection: `input[0]` picks the type
//! decoded (an acceptor's `Request`, an initiator's `Reply`, the `Hello`
//! an acceptor reveals, the `Join` an initiator reveals), the rest is the
//! message. An inline AppendEntries body of one part goes on to
//! `decode_entries`, as the acceptor does with the parts put together.
//!
//! Must hold: no panic; what decodes encodes again (within the message
//! limit) to bytes that decode and encode to the same bytes; a tail's
//! derived values are computed without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft::protocol::{
    AppendBody, Hello, Join, Reply, Request, decode, decode_entries, encode, encode_entries,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `bytes` as a `T`; if it decodes, checks that it encodes to
/// canonical bytes that round-trip, and yields it.
fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let message: T = decode(bytes).ok()?;
    let canonical = encode(&message).expect("what decoded within the limit encodes");
    let again: T = decode(&canonical).expect("canonical bytes decode");
    assert_eq!(
        encode(&again).expect("encodes"),
        canonical,
        "not a fixed point"
    );
    Some(message)
}

fn tail_checks(tail: &ringraft::protocol::Tail) {
    let _ = tail.last_log_id();
    let _ = tail.chain_tip();
}

fuzz_target!(|input: &[u8]| {
    let Some((kind, bytes)) = input.split_first() else {
        return;
    };
    match kind % 4 {
        0 => {
            if let Some(Request::Append {
                body:
                    AppendBody::Inline {
                        part: 0,
                        parts: 1,
                        bytes,
                    },
                ..
            }) = round_trip::<Request>(bytes)
                && let Ok(entries) = decode_entries(&bytes)
            {
                let canonical = encode_entries(&entries).expect("entries encode");
                let again = decode_entries(&canonical).expect("canonical entries decode");
                assert_eq!(encode_entries(&again).expect("encode"), canonical);
            }
        }
        1 => match round_trip::<Reply>(bytes) {
            Some(Reply::Granted { tail, .. })
            | Some(Reply::Appended { tail, .. })
            | Some(Reply::Rejected { tail, .. }) => tail_checks(&tail),
            _ => {}
        },
        2 => {
            let _ = round_trip::<Hello>(bytes);
        }
        _ => {
            let _ = round_trip::<Join>(bytes);
        }
    }
});
