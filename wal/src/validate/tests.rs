//! Unit tests of the parent module: they drive its pure functions directly
//! on buffers in memory and must never touch a file or the clock.

use super::*;
use crate::record::{RecordEncoder, RecordSink};
use crate::test_area::{Area, CAP, entry, epoch, tip_after};

const GEO: Geometry = Geometry {
    capacity: CAP,
    max_payload_bytes: 4096,
};

/// An area holding entries 0..n of term 1 written under `e`, from lsn 0.
fn area_with(n: u64, e: Epoch) -> (Area, Vec<u64>) {
    let mut area = Area(vec![0; CAP as usize]);
    let mut enc = RecordEncoder::new(CAP, 0, ChainTip::default(), e).unwrap();
    let lsns = (0..n)
        .map(|i| enc.push(&mut area, &entry(1, i, b"payload")).unwrap().lsn)
        .collect();
    (area, lsns)
}

/// Validates the record at `lsn` of `area` as the first one a recovery
/// under `fence` reads (an empty chain before it).
fn recover_first(area: &[u8], lsn: u64, fence: Epoch) -> Result<Valid, Invalid> {
    validate_at(
        area,
        lsn,
        GEO,
        ChainTip::default(),
        Check::Recovery { fence },
    )
}

/// A hand-made header of `kind`: lsn 0, no payload, every chain field zero
/// and no CRC yet (`seal` sets it); tests set the fields they need.
fn zeroed_header(kind: RecordKind) -> RecordHeader {
    RecordHeader {
        kind,
        payload_len: 0,
        lsn: 0,
        term: 0,
        index: 0,
        prev_term: 0,
        epoch: Epoch::ZERO,
        crc: 0,
    }
}

#[test]
fn valid_records_pass_both_contexts() {
    let e = epoch(1, 1);
    let (area, lsns) = area_with(3, e);
    let mut tip = ChainTip::default();
    for (i, lsn) in lsns.iter().enumerate() {
        for check in [Check::Adoption { fence: e }, Check::Recovery { fence: e }] {
            let v = validate_at(&area.0, *lsn, GEO, tip, check).unwrap();
            assert_eq!(v.header.index, i as u64);
        }
        tip = validate_at(&area.0, *lsn, GEO, tip, Check::Recovery { fence: e })
            .unwrap()
            .tip;
    }
    assert_eq!(tip, tip_after(2, 1, e));
}

#[test]
fn zeroes_are_bad_magic_and_end_of_log() {
    let area = vec![0u8; CAP as usize];
    let err = recover_first(&area, 0, Epoch::ZERO).unwrap_err();
    assert_eq!(err, Invalid::BadMagic { found: 0 });
    assert!(err.is_end_of_log());
}

#[test]
fn stale_lap_is_lsn_mismatch() {
    let e = epoch(1, 1);
    let (area, _) = area_with(1, e);
    // The same physical bytes looked at one lap later.
    let err = recover_first(&area.0, CAP, e).unwrap_err();
    assert_eq!(
        err,
        Invalid::LsnMismatch {
            expected: CAP,
            found: 0
        }
    );
    assert!(err.is_end_of_log());
}

#[test]
fn torn_payload_is_crc_mismatch() {
    let e = epoch(1, 1);
    let (mut area, _) = area_with(1, e);
    area.0[64] ^= 0x40;
    let err = recover_first(&area.0, 0, e).unwrap_err();
    assert!(matches!(err, Invalid::CrcMismatch { .. }), "{err}");
    assert!(!err.is_end_of_log());
}

#[test]
fn oversized_and_straddling_lengths_are_bad_length() {
    let e = epoch(1, 1);
    let (mut area, _) = area_with(1, e);
    area.0[8..12].copy_from_slice(&5000u32.to_le_bytes());
    let err = recover_first(&area.0, 0, e).unwrap_err();
    assert!(matches!(
        err,
        Invalid::BadLength {
            payload_len: 5000,
            ..
        }
    ));
    // A header at the very end claiming a payload that runs off the end.
    let mut area = vec![0u8; CAP as usize];
    let lsn = CAP - 64;
    let mut header = RecordHeader {
        payload_len: 1,
        lsn,
        ..zeroed_header(RecordKind::Entry)
    };
    area[lsn as usize..].copy_from_slice(&header.seal(&[0]));
    let err = recover_first(&area, lsn, e).unwrap_err();
    assert!(matches!(err, Invalid::BadLength { physical, .. } if physical == lsn));
}

#[test]
fn malformed_header_with_good_crc_is_bad_header() {
    let e = epoch(1, 1);
    let (mut area, _) = area_with(1, e);
    area.0[4] = 7;
    let crc = {
        let h: [u8; 64] = area.0[..64].try_into().unwrap();
        record_crc(&h, &area.0[64..64 + 7])
    };
    area.0[60..64].copy_from_slice(&crc.to_le_bytes());
    let err = recover_first(&area.0, 0, e).unwrap_err();
    assert_eq!(err, Invalid::BadHeader(HeaderDefect::Kind(7)));
    // The same defect with a bad CRC reads as a torn write.
    area.0[60] ^= 1;
    let err = recover_first(&area.0, 0, e).unwrap_err();
    assert!(matches!(err, Invalid::CrcMismatch { .. }));
}

#[test]
fn index_gap_and_prev_term_mismatch() {
    let e = epoch(1, 1);
    let (area, lsns) = area_with(2, e);
    let fence = Check::Recovery { fence: e };
    let err = validate_at(&area.0, lsns[1], GEO, tip_after(1, 1, e), fence).unwrap_err();
    assert_eq!(
        err,
        Invalid::IndexGap {
            expected: 2,
            found: 1
        }
    );
    let err = validate_at(&area.0, lsns[1], GEO, tip_after(0, 0, e), fence).unwrap_err();
    assert_eq!(
        err,
        Invalid::PrevTermMismatch {
            index: 1,
            expected: 0,
            found: 1
        }
    );
}

#[test]
fn term_regression_and_term_above_epoch() {
    let mut area = Area(vec![0; CAP as usize]);
    // Hand-made record: term 1 after an entry of term 2 (prev_term says 2).
    let mut h = RecordHeader {
        term: 1,
        index: 5,
        prev_term: 2,
        epoch: epoch(3, 1),
        ..zeroed_header(RecordKind::Entry)
    };
    area.put_record(0, &h.seal(&[]), &[]);
    let tip = tip_after(4, 2, Epoch::ZERO);
    let err =
        validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: epoch(3, 1) }).unwrap_err();
    assert_eq!(
        err,
        Invalid::TermRegression {
            index: 5,
            previous: 2,
            found: 1
        }
    );
    h.term = 4;
    area.put_record(0, &h.seal(&[]), &[]);
    let err =
        validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: epoch(9, 1) }).unwrap_err();
    assert_eq!(
        err,
        Invalid::TermAboveEpoch {
            term: 4,
            epoch: epoch(3, 1)
        }
    );
}

#[test]
fn epoch_rules_by_context() {
    let old = epoch(1, 1);
    let new = epoch(2, 2);
    let (area, _) = area_with(1, old);
    let tip = ChainTip::default();
    // Adoption: only the fence holder's records.
    assert_eq!(
        validate_at(&area.0, 0, GEO, tip, Check::Adoption { fence: new }).unwrap_err(),
        Invalid::NotFenceHolder {
            fence: new,
            found: old
        }
    );
    // Recovery: older epochs are kept...
    assert!(validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: new }).is_ok());
    // ...epochs above the fence are not...
    assert_eq!(
        validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: Epoch::ZERO }).unwrap_err(),
        Invalid::EpochAboveFence {
            fence: Epoch::ZERO,
            found: old
        }
    );
    // ...nor epochs that go backwards along the chain.
    let tip = ChainTip { epoch: new, ..tip };
    assert_eq!(
        validate_at(&area.0, 0, GEO, tip, Check::Recovery { fence: new }).unwrap_err(),
        Invalid::EpochBelowPrevious {
            previous: new,
            found: old
        }
    );
}

#[test]
fn wrap_marker_validates_and_jumps_to_next_lap() {
    let e = epoch(1, 1);
    let mut area = Area(vec![0; CAP as usize]);
    let tip = tip_after(9, 1, e);
    let mut enc = RecordEncoder::new(CAP, CAP - 64, tip, e).unwrap();
    enc.push(&mut area, &entry(1, 10, b"x")).unwrap();
    let check = Check::Recovery { fence: e };
    let wrap = validate_at(&area.0, CAP - 64, GEO, tip, check).unwrap();
    assert_eq!(wrap.header.kind, RecordKind::Wrap);
    assert_eq!(wrap.next_lsn, CAP);
    assert_eq!(wrap.tip, tip);
    let entry = validate_at(&area.0, CAP, GEO, wrap.tip, check).unwrap();
    assert_eq!(entry.header.index, 10);
    // A wrap marker whose chain fields are off is rejected like an entry.
    let err = validate_at(&area.0, CAP - 64, GEO, tip_after(10, 1, e), check).unwrap_err();
    assert_eq!(
        err,
        Invalid::IndexGap {
            expected: 11,
            found: 10
        }
    );
}

#[test]
fn wrap_marker_with_payload_is_bad_length() {
    let mut area = Area(vec![0; CAP as usize]);
    let mut h = RecordHeader {
        payload_len: 1,
        ..zeroed_header(RecordKind::Wrap)
    };
    area.put_record(0, &h.seal(&[1]), &[1]);
    let err = recover_first(&area.0, 0, Epoch::ZERO).unwrap_err();
    assert!(matches!(err, Invalid::BadLength { limit: 0, .. }));
}

#[test]
fn an_unanchored_log_takes_any_first_index_then_is_strict() {
    let e = epoch(1, 1);
    let mut area = Area(vec![0; CAP as usize]);
    let mut enc = RecordEncoder::new(CAP, 0, ChainTip::after(None), e).unwrap();
    enc.push(&mut area, &entry(1, 40, b"x")).unwrap();
    enc.push(&mut area, &entry(1, 41, b"y")).unwrap();
    let check = Check::Recovery { fence: e };
    let first = validate_at(&area.0, 0, GEO, ChainTip::after(None), check).unwrap();
    assert_eq!(first.header.index, 40);
    assert!(!first.tip.unanchored);
    assert!(validate_at(&area.0, 128, GEO, first.tip, check).is_ok());
    // The same first record checked against an anchored chain fails.
    assert_eq!(
        validate_at(
            &area.0,
            0,
            GEO,
            ChainTip::after(Some(LogPos { term: 1, index: 9 })),
            check
        )
        .unwrap_err(),
        Invalid::IndexGap {
            expected: 10,
            found: 40
        }
    );
}

#[test]
fn geometry_helpers() {
    assert_eq!(GEO.physical(CAP + 64), 64);
    assert_eq!(GEO.next_lap(CAP - 64), Some(CAP));
    assert_eq!(GEO.next_lap(CAP), Some(2 * CAP));
    assert_eq!(GEO.next_lap(0), Some(CAP));
    // The last lap of the lsn space has no next lap.
    assert_eq!(GEO.next_lap(MAX_LSN - 2 * CAP), Some(MAX_LSN - CAP));
    assert_eq!(GEO.next_lap(MAX_LSN - CAP), Some(MAX_LSN));
    assert_eq!(GEO.next_lap(MAX_LSN), None);
    assert_eq!(GEO.next_lap(u64::MAX - 63), None);
    assert_eq!(GEO.window_end(0), CAP);
    assert_eq!(GEO.window_end(MAX_LSN - 64), MAX_LSN);
    assert_eq!(GEO.window_end(u64::MAX), MAX_LSN);
}

/// Issue 10, item 6: a record with index u64::MAX (valid CRC) overflowed
/// `ChainTip::advance`; indexes above MAX_INDEX are refused, in both
/// contexts, and MAX_INDEX itself is a valid index.
#[test]
fn indexes_above_max_index_are_refused() {
    let e = epoch(1, 1);
    for (index, ok) in [(MAX_INDEX, true), (MAX_INDEX + 1, false), (u64::MAX, false)] {
        let mut area = Area(vec![0; CAP as usize]);
        for kind in [RecordKind::Entry, RecordKind::Wrap] {
            let mut h = RecordHeader {
                term: 1,
                index,
                prev_term: 1,
                epoch: e,
                ..zeroed_header(kind)
            };
            area.put_record(0, &h.seal(&[]), &[]);
            for check in [Check::Adoption { fence: e }, Check::Recovery { fence: e }] {
                let result = validate_at(&area.0, 0, GEO, ChainTip::after(None), check);
                if ok {
                    assert!(result.is_ok(), "{index} {kind:?}: {result:?}");
                } else {
                    assert_eq!(result, Err(Invalid::IndexOutOfRange { index }), "{kind:?}");
                }
            }
        }
    }
}

/// A record whose end, or whose next lap, lies beyond the lsn space is
/// outside any window, not an overflow.
#[test]
fn records_beyond_the_lsn_space_are_outside_the_window() {
    let e = epoch(1, 1);
    let mut area = Area(vec![0; CAP as usize]);
    let lsn = MAX_LSN;
    let mut h = RecordHeader {
        lsn,
        epoch: e,
        ..zeroed_header(RecordKind::Wrap)
    };
    area.put_record(lsn, &h.seal(&[]), &[]);
    let check = Check::Recovery { fence: e };
    assert!(matches!(
        validate_at(&area.0, lsn, GEO, ChainTip::after(None), check),
        Err(Invalid::OutsideWindow { .. })
    ));
    h.kind = RecordKind::Entry;
    area.put_record(lsn, &h.seal(&[]), &[]);
    assert!(matches!(
        validate_at(&area.0, lsn, GEO, ChainTip::after(None), check),
        Err(Invalid::OutsideWindow { .. })
    ));
    // The last line before the end: an entry ends exactly at MAX_LSN.
    h.lsn = MAX_LSN - 64;
    area.put_record(h.lsn, &h.seal(&[]), &[]);
    let valid = validate_at(&area.0, h.lsn, GEO, ChainTip::after(None), check).unwrap();
    assert_eq!(valid.next_lsn, MAX_LSN);
}
