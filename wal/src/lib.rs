//! # ringraft-wal
//!
//! ringraft's write-ahead log: a pinned, epoch-versioned ring that is at once
//! a node's Raft log and the memory a leader fills with one-sided RDMA
//! WRITEs. This crate knows nothing of openraft or of any network: it owns
//! the byte layout, the record codec, the validator (DESIGN.md's chain
//! rules), the ring (a file in shared memory, `/dev/shm` by default),
//! recovery, the metadata file and the offline checker.
//!
//! ## Layers (sans-IO first)
//! - [`layout`]: the control block's offsets and static header, [`Epoch`];
//! - [`record`]: record header, CRC, wrap markers, the [`RecordEncoder`] and
//!   the [`WriteBuffer`] a leader WRITEs from;
//! - [`validate`]: pure chain-rule checks in their contexts,
//!   [`Check::Adoption`], [`Check::Recovery`] and [`Check::Segment`];
//! - [`recovery`]: the pure recovery scan and the torn-tail /
//!   corrupt-inside verdict;
//! - [`ring`]: the memory-mapped ring file ([`Ring`]);
//! - [`shm`]: where the ring file lives (a shared-memory directory), its
//!   name, its binding to the data directory, and the sweep of orphans;
//! - [`meta`]: the vote / metadata file ([`Meta`]);
//! - [`store`]: a data directory, both files together ([`Wal`]);
//! - [`disk`]: the synchronous disk trait ([`Disk`], [`RealDisk`]) that a
//!   simulated disk can replace;
//! - [`segment`]: the segment file format (pure);
//! - [`segment_log`]: the log of segment files ([`SegmentLog`],
//!   [`SegmentReader`]): the retained log on disk beyond the ring;
//! - [`check`](mod@check): the offline checker ([`check()`]).
//!
//! ## Using it (the replicator's view)
//! ```
//! use ringraft_wal::{EntryRef, Epoch, RingConfig, Wal};
//!
//! let dir = tempfile::tempdir().unwrap();
//! // The ring lives in a shared-memory directory: /dev/shm in production
//! // (`ringraft_wal::DEFAULT_RING_DIR`); here a directory of the example's own.
//! let ring_dir = dir.path().join("shm");
//! let config = RingConfig {
//!     capacity: 1 << 20,
//!     max_record_bytes: 64 << 10,
//!     cluster_id: 7,
//!     node_id: 1,
//!     lock_memory: false,
//! };
//! let mut wal = Wal::open(&dir.path().join("data"), &ring_dir, &config).unwrap();
//! let epoch = Epoch::new(1, 1).unwrap();
//! // A leader first takes its own fence (through the fabric in a cluster).
//! wal.ring().compare_exchange_fence(Epoch::ZERO, epoch).unwrap();
//! let ring = wal.ring_mut();
//! ring.append(epoch, &[EntryRef { term: 1, index: 0, payload: b"hello" }]).unwrap();
//! ring.sync_and_ack(0).unwrap();
//! assert_eq!(ring.read(0).unwrap().payload, b"hello");
//! ```
//!
//! Indexes start at 0, as openraft's do; a log that was never purged begins
//! at index 0 with `prev_term` 0.

#![warn(missing_docs)]

pub mod check;
pub mod control_word;
mod crc;
pub mod disk;
pub mod error;
pub mod layout;
pub mod meta;
pub mod planted;
pub mod record;
pub mod recovery;
pub mod ring;
pub mod segment;
pub mod segment_log;
pub mod shm;
pub mod store;
#[cfg(test)]
mod test_area;
#[cfg(test)]
mod test_noise;
pub mod validate;

pub use check::{CheckReport, check};
pub use control_word::{FenceWord, HeadWord, WordLength};
pub use disk::{Access, Disk, DiskFile, DiskObserver, DiskOp, RealDisk, RealFile};
pub use error::{AdoptError, LayoutError, Result, WalError};
pub use layout::{Epoch, RingHeader};
pub use meta::{Meta, PurgePoint, VoteRecord};
pub use record::{EntryRef, RecordEncoder, RecordKind, WriteBuffer};
pub use recovery::{Damage, Evidence, ScanReport, Stop};
pub use ring::{
    AdoptRequest, Anchoring, Extended, PreparedAdoption, RawRegion, RecordView, Ring, RingConfig,
    RingRegions,
};
pub use segment::{SegmentDefect, SegmentHeader};
pub use segment_log::{
    SegmentConfig, SegmentLog, SegmentReader, SegmentRecord, SegmentRecovery, SegmentStop,
    check_segments,
};
pub use shm::{DEFAULT_RING_DIR, RingLocation, collect_garbage, remove, ring_path};
pub use store::{Recovery, Wal};
pub use validate::{ChainTip, Check, Geometry, Invalid, LogPos};
