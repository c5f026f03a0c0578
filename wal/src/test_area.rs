//! Test support shared by the unit tests of `record`, `validate` and
//! `recovery`: a ring area of [`CAP`] bytes in memory that records are
//! encoded into, and shorthands for epochs, entries and chain tips.
//! Compiled only for tests; it must never touch a file or the clock.

use crate::layout::Epoch;
use crate::record::{EntryRef, RecordSink};
use crate::validate::ChainTip;

/// The test area's capacity.
pub(crate) const CAP: u64 = 1 << 20;

/// A ring area in memory: a record at lsn `l` lands at `l % CAP`.
pub(crate) struct Area(pub(crate) Vec<u8>);

impl RecordSink for Area {
    fn put_record(&mut self, lsn: u64, header: &[u8; 64], payload: &[u8]) {
        let p = (lsn % CAP) as usize;
        self.0[p..p + 64].copy_from_slice(header);
        self.0[p + 64..p + 64 + payload.len()].copy_from_slice(payload);
    }
}

/// The epoch of `term` led by `leader` (both valid in every test).
pub(crate) fn epoch(term: u64, leader: u64) -> Epoch {
    Epoch::new(term, leader).unwrap()
}

/// The entry `index` of `term` carrying `payload`.
pub(crate) fn entry(term: u64, index: u64, payload: &[u8]) -> EntryRef<'_> {
    EntryRef {
        term,
        index,
        payload,
    }
}

/// The chain state after entry `index` of `term`, written under `e`.
pub(crate) fn tip_after(index: u64, term: u64, e: Epoch) -> ChainTip {
    ChainTip {
        next_index: index + 1,
        last_term: term,
        epoch: e,
        unanchored: false,
    }
}
