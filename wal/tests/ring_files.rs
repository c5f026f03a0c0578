//! The data directory's files around the ring: the vote and commit, foreign,
//! missing or corrupt files, interrupted creation, bad configurations and
//! corruption found at open.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use ringraft_wal::layout::CONTROL_BLOCK_BYTES;
use ringraft_wal::{Damage, Evidence, Invalid, Meta, RingConfig, VoteRecord, WalError, check};

/// Writes entries 0..20 of term 1 (200-byte payloads) into the node of
/// data directory `dir`, acknowledges them up to `acked` and closes the
/// node; returns where the last entry starts (its lsn).
fn twenty_entries_acked_to(dir: &Path, acked: u64) -> u64 {
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir, e);
    append_n(wal.ring_mut(), e, 1, 20, |_| 200);
    wal.ring_mut().sync_and_ack(acked).unwrap();
    wal.ring().read(19).unwrap().lsn
}

/// Flips a bit of the payload of the record at `lsn` behind the ring's
/// back: its CRC no longer matches.
fn flip_a_payload_bit(dir: &Path, lsn: u64) {
    let ring = ring_file(dir);
    let at = CONTROL_BLOCK_BYTES as u64 + lsn + 100;
    let mut b = [0u8];
    ring.read_exact_at(&mut b, at).unwrap();
    ring.write_all_at(&[b[0] ^ 8], at).unwrap();
}

#[test]
fn the_vote_and_commit_survive_and_foreign_directories_are_refused() {
    let dir = tempdir();
    let vote = VoteRecord {
        term: 7,
        voted_for: Some(3),
        committed: false,
    };
    {
        let mut wal = open(dir.path());
        wal.save_vote(vote).unwrap();
        wal.save_committed(last(7, 0)).unwrap();
    }
    let wal = open(dir.path());
    assert_eq!(wal.meta().vote, Some(vote));
    assert_eq!(wal.meta().committed, last(7, 0));
    drop(wal);
    let other_cluster = RingConfig {
        cluster_id: 1,
        ..config(1)
    };
    assert!(matches!(
        open_with(dir.path(), &other_cluster),
        Err(WalError::Foreign {
            field: "cluster id",
            ..
        })
    ));
    assert!(matches!(
        open_with(dir.path(), &config(2)),
        Err(WalError::Foreign {
            field: "node id",
            ..
        })
    ));
    let bigger = RingConfig {
        capacity: 2 * CAP,
        ..config(1)
    };
    assert!(matches!(
        open_with(dir.path(), &bigger),
        Err(WalError::Foreign {
            field: "capacity",
            ..
        })
    ));
}

#[test]
fn missing_or_corrupt_files_are_errors_not_defaults() {
    let dir = tempdir();
    drop(open(dir.path()));
    let meta = dir.path().join("meta");
    let saved = std::fs::read(&meta).unwrap();
    std::fs::remove_file(&meta).unwrap();
    assert!(matches!(
        open_with(dir.path(), &config(1)),
        Err(WalError::Incomplete { .. })
    ));
    let mut bad = saved.clone();
    bad[20] ^= 1;
    std::fs::write(&meta, &bad).unwrap();
    assert!(matches!(
        open_with(dir.path(), &config(1)),
        Err(WalError::Layout { .. })
    ));
    std::fs::write(&meta, &saved).unwrap();
    // A corrupt ring header.
    ring_file(dir.path()).write_all_at(&[0xFF], 30).unwrap();
    assert!(matches!(
        open_with(dir.path(), &config(1)),
        Err(WalError::Layout { .. })
    ));
    // A ring file of the wrong size.
    let dir2 = tempdir();
    drop(open(dir2.path()));
    ring_file(dir2.path())
        .set_len(CONTROL_BLOCK_BYTES as u64 + CAP / 2)
        .unwrap();
    assert!(matches!(
        open_with(dir2.path(), &config(1)),
        Err(WalError::Inconsistent { .. })
    ));
    assert!(check(dir2.path()).is_err());
}

#[test]
fn an_interrupted_creation_is_completed() {
    let dir = tempdir();
    Meta::new(0xC0FFEE, 1)
        .store(&dir.path().join("meta"))
        .unwrap();
    let wal = open(dir.path());
    assert!(wal.recovery().created);
}

#[test]
fn bad_configurations_are_refused() {
    let dir = tempdir();
    for cfg in [
        RingConfig {
            capacity: 3 << 20,
            ..config(1)
        },
        RingConfig {
            capacity: 1 << 19,
            ..config(1)
        },
        RingConfig {
            max_record_bytes: CAP,
            ..config(1)
        },
        RingConfig {
            node_id: 1 << 16,
            ..config(1)
        },
    ] {
        assert!(
            matches!(open_with(dir.path(), &cfg), Err(WalError::Config(_))),
            "{cfg:?}"
        );
    }
}

#[test]
fn corruption_below_the_watermark_is_reported_and_checked() {
    let dir = tempdir();
    let lsn = twenty_entries_acked_to(dir.path(), 19);
    let clean = check(dir.path()).unwrap();
    assert_eq!(clean.entries, 20);
    assert!(!clean.corrupt_in_acknowledged_range());
    assert!(format!("{clean}").contains("index 0..=19"));
    // Flip a payload bit of the last (acknowledged) entry.
    flip_a_payload_bit(dir.path(), lsn);
    let before = std::fs::read(ring_path(dir.path())).unwrap();
    let report = check(dir.path()).unwrap();
    assert_eq!(
        std::fs::read(ring_path(dir.path())).unwrap(),
        before,
        "check writes nothing"
    );
    assert_eq!(report.entries, 19);
    assert!(matches!(
        report.stop.unwrap().reason,
        Invalid::CrcMismatch { .. }
    ));
    assert!(report.corrupt_in_acknowledged_range());
    assert!(format!("{report}").contains("CORRUPT inside the acknowledged range"));
    let wal = open(dir.path());
    assert!(wal.recovery().corrupt_inside());
    assert_eq!(
        wal.recovery().damage,
        Damage::CorruptInside(Evidence::BelowWatermark {
            acked: 19,
            recovered_next_index: 19
        })
    );
}

/// Found by the `open` fuzz target (issue 15): recovery that emptied the
/// ring (its first record damaged) lowered the acknowledged watermark to
/// what it recovered, so the next open found nothing wrong and the node
/// would grant votes with acknowledged entries missing. The watermark is
/// kept, and the second open says what the first said (and what the
/// offline check says: the whole log breaks at its end, index 0 here).
#[test]
fn a_log_that_recovery_leaves_below_the_watermark_stays_corrupt_on_the_next_open() {
    let dir = tempdir();
    twenty_entries_acked_to(dir.path(), 19);
    let first_lsn = open(dir.path()).ring().read(0).unwrap().lsn;
    // Flip a payload bit of the first entry: the ring's scan finds nothing.
    flip_a_payload_bit(dir.path(), first_lsn);
    let below = Damage::CorruptInside(Evidence::BelowWatermark {
        acked: 19,
        recovered_next_index: 0,
    });
    assert_eq!(check(dir.path()).unwrap().damage, below);
    let wal = open(dir.path());
    assert_eq!(wal.recovery().damage, below);
    drop(wal);
    let again = open(dir.path());
    assert_eq!(again.recovery().damage, below, "forgotten on the next open");
    assert_eq!(again.ring().acked(), Some(19));
}

/// The `open` fuzz target's case (issue 15): the segments hold entries
/// 0..=15, the ring's first record is damaged, the watermark is 19.
/// `Wal::open` said the log breaks at index 0 (where the ring alone
/// ended), the offline check at 16 (where the whole log ends): they agree
/// now, on 16, and the watermark stays.
#[test]
fn open_and_check_agree_where_the_whole_log_breaks_below_the_watermark() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    append_n(wal.ring_mut(), e, 1, 20, |_| 200);
    wal.ring_mut().sync_and_ack(19).unwrap();
    // The segments take entries 0..=15, as the flusher copies them.
    let mut records = Vec::new();
    assert_eq!(
        wal.ring().copy_records(0, usize::MAX, &mut records),
        Some(19)
    );
    let record_len = records.len() / 20;
    let first_lsn = wal.ring().read(0).unwrap().lsn;
    let mut segments = wal.take_segments().unwrap();
    segments.append(&[&records[..16 * record_len]]).unwrap();
    segments.sync().unwrap();
    drop((segments, wal));
    // Flip a payload bit of the ring's first record: the ring gives nothing.
    flip_a_payload_bit(dir.path(), first_lsn);
    let below = Damage::CorruptInside(Evidence::BelowWatermark {
        acked: 19,
        recovered_next_index: 16,
    });
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damage, below, "{report}");
    let wal = open(dir.path());
    assert_eq!(wal.recovery().damage, below, "{:?}", wal.recovery());
    assert_eq!(wal.ring().next_index(), 16);
    assert_eq!(wal.ring().acked(), Some(19));
}

#[test]
fn an_unacknowledged_torn_tail_is_not_corruption() {
    let dir = tempdir();
    let lsn = twenty_entries_acked_to(dir.path(), 18);
    ring_file(dir.path())
        .write_all_at(&[0u8; 100], CONTROL_BLOCK_BYTES as u64 + lsn + 150)
        .unwrap();
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damage, Damage::TornTail);
    assert!(!report.corrupt_in_acknowledged_range());
    let wal = open(dir.path());
    assert_eq!(wal.ring().last_log(), last(1, 18));
    assert!(!wal.recovery().corrupt_inside());
}
