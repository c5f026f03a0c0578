//! A two-sided AppendEntries batch (`ringraft::protocol::decode_entries`):
//! the parts of an inline body put together, from the network.
//!
//! Must hold: no panic; a batch that decodes encodes (`encode_entries`) to
//! canonical bytes that decode to a batch encoding the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft::protocol::{decode_entries, encode_entries};

fuzz_target!(|input: &[u8]| {
    let Ok(entries) = decode_entries(input) else {
        return;
    };
    let canonical = encode_entries(&entries).expect("entries encode");
    let again = decode_entries(&canonical).expect("canonical entries decode");
    assert_eq!(again.len(), entries.len());
    assert_eq!(encode_entries(&again).expect("encode"), canonical);
});
