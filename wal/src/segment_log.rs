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

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::SystemTime;

use crate::disk::{Access, Disk, DiskFile};
use crate::error::{Result, WalError};
use crate::layout::{Epoch, LINE_BYTES, MAX_INDEX};
use crate::record::{RECORD_HEADER_BYTES, RecordHeader, RecordKind, record_crc};
use crate::recovery::{Damage, Evidence};
use crate::segment::{
    MAX_SEGMENT_FILE_BYTES, OwnRecord, SEGMENT_HEADER_BYTES, SegmentDefect, SegmentHeader, TermRun,
    own_record, parse_segment_name, scan_records, segment_name, well_formed_beyond,
};
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

impl<D: Disk> SegmentReader<D> {
    /// The retained range: `(first index, one past the last index)`.
    pub fn range(&self) -> (u64, u64) {
        let shared = read_lock(&self.shared);
        (shared.first_index(), shared.next_index())
    }

    /// Where retention would start the log: the lowest index such that
    /// the records from it on take at most `max_bytes` (exact to the
    /// record), and past every segment but the last that was last written
    /// before `written_before` (whole segments, like Kafka's
    /// `retention.ms`). `None` sets no limit. Never past the end of the
    /// log; the first index when nothing needs to go.
    pub fn retention_point(
        &self,
        max_bytes: Option<u64>,
        written_before: Option<SystemTime>,
    ) -> u64 {
        let shared = read_lock(&self.shared);
        let mut point = shared.first_index();
        if let Some(max) = max_bytes {
            let mut kept = 0u64;
            for segment in shared.segments.iter().rev() {
                let Some(&start) = segment.offsets.first() else {
                    continue;
                };
                let bytes = segment.end - start as u64;
                if kept + bytes <= max {
                    kept += bytes;
                    continue;
                }
                let j = segment
                    .offsets
                    .partition_point(|&o| kept + (segment.end - o as u64) > max);
                point = point.max(segment.first_index + j as u64);
                break;
            }
        }
        if let Some(before) = written_before {
            let closed = shared.segments.len().saturating_sub(1);
            for segment in shared.segments.iter().take(closed) {
                if segment.written_at < before {
                    point = point.max(segment.next_index());
                }
            }
        }
        point
    }

    /// Bytes of the records from `index` to the end of the log (`None`
    /// when the segments do not hold `index`).
    pub fn bytes_from(&self, index: u64) -> Option<u64> {
        let shared = read_lock(&self.shared);
        let i = shared.find(index)?;
        let in_first = shared.segments[i].end - shared.segments[i].record_range(index).0;
        let rest: u64 = shared
            .segments
            .iter()
            .skip(i + 1)
            .map(|s| s.offsets.first().map_or(0, |&o| s.end - o as u64))
            .sum();
        Some(in_first + rest)
    }

    /// Bytes of the segment files (preallocated space included).
    pub fn disk_bytes(&self) -> u64 {
        read_lock(&self.shared)
            .segments
            .iter()
            .map(|s| s.file_len)
            .sum()
    }

    /// The term of entry `index`, when the log holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        let shared = read_lock(&self.shared);
        let i = shared.find(index)?;
        Some(shared.segments[i].term_of(index))
    }

    /// Reads entry `index`, checking its record (CRC, index).
    ///
    /// # Errors
    /// [`WalError::Trimmed`] below the first retained index,
    /// [`WalError::NotInLog`] beyond the last (both name the retained
    /// range); [`WalError::Corrupt`] when the record on disk fails its
    /// checks; [`WalError::Io`].
    pub fn read(&self, index: u64) -> Result<SegmentRecord> {
        let mut records = self.read_range(index, index.saturating_add(1), 0)?;
        Ok(records
            .pop()
            .expect("a read of one index in range gives one record"))
    }

    /// Reads the entries `from..to` (`to` is cut to the end of the log),
    /// stopping once `max_bytes` of records were read (at least one record
    /// is read when `from < to`): one pread per segment touched.
    ///
    /// # Errors
    /// As [`SegmentReader::read`], for `from`; an empty range is fine.
    pub fn read_range(&self, from: u64, to: u64, max_bytes: u64) -> Result<Vec<SegmentRecord>> {
        let runs = {
            if from >= to {
                return Ok(Vec::new());
            }
            let shared = read_lock(&self.shared);
            let Some(mut i) = shared.find(from) else {
                return Err(shared.out_of_range(from));
            };
            let to = to.min(shared.next_index());
            let mut runs = Vec::new();
            let mut index = from;
            let mut bytes = 0u64;
            while index < to && (bytes == 0 || bytes < max_bytes) {
                let segment = &shared.segments[i];
                let last = to.min(segment.next_index());
                let start = segment.record_range(index).0;
                let mut offsets = Vec::new();
                let mut end = start;
                while index < last && (bytes == 0 || bytes < max_bytes) {
                    let (s, e) = segment.record_range(index);
                    offsets.push(s - start);
                    bytes += e - s;
                    end = e;
                    index += 1;
                }
                runs.push(Run {
                    file: Arc::clone(&segment.file),
                    first_index: index - offsets.len() as u64,
                    start,
                    end,
                    offsets,
                });
                i += 1;
            }
            runs
        };
        let mut records = Vec::new();
        for run in runs {
            let len = usize::try_from(run.end - run.start).expect("a segment fits in memory");
            let mut buf = vec![0u8; len];
            let read = run.file.read_at(&mut buf, run.start)?;
            for (k, offset) in run.offsets.iter().enumerate() {
                let index = run.first_index + k as u64;
                match decode_owned(&buf[..read], *offset as usize, index) {
                    Ok(record) => records.push(record),
                    Err(detail) => return Err(self.read_failed(index, &run.file, detail)),
                }
            }
        }
        Ok(records)
    }

    /// A record that failed its checks: gone by a truncation or retention
    /// since its position was taken (a range error), or corrupt on disk.
    fn read_failed(&self, index: u64, file: &Arc<D::File>, detail: String) -> WalError {
        let shared = read_lock(&self.shared);
        match shared.find(index) {
            Some(i) if Arc::ptr_eq(&shared.segments[i].file, file) => {
                let segment = &shared.segments[i];
                WalError::Corrupt {
                    index,
                    lsn: 0,
                    detail: format!(
                        "{} at offset {}: {detail}",
                        segment.path.display(),
                        segment.record_range(index).0
                    ),
                }
            }
            _ => shared.out_of_range(index),
        }
    }
}

/// Decodes and checks the record of `index` at `offset` of `buf`.
fn decode_owned(
    buf: &[u8],
    offset: usize,
    index: u64,
) -> std::result::Result<SegmentRecord, String> {
    let header_bytes: &[u8; RECORD_HEADER_BYTES] = buf
        .get(offset..offset + RECORD_HEADER_BYTES)
        .ok_or("the file ends inside the record's header")?
        .try_into()
        .expect("64 bytes");
    let header = RecordHeader::decode(header_bytes).map_err(|d| format!("bad header: {d:?}"))?;
    let payload_len = header.payload_len as usize;
    let payload = buf
        .get(offset + RECORD_HEADER_BYTES..offset + RECORD_HEADER_BYTES + payload_len)
        .ok_or("the file ends inside the record's payload")?;
    let computed = record_crc(header_bytes, payload);
    if computed != header.crc {
        return Err(format!(
            "CRC mismatch: stored {:#010x}, computed {computed:#010x}",
            header.crc
        ));
    }
    if header.kind != RecordKind::Entry || header.index != index {
        return Err(format!(
            "holds a {:?} of index {}, the log says entry {index}",
            header.kind, header.index
        ));
    }
    Ok(SegmentRecord {
        index,
        term: header.term,
        lsn: header.lsn,
        epoch: header.epoch,
        payload: payload.to_vec(),
    })
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

/// Lists the segment files of `dir`, in log order.
fn list_segments<D: Disk>(disk: &D, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments: Vec<(u64, PathBuf)> = disk
        .list(dir)?
        .into_iter()
        .filter_map(|name| parse_segment_name(&name).map(|first| (first, dir.join(name))))
        .collect();
    segments.sort_by_key(|(first, _)| *first);
    Ok(segments)
}

fn read_whole<F: DiskFile>(file: &F) -> Result<Vec<u8>> {
    let len = file.size()?;
    if len > MAX_SEGMENT_FILE_BYTES {
        return Err(WalError::Inconsistent {
            path: file.path().to_path_buf(),
            what: format!(
                "segment file of {len} bytes, above the largest a segment can be ({MAX_SEGMENT_FILE_BYTES})"
            ),
        });
    }
    let mut buf = vec![0u8; len as usize];
    let read = file.read_at(&mut buf, 0)?;
    buf.truncate(read);
    Ok(buf)
}

/// Scans the segments of `dir` (module docs, "Recovery"), opening files
/// with `access`. Changes nothing.
fn scan_dir<D: Disk>(
    disk: &D,
    dir: &Path,
    cluster_id: u64,
    node_id: u64,
    acked: Option<u64>,
    access: Access,
) -> Result<DirScan<D::File>> {
    let files = list_segments(disk, dir)?;
    let mut kept: Vec<Scanned<D::File>> = Vec::new();
    let mut tip = ChainTip::after(None);
    let mut lsn_end = 0u64;
    let mut stop: Option<(usize, u64, SegmentDefect)> = None;
    for (k, (name_index, path)) in files.iter().enumerate() {
        let file = disk.open(path, access)?;
        let buf = read_whole(&file)?;
        let defect_at = |offset: u64, reason: SegmentDefect| (k, offset, reason);
        let header = match SegmentHeader::decode(&buf) {
            Ok(header) => header,
            Err(fault) => {
                stop = Some(defect_at(0, SegmentDefect::Header(fault)));
                break;
            }
        };
        for (field, expected, found) in [
            ("cluster id", cluster_id, header.cluster_id),
            ("node id", node_id, header.node_id),
        ] {
            if expected != found {
                return Err(WalError::Foreign {
                    path: path.clone(),
                    field,
                    expected,
                    found,
                });
            }
        }
        if header.first_index != *name_index {
            stop = Some(defect_at(
                0,
                SegmentDefect::NameMismatch {
                    name: *name_index,
                    header: header.first_index,
                },
            ));
            break;
        }
        if !tip.unanchored
            && (header.first_index != tip.next_index || header.prev_term != tip.last_term)
        {
            stop = Some(defect_at(
                0,
                SegmentDefect::NotContinuing {
                    expected_index: tip.next_index,
                    expected_term: tip.last_term,
                    first_index: header.first_index,
                    prev_term: header.prev_term,
                },
            ));
            break;
        }
        let anchored = ChainTip {
            next_index: header.first_index,
            last_term: header.prev_term,
            epoch: tip.epoch,
            unanchored: false,
        };
        let scan = scan_records(&buf, SEGMENT_HEADER_BYTES as u64, anchored, lsn_end);
        let file_len = buf.len() as u64;
        let end_of_data = scan.stop.is_end_of_data();
        let garbage_after_end = buf[scan.end as usize..].iter().any(|b| *b != 0);
        tip = scan.tip;
        lsn_end = scan.lsn_end;
        kept.push(Scanned {
            segment: Segment {
                first_index: header.first_index,
                path: path.clone(),
                file: Arc::new(file),
                offsets: scan.offsets,
                terms: scan.terms,
                end: scan.end,
                file_len,
                written_at: std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .unwrap_or_else(|_| SystemTime::now()),
            },
            tip,
            lsn_end,
            garbage_after_end,
        });
        let is_last = k + 1 == files.len();
        if !end_of_data || (is_last && garbage_after_end) {
            // A break, or (as the ring's scan reports it) where the data
            // ends with something other than zeroes after it.
            stop = Some(defect_at(scan.end, scan.stop));
            break;
        }
    }
    // kept[i] is files[i]: the files after the last kept one are beyond
    // the log.
    let mut beyond_start = match &stop {
        Some((k, _, _)) if *k < kept.len() => k + 1,
        Some((k, _, _)) => *k,
        None => files.len(),
    };
    // An empty segment at the end (created, nothing written yet) is not
    // part of the log.
    if kept
        .last()
        .is_some_and(|last| last.segment.offsets.is_empty())
    {
        kept.pop();
        beyond_start = kept.len();
    }
    let beyond: Vec<(u64, PathBuf)> = files[beyond_start..].to_vec();

    let tip = kept.last().map_or(ChainTip::after(None), |s| s.tip);
    // The verdict.
    let mut damage = Damage::None;
    if let Some(acked) = acked
        && (tip.unanchored || tip.next_index <= acked)
    {
        damage = Damage::CorruptInside(Evidence::BelowWatermark {
            acked,
            recovered_next_index: if tip.unanchored { 0 } else { tip.next_index },
        });
    }
    let stop = stop.map(|(k, offset, reason)| SegmentStop {
        path: files[k].1.clone(),
        segment_first_index: files[k].0,
        offset,
        reason,
    });
    // Where the log's data ends: in the last kept segment, after its last
    // record (past the record that breaks there, if one does).
    let end_of_log = kept.last().map(|last| {
        let broken_here = stop
            .as_ref()
            .is_some_and(|stop| stop.path == last.segment.path && !stop.reason.is_end_of_data());
        let from = last.segment.end + if broken_here { LINE_BYTES as u64 } else { 0 };
        (last.segment.path.clone(), from)
    });
    let cut_last = kept.last().is_some_and(|last| {
        last.garbage_after_end
            || stop
                .as_ref()
                .is_some_and(|stop| stop.path == last.segment.path)
    });
    if damage == Damage::None
        && let Some(stop) = &stop
    {
        // Look for a well-formed record anywhere past the log's end: in the
        // rest of the last kept segment, then in every file beyond it.
        let mut evidence = None;
        if let Some((path, from)) = &end_of_log {
            let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
            evidence = well_formed_beyond(&buf, *from, tip);
        }
        for (_, path) in &beyond {
            if evidence.is_some() {
                break;
            }
            let buf = read_whole(&disk.open(path, Access::ReadOnly)?)?;
            evidence = well_formed_beyond(&buf, SEGMENT_HEADER_BYTES as u64, tip);
        }
        damage = match evidence {
            Some(beyond) => Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: beyond.lsn,
                index: beyond.index,
                epoch: beyond.epoch,
            }),
            None if stop.reason.is_end_of_data() => Damage::None,
            None => Damage::TornTail,
        };
    }
    Ok(DirScan {
        kept,
        beyond,
        stop,
        damage,
        cut_last,
    })
}

/// Checks the segments of `dir` without changing a byte (the offline
/// checker's view of [`SegmentLog::open`]).
///
/// # Errors
/// [`WalError::Foreign`] when a segment belongs to another cluster or node;
/// [`WalError::Inconsistent`] for a file too large to be a segment;
/// [`WalError::Io`].
pub fn check_segments<D: Disk>(
    disk: &D,
    dir: &Path,
    cluster_id: u64,
    node_id: u64,
    acked: Option<u64>,
) -> Result<SegmentRecovery> {
    let scan = scan_dir(disk, dir, cluster_id, node_id, acked, Access::ReadOnly)?;
    Ok(recovery_of(&scan.kept, scan.stop, scan.damage, acked, 0, 0))
}

fn recovery_of<F>(
    kept: &[Scanned<F>],
    stop: Option<SegmentStop>,
    damage: Damage,
    acked: Option<u64>,
    cut_bytes: u64,
    removed_files: u64,
) -> SegmentRecovery {
    let entries: u64 = kept.iter().map(|s| s.segment.offsets.len() as u64).sum();
    let last = kept.last().and_then(|s| {
        let index = s.tip.next_index.checked_sub(1)?;
        (!s.tip.unanchored).then_some(LogPos {
            index,
            term: s.tip.last_term,
        })
    });
    SegmentRecovery {
        segments: kept.len() as u64,
        first_index: kept.first().map_or(0, |s| s.segment.first_index),
        last: if entries == 0 { None } else { last },
        entries,
        disk_bytes: kept.iter().map(|s| s.segment.file_len).sum(),
        acked,
        stop,
        damage,
        cut_bytes,
        removed_files,
    }
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
        let mut cut_bytes = 0;
        let mut removed_files = 0;
        let mut discard = None;
        // Files beyond the log, newest first; when the break lies in the
        // last kept segment, cut it at its end.
        let remove: Vec<PathBuf> = scan.beyond.iter().rev().map(|(_, p)| p.clone()).collect();
        let cut_last = scan.cut_last;
        let mut log = SegmentLog {
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
        };
        if let Some(last) = kept.last() {
            log.tip = last.tip;
            log.lsn_end = last.lsn_end;
        }
        if corrupt {
            if !remove.is_empty() || cut_last {
                discard = Some(Discard { remove, cut_last });
            }
        } else {
            log.remove_files(&remove)?;
            removed_files = remove.len() as u64;
            if cut_last && let Some(last) = kept.last_mut() {
                cut_bytes = last.segment.file_len - last.segment.end;
                log.cut_segment(&mut last.segment)?;
            }
        }
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

    /// Appends records: each slice holds one or more whole entry records
    /// in the ring's format, chaining on the log's tail (the caller's own
    /// ring bytes). Writes with one positioned vectored write per segment
    /// touched, rolling to a new segment when the current one is full. Does
    /// not flush: see [`SegmentLog::sync`].
    ///
    /// # Errors
    /// [`WalError::DiskFull`] when a new segment cannot get its space, or
    /// (without preallocation) a write finds the disk full: nothing of the
    /// batch stays written, and a later append can succeed once space is
    /// freed. [`WalError::LogFailed`] after an earlier
    /// failure; [`WalError::Io`] (the log then refuses further writes).
    ///
    /// # Panics
    /// When a slice is not a sequence of whole entry records with good CRCs
    /// continuing the log (index, prev_term, lsn, epoch), or a payload is
    /// above `max_record_bytes`: the caller's own bug (or its memory was
    /// corrupted since it checked the records).
    pub fn append(&mut self, records: &[&[u8]]) -> Result<()> {
        self.check_usable()?;
        self.discard_damage()?;
        let plan = self.plan(records);
        if plan.is_empty() {
            return Ok(());
        }
        // Create the new segments first (their space preallocated), so
        // that a full disk is found before any byte of the batch is
        // written.
        let mut created: Vec<(usize, Arc<D::File>, PathBuf)> = Vec::new();
        for (k, part) in plan.iter().enumerate() {
            if let Some(header) = &part.new_header {
                let path = self.dir.join(segment_name(header.first_index));
                match self.create_segment(&path) {
                    Ok(file) => created.push((k, Arc::new(file), path)),
                    Err(err) => {
                        for (_, _, path) in created.iter().rev() {
                            let _ = self.disk.remove(path);
                        }
                        if !matches!(err, WalError::DiskFull { .. }) {
                            self.fail("create", &path, &err);
                        }
                        return Err(err);
                    }
                }
            }
        }
        let active = {
            let shared = read_lock(&self.shared);
            shared
                .segments
                .back()
                .map(|s| (Arc::clone(&s.file), s.end, s.path.clone()))
        };
        let mut written: Vec<(Arc<D::File>, u64)> = Vec::new();
        let mut zeroed_to = self.zeroed_to;
        for (k, part) in plan.iter().enumerate() {
            let (file, offset, path) = match created.iter().find(|(i, _, _)| *i == k) {
                Some((_, file, path)) => {
                    zeroed_to = 0;
                    (Arc::clone(file), 0, path.clone())
                }
                None => {
                    let (file, end, path) =
                        active.clone().expect("an append into the active segment");
                    (file, end, path)
                }
            };
            let header_bytes = part.new_header.map(|h| h.encode());
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(part.slices.len() + 2);
            if let Some(h) = &header_bytes {
                bufs.push(h);
            }
            bufs.extend(part.slices.iter().copied());
            let part_end = offset + bufs.iter().map(|b| b.len() as u64).sum::<u64>();
            if !self.zeroes.is_empty() && part_end > zeroed_to {
                let zero_to = part_end
                    .next_multiple_of(self.zeroes.len() as u64)
                    .min(self.config.segment_bytes)
                    .max(part_end);
                bufs.push(&self.zeroes[..(zero_to - part_end) as usize]);
                zeroed_to = zero_to;
            }
            if let Err(err) = file.write_at(&bufs, offset) {
                // A full disk (possible without preallocation): undo the
                // batch's bytes so that a later append starts clean.
                if matches!(err, WalError::DiskFull { .. })
                    && self.undo_batch(&created, active.as_ref()).is_ok()
                {
                    self.zeroed_to = active.as_ref().map_or(0, |a| a.1);
                    return Err(err);
                }
                self.fail("write", &path, &err);
                return Err(err);
            }
            written.push((file, offset));
        }
        // Publish.
        let last = plan.last().expect("a non-empty plan");
        {
            let mut shared = write_lock(&self.shared);
            for (k, part) in plan.iter().enumerate() {
                let added: u64 = part.slices.iter().map(|s| s.len() as u64).sum();
                match created.iter().find(|(i, _, _)| *i == k) {
                    Some((_, file, path)) => {
                        let header = part.new_header.expect("a new segment's header");
                        let end = SEGMENT_HEADER_BYTES as u64 + added;
                        let file_len = if self.config.preallocate {
                            self.config.segment_bytes.max(end)
                        } else {
                            end
                        };
                        shared.segments.push_back(Segment {
                            first_index: header.first_index,
                            path: path.clone(),
                            file: Arc::clone(file),
                            offsets: part.offsets.clone(),
                            terms: part.terms.clone(),
                            end,
                            file_len,
                            written_at: SystemTime::now(),
                        });
                    }
                    None => {
                        let segment = shared.segments.back_mut().expect("the active segment");
                        segment.offsets.extend_from_slice(&part.offsets);
                        for run in &part.terms {
                            if segment.terms.last().is_none_or(|r| r.term != run.term) {
                                segment.terms.push(*run);
                            }
                        }
                        segment.end += added;
                        segment.file_len = segment.file_len.max(segment.end);
                        segment.written_at = SystemTime::now();
                    }
                }
            }
        }
        self.tip = last.tip;
        self.lsn_end = last.lsn_end;
        self.zeroed_to = zeroed_to;
        if !created.is_empty() {
            self.dir_dirty = true;
        }
        for (file, _) in written {
            if !self.unsynced.iter().any(|f| Arc::ptr_eq(f, &file)) {
                self.unsynced.push(file);
            }
        }
        Ok(())
    }

    /// Removes the segments a failed append created and cuts the active
    /// one back to its end.
    fn undo_batch(
        &self,
        created: &[(usize, Arc<D::File>, PathBuf)],
        active: Option<&(Arc<D::File>, u64, PathBuf)>,
    ) -> Result<()> {
        for (_, _, path) in created.iter().rev() {
            self.disk.remove(path)?;
        }
        if !created.is_empty() {
            self.disk.sync_dir(&self.dir)?;
        }
        if let Some((file, end, _)) = active {
            file.set_len(*end)?;
            if self.config.preallocate {
                file.preallocate(self.config.segment_bytes)?;
            }
        }
        Ok(())
    }

    fn create_segment(&self, path: &Path) -> Result<D::File> {
        let file = self.disk.create_new(path)?;
        if self.config.preallocate
            && let Err(err) = file.preallocate(self.config.segment_bytes)
        {
            drop(file);
            let _ = self.disk.remove(path);
            return Err(err);
        }
        Ok(file)
    }

    /// Splits the records into per-segment parts, checking the chain.
    fn plan<'a>(&self, records: &[&'a [u8]]) -> Vec<Part<'a>> {
        let (mut end, mut has_records) = {
            let shared = read_lock(&self.shared);
            match shared.segments.back() {
                Some(s) => (Some(s.end), !s.offsets.is_empty()),
                None => (None, false),
            }
        };
        let mut tip = self.tip;
        let mut lsn_end = self.lsn_end;
        let mut parts: Vec<Part<'a>> = Vec::new();
        for slice in records {
            let mut at = 0usize;
            let mut run_start = 0usize;
            while at < slice.len() {
                let record = own_record(&slice[at..]);
                self.assert_continues(&record, tip, lsn_end);
                let len = record.len as u64;
                let roll = match end {
                    None => true,
                    Some(end) => has_records && end + len > self.config.segment_bytes,
                };
                if roll {
                    if at > run_start {
                        parts
                            .last_mut()
                            .expect("a part for the run")
                            .slices
                            .push(&slice[run_start..at]);
                    }
                    run_start = at;
                    parts.push(Part {
                        new_header: Some(SegmentHeader {
                            cluster_id: self.config.cluster_id,
                            node_id: self.config.node_id,
                            first_index: record.index,
                            prev_term: record.prev_term,
                        }),
                        ..Part::default()
                    });
                    end = Some(SEGMENT_HEADER_BYTES as u64);
                } else if parts.is_empty() {
                    parts.push(Part::default());
                }
                let part = parts.last_mut().expect("a part");
                let offset = end.expect("a segment to write into");
                part.offsets
                    .push(u32::try_from(offset).expect("segment offsets fit in u32"));
                if part.terms.last().is_none_or(|r| r.term != record.term) {
                    part.terms.push(TermRun {
                        first_index: record.index,
                        term: record.term,
                    });
                }
                end = Some(offset + len);
                has_records = true;
                tip = ChainTip {
                    next_index: record.index + 1,
                    last_term: record.term,
                    epoch: record.epoch,
                    unanchored: false,
                };
                lsn_end = record.lsn + len;
                part.tip = tip;
                part.lsn_end = lsn_end;
                at += record.len;
            }
            if at > run_start {
                parts
                    .last_mut()
                    .expect("a part for the run")
                    .slices
                    .push(&slice[run_start..at]);
            }
        }
        parts
    }

    fn assert_continues(&self, record: &OwnRecord, tip: ChainTip, lsn_end: u64) {
        assert!(
            record.payload_len <= self.config.max_record_bytes,
            "record {} with a payload of {} bytes is above max_record_bytes {}",
            record.index,
            record.payload_len,
            self.config.max_record_bytes
        );
        if !tip.unanchored {
            assert_eq!(
                (record.index, record.prev_term),
                (tip.next_index, tip.last_term),
                "record (index, prev_term) does not continue the segment log"
            );
        }
        assert!(
            record.lsn >= lsn_end,
            "record {} at lsn {} is below the log's lsn end {lsn_end}",
            record.index,
            record.lsn
        );
        assert!(
            record.epoch >= tip.epoch,
            "record {} of {} after a record of {}",
            record.index,
            record.epoch,
            tip.epoch
        );
        assert!(record.index < MAX_INDEX, "record index at MAX_INDEX");
    }

    /// Makes everything appended durable: `fdatasync` of every segment
    /// written since the last sync, and of the directory when a segment was
    /// created or removed. Returns the last entry now durable.
    ///
    /// # Errors
    /// [`WalError::Io`] or [`WalError::DiskFull`] from the flush; the log
    /// then refuses every further write ([`WalError::LogFailed`]).
    pub fn sync(&mut self) -> Result<Option<LogPos>> {
        self.check_usable()?;
        let target = self.last_log();
        while let Some(file) = self.unsynced.last() {
            if let Err(err) = file.sync_data() {
                let path = file.path().to_path_buf();
                self.fail("fdatasync", &path, &err);
                return Err(err);
            }
            self.unsynced.pop();
        }
        if self.dir_dirty {
            if let Err(err) = self.disk.sync_dir(&self.dir) {
                let dir = self.dir.clone();
                self.fail("sync directory", &dir, &err);
                return Err(err);
            }
            self.dir_dirty = false;
        }
        self.durable = target;
        Ok(target)
    }

    /// Removes every entry after `last_kept` (all of them for `None`):
    /// whole later segments are deleted (newest first), the boundary
    /// segment is cut. Durable when it returns. Removing everything leaves
    /// an empty log that takes any first record.
    ///
    /// # Errors
    /// [`WalError::Io`] (the log then refuses further writes),
    /// [`WalError::LogFailed`].
    pub fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<()> {
        self.check_usable()?;
        self.discard_damage()?;
        let next = last_kept.map_or(0, |i| i.saturating_add(1));
        if next >= self.next_index() {
            return Ok(());
        }
        // Publish first: readers of the removed entries get a range error.
        let (removed, boundary) = {
            let mut shared = write_lock(&self.shared);
            let mut removed = Vec::new();
            while let Some(last) = shared.segments.back() {
                if last.first_index >= next {
                    removed.push(shared.segments.pop_back().expect("a last segment"));
                } else {
                    break;
                }
            }
            let boundary = shared.segments.back_mut().map(|segment| {
                let keep = (next - segment.first_index) as usize;
                if keep < segment.offsets.len() {
                    segment.end = segment.offsets[keep] as u64;
                    segment.offsets.truncate(keep);
                    segment.truncate_terms();
                }
                (Arc::clone(&segment.file), segment.end, segment.path.clone())
            });
            if shared.segments.is_empty() {
                shared.empty_next = 0;
            }
            (removed, boundary)
        };
        let result = self.truncate_files(&removed, boundary.as_ref());
        if let Err(err) = &result {
            let path = boundary.as_ref().map_or(self.dir.clone(), |b| b.2.clone());
            self.fail("truncate", &path, err);
            return result;
        }
        self.unsynced
            .retain(|f| !removed.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        self.zeroed_to = self.last_end();
        // The new tail's chain state: its header, read back.
        match self.last_log() {
            Some(last) => {
                let header = self.header_of(last.index)?;
                self.tip = ChainTip {
                    next_index: last.index + 1,
                    last_term: last.term,
                    epoch: header.epoch,
                    unanchored: false,
                };
                self.lsn_end = header.lsn.checked_add(header.record_len()).ok_or_else(|| {
                    WalError::Corrupt {
                        index: last.index,
                        lsn: header.lsn,
                        detail: "its lsn and length overflow".to_string(),
                    }
                })?;
            }
            None => {
                self.tip = ChainTip::after(None);
                self.lsn_end = 0;
            }
        }
        if self.durable.is_some_and(|d| d.index >= next) {
            self.durable = self.last_log();
        }
        Ok(())
    }

    fn truncate_files(
        &mut self,
        removed: &[Segment<D::File>],
        boundary: Option<&(Arc<D::File>, u64, PathBuf)>,
    ) -> Result<()> {
        let paths: Vec<PathBuf> = removed.iter().map(|s| s.path.clone()).collect();
        self.remove_files(&paths)?;
        if let Some((file, end, _)) = boundary {
            file.set_len(*end)?;
            if self.config.preallocate {
                file.preallocate(self.config.segment_bytes)?;
            }
            file.sync_data()?;
            let len = file.size()?;
            let mut shared = write_lock(&self.shared);
            if let Some(last) = shared.segments.back_mut() {
                last.file_len = len;
            }
        }
        Ok(())
    }

    /// Removes files one by one, each removal durable before the next: a
    /// crash leaves a prefix of the removals done, whatever order the file
    /// system would write directory changes back in, so the directory stays
    /// a valid log (callers remove newest first when cutting the end,
    /// oldest first for retention).
    fn remove_files(&self, paths: &[PathBuf]) -> Result<()> {
        for path in paths {
            self.disk.remove(path)?;
            self.disk.sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Retention: deletes (oldest first) every whole segment whose entries
    /// are all below `first_kept`, except the last segment, which anchors
    /// the log's chain. Durable when it returns. Returns the new first
    /// index.
    ///
    /// # Errors
    /// [`WalError::Io`] (the log then refuses further writes),
    /// [`WalError::LogFailed`].
    pub fn remove_before(&mut self, first_kept: u64) -> Result<u64> {
        self.check_usable()?;
        let (removed, first) = {
            let mut shared = write_lock(&self.shared);
            let mut removed = Vec::new();
            while shared.segments.len() > 1 && shared.segments[0].next_index() <= first_kept {
                removed.push(shared.segments.pop_front().expect("a first segment"));
            }
            (removed, shared.first_index())
        };
        if removed.is_empty() {
            return Ok(first);
        }
        let paths: Vec<PathBuf> = removed.iter().map(|s| s.path.clone()).collect();
        if let Err(err) = self.remove_files(&paths) {
            let dir = self.dir.clone();
            self.fail("remove", &dir, &err);
            return Err(err);
        }
        self.unsynced
            .retain(|f| !removed.iter().any(|s| Arc::ptr_eq(f, &s.file)));
        Ok(first)
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
