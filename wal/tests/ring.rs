//! The file-backed ring through the public API: appends, wrapping, a full
//! ring, record limits, batches, the fence, the commit hint and memory
//! locking.

mod common;

use common::*;
use ringraft_wal::{Damage, EntryRef, Epoch, LogPos, RingConfig, WalError};

#[test]
fn a_new_directory_opens_empty_and_entries_survive_reopen() {
    let dir = tempdir();
    let e = epoch(1, 1);
    {
        let mut wal = open(dir.path());
        assert!(wal.recovery().created);
        assert_eq!(wal.recovery().incarnation, 1);
        assert_eq!(wal.ring().next_index(), 0);
        assert_eq!(wal.ring().last_log(), None);
        take_fence(wal.ring(), e);
        append_n(wal.ring_mut(), e, 1, 100, |i| (i * 13 % 700) as usize);
        wal.ring_mut().sync_and_ack(99).unwrap();
    }
    let wal = open(dir.path());
    assert!(!wal.recovery().created);
    assert_eq!(
        wal.recovery().incarnation,
        2,
        "incarnation bumps at every open"
    );
    assert_eq!(wal.recovery().entries, 100);
    assert_eq!(wal.recovery().damage, Damage::None);
    assert_eq!(wal.recovery().acked, Some(99));
    assert_eq!(wal.ring().fence(), e);
    assert_eq!(wal.ring().last_log(), last(1, 99));
    for (i, t, p) in contents(wal.ring()) {
        assert_eq!(t, 1);
        assert_eq!(p, payload(i, (i * 13 % 700) as usize));
    }
}

#[test]
fn appends_wrap_around_many_laps_with_purges() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    let len_of = |i: u64| (i * 977 % 9000) as usize;
    let mut purged_to = None;
    while wal.ring().tail_lsn() < 5 * CAP {
        let ring = wal.ring_mut();
        let index = ring.next_index();
        let p = payload(index, len_of(index));
        match ring.append(
            e,
            &[EntryRef {
                term: 1,
                index,
                payload: &p,
            }],
        ) {
            Ok(_) => {}
            Err(err) if err.is_retryable() => {
                // Purge the older half of the log and retry.
                let first = wal.ring().first_index();
                let upto = first + (wal.ring().next_index() - first) / 2;
                assert!(
                    wal.purge(LogPos {
                        term: 1,
                        index: upto
                    })
                    .unwrap()
                );
                purged_to = Some(upto);
            }
            Err(err) => panic!("{err}"),
        }
    }
    let purged_to = purged_to.expect("the ring filled up at least once");
    let expected = contents(wal.ring());
    assert_eq!(expected.first().unwrap().0, purged_to + 1);
    drop(wal);
    let wal = open(dir.path());
    assert_eq!(wal.ring().last_purged(), last(1, purged_to));
    assert_log_eq!(
        contents(wal.ring()),
        expected,
        "recovery crosses laps and wraps"
    );
    assert_eq!(wal.recovery().damage, Damage::None);
}

#[test]
fn a_full_ring_is_an_error_to_wait_on_never_an_overwrite() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    let big = vec![7u8; MAX_RECORD as usize];
    let mut n = 0;
    let err = loop {
        let index = wal.ring().next_index();
        match wal.ring_mut().append(
            e,
            &[EntryRef {
                term: 1,
                index,
                payload: &big,
            }],
        ) {
            Ok(_) => n += 1,
            Err(err) => break err,
        }
    };
    assert!(matches!(err, WalError::RingFull { .. }), "{err}");
    assert!(err.is_retryable());
    assert_eq!(
        wal.ring().next_index(),
        n,
        "nothing written by the failed append"
    );
    assert!(wal.ring().tail_lsn() <= wal.ring().head_lsn() + CAP);
    // The oldest entry is intact: the ring did not overwrite it.
    assert_eq!(wal.ring().read(0).unwrap().payload, &big[..]);
    wal.purge(LogPos { term: 1, index: 0 }).unwrap();
    let index = wal.ring().next_index();
    wal.ring_mut()
        .append(
            e,
            &[EntryRef {
                term: 1,
                index,
                payload: &big,
            }],
        )
        .expect("room after the purge");
}

#[test]
fn records_above_the_limit_are_refused() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let mut wal = open_fenced(dir.path(), e);
    let too_big = vec![0u8; MAX_RECORD as usize + 1];
    let err = wal
        .ring_mut()
        .append(
            e,
            &[EntryRef {
                term: 1,
                index: 0,
                payload: &too_big,
            }],
        )
        .unwrap_err();
    assert!(
        matches!(err, WalError::RecordTooLarge { len, max } if len == MAX_RECORD + 1 && max == MAX_RECORD)
    );
    assert_eq!(wal.ring().next_index(), 0);
}

#[test]
fn batches_are_all_or_nothing() {
    let dir = tempdir();
    let e = epoch(2, 1);
    let mut wal = open_fenced(dir.path(), e);
    let err = wal
        .ring_mut()
        .append(
            e,
            &[
                EntryRef {
                    term: 1,
                    index: 0,
                    payload: b"a",
                },
                EntryRef {
                    term: 2,
                    index: 1,
                    payload: b"b",
                },
                EntryRef {
                    term: 1,
                    index: 2,
                    payload: b"c",
                },
            ],
        )
        .unwrap_err();
    assert!(matches!(err, WalError::Encode(_)), "{err}");
    assert_eq!(wal.ring().next_index(), 0);
    assert_eq!(wal.ring().tail_lsn(), 0);
    // A writer above the fence is refused too.
    let err = wal
        .ring_mut()
        .append(
            epoch(3, 1),
            &[EntryRef {
                term: 1,
                index: 0,
                payload: b"a",
            }],
        )
        .unwrap_err();
    assert!(matches!(err, WalError::EpochAboveFence { .. }), "{err}");
}

#[test]
fn the_fence_moves_only_upward() {
    let dir = tempdir();
    let wal = open(dir.path());
    let ring = wal.ring();
    assert_eq!(ring.fence(), Epoch::ZERO);
    assert_eq!(
        ring.compare_exchange_fence(Epoch::ZERO, epoch(2, 1))
            .unwrap(),
        Epoch::ZERO
    );
    // A CAS from a stale expected value fails and returns what it found.
    assert_eq!(
        ring.compare_exchange_fence(Epoch::ZERO, epoch(3, 2))
            .unwrap(),
        epoch(2, 1)
    );
    assert_eq!(ring.fence(), epoch(2, 1));
    assert!(matches!(
        ring.compare_exchange_fence(epoch(2, 1), epoch(1, 3)),
        Err(WalError::FenceDownward { .. })
    ));
}

#[test]
fn memory_locking_is_attempted_and_never_fatal() {
    let dir = tempdir();
    let cfg = RingConfig {
        lock_memory: true,
        ..config(1)
    };
    let wal = open_with(dir.path(), &cfg).unwrap();
    // Whether mlock succeeds depends on RLIMIT_MEMLOCK; either way the ring
    // opened. Report which for the test log.
    eprintln!("memory locked: {}", wal.ring().memory_locked());
}

#[test]
fn commit_hint_round_trips() {
    let dir = tempdir();
    let wal = open(dir.path());
    assert_eq!(wal.ring().commit_hint(), None);
    wal.ring().set_commit_hint(Some(0));
    assert_eq!(wal.ring().commit_hint(), Some(0));
    wal.ring().set_commit_hint(Some(41));
    drop(wal);
    assert_eq!(open(dir.path()).ring().commit_hint(), Some(41));
}
