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
//!   the lsn space, [`MAX_LSN`] ([`WalError::LsnSpaceExhausted`]);
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

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};

use crate::error::{AdoptError, LayoutError, Result, WalError};
use crate::layout::{
    ACKED_OFFSET, COMMIT_OFFSET, CONTROL_BLOCK_BYTES, Epoch, FENCE_OFFSET, HEAD_OFFSET, MAX_INDEX,
    MAX_LSN, MAX_NODE_ID, RING_HEADER_BYTES, RingHeader, check_capacity, check_index, check_term,
    decode_index_word, encode_index_word,
};
use crate::meta::{PurgePoint, sync_dir};
use crate::record::{
    EntryRef, RECORD_HEADER_BYTES, RecordEncoder, RecordHeader, RecordKind, RecordSink, record_len,
    span_end,
};
use crate::recovery::{ScanInput, ScanReport, scan};
use crate::validate::{
    ChainTip, Check, Geometry, Invalid, LogPos, validate_header, validate_payload,
};

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

/// One record of a [`PreparedAdoption`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PreparedRecord {
    lsn: u64,
    index: u64,
    term: u64,
    payload_len: u32,
    epoch: Epoch,
}

/// Records a remote writer put into the ring, checked in place and not yet
/// part of the log (see [`Ring::prepare_adoption`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedAdoption {
    request: AdoptRequest,
    fence: Epoch,
    base_tip: ChainTip,
    tip: ChainTip,
    end_lsn: u64,
    records: Vec<PreparedRecord>,
}

impl PreparedAdoption {
    /// What the control message said.
    pub fn request(&self) -> AdoptRequest {
        self.request
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are no entries (a heartbeat).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The fence they were checked against.
    pub fn fence(&self) -> Epoch {
        self.fence
    }
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
    /// Creates a new ring file at `path` (it must not exist, and is readable
    /// by its owner only), its memory reserved up front, with an empty log,
    /// a zero fence and the given incarnation (0 for a new data directory;
    /// see [`crate::shm`] for a ring recreated after a reboot). Open it with
    /// [`Ring::open`]. On error the file is removed.
    ///
    /// # Errors
    /// [`WalError::RingDirFull`] when the ring dir has no room for it.
    pub fn create(path: &Path, config: &RingConfig, incarnation: u64) -> Result<()> {
        config.geometry()?;
        let file = crate::shm::create_ring_file(path)?;
        let total = CONTROL_BLOCK_BYTES as u64 + config.capacity;
        let header = RingHeader {
            capacity: config.capacity,
            cluster_id: config.cluster_id,
            node_id: config.node_id,
            incarnation,
        };
        crate::shm::reserve(&file, path, total)
            .and_then(|()| {
                file.write_all_at(&header.encode(), 0)
                    .map_err(WalError::io("write header", path))?;
                file.sync_all().map_err(WalError::io("fsync", path))
            })
            .inspect_err(|_| {
                let _ = std::fs::remove_file(path);
            })?;
        sync_dir(path)
    }

    /// Opens the ring at `path`, checks that it is this node's, bumps its
    /// incarnation, and scans the records from its `head` word on. The
    /// first record found starts the chain (its predecessor is in the
    /// segments, where `head` was advanced from): the caller anchors the
    /// ring on the durable log with [`Ring::anchor_on`]. Returns the ring
    /// and the scan's report.
    pub fn open(path: &Path, config: &RingConfig) -> Result<(Ring, ScanReport)> {
        let geometry = config.geometry()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(WalError::io("open", path))?;
        crate::shm::hold(&file, path);
        let mut line = [0u8; RING_HEADER_BYTES];
        file.read_exact_at(&mut line, 0)
            .map_err(WalError::io("read header", path))?;
        let mut header = RingHeader::decode(&line).map_err(|source| WalError::Layout {
            path: path.to_path_buf(),
            source,
        })?;
        header.incarnation = header
            .incarnation
            .checked_add(1)
            .ok_or_else(|| WalError::Layout {
                path: path.to_path_buf(),
                source: LayoutError::OutOfRange {
                    field: "incarnation",
                    value: header.incarnation,
                    rule: "no incarnation is left to bump it to",
                },
            })?;
        for (field, expected, found) in [
            ("cluster id", config.cluster_id, header.cluster_id),
            ("node id", config.node_id, header.node_id),
            ("capacity", config.capacity, header.capacity),
        ] {
            if expected != found {
                return Err(WalError::Foreign {
                    path: path.to_path_buf(),
                    field,
                    expected,
                    found,
                });
            }
        }
        let total = CONTROL_BLOCK_BYTES as u64 + config.capacity;
        let size = file.metadata().map_err(WalError::io("stat", path))?.len();
        if size != total {
            return Err(WalError::Inconsistent {
                path: path.to_path_buf(),
                what: format!("file is {size} bytes, its header says {total}"),
            });
        }
        let len = usize::try_from(total).map_err(|_| {
            WalError::Config(format!("ring of {total} bytes does not fit in memory"))
        })?;
        fresh_page_cache(&file, path)?;
        // SAFETY: the file is ours (a ring of this node, checked above) and is
        // not resized while mapped: the ring keeps it open and never truncates
        // it. Concurrent writers other than a registered fabric are outside
        // the contract (one process owns a data directory).
        let mut map = unsafe { MmapOptions::new().len(len).map_mut(&file) }
            .map_err(WalError::io("mmap", path))?;
        map.advise(memmap2::Advice::Random)
            .map_err(WalError::io("madvise", path))?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returns a non-null pointer");
        let memory_locked = config.lock_memory && lock_memory(&map, path);

        let mut ring = Ring {
            path: path.to_path_buf(),
            _file: file,
            map,
            base,
            geometry,
            header,
            anchor: None,
            first_index: 0,
            slots: VecDeque::new(),
            tip: ChainTip::after(None),
            head_lsn: 0,
            tail_lsn: 0,
            unsynced: None,
            sync_failed: None,
            memory_locked,
        };
        // Check the control words before writing anything.
        let head_word = ring.word(HEAD_OFFSET).load(Ordering::Acquire);
        if head_word > MAX_LSN {
            return Err(WalError::Layout {
                path: path.to_path_buf(),
                source: LayoutError::OutOfRange {
                    field: "head",
                    value: head_word,
                    rule: "an lsn is at most MAX_LSN",
                },
            });
        }
        ring.head_lsn = head_word;
        check_index_words(path, &ring)?;
        ring.write_control(0, &header.encode());

        let input = ScanInput {
            geometry: Geometry::loosest(geometry.capacity),
            start_lsn: ring.head_lsn,
            anchor: ring.anchor,
            fence: ring.fence(),
            acked: ring.acked(),
        };
        // SAFETY: the ring is not registered with any fabric yet, so nothing
        // else writes the data area while the scan reads it.
        let area =
            unsafe { std::slice::from_raw_parts(ring.data_ptr(), geometry.capacity as usize) };
        let report = scan(area, input);
        if let (None, Some(first)) = (ring.anchor, report.entries.first()) {
            ring.first_index = first.index;
        }
        ring.slots = report
            .entries
            .iter()
            .map(|e| Slot {
                lsn: e.lsn,
                term: e.term,
            })
            .collect();
        ring.tip = report.tip;
        ring.tail_lsn = report.end_lsn;
        ring.sync_control()?;
        Ok((ring, report))
    }

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
    /// end of the lsn space, [`MAX_LSN`]).
    pub fn free_bytes(&self) -> u64 {
        self.window_end() - self.tail_lsn
    }

    /// Where the window of bytes a writer may fill ends: `head + capacity`,
    /// or [`MAX_LSN`] in the last lap of the lsn space.
    pub fn window_end(&self) -> u64 {
        self.geometry.window_end(self.head_lsn)
    }

    // ----- control words ---------------------------------------------------

    /// The fence word: the epoch of the leader allowed to write.
    pub fn fence(&self) -> Epoch {
        Epoch(self.word(FENCE_OFFSET).load(Ordering::Acquire))
    }

    /// Compare-and-swap of the fence with a CPU atomic, upward only.
    ///
    /// DESIGN.md: RDMA atomics are atomic only against other RDMA atomics of
    /// the same device, so a node whose device reports `IBV_ATOMIC_HCA` must
    /// change its own fence through a loopback connection instead. This is
    /// for devices with global atomics and for software fabrics, whose
    /// atomics are these same CPU atomics. Returns the value found.
    pub fn compare_exchange_fence(&self, current: Epoch, new: Epoch) -> Result<Epoch> {
        if new <= current {
            return Err(WalError::FenceDownward {
                current,
                proposed: new,
            });
        }
        let found = match self.word(FENCE_OFFSET).compare_exchange(
            current.0,
            new.0,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(v) | Err(v) => v,
        };
        Ok(Epoch(found))
    }

    /// The leader's last commit hint.
    pub fn commit_hint(&self) -> Option<u64> {
        decode_index_word(self.word(COMMIT_OFFSET).load(Ordering::Acquire))
    }

    /// Records the leader's commit hint. It comes from a peer's message and
    /// is only a hint: an index above [`MAX_INDEX`] is stored as `MAX_INDEX`.
    pub fn set_commit_hint(&self, index: Option<u64>) {
        self.word(COMMIT_OFFSET).store(
            encode_index_word(index.map(|i| i.min(MAX_INDEX))),
            Ordering::Release,
        );
    }

    /// The highest index this node acknowledged.
    pub fn acked(&self) -> Option<u64> {
        decode_index_word(self.word(ACKED_OFFSET).load(Ordering::Acquire))
    }

    /// Raises the acknowledged watermark to `index` (memory durability: no
    /// msync). `index` must be in the log.
    pub fn mark_acked(&self, index: u64) {
        assert!(
            index < self.tip.next_index,
            "acknowledging {index}, beyond the log's end {}",
            self.tip.next_index
        );
        self.word(ACKED_OFFSET)
            .fetch_max(encode_index_word(Some(index)), Ordering::AcqRel);
    }

    /// Fsync durability: makes every record written so far durable, then
    /// raises the acknowledged watermark to `index` and makes it (and the
    /// fence) durable. Only after this may the node acknowledge `index`.
    pub fn sync_and_ack(&mut self, index: u64) -> Result<()> {
        self.sync_data()?;
        self.mark_acked(index);
        self.sync_control()
    }

    /// Makes every record written so far and the control block durable.
    pub fn sync(&mut self) -> Result<()> {
        self.sync_data()?;
        self.sync_control()
    }

    /// The parts a fabric registers; see the module docs.
    pub fn regions(&self) -> RingRegions {
        // SAFETY: both offsets are inside the mapping.
        let at = |offset: usize, len: usize| RawRegion {
            addr: unsafe { self.base.as_ptr().add(offset) },
            len,
        };
        RingRegions {
            data: at(CONTROL_BLOCK_BYTES, self.geometry.capacity as usize),
            fence: at(FENCE_OFFSET, 8),
            head: at(HEAD_OFFSET, 8),
        }
    }

    // ----- writing -----------------------------------------------------------

    /// Appends entries written by this node (a leader's own writes, or a
    /// conflicting suffix a follower received two-sided), as the writer
    /// holding `epoch`. All or nothing: on error nothing is written.
    pub fn append(&mut self, epoch: Epoch, entries: &[EntryRef<'_>]) -> Result<Extended> {
        let fence = self.fence();
        if epoch > fence {
            return Err(WalError::EpochAboveFence { epoch, fence });
        }
        for e in entries {
            if e.payload.len() as u64 > self.geometry.max_payload_bytes {
                return Err(WalError::RecordTooLarge {
                    len: e.payload.len() as u64,
                    max: self.geometry.max_payload_bytes,
                });
            }
        }
        let mut encoder =
            RecordEncoder::new(self.geometry.capacity, self.tail_lsn, self.tip, epoch)
                .expect("the ring's capacity was checked at open and its tail is a log position");
        encoder.check_batch(entries)?;
        let end_lsn = span_end(
            self.tail_lsn,
            self.geometry.capacity,
            entries.iter().map(|e| e.payload.len() as u64),
        );
        self.check_room(end_lsn)?;
        let (start_lsn, start_tip) = (self.tail_lsn, self.tip);
        let mut sink = MapSink {
            data: self.data_ptr(),
            capacity: self.geometry.capacity,
        };
        if self.slots.is_empty()
            && let Some(first) = entries.first()
        {
            self.first_index = first.index;
        }
        for entry in entries {
            let placed = encoder.push(&mut sink, entry).expect("batch checked above");
            self.slots.push_back(Slot {
                lsn: placed.lsn,
                term: placed.term,
            });
        }
        assert_eq!(
            encoder.next_lsn(),
            end_lsn,
            "span_end and the encoder agree"
        );
        self.mark_dirty(self.tail_lsn, end_lsn);
        self.tail_lsn = end_lsn;
        self.tip = encoder.tip();
        debug_assert_eq!(self.verify_from(start_lsn, start_tip), Ok(()));
        Ok(Extended {
            last: self.last_log(),
            tail_lsn: self.tail_lsn,
        })
    }

    /// Adopts in place the records a remote writer put at
    /// `request.from_lsn..request.to_lsn`: each must pass the validator in
    /// its adoption context (epoch equal to the current fence) and together
    /// they must be the entries the control message names. All or nothing.
    /// The same as [`Ring::prepare_adoption`] then [`Ring::commit_adoption`].
    pub fn adopt(&mut self, request: AdoptRequest) -> Result<Extended> {
        let prepared = self.prepare_adoption(request)?;
        self.commit_adoption(prepared)
    }

    /// Checks the records of `request` in place without taking them into the
    /// log, so that they can be read ([`Ring::prepared_records`]) and handed
    /// to the consensus layer, which decides whether they enter the log.
    pub fn prepare_adoption(&self, request: AdoptRequest) -> Result<PreparedAdoption> {
        let limit_lsn = self.window_end();
        if request.from_lsn != self.tail_lsn {
            return Err(AdoptError::NotAtTail {
                from_lsn: request.from_lsn,
                tail_lsn: self.tail_lsn,
            }
            .into());
        }
        if request.to_lsn < request.from_lsn || request.to_lsn > limit_lsn {
            return Err(AdoptError::BadRange {
                from_lsn: request.from_lsn,
                to_lsn: request.to_lsn,
                limit_lsn,
            }
            .into());
        }
        let fence = self.fence();
        let check = Check::Adoption { fence };
        let mut tip = self.tip;
        let mut lsn = request.from_lsn;
        let mut records = Vec::new();
        while lsn < request.to_lsn {
            let valid = self
                .validate_in_place(lsn, tip, check)
                .map_err(|reason| AdoptError::Rejected { lsn, reason })?;
            if valid.next_lsn > request.to_lsn && valid.header.kind == RecordKind::Entry {
                return Err(AdoptError::EndMismatch {
                    expected: request.to_lsn,
                    found: valid.next_lsn,
                }
                .into());
            }
            if valid.header.kind == RecordKind::Entry {
                records.push(PreparedRecord {
                    lsn,
                    index: valid.header.index,
                    term: valid.header.term,
                    payload_len: valid.header.payload_len,
                    epoch: valid.header.epoch,
                });
            }
            tip = valid.tip;
            lsn = valid.next_lsn;
        }
        let found_last = records.last().map(|r| LogPos {
            term: r.term,
            index: r.index,
        });
        if records.len() as u64 != request.entries || found_last != request.last {
            return Err(AdoptError::EntriesMismatch {
                expected_count: request.entries,
                expected_last: request.last,
                found_count: records.len() as u64,
                found_last,
            }
            .into());
        }
        // A trailing wrap marker moves the tail to the next lap.
        if lsn > limit_lsn {
            return Err(AdoptError::BadRange {
                from_lsn: request.from_lsn,
                to_lsn: lsn,
                limit_lsn,
            }
            .into());
        }
        Ok(PreparedAdoption {
            request,
            fence,
            base_tip: self.tip,
            tip,
            end_lsn: lsn,
            records,
        })
    }

    /// The entries of a prepared adoption, read in place.
    pub fn prepared_records<'a>(
        &'a self,
        prepared: &'a PreparedAdoption,
    ) -> impl Iterator<Item = RecordView<'a>> + 'a {
        prepared.records.iter().map(|r| RecordView {
            index: r.index,
            term: r.term,
            lsn: r.lsn,
            epoch: r.epoch,
            payload: self.bytes(r.lsn + RECORD_HEADER_BYTES as u64, r.payload_len as usize),
        })
    }

    /// Takes prepared records into the log. Fails, changing nothing, when the
    /// log or the fence moved since they were prepared.
    pub fn commit_adoption(&mut self, prepared: PreparedAdoption) -> Result<Extended> {
        if prepared.request.from_lsn != self.tail_lsn || prepared.base_tip != self.tip {
            return Err(AdoptError::NotAtTail {
                from_lsn: prepared.request.from_lsn,
                tail_lsn: self.tail_lsn,
            }
            .into());
        }
        let fence = self.fence();
        if fence != prepared.fence {
            return Err(AdoptError::Rejected {
                lsn: prepared.request.from_lsn,
                reason: Invalid::NotFenceHolder {
                    fence,
                    found: prepared.fence,
                },
            }
            .into());
        }
        if self.slots.is_empty()
            && let Some(first) = prepared.records.first()
        {
            self.first_index = first.index;
        }
        self.slots.extend(prepared.records.iter().map(|r| Slot {
            lsn: r.lsn,
            term: r.term,
        }));
        self.mark_dirty(self.tail_lsn, prepared.end_lsn);
        self.tail_lsn = prepared.end_lsn;
        self.tip = prepared.tip;
        Ok(Extended {
            last: self.last_log(),
            tail_lsn: self.tail_lsn,
        })
    }

    /// Erases scratch bytes a remote writer left beyond the adopted tail, up
    /// to `to_lsn` (bounded by the window): after a rejected adoption, so that
    /// neither a later adoption nor recovery finds the rejected records.
    pub fn clear_scratch(&mut self, to_lsn: u64) {
        self.clear_scratch_between(self.tail_lsn, to_lsn);
    }

    /// Erases the scratch bytes in `from_lsn..to_lsn`, clipped to what lies
    /// beyond the adopted tail and inside the window: the part of a rejected
    /// batch that no other prepared adoption covers.
    pub fn clear_scratch_between(&mut self, from_lsn: u64, to_lsn: u64) {
        let from_lsn = from_lsn.max(self.tail_lsn);
        let to_lsn = to_lsn.min(self.window_end());
        if to_lsn > from_lsn {
            self.zero_range(from_lsn, to_lsn);
        }
    }

    /// Removes every entry after `last_kept` (all of them when `None`), and
    /// erases their records so that recovery cannot bring them back.
    pub fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<()> {
        // `last_kept` is the caller's; at u64::MAX nothing is after it.
        let keep_next = last_kept.map_or(0, |i| i.saturating_add(1));
        if keep_next >= self.tip.next_index || self.slots.is_empty() {
            return Ok(());
        }
        if keep_next < self.first_index && self.anchor.is_some() {
            return Err(WalError::Conflict(format!(
                "cannot truncate after {last_kept:?}: entries up to {} are purged",
                self.first_index.saturating_sub(1)
            )));
        }
        let (new_tail, new_tip, keep) = if keep_next <= self.first_index {
            (self.head_lsn, ChainTip::after(self.anchor), 0)
        } else {
            let index = keep_next - 1;
            let slot = self.slot(index).expect("index checked above");
            let header = self.stored_header(slot.lsn);
            (
                slot.lsn + header.record_len(),
                ChainTip {
                    next_index: keep_next,
                    last_term: slot.term,
                    epoch: header.epoch,
                    unanchored: false,
                },
                keep_next - self.first_index,
            )
        };
        self.zero_range(new_tail, self.tail_lsn);
        self.slots.truncate(keep as usize);
        if self.slots.is_empty() {
            self.first_index = self.anchor.map_or(0, |a| a.index + 1);
        }
        self.tail_lsn = new_tail;
        self.tip = new_tip;
        let acked = self.word(ACKED_OFFSET);
        let keep_word = encode_index_word(last_kept);
        acked.fetch_min(keep_word, Ordering::AcqRel);
        Ok(())
    }

    /// Where the log would continue after purging up to and including
    /// `upto`; `None` when that is already purged. `upto` may lie beyond the
    /// log (after a snapshot), then the whole log goes.
    pub fn purge_point(&self, upto: LogPos) -> Result<Option<PurgePoint>> {
        check_term("purge term", upto.term)
            .and_then(|()| check_index("purge index", upto.index))
            .map_err(|e| WalError::Conflict(format!("purge to {upto:?} refused: {e}")))?;
        if self.anchor.is_none() && !self.slots.is_empty() && upto.index < self.first_index {
            // A log that began at an arbitrary index gets its purge point
            // right before its first entry (see `Ring::needs_anchor`).
            if upto.index + 1 != self.first_index {
                return Err(WalError::Conflict(format!(
                    "purge to {upto:?} leaves a gap before the first entry {}",
                    self.first_index
                )));
            }
            return Ok(Some(PurgePoint {
                log: upto,
                next_lsn: self.head_lsn,
            }));
        }
        if upto.index < self.first_index {
            return match self.anchor {
                Some(a) if a.index == upto.index && a.term != upto.term => Err(WalError::Conflict(
                    format!("purge to {upto:?}, but {a:?} was purged already"),
                )),
                _ => Ok(None),
            };
        }
        let next_lsn = match self.slot(upto.index) {
            Some(slot) => {
                if slot.term != upto.term {
                    return Err(WalError::Conflict(format!(
                        "purge to {upto:?}, but the log holds term {} at that index",
                        slot.term
                    )));
                }
                slot.lsn + self.stored_header(slot.lsn).record_len()
            }
            None => self.tail_lsn,
        };
        Ok(Some(PurgePoint {
            log: upto,
            next_lsn,
        }))
    }

    /// True when the log began at an arbitrary index and has no purge point
    /// (recovery accepts its first record after a purge right before it
    /// without knowing the purged entry's term: [`Ring::anchor_on`]).
    pub fn needs_anchor(&self) -> bool {
        self.anchor.is_none() && !self.slots.is_empty()
    }

    /// Purges up to `point` (from [`Ring::purge_point`]) and advances `head`.
    /// The caller stores the purge point in the metadata file first.
    pub fn apply_purge(&mut self, point: PurgePoint) {
        assert!(
            point.next_lsn >= self.head_lsn && point.next_lsn <= self.tail_lsn,
            "purge point {point:?} outside {}..{}",
            self.head_lsn,
            self.tail_lsn
        );
        let drop = (point.log.index + 1)
            .min(self.tip.next_index)
            .saturating_sub(self.first_index);
        self.slots.drain(..drop as usize);
        self.first_index = point.log.index + 1;
        self.anchor = Some(point.log);
        if self.slots.is_empty() {
            self.tip = ChainTip::after(Some(point.log));
        }
        self.head_lsn = point.next_lsn;
        self.word(HEAD_OFFSET)
            .store(point.next_lsn, Ordering::Release);
    }

    // ----- reading -----------------------------------------------------------

    /// Reads entry `index`, checking its header and CRC.
    pub fn read(&self, index: u64) -> Result<RecordView<'_>> {
        let slot = self.slot(index).ok_or(WalError::NotInLog {
            index,
            first: self.first_index,
            next: self.tip.next_index,
        })?;
        let corrupt = |detail: String| WalError::Corrupt {
            index,
            lsn: slot.lsn,
            detail,
        };
        let header_bytes = self.header_bytes(slot.lsn);
        // The loosest geometry, as recovery's: a record the log holds may
        // have been written under a higher record limit than today's.
        let geometry = Geometry::loosest(self.geometry.capacity);
        let payload_len = validate_header(header_bytes, slot.lsn, geometry)
            .map_err(|reason| corrupt(reason.to_string()))?;
        let payload = self.bytes(slot.lsn + RECORD_HEADER_BYTES as u64, payload_len as usize);
        // The chain was checked when the record entered the log; here the
        // record must still be itself: CRC, layout, index and term.
        let own_chain = ChainTip {
            next_index: index,
            last_term: crate::layout::le_u64(&header_bytes[40..]),
            epoch: Epoch::ZERO,
            unanchored: false,
        };
        let any_fence = Check::Recovery {
            fence: Epoch(u64::MAX),
        };
        let valid = validate_payload(header_bytes, payload, geometry, own_chain, any_fence)
            .map_err(|reason| corrupt(reason.to_string()))?;
        if valid.header.kind != RecordKind::Entry || valid.header.term != slot.term {
            return Err(corrupt(format!(
                "holds a {:?} of term {}, the log says an entry of term {}",
                valid.header.kind, valid.header.term, slot.term
            )));
        }
        Ok(RecordView {
            index,
            term: valid.header.term,
            lsn: slot.lsn,
            epoch: valid.header.epoch,
            payload,
        })
    }

    // ----- feeding the durable log (the segments) -----------------------------

    /// Copies the records of entries `from_index..` into `out`: whole
    /// records in the ring's format (header, payload, padding), wrap markers
    /// left out, at most `max_bytes` unless the first record alone is
    /// larger (it is copied whole). Returns the last index copied, `None`
    /// when the ring holds no entry at or after `from_index`.
    ///
    /// Every record copied is one the ring owns (appended or adopted), so
    /// no remote writer changes it while it is copied.
    pub fn copy_records(
        &self,
        from_index: u64,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Option<u64> {
        let start = from_index.max(self.first_index);
        let mut last = None;
        let mut copied = 0usize;
        for index in start..self.tip.next_index {
            let slot = self.slot(index).expect("index inside the ring");
            let len = self.stored_header(slot.lsn).record_len() as usize;
            if last.is_some() && copied + len > max_bytes {
                break;
            }
            out.extend_from_slice(self.bytes(slot.lsn, len));
            copied += len;
            last = Some(index);
        }
        last
    }

    /// Bytes of the ring's window in use: from `head` to the adopted tail.
    pub fn used_bytes(&self) -> u64 {
        self.tail_lsn - self.head_lsn
    }

    /// Forgets the entries up to and including `index` and advances `head`
    /// past them, giving their bytes back to writers. The caller guarantees
    /// they are in the durable log (the segments) already: the ring is only
    /// the window of recent entries. Entries not in the ring are ignored;
    /// `index` beyond the ring's last entry empties it.
    ///
    /// No metadata is stored: after a killed process, recovery starts from
    /// the `head` word in shared memory and takes the entry before the first
    /// record there from the segments.
    pub fn release_through(&mut self, index: u64) {
        if index < self.first_index || self.slots.is_empty() {
            return;
        }
        let last = index.min(self.tip.next_index - 1);
        let slot = self.slot(last).expect("index inside the ring");
        let next_lsn = slot.lsn + self.stored_header(slot.lsn).record_len();
        self.apply_purge(PurgePoint {
            log: LogPos {
                index: last,
                term: slot.term,
            },
            next_lsn,
        });
    }

    /// Forgets the oldest entries, none beyond `through`, until at most
    /// `max_used` bytes of the window are in use (or no entry up to
    /// `through` is left): [`Ring::release_through`] of as few entries as
    /// that takes. Returns true when `head` moved.
    pub fn release_to_fit(&mut self, max_used: u64, through: u64) -> bool {
        if self.used_bytes() <= max_used || through < self.first_index || self.slots.is_empty() {
            return false;
        }
        let last = through.min(self.tip.next_index - 1);
        let mut release = None;
        for index in self.first_index..=last {
            let slot = self.slot(index).expect("index inside the ring");
            release = Some(index);
            let next_lsn = slot.lsn + self.stored_header(slot.lsn).record_len();
            if self.tail_lsn - next_lsn <= max_used {
                break;
            }
        }
        match release {
            Some(index) => {
                self.release_through(index);
                true
            }
            None => false,
        }
    }

    /// Empties the ring and makes the log continue after `anchor` (the last
    /// entry of the durable log, `None` for an empty log), erasing every
    /// record between `head` and the tail. `head` does not move back: a
    /// leader may still have writes in flight up to `head + capacity`, and
    /// the next record goes at the old `head`, from where no such write can
    /// alias it. For a truncation below the ring's first entry (the entries
    /// kept are all in the segments) and for recovery.
    pub fn reset_after(&mut self, anchor: Option<LogPos>) {
        self.zero_range(self.head_lsn, self.tail_lsn);
        self.slots.clear();
        self.anchor = anchor;
        self.first_index = anchor.map_or(0, |a| a.index + 1);
        self.tip = ChainTip::after(anchor);
        self.tail_lsn = self.head_lsn;
        let acked = self.word(ACKED_OFFSET);
        acked.fetch_min(encode_index_word(anchor.map(|a| a.index)), Ordering::AcqRel);
    }

    /// Recovery: joins the ring's records (as [`Ring::open`] found them) to
    /// the durable log. `durable_last` is the segments' last entry,
    /// `purged` the log's purge point (the metadata file's), and
    /// `durable_term` gives the segments' term of an index.
    ///
    /// The ring is the newer of the two (the segments are written from it,
    /// and `head` only passes records the segments hold), so where both
    /// hold an index and disagree, the ring wins from there on. Records
    /// the ring holds below the purge point are forgotten. A ring whose
    /// first record does not continue the durable log (a gap, or another
    /// term before it) is emptied: its records cannot be placed.
    pub fn anchor_on(
        &mut self,
        durable_last: Option<LogPos>,
        durable_lsn_end: u64,
        purged: Option<LogPos>,
        durable_term: impl Fn(u64) -> Option<u64>,
    ) -> Anchoring {
        // Where the log stands without the ring.
        let base = durable_end(durable_last, purged);
        if let Some(p) = purged {
            self.release_through(p.index);
        }
        let Some(first_slot) = self.slots.front().copied() else {
            self.reset_after(base);
            self.move_empty_window(durable_lsn_end);
            return Anchoring {
                flush_from: base.map_or(0, |b| b.index + 1),
                durable_conflict_after: None,
                dropped: 0,
            };
        };
        let first = self.first_index;
        let prev_term = self.stored_header(first_slot.lsn).prev_term;
        let last = self.tip.next_index - 1;
        let continues = match (first.checked_sub(1), base) {
            // The log's very beginning, or nothing before it anywhere.
            (None, _) | (Some(_), None) => true,
            // A gap between the durable log and the ring.
            (Some(before), Some(base)) if before > base.index => false,
            (Some(before), Some(_)) => match durable_term(before) {
                // The segments hold its predecessor: the terms must agree.
                Some(term) => term == prev_term,
                // Written right after a purge (a snapshot installed): its
                // writer did not know the purged entry's term. Or the ring
                // reaches back before the segments' first entry.
                None => true,
            },
        };
        if !continues {
            let dropped = self.tip.next_index - first;
            tracing::warn!(
                first,
                last,
                prev_term,
                ?base,
                "the ring's records do not continue the durable log: dropped"
            );
            self.reset_after(base);
            self.move_empty_window(durable_lsn_end);
            return Anchoring {
                flush_from: base.map_or(0, |b| b.index + 1),
                durable_conflict_after: None,
                dropped,
            };
        }
        // A log that began at its first record (nothing durable or purged
        // before it) stays unanchored.
        if base.is_some() {
            self.anchor = first.checked_sub(1).map(|index| LogPos {
                index,
                term: prev_term,
            });
        }
        // The first index both hold with different terms, if any.
        let durable_next = durable_last.map_or(0, |d| d.index + 1);
        let overlap_end = durable_next.min(last + 1);
        let conflict = (first..overlap_end).find(|&k| durable_term(k) != self.term_of(k));
        match conflict {
            Some(k) => Anchoring {
                flush_from: k,
                durable_conflict_after: Some(k.checked_sub(1)),
                dropped: 0,
            },
            None => {
                if durable_next > self.tip.next_index {
                    // The segments reach further (the ring's scan stopped
                    // early: damage the segments do not share).
                    self.reset_after(durable_last);
                    self.move_empty_window(durable_lsn_end);
                }
                Anchoring {
                    flush_from: durable_next.max(first),
                    durable_conflict_after: None,
                    dropped: 0,
                }
            }
        }
    }

    /// Recovery of an empty ring: its window starts at `lsn` or beyond, so
    /// that its records continue the segments' lsn order (a ring recreated
    /// after a reboot starts at lsn 0). Nobody writes into a ring being
    /// recovered, so `head` may move.
    fn move_empty_window(&mut self, lsn: u64) {
        assert!(
            self.slots.is_empty(),
            "moving the window of a ring with entries"
        );
        if lsn > self.head_lsn && lsn <= MAX_LSN {
            self.head_lsn = lsn;
            self.tail_lsn = lsn;
            self.word(HEAD_OFFSET).store(lsn, Ordering::Release);
        }
    }

    // ----- internals ---------------------------------------------------------

    fn slot(&self, index: u64) -> Option<Slot> {
        let offset = index.checked_sub(self.first_index)?;
        self.slots.get(usize::try_from(offset).ok()?).copied()
    }

    fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the data area starts right after the control block.
        unsafe { self.base.as_ptr().add(CONTROL_BLOCK_BYTES) }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset < CONTROL_BLOCK_BYTES);
        // SAFETY: the mapping is page aligned and `offset` is a multiple of 8
        // inside the control block, so the word is aligned and in bounds; it
        // is only ever accessed atomically (locally and by the fabric's
        // atomics), and lives as long as `self`.
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn write_control(&mut self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= CONTROL_BLOCK_BYTES);
        // SAFETY: in bounds; the static header is not remotely accessible.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(offset),
                bytes.len(),
            )
        };
    }

    /// `len` bytes at logical `lsn`, which must not straddle the end.
    fn bytes(&self, lsn: u64, len: usize) -> &[u8] {
        let physical = self.geometry.physical(lsn) as usize;
        assert!(
            physical + len <= self.geometry.capacity as usize,
            "straddling read"
        );
        // SAFETY: in bounds (checked). Callers only read records the ring owns
        // or a finished remote write named by a control message (module docs).
        unsafe { std::slice::from_raw_parts(self.data_ptr().add(physical), len) }
    }

    fn header_bytes(&self, lsn: u64) -> &[u8; RECORD_HEADER_BYTES] {
        self.bytes(lsn, RECORD_HEADER_BYTES)
            .try_into()
            .expect("64 bytes")
    }

    /// The header of a record the ring owns (asserted: it was validated).
    fn stored_header(&self, lsn: u64) -> RecordHeader {
        let header = RecordHeader::decode(self.header_bytes(lsn)).unwrap_or_else(|defect| {
            panic!("owned record at lsn {lsn} lost its header: {defect:?}")
        });
        assert_eq!(header.lsn, lsn, "owned record moved");
        header
    }

    fn validate_in_place(
        &self,
        lsn: u64,
        tip: ChainTip,
        check: Check,
    ) -> Result<crate::validate::Valid, Invalid> {
        let header = self.header_bytes(lsn);
        let payload_len = validate_header(header, lsn, self.geometry)?;
        let payload = self.bytes(lsn + RECORD_HEADER_BYTES as u64, payload_len as usize);
        validate_payload(header, payload, self.geometry, tip, check)
    }

    /// Debug check that the records from `lsn` to the tail continue `tip`
    /// under the recovery rules: what this ring writes, it can recover.
    fn verify_from(&self, mut lsn: u64, mut tip: ChainTip) -> Result<(), Invalid> {
        let check = Check::Recovery {
            fence: self.fence(),
        };
        while lsn < self.tail_lsn {
            let valid = self.validate_in_place(lsn, tip, check)?;
            tip = valid.tip;
            lsn = valid.next_lsn;
        }
        assert_eq!(tip, self.tip, "the chain state matches the records");
        Ok(())
    }

    fn check_room(&self, end_lsn: u64) -> Result<()> {
        if end_lsn > MAX_LSN {
            return Err(WalError::LsnSpaceExhausted {
                end_lsn,
                max_lsn: MAX_LSN,
            });
        }
        let limit = self.head_lsn + self.geometry.capacity;
        if end_lsn > limit {
            return Err(WalError::RingFull {
                needed: end_lsn - self.tail_lsn,
                free: limit - self.tail_lsn,
            });
        }
        Ok(())
    }

    fn zero_range(&mut self, from: u64, to: u64) {
        debug_assert!(to - from <= self.geometry.capacity);
        let mut lsn = from;
        while lsn < to {
            let physical = self.geometry.physical(lsn);
            let run = (self.geometry.capacity - physical).min(to - lsn);
            // SAFETY: in bounds (the run stops at the end of the area); the
            // range is the ring's own (truncated entries or scratch beyond the
            // tail that no fence holder is writing: see `clear_scratch`).
            unsafe {
                std::ptr::write_bytes(self.data_ptr().add(physical as usize), 0, run as usize)
            };
            lsn += run;
        }
        self.mark_dirty(from, to);
    }

    fn mark_dirty(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        self.unsynced = Some(match self.unsynced {
            Some((lo, hi)) => (lo.min(from), hi.max(to)),
            None => (from, to),
        });
    }

    fn sync_data(&mut self) -> Result<()> {
        self.check_not_poisoned()?;
        let Some((from, to)) = self.unsynced else {
            return Ok(());
        };
        let capacity = self.geometry.capacity;
        let (a, b) = (self.geometry.physical(from), self.geometry.physical(to));
        let ranges = if to - from >= capacity {
            [(0, capacity), (0, 0)]
        } else if a < b || b == 0 {
            [(a, if b == 0 { capacity } else { b }), (0, 0)]
        } else {
            [(a, capacity), (0, b)]
        };
        for (start, end) in ranges.into_iter().filter(|(s, e)| s < e) {
            let flushed = self
                .map
                .flush_range(CONTROL_BLOCK_BYTES + start as usize, (end - start) as usize);
            self.poison_on_error(flushed)?;
        }
        self.unsynced = None;
        Ok(())
    }

    fn sync_control(&mut self) -> Result<()> {
        self.check_not_poisoned()?;
        let flushed = self.map.flush_range(0, CONTROL_BLOCK_BYTES);
        self.poison_on_error(flushed)
    }

    /// A failed msync may have dropped the dirty pages it could not write
    /// (they are then clean and a retry "succeeds" without writing them), so
    /// after one failure nothing the ring holds can be called durable: every
    /// later sync fails too, and the node must restart and recover.
    fn poison_on_error(&mut self, result: std::io::Result<()>) -> Result<()> {
        result.map_err(|source| {
            self.sync_failed = Some(source.to_string());
            WalError::Io {
                op: "msync",
                path: self.path.clone(),
                source,
            }
        })
    }

    fn check_not_poisoned(&self) -> Result<()> {
        match &self.sync_failed {
            Some(first) => Err(WalError::SyncFailed {
                path: self.path.clone(),
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// Checks the control words that hold `index + 1` (the acknowledged
/// watermark and the commit hint): an index above [`MAX_INDEX`] is no index
/// this ring can hold.
fn check_index_words(path: &Path, ring: &Ring) -> Result<()> {
    for (field, index) in [
        ("acknowledged watermark", ring.acked()),
        ("commit hint", ring.commit_hint()),
    ] {
        if let Some(index) = index {
            check_index(field, index).map_err(|source| WalError::Layout {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Writes records straight into the mapping.
struct MapSink {
    data: *mut u8,
    capacity: u64,
}

impl RecordSink for MapSink {
    fn put_record(&mut self, lsn: u64, header: &[u8; RECORD_HEADER_BYTES], payload: &[u8]) {
        let physical = (lsn & (self.capacity - 1)) as usize;
        assert!(physical + RECORD_HEADER_BYTES + payload.len() <= self.capacity as usize);
        // SAFETY: in bounds (asserted); the bytes lie at or beyond the tail
        // and below head + capacity (checked by `append`), where only this
        // node writes while it appends locally.
        unsafe {
            let dst = self.data.add(physical);
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, RECORD_HEADER_BYTES);
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                dst.add(RECORD_HEADER_BYTES),
                payload.len(),
            );
        }
    }
}

/// Starts the ring from an empty page cache, faulted in page by page.
///
/// This matters for a ring file on a disk (a ring dir that is not a tmpfs,
/// e.g. the wal's own benchmark); on tmpfs both calls do nothing.
///
/// Linux (6.x) caches ext4 files in large folios (up to 2 MiB) when it reads
/// ahead. A store through the mapping dirties a whole folio, and msync then
/// writes all of it back: a 64-byte append cost ~3 ms to sync instead of
/// ~0.3 ms (measured, wal/BENCH.md). So at open: write back what a previous
/// instance left dirty, drop the file's cached pages (they may have come in
/// through read-ahead, from a `cp` or an older process), and forbid
/// read-ahead on the descriptor and, before any page is touched, on the
/// mapping, so that every page is faulted in as its own 4 KiB folio.
fn fresh_page_cache(file: &File, path: &Path) -> Result<()> {
    file.sync_data().map_err(WalError::io("fdatasync", path))?;
    for (advice, what) in [
        (libc::POSIX_FADV_DONTNEED, "posix_fadvise(DONTNEED)"),
        (libc::POSIX_FADV_RANDOM, "posix_fadvise(RANDOM)"),
    ] {
        // SAFETY: plain syscall on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice) };
        if rc != 0 {
            return Err(WalError::Io {
                op: what,
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
    }
    Ok(())
}

fn lock_memory(map: &MmapMut, path: &Path) -> bool {
    match map.lock() {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                path = %path.display(),
                bytes = map.len(),
                %error,
                "mlock of the ring failed (RLIMIT_MEMLOCK?); the ring works but may be paged out"
            );
            false
        }
    }
}
