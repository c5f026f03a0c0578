//! The entries appended last, as openraft gave them to the store: what
//! openraft reads back right after (a leader's replication to its
//! followers, the state machine's apply), served without reading, checking
//! and decoding them out of the ring again; and, for those this node
//! encoded itself, their payloads' encoding, which a leader's links WRITE
//! into the followers' rings without encoding them again (issue 14,
//! item 2).
//!
//! Owns a window of consecutive entries, bounded in bytes. Never: hold an
//! entry the log does not hold as it is (the store updates it under the
//! wal lock wherever the log's end moves back or its start moves forward).

use std::collections::VecDeque;

use super::codec::{Encoded, Payloads};
use crate::types::Entry;

/// Bytes of entries the window keeps, about (payload bytes, their
/// encodings, plus a fixed cost per entry).
pub(super) const RECENT_BYTES: u64 = 16 << 20;
/// What an entry counts for besides its application bytes.
const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// An entry, and its payload's encoding where this node made it.
struct Kept {
    entry: Entry,
    encoded: Option<Encoded>,
}

/// A window of consecutive entries: `entries[k]` has index `first + k`.
#[derive(Default)]
pub(super) struct Recent {
    entries: VecDeque<Kept>,
    bytes: u64,
}

fn cost(kept: &Kept) -> u64 {
    let data = match &kept.entry.payload {
        openraft::EntryPayload::Normal(command) => command.data.len() as u64,
        _ => 0,
    };
    let encoded = kept.encoded.as_ref().map_or(0, |e| e.bytes.len() as u64);
    data + encoded + ENTRY_OVERHEAD_BYTES
}

impl Recent {
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|k| k.entry.log_id.index)
    }

    fn next(&self) -> Option<u64> {
        self.entries.back().map(|k| k.entry.log_id.index + 1)
    }

    /// `entries` (consecutive) now end the log: what they replace, and
    /// anything not consecutive with them, goes. `encoded`, where given,
    /// holds their payloads' encodings, one per entry.
    pub(super) fn appended(&mut self, entries: Vec<Entry>, encoded: Option<Vec<Encoded>>) {
        let Some(start) = entries.first().map(|e| e.log_id.index) else {
            return;
        };
        if let Some(encoded) = &encoded {
            assert!(
                encoded.len() == entries.len()
                    && encoded
                        .iter()
                        .zip(&entries)
                        .all(|(x, e)| x.log_id == e.log_id),
                "one encoding per entry, in order"
            );
        }
        match (self.first(), self.next()) {
            (Some(first), Some(next)) if first <= start && start <= next => {
                self.truncate_from(start)
            }
            _ => self.clear(),
        }
        let mut encoded = encoded.map(Vec::into_iter);
        for entry in entries {
            debug_assert_eq!(
                self.next().unwrap_or(entry.log_id.index),
                entry.log_id.index,
                "consecutive entries"
            );
            let kept = Kept {
                entry,
                encoded: encoded.as_mut().and_then(Iterator::next),
            };
            self.bytes += cost(&kept);
            self.entries.push_back(kept);
        }
        while self.bytes > RECENT_BYTES && self.entries.len() > 1 {
            self.pop_front();
        }
    }

    /// The log ends at `last` now (`None`: it is empty).
    pub(super) fn truncate_after(&mut self, last: Option<u64>) {
        match last {
            Some(last) => self.truncate_from(last + 1),
            None => self.clear(),
        }
    }

    /// The log starts after `upto` now.
    pub(super) fn purge(&mut self, upto: u64) {
        while self.first().is_some_and(|first| first <= upto) {
            self.pop_front();
        }
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Entries `start..end`, when the window holds all of them.
    pub(super) fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = self.first()?;
        if start < first || end > self.next()? || start >= end {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(
            self.entries
                .range(from..to)
                .map(|k| k.entry.clone())
                .collect(),
        )
    }

    /// The encodings it holds of `entries` (consecutive, as a leader
    /// replicates them): from the first of them, as long as the window
    /// holds each entry, by log id, with its encoding.
    pub(super) fn payloads(&self, entries: &[Entry]) -> Payloads {
        let (Some(first), Some(wanted)) = (self.first(), entries.first()) else {
            return Payloads::default();
        };
        let Some(from) = wanted
            .log_id
            .index
            .checked_sub(first)
            .and_then(|d| usize::try_from(d).ok())
        else {
            return Payloads::default();
        };
        let held = self
            .entries
            .iter()
            .skip(from)
            .zip(entries)
            .map_while(|(kept, entry)| {
                kept.encoded
                    .as_ref()
                    .filter(|x| x.log_id == entry.log_id)
                    .cloned()
            })
            .collect();
        Payloads::new(held)
    }

    fn truncate_from(&mut self, index: u64) {
        while self.next().is_some_and(|next| next > index) {
            if let Some(kept) = self.entries.pop_back() {
                self.bytes -= cost(&kept);
            }
        }
    }

    fn pop_front(&mut self) {
        if let Some(kept) = self.entries.pop_front() {
            self.bytes -= cost(&kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Command, log_id};

    fn entry(term: u64, index: u64, len: usize) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: openraft::EntryPayload::Normal(Command {
                session: None,
                data: vec![index as u8; len],
                control: None,
            }),
        }
    }

    fn run(term: u64, indexes: std::ops::Range<u64>) -> Vec<Entry> {
        indexes.map(|i| entry(term, i, 8)).collect()
    }

    fn ids(entries: Option<Vec<Entry>>) -> Option<Vec<(u64, u64)>> {
        entries.map(|es| {
            es.iter()
                .map(|e| (crate::types::term_of(&e.log_id), e.log_id.index))
                .collect()
        })
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let mut r = Recent::default();
        r.appended(run(1, 5..10), None);
        assert_eq!(ids(r.get(5, 10)).map(|v| v.len()), Some(5));
        assert_eq!(ids(r.get(7, 9)), Some(vec![(1, 7), (1, 8)]));
        assert!(r.get(4, 6).is_none(), "starts before the window");
        assert!(r.get(8, 11).is_none(), "ends after it");
        assert!(r.get(6, 6).is_none(), "empty");
    }

    #[test]
    fn a_new_term_replaces_the_entries_it_overwrites() {
        let mut r = Recent::default();
        r.appended(run(1, 1..10), None);
        r.truncate_after(Some(6));
        assert!(r.get(7, 8).is_none(), "truncated away");
        r.appended(run(2, 7..9), None);
        assert_eq!(ids(r.get(6, 9)), Some(vec![(1, 6), (2, 7), (2, 8)]));
        // Appended over the end without a truncation first: the same.
        r.appended(run(3, 8..9), None);
        assert_eq!(ids(r.get(7, 9)), Some(vec![(2, 7), (3, 8)]));
    }

    #[test]
    fn a_gap_or_a_purge_leaves_only_what_follows() {
        let mut r = Recent::default();
        r.appended(run(1, 1..5), None);
        r.appended(run(1, 9..11), None);
        assert!(
            r.get(1, 2).is_none(),
            "not consecutive with the new entries"
        );
        assert_eq!(ids(r.get(9, 11)).map(|v| v.len()), Some(2));
        r.purge(9);
        assert!(r.get(9, 10).is_none());
        assert_eq!(ids(r.get(10, 11)), Some(vec![(1, 10)]));
        r.truncate_after(None);
        assert!(r.get(10, 11).is_none());
    }

    #[test]
    fn keeps_about_its_byte_bound() {
        let mut r = Recent::default();
        let big = (RECENT_BYTES / 4) as usize;
        r.appended((1..7).map(|i| entry(1, i, big)).collect(), None);
        assert!(r.bytes <= RECENT_BYTES);
        assert!(r.get(1, 2).is_none(), "the oldest went");
        assert!(r.get(4, 7).is_some(), "the newest stayed");
    }

    fn encoded(entries: &[Entry]) -> Option<Vec<Encoded>> {
        Some(
            entries
                .iter()
                .map(|e| Encoded::of(e).expect("encodes"))
                .collect(),
        )
    }

    #[test]
    fn gives_the_encodings_it_holds_of_the_entries_asked_for() {
        let mut r = Recent::default();
        let older = run(1, 1..4);
        r.appended(older.clone(), None);
        let newer = run(2, 4..8);
        r.appended(newer.clone(), encoded(&newer));
        let ids = |p: &Payloads, of: &[Entry]| -> Vec<u64> {
            of.iter()
                .filter_map(|e| p.get(&e.log_id))
                .map(|x| x.log_id.index)
                .collect()
        };
        // Entries appended without their encodings (adopted in place):
        // none.
        let all: Vec<Entry> = older.iter().chain(&newer).cloned().collect();
        assert!(r.payloads(&all).is_empty());
        // From the first encoded entry on: each one, the same bytes the
        // entry encodes to.
        let p = r.payloads(&newer[1..]);
        assert_eq!(ids(&p, &newer), vec![5, 6, 7]);
        let five = p.get(&newer[1].log_id).expect("held");
        assert_eq!(
            *five.bytes,
            crate::log_store::encode_payload(&newer[1].payload).unwrap()
        );
        // Entries of another term at the same indexes (another leader's
        // log): none of them.
        assert!(r.payloads(&run(3, 5..8)).is_empty());
        // Past the window's end: what it holds.
        assert_eq!(ids(&r.payloads(&run(2, 6..12)), &run(2, 6..12)), vec![6, 7]);
        // Truncated away: gone with the entries.
        r.truncate_after(Some(5));
        assert_eq!(ids(&r.payloads(&newer), &newer), vec![4, 5]);
    }

    #[test]
    fn its_byte_bound_counts_the_encodings() {
        let mut r = Recent::default();
        let big = (RECENT_BYTES / 8) as usize;
        let entries: Vec<Entry> = (1..7).map(|i| entry(1, i, big)).collect();
        r.appended(entries.clone(), encoded(&entries));
        assert!(r.bytes <= RECENT_BYTES);
        assert!(r.get(1, 3).is_none(), "the oldest went");
        assert!(r.get(4, 7).is_some(), "the newest stayed");
    }
}
