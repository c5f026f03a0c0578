//! The log of segment files (issue 11, item 2): round trips across segment
//! rolls, recovery verdicts (clean end, torn tail, corruption inside), the
//! zeroes of preallocation, truncation, retention, readers racing the
//! writer, a full disk, and bad bytes that must never panic.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ringraft_wal::disk::{Access, Disk, DiskFile, RealDisk, RealFile};
use ringraft_wal::{
    ChainTip, Damage, EntryRef, Epoch, Evidence, LogPos, RecordEncoder, SegmentConfig,
    SegmentDefect, SegmentLog, SegmentRecovery, WalError, WriteBuffer,
};

const CLUSTER: u64 = 0xC0FFEE;
const NODE: u64 = 1;
/// A ring as large as the encoder allows: records never wrap in these
/// tests, so the bytes of a batch are one run.
const RING: u64 = 1 << 40;

fn config(segment_bytes: u64) -> SegmentConfig {
    SegmentConfig {
        segment_bytes,
        max_record_bytes: 64 << 10,
        ..SegmentConfig::new(CLUSTER, NODE)
    }
}

/// Plays the ring: encodes entries as the ring would and hands out their
/// bytes.
struct Source {
    encoder: RecordEncoder,
    epoch: Epoch,
    /// Everything encoded, as (index, term, payload).
    entries: Vec<(u64, u64, Vec<u8>)>,
}

impl Source {
    fn new() -> Source {
        Source::after(None, 0)
    }

    fn after(last: Option<LogPos>, lsn: u64) -> Source {
        let tip = ChainTip::after(last);
        Source {
            encoder: RecordEncoder::new(RING, lsn, tip, epoch(1)).unwrap(),
            epoch: epoch(1),
            entries: Vec::new(),
        }
    }

    /// Encodes one batch of entries of `term` with these payload lengths
    /// and returns its bytes (one run of whole records).
    fn batch(&mut self, term: u64, lens: &[usize]) -> Vec<u8> {
        if epoch(term) > self.epoch {
            self.epoch = epoch(term);
            self.encoder = RecordEncoder::new(
                RING,
                self.encoder.next_lsn(),
                self.encoder.tip(),
                epoch(term),
            )
            .unwrap();
        }
        let mut buf = WriteBuffer::new(RING, self.encoder.next_lsn()).unwrap();
        for len in lens {
            let tip = self.encoder.tip();
            let index = if tip.unanchored { 0 } else { tip.next_index };
            let payload = common::payload(index, *len);
            self.encoder
                .push(
                    &mut buf,
                    &EntryRef {
                        term,
                        index,
                        payload: &payload,
                    },
                )
                .unwrap();
            self.entries.push((index, term, payload));
        }
        assert_eq!(buf.segments().len(), 1, "no wrap in these tests");
        buf.segments()[0].bytes.clone()
    }

    /// Forgets the entries after `last_kept` and encodes from there on (a
    /// Raft conflict): the ring cut at the same place continues at the lsn
    /// after the kept record.
    fn truncate_after(&mut self, last_kept: u64, lsn: u64) {
        self.entries.retain(|e| e.0 <= last_kept);
        let (index, term, _) = self.entries.last().unwrap().clone();
        let tip = ChainTip {
            epoch: self.epoch,
            ..ChainTip::after(Some(LogPos { term, index }))
        };
        self.encoder = RecordEncoder::new(RING, lsn, tip, self.epoch).unwrap();
    }
}

fn epoch(term: u64) -> Epoch {
    Epoch::new(term, 1).unwrap()
}

fn open(
    dir: &Path,
    segment_bytes: u64,
    acked: Option<u64>,
) -> (SegmentLog<RealDisk>, SegmentRecovery) {
    SegmentLog::open(RealDisk, dir, config(segment_bytes), acked).unwrap()
}

/// Everything the log holds, read one by one and as one range.
fn contents<D: Disk>(log: &SegmentLog<D>) -> Vec<(u64, u64, Vec<u8>)> {
    let reader = log.reader();
    let (first, next) = reader.range();
    let one_by_one: Vec<_> = (first..next)
        .map(|i| {
            let r = reader.read(i).unwrap();
            assert_eq!(log.term_of(i), Some(r.term));
            (r.index, r.term, r.payload)
        })
        .collect();
    let ranged: Vec<_> = reader
        .read_range(first, next, u64::MAX)
        .unwrap()
        .into_iter()
        .map(|r| (r.index, r.term, r.payload))
        .collect();
    assert_eq!(one_by_one, ranged);
    one_by_one
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// Writes a log of `batches` batches of mixed sizes over small segments.
fn written(dir: &Path, segment_bytes: u64) -> (SegmentLog<RealDisk>, Source) {
    let (mut log, recovery) = open(dir, segment_bytes, None);
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(recovery.entries, 0);
    let mut source = Source::new();
    for (k, term) in [1u64, 1, 2, 2, 2, 3, 3, 3, 3, 4].into_iter().enumerate() {
        let lens: Vec<usize> = (0..(k % 4 + 1))
            .map(|i| (k * 97 + i * 331) % 1500)
            .collect();
        let bytes = source.batch(term, &lens);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    (log, source)
}

#[test]
fn a_log_round_trips_across_segment_rolls_and_reopens_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (log, source) = written(dir.path(), 4096);
    assert!(log.segment_count() > 3, "{} segments", log.segment_count());
    assert_eq!(contents(&log), source.entries);
    let last = source.entries.last().unwrap();
    assert_eq!(
        log.last_log(),
        Some(LogPos {
            index: last.0,
            term: last.1
        })
    );
    assert_eq!(log.durable(), log.last_log());
    for (index, _, _) in &source.entries {
        let lsn = log.lsn_of(*index).unwrap();
        assert_eq!(lsn % 64, 0);
    }
    // Preallocated: every file is at least a segment long, zeroes after
    // the records; reopening calls that a clean end.
    for file in segment_files(dir.path()) {
        assert!(std::fs::metadata(&file).unwrap().len() >= 4096);
    }
    let disk_bytes = log.disk_bytes();
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, Some(last.0));
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(recovery.stop, None);
    assert_eq!(recovery.entries, source.entries.len() as u64);
    assert_eq!(recovery.first_index, 0);
    assert_eq!(recovery.last, log.last_log());
    assert_eq!(recovery.disk_bytes, disk_bytes);
    assert_eq!(contents(&log), source.entries);
}

#[test]
fn records_larger_than_a_segment_get_a_segment_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), 4096, None);
    let mut source = Source::new();
    let a = source.batch(1, &[10, 9000, 20]);
    let b = source.batch(1, &[5000]);
    log.append(&[&a, &b]).unwrap();
    log.sync().unwrap();
    // 10 | 9000 | 20 | 5000: each large record rolls, and so does the
    // record after it.
    assert_eq!(log.segment_count(), 4);
    assert_eq!(contents(&log), source.entries);
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, None);
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(contents(&log), source.entries);
}

#[test]
fn a_log_without_preallocation_reopens_clean_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig {
        preallocate: false,
        ..config(4096)
    };
    let (mut log, _) = SegmentLog::open(RealDisk, dir.path(), cfg, None).unwrap();
    let mut source = Source::new();
    for _ in 0..20 {
        let bytes = source.batch(1, &[300, 7]);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = SegmentLog::open(RealDisk, dir.path(), cfg, None).unwrap();
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(contents(&log), source.entries);
}

/// Copies the segment directory `from` into a fresh one.
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for file in segment_files(from) {
        std::fs::copy(&file, to.path().join(file.file_name().unwrap())).unwrap();
    }
    to
}

/// Where the last record of the last segment starts and ends.
fn last_record_span<D: Disk>(log: &SegmentLog<D>) -> (u64, u64) {
    let last = log.last_log().unwrap().index;
    let r = log.reader().read(last).unwrap();
    let len = 64 + r.payload.len().next_multiple_of(64) as u64;
    // The file offset: the end of the previous record in the same segment
    // is not exposed, so find it from the file.
    let files = segment_files(log.dir());
    let bytes = std::fs::read(files.last().unwrap()).unwrap();
    let lsn = log.lsn_of(last).unwrap().to_le_bytes();
    let start = (64..bytes.len())
        .step_by(64)
        .find(|o| bytes[o + 16..o + 24] == lsn && bytes[*o..o + 4] == *b"RRec")
        .unwrap() as u64;
    (start, start + len)
}

#[test]
fn a_torn_last_record_is_a_torn_tail_cut_off_at_every_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut source) = written(dir.path(), 4096);
    // A last record of its own, long enough to tear anywhere.
    let bytes = source.batch(4, &[200]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    let (start, end) = last_record_span(&log);
    let last_file = segment_files(dir.path()).pop().unwrap();
    let name = last_file.file_name().unwrap().to_owned();
    let kept = source.entries[..source.entries.len() - 1].to_vec();
    drop(log);
    for cut in start..end {
        for zero_fill in [false, true] {
            let copy = copy_dir(dir.path());
            let path = copy.path().join(&name);
            if zero_fill {
                // Torn in a preallocated file: the bytes after the cut are
                // zeroes.
                let mut data = std::fs::read(&path).unwrap();
                data[cut as usize..end as usize].fill(0);
                std::fs::write(&path, data).unwrap();
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(cut)
                    .unwrap();
            }
            let (log, recovery) = open(copy.path(), 4096, Some(kept.last().unwrap().0));
            // Cut before the magic is whole: no record starts there, a clean
            // end; from then on, a torn tail. Zeroes in the padding only
            // (not covered by the CRC) leave the record whole; a file that
            // ends inside the padding holds a torn write.
            let magic_whole = if zero_fill {
                cut >= start + 4
            } else {
                cut > start
            };
            let intact = zero_fill && cut >= start + 64 + 200;
            let expected = if magic_whole && !intact {
                Damage::TornTail
            } else {
                Damage::None
            };
            assert_eq!(
                recovery.damage, expected,
                "cut at {cut} (zero fill {zero_fill}): {recovery:?}"
            );
            let kept = if intact { &source.entries } else { &kept };
            if expected == Damage::TornTail {
                let stop = recovery.stop.as_ref().unwrap();
                assert_eq!(stop.offset, start);
                assert!(!stop.reason.is_end_of_data());
            }
            assert_eq!(&contents(&log), kept, "cut at {cut}");
            drop(log);
            // The tail was cut off: a clean end now.
            let (log, recovery) = open(copy.path(), 4096, None);
            assert_eq!(recovery.damage, Damage::None, "reopen after cut at {cut}");
            assert_eq!(recovery.stop, None, "reopen after cut at {cut}");
            assert_eq!(&contents(&log), kept);
        }
    }
}

#[test]
fn a_flipped_byte_in_a_middle_record_is_corruption_inside_named_by_index() {
    let dir = tempfile::tempdir().unwrap();
    let (log, source) = written(dir.path(), 1 << 20);
    assert_eq!(log.segment_count(), 1);
    let victim = source.entries[5].0;
    let lsn = log.lsn_of(victim).unwrap();
    drop(log);
    let file = segment_files(dir.path()).pop().unwrap();
    let mut data = std::fs::read(&file).unwrap();
    let at = (64..data.len())
        .step_by(64)
        .find(|o| data[o + 16..o + 24] == lsn.to_le_bytes())
        .unwrap();
    data[at + 70] ^= 0x40;
    std::fs::write(&file, &data).unwrap();
    let (mut log, recovery) = open(dir.path(), 1 << 20, None);
    assert_eq!(
        recovery.damage,
        Damage::CorruptInside(Evidence::WellFormedBeyond {
            lsn: log_lsn_after(&source, victim, lsn),
            index: victim + 1,
            epoch: recovery_epoch(&source, victim + 1),
        }),
        "{recovery:?}"
    );
    assert!(recovery.corrupt_inside());
    assert_eq!(recovery.last.unwrap().index, victim - 1);
    let stop = recovery.stop.clone().unwrap();
    assert_eq!(stop.offset, at as u64);
    assert!(matches!(
        stop.reason,
        SegmentDefect::Record(ringraft_wal::Invalid::CrcMismatch { .. })
    ));
    // Reported, not cut: the file is as it was until the log is written.
    assert_eq!(std::fs::read(&file).unwrap(), data);
    let again = ringraft_wal::check_segments(&RealDisk, dir.path(), CLUSTER, NODE, None).unwrap();
    assert_eq!(again.damage, recovery.damage);
    // The leader re-replicates from the break: the damaged rest goes.
    let mut replay = Source::after(recovery.last, log.lsn_of(victim - 1).unwrap() + 64 * 64);
    let bytes = replay.batch(4, &[10, 20]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = open(dir.path(), 1 << 20, None);
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(log.last_log().unwrap().index, victim + 1);
}

fn log_lsn_after(source: &Source, index: u64, lsn: u64) -> u64 {
    let (_, _, payload) = &source.entries[index as usize];
    lsn + 64 + payload.len().next_multiple_of(64) as u64
}

fn recovery_epoch(source: &Source, index: u64) -> Epoch {
    epoch(source.entries[index as usize].1)
}

/// Issue 11, item 2: a hole in a segment (a lost write) whose later
/// segments were all lost too: the records after the hole in that same
/// segment are well-formed records beyond the break, so the log is corrupt
/// inside, as the ring would say, not a clean end (the first version looked
/// for them only in the files after the break and called it clean).
#[test]
fn records_after_a_hole_in_a_segment_whose_successors_were_lost_are_corruption_inside() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut source) = written(dir.path(), 8192);
    for _ in 0..4 {
        let bytes = source.batch(5, &[300, 300, 300]);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    // The second-to-last segment: a hole where its second record was.
    let victim = &files[files.len() - 2];
    let first =
        ringraft_wal::segment::parse_segment_name(victim.file_name().unwrap().to_str().unwrap())
            .unwrap();
    let hole = log.lsn_of(first + 1).unwrap();
    let after = log.lsn_of(first + 2).unwrap();
    drop(log);
    let mut data = std::fs::read(victim).unwrap();
    let at = (64..data.len())
        .step_by(64)
        .find(|o| data[o + 16..o + 24] == hole.to_le_bytes())
        .unwrap();
    let len = (after - hole) as usize;
    data[at..at + len].fill(0);
    std::fs::write(victim, &data).unwrap();
    // The last segment: lost entirely (zeroes).
    let last = files.last().unwrap();
    let zeroes = vec![0u8; std::fs::metadata(last).unwrap().len() as usize];
    std::fs::write(last, zeroes).unwrap();
    let (mut log, recovery) = open(dir.path(), 8192, None);
    assert_eq!(
        recovery.damage,
        Damage::CorruptInside(Evidence::WellFormedBeyond {
            lsn: after,
            index: first + 2,
            epoch: recovery_epoch(&source, first + 2),
        }),
        "{recovery:?}"
    );
    assert_eq!(recovery.last.unwrap().index, first);
    // Going on from the break discards the rest: the next open is clean.
    let mut replay = Source::after(recovery.last, hole + (1 << 20));
    let bytes = replay.batch(9, &[10]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = open(dir.path(), 8192, None);
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(recovery.stop, None, "{recovery:?}");
    assert_eq!(log.last_log().unwrap().index, first + 1);
}

#[test]
fn a_break_below_the_acknowledged_index_is_corruption_inside() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut source) = written(dir.path(), 4096);
    let bytes = source.batch(4, &[100]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    let (start, _) = last_record_span(&log);
    let last = log.last_log().unwrap().index;
    drop(log);
    let file = segment_files(dir.path()).pop().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(start + 100).unwrap();
    let (_, recovery) = open(dir.path(), 4096, Some(last));
    assert_eq!(
        recovery.damage,
        Damage::CorruptInside(Evidence::BelowWatermark {
            acked: last,
            recovered_next_index: last
        })
    );
}

#[test]
fn truncate_after_across_a_segment_boundary_then_append_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut source) = written(dir.path(), 4096);
    let segments = log.segment_count();
    // Keep an entry that is the last of its segment's... anywhere in the
    // second segment: the later segments go, the second is cut.
    let reader = log.reader();
    let keep = source.entries.len() as u64 / 3;
    let lsn_after = {
        let r = reader.read(keep).unwrap();
        r.lsn + 64 + r.payload.len().next_multiple_of(64) as u64
    };
    log.truncate_after(Some(keep)).unwrap();
    assert!(log.segment_count() < segments);
    assert_eq!(log.last_log().unwrap().index, keep);
    assert!(
        matches!(reader.read(keep + 1), Err(WalError::NotInLog { index, first: 0, next }) if index == keep + 1 && next == keep + 1)
    );
    source.truncate_after(keep, lsn_after);
    for _ in 0..6 {
        let bytes = source.batch(7, &[700, 30]);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    assert_eq!(contents(&log), source.entries);
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, None);
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(contents(&log), source.entries);
    // Everything: an empty log that takes any first record.
    let mut log = log;
    log.truncate_after(None).unwrap();
    assert_eq!(log.segment_count(), 0);
    assert_eq!(log.last_log(), None);
    let mut fresh = Source::after(Some(LogPos { index: 99, term: 9 }), 1 << 20);
    let bytes = fresh.batch(9, &[5]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, None);
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(recovery.first_index, 100);
    assert_eq!(contents(&log), fresh.entries);
}

#[test]
fn remove_before_keeps_reads_above_and_names_the_range_below() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, source) = written(dir.path(), 4096);
    let next = log.reader().range().1;
    let first = log.remove_before(next / 2).unwrap();
    assert!(first > 0 && first <= next / 2, "first {first}");
    assert_eq!(log.first_index(), first);
    assert_eq!(contents(&log), source.entries[first as usize..].to_vec());
    match log.reader().read(first - 1) {
        Err(WalError::Trimmed {
            index,
            first: f,
            next: n,
        }) => {
            assert_eq!((index, f, n), (first - 1, first, next));
        }
        other => panic!("expected Trimmed, got {other:?}"),
    }
    let err = log.reader().read_range(0, next, u64::MAX).unwrap_err();
    assert!(
        err.to_string().contains(&format!("{first}..{next}")),
        "{err}"
    );
    // The last segment is never removed: it anchors the chain.
    let last_first = log.remove_before(u64::MAX).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.last_log().unwrap().index, next - 1);
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, None);
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(recovery.first_index, last_first);
    assert_eq!(
        contents(&log),
        source.entries[last_first as usize..].to_vec()
    );
}

/// A real disk whose reads run a hook first: the interleaving "the reader
/// took its positions, then the writer moved, then the reader reads" on
/// purpose. Preallocation can be made to fail with ENOSPC.
type Hook = Box<dyn FnOnce() + Send>;

#[derive(Clone, Default)]
struct HookDisk {
    before_read: Arc<Mutex<Option<Hook>>>,
    /// Preallocation fails with ENOSPC.
    disk_full: Arc<Mutex<bool>>,
    /// Writes write their first part only, then fail with ENOSPC.
    writes_fail_half_way: Arc<Mutex<bool>>,
    /// Every write: (file name, offset, bytes).
    writes: Arc<Mutex<Vec<(String, u64, u64)>>>,
    /// Every flush: a file name, or "dir" for the directory.
    syncs: Arc<Mutex<Vec<String>>>,
    /// File flushes fail with EIO.
    syncs_fail: Arc<Mutex<bool>>,
}

struct HookFile {
    inner: RealFile,
    disk: HookDisk,
}

impl Disk for HookDisk {
    type File = HookFile;
    fn create_dir_all(&self, dir: &Path) -> ringraft_wal::Result<()> {
        RealDisk.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> ringraft_wal::Result<Vec<String>> {
        RealDisk.list(dir)
    }
    fn create_new(&self, path: &Path) -> ringraft_wal::Result<HookFile> {
        Ok(HookFile {
            inner: RealDisk.create_new(path)?,
            disk: self.clone(),
        })
    }
    fn open(&self, path: &Path, access: Access) -> ringraft_wal::Result<HookFile> {
        Ok(HookFile {
            inner: RealDisk.open(path, access)?,
            disk: self.clone(),
        })
    }
    fn remove(&self, path: &Path) -> ringraft_wal::Result<()> {
        RealDisk.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> ringraft_wal::Result<()> {
        self.syncs.lock().unwrap().push("dir".to_string());
        RealDisk.sync_dir(dir)
    }
}

impl DiskFile for HookFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn size(&self) -> ringraft_wal::Result<u64> {
        self.inner.size()
    }
    fn write_at(&self, bufs: &[&[u8]], offset: u64) -> ringraft_wal::Result<()> {
        self.disk.writes.lock().unwrap().push((
            self.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            offset,
            bufs.iter().map(|b| b.len() as u64).sum(),
        ));
        if *self.disk.writes_fail_half_way.lock().unwrap() {
            self.inner.write_at(&bufs[..1], offset)?;
            return Err(WalError::from_io(
                "write",
                self.path(),
                bufs.iter().map(|b| b.len() as u64).sum(),
                std::io::Error::from_raw_os_error(libc_enospc()),
            ));
        }
        self.inner.write_at(bufs, offset)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> ringraft_wal::Result<usize> {
        let hook = self.disk.before_read.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.read_at(buf, offset)
    }
    fn sync_data(&self) -> ringraft_wal::Result<()> {
        self.disk.syncs.lock().unwrap().push(
            self.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
        if *self.disk.syncs_fail.lock().unwrap() {
            return Err(WalError::from_io(
                "fdatasync",
                self.path(),
                0,
                std::io::Error::from_raw_os_error(5), // EIO
            ));
        }
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> ringraft_wal::Result<()> {
        self.inner.set_len(len)
    }
    fn preallocate(&self, len: u64) -> ringraft_wal::Result<()> {
        if *self.disk.disk_full.lock().unwrap() {
            return Err(WalError::from_io(
                "preallocate",
                self.path(),
                len,
                std::io::Error::from_raw_os_error(libc_enospc()),
            ));
        }
        self.inner.preallocate(len)
    }
}

fn libc_enospc() -> i32 {
    28 // ENOSPC on Linux
}

fn hooked_log(dir: &Path) -> (Arc<Mutex<SegmentLog<HookDisk>>>, HookDisk, Source) {
    let disk = HookDisk::default();
    let (mut log, _) = SegmentLog::open(disk.clone(), dir, config(4096), None).unwrap();
    let mut source = Source::new();
    for _ in 0..12 {
        let bytes = source.batch(1, &[900, 900]);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    (Arc::new(Mutex::new(log)), disk, source)
}

#[test]
fn a_read_in_flight_survives_retention_deleting_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (log, disk, source) = hooked_log(dir.path());
    let reader = log.lock().unwrap().reader();
    let next = reader.range().1;
    // The reader has taken its positions in the first segment; before it
    // reads, retention deletes that segment (and the writer appends).
    let writer = Arc::clone(&log);
    let appended = Arc::new(Mutex::new(None));
    let appended_in_hook = Arc::clone(&appended);
    *disk.before_read.lock().unwrap() = Some(Box::new(move || {
        let mut log = writer.lock().unwrap();
        let first = log.remove_before(next).unwrap();
        let mut more = Source::after(log.last_log(), 1 << 30);
        let bytes = more.batch(1, &[10]);
        log.append(&[&bytes]).unwrap();
        *appended_in_hook.lock().unwrap() = Some(first);
    }));
    let first_file = segment_files(dir.path()).remove(0);
    let records = reader.read_range(0, 3, u64::MAX).unwrap();
    let first = appended.lock().unwrap().expect("the hook ran");
    assert!(
        first > 2,
        "retention removed the segment being read (first now {first})"
    );
    assert!(!first_file.exists());
    let got: Vec<_> = records
        .into_iter()
        .map(|r| (r.index, r.term, r.payload))
        .collect();
    assert_eq!(got, source.entries[..3].to_vec());
    // Afterwards, the same read names the retained range.
    assert!(matches!(
        reader.read(0),
        Err(WalError::Trimmed { index: 0, .. })
    ));
}

#[test]
fn a_read_in_flight_of_entries_truncated_meanwhile_is_a_range_error() {
    let dir = tempfile::tempdir().unwrap();
    let (log, disk, _) = hooked_log(dir.path());
    let reader = log.lock().unwrap().reader();
    let last = reader.range().1 - 1;
    let writer = Arc::clone(&log);
    *disk.before_read.lock().unwrap() = Some(Box::new(move || {
        writer
            .lock()
            .unwrap()
            .truncate_after(Some(last - 1))
            .unwrap();
    }));
    match reader.read(last) {
        Err(WalError::NotInLog { index, next, .. }) => assert_eq!((index, next), (last, last)),
        other => panic!("expected NotInLog, got {other:?}"),
    }
}

#[test]
fn a_full_disk_refuses_appends_without_writing_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (log, disk, source) = hooked_log(dir.path());
    let mut log = Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap();
    let before = segment_files(dir.path());
    let last = log.last_log();
    *disk.disk_full.lock().unwrap() = true;
    let mut more = Source::after(last, 1 << 30);
    // Enough to need a new segment.
    let bytes = more.batch(1, &[3000, 3000]);
    match log.append(&[&bytes]) {
        Err(WalError::DiskFull { needed, .. }) => assert_eq!(needed, 4096),
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert!(log.append(&[&bytes]).unwrap_err().is_retryable());
    assert_eq!(log.last_log(), last);
    assert_eq!(segment_files(dir.path()), before, "no segment left behind");
    assert_eq!(contents(&log), source.entries);
    // Space freed: the same append goes through.
    *disk.disk_full.lock().unwrap() = false;
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = open(dir.path(), 4096, None);
    assert_eq!(recovery.damage, Damage::None);
    let mut all = source.entries.clone();
    all.extend(more.entries.clone());
    assert_eq!(contents(&log), all);
}

/// Issue 11, item 5 (the wal's part): without preallocation a write can
/// find the disk full half way; the batch is undone, the log stays usable,
/// and the same append succeeds once space is freed.
#[test]
fn a_write_that_finds_the_disk_full_is_undone_and_appends_resume() {
    let dir = tempfile::tempdir().unwrap();
    let disk = HookDisk::default();
    let cfg = SegmentConfig {
        preallocate: false,
        ..config(4096)
    };
    let (mut log, _) = SegmentLog::open(disk.clone(), dir.path(), cfg, None).unwrap();
    let mut source = Source::new();
    let first = source.batch(1, &[100, 100]);
    log.append(&[&first]).unwrap();
    log.sync().unwrap();
    let kept = source.entries.clone();
    let last = log.last_log();
    // Two slices into the active segment, then a third rolling to a new
    // one: the first write lands half, then ENOSPC.
    let a = source.batch(1, &[200]);
    let b = source.batch(1, &[3000]);
    let c = source.batch(1, &[300]);
    *disk.writes_fail_half_way.lock().unwrap() = true;
    let err = log.append(&[&a, &b, &c]).unwrap_err();
    assert!(matches!(err, WalError::DiskFull { .. }), "{err}");
    assert_eq!(log.last_log(), last);
    assert_eq!(contents(&log), kept);
    assert_eq!(
        segment_files(dir.path()).len(),
        1,
        "the new segment was removed"
    );
    // Nothing of the batch is left on disk: a reopen sees the clean log.
    let (other, recovery) = SegmentLog::open(RealDisk, dir.path(), cfg, None).unwrap();
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(recovery.stop, None);
    drop(other);
    *disk.writes_fail_half_way.lock().unwrap() = false;
    log.append(&[&a, &b, &c]).unwrap();
    log.sync().unwrap();
    assert_eq!(contents(&log), source.entries);
    drop(log);
    let (log, recovery) = SegmentLog::open(RealDisk, dir.path(), cfg, None).unwrap();
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(contents(&log), source.entries);
}

/// A write that passes the zeroed part of a preallocated segment carries
/// zeroes up to the next `zero_ahead_bytes` boundary, in the same write;
/// writes within it carry none. Recovery calls the zeroes a clean end.
#[test]
fn writes_carry_zeroes_ahead_to_the_next_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let disk = HookDisk::default();
    let cfg = SegmentConfig {
        segment_bytes: 64 << 10,
        zero_ahead_bytes: 16 << 10,
        ..config(4096)
    };
    let (mut log, _) = SegmentLog::open(disk.clone(), dir.path(), cfg, None).unwrap();
    let mut source = Source::new();
    let mut append = |lens: &[usize]| {
        let bytes = source.batch(1, lens);
        log.append(&[&bytes]).unwrap();
    };
    append(&[100]); // header 64 + record 192, zeroes to 16 KiB
    append(&[100]); // within the zeroed part
    append(&[16 << 10]); // from 448 to 448 + 16448 = 16896: zeroes to 32 KiB
    append(&[48 << 10]); // 16896 + 49216 > 64 KiB: a new segment, zeroes
    // to its end
    let name0 = ringraft_wal::segment::segment_name(0);
    let name3 = ringraft_wal::segment::segment_name(3);
    let writes = disk.writes.lock().unwrap().clone();
    assert_eq!(
        writes,
        vec![
            (name0.clone(), 0, 16 << 10),
            (name0.clone(), 256, 192),
            (name0, 448, (32 << 10) - 448),
            (name3, 0, 64 << 10),
        ]
    );
    log.sync().unwrap();
    drop(log);
    let (log, recovery) = SegmentLog::open(RealDisk, dir.path(), cfg, None).unwrap();
    assert_eq!(recovery.damage, Damage::None);
    assert_eq!(recovery.stop, None);
    assert_eq!(contents(&log), source.entries);
}

/// One positioned write per segment an append touches; `sync` flushes each
/// segment written since the last sync once, and the directory only after
/// a segment was created.
#[test]
fn an_append_writes_once_per_segment_and_sync_flushes_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = HookDisk::default();
    let (mut log, _) = SegmentLog::open(disk.clone(), dir.path(), config(4096), None).unwrap();
    let mut source = Source::new();
    let a = source.batch(1, &[1000, 1000]);
    log.append(&[&a]).unwrap();
    disk.writes.lock().unwrap().clear();
    disk.syncs.lock().unwrap().clear();
    // Two slices: the first fits the segment (64 + 2 × 1088 + 1088 = 3328),
    // the second's two records roll to a new segment and then a third.
    let b = source.batch(1, &[1000]);
    let c = source.batch(1, &[2500, 2500]);
    log.append(&[&b, &c]).unwrap();
    let name = |i: u64| ringraft_wal::segment::segment_name(i);
    let writes: Vec<(String, u64)> = disk
        .writes
        .lock()
        .unwrap()
        .iter()
        .map(|(n, o, _)| (n.clone(), *o))
        .collect();
    assert_eq!(
        writes,
        vec![(name(0), 2240), (name(3), 0), (name(4), 0)],
        "one write per segment touched"
    );
    assert!(
        disk.syncs.lock().unwrap().is_empty(),
        "append never flushes"
    );
    log.sync().unwrap();
    let mut syncs = disk.syncs.lock().unwrap().clone();
    syncs.sort();
    assert_eq!(syncs, vec![name(0), name(3), name(4), "dir".to_string()]);
    // Nothing new: nothing to flush.
    disk.syncs.lock().unwrap().clear();
    log.sync().unwrap();
    assert!(disk.syncs.lock().unwrap().is_empty());
    // An append into the last segment: that segment only, no directory.
    let d = source.batch(1, &[10]);
    log.append(&[&d]).unwrap();
    log.sync().unwrap();
    assert_eq!(*disk.syncs.lock().unwrap(), vec![name(4)]);
    assert_eq!(contents(&log), source.entries);
}

/// After a failed flush the kernel may have dropped the pages it could not
/// write: the log refuses every later write and flush, naming the first
/// failure, even once the disk works again; reads go on.
#[test]
fn a_failed_flush_stops_all_writes_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let disk = HookDisk::default();
    let (mut log, _) = SegmentLog::open(disk.clone(), dir.path(), config(4096), None).unwrap();
    let mut source = Source::new();
    let a = source.batch(1, &[100]);
    log.append(&[&a]).unwrap();
    log.sync().unwrap();
    let durable = log.durable();
    let b = source.batch(1, &[100]);
    log.append(&[&b]).unwrap();
    *disk.syncs_fail.lock().unwrap() = true;
    let err = log.sync().unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Io {
                op: "fdatasync",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(log.durable(), durable, "nothing more is called durable");
    *disk.syncs_fail.lock().unwrap() = false;
    let c = source.batch(1, &[100]);
    for result in [
        log.append(&[&c]),
        log.sync().map(|_| ()),
        log.truncate_after(Some(0)),
        log.remove_before(1).map(|_| ()),
    ] {
        match result {
            Err(WalError::LogFailed { op, first, .. }) => {
                assert_eq!(op, "fdatasync");
                assert!(first.contains("fdatasync"), "{first}");
            }
            other => panic!("expected LogFailed, got {other:?}"),
        }
    }
    assert_eq!(log.reader().read(1).unwrap().payload, source.entries[1].2);
}

#[test]
fn segments_of_another_node_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(written(dir.path(), 4096));
    let other = SegmentConfig {
        node_id: 2,
        ..config(4096)
    };
    let err = SegmentLog::open(RealDisk, dir.path(), other, None).unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Foreign {
                field: "node id",
                ..
            }
        ),
        "{err}"
    );
}

/// Deterministic bytes (xorshift), so that a failure replays.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[test]
fn bad_bytes_in_segment_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    drop(written(dir.path(), 4096));
    let files = segment_files(dir.path());
    for seed in 0..200u64 {
        let copy = copy_dir(dir.path());
        let victim = copy
            .path()
            .join(files[seed as usize % files.len()].file_name().unwrap());
        let mut data = std::fs::read(&victim).unwrap();
        let junk = noise(seed, 64 + (seed as usize * 13) % 300);
        let at = (seed as usize * 997) % (data.len() - junk.len());
        // Sometimes keep the magic of a header so the fields are read.
        data[at..at + junk.len()].copy_from_slice(&junk);
        if seed % 3 == 0 {
            let line = at / 64 * 64;
            data[line..line + 4].copy_from_slice(b"RRec");
        }
        std::fs::write(&victim, &data).unwrap();
        match SegmentLog::open(RealDisk, copy.path(), config(4096), Some(3)) {
            Ok((log, recovery)) => {
                // Whatever it kept reads back.
                let (first, next) = log.reader().range();
                for i in first..next {
                    log.reader().read(i).unwrap();
                }
                assert_eq!(recovery.entries, next - first);
            }
            Err(err) => assert!(
                matches!(err, WalError::Foreign { .. }),
                "seed {seed}: {err}"
            ),
        }
    }
}

/// A data directory with a ring and a metadata file (entries 0..n of term 1
/// in the ring, acknowledged up to `acked`) and the same entries in `log/`.
fn data_dir_with_segments(n: usize, acked: Option<u64>) -> (tempfile::TempDir, Source) {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = common::open(dir.path());
    let e = epoch(1);
    common::take_fence(wal.ring(), e);
    let mut source = Source::new();
    let (mut log, _) = open(&dir.path().join("log"), 4096, None);
    for _ in 0..n {
        let bytes = source.batch(1, &[700]);
        log.append(&[&bytes]).unwrap();
    }
    log.sync().unwrap();
    let ring = wal.ring_mut();
    for (index, term, payload) in &source.entries {
        ring.append(
            e,
            &[EntryRef {
                term: *term,
                index: *index,
                payload,
            }],
        )
        .unwrap();
    }
    match acked {
        Some(index) => ring.sync_and_ack(index).unwrap(),
        None => ring.sync().unwrap(),
    }
    (dir, source)
}

/// Copies a data directory (its files and its `log/` folder).
fn copy_data_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::create_dir(to.path().join("log")).unwrap();
    for file in segment_files(&from.join("log")) {
        std::fs::copy(&file, to.path().join("log").join(file.file_name().unwrap())).unwrap();
    }
    to
}

fn in_copy(copy: &tempfile::TempDir, like: &Path) -> PathBuf {
    copy.path().join("log").join(like.file_name().unwrap())
}

#[test]
fn wal_check_gives_the_segments_verdicts() {
    // Clean.
    let (dir, source) = data_dir_with_segments(12, Some(11));
    let report = ringraft_wal::check(dir.path()).unwrap();
    let segments = report.segments.clone().expect("a log/ folder");
    assert_eq!(segments.damage, Damage::None);
    assert_eq!(segments.entries, source.entries.len() as u64);
    assert_eq!(segments.first_index, 0);
    assert_eq!(segments.last, Some(LogPos { index: 11, term: 1 }));
    assert!(segments.disk_bytes >= 4096 * segments.segments);
    assert!(!report.corrupt_in_acknowledged_range());
    let text = report.to_string();
    assert!(
        text.contains("index 0..=11 (12 entries, last term 1)"),
        "{text}"
    );
    assert!(text.contains("verdict     clean"), "{text}");

    let files = segment_files(&dir.path().join("log"));
    let last = files.last().unwrap();
    let data = std::fs::read(last).unwrap();
    let start = (64..data.len())
        .step_by(64)
        .rfind(|o| data[*o..o + 4] == *b"RRec")
        .unwrap();
    let mut torn = data.clone();
    torn[start + 100] ^= 1;

    // The last record torn in the segments, acknowledged, but the ring
    // still holds it: the segments alone show a torn tail (they may end
    // below the watermark while the ring goes on, in `memory` durability);
    // the log, ring and segments together, lost nothing. (A break both
    // share is tests/faults.rs's `a_node_corrupt_inside_...`.)
    let copy = copy_data_dir(dir.path());
    std::fs::write(in_copy(&copy, last), &torn).unwrap();
    let report = ringraft_wal::check(copy.path()).unwrap();
    assert_eq!(report.segments.as_ref().unwrap().damage, Damage::TornTail);
    assert_eq!(report.damage, Damage::None, "the ring holds the record");
    assert!(!report.corrupt_in_acknowledged_range());
    // Offline: nothing was changed.
    assert_eq!(std::fs::read(in_copy(&copy, last)).unwrap(), torn);

    // The same torn record, not acknowledged: a torn tail.
    let (dir, _) = data_dir_with_segments(12, Some(10));
    let copy = copy_data_dir(dir.path());
    std::fs::write(in_copy(&copy, last), &torn).unwrap();
    let report = ringraft_wal::check(copy.path()).unwrap();
    let segments = report.segments.clone().unwrap();
    assert_eq!(segments.damage, Damage::TornTail);
    assert_eq!(segments.stop.unwrap().offset, start as u64);
    assert!(!report.corrupt_in_acknowledged_range());
    assert!(report.to_string().contains("torn tail"), "{report}");

    // A record in the middle flipped (above the watermark): corruption
    // inside, with the well-formed record found beyond.
    let (dir, _) = data_dir_with_segments(12, Some(0));
    let copy = copy_data_dir(dir.path());
    let second = &files[1];
    let mut data = std::fs::read(second).unwrap();
    data[64 + 100] ^= 1;
    std::fs::write(in_copy(&copy, second), &data).unwrap();
    let report = ringraft_wal::check(copy.path()).unwrap();
    let segments = report.segments.clone().unwrap();
    assert!(
        matches!(
            segments.damage,
            Damage::CorruptInside(Evidence::WellFormedBeyond { index, .. }) if index > segments.last.unwrap().index + 1
        ),
        "{segments:?}"
    );
    assert_eq!(segments.stop.as_ref().unwrap().offset, 64);
    assert!(!report.corrupt_in_acknowledged_range());
    assert!(
        report.to_string().contains("CORRUPT inside the log"),
        "{report}"
    );
}

mod model {
    //! Random operation sequences against a model: the log holds exactly
    //! what was appended, minus what was truncated, from the first retained
    //! index on, across reopens.

    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Append { term_bump: bool, lens: Vec<usize> },
        Sync,
        TruncateAfter(u64),
        RemoveBefore(u64),
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (any::<bool>(), prop::collection::vec(0usize..2500, 1..5))
                .prop_map(|(term_bump, lens)| Op::Append { term_bump, lens }),
            2 => Just(Op::Sync),
            1 => (0u64..1000).prop_map(Op::TruncateAfter),
            1 => (0u64..1000).prop_map(Op::RemoveBefore),
            1 => Just(Op::Reopen),
        ]
    }

    struct World {
        dir: tempfile::TempDir,
        log: Option<SegmentLog<RealDisk>>,
        source: Source,
        term: u64,
        first: u64,
    }

    impl World {
        fn log(&mut self) -> &mut SegmentLog<RealDisk> {
            self.log.as_mut().unwrap()
        }

        fn apply(&mut self, op: &Op) {
            match op {
                Op::Append { term_bump, lens } => {
                    if *term_bump {
                        self.term += 1;
                    }
                    let bytes = self.source.batch(self.term, lens);
                    // Two slices when there are several records: several
                    // slices of one append.
                    let first_len = 64 + lens[0].next_multiple_of(64);
                    if lens.len() > 1 {
                        let (x, y) = bytes.split_at(first_len);
                        self.log().append(&[x, y]).unwrap();
                    } else {
                        self.log().append(&[&bytes]).unwrap();
                    }
                }
                Op::Sync => {
                    let durable = self.log().sync().unwrap();
                    assert_eq!(durable, self.log().last_log());
                }
                Op::TruncateAfter(k) => {
                    let Some(last) = self.source.entries.last().map(|e| e.0) else {
                        return;
                    };
                    let first = self.first;
                    if last < first {
                        return;
                    }
                    // Somewhere in the retained range (not below it).
                    let keep = first + k % (last - first + 1);
                    let lsn_after = {
                        let r = self.log().reader().read(keep).unwrap();
                        r.lsn + 64 + r.payload.len().next_multiple_of(64) as u64
                    };
                    self.log().truncate_after(Some(keep)).unwrap();
                    self.source.truncate_after(keep, lsn_after);
                }
                Op::RemoveBefore(k) => {
                    let next = self.log().next_index();
                    let first = self.log().remove_before(k % (next + 1)).unwrap();
                    assert!(first <= next);
                    self.first = first;
                }
                Op::Reopen => {
                    drop(self.log.take());
                    let (log, recovery) = open(self.dir.path(), 4096, None);
                    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
                    assert_eq!(recovery.first_index, self.first);
                    self.log = Some(log);
                }
            }
        }

        fn check(&mut self) {
            let first = self.first;
            let expected: Vec<_> = self
                .source
                .entries
                .iter()
                .filter(|e| e.0 >= first)
                .cloned()
                .collect();
            let log = self.log.as_ref().unwrap();
            assert_eq!(log.first_index(), first);
            assert_eq!(contents(log), expected);
            if first > 0 {
                assert!(matches!(
                    log.reader().read(first - 1),
                    Err(WalError::Trimmed { .. })
                ));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let (log, _) = open(dir.path(), 4096, None);
            let mut world = World { dir, log: Some(log), source: Source::new(), term: 1, first: 0 };
            for op in &ops {
                world.apply(op);
                world.check();
            }
        }
    }
}

#[test]
fn the_writer_moves_to_a_thread_and_readers_are_shared() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync + Clone>() {}
    send::<SegmentLog<RealDisk>>();
    send_sync::<ringraft_wal::SegmentReader<RealDisk>>();
}

/// A safety net beside the scripted interleavings above: a reader thread
/// reads while the writer appends and retention removes segments. Every
/// read either returns the right record or names the retained range; the
/// test asserts nothing about how the threads happen to interleave.
#[test]
fn concurrent_reads_see_right_records_or_a_range_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), 4096, None);
    let reader = log.reader();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reading = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut ok = 0u64;
            let mut probe = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let (first, next) = reader.range();
                if next == 0 {
                    continue;
                }
                probe = probe
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let index = first.saturating_sub(2) + probe % (next - first + 2);
                match reader.read(index) {
                    Ok(r) => {
                        assert_eq!(r.index, index);
                        assert_eq!(
                            r.payload,
                            common::payload(index, 50 + (index as usize * 7) % 900)
                        );
                        ok += 1;
                    }
                    Err(WalError::Trimmed { .. } | WalError::NotInLog { .. }) => {}
                    Err(other) => panic!("read {index}: {other}"),
                }
            }
            ok
        })
    };
    let mut source = Source::new();
    for round in 0..300u64 {
        let index = source.entries.len();
        let lens: Vec<usize> = (index..index + 3).map(|i| 50 + (i * 7) % 900).collect();
        let bytes = source.batch(1, &lens);
        log.append(&[&bytes]).unwrap();
        if round % 10 == 9 {
            log.sync().unwrap();
            let next = log.next_index();
            log.remove_before(next.saturating_sub(20)).unwrap();
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    reading.join().unwrap();
    let first = log.first_index();
    assert_eq!(contents(&log), source.entries[first as usize..].to_vec());
}

/// A record whose bytes changed since its CRC was computed is never
/// written: our own memory broke, so the writer stops loudly.
#[test]
#[should_panic(expected = "bad CRC")]
fn appending_a_record_with_a_bad_crc_is_a_bug() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), 4096, None);
    let mut source = Source::new();
    let mut bytes = source.batch(1, &[100]);
    bytes[70] ^= 1;
    let _ = log.append(&[&bytes]);
}

/// A record that does not continue the log is the caller's bug.
#[test]
#[should_panic(expected = "does not continue the segment log")]
fn appending_a_record_that_does_not_continue_the_log_is_a_bug() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open(dir.path(), 4096, None);
    let mut source = Source::new();
    let first = source.batch(1, &[10]);
    let _second = source.batch(1, &[10]);
    let third = source.batch(1, &[10]);
    log.append(&[&first]).unwrap();
    let _ = log.append(&[&third]);
}

/// Issue 11, items 1 and 2: after a reboot the ring (shared memory) is gone
/// and the segments are the log: `wal check` checks them and says so,
/// instead of refusing the directory.
#[test]
fn wal_check_after_a_reboot_checks_the_segments_alone() {
    let (dir, source) = data_dir_with_segments(12, Some(11));
    let ring = ringraft_wal::ring_path(dir.path()).unwrap();
    std::fs::remove_file(&ring).unwrap();
    let report = ringraft_wal::check(dir.path()).unwrap();
    assert!(!report.ring_present);
    let segments = report.segments.clone().expect("a log/ folder");
    assert_eq!(segments.entries, source.entries.len() as u64);
    assert_eq!(report.last, Some(LogPos { index: 11, term: 1 }));
    assert_eq!(segments.damage, Damage::None);
    assert!(!report.corrupt_in_acknowledged_range());
    let text = report.to_string();
    assert!(text.contains("GONE"), "{text}");
    assert!(
        text.contains("index 0..=11 (12 entries, last term 1)"),
        "{text}"
    );
}

/// Issue 11, item 5: where retention starts the log, and the bytes from an
/// index on (what a leader weighs before it keeps entries for a lagging
/// follower). By size it is exact
/// to the record (the records from the point on take at most the budget,
/// one more would not fit); by age whole closed segments go, never the last.
#[test]
fn retention_point_is_exact_to_the_record_by_size_and_whole_segments_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _source) = written(dir.path(), 4096);
    let reader = log.reader();
    let (first, next) = reader.range();
    assert!(log.segment_count() > 2, "{} segments", log.segment_count());
    assert_eq!(reader.retention_point(None, None), first);
    assert_eq!(reader.retention_point(Some(u64::MAX), None), first);
    assert_eq!(reader.retention_point(Some(0), None), next);
    assert_eq!(reader.bytes_from(next), None, "past the end");
    let end = log.lsn_end();
    for k in first..next {
        let from_k = end - log.lsn_of(k).unwrap();
        assert_eq!(reader.bytes_from(k), Some(from_k), "index {k}");
        assert_eq!(reader.retention_point(Some(from_k), None), k, "index {k}");
        assert_eq!(
            reader.retention_point(Some(from_k - 1), None),
            k + 1,
            "index {k}, one byte less"
        );
    }
    let now = std::time::SystemTime::now();
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(reader.retention_point(None, Some(now - hour)), first);
    let last_first = reader.retention_point(None, Some(now + hour));
    assert!(last_first > first && last_first < next, "{last_first}");
    assert_eq!(
        log.reader().read(last_first).unwrap().index,
        last_first,
        "the last segment stays"
    );
    // Both limits: the larger point wins.
    assert_eq!(
        reader.retention_point(Some(u64::MAX), Some(now + hour)),
        last_first
    );
    assert_eq!(reader.retention_point(Some(0), Some(now + hour)), next);
}
