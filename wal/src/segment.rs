//! The segment file format: the log on disk beyond the ring.
//!
//! Every node writes the entry records it appended or adopted in its ring
//! into append-only segment files, byte for byte as they are in the ring
//! (no re-encoding: the caller hands slices of its ring memory). A segment
//! is a 64-byte header followed by records; a record never straddles two
//! segments, and wrap markers are never written. [`crate::segment_log`]
//! owns the files; this module is pure code (no I/O): the header codec,
//! the file names, and the scan of one segment's bytes.
//!
//! # Segment header, version 1
//!
//! ```text
//! offset  size  field
//! 0       8     magic "RRFTSEGM"
//! 8       4     segment format version (u32 LE) = 1
//! 12      4     header bytes (u32 LE) = 64
//! 16      8     cluster id
//! 24      8     node id
//! 32      8     first index: the index of the segment's first record
//! 40      8     prev_term: the term of the entry before it (its first
//!               record's prev_term; any value for a log's very first entry)
//! 48      12    reserved, zero
//! 60      4     CRC32 (crc32fast, IEEE) of bytes 0..60
//! 64      ...   records, one after the other, each exactly as in the ring
//!               (crate::record: a 64-byte header with magic, kind = entry,
//!               payload length, lsn, term, index, prev_term, epoch, CRC32;
//!               the payload; padding to a multiple of 64)
//! end     ...   zeroes (preallocated space) or nothing
//! ```
//!
//! All integers are little-endian. A segment is named after its first
//! index, `<first index, 20 decimal digits>.seg`, so that listing the
//! directory in name order gives the log's order.
//!
//! # Chain rules in a segment
//!
//! The ring's ([`crate::validate`]) in the context [`Check::Segment`]: CRC,
//! index = previous + 1, prev_term = previous term, term not below the
//! previous term nor above its epoch's term, epoch not below the previous
//! record's. The lsn rule differs: a record's lsn names its place in the
//! ring, not in the file, so along the log lsns only grow: a record starts
//! at or beyond the end (`lsn + length`) of the one before it (the ring's
//! wrap markers, left out here, skip lsns). The first record of a segment
//! continues the segment's header (its index and prev_term), and each
//! segment's header continues the segment before it. The record size limit
//! of the configuration is not applied when reading (lowering it must not
//! hide records written under a higher one): a record must lie within its
//! file.
//!
//! Every word read from a file is checked before use (checked arithmetic,
//! ranges): bad bytes give a [`SegmentDefect`], never a panic.

use crate::crc::PrefixCrcs;
use crate::error::LayoutError;
use crate::layout::{Epoch, LINE_BYTES, MAX_INDEX, MAX_LSN, le_u32, le_u64};
use crate::record::{RECORD_CRC_OFFSET, RECORD_HEADER_BYTES, record_crc, record_len};
use crate::validate::{ChainTip, Check, Geometry, Invalid, stored_crc, validate_fields};

/// Magic at offset 0 of a segment file: "RRFTSEGM".
pub const SEGMENT_MAGIC: [u8; 8] = *b"RRFTSEGM";
/// Version of the segment format.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of a segment header in bytes.
pub const SEGMENT_HEADER_BYTES: usize = LINE_BYTES;
/// Name of the folder of a data directory that holds the segments.
pub const SEGMENT_DIR: &str = "log";
/// Suffix of a segment file's name.
pub const SEGMENT_SUFFIX: &str = ".seg";
/// Largest segment file read or written, in bytes: offsets within a
/// segment fit in a `u32`.
pub const MAX_SEGMENT_FILE_BYTES: u64 = u32::MAX as u64 - (u32::MAX as u64 % LINE_BYTES as u64);

const SEGMENT_CRC_OFFSET: usize = 60;
const NAME_DIGITS: usize = 20;

/// A decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The cluster the segment belongs to.
    pub cluster_id: u64,
    /// The node that wrote it.
    pub node_id: u64,
    /// Index of its first record.
    pub first_index: u64,
    /// Term of the entry before its first record.
    pub prev_term: u64,
}

impl SegmentHeader {
    /// Encodes the header with its CRC.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut h = [0u8; SEGMENT_HEADER_BYTES];
        h[0..8].copy_from_slice(&SEGMENT_MAGIC);
        h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(SEGMENT_HEADER_BYTES as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.cluster_id.to_le_bytes());
        h[24..32].copy_from_slice(&self.node_id.to_le_bytes());
        h[32..40].copy_from_slice(&self.first_index.to_le_bytes());
        h[40..48].copy_from_slice(&self.prev_term.to_le_bytes());
        let crc = crc32fast::hash(&h[..SEGMENT_CRC_OFFSET]);
        h[SEGMENT_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes and checks a header: magic, CRC, version, size, reserved
    /// bytes, and the first index within [`MAX_INDEX`].
    ///
    /// # Errors
    /// The first defect found, as a [`LayoutError`].
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, LayoutError> {
        let Some(h) = bytes.get(..SEGMENT_HEADER_BYTES) else {
            return Err(LayoutError::Truncated {
                needed: SEGMENT_HEADER_BYTES,
                found: bytes.len(),
            });
        };
        if h[0..8] != SEGMENT_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let stored = le_u32(&h[SEGMENT_CRC_OFFSET..]);
        let computed = crc32fast::hash(&h[..SEGMENT_CRC_OFFSET]);
        if stored != computed {
            return Err(LayoutError::HeaderCrc { stored, computed });
        }
        let version = le_u32(&h[8..]);
        if version != SEGMENT_VERSION {
            return Err(LayoutError::UnsupportedVersion(version));
        }
        if le_u32(&h[12..]) != SEGMENT_HEADER_BYTES as u32 {
            return Err(LayoutError::BadField("segment header bytes"));
        }
        if h[48..60].iter().any(|b| *b != 0) {
            return Err(LayoutError::ReservedNotZero);
        }
        let header = SegmentHeader {
            cluster_id: le_u64(&h[16..]),
            node_id: le_u64(&h[24..]),
            first_index: le_u64(&h[32..]),
            prev_term: le_u64(&h[40..]),
        };
        crate::layout::check_index("segment first index", header.first_index)?;
        Ok(header)
    }
}

/// The file name of the segment whose first index is `first_index`.
pub fn segment_name(first_index: u64) -> String {
    format!("{first_index:0NAME_DIGITS$}{SEGMENT_SUFFIX}")
}

/// The first index a segment file name stands for, or `None` when the name
/// is not a segment's.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Why the scan of a segment stopped where it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SegmentDefect {
    /// The segment's bytes end here: the file ends, or zeroes or bytes
    /// without a record's magic follow (preallocated space). The log may
    /// go on in the next segment.
    #[error("end of data")]
    EndOfData,
    /// The header cannot be decoded.
    #[error("bad segment header: {0}")]
    Header(LayoutError),
    /// The header's first index is not the one its file name says.
    #[error("the header says first index {header}, the file name {name}")]
    NameMismatch {
        /// First index in the name.
        name: u64,
        /// First index in the header.
        header: u64,
    },
    /// The segment does not continue the one before it.
    #[error(
        "segment starts at index {first_index} after term {prev_term}; the log needs index {expected_index} after term {expected_term}"
    )]
    NotContinuing {
        /// The index the log needed next.
        expected_index: u64,
        /// The term of the log's last entry.
        expected_term: u64,
        /// The segment's first index.
        first_index: u64,
        /// The segment's prev_term.
        prev_term: u64,
    },
    /// A record's bytes run past the end of the file (a torn write).
    #[error("a record of {record_bytes} bytes runs past the end of the file ({file_bytes} bytes)")]
    PastEndOfFile {
        /// Bytes the record needs from its start.
        record_bytes: u64,
        /// Bytes of the file from the record's start.
        file_bytes: u64,
    },
    /// A valid record that is not an entry (a wrap marker: never written
    /// to a segment).
    #[error("a record of kind {kind} (segments hold entries only)")]
    NotAnEntry {
        /// Its kind byte.
        kind: u8,
    },
    /// The record's lsn does not follow the previous record's end.
    #[error("lsn {found} is not a log position at or after {previous_end} (lsns only grow)")]
    LsnNotIncreasing {
        /// Where the previous record ended.
        previous_end: u64,
        /// The record's lsn.
        found: u64,
    },
    /// The record breaks a chain rule (or its CRC).
    #[error("{0}")]
    Record(Invalid),
}

impl SegmentDefect {
    /// True when no record starts here: the segment's data simply ends.
    pub fn is_end_of_data(&self) -> bool {
        matches!(
            self,
            SegmentDefect::EndOfData | SegmentDefect::Header(LayoutError::BadMagic)
        )
    }
}

/// One term run of a segment: from `first_index` on, entries have `term`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TermRun {
    pub first_index: u64,
    pub term: u64,
}

/// What a scan of a segment's records found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordsScan {
    /// File offset of each valid record.
    pub offsets: Vec<u32>,
    /// The term runs of the valid records.
    pub terms: Vec<TermRun>,
    /// The chain state after the last valid record.
    pub tip: ChainTip,
    /// Where the last valid record ends in lsn space.
    pub lsn_end: u64,
    /// File offset one past the last valid record.
    pub end: u64,
    /// Why the scan stopped at `end`.
    pub stop: SegmentDefect,
}

/// The record layout checks that need no chain: a valid entry record of
/// `buf` at `offset` (CRC included) returns its header's fields and its
/// length in the file.
pub(crate) struct RecordAt {
    pub header: crate::record::RecordHeader,
    pub len: u64,
}

/// Geometry handed to [`validate_fields`]: a segment has no data area, and
/// the only use of it there is for wrap markers, which a segment scan
/// refuses before (`NotAnEntry`).
const NO_AREA: Geometry = Geometry {
    capacity: crate::layout::MAX_CAPACITY_BYTES,
    max_payload_bytes: u32::MAX as u64,
};

/// The header line at `offset` and the record length it claims, if a
/// record can start there: `Err(EndOfData)` when the bytes hold no magic,
/// `Err(PastEndOfFile)` when the record would run past `buf`.
fn record_bounds(
    buf: &[u8],
    offset: usize,
) -> Result<(&[u8; RECORD_HEADER_BYTES], usize), SegmentDefect> {
    let rest = buf.get(offset..).unwrap_or(&[]);
    if rest.len() < RECORD_HEADER_BYTES {
        return if rest.iter().all(|b| *b == 0) {
            Err(SegmentDefect::EndOfData)
        } else {
            Err(SegmentDefect::PastEndOfFile {
                record_bytes: RECORD_HEADER_BYTES as u64,
                file_bytes: rest.len() as u64,
            })
        };
    }
    let header: &[u8; RECORD_HEADER_BYTES] =
        rest[..RECORD_HEADER_BYTES].try_into().expect("64 bytes");
    if le_u32(&header[0..]) != crate::record::RECORD_MAGIC {
        return Err(SegmentDefect::EndOfData);
    }
    let payload_len = le_u32(&header[8..]) as u64;
    let len = record_len(payload_len);
    if len > rest.len() as u64 {
        return Err(SegmentDefect::PastEndOfFile {
            record_bytes: len,
            file_bytes: rest.len() as u64,
        });
    }
    Ok((header, len as usize))
}

/// Checks the record at `offset` of `buf` against the chain `tip` and the
/// previous record's lsn end.
pub(crate) fn record_at(
    buf: &[u8],
    offset: usize,
    tip: ChainTip,
    lsn_end: u64,
) -> Result<RecordAt, SegmentDefect> {
    let (header, len) = record_bounds(buf, offset)?;
    let payload_len = le_u32(&header[8..]) as usize;
    let payload = &buf[offset + RECORD_HEADER_BYTES..offset + RECORD_HEADER_BYTES + payload_len];
    let stored = stored_crc(header);
    let computed = record_crc(header, payload);
    if stored != computed {
        return Err(SegmentDefect::Record(Invalid::CrcMismatch {
            stored,
            computed,
        }));
    }
    let kind = header[4];
    if kind != crate::record::RecordKind::Entry as u8 {
        // A wrap marker, or a kind no record has (the layout check below
        // would name it; both break the segment).
        return Err(SegmentDefect::NotAnEntry { kind });
    }
    let valid =
        validate_fields(header, NO_AREA, tip, Check::Segment).map_err(SegmentDefect::Record)?;
    let lsn = valid.header.lsn;
    if !lsn.is_multiple_of(LINE_BYTES as u64) || lsn < lsn_end {
        return Err(SegmentDefect::LsnNotIncreasing {
            previous_end: lsn_end,
            found: lsn,
        });
    }
    // validate_fields checked lsn + length within MAX_LSN.
    debug_assert!(lsn.checked_add(len as u64).is_some_and(|e| e <= MAX_LSN));
    Ok(RecordAt {
        header: valid.header,
        len: len as u64,
    })
}

/// Scans the records of one segment's bytes `buf` (the whole file) from
/// offset `start` after the chain state `tip` and lsn end `lsn_end`,
/// stopping at the first that is not valid.
///
/// # Panics
/// When `buf` is longer than [`MAX_SEGMENT_FILE_BYTES`] (callers check file
/// lengths first) or `start` is not line aligned.
pub(crate) fn scan_records(buf: &[u8], start: u64, tip: ChainTip, lsn_end: u64) -> RecordsScan {
    assert!(
        buf.len() as u64 <= MAX_SEGMENT_FILE_BYTES,
        "segment too large to scan"
    );
    assert!(start.is_multiple_of(LINE_BYTES as u64));
    let mut scan = RecordsScan {
        offsets: Vec::new(),
        terms: Vec::new(),
        tip,
        lsn_end,
        end: start,
        stop: SegmentDefect::EndOfData,
    };
    loop {
        let offset = scan.end as usize;
        if offset == buf.len() {
            scan.stop = SegmentDefect::EndOfData;
            return scan;
        }
        match record_at(buf, offset, scan.tip, scan.lsn_end) {
            Ok(record) => {
                let h = record.header;
                scan.offsets.push(offset as u32);
                if scan.terms.last().is_none_or(|run| run.term != h.term) {
                    scan.terms.push(TermRun {
                        first_index: h.index,
                        term: h.term,
                    });
                }
                scan.tip = scan.tip.advance(&h);
                scan.lsn_end = h.lsn + record.len;
                scan.end += record.len;
            }
            Err(defect) => {
                scan.stop = defect;
                return scan;
            }
        }
    }
}

/// A record found beyond a break: evidence that the log lost entries
/// inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Beyond {
    pub offset: u64,
    pub lsn: u64,
    pub index: u64,
    pub epoch: Epoch,
}

/// Looks in `buf` (a segment's bytes) from `from` on, line by line, for an
/// entry record that is intact on its own (magic, length within the file,
/// layout, CRC) and could only have been written after the log's last valid
/// record: an index at or above the one the log needed next (any, when the
/// log is empty), an epoch not below the last record's, a term not above
/// its epoch's. The CRC is checked last, and costs constant time per
/// candidate once one file's worth of bytes has been checksummed directly
/// (as [`crate::recovery`] does), so the search is linear in the file.
pub(crate) fn well_formed_beyond(buf: &[u8], from: u64, tip: ChainTip) -> Option<Beyond> {
    let mut offset = usize::try_from(from).ok()?.next_multiple_of(LINE_BYTES);
    let mut direct_budget = buf.len() as u64;
    let mut prefixes: Option<PrefixCrcs> = None;
    while offset + RECORD_HEADER_BYTES <= buf.len() {
        if let Ok((header, _)) = record_bounds(buf, offset) {
            let own_chain = ChainTip {
                next_index: le_u64(&header[32..]),
                last_term: le_u64(&header[40..]),
                epoch: tip.epoch,
                unanchored: false,
            };
            if header[4] == crate::record::RecordKind::Entry as u8
                && let Ok(valid) = validate_fields(header, NO_AREA, own_chain, Check::Segment)
                && (tip.unanchored || valid.header.index >= tip.next_index)
            {
                let payload_len = valid.header.payload_len as usize;
                let start = offset + RECORD_HEADER_BYTES;
                let cost = (RECORD_CRC_OFFSET + payload_len) as u64;
                let crc = if prefixes.is_none() && cost <= direct_budget {
                    direct_budget -= cost;
                    record_crc(header, &buf[start..start + payload_len])
                } else {
                    let prefixes = prefixes.get_or_insert_with(|| PrefixCrcs::new(buf));
                    let (payload_crc, _) = prefixes.range(buf, start, start + payload_len);
                    let header_crc = crc32fast::hash(&header[..RECORD_CRC_OFFSET]);
                    crate::crc::shift(header_crc, payload_len as u64) ^ payload_crc
                };
                if crc == stored_crc(header) {
                    return Some(Beyond {
                        offset: offset as u64,
                        lsn: valid.header.lsn,
                        index: valid.header.index,
                        epoch: valid.header.epoch,
                    });
                }
            }
        }
        offset += LINE_BYTES;
    }
    None
}

/// The chain fields of a record header from the caller's own memory (an
/// append): no CRC, just what chaining needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnRecord {
    pub index: u64,
    pub term: u64,
    pub prev_term: u64,
    pub lsn: u64,
    pub epoch: Epoch,
    pub payload_len: u64,
    pub len: usize,
}

/// Decodes the header of a record the caller hands over for appending.
///
/// # Panics
/// When the bytes are not a whole entry record: the caller hands over
/// records of its own ring, which it validated, so anything else is a bug.
pub(crate) fn own_record(bytes: &[u8]) -> OwnRecord {
    assert!(
        bytes.len() >= RECORD_HEADER_BYTES,
        "a record slice shorter than a header ({} bytes)",
        bytes.len()
    );
    let header: &[u8; RECORD_HEADER_BYTES] =
        bytes[..RECORD_HEADER_BYTES].try_into().expect("64 bytes");
    let decoded = crate::record::RecordHeader::decode(header)
        .unwrap_or_else(|defect| panic!("appending a record that does not decode: {defect:?}"));
    assert_eq!(
        decoded.kind,
        crate::record::RecordKind::Entry,
        "only entry records go to segments"
    );
    assert!(decoded.index <= MAX_INDEX, "record index above MAX_INDEX");
    let len = decoded.record_len() as usize;
    assert!(
        len <= bytes.len(),
        "record {} claims {len} bytes, the slice has {}",
        decoded.index,
        bytes.len()
    );
    // Cheap enough to check always (wal/BENCH.md: ~2 µs per 64 KiB): a
    // record whose bytes changed in the ring since they were checked is
    // never made durable.
    assert_eq!(
        record_crc(
            header,
            &bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + decoded.payload_len as usize]
        ),
        decoded.crc,
        "record {} handed to the segment log has a bad CRC",
        decoded.index
    );
    OwnRecord {
        index: decoded.index,
        term: decoded.term,
        prev_term: decoded.prev_term,
        lsn: decoded.lsn,
        epoch: decoded.epoch,
        payload_len: decoded.payload_len as u64,
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_bytes_are_where_the_doc_says() {
        let h = SegmentHeader {
            cluster_id: 7,
            node_id: 3,
            first_index: 1234,
            prev_term: 9,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], b"RRFTSEGM");
        assert_eq!(le_u32(&b[8..]), 1);
        assert_eq!(le_u32(&b[12..]), 64);
        assert_eq!(le_u64(&b[16..]), 7);
        assert_eq!(le_u64(&b[24..]), 3);
        assert_eq!(le_u64(&b[32..]), 1234);
        assert_eq!(le_u64(&b[40..]), 9);
        assert_eq!(le_u32(&b[60..]), crc32fast::hash(&b[..60]));
        assert_eq!(SegmentHeader::decode(&b), Ok(h));
    }

    #[test]
    fn header_defects_are_errors() {
        let good = SegmentHeader {
            cluster_id: 7,
            node_id: 3,
            first_index: 1,
            prev_term: 1,
        }
        .encode();
        assert!(matches!(
            SegmentHeader::decode(&good[..10]),
            Err(LayoutError::Truncated { .. })
        ));
        assert_eq!(SegmentHeader::decode(&[0; 64]), Err(LayoutError::BadMagic));
        let mut bad = good;
        bad[20] ^= 1;
        assert!(matches!(
            SegmentHeader::decode(&bad),
            Err(LayoutError::HeaderCrc { .. })
        ));
        let reseal = |mut b: [u8; 64]| {
            let crc = crc32fast::hash(&b[..60]);
            b[60..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut bad = good;
        bad[8] = 2;
        assert_eq!(
            SegmentHeader::decode(&reseal(bad)),
            Err(LayoutError::UnsupportedVersion(2))
        );
        let mut bad = good;
        bad[50] = 1;
        assert_eq!(
            SegmentHeader::decode(&reseal(bad)),
            Err(LayoutError::ReservedNotZero)
        );
        let mut bad = good;
        bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            SegmentHeader::decode(&reseal(bad)),
            Err(LayoutError::OutOfRange { .. })
        ));
    }

    #[test]
    fn names_sort_in_index_order_and_parse_back() {
        assert_eq!(segment_name(42), "00000000000000000042.seg");
        assert_eq!(parse_segment_name(&segment_name(42)), Some(42));
        assert_eq!(parse_segment_name(&segment_name(u64::MAX)), Some(u64::MAX));
        assert!(segment_name(9) < segment_name(10));
        for bad in [
            "42.seg",
            "0000000000000000004x.seg",
            "00000000000000000042.tmp",
            "",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }
}
