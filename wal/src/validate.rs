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
        Check::Adoption { fence } if header.epoch != fence => {
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
mod tests {
    use super::*;
    use crate::record::{EntryRef, RecordEncoder, RecordSink};

    const CAP: u64 = 1 << 20;
    const GEO: Geometry = Geometry {
        capacity: CAP,
        max_payload_bytes: 4096,
    };

    struct Area(Vec<u8>);
    impl RecordSink for Area {
        fn put_record(&mut self, lsn: u64, header: &[u8; 64], payload: &[u8]) {
            let p = (lsn % CAP) as usize;
            self.0[p..p + 64].copy_from_slice(header);
            self.0[p + 64..p + 64 + payload.len()].copy_from_slice(payload);
        }
    }

    fn epoch(term: u64, leader: u64) -> Epoch {
        Epoch::new(term, leader).unwrap()
    }

    /// An area holding entries 0..n of term 1 written under `e`, from lsn 0.
    fn area_with(n: u64, e: Epoch) -> (Area, Vec<u64>) {
        let mut area = Area(vec![0; CAP as usize]);
        let mut enc = RecordEncoder::new(CAP, 0, ChainTip::default(), e).unwrap();
        let lsns = (0..n)
            .map(|i| {
                enc.push(
                    &mut area,
                    &EntryRef {
                        term: 1,
                        index: i,
                        payload: b"payload",
                    },
                )
                .unwrap()
                .lsn
            })
            .collect();
        (area, lsns)
    }

    fn tip_after(index: u64, term: u64, e: Epoch) -> ChainTip {
        ChainTip {
            next_index: index + 1,
            last_term: term,
            epoch: e,
            unanchored: false,
        }
    }

    #[test]
    fn valid_records_pass_both_contexts() {
        let e = epoch(1, 1);
        let (area, lsns) = area_with(3, e);
        let mut tip = ChainTip::default();
        for (i, lsn) in lsns.iter().enumerate() {
            for check in [Check::Adoption { fence: e }, Check::Recovery { fence: e }] {
                let v = validate_at(&area.0, *lsn, GEO, tip, check).unwrap();
                assert_eq!(v.header.index, i as u64);
            }
            tip = validate_at(&area.0, *lsn, GEO, tip, Check::Recovery { fence: e })
                .unwrap()
                .tip;
        }
        assert_eq!(tip, tip_after(2, 1, e));
    }

    #[test]
    fn zeroes_are_bad_magic_and_end_of_log() {
        let area = vec![0u8; CAP as usize];
        let err = validate_at(
            &area,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: Epoch::ZERO },
        )
        .unwrap_err();
        assert_eq!(err, Invalid::BadMagic { found: 0 });
        assert!(err.is_end_of_log());
    }

    #[test]
    fn stale_lap_is_lsn_mismatch() {
        let e = epoch(1, 1);
        let (area, _) = area_with(1, e);
        // The same physical bytes looked at one lap later.
        let err = validate_at(
            &area.0,
            CAP,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert_eq!(
            err,
            Invalid::LsnMismatch {
                expected: CAP,
                found: 0
            }
        );
        assert!(err.is_end_of_log());
    }

    #[test]
    fn torn_payload_is_crc_mismatch() {
        let e = epoch(1, 1);
        let (mut area, _) = area_with(1, e);
        area.0[64] ^= 0x40;
        let err = validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert!(matches!(err, Invalid::CrcMismatch { .. }), "{err}");
        assert!(!err.is_end_of_log());
    }

    #[test]
    fn oversized_and_straddling_lengths_are_bad_length() {
        let e = epoch(1, 1);
        let (mut area, _) = area_with(1, e);
        area.0[8..12].copy_from_slice(&5000u32.to_le_bytes());
        let err = validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Invalid::BadLength {
                payload_len: 5000,
                ..
            }
        ));
        // A header at the very end claiming a payload that runs off the end.
        let mut area = vec![0u8; CAP as usize];
        let lsn = CAP - 64;
        let mut header = RecordHeader {
            kind: RecordKind::Entry,
            payload_len: 1,
            lsn,
            term: 0,
            index: 0,
            prev_term: 0,
            epoch: Epoch::ZERO,
            crc: 0,
        };
        area[lsn as usize..].copy_from_slice(&header.seal(&[0]));
        let err = validate_at(
            &area,
            lsn,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert!(matches!(err, Invalid::BadLength { physical, .. } if physical == lsn));
    }

    #[test]
    fn malformed_header_with_good_crc_is_bad_header() {
        let e = epoch(1, 1);
        let (mut area, _) = area_with(1, e);
        area.0[4] = 7;
        let crc = {
            let h: [u8; 64] = area.0[..64].try_into().unwrap();
            record_crc(&h, &area.0[64..64 + 7])
        };
        area.0[60..64].copy_from_slice(&crc.to_le_bytes());
        let err = validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert_eq!(err, Invalid::BadHeader(HeaderDefect::Kind(7)));
        // The same defect with a bad CRC reads as a torn write.
        area.0[60] ^= 1;
        let err = validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: e },
        )
        .unwrap_err();
        assert!(matches!(err, Invalid::CrcMismatch { .. }));
    }

    #[test]
    fn index_gap_and_prev_term_mismatch() {
        let e = epoch(1, 1);
        let (area, lsns) = area_with(2, e);
        let fence = Check::Recovery { fence: e };
        let err = validate_at(&area.0, lsns[1], GEO, tip_after(1, 1, e), fence).unwrap_err();
        assert_eq!(
            err,
            Invalid::IndexGap {
                expected: 2,
                found: 1
            }
        );
        let err = validate_at(&area.0, lsns[1], GEO, tip_after(0, 0, e), fence).unwrap_err();
        assert_eq!(
            err,
            Invalid::PrevTermMismatch {
                index: 1,
                expected: 0,
                found: 1
            }
        );
    }

    #[test]
    fn term_regression_and_term_above_epoch() {
        let mut area = Area(vec![0; CAP as usize]);
        // Hand-made record: term 1 after an entry of term 2 (prev_term says 2).
        let mut h = RecordHeader {
            kind: RecordKind::Entry,
            payload_len: 0,
            lsn: 0,
            term: 1,
            index: 5,
            prev_term: 2,
            epoch: epoch(3, 1),
            crc: 0,
        };
        area.put_record(0, &h.seal(&[]), &[]);
        let tip = ChainTip {
            next_index: 5,
            last_term: 2,
            epoch: Epoch::ZERO,
            unanchored: false,
        };
        let err =
            validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: epoch(3, 1) }).unwrap_err();
        assert_eq!(
            err,
            Invalid::TermRegression {
                index: 5,
                previous: 2,
                found: 1
            }
        );
        h.term = 4;
        area.put_record(0, &h.seal(&[]), &[]);
        let err =
            validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: epoch(9, 1) }).unwrap_err();
        assert_eq!(
            err,
            Invalid::TermAboveEpoch {
                term: 4,
                epoch: epoch(3, 1)
            }
        );
    }

    #[test]
    fn epoch_rules_by_context() {
        let old = epoch(1, 1);
        let new = epoch(2, 2);
        let (area, _) = area_with(1, old);
        let tip = ChainTip::default();
        // Adoption: only the fence holder's records.
        assert_eq!(
            validate_at(&area.0, 0, GEO, tip, Check::Adoption { fence: new }).unwrap_err(),
            Invalid::NotFenceHolder {
                fence: new,
                found: old
            }
        );
        // Recovery: older epochs are kept...
        assert!(validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: new }).is_ok());
        // ...epochs above the fence are not...
        assert_eq!(
            validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: Epoch::ZERO }).unwrap_err(),
            Invalid::EpochAboveFence {
                fence: Epoch::ZERO,
                found: old
            }
        );
        // ...nor epochs that go backwards along the chain.
        let tip = ChainTip { epoch: new, ..tip };
        assert_eq!(
            validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: new }).unwrap_err(),
            Invalid::EpochBelowPrevious {
                previous: new,
                found: old
            }
        );
    }

    #[test]
    fn wrap_marker_validates_and_jumps_to_next_lap() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let tip = tip_after(9, 1, e);
        let mut enc = RecordEncoder::new(CAP, CAP - 64, tip, e).unwrap();
        enc.push(
            &mut area,
            &EntryRef {
                term: 1,
                index: 10,
                payload: b"x",
            },
        )
        .unwrap();
        let check = Check::Recovery { fence: e };
        let wrap = validate_at(&area.0, CAP - 64, GEO, tip, check).unwrap();
        assert_eq!(wrap.header.kind, RecordKind::Wrap);
        assert_eq!(wrap.next_lsn, CAP);
        assert_eq!(wrap.tip, tip);
        let entry = validate_at(&area.0, CAP, GEO, wrap.tip, check).unwrap();
        assert_eq!(entry.header.index, 10);
        // A wrap marker whose chain fields are off is rejected like an entry.
        let err = validate_at(&area.0, CAP - 64, GEO, tip_after(10, 1, e), check).unwrap_err();
        assert_eq!(
            err,
            Invalid::IndexGap {
                expected: 11,
                found: 10
            }
        );
    }

    #[test]
    fn wrap_marker_with_payload_is_bad_length() {
        let mut area = Area(vec![0; CAP as usize]);
        let mut h = RecordHeader {
            kind: RecordKind::Wrap,
            payload_len: 1,
            lsn: 0,
            term: 0,
            index: 0,
            prev_term: 0,
            epoch: Epoch::ZERO,
            crc: 0,
        };
        area.put_record(0, &h.seal(&[1]), &[1]);
        let err = validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::default(),
            Check::Recovery { fence: Epoch::ZERO },
        )
        .unwrap_err();
        assert!(matches!(err, Invalid::BadLength { limit: 0, .. }));
    }

    #[test]
    fn an_unanchored_log_takes_any_first_index_then_is_strict() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let mut enc = RecordEncoder::new(CAP, 0, ChainTip::after(None), e).unwrap();
        enc.push(
            &mut area,
            &EntryRef {
                term: 1,
                index: 40,
                payload: b"x",
            },
        )
        .unwrap();
        enc.push(
            &mut area,
            &EntryRef {
                term: 1,
                index: 41,
                payload: b"y",
            },
        )
        .unwrap();
        let check = Check::Recovery { fence: e };
        let first = validate_at(&area.0, 0, GEO, ChainTip::after(None), check).unwrap();
        assert_eq!(first.header.index, 40);
        assert!(!first.tip.unanchored);
        assert!(validate_at(&area.0, 128, GEO, first.tip, check).is_ok());
        // The same first record checked against an anchored chain fails.
        assert_eq!(
            validate_at(
                &area.0,
                0,
                GEO,
                ChainTip::after(Some(LogPos { term: 1, index: 9 })),
                check
            )
            .unwrap_err(),
            Invalid::IndexGap {
                expected: 10,
                found: 40
            }
        );
    }

    #[test]
    fn geometry_helpers() {
        assert_eq!(GEO.physical(CAP + 64), 64);
        assert_eq!(GEO.next_lap(CAP - 64), Some(CAP));
        assert_eq!(GEO.next_lap(CAP), Some(2 * CAP));
        assert_eq!(GEO.next_lap(0), Some(CAP));
        // The last lap of the lsn space has no next lap.
        assert_eq!(GEO.next_lap(MAX_LSN - 2 * CAP), Some(MAX_LSN - CAP));
        assert_eq!(GEO.next_lap(MAX_LSN - CAP), Some(MAX_LSN));
        assert_eq!(GEO.next_lap(MAX_LSN), None);
        assert_eq!(GEO.next_lap(u64::MAX - 63), None);
        assert_eq!(GEO.window_end(0), CAP);
        assert_eq!(GEO.window_end(MAX_LSN - 64), MAX_LSN);
        assert_eq!(GEO.window_end(u64::MAX), MAX_LSN);
    }

    /// Issue 10, item 6: a record with index u64::MAX (valid CRC) overflowed
    /// `ChainTip::advance`; indexes above MAX_INDEX are refused, in both
    /// contexts, and MAX_INDEX itself is a valid index.
    #[test]
    fn indexes_above_max_index_are_refused() {
        let e = epoch(1, 1);
        for (index, ok) in [(MAX_INDEX, true), (MAX_INDEX + 1, false), (u64::MAX, false)] {
            let mut area = Area(vec![0; CAP as usize]);
            for kind in [RecordKind::Entry, RecordKind::Wrap] {
                let mut h = RecordHeader {
                    kind,
                    payload_len: 0,
                    lsn: 0,
                    term: 1,
                    index,
                    prev_term: 1,
                    epoch: e,
                    crc: 0,
                };
                area.put_record(0, &h.seal(&[]), &[]);
                for check in [Check::Adoption { fence: e }, Check::Recovery { fence: e }] {
                    let result = validate_at(&area.0, 0, GEO, ChainTip::after(None), check);
                    if ok {
                        assert!(result.is_ok(), "{index} {kind:?}: {result:?}");
                    } else {
                        assert_eq!(result, Err(Invalid::IndexOutOfRange { index }), "{kind:?}");
                    }
                }
            }
        }
    }

    /// A record whose end, or whose next lap, lies beyond the lsn space is
    /// outside any window, not an overflow.
    #[test]
    fn records_beyond_the_lsn_space_are_outside_the_window() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let lsn = MAX_LSN;
        let mut h = RecordHeader {
            kind: RecordKind::Wrap,
            payload_len: 0,
            lsn,
            term: 0,
            index: 0,
            prev_term: 0,
            epoch: e,
            crc: 0,
        };
        area.put_record(lsn, &h.seal(&[]), &[]);
        let check = Check::Recovery { fence: e };
        assert!(matches!(
            validate_at(&area.0, lsn, GEO, ChainTip::after(None), check),
            Err(Invalid::OutsideWindow { .. })
        ));
        h.kind = RecordKind::Entry;
        area.put_record(lsn, &h.seal(&[]), &[]);
        assert!(matches!(
            validate_at(&area.0, lsn, GEO, ChainTip::after(None), check),
            Err(Invalid::OutsideWindow { .. })
        ));
        // The last line before the end: an entry ends exactly at MAX_LSN.
        h.lsn = MAX_LSN - 64;
        area.put_record(h.lsn, &h.seal(&[]), &[]);
        let valid = validate_at(&area.0, h.lsn, GEO, ChainTip::after(None), check).unwrap();
        assert_eq!(valid.next_lsn, MAX_LSN);
    }
}
