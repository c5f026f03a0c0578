//! The vote / metadata file: what must survive a crash outside the remotely
//! writable ring.
//!
//! It holds the cluster and node ids, the vote, the last purged log id with
//! the lsn where the log continues (recovery's starting point) and the last
//! committed log id. It is small, CRC-protected and replaced atomically:
//! write a temporary file, fsync it, rename it over the old one, fsync the
//! directory. A corrupt file, or one of another cluster or node, is an
//! error; it is never replaced by defaults.
//!
//! Every number in it is checked when it is read, and before it is stored
//! (so that what is stored can be read back): a purge point's `next_lsn`
//! is a line-aligned log position within the lsn space
//! ([`crate::layout::MAX_LSN`]), indexes are at most
//! [`crate::layout::MAX_INDEX`], terms fit in an epoch and `voted_for` is a
//! node id an epoch can carry. A value out of range is
//! [`LayoutError::OutOfRange`], naming the field.
//!
//! # File layout, version 1 (128 bytes, little-endian)
//!
//! ```text
//! offset  size  field
//! 0       8     magic "RRFTMETA"
//! 8       4     version = 1
//! 12      4     file size = 128
//! 16      8     cluster id
//! 24      8     node id
//! 32      1     flags: 1 vote, 2 vote has voted_for, 4 vote committed,
//!                      8 purged, 16 committed
//! 33      7     reserved, zero
//! 40      8     vote term
//! 48      8     vote voted_for
//! 56      8     purged term
//! 64      8     purged index
//! 72      8     purged next_lsn (where the log continues)
//! 80      8     committed term
//! 88      8     committed index
//! 96      28    reserved, zero
//! 124     4     CRC32 of bytes 0..124
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{LayoutError, Result, WalError};
use crate::layout::{MAX_NODE_ID, check_index, check_lsn, check_term, le_u32, le_u64};
use crate::validate::LogPos;

/// Magic at offset 0 of a metadata file.
pub const META_MAGIC: [u8; 8] = *b"RRFTMETA";
/// Version of the metadata layout.
pub const META_VERSION: u32 = 1;
/// Size of the metadata file in bytes.
pub const META_BYTES: usize = 128;
/// Name of the metadata file in a data directory.
pub const META_FILE: &str = "meta";

const FLAG_VOTE: u8 = 1;
const FLAG_VOTED_FOR: u8 = 2;
const FLAG_VOTE_COMMITTED: u8 = 4;
const FLAG_PURGED: u8 = 8;
const FLAG_COMMITTED: u8 = 16;
const FLAGS_KNOWN: u8 = 31;

/// A Raft vote as openraft keeps it (standard leader ids).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VoteRecord {
    /// The term.
    pub term: u64,
    /// Who this node voted for in that term, if anyone.
    pub voted_for: Option<u64>,
    /// Whether the vote was granted by a quorum (the node is a leader's).
    pub committed: bool,
}

/// The last purged log id and where the log continues after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PurgePoint {
    /// The last purged log id.
    pub log: LogPos,
    /// The logical offset of the first byte still needed: `head`.
    pub next_lsn: u64,
}

impl PurgePoint {
    /// Checks the ranges: `next_lsn` a line-aligned log position, the index
    /// at most [`crate::layout::MAX_INDEX`], the term one an epoch carries.
    pub fn check(&self) -> Result<(), LayoutError> {
        check_term("purged term", self.log.term)?;
        check_index("purged index", self.log.index)?;
        check_lsn("purged next_lsn", self.next_lsn)
    }
}

/// The content of the metadata file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    /// The cluster this node belongs to.
    pub cluster_id: u64,
    /// This node.
    pub node_id: u64,
    /// The last vote saved.
    pub vote: Option<VoteRecord>,
    /// The last purge.
    pub purged: Option<PurgePoint>,
    /// The last committed log id saved.
    pub committed: Option<LogPos>,
}

impl Meta {
    /// A fresh metadata record: nothing voted, purged or committed.
    pub fn new(cluster_id: u64, node_id: u64) -> Meta {
        Meta {
            cluster_id,
            node_id,
            vote: None,
            purged: None,
            committed: None,
        }
    }

    /// Encodes the record, CRC included.
    pub fn encode(&self) -> [u8; META_BYTES] {
        let mut b = [0u8; META_BYTES];
        b[0..8].copy_from_slice(&META_MAGIC);
        b[8..12].copy_from_slice(&META_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(META_BYTES as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.cluster_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.node_id.to_le_bytes());
        let mut flags = 0u8;
        if let Some(vote) = self.vote {
            flags |= FLAG_VOTE;
            b[40..48].copy_from_slice(&vote.term.to_le_bytes());
            if let Some(id) = vote.voted_for {
                flags |= FLAG_VOTED_FOR;
                b[48..56].copy_from_slice(&id.to_le_bytes());
            }
            if vote.committed {
                flags |= FLAG_VOTE_COMMITTED;
            }
        }
        if let Some(p) = self.purged {
            flags |= FLAG_PURGED;
            b[56..64].copy_from_slice(&p.log.term.to_le_bytes());
            b[64..72].copy_from_slice(&p.log.index.to_le_bytes());
            b[72..80].copy_from_slice(&p.next_lsn.to_le_bytes());
        }
        if let Some(c) = self.committed {
            flags |= FLAG_COMMITTED;
            b[80..88].copy_from_slice(&c.term.to_le_bytes());
            b[88..96].copy_from_slice(&c.index.to_le_bytes());
        }
        b[32] = flags;
        let crc = crc32fast::hash(&b[..124]);
        b[124..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a record: size, magic, CRC, version, flags and
    /// reserved bytes.
    pub fn decode(b: &[u8]) -> Result<Meta, LayoutError> {
        if b.len() != META_BYTES {
            return Err(LayoutError::Truncated {
                needed: META_BYTES,
                found: b.len(),
            });
        }
        if b[0..8] != META_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let stored = le_u32(&b[124..]);
        let computed = crc32fast::hash(&b[..124]);
        if stored != computed {
            return Err(LayoutError::HeaderCrc { stored, computed });
        }
        let version = le_u32(&b[8..]);
        if version != META_VERSION {
            return Err(LayoutError::UnsupportedVersion(version));
        }
        if le_u32(&b[12..]) as usize != META_BYTES {
            return Err(LayoutError::BadField("file size"));
        }
        let flags = b[32];
        if flags & !FLAGS_KNOWN != 0 {
            return Err(LayoutError::BadField("flags"));
        }
        if b[33..40].iter().chain(&b[96..124]).any(|x| *x != 0) {
            return Err(LayoutError::ReservedNotZero);
        }
        let has = |f: u8| flags & f != 0;
        if !has(FLAG_VOTE) && (has(FLAG_VOTED_FOR) || has(FLAG_VOTE_COMMITTED)) {
            return Err(LayoutError::BadField("vote flags"));
        }
        let vote = has(FLAG_VOTE).then(|| VoteRecord {
            term: le_u64(&b[40..]),
            voted_for: has(FLAG_VOTED_FOR).then(|| le_u64(&b[48..])),
            committed: has(FLAG_VOTE_COMMITTED),
        });
        let purged = has(FLAG_PURGED).then(|| PurgePoint {
            log: LogPos {
                term: le_u64(&b[56..]),
                index: le_u64(&b[64..]),
            },
            next_lsn: le_u64(&b[72..]),
        });
        let committed = has(FLAG_COMMITTED).then(|| LogPos {
            term: le_u64(&b[80..]),
            index: le_u64(&b[88..]),
        });
        let meta = Meta {
            cluster_id: le_u64(&b[16..]),
            node_id: le_u64(&b[24..]),
            vote,
            purged,
            committed,
        };
        meta.check_ranges()?;
        Ok(meta)
    }

    /// Checks every number against the range the format allows (module
    /// docs). [`Meta::decode`] and [`Meta::store`] both call it.
    pub fn check_ranges(&self) -> Result<(), LayoutError> {
        if self.node_id > MAX_NODE_ID {
            return Err(LayoutError::OutOfRange {
                field: "node id",
                value: self.node_id,
                rule: "above the largest node id an epoch carries (65535)",
            });
        }
        if let Some(vote) = self.vote {
            check_term("vote term", vote.term)?;
            if let Some(id) = vote.voted_for
                && id > MAX_NODE_ID
            {
                return Err(LayoutError::OutOfRange {
                    field: "vote voted_for",
                    value: id,
                    rule: "above the largest node id an epoch carries (65535)",
                });
            }
        }
        if let Some(purged) = self.purged {
            purged.check()?;
        }
        if let Some(committed) = self.committed {
            check_term("committed term", committed.term)?;
            check_index("committed index", committed.index)?;
        }
        Ok(())
    }

    /// Reads and decodes the metadata file at `path`, whatever its ids.
    pub fn read(path: &Path) -> Result<Meta> {
        let bytes = fs::read(path).map_err(WalError::io("read", path))?;
        Meta::decode(&bytes).map_err(|source| WalError::Layout {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads the metadata file at `path` and checks that it belongs to
    /// `cluster_id` / `node_id`.
    pub fn load(path: &Path, cluster_id: u64, node_id: u64) -> Result<Meta> {
        let meta = Meta::read(path)?;
        meta.check_identity(path, cluster_id, node_id)?;
        Ok(meta)
    }

    /// Fails with [`WalError::Foreign`] unless the ids are these.
    pub fn check_identity(&self, path: &Path, cluster_id: u64, node_id: u64) -> Result<()> {
        WalError::check_owner(
            path,
            &[
                ("cluster id", cluster_id, self.cluster_id),
                ("node id", node_id, self.node_id),
            ],
        )
    }

    /// Replaces the file at `path` atomically with this record: write a
    /// temporary file beside it, fsync it, rename it over `path`, fsync the
    /// directory.
    ///
    /// # Errors
    /// [`WalError::Layout`] when a number is out of range
    /// ([`Meta::check_ranges`]): the file would not be readable; then
    /// nothing is written. [`WalError::Io`] when a file operation fails.
    pub fn store(&self, path: &Path) -> Result<()> {
        self.check_ranges().map_err(|source| WalError::Layout {
            path: path.to_path_buf(),
            source,
        })?;
        let tmp = tmp_path(path);
        let bytes = self.encode();
        {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(WalError::io("create", &tmp))?;
            file.write_all(&bytes)
                .map_err(WalError::io("write", &tmp))?;
            file.sync_all().map_err(WalError::io("fsync", &tmp))?;
        }
        fs::rename(&tmp, path).map_err(WalError::io("rename", path))?;
        sync_dir(path)
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Fsyncs the directory that holds `path`, so that a rename or a creation in
/// it is durable.
pub fn sync_dir(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(WalError::io("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Meta {
        Meta {
            cluster_id: 0xABCD,
            node_id: 2,
            vote: Some(VoteRecord {
                term: 9,
                voted_for: Some(3),
                committed: true,
            }),
            purged: Some(PurgePoint {
                log: LogPos {
                    term: 4,
                    index: 1000,
                },
                next_lsn: 123 * 64,
            }),
            committed: Some(LogPos {
                term: 9,
                index: 1500,
            }),
        }
    }

    #[test]
    fn every_shape_round_trips() {
        let variants = [
            Meta::new(1, 1),
            full(),
            Meta {
                vote: Some(VoteRecord {
                    term: 1,
                    voted_for: None,
                    committed: false,
                }),
                ..Meta::new(5, 6)
            },
            Meta {
                vote: Some(VoteRecord {
                    term: 0,
                    voted_for: Some(0),
                    committed: false,
                }),
                committed: Some(LogPos { term: 0, index: 0 }),
                ..Meta::new(u64::MAX, 0)
            },
        ];
        for m in variants {
            assert_eq!(Meta::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bytes_are_where_the_doc_says() {
        let b = full().encode();
        assert_eq!(&b[0..8], b"RRFTMETA");
        assert_eq!(le_u32(&b[8..]), 1);
        assert_eq!(le_u32(&b[12..]), 128);
        assert_eq!(le_u64(&b[16..]), 0xABCD);
        assert_eq!(le_u64(&b[24..]), 2);
        assert_eq!(b[32], 31);
        assert_eq!(le_u64(&b[40..]), 9);
        assert_eq!(le_u64(&b[48..]), 3);
        assert_eq!(le_u64(&b[64..]), 1000);
        assert_eq!(le_u64(&b[72..]), 123 * 64);
        assert_eq!(le_u64(&b[88..]), 1500);
    }

    #[test]
    fn any_bit_flip_is_detected() {
        let b = full().encode();
        for bit in 0..META_BYTES * 8 {
            let mut bad = b;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Meta::decode(&bad).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn wrong_sizes_flags_and_versions_are_errors() {
        let b = full().encode();
        assert!(matches!(
            Meta::decode(&b[..100]),
            Err(LayoutError::Truncated { .. })
        ));
        let reseal = |mut b: [u8; META_BYTES]| {
            let crc = crc32fast::hash(&b[..124]);
            b[124..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut v = b;
        v[8] = 2;
        assert_eq!(
            Meta::decode(&reseal(v)),
            Err(LayoutError::UnsupportedVersion(2))
        );
        let mut f = b;
        f[32] = 64;
        assert_eq!(
            Meta::decode(&reseal(f)),
            Err(LayoutError::BadField("flags"))
        );
        let mut f = b;
        f[32] = FLAG_VOTED_FOR;
        assert_eq!(
            Meta::decode(&reseal(f)),
            Err(LayoutError::BadField("vote flags"))
        );
        let mut r = b;
        r[100] = 1;
        assert_eq!(Meta::decode(&reseal(r)), Err(LayoutError::ReservedNotZero));
        let mut s = b;
        s[12] = 64;
        assert_eq!(
            Meta::decode(&reseal(s)),
            Err(LayoutError::BadField("file size"))
        );
    }

    #[test]
    fn store_replaces_atomically_and_load_checks_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META_FILE);
        full().store(&path).unwrap();
        assert_eq!(Meta::load(&path, 0xABCD, 2).unwrap(), full());
        let newer = Meta {
            vote: Some(VoteRecord {
                term: 10,
                voted_for: None,
                committed: false,
            }),
            ..full()
        };
        newer.store(&path).unwrap();
        assert_eq!(Meta::load(&path, 0xABCD, 2).unwrap(), newer);
        assert!(!tmp_path(&path).exists(), "temporary file renamed away");
        assert!(matches!(
            Meta::load(&path, 0xABCE, 2),
            Err(WalError::Foreign {
                field: "cluster id",
                ..
            })
        ));
        assert!(matches!(
            Meta::load(&path, 0xABCD, 3),
            Err(WalError::Foreign {
                field: "node id",
                ..
            })
        ));
    }

    #[test]
    fn corrupt_or_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META_FILE);
        assert!(matches!(Meta::load(&path, 1, 1), Err(WalError::Io { .. })));
        let mut b = full().encode();
        b[70] ^= 1;
        std::fs::write(&path, b).unwrap();
        let err = Meta::load(&path, 0xABCD, 2).unwrap_err();
        assert!(
            matches!(
                err,
                WalError::Layout {
                    source: LayoutError::HeaderCrc { .. },
                    ..
                }
            ),
            "{err}"
        );
        std::fs::write(&path, b"garbage").unwrap();
        assert!(Meta::load(&path, 0xABCD, 2).is_err());
    }

    /// Issue 10, item 6: every number of the metadata file is range-checked
    /// on read (naming the field) and before a store (so that what is stored
    /// can be read back): a purge point's next_lsn must be a line-aligned
    /// position within the lsn space, indexes at most MAX_INDEX, terms and
    /// node ids what an epoch carries.
    #[test]
    fn out_of_range_fields_are_refused_on_read_and_on_store() {
        use crate::layout::{MAX_INDEX, MAX_LSN, MAX_TERM};
        let purged = |term, index, next_lsn| Meta {
            purged: Some(PurgePoint {
                log: LogPos { term, index },
                next_lsn,
            }),
            ..full()
        };
        let vote = |term, voted_for| Meta {
            vote: Some(VoteRecord {
                term,
                voted_for,
                committed: false,
            }),
            ..full()
        };
        let committed = |term, index| Meta {
            committed: Some(LogPos { term, index }),
            ..full()
        };
        let bad = [
            (purged(1, 5, 1), "purged next_lsn"),
            (purged(1, 5, 0xFFFFF), "purged next_lsn"),
            (purged(1, 5, MAX_LSN + 64), "purged next_lsn"),
            (purged(1, 5, 0xFFFF_FFFF_FFFF_FFC0), "purged next_lsn"),
            (purged(1, MAX_INDEX + 1, 0), "purged index"),
            (purged(1, u64::MAX, 0), "purged index"),
            (purged(MAX_TERM + 1, 5, 0), "purged term"),
            (vote(MAX_TERM + 1, None), "vote term"),
            (vote(1, Some(1 << 16)), "vote voted_for"),
            (committed(1, u64::MAX), "committed index"),
            (committed(u64::MAX, 1), "committed term"),
            (Meta::new(1, 1 << 16), "node id"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META_FILE);
        full().store(&path).unwrap();
        for (meta, field) in bad {
            match Meta::decode(&meta.encode()) {
                Err(LayoutError::OutOfRange { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
            let err = meta.store(&path).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
            assert_eq!(Meta::read(&path).unwrap(), full(), "nothing stored");
        }
        let edge = [
            purged(MAX_TERM, MAX_INDEX, MAX_LSN),
            vote(MAX_TERM, Some(crate::layout::MAX_NODE_ID)),
            committed(MAX_TERM, MAX_INDEX),
        ];
        for meta in edge {
            assert_eq!(Meta::decode(&meta.encode()), Ok(meta));
        }
    }
}
