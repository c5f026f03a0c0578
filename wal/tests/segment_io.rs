//! The segment log's disk and its readers (issue 11, item 2): readers
//! racing the writer and retention, a full disk, the zeroes of
//! preallocation, one write per segment and what sync flushes, and a
//! failed flush.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::segments::*;
use ringraft_wal::disk::{Access, Disk, DiskFile, RealDisk, RealFile};
use ringraft_wal::{Damage, SegmentConfig, SegmentLog, WalError};

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

/// A new log in `dir` with `cfg` on a fresh [`HookDisk`], and that disk.
fn log_on_hook_disk(dir: &Path, cfg: SegmentConfig) -> (SegmentLog<HookDisk>, HookDisk) {
    let disk = HookDisk::default();
    let (log, _) = SegmentLog::open(disk.clone(), dir, cfg, None).unwrap();
    (log, disk)
}

/// A log of 24 entries over 4 KiB segments on a [`HookDisk`], shared with
/// the hooks; the disk and the entries.
fn hooked_log(dir: &Path) -> (Arc<Mutex<SegmentLog<HookDisk>>>, HookDisk, Source) {
    let (mut log, disk) = log_on_hook_disk(dir, config(4096));
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
    let mut all = source.entries.clone();
    all.extend(more.entries.clone());
    reopen_clean(dir.path(), config(4096), &all);
}

/// Issue 11, item 5 (the wal's part): without preallocation a write can
/// find the disk full half way; the batch is undone, the log stays usable,
/// and the same append succeeds once space is freed.
#[test]
fn a_write_that_finds_the_disk_full_is_undone_and_appends_resume() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig {
        preallocate: false,
        ..config(4096)
    };
    let (mut log, disk) = log_on_hook_disk(dir.path(), cfg);
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
    reopen_clean(dir.path(), cfg, &source.entries);
}

/// A write that passes the zeroed part of a preallocated segment carries
/// zeroes up to the next `zero_ahead_bytes` boundary, in the same write;
/// writes within it carry none. Recovery calls the zeroes a clean end.
#[test]
fn writes_carry_zeroes_ahead_to_the_next_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig {
        segment_bytes: 64 << 10,
        zero_ahead_bytes: 16 << 10,
        ..config(4096)
    };
    let (mut log, disk) = log_on_hook_disk(dir.path(), cfg);
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
    let (_, recovery) = reopen_clean(dir.path(), cfg, &source.entries);
    assert_eq!(recovery.stop, None);
}

/// One positioned write per segment an append touches; `sync` flushes each
/// segment written since the last sync once, and the directory only after
/// a segment was created.
#[test]
fn an_append_writes_once_per_segment_and_sync_flushes_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, disk) = log_on_hook_disk(dir.path(), config(4096));
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
    let (mut log, disk) = log_on_hook_disk(dir.path(), config(4096));
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
