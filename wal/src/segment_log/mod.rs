//! The log of segment files: a node's retained log on disk, beyond the
//! ring's window of recent records.
//!
//! [`SegmentLog`] is the single writer: it appends the ring's own record
//! bytes ([`crate::segment`] gives the file format), rolls to a new segment
//! when the current one is full, makes what it appended durable on
//! [`SegmentLog::sync`], cuts the log after a Raft conflict
//! ([`SegmentLog::truncate_after`]) and deletes whole old segments for
//! retention ([`SegmentLog::remove_before`]). [`SegmentReader`] (cheap to
//! clone, `Send + Sync`) reads records while the writer goes on: it holds
//! each segment's file handle through an `Arc`, so a segment removed by
//! retention while a read is in flight is still read to the end.
//!
//! All I/O goes through [`Disk`], a synchronous trait: no thread and no
//! async inside, so that a deterministic simulator can drive it. No lock is
//! held across I/O: the writer does its I/O, then publishes the new state to
//! readers under a short write lock; readers copy what they need under a
//! short read lock and read without it.
//!
//! # Recovery
//!
//! [`SegmentLog::open`] scans every segment in name order (one segment's
//! bytes in memory at a time; per segment it keeps a `u32` offset per
//! record and the term runs), applies the chain rules of
//! [`crate::segment`], and gives the ring's verdicts ([`Damage`]):
//! - clean end ([`Damage::None`]): the records end where the writes ended
//!   (zeroes of preallocation after the last record are a clean end);
//! - torn tail ([`Damage::TornTail`]): the last write was cut; the garbage
//!   beyond the last valid record is cut off (files cut, later ones
//!   removed) before `open` returns;
//! - corruption inside ([`Damage::CorruptInside`]): the log breaks below
//!   the acknowledged index the caller passes in, or a well-formed record
//!   that could only have been written after the lost ones lies beyond the
//!   break (in the same segment or a later one). Nothing is cut at `open`:
//!   the caller decides (the replicator blocks votes until a leader
//!   re-replicated past the break). The log is open at the break; the first
//!   `append` or `truncate_after` discards the damaged remainder (durably)
//!   before it writes.
//!
//! # Durability and ordering on disk
//!
//! `append` writes with one positioned vectored write per segment touched
//! and never flushes; `sync` flushes every segment written since the last
//! sync (`fdatasync`) and the directory when a segment was created or
//! removed. `truncate_after` and `remove_before` are durable when they
//! return. They keep the directory a valid log at every step, whatever
//! order the file system writes directory changes back in: each removal is
//! made durable (directory fsync) before the next; later segments are
//! removed newest first before the boundary one is cut, old segments
//! oldest first. A new segment is preallocated when it is created
//! (see `wal/BENCH.md`), so an append into it cannot fail for lack of space:
//! a full disk shows as [`WalError::DiskFull`] when a segment is created,
//! before anything of the batch is written. After a failed write or flush,
//! the log refuses every write ([`WalError::LogFailed`]): the kernel may
//! have dropped the pages it could not write.
//!
//! # For the caller (the replicator's log store)
//!
//! - Append only records after [`SegmentLog::last_log`] (after a restart the
//!   ring may hold records the segments already have: skip those); a record
//!   that does not continue the log is a bug and panics.
//! - A record's lsn must not be below [`SegmentLog::lsn_end`]: a ring that
//!   is rebuilt (its shared memory lost in a reboot) must continue at or
//!   beyond it.
//! - A Raft conflict cuts both: the ring's `truncate_after` and this log's,
//!   before records of the new leader are appended.
//! - `sync` in `fsync` durability, before acknowledging; `memory`
//!   durability may never call it (the page cache writes the segments back).
//! - Recovery after a crash: writeback order is not write order, so a
//!   machine crash before a `sync` can leave a later segment on disk and an
//!   earlier one's tail missing; the scan then sees well-formed records
//!   beyond the break and says corruption inside, as the ring's scan does
//!   for its own unflushed writes (liveness: the node waits for a leader to
//!   re-replicate; nothing acknowledged is affected).
//!
//! # An empty log
//!
//! A log with no segment (new, or cut by `truncate_after(None)`) takes any
//! first record: its index and prev_term start the chain (openraft's logs
//! may begin at any index). `remove_before` never removes the last segment,
//! so the chain stays anchored on disk.

mod reader;
mod scan;
mod write;

pub use scan::check_segments;
use scan::{recovery_of, scan_dir};

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::SystemTime;

use crate::disk::{Access, Disk, DiskFile};
use crate::error::{Result, WalError};
use crate::layout::Epoch;
use crate::record::{RECORD_HEADER_BYTES, RecordHeader};
use crate::recovery::Damage;
use crate::segment::{MAX_SEGMENT_FILE_BYTES, SegmentDefect, SegmentHeader, TermRun};
use crate::validate::{ChainTip, LogPos};

/// Default size of a segment file, in bytes.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default [`SegmentConfig::zero_ahead_bytes`].
pub const DEFAULT_ZERO_AHEAD_BYTES: u64 = 1 << 20;
/// Smallest segment size, in bytes.
pub const MIN_SEGMENT_BYTES: u64 = 4096;
/// Largest segment size, in bytes.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Largest record payload a segment log takes, in bytes.
pub const MAX_SEGMENT_RECORD_BYTES: u64 = 1 << 30;

const _: () = assert!(
    MAX_SEGMENT_BYTES + RECORD_HEADER_BYTES as u64 + MAX_SEGMENT_RECORD_BYTES + 64
        <= MAX_SEGMENT_FILE_BYTES
);

/// How a segment log is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    /// The cluster's id (checked against every segment header).
    pub cluster_id: u64,
    /// This node's id (checked against every segment header).
    pub node_id: u64,
    /// A segment rolls when the next record would take it beyond this
    /// many bytes (a segment holds at least one record, so a record larger
    /// than this gets a segment of its own). A multiple of 4096 between
    /// [`MIN_SEGMENT_BYTES`] and [`MAX_SEGMENT_BYTES`].
    pub segment_bytes: u64,
    /// Largest payload `append` takes, in bytes (at most
    /// [`MAX_SEGMENT_RECORD_BYTES`]). Not applied when reading: records
    /// written under a higher limit stay readable.
    pub max_record_bytes: u64,
    /// Allocate each new segment's `segment_bytes` on disk when it is
    /// created (`fallocate`), so that appends never find the disk full
    /// mid-batch. See `wal/BENCH.md` for what it costs.
    pub preallocate: bool,
    /// With `preallocate`: a write that passes the part of the segment
    /// already written also writes zeroes up to the next multiple of this
    /// many bytes (in the same pwritev), so that the flushes of the writes
    /// that follow find their blocks already written: on ext4 a write into
    /// a fallocated (unwritten) block makes `fdatasync` commit the journal
    /// to convert it, a write into a written block does not (`wal/BENCH.md`).
    /// It doubles the bytes written. 0 turns it off; otherwise a multiple
    /// of 4096 (taken as `segment_bytes` when above it).
    pub zero_ahead_bytes: u64,
}

impl SegmentConfig {
    /// The defaults: 64 MiB segments, preallocated, 64 MiB records.
    pub fn new(cluster_id: u64, node_id: u64) -> SegmentConfig {
        SegmentConfig {
            cluster_id,
            node_id,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_record_bytes: 64 << 20,
            preallocate: true,
            zero_ahead_bytes: DEFAULT_ZERO_AHEAD_BYTES,
        }
    }

    fn check(&self) -> Result<()> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes)
            || !self.segment_bytes.is_multiple_of(4096)
        {
            return Err(WalError::Config(format!(
                "segment_bytes {} is not a multiple of 4096 between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES}",
                self.segment_bytes
            )));
        }
        if !self.zero_ahead_bytes.is_multiple_of(4096) || self.zero_ahead_bytes > MAX_SEGMENT_BYTES
        {
            return Err(WalError::Config(format!(
                "zero_ahead_bytes {} is not a multiple of 4096 up to {MAX_SEGMENT_BYTES}",
                self.zero_ahead_bytes
            )));
        }
        if self.max_record_bytes > MAX_SEGMENT_RECORD_BYTES {
            return Err(WalError::Config(format!(
                "max_record_bytes {} is above {MAX_SEGMENT_RECORD_BYTES}",
                self.max_record_bytes
            )));
        }
        Ok(())
    }
}

/// Where the scan of the segments stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentStop {
    /// The segment file.
    pub path: PathBuf,
    /// The first index its name stands for.
    pub segment_first_index: u64,
    /// The offset in the file of the first byte not part of the log.
    pub offset: u64,
    /// Why.
    pub reason: SegmentDefect,
}

/// What [`SegmentLog::open`] (or the offline checker) found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRecovery {
    /// Segment files kept.
    pub segments: u64,
    /// The first index held, or the index the log continues at when empty
    /// (0 for a log without a segment).
    pub first_index: u64,
    /// The last entry's log id, `None` when the log is empty.
    pub last: Option<LogPos>,
    /// Entries held.
    pub entries: u64,
    /// Bytes of the segment files kept (preallocated space included).
    pub disk_bytes: u64,
    /// The acknowledged index the caller passed in.
    pub acked: Option<u64>,
    /// Where the scan stopped, when it stopped at anything but the end of
    /// the last segment's data.
    pub stop: Option<SegmentStop>,
    /// How the log ended.
    pub damage: Damage,
    /// What `open` cut off (a torn tail or garbage after a clean end): the
    /// bytes after the last kept segment's last record, cleared (the file
    /// is cut there, then preallocated again with zeroes). Zero for the
    /// offline checker, which changes nothing.
    pub cut_bytes: u64,
    /// Segment files removed by `open`.
    pub removed_files: u64,
}

impl SegmentRecovery {
    /// True when the log lost entries inside it: the node must not grant
    /// votes until a leader has re-replicated past the break.
    pub fn corrupt_inside(&self) -> bool {
        matches!(self.damage, Damage::CorruptInside(_))
    }
}

/// One record read from the segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Raft index.
    pub index: u64,
    /// Raft term.
    pub term: u64,
    /// Its lsn in the ring it was written from.
    pub lsn: u64,
    /// The epoch of its writer.
    pub epoch: Epoch,
    /// The payload.
    pub payload: Vec<u8>,
}

/// One segment, as the writer and the readers see it.
struct Segment<F> {
    first_index: u64,
    path: PathBuf,
    file: Arc<F>,
    /// File offset of each record.
    offsets: Vec<u32>,
    terms: Vec<TermRun>,
    /// File offset one past the last record.
    end: u64,
    /// The file's length (preallocated space included).
    file_len: u64,
    /// When records were last appended to it (for a segment found at open,
    /// its file's modification time): what age-based retention goes by.
    written_at: SystemTime,
}

impl<F> Segment<F> {
    fn next_index(&self) -> u64 {
        self.first_index + self.offsets.len() as u64
    }

    fn record_range(&self, index: u64) -> (u64, u64) {
        let i = (index - self.first_index) as usize;
        let start = self.offsets[i] as u64;
        let end = self.offsets.get(i + 1).map_or(self.end, |o| *o as u64);
        (start, end)
    }

    fn term_of(&self, index: u64) -> u64 {
        let run = self.terms.partition_point(|r| r.first_index <= index);
        assert!(run > 0, "term runs start at the segment's first index");
        self.terms[run - 1].term
    }

    fn truncate_terms(&mut self) {
        let next = self.next_index();
        self.terms.retain(|r| r.first_index < next);
    }
}

/// The state readers share with the writer.
struct Shared<F> {
    segments: VecDeque<Segment<F>>,
    /// The index the log continues at when it has no segment.
    empty_next: u64,
}

impl<F> Shared<F> {
    fn first_index(&self) -> u64 {
        self.segments
            .front()
            .map_or(self.empty_next, |s| s.first_index)
    }

    fn next_index(&self) -> u64 {
        self.segments
            .back()
            .map_or(self.empty_next, |s| s.next_index())
    }

    fn find(&self, index: u64) -> Option<usize> {
        if index < self.first_index() || index >= self.next_index() {
            return None;
        }
        let i = self.segments.partition_point(|s| s.first_index <= index);
        Some(i - 1)
    }

    fn out_of_range(&self, index: u64) -> WalError {
        let (first, next) = (self.first_index(), self.next_index());
        if index < first {
            WalError::Trimmed { index, first, next }
        } else {
            WalError::NotInLog { index, first, next }
        }
    }
}

fn read_lock<F>(lock: &RwLock<Shared<F>>) -> RwLockReadGuard<'_, Shared<F>> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_lock<F>(lock: &RwLock<Shared<F>>) -> RwLockWriteGuard<'_, Shared<F>> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads records from the segments while the writer appends. Cheap to
/// clone; `Send + Sync`.
pub struct SegmentReader<D: Disk> {
    shared: Arc<RwLock<Shared<D::File>>>,
}

impl<D: Disk> Clone for SegmentReader<D> {
    fn clone(&self) -> Self {
        SegmentReader {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<D: Disk> std::fmt::Debug for SegmentReader<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, next) = self.range();
        f.debug_struct("SegmentReader")
            .field("first", &first)
            .field("next", &next)
            .finish()
    }
}

/// A run of records of one segment to read with one pread.
struct Run<F> {
    file: Arc<F>,
    first_index: u64,
    start: u64,
    end: u64,
    /// Offsets of the records in the run, relative to `start`.
    offsets: Vec<u64>,
}

/// What the first write after a corrupt-inside `open` must discard first.
#[derive(Clone, Debug)]
struct Discard {
    /// Files beyond the last kept segment, newest first.
    remove: Vec<PathBuf>,
    /// Cut the last kept segment at its end.
    cut_last: bool,
}

/// Why the log stopped taking writes.
#[derive(Clone, Debug)]
struct Failure {
    path: PathBuf,
    op: &'static str,
    first: String,
}

/// The single writer of a log of segment files (module docs).
pub struct SegmentLog<D: Disk> {
    disk: D,
    dir: PathBuf,
    config: SegmentConfig,
    shared: Arc<RwLock<Shared<D::File>>>,
    /// The chain state after the last record.
    tip: ChainTip,
    /// Where the last record ends in lsn space (0 for an empty log).
    lsn_end: u64,
    /// Segments written since the last sync.
    unsynced: Vec<Arc<D::File>>,
    /// A segment was created or removed since the last directory sync.
    dir_dirty: bool,
    /// The last entry made durable by `sync`.
    durable: Option<LogPos>,
    failed: Option<Failure>,
    discard: Option<Discard>,
    /// How far the last segment is known written (records or zeroes).
    zeroed_to: u64,
    /// `zero_ahead_bytes` of zeroes, to write from.
    zeroes: Vec<u8>,
}

impl<D: Disk> std::fmt::Debug for SegmentLog<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLog")
            .field("dir", &self.dir)
            .field("range", &self.reader().range())
            .field("tip", &self.tip)
            .field("durable", &self.durable)
            .finish()
    }
}

/// A segment as the scan found it.
struct Scanned<F> {
    segment: Segment<F>,
    tip: ChainTip,
    lsn_end: u64,
    /// Bytes other than zeroes follow the segment's last record.
    garbage_after_end: bool,
}

/// The outcome of scanning a segment directory, before any repair.
struct DirScan<F> {
    kept: Vec<Scanned<F>>,
    /// Segment files beyond the last kept one (their names), oldest first.
    beyond: Vec<(u64, PathBuf)>,
    stop: Option<SegmentStop>,
    damage: Damage,
    /// The last kept segment must be cut at its end: the break lies in it,
    /// or bytes other than zeroes follow its last record.
    cut_last: bool,
}

impl<D: Disk> SegmentLog<D> {
    /// Opens (creating `dir` when missing) the segment log in `dir`,
    /// recovering it (module docs). `acked` is the highest index this node
    /// acknowledged that the log must still hold, if any (`None` when the
    /// log was emptied by `truncate_after(None)` since, e.g. for a
    /// snapshot: an empty log holds no index).
    ///
    /// # Errors
    /// [`WalError::Config`] for a bad configuration;
    /// [`WalError::Foreign`] when a segment belongs to another cluster or
    /// node; [`WalError::Inconsistent`] for a file too large to be a
    /// segment; [`WalError::Io`] / [`WalError::DiskFull`] from the disk.
    pub fn open(
        disk: D,
        dir: &Path,
        config: SegmentConfig,
        acked: Option<u64>,
    ) -> Result<(SegmentLog<D>, SegmentRecovery)> {
        config.check()?;
        disk.create_dir_all(dir)?;
        // The folder's own entry must survive a crash too.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            disk.sync_dir(parent)?;
        }
        let scan = scan_dir(
            &disk,
            dir,
            config.cluster_id,
            config.node_id,
            acked,
            Access::ReadWrite,
        )?;
        let mut kept = scan.kept;
        let corrupt = matches!(scan.damage, Damage::CorruptInside(_));
        // Files beyond the log, newest first; when the break lies in the
        // last kept segment, cut it at its end.
        let remove: Vec<PathBuf> = scan.beyond.iter().rev().map(|(_, p)| p.clone()).collect();
        let cut_last = scan.cut_last;
        let mut log = SegmentLog::unscanned(disk, dir, config);
        if let Some(last) = kept.last() {
            log.tip = last.tip;
            log.lsn_end = last.lsn_end;
        }
        let (discard, cut_bytes, removed_files) =
            log.discard_beyond(&mut kept, remove, cut_last, corrupt)?;
        // What the scan read may sit in the page cache only (after a killed
        // process): flush it, so that `durable()` tells the truth.
        for s in &kept {
            s.segment.file.sync_data()?;
        }
        if !kept.is_empty() {
            log.disk.sync_dir(dir)?;
        }
        let recovery = recovery_of(
            &kept,
            scan.stop,
            scan.damage,
            acked,
            cut_bytes,
            removed_files,
        );
        {
            let mut shared = write_lock(&log.shared);
            shared.segments = kept.into_iter().map(|s| s.segment).collect();
        }
        log.discard = discard;
        log.durable = log.last_log();
        log.zeroed_to = log.last_end();
        Ok((log, recovery))
    }

    /// A log in `dir` with no segments yet, before the scan's are
    /// published to it.
    fn unscanned(disk: D, dir: &Path, config: SegmentConfig) -> SegmentLog<D> {
        SegmentLog {
            disk,
            dir: dir.to_path_buf(),
            config,
            shared: Arc::new(RwLock::new(Shared {
                segments: VecDeque::new(),
                empty_next: 0,
            })),
            tip: ChainTip::after(None),
            lsn_end: 0,
            unsynced: Vec::new(),
            dir_dirty: false,
            durable: None,
            failed: None,
            discard: None,
            zeroed_to: 0,
            zeroes: if config.preallocate {
                vec![0; config.zero_ahead_bytes.min(config.segment_bytes) as usize]
            } else {
                Vec::new()
            },
        }
    }

    /// Deals with what lies beyond the log at open: the files to `remove`
    /// (newest first) and, with `cut_last`, the last kept segment's bytes
    /// past its end. When the log is `corrupt` inside, nothing is removed
    /// yet (a [`Discard`] is returned, done at the first write); otherwise
    /// they go now. Returns the discard, the bytes cut and the files removed.
    fn discard_beyond(
        &mut self,
        kept: &mut [Scanned<D::File>],
        remove: Vec<PathBuf>,
        cut_last: bool,
        corrupt: bool,
    ) -> Result<(Option<Discard>, u64, u64)> {
        let mut cut_bytes = 0;
        let mut removed_files = 0;
        let mut discard = None;
        if corrupt {
            if !remove.is_empty() || cut_last {
                discard = Some(Discard { remove, cut_last });
            }
        } else {
            self.remove_files(&remove)?;
            removed_files = remove.len() as u64;
            if cut_last && let Some(last) = kept.last_mut() {
                cut_bytes = last.segment.file_len - last.segment.end;
                self.cut_segment(&mut last.segment)?;
            }
        }
        Ok((discard, cut_bytes, removed_files))
    }

    /// A reader of this log.
    pub fn reader(&self) -> SegmentReader<D> {
        SegmentReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The directory of the segments.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration.
    pub fn config(&self) -> &SegmentConfig {
        &self.config
    }

    /// The first index held; when the log is empty, the index it continues
    /// at (0 for a log that never held an entry).
    pub fn first_index(&self) -> u64 {
        read_lock(&self.shared).first_index()
    }

    /// One past the last index held.
    pub fn next_index(&self) -> u64 {
        read_lock(&self.shared).next_index()
    }

    /// The last entry's log id, `None` when the log is empty.
    pub fn last_log(&self) -> Option<LogPos> {
        let shared = read_lock(&self.shared);
        let last = shared.segments.back()?;
        let index = last.next_index().checked_sub(1)?;
        (index >= last.first_index).then(|| LogPos {
            index,
            term: last.term_of(index),
        })
    }

    /// The chain state after the last record: the index and prev_term the
    /// next record must carry, and the epoch it must not go below (an
    /// unanchored tip for an empty log).
    pub fn tip(&self) -> ChainTip {
        self.tip
    }

    /// Where the last record ends in lsn space (0 for an empty log). The
    /// next record's lsn must not be below it: a ring rebuilt after its
    /// memory was lost (a reboot) must continue at or beyond it.
    pub fn lsn_end(&self) -> u64 {
        self.lsn_end
    }

    /// The last entry made durable by [`SegmentLog::sync`] (or found at
    /// `open`).
    pub fn durable(&self) -> Option<LogPos> {
        self.durable
    }

    /// The term of entry `index`, when the log holds it (from memory).
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.reader().term_of(index)
    }

    /// The lsn (in the ring it came from) of entry `index`: one read of its
    /// header.
    ///
    /// # Errors
    /// As [`SegmentReader::read`].
    pub fn lsn_of(&self, index: u64) -> Result<u64> {
        Ok(self.header_of(index)?.lsn)
    }

    /// Bytes of the segment files (preallocated space included).
    pub fn disk_bytes(&self) -> u64 {
        self.reader().disk_bytes()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        read_lock(&self.shared).segments.len()
    }

    fn header_of(&self, index: u64) -> Result<RecordHeader> {
        let (file, offset) = {
            let shared = read_lock(&self.shared);
            let i = shared
                .find(index)
                .ok_or_else(|| shared.out_of_range(index))?;
            let segment = &shared.segments[i];
            (Arc::clone(&segment.file), segment.record_range(index).0)
        };
        let mut bytes = [0u8; RECORD_HEADER_BYTES];
        let read = file.read_at(&mut bytes, offset)?;
        let corrupt = |detail: String| WalError::Corrupt {
            index,
            lsn: 0,
            detail: format!("{} at offset {offset}: {detail}", file.path().display()),
        };
        if read < RECORD_HEADER_BYTES {
            return Err(corrupt("the file ends inside the header".to_string()));
        }
        let header = RecordHeader::decode(&bytes).map_err(|d| corrupt(format!("{d:?}")))?;
        if header.index != index {
            return Err(corrupt(format!("holds index {}", header.index)));
        }
        Ok(header)
    }

    /// Where the last segment's records end (0 without a segment).
    fn last_end(&self) -> u64 {
        read_lock(&self.shared).segments.back().map_or(0, |s| s.end)
    }

    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(failure) => Err(WalError::LogFailed {
                path: failure.path.clone(),
                op: failure.op,
                first: failure.first.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, op: &'static str, path: &Path, err: &WalError) {
        if self.failed.is_none() {
            self.failed = Some(Failure {
                path: path.to_path_buf(),
                op,
                first: err.to_string(),
            });
        }
    }

    /// Cuts `segment`'s file at its end (zeroes after it, preallocated
    /// again) and makes it durable.
    fn cut_segment(&self, segment: &mut Segment<D::File>) -> Result<()> {
        segment.file.set_len(segment.end)?;
        if self.config.preallocate {
            segment.file.preallocate(self.config.segment_bytes)?;
        }
        segment.file.sync_data()?;
        segment.file_len = segment.file.size()?;
        Ok(())
    }

    /// Discards what a corrupt-inside `open` left beyond the log.
    fn discard_damage(&mut self) -> Result<()> {
        let Some(discard) = self.discard.take() else {
            return Ok(());
        };
        self.remove_files(&discard.remove)?;
        let last = read_lock(&self.shared)
            .segments
            .back()
            .map(|s| (Arc::clone(&s.file), s.end));
        self.zeroed_to = self.last_end();
        if discard.cut_last
            && let Some((file, end)) = last
        {
            file.set_len(end)?;
            if self.config.preallocate {
                file.preallocate(self.config.segment_bytes)?;
            }
            file.sync_data()?;
            let len = file.size()?;
            if let Some(last) = write_lock(&self.shared).segments.back_mut() {
                last.file_len = len;
            }
        }
        Ok(())
    }
}

/// The records of an append bound for one segment.
#[derive(Default)]
struct Part<'a> {
    /// Set when the part starts a new segment.
    new_header: Option<SegmentHeader>,
    slices: Vec<&'a [u8]>,
    offsets: Vec<u32>,
    terms: Vec<TermRun>,
    /// The chain state after the part.
    tip: ChainTip,
    lsn_end: u64,
}
