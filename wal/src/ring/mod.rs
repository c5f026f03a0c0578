//! The ring: a memory-mapped file holding the control block and the data
//! area (layout in [`crate::layout`]), its memory reserved when it is
//! created. The file lives in a shared-memory directory (a tmpfs such as
//! `/dev/shm`), not in the data directory: [`crate::shm`] names it, binds it
//! to its data directory and explains why. So the ring, its records and its
//! control words (fence, head, commit hint, acknowledged watermark) outlive
//! the process that wrote them, not a reboot; [`crate::Wal::open`] rebuilds
//! what a reboot took from the durable metadata file. On tmpfs the msyncs
//! below cost nothing and make nothing durable.
//!
//! The ring is the node's log. A leader appends to its own ring with
//! [`Ring::append`]; a follower's ring is filled by the leader's one-sided
//! WRITEs, and the follower checks those records in place and takes them
//! into its log with [`Ring::adopt`], without copying them. Both keep an
//! index → lsn map, rebuilt by the recovery scan when the ring is opened.
//!
//! What the ring guarantees:
//! - it never writes, nor adopts, past `head + capacity` (a full ring is
//!   [`WalError::RingFull`], which the caller waits on), nor past the end of
//!   the lsn space, [`MAX_LSN`](crate::layout::MAX_LSN) ([`WalError::LsnSpaceExhausted`]);
//! - adopted records are never overwritten by the ring itself except by
//!   [`Ring::truncate_after`], which also erases them so that recovery does
//!   not bring them back;
//! - every record it appends passes the validator's recovery rules, and every
//!   record it serves passes its CRC;
//! - every word it reads from the file is checked before use (the header,
//!   the purge point, the incarnation it bumps, the acknowledged watermark):
//!   a value out of range is an error naming the file and the field, never
//!   an overflow.
//!
//! # Memory shared with a device
//!
//! Once [`Ring::regions`] has been registered with a fabric, a remote writer
//! may change the data area beyond the adopted tail, and the fence word, at
//! any moment. So the ring never holds a Rust reference to the whole mapping:
//! it keeps a raw pointer and forms slices only over records it owns (adopted
//! or appended, which no remote writer touches: a leader writes only beyond
//! the tail it learnt from this node) or over a range a control message
//! named as finished (RC ordering: the WRITE completed before the SEND that
//! names it). The fence word is only touched atomically.

mod adopt;
mod control;
mod open;
mod purge;
mod raw;

pub use adopt::PreparedAdoption;
pub(crate) use open::ring_file_len;

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::MmapMut;

use crate::error::{Result, WalError};
use crate::layout::{Epoch, MAX_NODE_ID, RingHeader, check_capacity};
use crate::record::record_len;
use crate::validate::{ChainTip, Geometry, LogPos};

/// Name of the ring file inside a data directory in the layout before rings
/// moved to shared memory: [`crate::Wal::open`] moves such a ring into the
/// ring dir ([`crate::shm`]). Error messages still call the ring "ring".
pub const RING_FILE: &str = "ring";

/// How a ring is shaped and whose it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Data area capacity in bytes: a power of two, 1 MiB ..= 1 TiB.
    pub capacity: u64,
    /// Largest payload accepted, in bytes. A record (header and padding
    /// included) may take at most half the capacity.
    pub max_record_bytes: u64,
    /// The cluster the ring belongs to.
    pub cluster_id: u64,
    /// The node that owns the ring (at most [`MAX_NODE_ID`]: it is packed
    /// into epochs).
    pub node_id: u64,
    /// Lock the mapping in memory (mlock). When the limit forbids it the ring
    /// still works and logs a warning.
    pub lock_memory: bool,
}

impl RingConfig {
    /// Checks the bounds and returns the geometry the validator uses.
    pub fn geometry(&self) -> Result<Geometry> {
        check_capacity(self.capacity).map_err(|e| WalError::Config(e.to_string()))?;
        if self.max_record_bytes > u32::MAX as u64
            || record_len(self.max_record_bytes) > self.capacity / 2
        {
            return Err(WalError::Config(format!(
                "max record of {} bytes does not fit twice in a ring of {} bytes",
                self.max_record_bytes, self.capacity
            )));
        }
        if self.node_id > MAX_NODE_ID {
            return Err(WalError::Config(format!(
                "node id {} is above {MAX_NODE_ID}: it must fit in an epoch's 16 leader bits",
                self.node_id
            )));
        }
        Ok(Geometry {
            capacity: self.capacity,
            max_payload_bytes: self.max_record_bytes,
        })
    }
}

/// A span of the mapping that a fabric may register for remote access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRegion {
    /// First byte.
    pub addr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

/// The three separately registrable parts of a ring (least privilege):
/// the data area (remote WRITE only), the fence word (remote READ and
/// ATOMIC), the head word (remote READ only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingRegions {
    /// The data area.
    pub data: RawRegion,
    /// The fence word (8 bytes, 8-byte aligned).
    pub fence: RawRegion,
    /// The head word (8 bytes, 8-byte aligned).
    pub head: RawRegion,
}

/// What a control message says a remote writer put into the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdoptRequest {
    /// Where the records start (must be the adopted tail).
    pub from_lsn: u64,
    /// Where they end.
    pub to_lsn: u64,
    /// How many entries they hold.
    pub entries: u64,
    /// The last entry's log id (`None` only when `entries` is 0).
    pub last: Option<LogPos>,
}

/// The log after an append or an adoption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extended {
    /// The last entry's log id.
    pub last: Option<LogPos>,
    /// Where the next record goes.
    pub tail_lsn: u64,
}

/// One entry read back from the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Raft index.
    pub index: u64,
    /// Raft term.
    pub term: u64,
    /// Position in the ring.
    pub lsn: u64,
    /// Writer's epoch.
    pub epoch: Epoch,
    /// The payload, in place in the mapping.
    pub payload: &'a [u8],
}

/// Where a log stands without its ring: the segments' last entry, or the
/// purge point when that lies beyond it (a snapshot was installed).
pub fn durable_end(durable_last: Option<LogPos>, purged: Option<LogPos>) -> Option<LogPos> {
    match (durable_last, purged) {
        (Some(d), Some(p)) if p.index > d.index => Some(p),
        (Some(d), _) => Some(d),
        (None, p) => p,
    }
}

/// How [`Ring::anchor_on`] joined the ring to the durable log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Anchoring {
    /// The first index the segments must still be given (everything below
    /// is in them, in the form the log holds).
    pub flush_from: u64,
    /// The segments hold entries after this one (`Some(None)`: all of
    /// them) that the ring replaced: truncate them before writing more.
    pub durable_conflict_after: Option<Option<u64>>,
    /// Ring entries dropped because they did not continue the durable log.
    pub dropped: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    lsn: u64,
    term: u64,
}

/// A node's ring, open for reading and writing. See the module docs.
pub struct Ring {
    path: PathBuf,
    _file: File,
    map: MmapMut,
    base: NonNull<u8>,
    geometry: Geometry,
    header: RingHeader,
    /// The last purged log id: the chain the first entry continues.
    anchor: Option<LogPos>,
    /// Index of `slots[0]`.
    first_index: u64,
    slots: VecDeque<Slot>,
    tip: ChainTip,
    head_lsn: u64,
    tail_lsn: u64,
    /// Logical range written since the last sync, if any.
    unsynced: Option<(u64, u64)>,
    /// The first msync failure, after which no sync can succeed.
    sync_failed: Option<String>,
    memory_locked: bool,
}

// SAFETY: `base` points into `map`, which the ring owns and which lives as
// long as the ring; all mutation goes through `&mut self` or atomics.
unsafe impl Send for Ring {}
// SAFETY: shared access only reads records the ring owns (no one writes them)
// and control words through atomics.
unsafe impl Sync for Ring {}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("path", &self.path)
            .field("header", &self.header)
            .field("first_index", &self.first_index)
            .field("next_index", &self.tip.next_index)
            .field("head_lsn", &self.head_lsn)
            .field("tail_lsn", &self.tail_lsn)
            .finish_non_exhaustive()
    }
}

impl Ring {
    // ----- shape and state -------------------------------------------------

    /// The file this ring lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The static header (incarnation as of this open).
    pub fn header(&self) -> RingHeader {
        self.header
    }

    /// Capacity and record limit.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Whether mlock succeeded.
    pub fn memory_locked(&self) -> bool {
        self.memory_locked
    }

    /// The first index still in the log.
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// One past the last index in the log.
    pub fn next_index(&self) -> u64 {
        self.tip.next_index
    }

    /// The chain state at the end of the log.
    pub fn tip(&self) -> ChainTip {
        self.tip
    }

    /// The last purged log id.
    pub fn last_purged(&self) -> Option<LogPos> {
        self.anchor
    }

    /// The last entry's log id, or the last purged one when the log is empty.
    pub fn last_log(&self) -> Option<LogPos> {
        match self.slots.back() {
            Some(slot) => Some(LogPos {
                term: slot.term,
                index: self.tip.next_index - 1,
            }),
            None => self.anchor,
        }
    }

    /// The term of entry `index`, if the log holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.slot(index).map(|s| s.term)
    }

    /// Logical offset of the oldest byte still needed.
    pub fn head_lsn(&self) -> u64 {
        self.head_lsn
    }

    /// Logical offset where the next record goes.
    pub fn tail_lsn(&self) -> u64 {
        self.tail_lsn
    }

    /// Bytes that can be written before reaching `head + capacity` (or the
    /// end of the lsn space, [`MAX_LSN`](crate::layout::MAX_LSN)).
    pub fn free_bytes(&self) -> u64 {
        self.window_end() - self.tail_lsn
    }

    /// Where the window of bytes a writer may fill ends: `head + capacity`,
    /// or [`MAX_LSN`](crate::layout::MAX_LSN) in the last lap of the lsn space.
    pub fn window_end(&self) -> u64 {
        self.geometry.window_end(self.head_lsn)
    }
}
