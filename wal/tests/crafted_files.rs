//! A data directory's files are outside input (issue 10, item 6): crafted
//! ring and metadata files, with valid CRCs, whose words would overflow,
//! misalign or hang the readers. Each is refused with an error naming the
//! file and the field, or read correctly, in debug and release builds alike.
//!
//! The fuzz targets in `wal/fuzz` found these; each test here pins one
//! finding and runs in the ordinary `cargo test`.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use ringraft_wal::layout::{CONTROL_BLOCK_BYTES, FENCE_OFFSET, MAX_LSN};
use ringraft_wal::meta::META_FILE;
use ringraft_wal::record::RecordHeader;
use ringraft_wal::recovery::{ScanInput, scan};
use ringraft_wal::ring::RING_FILE;
use ringraft_wal::{
    AdoptError, AdoptRequest, Damage, EntryRef, Epoch, Geometry, Invalid, LogPos, Meta, PurgePoint,
    RecordKind, RingHeader, Wal, WalError, check,
};

/// A data directory with a fresh, empty log of node 1.
fn fresh_dir() -> TestDir {
    let dir = tempdir();
    drop(open(dir.path()));
    dir
}

/// Overwrites the metadata file with `meta`, CRC included, bypassing
/// `Meta::store`'s checks: what a crafted file holds.
fn write_meta(dir: &Path, meta: Meta) {
    std::fs::write(dir.join(META_FILE), meta.encode()).unwrap();
}

fn with_purge_point(dir: &Path, term: u64, index: u64, next_lsn: u64) {
    // The ring is scanned from its head word (shared memory; the segments
    // hold what lies before it): a crafted start goes there too.
    ring_file(dir)
        .write_all_at(
            &next_lsn.to_le_bytes(),
            ringraft_wal::layout::HEAD_OFFSET as u64,
        )
        .unwrap();
    write_meta(
        dir,
        Meta {
            purged: Some(PurgePoint {
                log: LogPos { term, index },
                next_lsn,
            }),
            ..Meta::new(0xC0FFEE, 1)
        },
    );
}

/// Writes a sealed record header (and `payload`) at logical `lsn`.
fn put_record(dir: &Path, mut header: RecordHeader, payload: &[u8]) {
    let sealed = header.seal(payload);
    let at = CONTROL_BLOCK_BYTES as u64 + header.lsn % CAP;
    let file = ring_file(dir);
    file.write_all_at(&sealed, at).unwrap();
    file.write_all_at(payload, at + 64).unwrap();
}

fn set_fence(dir: &Path, fence: Epoch) {
    ring_file(dir)
        .write_all_at(&fence.0.to_le_bytes(), FENCE_OFFSET as u64)
        .unwrap();
}

/// Asserts that `result` is a refusal whose message names `field`.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, WalError>, field: &str) {
    match result {
        Ok(value) => panic!("accepted a file whose {field} is out of range: {value:?}"),
        Err(err) => {
            let text = err.to_string();
            assert!(
                text.contains(field),
                "error does not name `{field}`: {text}"
            );
            assert!(
                text.contains(META_FILE) || text.contains(RING_FILE),
                "error does not name the file: {text}"
            );
        }
    }
}

/// Issue 10, item 6: a purge point with `next_lsn = 0xFFFFFFFFFFFFFFC0`
/// overflowed `start_lsn + capacity` in the recovery scan (a panic in
/// debug; in release a nonsensical log with head and tail at 2^64 − 64).
#[test]
fn a_purge_point_at_the_end_of_the_lsn_space_is_refused() {
    let dir = fresh_dir();
    with_purge_point(dir.path(), 1, 5, 0xFFFF_FFFF_FFFF_FFC0);
    assert_refused(check(dir.path()), "purged next_lsn");
    assert_refused(open_with(dir.path(), &config(1)), "purged next_lsn");
}

/// Issue 10, item 6: a purge index of `u64::MAX` overflowed
/// `ChainTip::after` and the ring's `first_index` (`index + 1`).
#[test]
fn a_purge_index_of_u64_max_is_refused() {
    let dir = fresh_dir();
    with_purge_point(dir.path(), 1, u64::MAX, 0);
    assert_refused(check(dir.path()), "purged index");
    assert_refused(open_with(dir.path(), &config(1)), "purged index");
}

/// Issue 10, item 6: a ring header with incarnation `u64::MAX` (valid CRC)
/// overflowed `incarnation += 1` at open (in release: incarnation 0, so a
/// leader would not see a new incarnation). The offline checker only reads
/// it and reports it.
#[test]
fn an_incarnation_that_cannot_be_bumped_is_refused() {
    let dir = fresh_dir();
    let header = RingHeader {
        capacity: CAP,
        cluster_id: 0xC0FFEE,
        node_id: 1,
        incarnation: u64::MAX,
    };
    ring_file(dir.path())
        .write_all_at(&header.encode(), 0)
        .unwrap();
    assert_eq!(check(dir.path()).unwrap().header.incarnation, u64::MAX);
    assert_refused(open_with(dir.path(), &config(1)), "incarnation");
}

/// The record of the two tests below: an entry of index `u64::MAX` under
/// `e` at lsn 0, with a 3-byte payload (`b"abc"`).
fn entry_of_index_u64_max(e: Epoch) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Entry,
        payload_len: 3,
        lsn: 0,
        term: 1,
        index: u64::MAX,
        prev_term: 0,
        epoch: e,
        crc: 0,
    }
}

/// Issue 10, item 6: a record with index `u64::MAX` (valid CRC, first
/// record of a log that was never purged, which may start at any index)
/// overflowed `ChainTip::advance` (in release: `first_index` u64::MAX and
/// `next_index` 0). It is not a record of the log: the scan stops there.
#[test]
fn a_record_with_index_u64_max_ends_the_recovered_log() {
    let dir = fresh_dir();
    let e = epoch(1, 1);
    set_fence(dir.path(), e);
    put_record(dir.path(), entry_of_index_u64_max(e), b"abc");
    let report = check(dir.path()).unwrap();
    assert_eq!(report.entries, 0, "{report}");
    assert_eq!(report.stop.map(|s| s.lsn), Some(0));
    let wal = open_with(dir.path(), &config(1)).unwrap();
    assert_eq!(wal.recovery().entries, 0);
    assert_eq!(wal.ring().next_index(), 0);
    assert_eq!(wal.ring().first_index(), 0);
    assert_eq!(wal.ring().tail_lsn(), 0);
}

/// Issue 10, item 6: the same record written by the fence holder and
/// named by its control message went through the same validator during
/// adoption; it must be rejected like any invalid record, not overflow.
#[test]
fn adoption_rejects_a_record_with_index_u64_max() {
    let dir = tempdir();
    let mut wal = open(dir.path());
    let result = adopt_one(&mut wal, entry_of_index_u64_max(epoch(1, 1)), b"abc");
    assert!(
        matches!(
            result,
            Err(WalError::Adopt(AdoptError::Rejected { lsn: 0, .. }))
        ),
        "{result:?}"
    );
    assert_eq!(wal.ring().next_index(), 0);
    assert_eq!(wal.ring().tail_lsn(), 0);
}

/// Issue 10, item 6: a wrap marker in the last lap of the lsn space
/// overflowed `Geometry::next_lap` (debug: a panic; release: the scan went
/// on from lsn 0 and `well_formed_beyond` walked ~2^58 lines, a hang). The
/// purge point that leads there lies beyond the lsn space a ring may use.
#[test]
fn a_wrap_marker_in_the_last_lap_of_the_lsn_space_neither_hangs_nor_panics() {
    let dir = fresh_dir();
    let e = epoch(1, 1);
    set_fence(dir.path(), e);
    let start = 0u64.wrapping_sub(CAP + 64);
    with_purge_point(dir.path(), 1, 10, start);
    let wrap = |lsn: u64| RecordHeader {
        kind: RecordKind::Wrap,
        payload_len: 0,
        lsn,
        term: 1,
        index: 11,
        prev_term: 1,
        epoch: e,
        crc: 0,
    };
    // One wrap marker on the last line of the second-to-last lap, another
    // at the start of the last lap, whose next lap starts at 2^64.
    put_record(dir.path(), wrap(start), &[]);
    put_record(dir.path(), wrap(start + 64), &[]);
    assert_refused(check(dir.path()), "purged next_lsn");
    assert_refused(open_with(dir.path(), &config(1)), "purged next_lsn");
}

/// Issue 10, item 6: an unaligned purge point (`next_lsn` 1 or 0xFFFFF) was
/// refused by `Ring::open` but crashed the offline checker (`ringraft wal
/// check`) with a slice index out of range, in release too.
#[test]
fn an_unaligned_purge_point_is_refused_by_the_checker_too() {
    for next_lsn in [1, 0xFFFFF] {
        let dir = fresh_dir();
        with_purge_point(dir.path(), 1, 5, next_lsn);
        assert_refused(check(dir.path()), "purged next_lsn");
        assert_refused(open_with(dir.path(), &config(1)), "purged next_lsn");
    }
}

/// Issue 10, item 6: recovery time was quadratic in the damage. With every
/// line after the break holding a header with good magic and lsn, the
/// largest allowed length and a bad CRC, the search for well-formed records
/// beyond the break checksummed up to capacity/2 bytes per line: ~cap²/128
/// bytes (98 ms at 1 MiB, ~400 s at 64 MiB, ~29 h at 1 GiB). The work is
/// counted, not timed: it must stay below 6 × capacity, and the verdict
/// must not change.
#[test]
fn recovery_work_is_linear_in_the_capacity_whatever_the_tail_holds() {
    let e = epoch(1, 1);
    let mut area = vec![0u8; CAP as usize];
    for physical in (0..CAP).step_by(64) {
        let header = RecordHeader {
            kind: RecordKind::Entry,
            // The largest length the loosest geometry allows here.
            payload_len: (CAP / 2 - 64).min(CAP - physical - 64) as u32,
            lsn: physical,
            term: 1,
            index: 0,
            prev_term: 0,
            epoch: e,
            crc: 0xBAD,
        };
        let at = physical as usize;
        area[at..at + 64].copy_from_slice(&header.encode());
    }
    let report = scan(
        &area,
        ScanInput {
            geometry: Geometry::loosest(CAP),
            start_lsn: 0,
            anchor: None,
            fence: e,
            acked: None,
        },
    );
    assert!(report.entries.is_empty());
    assert!(matches!(
        report.stop.map(|s| s.reason),
        Some(Invalid::CrcMismatch { .. })
    ));
    assert_eq!(report.damage, Damage::TornTail);
    assert!(
        report.checksummed_bytes < 6 * CAP,
        "recovery checksummed {} bytes of a {CAP}-byte ring",
        report.checksummed_bytes
    );
}

/// Issue 10, item 6 (the other side of the lsn bound): a log that reaches
/// the end of the lsn space is recovered up to it, and a write beyond it is
/// a clear error that waiting cannot cure, never a wrap to lsn 0.
#[test]
fn the_end_of_the_lsn_space_is_a_clear_error_not_a_wrap() {
    let dir = fresh_dir();
    let e = epoch(1, 1);
    set_fence(dir.path(), e);
    with_purge_point(dir.path(), 1, 9, MAX_LSN - 128);
    let entry = |index| EntryRef {
        term: 1,
        index,
        payload: &[],
    };
    {
        let mut wal = open_with(dir.path(), &config(1)).unwrap();
        let ring = wal.ring_mut();
        assert_eq!(ring.free_bytes(), 128);
        ring.append(e, &[entry(10), entry(11)]).unwrap();
        assert_eq!(ring.tail_lsn(), MAX_LSN);
        let err = ring.append(e, &[entry(12)]).unwrap_err();
        assert!(matches!(err, WalError::LsnSpaceExhausted { .. }), "{err}");
        assert!(!err.is_retryable());
        ring.sync_and_ack(11).unwrap();
    }
    let report = check(dir.path()).unwrap();
    assert_eq!((report.entries, report.end_lsn), (2, MAX_LSN));
    assert_eq!(report.damage, Damage::None);
    let wal = open_with(dir.path(), &config(1)).unwrap();
    assert_eq!(wal.ring().last_log(), last(1, 11));
    assert_eq!(wal.ring().tail_lsn(), MAX_LSN);
    assert_eq!(wal.recovery().damage, Damage::None);
}

/// Issue 10, item 6: the control words that hold `index + 1` are checked
/// like every other word read from the file: an acknowledged watermark or a
/// commit hint above MAX_INDEX is refused (before, a watermark of 2^64 − 2
/// made the node believe it had acknowledged an index no log can reach).
#[test]
fn index_words_of_the_control_block_are_range_checked() {
    use ringraft_wal::layout::{ACKED_OFFSET, COMMIT_OFFSET};
    for (offset, field) in [
        (ACKED_OFFSET, "acknowledged watermark"),
        (COMMIT_OFFSET, "commit hint"),
    ] {
        let dir = fresh_dir();
        ring_file(dir.path())
            .write_all_at(&u64::MAX.to_le_bytes(), offset as u64)
            .unwrap();
        assert_refused(check(dir.path()), field);
        assert_refused(open_with(dir.path(), &config(1)), field);
    }
    // A leader's hint beyond any index is stored as the largest index.
    let dir = fresh_dir();
    let wal = open(dir.path());
    wal.ring().set_commit_hint(Some(u64::MAX));
    assert_eq!(
        wal.ring().commit_hint(),
        Some(ringraft_wal::layout::MAX_INDEX)
    );
    drop(wal);
    assert!(check(dir.path()).is_ok());
}

/// Found by the `open` fuzz target: the first record of a log that was
/// never purged may carry any index and any prev_term, and recovery took one
/// whose prev_term (the term of the entry before it) was above its own term;
/// `Ring::read` then refused the entry it had just recovered ("term 1 at
/// index 0 does not continue term 17071882152716533760"). Such a record is
/// no Raft entry: recovery and adoption stop at it.
#[test]
fn a_first_record_whose_prev_term_is_above_its_term_is_not_recovered() {
    let e = epoch(3, 1);
    let record = RecordHeader {
        kind: RecordKind::Entry,
        payload_len: 2,
        lsn: 0,
        term: 1,
        index: 0,
        prev_term: 17_071_882_152_716_533_760,
        epoch: e,
        crc: 0,
    };
    let dir = fresh_dir();
    set_fence(dir.path(), e);
    put_record(dir.path(), record, b"ab");
    let wal = open_with(dir.path(), &config(1)).unwrap();
    for index in wal.ring().first_index()..wal.ring().next_index() {
        let read = wal.ring().read(index);
        assert!(read.is_ok(), "recovered entry {index} unreadable: {read:?}");
    }
    assert_eq!(wal.recovery().entries, 0);
    assert_eq!(check(dir.path()).unwrap().entries, 0);
    drop(wal);

    // The same record from the fence holder is not adopted.
    let dir = tempdir();
    let mut wal = open(dir.path());
    let result = adopt_one(&mut wal, record, b"ab");
    assert!(
        matches!(
            result,
            Err(WalError::Adopt(AdoptError::Rejected {
                reason: Invalid::TermRegression { .. },
                ..
            }))
        ),
        "{result:?}"
    );
}

/// Found by the `open` fuzz target: recovery checks records against the
/// loosest geometry (any record up to half the ring), so that lowering the
/// configured record limit never hides records written under a higher one,
/// but `Ring::read` checked them against the configured limit and refused
/// entries recovery had just taken ("bad length: payload of 458762 bytes
/// ... (limit 65536)"). A node restarted with a lower `max_record_bytes`
/// could not serve its own log.
#[test]
fn entries_written_under_a_higher_record_limit_stay_readable() {
    let dir = tempdir();
    let e = epoch(1, 1);
    let big = ringraft_wal::RingConfig {
        max_record_bytes: 4 * MAX_RECORD,
        ..config(1)
    };
    {
        let mut wal = open_with(dir.path(), &big).unwrap();
        take_fence(wal.ring(), e);
        append_n(wal.ring_mut(), e, 1, 3, |i| {
            (i as usize + 2) * MAX_RECORD as usize
        });
        wal.ring_mut().sync_and_ack(2).unwrap();
    }
    let wal = open_with(dir.path(), &config(1)).unwrap();
    assert_eq!(wal.recovery().entries, 3);
    for index in 0..3 {
        let entry = wal.ring().read(index);
        assert!(entry.is_ok(), "entry {index}: {entry:?}");
        assert_eq!(
            entry.unwrap().payload,
            payload(index, (index as usize + 2) * MAX_RECORD as usize)
        );
    }
}

/// Plays the fence holder (of `header.epoch`): writes one record of
/// `payload` (at most 64 bytes) at lsn 0 of an empty ring, as a remote
/// WRITE would, and asks to adopt it as the entry its header names.
fn adopt_one(
    wal: &mut Wal,
    mut header: RecordHeader,
    payload: &[u8],
) -> ringraft_wal::Result<ringraft_wal::Extended> {
    assert!(payload.len() <= 64);
    take_fence(wal.ring(), header.epoch);
    let sealed = header.seal(payload);
    let data = wal.ring().regions().data;
    // SAFETY: in bounds of the data area (two lines); the test plays the
    // remote writer and is the only one writing.
    unsafe {
        std::ptr::copy_nonoverlapping(sealed.as_ptr(), data.addr, 64);
        std::ptr::copy_nonoverlapping(payload.as_ptr(), data.addr.add(64), payload.len());
    }
    wal.ring_mut().adopt(AdoptRequest {
        from_lsn: 0,
        to_lsn: 128,
        entries: 1,
        last: Some(LogPos {
            term: header.term,
            index: header.index,
        }),
    })
}
