//! The daemon's state machine: the committed records themselves, by log
//! index, so that any node serves reads of any committed range from its own
//! copy.
//!
//! Every record is kept (in memory, and in every snapshot): this daemon is a
//! replicated log with no retention limit. Entries that carry no record
//! (blank entries, membership changes) leave gaps in the indexes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ringraft::{Applied, StateMachine};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// One committed record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// Term of its entry.
    pub term: u64,
    /// Its bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

#[derive(Default, Serialize, Deserialize)]
struct Store {
    records: BTreeMap<u64, StoredRecord>,
}

/// The records, shared between the state machine (which Raft drives) and
/// the client API (which reads).
#[derive(Clone)]
pub struct Records {
    store: Arc<Mutex<Store>>,
    applied: Arc<watch::Sender<u64>>,
}

impl Default for Records {
    fn default() -> Self {
        Records {
            store: Arc::default(),
            applied: Arc::new(watch::channel(0).0),
        }
    }
}

impl Records {
    /// Records with index in `from..=to`.
    pub fn range(&self, from: u64, to: u64) -> Vec<(u64, StoredRecord)> {
        let store = self.store.lock().expect("records lock");
        store
            .records
            .range(from..=to)
            .map(|(i, r)| (*i, r.clone()))
            .collect()
    }

    /// At most `limit` records from `from` on.
    pub fn from(&self, from: u64, limit: usize) -> Vec<(u64, StoredRecord)> {
        let store = self.store.lock().expect("records lock");
        store
            .records
            .range(from..)
            .take(limit)
            .map(|(i, r)| (*i, r.clone()))
            .collect()
    }

    /// A watch of the highest index applied.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// How many records are held.
    pub fn len(&self) -> usize {
        self.store.lock().expect("records lock").records.len()
    }
}

impl StateMachine for Records {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        let mut store = self.store.lock().expect("records lock");
        let mut last = 0;
        for a in batch {
            store.records.insert(
                a.index,
                StoredRecord {
                    term: a.term,
                    data: a.data.to_vec(),
                },
            );
            last = a.index;
        }
        drop(store);
        if last > 0 {
            self.applied.send_if_modified(|v| {
                let changed = *v < last;
                *v = (*v).max(last);
                changed
            });
        }
        // The answer is the record's index; the client learns it from the
        // response anyway.
        batch
            .iter()
            .map(|a| a.index.to_le_bytes().to_vec())
            .collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(
            &*self.store.lock().expect("records lock"),
            bincode::config::standard(),
        )
        .expect("records encode")
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let (store, used): (Store, usize) =
            bincode::serde::decode_from_slice(snapshot, bincode::config::standard())
                .map_err(|e| e.to_string())?;
        if used != snapshot.len() {
            return Err("trailing bytes in a records snapshot".into());
        }
        let last = store.records.keys().next_back().copied().unwrap_or(0);
        *self.store.lock().expect("records lock") = store;
        self.applied.send_modify(|v| *v = (*v).max(last));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_snapshot_restore() {
        let mut r = Records::default();
        let answers = r.apply(&[
            Applied {
                index: 3,
                term: 1,
                data: b"a",
            },
            Applied {
                index: 5,
                term: 2,
                data: b"b",
            },
        ]);
        assert_eq!(
            answers,
            vec![3u64.to_le_bytes().to_vec(), 5u64.to_le_bytes().to_vec()]
        );
        assert_eq!(*r.watch_applied().borrow(), 5);
        assert_eq!(r.range(1, 4).len(), 1);
        let snap = r.snapshot();
        let mut other = Records::default();
        other.restore(&snap).unwrap();
        assert_eq!(other.range(0, 10), r.range(0, 10));
        assert!(other.restore(&[0xff, 0xff]).is_err());
    }
}
