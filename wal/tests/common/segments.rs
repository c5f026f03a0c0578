//! Helpers shared by the segment-log tests (`tests/segments.rs`,
//! `tests/segment_recovery.rs`, `tests/segment_io.rs`): the segment
//! configuration, a [`Source`] that encodes entries as the ring would, and
//! readers of a log's contents and files. They only build and read test
//! logs; they never assert a verdict of their own beyond the contents'
//! two reads agreeing.

use std::path::{Path, PathBuf};

use ringraft_wal::disk::{Disk, RealDisk};
use ringraft_wal::{
    ChainTip, Damage, EntryRef, Epoch, LogPos, RecordEncoder, SegmentConfig, SegmentLog,
    SegmentRecovery, WriteBuffer,
};

pub const CLUSTER: u64 = 0xC0FFEE;
pub const NODE: u64 = 1;
/// A ring as large as the encoder allows: records never wrap in these
/// tests, so the bytes of a batch are one run.
pub const RING: u64 = 1 << 40;

pub fn config(segment_bytes: u64) -> SegmentConfig {
    SegmentConfig {
        segment_bytes,
        max_record_bytes: 64 << 10,
        ..SegmentConfig::new(CLUSTER, NODE)
    }
}

/// Plays the ring: encodes entries as the ring would and hands out their
/// bytes.
pub struct Source {
    pub encoder: RecordEncoder,
    pub epoch: Epoch,
    /// Everything encoded, as (index, term, payload).
    pub entries: Vec<(u64, u64, Vec<u8>)>,
}

impl Source {
    pub fn new() -> Source {
        Source::after(None, 0)
    }

    pub fn after(last: Option<LogPos>, lsn: u64) -> Source {
        let tip = ChainTip::after(last);
        Source {
            encoder: RecordEncoder::new(RING, lsn, tip, epoch(1)).unwrap(),
            epoch: epoch(1),
            entries: Vec::new(),
        }
    }

    /// Encodes one batch of entries of `term` with these payload lengths
    /// and returns its bytes (one run of whole records).
    pub fn batch(&mut self, term: u64, lens: &[usize]) -> Vec<u8> {
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
            let payload = super::payload(index, *len);
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
    pub fn truncate_after(&mut self, last_kept: u64, lsn: u64) {
        self.entries.retain(|e| e.0 <= last_kept);
        let (index, term, _) = self.entries.last().unwrap().clone();
        let tip = ChainTip {
            epoch: self.epoch,
            ..ChainTip::after(Some(LogPos { term, index }))
        };
        self.encoder = RecordEncoder::new(RING, lsn, tip, self.epoch).unwrap();
    }
}

pub fn epoch(term: u64) -> Epoch {
    Epoch::new(term, 1).unwrap()
}

pub fn open(
    dir: &Path,
    segment_bytes: u64,
    acked: Option<u64>,
) -> (SegmentLog<RealDisk>, SegmentRecovery) {
    SegmentLog::open(RealDisk, dir, config(segment_bytes), acked).unwrap()
}

/// Opens the log in `dir` again with `config` on the real disk and asserts
/// that recovery finds it clean and holding `expected` (as (index, term,
/// payload)).
pub fn reopen_clean(
    dir: &Path,
    config: SegmentConfig,
    expected: &[(u64, u64, Vec<u8>)],
) -> (SegmentLog<RealDisk>, SegmentRecovery) {
    let (log, recovery) = SegmentLog::open(RealDisk, dir, config, None).unwrap();
    assert_eq!(recovery.damage, Damage::None, "{recovery:?}");
    assert_eq!(contents(&log), expected);
    (log, recovery)
}

/// The lsn right after the record of entry `index` in `log`: where the
/// ring goes on when the log is cut after that entry.
pub fn lsn_after<D: Disk>(log: &SegmentLog<D>, index: u64) -> u64 {
    let r = log.reader().read(index).unwrap();
    r.lsn + 64 + r.payload.len().next_multiple_of(64) as u64
}

/// A model's truncation (tests/segments.rs, tests/segment_crashes.rs): cuts
/// `log` and `source` after the retained entry (from `first` on) that
/// `pick` chooses, modulo their number; that entry, or `None` when no entry
/// is retained.
pub fn truncate_after_picked<D: Disk>(
    log: &mut SegmentLog<D>,
    source: &mut Source,
    first: u64,
    pick: u64,
) -> Option<u64> {
    let last = source.entries.last()?.0;
    if last < first {
        return None;
    }
    let keep = first + pick % (last - first + 1);
    let lsn_after = lsn_after(log, keep);
    log.truncate_after(Some(keep)).unwrap();
    source.truncate_after(keep, lsn_after);
    Some(keep)
}

/// Everything the log holds, read one by one and as one range.
pub fn contents<D: Disk>(log: &SegmentLog<D>) -> Vec<(u64, u64, Vec<u8>)> {
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

pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// Writes a log of `batches` batches of mixed sizes over small segments.
pub fn written(dir: &Path, segment_bytes: u64) -> (SegmentLog<RealDisk>, Source) {
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

/// Copies the segment directory `from` into a fresh one.
pub fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for file in segment_files(from) {
        std::fs::copy(&file, to.path().join(file.file_name().unwrap())).unwrap();
    }
    to
}
