//! Truncation, purging and anchoring of the ring on the durable log, through
//! the public API.

mod common;

use common::*;
use ringraft_wal::{Damage, EntryRef, LogPos, Meta, WalError, check};

#[test]
fn truncated_entries_do_not_come_back_after_a_crash() {
    let dir = tempdir();
    let e1 = epoch(1, 1);
    let e2 = epoch(2, 2);
    {
        let mut wal = open_fenced(dir.path(), e1);
        append_n(wal.ring_mut(), e1, 1, 10, |i| i as usize * 10);
        wal.ring_mut().sync_and_ack(9).unwrap();
        wal.ring_mut().truncate_after(Some(4)).unwrap();
        assert_eq!(wal.ring().last_log(), last(1, 4));
        assert_eq!(
            wal.ring().acked(),
            Some(4),
            "watermark follows the truncation"
        );
        wal.ring_mut().sync().unwrap();
    }
    {
        let mut wal = open(dir.path());
        assert_eq!(wal.ring().last_log(), last(1, 4));
        assert_eq!(wal.recovery().damage, Damage::None, "{:?}", wal.recovery());
        // A new leader's entries continue from the truncation point.
        take_fence(wal.ring(), e2);
        append_n(wal.ring_mut(), e2, 2, 2, |_| 3);
        wal.ring_mut().truncate_after(None).unwrap();
        assert_eq!(wal.ring().last_log(), None);
        wal.ring_mut().sync().unwrap();
    }
    let wal = open(dir.path());
    assert_eq!(wal.ring().next_index(), 0);
    assert_eq!(wal.recovery().damage, Damage::None);
}

#[test]
fn truncation_below_the_purge_point_is_refused() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    append_n(wal.ring_mut(), e, 1, 10, |_| 1);
    wal.purge(LogPos { term: 1, index: 5 }).unwrap();
    assert!(matches!(
        wal.ring_mut().truncate_after(Some(3)),
        Err(WalError::Conflict(_))
    ));
    wal.ring_mut().truncate_after(Some(5)).unwrap();
    assert_eq!(wal.ring().next_index(), 6);
    assert_eq!(wal.ring().first_index(), 6);
}

#[test]
fn purge_advances_head_and_beyond_the_log_empties_it() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    append_n(wal.ring_mut(), e, 1, 10, |_| 100);
    let lsn5 = wal.ring().read(5).unwrap().lsn;
    assert!(wal.purge(LogPos { term: 1, index: 4 }).unwrap());
    assert_eq!(wal.ring().head_lsn(), lsn5);
    assert_eq!(wal.ring().first_index(), 5);
    assert!(
        !wal.purge(LogPos { term: 1, index: 3 }).unwrap(),
        "already purged"
    );
    assert!(matches!(
        wal.purge(LogPos { term: 2, index: 7 }),
        Err(WalError::Conflict(_))
    ));
    assert!(matches!(wal.ring().read(4), Err(WalError::NotInLog { .. })));
    // A snapshot beyond the log: everything goes, the log continues after it.
    assert!(
        wal.purge(LogPos {
            term: 3,
            index: 100
        })
        .unwrap()
    );
    assert_eq!(wal.ring().next_index(), 101);
    assert_eq!(wal.ring().last_log(), last(3, 100));
    assert_eq!(wal.ring().head_lsn(), wal.ring().tail_lsn());
    take_fence(wal.ring(), epoch(3, 1));
    append_n(wal.ring_mut(), epoch(3, 1), 3, 1, |_| 5);
    drop(wal);
    let wal = open(dir.path());
    assert_eq!(wal.ring().first_index(), 101);
    assert_eq!(wal.ring().last_log(), last(3, 101));
    assert_eq!(
        wal.meta().purged.unwrap().log,
        LogPos {
            term: 3,
            index: 100
        }
    );
}

#[test]
fn a_purge_interrupted_before_head_moved_is_completed_at_open() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let lsn;
    {
        let mut wal = open_fenced(dir.path(), e);
        append_n(wal.ring_mut(), e, 1, 10, |_| 100);
        lsn = wal
            .ring()
            .purge_point(LogPos { term: 1, index: 4 })
            .unwrap()
            .unwrap();
        // The metadata is stored, then the process dies before head moves.
        Meta {
            purged: Some(lsn),
            ..*wal.meta()
        }
        .store(&dir.path().join("meta"))
        .unwrap();
        wal.ring_mut().sync().unwrap();
    }
    let wal = open(dir.path());
    assert_eq!(wal.ring().head_lsn(), lsn.next_lsn);
    assert_eq!(wal.ring().first_index(), 5);
    assert_eq!(wal.ring().next_index(), 10);
}

#[test]
fn a_log_never_purged_may_start_at_any_index() {
    let dir = tempdir();
    let e = epoch(2, 1);
    {
        let mut wal = open_fenced(dir.path(), e);
        assert!(wal.ring().tip().unanchored);
        let ring = wal.ring_mut();
        ring.append(
            e,
            &[EntryRef {
                term: 2,
                index: 5,
                payload: b"five",
            }],
        )
        .unwrap();
        assert_eq!(ring.first_index(), 5);
        assert!(!ring.tip().unanchored);
        // Once anchored by its first entry, the chain is strict again.
        assert!(
            ring.append(
                e,
                &[EntryRef {
                    term: 2,
                    index: 7,
                    payload: b"x"
                }]
            )
            .is_err()
        );
        ring.append(
            e,
            &[EntryRef {
                term: 2,
                index: 6,
                payload: b"six",
            }],
        )
        .unwrap();
        ring.sync().unwrap();
    }
    let mut wal = open(dir.path());
    assert_eq!(wal.ring().first_index(), 5);
    assert_eq!(wal.ring().last_log(), last(2, 6));
    assert_eq!(wal.ring().read(5).unwrap().payload, b"five");
    assert!(matches!(wal.ring().read(4), Err(WalError::NotInLog { .. })));
    // Truncating everything makes it unanchored again.
    wal.ring_mut().truncate_after(Some(2)).unwrap();
    assert_eq!(wal.ring().next_index(), 0);
    assert!(wal.ring().tip().unanchored);
    wal.ring_mut()
        .append(
            e,
            &[EntryRef {
                term: 2,
                index: 9,
                payload: b"nine",
            }],
        )
        .unwrap();
    drop(wal);
    let wal = open(dir.path());
    assert_eq!(wal.ring().first_index(), 9);
    assert_eq!(check(dir.path()).unwrap().first_index, 9);
}

#[test]
fn a_log_that_began_anywhere_can_be_anchored_right_before_its_first_entry() {
    let dir = tempdir();
    let e = epoch(3, 1);
    {
        let mut wal = open_fenced(dir.path(), e);
        append_range(wal.ring_mut(), e, 2, 7..10, |_| 10);
        assert!(
            matches!(
                wal.purge(LogPos { term: 1, index: 5 }),
                Err(WalError::Conflict(_))
            ),
            "gap"
        );
        assert!(
            matches!(
                wal.purge(LogPos { term: 3, index: 6 }),
                Err(WalError::Conflict(_))
            ),
            "term above"
        );
        assert!(wal.purge(LogPos { term: 1, index: 6 }).unwrap());
        assert_eq!(wal.ring().last_purged(), last(1, 6));
        assert_eq!(wal.ring().first_index(), 7);
    }
    let wal = open(dir.path());
    assert_eq!(wal.recovery().damage, Damage::None, "{:?}", wal.recovery());
    assert_eq!(wal.ring().first_index(), 7);
    assert_eq!(wal.ring().last_log(), last(2, 9));
    assert_eq!(wal.ring().read(7).unwrap().payload, payload(7, 10));
}
