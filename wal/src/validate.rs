//! The validator: DESIGN.md's chain rules as pure functions.
//!
//! A record at logical offset `p` is well-formed only if its magic matches,
//! its `lsn == p` (a record of a previous lap is never read as new), its CRC
//! matches (torn and partial writes are caught), its index follows the
//! previous record's and its `prev_term` equals the previous record's term
//! (Raft's log-matching check, carried by the record), its term does not go
//! below the previous term nor above its epoch's term, and its epoch is not
//! below the previous record's epoch. Then, by context:
//!
//! - [`Check::Adoption`]: a live follower accepting records a leader just
//!   wrote: the epoch must *equal* the current fence (a writer that lost the
//!   fence is rejected);
//! - [`Check::Recovery`]: after a crash, the epoch must not be *above* the
//!   fence; valid records of older epochs are kept.
//! - [`Check::Segment`]: a record of a segment file, where no fence is
//!   known: only the epoch rules along the chain (the segment scanner in
//!   [`crate::segment`] applies its own lsn rule).
//!
//! The follower's adopt path, crash recovery and the offline checker all call
//! [`validate_header`] and [`validate_payload`] (or [`validate_at`], which
//! does both on a slice of the data area). Nothing here performs I/O.
//!
//! Every number of a record came from a file or a peer's NIC: an index above
//! [`MAX_INDEX`] is refused ([`Invalid::IndexOutOfRange`]) before anything
//! adds to it, and positions are computed with checked arithmetic.

use crate::layout::{Epoch, LINE_BYTES, MAX_INDEX, MAX_LSN};
use crate::record::{
    HeaderDefect, RECORD_HEADER_BYTES, RecordHeader, RecordKind, record_crc, record_len,
};

/// The chain state a record must continue: what the previous record (or the
/// purge point, for the first record) fixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChainTip {
    /// The index the next entry must carry.
    pub next_index: u64,
    /// The term of the entry before it (0 when there is none).
    pub last_term: u64,
    /// The epoch of the previous record ([`Epoch::ZERO`] at the start of a
    /// scan).
    pub epoch: Epoch,
    /// The log is empty and was never purged: the next entry may carry any
    /// index (and any `prev_term`); it becomes the log's first. openraft's
    /// storage contract lets a log begin at any index.
    pub unanchored: bool,
}

impl ChainTip {
    /// The chain state of a log whose last entry (or purge point) is
    /// `last`, or of an empty log that starts at index 0.
    ///
    /// # Panics
    /// When `last.index` is above [`MAX_INDEX`]: callers check indexes read
    /// from a file ([`crate::PurgePoint::check`]) before they get here.
    pub fn after(last: Option<LogPos>) -> ChainTip {
        match last {
            Some(pos) => ChainTip {
                next_index: one_past(pos.index),
                last_term: pos.term,
                epoch: Epoch::ZERO,
                unanchored: false,
            },
            None => ChainTip {
                unanchored: true,
                ..ChainTip::default()
            },
        }
    }

    /// The chain state once `header` (a valid record) is accepted.
    ///
    /// # Panics
    /// When `header.index` is above [`MAX_INDEX`]: the validator refuses
    /// such a record ([`Invalid::IndexOutOfRange`]) before it advances.
    pub fn advance(self, header: &RecordHeader) -> ChainTip {
        match header.kind {
            RecordKind::Entry => ChainTip {
                next_index: one_past(header.index),
                last_term: header.term,
                epoch: header.epoch,
                unanchored: false,
            },
            RecordKind::Wrap => ChainTip {
                epoch: header.epoch,
                ..self
            },
        }
    }
}

fn one_past(index: u64) -> u64 {
    assert!(
        index <= MAX_INDEX,
        "index {index} above MAX_INDEX reached the chain state unchecked"
    );
    index + 1
}

/// A log position: a Raft log id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LogPos {
    /// Raft term.
    pub term: u64,
    /// Raft index.
    pub index: u64,
}

/// The context a record is checked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// A live follower adopting what a leader wrote: epoch must equal the
    /// fence.
    Adoption {
        /// The ring's current fence.
        fence: Epoch,
    },
    /// Crash recovery and the offline checker: epoch must not exceed the
    /// fence.
    Recovery {
        /// The ring's fence.
        fence: Epoch,
    },
    /// A record of a segment file ([`crate::segment`]): no fence is known
    /// there, so only the epoch rules along the chain apply (not below the
    /// previous record's epoch, term not above the epoch's term). The lsn
    /// rule differs too and is the segment scanner's: lsns strictly increase
    /// along the log instead of naming the record's position.
    Segment,
}

/// The shape of the data area the validator checks against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Capacity of the data area in bytes (a power of two).
    pub capacity: u64,
    /// Largest payload a record may carry, in bytes.
    pub max_payload_bytes: u64,
}

impl Geometry {
    /// The loosest geometry of a data area of `capacity` bytes: any record up
    /// to half the area. Recovery and the offline checker use it, so that
    /// lowering the configured record limit never hides records written
    /// under a higher one.
    pub fn loosest(capacity: u64) -> Geometry {
        Geometry {
            capacity,
            max_payload_bytes: capacity / 2 - RECORD_HEADER_BYTES as u64,
        }
    }

    /// Physical offset of logical offset `lsn`.
    pub fn physical(&self, lsn: u64) -> u64 {
        lsn & (self.capacity - 1)
    }

    /// The logical offset where the lap after the one holding `lsn` starts,
    /// or `None` beyond the end of the lsn space ([`MAX_LSN`]).
    pub fn next_lap(&self, lsn: u64) -> Option<u64> {
        (lsn | (self.capacity - 1))
            .checked_add(1)
            .filter(|next| *next <= MAX_LSN)
    }

    /// Where the window of a log whose oldest needed byte is `head_lsn`
    /// ends: `head_lsn + capacity`, but never beyond [`MAX_LSN`].
    pub fn window_end(&self, head_lsn: u64) -> u64 {
        head_lsn.saturating_add(self.capacity).min(MAX_LSN)
    }
}

/// Why a record is not valid at the position it was looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// No record starts here (zeroes, garbage, or a torn header).
    #[error("bad magic {found:#010x}")]
    BadMagic {
        /// The four bytes found where the magic belongs.
        found: u32,
    },
    /// A record of another position: left from a previous lap, or misplaced.
    #[error("lsn mismatch: expected {expected}, found {found} (stale lap)")]
    LsnMismatch {
        /// The position looked at.
        expected: u64,
        /// The lsn the record carries.
        found: u64,
    },
    /// The payload length is above the limit or runs past the end of the
    /// data area.
    #[error("bad length: payload of {payload_len} bytes at physical {physical} (limit {limit})")]
    BadLength {
        /// The payload length the header claims.
        payload_len: u32,
        /// Physical offset of the record.
        physical: u64,
        /// The largest payload allowed.
        limit: u64,
    },
    /// The CRC does not match: a torn or partial write, or corruption.
    #[error(
        "CRC mismatch: stored {stored:#010x}, computed {computed:#010x} (torn or partial write)"
    )]
    CrcMismatch {
        /// CRC stored in the header.
        stored: u32,
        /// CRC of the bytes found.
        computed: u32,
    },
    /// The CRC matches but the header is malformed.
    #[error("malformed header: {0:?}")]
    BadHeader(HeaderDefect),
    /// The record's index is above [`MAX_INDEX`]: no log reaches it, and one
    /// past it would not fit in a `u64`.
    #[error("index {index} is above the largest log index {MAX_INDEX}")]
    IndexOutOfRange {
        /// The index the record carries.
        index: u64,
    },
    /// The record's index does not follow the previous one.
    #[error("index gap: expected {expected}, found {found}")]
    IndexGap {
        /// The index the chain needs.
        expected: u64,
        /// The index found.
        found: u64,
    },
    /// The record's prev_term is not the previous entry's term.
    #[error(
        "prev_term mismatch at index {index}: expected {expected}, found {found} (log-matching violation)"
    )]
    PrevTermMismatch {
        /// Index of the record.
        index: u64,
        /// The previous entry's term.
        expected: u64,
        /// The prev_term the record carries.
        found: u64,
    },
    /// The record's term goes below the previous entry's term, or a wrap
    /// marker's term differs from it.
    #[error("term {found} at index {index} does not continue term {previous}")]
    TermRegression {
        /// Index of the record.
        index: u64,
        /// The previous entry's term.
        previous: u64,
        /// The record's term.
        found: u64,
    },
    /// The record's term is above the term of its epoch.
    #[error("term {term} above the term of {epoch}")]
    TermAboveEpoch {
        /// The record's term.
        term: u64,
        /// The record's epoch.
        epoch: Epoch,
    },
    /// The record's epoch is below the previous record's.
    #[error("{found} is below the previous record's {previous}")]
    EpochBelowPrevious {
        /// The previous record's epoch.
        previous: Epoch,
        /// The record's epoch.
        found: Epoch,
    },
    /// Recovery: the record's epoch is above the ring's fence.
    #[error("{found} is above the fence {fence}")]
    EpochAboveFence {
        /// The ring's fence.
        fence: Epoch,
        /// The record's epoch.
        found: Epoch,
    },
    /// The record ends beyond `head + capacity` (or beyond the end of the
    /// lsn space, [`MAX_LSN`]): it would overwrite bytes still needed, so it
    /// cannot belong to the log.
    #[error(
        "record ends at lsn {end_lsn}, beyond the ring's window (head + capacity = {limit_lsn})"
    )]
    OutsideWindow {
        /// Where the record ends.
        end_lsn: u64,
        /// `head + capacity`.
        limit_lsn: u64,
    },
    /// Adoption: the writer does not hold the fence (a fenced-out leader).
    #[error("writer's {found} is not the fence {fence} (fenced writer)")]
    NotFenceHolder {
        /// The ring's fence.
        fence: Epoch,
        /// The record's epoch.
        found: Epoch,
    },
}

impl Invalid {
    /// True when the position simply holds no record of this lap: the log
    /// ends here rather than breaking.
    pub fn is_end_of_log(&self) -> bool {
        matches!(self, Invalid::BadMagic { .. } | Invalid::LsnMismatch { .. })
    }
}

/// A record that passed the validator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Valid {
    /// Its header.
    pub header: RecordHeader,
    /// The chain state after it.
    pub tip: ChainTip,
    /// Where the next record starts (the next lap's start after a wrap).
    pub next_lsn: u64,
}

/// Checks what the header alone decides before the payload can be read:
/// magic, position (lsn) and length. Returns the payload length, i.e. how
/// many bytes after the header [`validate_payload`] must be given.
///
/// The order of checks makes the reason precise: the end of the log (bad
/// magic, stale lap) first, then the length and the CRC (torn writes), then
/// the layout, the epoch (fenced writers) and the chain.
pub fn validate_header(
    header_bytes: &[u8; RECORD_HEADER_BYTES],
    lsn: u64,
    geometry: Geometry,
) -> Result<u32, Invalid> {
    debug_assert_eq!(lsn % LINE_BYTES as u64, 0);
    let magic = crate::layout::le_u32(&header_bytes[0..]);
    if magic != crate::record::RECORD_MAGIC {
        return Err(Invalid::BadMagic { found: magic });
    }
    let payload_len = crate::layout::le_u32(&header_bytes[8..]);
    check_position(header_bytes, lsn, payload_len, geometry)?;
    Ok(payload_len)
}

fn check_position(
    header_bytes: &[u8; RECORD_HEADER_BYTES],
    lsn: u64,
    payload_len: u32,
    geometry: Geometry,
) -> Result<(), Invalid> {
    let found = crate::layout::le_u64(&header_bytes[16..]);
    if found != lsn {
        return Err(Invalid::LsnMismatch {
            expected: lsn,
            found,
        });
    }
    let physical = geometry.physical(lsn);
    if payload_len as u64 > geometry.max_payload_bytes
        || physical + record_len(payload_len as u64) > geometry.capacity
    {
        return Err(Invalid::BadLength {
            payload_len,
            physical,
            limit: geometry.max_payload_bytes,
        });
    }
    Ok(())
}

/// Checks the CRC over the header and `payload` (exactly the payload length
/// [`validate_header`] returned), then the header's layout, the epoch and
/// the chain against `tip`.
pub fn validate_payload(
    header_bytes: &[u8; RECORD_HEADER_BYTES],
    payload: &[u8],
    geometry: Geometry,
    tip: ChainTip,
    check: Check,
) -> Result<Valid, Invalid> {
    let stored = stored_crc(header_bytes);
    let computed = record_crc(header_bytes, payload);
    if stored != computed {
        return Err(Invalid::CrcMismatch { stored, computed });
    }
    debug_assert_eq!(
        crate::layout::le_u32(&header_bytes[8..]) as usize,
        payload.len()
    );
    validate_fields(header_bytes, geometry, tip, check)
}

/// The CRC a record header carries.
pub fn stored_crc(header_bytes: &[u8; RECORD_HEADER_BYTES]) -> u32 {
    crate::layout::le_u32(&header_bytes[crate::record::RECORD_CRC_OFFSET..])
}

/// Every check of [`validate_payload`] but the CRC: the header's layout,
/// the epoch and the chain against `tip`. Callers that must not spend a CRC
/// on a record that fails anyway (recovery's search beyond a break) run this
/// first and the CRC after; [`validate_payload`] runs the CRC first, so that
/// a torn write is reported as such.
pub fn validate_fields(
    header_bytes: &[u8; RECORD_HEADER_BYTES],
    geometry: Geometry,
    tip: ChainTip,
    check: Check,
) -> Result<Valid, Invalid> {
    let header = RecordHeader::decode(header_bytes).map_err(|defect| match defect {
        HeaderDefect::Magic(found) => Invalid::BadMagic { found },
        other => Invalid::BadHeader(other),
    })?;
    if header.kind == RecordKind::Wrap && header.payload_len != 0 {
        return Err(Invalid::BadLength {
            payload_len: header.payload_len,
            physical: geometry.physical(header.lsn),
            limit: 0,
        });
    }
    if header.index > MAX_INDEX {
        return Err(Invalid::IndexOutOfRange {
            index: header.index,
        });
    }
    check_epoch(&header, tip, check)?;
    check_chain(&header, tip)?;
    let next_lsn = match header.kind {
        RecordKind::Entry => header
            .lsn
            .checked_add(header.record_len())
            .filter(|end| *end <= MAX_LSN),
        RecordKind::Wrap => geometry.next_lap(header.lsn),
    }
    .ok_or(Invalid::OutsideWindow {
        end_lsn: u64::MAX,
        limit_lsn: MAX_LSN,
    })?;
    Ok(Valid {
        header,
        tip: tip.advance(&header),
        next_lsn,
    })
}

fn check_epoch(header: &RecordHeader, tip: ChainTip, check: Check) -> Result<(), Invalid> {
    match check {
        Check::Adoption { fence }
            if header.epoch != fence && !crate::planted::skipping_epoch_check() =>
        {
            return Err(Invalid::NotFenceHolder {
                fence,
                found: header.epoch,
            });
        }
        Check::Recovery { fence } if header.epoch > fence => {
            return Err(Invalid::EpochAboveFence {
                fence,
                found: header.epoch,
            });
        }
        _ => {}
    }
    if header.epoch < tip.epoch {
        return Err(Invalid::EpochBelowPrevious {
            previous: tip.epoch,
            found: header.epoch,
        });
    }
    if header.term > header.epoch.term() {
        return Err(Invalid::TermAboveEpoch {
            term: header.term,
            epoch: header.epoch,
        });
    }
    Ok(())
}

fn check_chain(header: &RecordHeader, tip: ChainTip) -> Result<(), Invalid> {
    let previous_term = if tip.unanchored {
        // The first record of a log that was never purged: any index and
        // prev_term (a wrap marker keeps the log unanchored). Its terms must
        // still hold together: the entry before it, whose term it names,
        // cannot have a later term than its own.
        header.prev_term
    } else {
        if header.index != tip.next_index {
            return Err(Invalid::IndexGap {
                expected: tip.next_index,
                found: header.index,
            });
        }
        if header.prev_term != tip.last_term {
            return Err(Invalid::PrevTermMismatch {
                index: header.index,
                expected: tip.last_term,
                found: header.prev_term,
            });
        }
        tip.last_term
    };
    let term_ok = match header.kind {
        RecordKind::Entry => header.term >= previous_term,
        RecordKind::Wrap => header.term == previous_term,
    };
    if !term_ok {
        return Err(Invalid::TermRegression {
            index: header.index,
            previous: previous_term,
            found: header.term,
        });
    }
    Ok(())
}

/// Validates the record at logical offset `lsn` of `area`, a view of the
/// whole data area (`area.len() == geometry.capacity`).
///
/// # Panics
/// When `area` is not the whole data area or `lsn` is not line aligned: a
/// position is the caller's, never a value read from the record.
pub fn validate_at(
    area: &[u8],
    lsn: u64,
    geometry: Geometry,
    tip: ChainTip,
    check: Check,
) -> Result<Valid, Invalid> {
    assert_eq!(
        area.len() as u64,
        geometry.capacity,
        "area is the whole data area"
    );
    assert!(
        lsn.is_multiple_of(LINE_BYTES as u64),
        "unaligned position {lsn}"
    );
    let physical = geometry.physical(lsn) as usize;
    let header_bytes: &[u8; RECORD_HEADER_BYTES] = area[physical..physical + RECORD_HEADER_BYTES]
        .try_into()
        .expect("64 bytes");
    let payload_len = validate_header(header_bytes, lsn, geometry)?;
    let payload_start = physical + RECORD_HEADER_BYTES;
    let payload = &area[payload_start..payload_start + payload_len as usize];
    validate_payload(header_bytes, payload, geometry, tip, check)
}

#[cfg(test)]
mod tests;
