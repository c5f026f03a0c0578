//! The byte layout of a ring region: the 4 KiB control block in front of the
//! data area.
//!
//! This module owns the numbers (offsets, sizes, magic values, limits) and
//! the codec of the control block's static header. It never touches a file or
//! a mapping: [`crate::ring`] does that with these offsets.
//!
//! # Region layout, version 1
//!
//! ```text
//! file offset   size      what
//! 0             4096      control block (below)
//! 4096          capacity  data area: records, 64-byte aligned (see crate::record)
//! ```
//!
//! Control block: every word sits on a 64-byte line of its own so that the
//! fabric can register each one separately (least privilege) and a remote
//! atomic on one never shares a cache line with another.
//!
//! ```text
//! offset  size  field                 remote access   written by
//! 0       64    static header         none            the owner, at create/open
//!   0       8     magic "RRFTRING"
//!   8       4     layout version (u32 LE) = 1
//!   12      4     control block bytes (u32 LE) = 4096
//!   16      8     capacity of the data area in bytes (power of two)
//!   24      8     cluster id
//!   32      8     node id
//!   40      8     incarnation (bumped at every open)
//!   48      12    reserved, zero
//!   60      4     CRC32 of bytes 0..60
//! 64      8     fence                 READ, ATOMIC    the fence holder, by CAS only
//! 128     8     head                  READ            the owner (after purge)
//! 192     8     commit hint           none            the owner, from the leader's message
//! 256     8     acked watermark       none            the owner (local only, see below)
//! 320..4096     reserved, zero
//! ```
//!
//! All integers are little-endian. `fence` is an [`Epoch`]: `term << 16 |
//! leader_id`. `head` is the logical offset (lsn) of the oldest byte still
//! needed. `commit` and `acked` hold *one past* an index (`index + 1`, and 0
//! for "none"), because openraft's log indexes start at 0.
//!
//! The `acked` word is an addition to DESIGN.md's control block: it is the
//! highest index this node ever acknowledged, written after the records below
//! it are durable and made durable by the same msync of the control page that
//! already carries the fence. Keeping it in the metadata file would cost an
//! atomic file replacement (two fsyncs) per acknowledged batch. The ring
//! lives in shared memory ([`crate::shm`]), so the control words outlive a
//! killed process, not a reboot.

use crate::error::LayoutError;

/// Size of the control block in front of the data area, in bytes.
pub const CONTROL_BLOCK_BYTES: usize = 4096;
/// Size of a cache line; every control word and every record is aligned to it.
pub const LINE_BYTES: usize = 64;
/// Magic at offset 0 of a ring file.
pub const RING_MAGIC: [u8; 8] = *b"RRFTRING";
/// Version of this byte layout (control block and records).
pub const LAYOUT_VERSION: u32 = 1;

/// Offset of the static header in the control block.
pub const HEADER_OFFSET: usize = 0;
/// Offset of the fence word in the control block.
pub const FENCE_OFFSET: usize = 64;
/// Offset of the head word in the control block.
pub const HEAD_OFFSET: usize = 128;
/// Offset of the commit hint word in the control block.
pub const COMMIT_OFFSET: usize = 192;
/// Offset of the acknowledged-index watermark word in the control block.
pub const ACKED_OFFSET: usize = 256;

/// Smallest data area capacity, in bytes.
pub const MIN_CAPACITY_BYTES: u64 = 1 << 20;
/// Largest data area capacity, in bytes.
pub const MAX_CAPACITY_BYTES: u64 = 1 << 40;

const HEADER_CRC_OFFSET: usize = 60;

/// The end of the logical offset space: no log position (`head`, the tail,
/// a record's `lsn` or its end) ever lies beyond it, so that a position plus
/// two capacities still fits in a `u64` and no lsn arithmetic can overflow.
/// It is `2^64 - 2^42`, a multiple of every capacity, so the last lap ends
/// exactly there. A ring written at 50 GB/s (a 400 Gb/s NIC at line rate,
/// without pause) reaches it after 11 years; then it refuses to write
/// ([`crate::WalError::LsnSpaceExhausted`]) rather than wrap.
pub const MAX_LSN: u64 = u64::MAX - 4 * MAX_CAPACITY_BYTES + 1;
/// The largest Raft log index a ring holds (`2^63 - 1`): one past any index,
/// and the control words that store `index + 1`, always fit in a `u64`. At a
/// billion entries per second a log reaches it after 292 years.
pub const MAX_INDEX: u64 = i64::MAX as u64;

const _: () = {
    assert!(MAX_LSN.is_multiple_of(MAX_CAPACITY_BYTES));
    assert!(MAX_LSN.checked_add(3 * MAX_CAPACITY_BYTES).is_some());
};

/// Number of bits of an epoch that hold the leader id.
pub const EPOCH_LEADER_BITS: u32 = 16;
/// Largest node id an epoch can carry.
pub const MAX_NODE_ID: u64 = (1 << EPOCH_LEADER_BITS) - 1;
/// Largest term an epoch can carry.
pub const MAX_TERM: u64 = (1 << (64 - EPOCH_LEADER_BITS)) - 1;

/// A fence value: `term << 16 | leader_id`.
///
/// Ordering epochs as integers orders them by term first, then by leader id,
/// which is what the fence's "only upward" rule needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch before any leader: term 0, leader 0.
    pub const ZERO: Epoch = Epoch(0);

    /// Builds the epoch of `leader_id` in `term`, or `None` when either does
    /// not fit (term above [`MAX_TERM`], id above [`MAX_NODE_ID`]).
    pub fn new(term: u64, leader_id: u64) -> Option<Epoch> {
        (term <= MAX_TERM && leader_id <= MAX_NODE_ID)
            .then_some(Epoch(term << EPOCH_LEADER_BITS | leader_id))
    }

    /// The term this epoch belongs to.
    pub fn term(self) -> u64 {
        self.0 >> EPOCH_LEADER_BITS
    }

    /// The leader that holds (or held) this epoch.
    pub fn leader_id(self) -> u64 {
        self.0 & MAX_NODE_ID
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch(term {}, leader {})",
            self.term(),
            self.leader_id()
        )
    }
}

/// The static header of a ring file (control block line 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingHeader {
    /// Capacity of the data area in bytes (a power of two).
    pub capacity: u64,
    /// The cluster this ring belongs to.
    pub cluster_id: u64,
    /// The node that owns this ring.
    pub node_id: u64,
    /// Bumped at every open; a leader that sees a new incarnation redoes the
    /// handshake and no rkey of an older incarnation is honoured.
    pub incarnation: u64,
}

/// Encoded size of [`RingHeader`].
pub const RING_HEADER_BYTES: usize = LINE_BYTES;

impl RingHeader {
    /// Encodes the header into its 64-byte line, CRC included.
    pub fn encode(&self) -> [u8; RING_HEADER_BYTES] {
        let mut line = [0u8; RING_HEADER_BYTES];
        line[0..8].copy_from_slice(&RING_MAGIC);
        line[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        line[12..16].copy_from_slice(&(CONTROL_BLOCK_BYTES as u32).to_le_bytes());
        line[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        line[24..32].copy_from_slice(&self.cluster_id.to_le_bytes());
        line[32..40].copy_from_slice(&self.node_id.to_le_bytes());
        line[40..48].copy_from_slice(&self.incarnation.to_le_bytes());
        let crc = crc32fast::hash(&line[..HEADER_CRC_OFFSET]);
        line[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        line
    }

    /// Decodes and checks a header line: magic, version, control block size,
    /// CRC, reserved bytes and capacity must all be right.
    pub fn decode(line: &[u8]) -> Result<RingHeader, LayoutError> {
        if line.len() < RING_HEADER_BYTES {
            return Err(LayoutError::Truncated {
                needed: RING_HEADER_BYTES,
                found: line.len(),
            });
        }
        let line = &line[..RING_HEADER_BYTES];
        if line[0..8] != RING_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let stored_crc = le_u32(&line[HEADER_CRC_OFFSET..]);
        let computed_crc = crc32fast::hash(&line[..HEADER_CRC_OFFSET]);
        if stored_crc != computed_crc {
            return Err(LayoutError::HeaderCrc {
                stored: stored_crc,
                computed: computed_crc,
            });
        }
        let version = le_u32(&line[8..]);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::UnsupportedVersion(version));
        }
        let control_bytes = le_u32(&line[12..]);
        if control_bytes as usize != CONTROL_BLOCK_BYTES {
            return Err(LayoutError::ControlBlockSize(control_bytes));
        }
        if line[48..60].iter().any(|b| *b != 0) {
            return Err(LayoutError::ReservedNotZero);
        }
        let header = RingHeader {
            capacity: le_u64(&line[16..]),
            cluster_id: le_u64(&line[24..]),
            node_id: le_u64(&line[32..]),
            incarnation: le_u64(&line[40..]),
        };
        check_capacity(header.capacity)?;
        Ok(header)
    }
}

/// Checks that `lsn` can be a log position: line aligned and at most
/// [`MAX_LSN`]. `field` names it in the error.
pub fn check_lsn(field: &'static str, lsn: u64) -> Result<(), LayoutError> {
    if !lsn.is_multiple_of(LINE_BYTES as u64) {
        return Err(LayoutError::OutOfRange {
            field,
            value: lsn,
            rule: "a log position must be a multiple of 64",
        });
    }
    if lsn > MAX_LSN {
        return Err(LayoutError::OutOfRange {
            field,
            value: lsn,
            rule: "beyond the end of the lsn space (2^64 - 2^42)",
        });
    }
    Ok(())
}

/// Checks that `index` is at most [`MAX_INDEX`]. `field` names it in the
/// error.
pub fn check_index(field: &'static str, index: u64) -> Result<(), LayoutError> {
    if index > MAX_INDEX {
        return Err(LayoutError::OutOfRange {
            field,
            value: index,
            rule: "above the largest log index (2^63 - 1)",
        });
    }
    Ok(())
}

/// Checks that `term` fits in an epoch (at most [`MAX_TERM`]). `field`
/// names it in the error.
pub fn check_term(field: &'static str, term: u64) -> Result<(), LayoutError> {
    if term > MAX_TERM {
        return Err(LayoutError::OutOfRange {
            field,
            value: term,
            rule: "above the largest term an epoch carries (2^48 - 1)",
        });
    }
    Ok(())
}

/// Checks that `capacity` is a power of two within
/// [`MIN_CAPACITY_BYTES`]..=[`MAX_CAPACITY_BYTES`].
pub fn check_capacity(capacity: u64) -> Result<(), LayoutError> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY_BYTES..=MAX_CAPACITY_BYTES).contains(&capacity)
    {
        return Err(LayoutError::BadCapacity(capacity));
    }
    Ok(())
}

/// Encodes an optional index as a control word (`index + 1`, 0 for none).
pub fn encode_index_word(index: Option<u64>) -> u64 {
    match index {
        Some(i) => {
            assert!(i < u64::MAX, "index {i} cannot be stored as a word");
            i + 1
        }
        None => 0,
    }
}

/// Decodes a control word written by [`encode_index_word`].
pub fn decode_index_word(word: u64) -> Option<u64> {
    word.checked_sub(1)
}

/// Rounds `n` up to a multiple of [`LINE_BYTES`].
pub const fn align_line(n: u64) -> u64 {
    (n + LINE_BYTES as u64 - 1) & !(LINE_BYTES as u64 - 1)
}

pub(crate) fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

pub(crate) fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RingHeader {
        RingHeader {
            capacity: 1 << 20,
            cluster_id: 0xC1u64,
            node_id: 3,
            incarnation: 7,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = sample();
        let line = h.encode();
        assert_eq!(RingHeader::decode(&line), Ok(h));
    }

    #[test]
    fn header_bytes_are_where_the_doc_says() {
        let line = sample().encode();
        assert_eq!(&line[0..8], b"RRFTRING");
        assert_eq!(le_u32(&line[8..]), 1);
        assert_eq!(le_u32(&line[12..]), 4096);
        assert_eq!(le_u64(&line[16..]), 1 << 20);
        assert_eq!(le_u64(&line[24..]), 0xC1);
        assert_eq!(le_u64(&line[32..]), 3);
        assert_eq!(le_u64(&line[40..]), 7);
        assert!(line[48..60].iter().all(|b| *b == 0));
    }

    #[test]
    fn header_rejects_every_single_bit_flip() {
        let line = sample().encode();
        for bit in 0..(RING_HEADER_BYTES * 8) {
            let mut bad = line;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(RingHeader::decode(&bad).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn header_rejects_wrong_magic_version_size_and_capacity() {
        let mut bad = sample().encode();
        bad[0] = b'X';
        assert_eq!(RingHeader::decode(&bad), Err(LayoutError::BadMagic));

        let reseal = |mut line: [u8; 64]| {
            let crc = crc32fast::hash(&line[..60]);
            line[60..].copy_from_slice(&crc.to_le_bytes());
            line
        };
        let mut v2 = sample().encode();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(
            RingHeader::decode(&reseal(v2)),
            Err(LayoutError::UnsupportedVersion(2))
        );
        let mut size = sample().encode();
        size[12..16].copy_from_slice(&8192u32.to_le_bytes());
        assert_eq!(
            RingHeader::decode(&reseal(size)),
            Err(LayoutError::ControlBlockSize(8192))
        );
        let mut cap = sample().encode();
        cap[16..24].copy_from_slice(&((1u64 << 20) + 64).to_le_bytes());
        assert_eq!(
            RingHeader::decode(&reseal(cap)),
            Err(LayoutError::BadCapacity((1 << 20) + 64))
        );
        let mut reserved = sample().encode();
        reserved[50] = 1;
        assert_eq!(
            RingHeader::decode(&reseal(reserved)),
            Err(LayoutError::ReservedNotZero)
        );
        assert!(matches!(
            RingHeader::decode(&line_of(10)),
            Err(LayoutError::Truncated { .. })
        ));
    }

    fn line_of(n: usize) -> Vec<u8> {
        vec![0; n]
    }

    #[test]
    fn control_words_have_lines_of_their_own() {
        let offsets = [
            HEADER_OFFSET,
            FENCE_OFFSET,
            HEAD_OFFSET,
            COMMIT_OFFSET,
            ACKED_OFFSET,
        ];
        for pair in offsets.windows(2) {
            assert_eq!(pair[1] - pair[0], LINE_BYTES);
        }
        const { assert!(ACKED_OFFSET + LINE_BYTES <= CONTROL_BLOCK_BYTES) };
    }

    #[test]
    fn epoch_packs_term_and_leader() {
        let e = Epoch::new(5, 3).unwrap();
        assert_eq!(e.0, 5 << 16 | 3);
        assert_eq!((e.term(), e.leader_id()), (5, 3));
        assert!(Epoch::new(5, 3) < Epoch::new(6, 0));
        assert!(Epoch::new(5, 3) > Epoch::new(5, 2));
        assert_eq!(Epoch::new(1, MAX_NODE_ID + 1), None);
        assert_eq!(Epoch::new(MAX_TERM + 1, 1), None);
        assert_eq!(Epoch::new(MAX_TERM, MAX_NODE_ID), Some(Epoch(u64::MAX)));
    }

    #[test]
    fn index_words_round_trip() {
        for i in [None, Some(0), Some(1), Some(u64::MAX - 1)] {
            assert_eq!(decode_index_word(encode_index_word(i)), i);
        }
        assert_eq!(encode_index_word(None), 0);
    }

    #[test]
    fn capacity_bounds() {
        assert!(check_capacity(1 << 20).is_ok());
        assert!(check_capacity(1 << 40).is_ok());
        assert!(check_capacity(1 << 19).is_err());
        assert!(check_capacity(1 << 41).is_err());
        assert!(check_capacity(3 << 20).is_err());
    }

    #[test]
    fn align_line_rounds_up() {
        assert_eq!(align_line(0), 0);
        assert_eq!(align_line(1), 64);
        assert_eq!(align_line(64), 64);
        assert_eq!(align_line(65), 128);
    }
}
