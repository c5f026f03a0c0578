//! The log of segment files (issue 11, item 2): round trips across segment
//! rolls, truncation, retention, a model of random operation sequences,
//! segments of another node, and records the writer must refuse as bugs.
//! Recovery verdicts are in `tests/segment_recovery.rs`, the disk's faults
//! and readers racing the writer in `tests/segment_io.rs`.

mod common;

use common::segments::*;
use ringraft_wal::disk::RealDisk;
use ringraft_wal::{Damage, LogPos, SegmentConfig, SegmentLog, WalError};

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
    reopen_clean(dir.path(), config(4096), &source.entries);
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
    reopen_clean(dir.path(), cfg, &source.entries);
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
    let lsn_after = lsn_after(&log, keep);
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
    let (mut log, _) = reopen_clean(dir.path(), config(4096), &source.entries);
    // Everything: an empty log that takes any first record.
    log.truncate_after(None).unwrap();
    assert_eq!(log.segment_count(), 0);
    assert_eq!(log.last_log(), None);
    let mut fresh = Source::after(Some(LogPos { index: 99, term: 9 }), 1 << 20);
    let bytes = fresh.batch(9, &[5]);
    log.append(&[&bytes]).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_, recovery) = reopen_clean(dir.path(), config(4096), &fresh.entries);
    assert_eq!(recovery.first_index, 100);
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
                    // Somewhere in the retained range (not below it).
                    let log = self.log.as_mut().unwrap();
                    truncate_after_picked(log, &mut self.source, self.first, *k);
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
