//! The ring records' payloads: openraft entry payloads in bincode, and
//! the mapping between openraft log ids and the wal's positions.
//!
//! Owns the encoding of an entry; it must never touch the ring or the
//! segments (callers read and write the bytes).

use std::io;
use std::sync::Arc;

use ringraft_wal::LogPos;

use crate::types::{Entry, LogId, TypeConfig, log_id, term_of};

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

pub(crate) fn encode_payload(
    payload: &openraft::alias::PayloadOf<TypeConfig>,
) -> io::Result<Vec<u8>> {
    bincode::serde::encode_to_vec(payload, bincode::config::standard()).map_err(io_err)
}

/// An entry's payload as the ring records carry it: encoded once, for the
/// leader's own ring and every follower's (issue 14, item 2). Clones share
/// the bytes. (Each record's CRC covers its header too, which differs from
/// ring to ring: it is computed per record. Combining a CRC of the payload
/// computed once with each header's, `crc32fast::Hasher::combine`, was
/// tried: by callgrind it cost more instructions than it saved for 64 B
/// payloads, and about as many for 4 KiB ones.)
#[derive(Clone, Debug)]
pub(crate) struct Encoded {
    pub(crate) log_id: LogId,
    pub(crate) bytes: Arc<Vec<u8>>,
}

impl Encoded {
    /// Encodes `entry`'s payload.
    pub(crate) fn of(entry: &Entry) -> io::Result<Encoded> {
        Ok(Encoded {
            log_id: entry.log_id,
            bytes: Arc::new(encode_payload(&entry.payload)?),
        })
    }
}

/// The encodings of consecutive entries that the log store kept when it
/// appended them: what a leader's link WRITEs instead of encoding the
/// entries again. An entry it does not hold, by log id, is encoded again
/// (two entries with the same log id are the same entry, Raft's log
/// matching).
#[derive(Clone, Debug, Default)]
pub struct Payloads(Vec<Encoded>);

impl Payloads {
    /// `encoded`, which must be of consecutive entries.
    pub(crate) fn new(encoded: Vec<Encoded>) -> Payloads {
        assert!(
            encoded
                .windows(2)
                .all(|w| w[0].log_id.index + 1 == w[1].log_id.index),
            "the encodings of consecutive entries"
        );
        Payloads(encoded)
    }

    /// The encoding of the entry `log_id`, if held.
    pub(crate) fn get(&self, log_id: &LogId) -> Option<&Encoded> {
        let first = self.0.first()?.log_id.index;
        let at = usize::try_from(log_id.index.checked_sub(first)?).ok()?;
        self.0.get(at).filter(|e| e.log_id == *log_id)
    }

    /// Whether it holds none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The most a record's payload may claim while it decodes (a record holds
/// far less: `max_record_bytes`).
const PAYLOAD_CLAIM_CAP: usize = 1 << 30;

/// Decodes a ring record's payload into an openraft entry.
pub fn decode_entry(term: u64, index: u64, bytes: &[u8]) -> io::Result<Entry> {
    let (payload, used): (openraft::alias::PayloadOf<TypeConfig>, usize) =
        // Bounded by what the payload can hold: a length in it cannot make
        // an allocation larger than that (a record's payload comes from the
        // network when a leader WRITEs it).
        ringraft_transport::bounded::decode(bytes, PAYLOAD_CLAIM_CAP).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("entry {index}: undecodable payload: {e}"),
            )
        })?;
    if used != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("entry {index}: trailing bytes in the payload"),
        ));
    }
    Ok(Entry {
        log_id: log_id(term, index),
        payload,
    })
}

pub(super) fn pos(log_id: &LogId) -> LogPos {
    LogPos {
        term: term_of(log_id),
        index: log_id.index,
    }
}

pub(super) fn to_log_id(pos: LogPos) -> LogId {
    log_id(pos.term, pos.index)
}
