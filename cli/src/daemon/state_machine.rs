//! The daemon's state machine. The log is the data: reads are served from
//! the log itself (ring and segments, [`ringraft::Node::read_log`]), so the
//! state machine keeps nothing of the records, and a snapshot holds only
//! what the library adds to it (the log position, the membership, client
//! sessions, the retention point). Memory use does not grow with the log;
//! this module must never keep a copy of the records.

use ringraft::{Applied, StateMachine};

/// The daemon's state machine: it answers each record with its index.
#[derive(Clone, Copy, Debug, Default)]
pub struct Records;

impl StateMachine for Records {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        // The answer is the record's index; the client learns it from the
        // response anyway.
        batch
            .iter()
            .map(|a| a.index.to_le_bytes().to_vec())
            .collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        if snapshot.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "a snapshot whose state holds {} bytes: written by a daemon that kept every record \
                 in its state machine (before the log became the data); this daemon cannot use it",
                snapshot.len()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11, item 4: the state machine copied every record into memory
    /// and into every snapshot (a snapshot after 1000 records of 1 KiB took
    /// over 1 MB). It keeps nothing now.
    #[test]
    fn a_snapshot_does_not_grow_with_the_records() {
        let mut r = Records;
        let data = vec![7u8; 1024];
        for index in 1..=1000u64 {
            let answers = r.apply(&[Applied {
                index,
                term: 1,
                data: &data,
            }]);
            assert_eq!(answers, vec![index.to_le_bytes().to_vec()]);
        }
        assert!(r.snapshot().is_empty(), "{} bytes", r.snapshot().len());
        let mut other = Records;
        other.restore(&r.snapshot()).unwrap();
        let err = other.restore(&[1, 2, 3]).unwrap_err();
        assert!(err.contains("kept every record"), "{err}");
    }
}
