//! The ring records' payloads: openraft entry payloads in bincode, and
//! the mapping between openraft log ids and the wal's positions.
//!
//! Owns the encoding of an entry; it must never touch the ring or the
//! segments (callers read and write the bytes).

use std::io;

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

/// Decodes a ring record's payload into an openraft entry.
pub fn decode_entry(term: u64, index: u64, bytes: &[u8]) -> io::Result<Entry> {
    let (payload, used): (openraft::alias::PayloadOf<TypeConfig>, usize) =
        bincode::serde::decode_from_slice(bytes, bincode::config::standard()).map_err(|e| {
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
