//! `Wal::open` over a crafted data directory (valid CRCs where the input
//! asks for them): it must open or refuse, never panic or hang; what it
//! opens must agree with the offline checker, be readable, recover the same
//! way twice, and recover what it appends next.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_wal::layout::{MAX_NODE_ID, MAX_TERM};
use ringraft_wal::record::EncodeError;
use ringraft_wal::{EntryRef, Epoch, LayoutError, Recovery, Wal, WalError, check};
use ringraft_wal_fuzz::{DirInput, ring_dir_of, scratch_dir};

/// What must not change when the same files are recovered again.
fn summary(recovery: &Recovery) -> impl PartialEq + std::fmt::Debug {
    (
        recovery.first_index,
        recovery.last,
        recovery.entries,
        recovery.head_lsn,
        recovery.tail_lsn,
        recovery.acked,
        recovery.stop,
        recovery.damage,
    )
}

/// The incarnation has no successor: a second open is refused, as it must.
fn out_of_incarnations(err: &WalError) -> bool {
    matches!(
        err,
        WalError::Layout {
            source: LayoutError::OutOfRange {
                field: "incarnation",
                ..
            },
            ..
        }
    )
}

fuzz_target!(|input: &[u8]| {
    let dir = scratch_dir();
    let written = DirInput::parse(input).write_to(dir);
    let config = written.config;
    let checked = check(dir);
    let Ok(wal) = Wal::open(dir, &ring_dir_of(dir), &config) else {
        return;
    };
    let recovery = *wal.recovery();
    if let Ok(report) = &checked {
        assert_eq!(
            (report.first_index, report.last, report.entries),
            (recovery.first_index, recovery.last, recovery.entries),
            "check and open disagree"
        );
        assert_eq!(
            (report.end_lsn, report.stop, report.damage),
            (recovery.tail_lsn, recovery.stop, recovery.damage),
            "check and open disagree"
        );
    }
    let ring = wal.ring();
    assert!(ring.first_index() <= ring.next_index());
    assert!(ring.head_lsn() <= ring.tail_lsn());
    assert!(ring.tail_lsn() <= ring.window_end());
    for index in ring.first_index()..ring.next_index() {
        if let Err(err) = ring.read(index) {
            panic!("recovered entry {index} is unreadable: {err}");
        }
    }
    drop(wal);

    // The same files recover the same log.
    let mut wal = match Wal::open(dir, &ring_dir_of(dir), &config) {
        Ok(wal) => wal,
        Err(err) if out_of_incarnations(&err) => return,
        Err(err) => panic!("opened once, then refused: {err}"),
    };
    assert_eq!(summary(wal.recovery()), summary(&recovery));

    // What the ring appends, it recovers (after the entries it had).
    let ring = wal.ring();
    let fence = ring.fence();
    let last_term = ring.tip().last_term;
    let term = fence.term().max(last_term) + 1;
    if term > MAX_TERM || config.node_id > MAX_NODE_ID {
        return;
    }
    let epoch = Epoch::new(term, config.node_id).expect("in range");
    ring.compare_exchange_fence(fence, epoch)
        .expect("the fence moves upward");
    let index = ring.next_index();
    let before = ring.last_log();
    let appended = wal.ring_mut().append(
        epoch,
        &[EntryRef {
            term,
            index,
            payload: b"fuzz",
        }],
    );
    match appended {
        Ok(_) => {}
        Err(
            WalError::RingFull { .. }
            | WalError::LsnSpaceExhausted { .. }
            | WalError::Encode(EncodeError::IndexOutOfRange { .. }),
        ) => return,
        Err(err) => panic!("append after recovery to {before:?}: {err}"),
    }
    wal.ring_mut().sync().expect("sync");
    drop(wal);
    let wal = match Wal::open(dir, &ring_dir_of(dir), &config) {
        Ok(wal) => wal,
        Err(err) if out_of_incarnations(&err) => return,
        Err(err) => panic!("appended, then refused: {err}"),
    };
    let ring = wal.ring();
    assert_eq!(ring.first_index(), recovery.first_index.min(index));
    let entry = ring
        .read(index)
        .unwrap_or_else(|err| panic!("the appended entry {index} is not recovered: {err}"));
    assert_eq!((entry.term, entry.payload), (term, &b"fuzz"[..]));
    for earlier in ring.first_index()..index {
        ring.read(earlier)
            .unwrap_or_else(|err| panic!("entry {earlier} is lost after an append: {err}"));
    }
});
