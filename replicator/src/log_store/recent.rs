//! The entries appended last, as openraft gave them to the store: what
//! openraft reads back right after (a leader's replication to its
//! followers, the state machine's apply), served without reading, checking
//! and decoding them out of the ring again (issue 14, item 2).
//!
//! Owns a window of consecutive entries, bounded in bytes. Never: hold an
//! entry the log does not hold as it is (the store updates it under the
//! wal lock wherever the log's end moves back or its start moves forward).

use std::collections::VecDeque;

use crate::types::Entry;

/// Bytes of entries the window keeps, about (payload bytes plus a fixed
/// cost per entry).
pub(super) const RECENT_BYTES: u64 = 8 << 20;
/// What an entry counts for besides its application bytes.
const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// A window of consecutive entries: `entries[k]` has index `first + k`.
#[derive(Default)]
pub(super) struct Recent {
    entries: VecDeque<Entry>,
    bytes: u64,
}

fn cost(entry: &Entry) -> u64 {
    let data = match &entry.payload {
        openraft::EntryPayload::Normal(command) => command.data.len() as u64,
        _ => 0,
    };
    data + ENTRY_OVERHEAD_BYTES
}

impl Recent {
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|e| e.log_id.index)
    }

    fn next(&self) -> Option<u64> {
        self.entries.back().map(|e| e.log_id.index + 1)
    }

    /// `entries` (consecutive) now end the log: what they replace, and
    /// anything not consecutive with them, goes.
    pub(super) fn appended(&mut self, entries: Vec<Entry>) {
        let Some(start) = entries.first().map(|e| e.log_id.index) else {
            return;
        };
        match (self.first(), self.next()) {
            (Some(first), Some(next)) if first <= start && start <= next => {
                self.truncate_from(start)
            }
            _ => self.clear(),
        }
        for entry in entries {
            debug_assert_eq!(
                self.next().unwrap_or(entry.log_id.index),
                entry.log_id.index,
                "consecutive entries"
            );
            self.bytes += cost(&entry);
            self.entries.push_back(entry);
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
        Some(self.entries.range(from..to).cloned().collect())
    }

    fn truncate_from(&mut self, index: u64) {
        while self.next().is_some_and(|next| next > index) {
            if let Some(entry) = self.entries.pop_back() {
                self.bytes -= cost(&entry);
            }
        }
    }

    fn pop_front(&mut self) {
        if let Some(entry) = self.entries.pop_front() {
            self.bytes -= cost(&entry);
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
        r.appended(run(1, 5..10));
        assert_eq!(ids(r.get(5, 10)).map(|v| v.len()), Some(5));
        assert_eq!(ids(r.get(7, 9)), Some(vec![(1, 7), (1, 8)]));
        assert!(r.get(4, 6).is_none(), "starts before the window");
        assert!(r.get(8, 11).is_none(), "ends after it");
        assert!(r.get(6, 6).is_none(), "empty");
    }

    #[test]
    fn a_new_term_replaces_the_entries_it_overwrites() {
        let mut r = Recent::default();
        r.appended(run(1, 1..10));
        r.truncate_after(Some(6));
        assert!(r.get(7, 8).is_none(), "truncated away");
        r.appended(run(2, 7..9));
        assert_eq!(ids(r.get(6, 9)), Some(vec![(1, 6), (2, 7), (2, 8)]));
        // Appended over the end without a truncation first: the same.
        r.appended(run(3, 8..9));
        assert_eq!(ids(r.get(7, 9)), Some(vec![(2, 7), (3, 8)]));
    }

    #[test]
    fn a_gap_or_a_purge_leaves_only_what_follows() {
        let mut r = Recent::default();
        r.appended(run(1, 1..5));
        r.appended(run(1, 9..11));
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
        r.appended((1..7).map(|i| entry(1, i, big)).collect());
        assert!(r.bytes <= RECENT_BYTES);
        assert!(r.get(1, 2).is_none(), "the oldest went");
        assert!(r.get(4, 7).is_some(), "the newest stayed");
    }
}
