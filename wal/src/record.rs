//! The record codec: 64-byte aligned records in the data area, their header,
//! their CRC, wrap markers, and the encoder that lays a batch of entries out
//! from a given logical offset.
//!
//! Pure code: no file, no mapping. The encoder writes through a
//! [`RecordSink`], which is the ring's mapping for a local append and a
//! [`WriteBuffer`] for a leader preparing a one-sided WRITE into a follower's
//! ring.
//!
//! # Record layout, version 1
//!
//! ```text
//! offset  size  field
//! 0       4     magic "RRec"
//! 4       1     kind: 1 = entry, 2 = wrap
//! 5       1     record format version = 1
//! 6       2     reserved, zero
//! 8       4     payload length in bytes (u32 LE)
//! 12      4     reserved, zero
//! 16      8     lsn: logical offset of this record (monotonic; physical = lsn % capacity)
//! 24      8     term of the entry
//! 32      8     index of the entry
//! 40      8     prev_term: term of the entry before it
//! 48      8     epoch: the fence value the writer held (term << 16 | leader)
//! 56      4     reserved, zero
//! 60      4     CRC32 (crc32fast, IEEE) of bytes 0..60 followed by the payload
//! 64      n     payload
//! 64+n    pad   to the next multiple of 64 (not covered by the CRC, any value)
//! ```
//!
//! A record never straddles the end of the data area. When the next record
//! would, a *wrap* marker (a bare 64-byte header, kind 2, no payload) is
//! written at the current position and the record goes to physical 0 with the
//! next lap's lsn. A wrap marker carries the chain state unchanged: `index`
//! is the index of the entry that follows it, `term` and `prev_term` are the
//! term of the entry before it.

use crate::layout::{Epoch, LINE_BYTES, MAX_INDEX, align_line, check_capacity, le_u32, le_u64};
use crate::validate::ChainTip;

/// Magic at offset 0 of every record: the bytes "RRec".
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RRec");
/// Version of the record format.
pub const RECORD_VERSION: u8 = 1;
/// Size of a record header in bytes.
pub const RECORD_HEADER_BYTES: usize = LINE_BYTES;
/// Offset of the CRC in the header.
pub const RECORD_CRC_OFFSET: usize = 60;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A log entry with a payload.
    Entry = 1,
    /// A wrap marker: the log continues at physical 0, next lap.
    Wrap = 2,
}

impl RecordKind {
    fn from_byte(byte: u8) -> Option<RecordKind> {
        match byte {
            1 => Some(RecordKind::Entry),
            2 => Some(RecordKind::Wrap),
            _ => None,
        }
    }
}

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordHeader {
    /// Entry or wrap marker.
    pub kind: RecordKind,
    /// Payload length in bytes (0 for a wrap marker).
    pub payload_len: u32,
    /// Logical offset of the record.
    pub lsn: u64,
    /// Raft term of the entry.
    pub term: u64,
    /// Raft index of the entry.
    pub index: u64,
    /// Term of the entry before this one.
    pub prev_term: u64,
    /// The fence value the writer held.
    pub epoch: Epoch,
    /// CRC32 of header bytes 0..60 and the payload.
    pub crc: u32,
}

/// Why a header could not even be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderDefect {
    /// The magic is not "RRec".
    Magic(u32),
    /// The kind byte is neither entry nor wrap.
    Kind(u8),
    /// The format version is not [`RECORD_VERSION`].
    Version(u8),
    /// A reserved field is not zero.
    Reserved,
}

impl RecordHeader {
    /// Total bytes the record occupies in the ring, padding included.
    pub fn record_len(&self) -> u64 {
        record_len(self.payload_len as u64)
    }

    /// Encodes the header with its CRC field set to `self.crc`.
    pub fn encode(&self) -> [u8; RECORD_HEADER_BYTES] {
        let mut h = [0u8; RECORD_HEADER_BYTES];
        h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        h[4] = self.kind as u8;
        h[5] = RECORD_VERSION;
        h[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        h[16..24].copy_from_slice(&self.lsn.to_le_bytes());
        h[24..32].copy_from_slice(&self.term.to_le_bytes());
        h[32..40].copy_from_slice(&self.index.to_le_bytes());
        h[40..48].copy_from_slice(&self.prev_term.to_le_bytes());
        h[48..56].copy_from_slice(&self.epoch.0.to_le_bytes());
        h[RECORD_CRC_OFFSET..].copy_from_slice(&self.crc.to_le_bytes());
        h
    }

    /// Computes the CRC of this header (its CRC field ignored) followed by
    /// `payload`, stores it in `self.crc`, and returns the encoded header.
    pub fn seal(&mut self, payload: &[u8]) -> [u8; RECORD_HEADER_BYTES] {
        assert_eq!(payload.len(), self.payload_len as usize, "payload length");
        self.crc = record_crc(&self.encode(), payload);
        self.encode()
    }

    /// Decodes a header. Only the layout is checked here (magic, kind,
    /// version, reserved bytes); position, length, CRC, chain and epoch are
    /// the validator's job.
    pub fn decode(h: &[u8; RECORD_HEADER_BYTES]) -> Result<RecordHeader, HeaderDefect> {
        let magic = le_u32(&h[0..]);
        if magic != RECORD_MAGIC {
            return Err(HeaderDefect::Magic(magic));
        }
        let kind = RecordKind::from_byte(h[4]).ok_or(HeaderDefect::Kind(h[4]))?;
        if h[5] != RECORD_VERSION {
            return Err(HeaderDefect::Version(h[5]));
        }
        if h[6..8] != [0, 0] || h[12..16] != [0; 4] || h[56..60] != [0; 4] {
            return Err(HeaderDefect::Reserved);
        }
        Ok(RecordHeader {
            kind,
            payload_len: le_u32(&h[8..]),
            lsn: le_u64(&h[16..]),
            term: le_u64(&h[24..]),
            index: le_u64(&h[32..]),
            prev_term: le_u64(&h[40..]),
            epoch: Epoch(le_u64(&h[48..])),
            crc: le_u32(&h[RECORD_CRC_OFFSET..]),
        })
    }
}

/// CRC32 over header bytes 0..60 and the payload.
pub fn record_crc(header: &[u8; RECORD_HEADER_BYTES], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..RECORD_CRC_OFFSET]);
    hasher.update(payload);
    hasher.finalize()
}

/// Bytes a record with a payload of `payload_len` bytes occupies in the ring.
pub const fn record_len(payload_len: u64) -> u64 {
    align_line(RECORD_HEADER_BYTES as u64 + payload_len)
}

/// Where a record of `len` bytes goes when the log ends at `tail_lsn`:
/// `(wrap_lsn, record_lsn)`, with `wrap_lsn` set when a wrap marker must be
/// written first because the record would straddle the end.
pub fn place(tail_lsn: u64, capacity: u64, len: u64) -> (Option<u64>, u64) {
    debug_assert!(capacity.is_power_of_two());
    debug_assert_eq!(tail_lsn % LINE_BYTES as u64, 0);
    debug_assert!(len <= capacity);
    let physical = tail_lsn & (capacity - 1);
    if physical + len > capacity {
        (Some(tail_lsn), tail_lsn - physical + capacity)
    } else {
        (None, tail_lsn)
    }
}

/// The logical offset where a batch of records with these payload lengths,
/// written from `start_lsn`, ends (wrap markers included).
pub fn span_end(start_lsn: u64, capacity: u64, payload_lens: impl IntoIterator<Item = u64>) -> u64 {
    payload_lens
        .into_iter()
        .fold(start_lsn, |tail, payload_len| {
            let len = record_len(payload_len);
            place(tail, capacity, len).1 + len
        })
}

/// One entry to encode.
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    /// Raft term.
    pub term: u64,
    /// Raft index.
    pub index: u64,
    /// Opaque payload bytes.
    pub payload: &'a [u8],
}

/// Where an encoded record went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Raft index of the entry.
    pub index: u64,
    /// Raft term of the entry.
    pub term: u64,
    /// Logical offset of the record.
    pub lsn: u64,
    /// Bytes the record occupies, padding included.
    pub len: u64,
}

/// Receives encoded records in lsn order.
pub trait RecordSink {
    /// Stores one record: `header` at `lsn`, `payload` right after it.
    /// `lsn % capacity + 64 + payload.len()` never exceeds the capacity.
    fn put_record(&mut self, lsn: u64, header: &[u8; RECORD_HEADER_BYTES], payload: &[u8]);
}

/// Why the encoder refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The entry's index does not follow the log's last index.
    #[error("entry index {found} does not follow the log (expected {expected})")]
    IndexGap {
        /// The index the log needs next.
        expected: u64,
        /// The index given.
        found: u64,
    },
    /// The entry's term is below the term of the entry before it.
    #[error("entry {index} has term {term}, below the previous entry's term {prev_term}")]
    TermRegression {
        /// Index of the entry.
        index: u64,
        /// Its term.
        term: u64,
        /// Term of the entry before it.
        prev_term: u64,
    },
    /// The entry's term is above the term of the writer's epoch.
    #[error("entry {index} has term {term}, above the writer's {epoch}")]
    TermAboveEpoch {
        /// Index of the entry.
        index: u64,
        /// Its term.
        term: u64,
        /// The writer's epoch.
        epoch: Epoch,
    },
    /// The writer's epoch is below the epoch of the previous record.
    #[error("writer's {epoch} is below the previous record's {previous}")]
    EpochRegression {
        /// The writer's epoch.
        epoch: Epoch,
        /// The previous record's epoch.
        previous: Epoch,
    },
    /// The payload is longer than a record can hold.
    #[error("payload of {len} bytes does not fit in one record")]
    PayloadTooLarge {
        /// Payload length.
        len: usize,
    },
    /// The entry's index is above [`MAX_INDEX`].
    #[error("entry index {index} is above the largest log index {MAX_INDEX}")]
    IndexOutOfRange {
        /// The index given.
        index: u64,
    },
    /// The ring capacity (a leader learns it from the follower) is not a
    /// power of two between 1 MiB and 1 TiB.
    #[error("ring capacity {capacity} is not a power of two between 1 MiB and 1 TiB")]
    BadCapacity {
        /// The capacity given.
        capacity: u64,
    },
    /// The position to write at (a leader learns it from the follower) is
    /// not a log position: not a multiple of 64, or beyond
    /// [`crate::layout::MAX_LSN`].
    #[error("lsn {lsn} is not a log position (a multiple of 64, at most 2^64 - 2^42)")]
    BadLsn {
        /// The lsn given.
        lsn: u64,
    },
}

/// Checks the shape a writer was given: a valid capacity and a log position.
fn check_start(capacity: u64, lsn: u64) -> Result<(), EncodeError> {
    check_capacity(capacity).map_err(|_| EncodeError::BadCapacity { capacity })?;
    crate::layout::check_lsn("lsn", lsn).map_err(|_| EncodeError::BadLsn { lsn })
}

/// Lays records out from a logical offset, keeping the chain state
/// (`index`, `prev_term`, `epoch`) that the validator will check.
#[derive(Clone, Debug)]
pub struct RecordEncoder {
    capacity: u64,
    next_lsn: u64,
    tip: ChainTip,
    epoch: Epoch,
}

impl RecordEncoder {
    /// An encoder that writes from `next_lsn` after the chain state `tip`,
    /// as the writer holding `epoch`.
    ///
    /// # Errors
    /// A leader builds it from what a follower told it (its capacity and its
    /// tail), so these are checked: [`EncodeError::BadCapacity`] unless the
    /// capacity is a power of two between 1 MiB and 1 TiB,
    /// [`EncodeError::BadLsn`] unless `next_lsn` is a multiple of 64 within
    /// the lsn space.
    pub fn new(
        capacity: u64,
        next_lsn: u64,
        tip: ChainTip,
        epoch: Epoch,
    ) -> Result<RecordEncoder, EncodeError> {
        check_start(capacity, next_lsn)?;
        Ok(RecordEncoder {
            capacity,
            next_lsn,
            tip,
            epoch,
        })
    }

    /// The logical offset the next record goes to (before any wrap).
    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// The chain state after the records pushed so far.
    pub fn tip(&self) -> ChainTip {
        self.tip
    }

    /// Checks `entry` against the chain without encoding it.
    pub fn check(&self, entry: &EntryRef<'_>) -> Result<(), EncodeError> {
        if entry.index > MAX_INDEX {
            return Err(EncodeError::IndexOutOfRange { index: entry.index });
        }
        if entry.index != self.tip.next_index && !self.tip.unanchored {
            return Err(EncodeError::IndexGap {
                expected: self.tip.next_index,
                found: entry.index,
            });
        }
        if entry.term < self.tip.last_term && !self.tip.unanchored {
            return Err(EncodeError::TermRegression {
                index: entry.index,
                term: entry.term,
                prev_term: self.tip.last_term,
            });
        }
        if entry.term > self.epoch.term() {
            return Err(EncodeError::TermAboveEpoch {
                index: entry.index,
                term: entry.term,
                epoch: self.epoch,
            });
        }
        if self.epoch < self.tip.epoch {
            return Err(EncodeError::EpochRegression {
                epoch: self.epoch,
                previous: self.tip.epoch,
            });
        }
        if u32::try_from(entry.payload.len()).is_err()
            || record_len(entry.payload.len() as u64) > self.capacity
        {
            return Err(EncodeError::PayloadTooLarge {
                len: entry.payload.len(),
            });
        }
        Ok(())
    }

    /// Checks a whole batch against the chain without encoding it.
    pub fn check_batch(&self, entries: &[EntryRef<'_>]) -> Result<(), EncodeError> {
        let mut tip = self.tip;
        for entry in entries {
            RecordEncoder {
                tip,
                ..self.clone()
            }
            .check(entry)?;
            tip = ChainTip {
                next_index: entry.index + 1,
                last_term: entry.term,
                epoch: self.epoch,
                unanchored: false,
            };
        }
        Ok(())
    }

    /// Encodes one entry (after a wrap marker when needed) into `sink`.
    pub fn push<S: RecordSink + ?Sized>(
        &mut self,
        sink: &mut S,
        entry: &EntryRef<'_>,
    ) -> Result<Placed, EncodeError> {
        self.check(entry)?;
        let len = record_len(entry.payload.len() as u64);
        let (wrap_lsn, lsn) = place(self.next_lsn, self.capacity, len);
        if let Some(wrap_lsn) = wrap_lsn {
            let mut wrap = RecordHeader {
                kind: RecordKind::Wrap,
                payload_len: 0,
                lsn: wrap_lsn,
                term: self.tip.last_term,
                index: if self.tip.unanchored {
                    entry.index
                } else {
                    self.tip.next_index
                },
                prev_term: self.tip.last_term,
                epoch: self.epoch,
                crc: 0,
            };
            sink.put_record(wrap_lsn, &wrap.seal(&[]), &[]);
        }
        let mut header = RecordHeader {
            kind: RecordKind::Entry,
            payload_len: entry.payload.len() as u32,
            lsn,
            term: entry.term,
            index: entry.index,
            prev_term: self.tip.last_term,
            epoch: self.epoch,
            crc: 0,
        };
        sink.put_record(lsn, &header.seal(entry.payload), entry.payload);
        self.next_lsn = lsn + len;
        self.tip = ChainTip {
            next_index: entry.index + 1,
            last_term: entry.term,
            epoch: self.epoch,
            unanchored: false,
        };
        Ok(Placed {
            index: entry.index,
            term: entry.term,
            lsn,
            len,
        })
    }
}

/// One contiguous run of bytes bound for the data area at `physical`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// Physical offset in the data area.
    pub physical: u64,
    /// The bytes, padding included.
    pub bytes: Vec<u8>,
}

/// A [`RecordSink`] that gathers records into at most a few physical
/// segments (a new one starts after each wrap): what a leader WRITEs into a
/// follower's ring. Padding bytes are zero.
#[derive(Clone, Debug)]
pub struct WriteBuffer {
    capacity: u64,
    start_lsn: u64,
    end_lsn: u64,
    segments: Vec<Segment>,
}

impl WriteBuffer {
    /// An empty buffer whose first record goes to `start_lsn`.
    ///
    /// # Errors
    /// As [`RecordEncoder::new`]: the capacity and the position come from
    /// the follower.
    pub fn new(capacity: u64, start_lsn: u64) -> Result<WriteBuffer, EncodeError> {
        check_start(capacity, start_lsn)?;
        Ok(WriteBuffer {
            capacity,
            start_lsn,
            end_lsn: start_lsn,
            segments: Vec::new(),
        })
    }

    /// The logical offset of the first byte.
    pub fn start_lsn(&self) -> u64 {
        self.start_lsn
    }

    /// The logical offset one past the last record.
    pub fn end_lsn(&self) -> u64 {
        self.end_lsn
    }

    /// The physical runs to write, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Total bytes to write.
    pub fn byte_len(&self) -> usize {
        self.segments.iter().map(|s| s.bytes.len()).sum()
    }

    /// The physical runs to write, in order, taken out of the buffer (a
    /// leader hands them to the fabric without copying them again).
    pub fn into_segments(self) -> Vec<Segment> {
        self.segments
    }
}

impl RecordSink for WriteBuffer {
    fn put_record(&mut self, lsn: u64, header: &[u8; RECORD_HEADER_BYTES], payload: &[u8]) {
        assert!(lsn >= self.end_lsn, "records out of order");
        let physical = lsn & (self.capacity - 1);
        let contiguous = lsn == self.end_lsn
            && self
                .segments
                .last()
                .is_some_and(|s| s.physical + s.bytes.len() as u64 == physical);
        if !contiguous {
            self.segments.push(Segment {
                physical,
                bytes: Vec::new(),
            });
        }
        let segment = self
            .segments
            .last_mut()
            .expect("a segment was just ensured");
        segment.bytes.extend_from_slice(header);
        segment.bytes.extend_from_slice(payload);
        let len = record_len(payload.len() as u64);
        segment.bytes.resize(
            segment.bytes.len() + (len as usize - RECORD_HEADER_BYTES - payload.len()),
            0,
        );
        self.end_lsn = lsn + len;
    }
}

#[cfg(test)]
mod tests;
