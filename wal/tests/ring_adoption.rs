//! Adoption of records a remote writer put into the ring, through the public
//! API.

mod common;

use common::*;
use ringraft_wal::{
    AdoptError, AdoptRequest, ChainTip, EntryRef, Invalid, LogPos, Wal, WalError, WriteBuffer,
};

#[test]
fn adoption_takes_a_remote_writers_records_in_place() {
    let dir = tempdir();
    let leader = epoch(1, 2);
    let mut wal = open_fenced(dir.path(), leader);
    let entries: Vec<_> = (0..20)
        .map(|i| (i, 1, payload(i, (i * 300) as usize)))
        .collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), leader, &entries);
    let out = wal.ring_mut().adopt(adopt_request(&buf, &entries)).unwrap();
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
    let mut wal = open_fenced(dir.path(), old);
    // The old leader writes, but a new leader takes the fence first.
    let stale = [(0, 1, b"stale".to_vec())];
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), old, &stale);
    take_fence(wal.ring(), new);
    let err = wal
        .ring_mut()
        .adopt(adopt_request(&buf, &stale))
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
    let fresh = [(0, 2, b"fresh".to_vec())];
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), new, &fresh);
    wal.ring_mut().adopt(adopt_request(&buf, &fresh)).unwrap();
    assert_eq!(wal.ring().read(0).unwrap().payload, b"fresh");
}

#[test]
fn adoption_checks_position_range_and_metadata() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open_fenced(dir.path(), e);
    let entries: Vec<_> = (0..3).map(|i| (i, 1, payload(i, 10))).collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::default(), e, &entries);
    let end = buf.end_lsn();
    let good = adopt_request(&buf, &entries);
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

/// Asks `wal` to adopt `entries`, written as `buf`, and returns why it
/// rejected them; fails if it did not reject them.
fn rejection(wal: &mut Wal, buf: &WriteBuffer, entries: &[(u64, u64, Vec<u8>)]) -> Invalid {
    match wal.ring_mut().adopt(adopt_request(buf, entries)) {
        Err(WalError::Adopt(AdoptError::Rejected { reason, .. })) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn adoption_rejects_torn_and_chain_breaking_records() {
    let dir = tempdir();
    let e = epoch(2, 2);
    let mut wal = open_fenced(dir.path(), e);
    append_n(wal.ring_mut(), e, 2, 3, |_| 10);
    let tail = wal.ring().tail_lsn();
    // prev_term 1 after an entry of term 2: a log-matching violation.
    let bad_tip = ChainTip {
        next_index: 3,
        last_term: 1,
        epoch: e,
        unanchored: false,
    };
    let chain_breaking = [(3, 2, b"x".to_vec())];
    let buf = remote_write(wal.ring(), tail, bad_tip, e, &chain_breaking);
    let reason = rejection(&mut wal, &buf, &chain_breaking);
    assert!(
        matches!(reason, Invalid::PrevTermMismatch { .. }),
        "{reason}"
    );
    // A torn write: right chain, one payload byte flipped.
    let torn = [(3, 2, b"xyz".to_vec())];
    let buf = remote_write(wal.ring(), tail, wal.ring().tip(), e, &torn);
    let data = wal.ring().regions().data;
    unsafe { *data.addr.add((tail % CAP) as usize + 65) ^= 1 };
    let reason = rejection(&mut wal, &buf, &torn);
    assert!(matches!(reason, Invalid::CrcMismatch { .. }), "{reason}");
    assert_eq!(wal.ring().next_index(), 3);
}

#[test]
fn adoption_across_the_end_of_the_area() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open_fenced(dir.path(), e);
    // Fill most of the first lap locally, purge it, then adopt a batch that
    // wraps.
    append_n(wal.ring_mut(), e, 1, 60, |_| 16_000);
    wal.purge(LogPos { term: 1, index: 59 }).unwrap();
    let tail = wal.ring().tail_lsn();
    let entries: Vec<_> = (60..70).map(|i| (i, 1, payload(i, 9000))).collect();
    let buf = remote_write(wal.ring(), tail, wal.ring().tip(), e, &entries);
    assert_eq!(buf.segments().len(), 2, "the batch wraps");
    wal.ring_mut().adopt(adopt_request(&buf, &entries)).unwrap();
    assert_log_eq!(contents(wal.ring()), entries);
    drop(wal);
    assert_log_eq!(contents(open(dir.path()).ring()), entries);
}

#[test]
fn prepared_adoptions_are_readable_and_commit_only_if_nothing_moved() {
    let dir = tempdir();
    let e = epoch(1, 2);
    let mut wal = open_fenced(dir.path(), e);
    let entries: Vec<_> = (0..4).map(|i| (i, 1, payload(i, 100))).collect();
    let buf = remote_write(wal.ring(), 0, ChainTip::after(None), e, &entries);
    let prepared = wal
        .ring()
        .prepare_adoption(adopt_request(&buf, &entries))
        .unwrap();
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
