//! A ring record's payload (`ringraft::log_store::decode_entry`): the
//! bytes a leader WRITEs one-sided into a follower's ring, read back when
//! the follower adopts, recovers or serves them. `input[0..16]` are the
//! record's term and index (u64 LE), the rest its payload.
//!
//! Must hold: no panic; an entry that decodes carries the record's log id,
//! and its payload encodes (bincode, standard configuration, as the log
//! store writes it) to bytes that decode to the same entry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft::log_store::decode_entry;
use ringraft_fuzz::{tail, u64_at};

fuzz_target!(|input: &[u8]| {
    let (term, index) = (u64_at(input, 0), u64_at(input, 8));
    let payload = tail(input, 16);
    let Ok(entry) = decode_entry(term, index, payload) else {
        return;
    };
    assert_eq!(entry.log_id, ringraft::types::log_id(term, index));
    let canonical = bincode::serde::encode_to_vec(&entry.payload, bincode::config::standard())
        .expect("a payload encodes");
    let again = decode_entry(term, index, &canonical).expect("canonical bytes decode");
    assert_eq!(again, entry);
});
