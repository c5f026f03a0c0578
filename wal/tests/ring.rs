//! The file-backed ring and the data directory, through the public API.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::*;
use ringraft_wal::layout::CONTROL_BLOCK_BYTES;
use ringraft_wal::{
    AdoptError, AdoptRequest, ChainTip, Damage, EntryRef, Epoch, Evidence, Invalid, LogPos, Meta,
    RingConfig, VoteRecord, WalError, check,
};

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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
fn adoption_takes_a_remote_writers_records_in_place() {
    let dir = tempdir();
    let leader = epoch(1, 2);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), leader);
    let entries: Vec<_> = (0..20)
        .map(|i| (i, 1, payload(i, (i * 300) as usize)))
        .collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), leader, &entries);
    let request = AdoptRequest {
        from_lsn: 0,
        to_lsn: buf.end_lsn(),
        entries: 20,
        last: last(1, 19),
    };
    let out = wal.ring_mut().adopt(request).unwrap();
    assert_eq!(out.last, last(1, 19));
    assert_eq!(out.tail_lsn, buf.end_lsn());
    assert_log_eq!(contents(wal.ring()), entries);
    // Adopted records are read in place: same address as the ring's bytes.
    let r = wal.ring().read(3).unwrap();
    let data = wal.ring().regions().data;
    assert_eq!(
        r.payload.as_ptr(),
        data.addr.wrapping_add((r.lsn % CAP) as usize + 64) as *const u8
    );
    // A heartbeat adopts nothing and changes nothing.
    let tail = wal.ring().tail_lsn();
    wal.ring_mut()
        .adopt(AdoptRequest {
            from_lsn: tail,
            to_lsn: tail,
            entries: 0,
            last: None,
        })
        .unwrap();
    assert_eq!(wal.ring().tail_lsn(), tail);
    drop(wal);
    let wal = open(dir.path());
    assert_log_eq!(
        contents(wal.ring()),
        entries,
        "adopted records survive a restart"
    );
}

#[test]
fn adoption_rejects_a_writer_that_lost_the_fence() {
    let dir = tempdir();
    let old = epoch(1, 2);
    let new = epoch(2, 3);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), old);
    // The old leader writes, but a new leader takes the fence first.
    let buf = remote_write(
        wal.ring(),
        0,
        ChainTip::default(),
        old,
        &[(0, 1, b"stale".to_vec())],
    );
    take_fence(wal.ring(), new);
    let err = wal
        .ring_mut()
        .adopt(AdoptRequest {
            from_lsn: 0,
            to_lsn: buf.end_lsn(),
            entries: 1,
            last: last(1, 0),
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            WalError::Adopt(AdoptError::Rejected {
                lsn: 0,
                reason: Invalid::NotFenceHolder { fence, found }
            }) if fence == new && found == old
        ),
        "{err}"
    );
    assert_eq!(wal.ring().next_index(), 0, "nothing adopted");
    // The follower erases the rejected scratch; the new leader's records
    // written there are adopted.
    wal.ring_mut().clear_scratch(buf.end_lsn());
    let buf = remote_write(
        wal.ring(),
        0,
        ChainTip::default(),
        new,
        &[(0, 2, b"fresh".to_vec())],
    );
    wal.ring_mut()
        .adopt(AdoptRequest {
            from_lsn: 0,
            to_lsn: buf.end_lsn(),
            entries: 1,
            last: last(2, 0),
        })
        .unwrap();
    assert_eq!(wal.ring().read(0).unwrap().payload, b"fresh");
}

#[test]
fn adoption_checks_position_range_and_metadata() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
    let entries: Vec<_> = (0..3).map(|i| (i, 1, payload(i, 10))).collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), e, &entries);
    let end = buf.end_lsn();
    let good = AdoptRequest {
        from_lsn: 0,
        to_lsn: end,
        entries: 3,
        last: last(1, 2),
    };
    let cases = [
        AdoptRequest {
            from_lsn: 64,
            ..good
        },
        AdoptRequest {
            to_lsn: CAP + 64,
            ..good
        },
        AdoptRequest {
            to_lsn: end - 64,
            ..good
        },
        AdoptRequest {
            to_lsn: end + 64,
            ..good
        },
        AdoptRequest { entries: 2, ..good },
        AdoptRequest {
            last: last(2, 2),
            ..good
        },
    ];
    let errs: Vec<_> = cases
        .iter()
        .map(|r| match wal.ring_mut().adopt(*r).unwrap_err() {
            WalError::Adopt(a) => a,
            other => panic!("{other}"),
        })
        .collect();
    assert!(matches!(
        errs[0],
        AdoptError::NotAtTail {
            from_lsn: 64,
            tail_lsn: 0
        }
    ));
    assert!(matches!(errs[1], AdoptError::BadRange { .. }));
    assert!(matches!(errs[2], AdoptError::EndMismatch { .. }));
    assert!(matches!(
        errs[3],
        AdoptError::Rejected {
            reason: Invalid::BadMagic { .. },
            ..
        }
    ));
    assert!(matches!(errs[4], AdoptError::EntriesMismatch { .. }));
    assert!(matches!(errs[5], AdoptError::EntriesMismatch { .. }));
    assert_eq!(
        wal.ring().next_index(),
        0,
        "no failed request adopted anything"
    );
    wal.ring_mut().adopt(good).unwrap();
    assert_log_eq!(contents(wal.ring()), entries);
}

#[test]
fn adoption_rejects_torn_and_chain_breaking_records() {
    let dir = tempdir();
    let e = epoch(2, 2);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
    append_n(wal.ring_mut(), e, 2, 3, |_| 10);
    let tail = wal.ring().tail_lsn();
    // prev_term 1 after an entry of term 2: a log-matching violation.
    let bad_tip = ChainTip {
        next_index: 3,
        last_term: 1,
        epoch: e,
        unanchored: false,
    };
    let buf = remote_write(wal.ring(), tail, bad_tip, e, &[(3, 2, b"x".to_vec())]);
    let req = AdoptRequest {
        from_lsn: tail,
        to_lsn: buf.end_lsn(),
        entries: 1,
        last: last(2, 3),
    };
    let err = wal.ring_mut().adopt(req).unwrap_err();
    assert!(matches!(
        err,
        WalError::Adopt(AdoptError::Rejected {
            reason: Invalid::PrevTermMismatch { .. },
            ..
        })
    ));
    // A torn write: right chain, one payload byte flipped.
    let buf = remote_write(
        wal.ring(),
        tail,
        wal.ring().tip(),
        e,
        &[(3, 2, b"xyz".to_vec())],
    );
    let data = wal.ring().regions().data;
    unsafe { *data.addr.add((tail % CAP) as usize + 65) ^= 1 };
    let req = AdoptRequest {
        from_lsn: tail,
        to_lsn: buf.end_lsn(),
        entries: 1,
        last: last(2, 3),
    };
    let err = wal.ring_mut().adopt(req).unwrap_err();
    assert!(matches!(
        err,
        WalError::Adopt(AdoptError::Rejected {
            reason: Invalid::CrcMismatch { .. },
            ..
        })
    ));
    assert_eq!(wal.ring().next_index(), 3);
}

#[test]
fn adoption_across_the_end_of_the_area() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
    // Fill most of the first lap locally, purge it, then adopt a batch that
    // wraps.
    append_n(wal.ring_mut(), e, 1, 60, |_| 16_000);
    wal.purge(LogPos { term: 1, index: 59 }).unwrap();
    let tail = wal.ring().tail_lsn();
    let entries: Vec<_> = (60..70).map(|i| (i, 1, payload(i, 9000))).collect();
    let buf = remote_write(wal.ring(), tail, wal.ring().tip(), e, &entries);
    assert_eq!(buf.segments().len(), 2, "the batch wraps");
    wal.ring_mut()
        .adopt(AdoptRequest {
            from_lsn: tail,
            to_lsn: buf.end_lsn(),
            entries: 10,
            last: last(1, 69),
        })
        .unwrap();
    assert_log_eq!(contents(wal.ring()), entries);
    drop(wal);
    assert_log_eq!(contents(open(dir.path()).ring()), entries);
}

#[test]
fn truncated_entries_do_not_come_back_after_a_crash() {
    let dir = tempdir();
    let e1 = epoch(1, 1);
    let e2 = epoch(2, 2);
    {
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e1);
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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
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
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e);
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
    let ring = OpenOptions::new()
        .write(true)
        .open(ring_path(dir.path()))
        .unwrap();
    ring.write_all_at(&[0xFF], 30).unwrap();
    assert!(matches!(
        open_with(dir.path(), &config(1)),
        Err(WalError::Layout { .. })
    ));
    // A ring file of the wrong size.
    let dir2 = tempdir();
    drop(open(dir2.path()));
    let ring = OpenOptions::new()
        .write(true)
        .open(ring_path(dir2.path()))
        .unwrap();
    ring.set_len(CONTROL_BLOCK_BYTES as u64 + CAP / 2).unwrap();
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
    let e = epoch(1, 1);
    let lsn;
    {
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e);
        append_n(wal.ring_mut(), e, 1, 20, |_| 200);
        wal.ring_mut().sync_and_ack(19).unwrap();
        lsn = wal.ring().read(19).unwrap().lsn;
    }
    let clean = check(dir.path()).unwrap();
    assert_eq!(clean.entries, 20);
    assert!(!clean.corrupt_in_acknowledged_range());
    assert!(format!("{clean}").contains("index 0..=19"));
    // Flip a payload bit of the last (acknowledged) entry.
    let ring = OpenOptions::new()
        .read(true)
        .write(true)
        .open(ring_path(dir.path()))
        .unwrap();
    let at = CONTROL_BLOCK_BYTES as u64 + lsn + 100;
    let mut b = [0u8];
    ring.read_exact_at(&mut b, at).unwrap();
    ring.write_all_at(&[b[0] ^ 8], at).unwrap();
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

#[test]
fn an_unacknowledged_torn_tail_is_not_corruption() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let lsn;
    {
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e);
        append_n(wal.ring_mut(), e, 1, 20, |_| 200);
        wal.ring_mut().sync_and_ack(18).unwrap();
        lsn = wal.ring().read(19).unwrap().lsn;
    }
    let ring = OpenOptions::new()
        .write(true)
        .open(ring_path(dir.path()))
        .unwrap();
    ring.write_all_at(&[0u8; 100], CONTROL_BLOCK_BYTES as u64 + lsn + 150)
        .unwrap();
    let report = check(dir.path()).unwrap();
    assert_eq!(report.damage, Damage::TornTail);
    assert!(!report.corrupt_in_acknowledged_range());
    let wal = open(dir.path());
    assert_eq!(wal.ring().last_log(), last(1, 18));
    assert!(!wal.recovery().corrupt_inside());
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

#[test]
fn a_log_never_purged_may_start_at_any_index() {
    let dir = tempdir();
    let e = epoch(2, 1);
    {
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e);
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
fn prepared_adoptions_are_readable_and_commit_only_if_nothing_moved() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open(dir.path());
    take_fence(wal.ring(), e);
    let entries: Vec<_> = (0..4).map(|i| (i, 1, payload(i, 100))).collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::after(None), e, &entries);
    let request = AdoptRequest {
        from_lsn: 0,
        to_lsn: buf.end_lsn(),
        entries: 4,
        last: last(1, 3),
    };
    let prepared = wal.ring().prepare_adoption(request).unwrap();
    assert_eq!(prepared.len(), 4);
    let seen: Vec<_> = wal
        .ring()
        .prepared_records(&prepared)
        .map(|r| (r.index, r.term, r.payload.to_vec()))
        .collect();
    assert_log_eq!(seen, entries);
    assert_eq!(wal.ring().next_index(), 0, "preparing adopts nothing");
    // The fence moves before the commit: refused.
    take_fence(wal.ring(), epoch(2, 3));
    let err = wal
        .ring_mut()
        .commit_adoption(prepared.clone())
        .unwrap_err();
    assert!(
        matches!(err, WalError::Adopt(AdoptError::Rejected { .. })),
        "{err}"
    );
    assert_eq!(wal.ring().next_index(), 0);
    // The log moves before the commit: refused.
    let e2 = epoch(2, 3);
    wal.ring_mut()
        .append(
            e2,
            &[EntryRef {
                term: 2,
                index: 0,
                payload: b"local",
            }],
        )
        .unwrap();
    assert!(wal.ring_mut().commit_adoption(prepared).is_err());
    assert_eq!(wal.ring().next_index(), 1);
}

#[test]
fn a_log_that_began_anywhere_can_be_anchored_right_before_its_first_entry() {
    let dir = tempdir();
    let e = epoch(3, 1);
    {
        let mut wal = open(dir.path());
        take_fence(wal.ring(), e);
        append_n_from(wal.ring_mut(), e, 2, 7, 3);
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

fn append_n_from(ring: &mut ringraft_wal::Ring, e: Epoch, term: u64, first: u64, n: u64) {
    for index in first..first + n {
        let p = payload(index, 10);
        ring.append(
            e,
            &[EntryRef {
                term,
                index,
                payload: &p,
            }],
        )
        .unwrap();
    }
}
