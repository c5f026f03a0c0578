//! Unit tests of the parent module: they drive its pure functions directly
//! on buffers in memory and must never touch a file or the clock.

use super::*;
use crate::test_area::{entry, tip_after};

fn header() -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Entry,
        payload_len: 5,
        lsn: 4096,
        term: 3,
        index: 17,
        prev_term: 2,
        epoch: Epoch::new(3, 1).unwrap(),
        crc: 0,
    }
}

#[test]
fn header_round_trips_with_crc() {
    let mut h = header();
    let bytes = h.seal(b"hello");
    let back = RecordHeader::decode(&bytes).unwrap();
    assert_eq!(back, h);
    assert_eq!(back.crc, record_crc(&bytes, b"hello"));
    assert_ne!(back.crc, record_crc(&bytes, b"hellp"));
}

#[test]
fn wrap_header_round_trips() {
    let mut h = header();
    h.kind = RecordKind::Wrap;
    h.payload_len = 0;
    let bytes = h.seal(&[]);
    assert_eq!(RecordHeader::decode(&bytes).unwrap(), h);
    assert_eq!(h.record_len(), 64);
}

#[test]
fn header_bytes_are_where_the_doc_says() {
    let mut h = header();
    let b = h.seal(b"hello");
    assert_eq!(&b[0..4], b"RRec");
    assert_eq!(b[4], 1);
    assert_eq!(b[5], 1);
    assert_eq!(le_u32(&b[8..]), 5);
    assert_eq!(le_u64(&b[16..]), 4096);
    assert_eq!(le_u64(&b[24..]), 3);
    assert_eq!(le_u64(&b[32..]), 17);
    assert_eq!(le_u64(&b[40..]), 2);
    assert_eq!(le_u64(&b[48..]), 3 << 16 | 1);
    assert_eq!(le_u32(&b[60..]), h.crc);
}

#[test]
fn decode_reports_each_defect() {
    let mut h = header();
    let good = h.seal(b"hello");
    let mut bad = good;
    bad[0] = 0;
    assert!(matches!(
        RecordHeader::decode(&bad),
        Err(HeaderDefect::Magic(_))
    ));
    let mut bad = good;
    bad[4] = 9;
    assert_eq!(RecordHeader::decode(&bad), Err(HeaderDefect::Kind(9)));
    let mut bad = good;
    bad[5] = 2;
    assert_eq!(RecordHeader::decode(&bad), Err(HeaderDefect::Version(2)));
    for offset in [6, 7, 12, 13, 14, 15, 56, 57, 58, 59] {
        let mut bad = good;
        bad[offset] = 1;
        assert_eq!(
            RecordHeader::decode(&bad),
            Err(HeaderDefect::Reserved),
            "{offset}"
        );
    }
}

#[test]
fn record_len_is_line_aligned() {
    assert_eq!(record_len(0), 64);
    assert_eq!(record_len(1), 128);
    assert_eq!(record_len(64), 128);
    assert_eq!(record_len(65), 192);
}

#[test]
fn place_wraps_only_when_straddling() {
    let cap = 1 << 20;
    assert_eq!(place(0, cap, 128), (None, 0));
    assert_eq!(place(cap - 128, cap, 128), (None, cap - 128));
    assert_eq!(place(cap - 64, cap, 128), (Some(cap - 64), cap));
    assert_eq!(place(3 * cap - 64, cap, 128), (Some(3 * cap - 64), 3 * cap));
    assert_eq!(span_end(cap - 64, cap, [64]), cap + 128);
    assert_eq!(span_end(0, cap, [0, 0, 1]), 64 + 64 + 128);
}

struct Collect(Vec<(u64, RecordHeader, Vec<u8>)>);
impl RecordSink for Collect {
    fn put_record(&mut self, lsn: u64, header: &[u8; 64], payload: &[u8]) {
        self.0
            .push((lsn, RecordHeader::decode(header).unwrap(), payload.to_vec()));
    }
}

#[test]
fn encoder_chains_records_and_wraps() {
    let cap = 1u64 << 20;
    let epoch = Epoch::new(4, 2).unwrap();
    let tip = tip_after(9, 3, Epoch::ZERO);
    let mut enc = RecordEncoder::new(cap, cap - 192, tip, epoch).unwrap();
    let mut sink = Collect(Vec::new());
    let a = enc.push(&mut sink, &entry(3, 10, b"a")).unwrap();
    assert_eq!(
        a,
        Placed {
            index: 10,
            term: 3,
            lsn: cap - 192,
            len: 128
        }
    );
    let b = enc.push(&mut sink, &entry(4, 11, &[7; 100])).unwrap();
    assert_eq!(
        b,
        Placed {
            index: 11,
            term: 4,
            lsn: cap,
            len: 192
        }
    );
    let seen: Vec<_> = sink
        .0
        .iter()
        .map(|(l, h, p)| (*l, h.kind, h.index, h.term, h.prev_term, p.len()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (cap - 192, RecordKind::Entry, 10, 3, 3, 1),
            (cap - 64, RecordKind::Wrap, 11, 3, 3, 0),
            (cap, RecordKind::Entry, 11, 4, 3, 100),
        ]
    );
    assert_eq!(enc.tip(), tip_after(11, 4, epoch));
    assert_eq!(enc.next_lsn(), cap + 192);
    // A record that ends exactly at the end of the area needs no wrap.
    let mut enc = RecordEncoder::new(cap, cap - 128, tip, epoch).unwrap();
    let mut sink = Collect(Vec::new());
    enc.push(&mut sink, &entry(3, 10, b"a")).unwrap();
    enc.push(&mut sink, &entry(3, 11, b"b")).unwrap();
    assert!(sink.0.iter().all(|(_, h, _)| h.kind == RecordKind::Entry));
    assert_eq!(sink.0[1].0, cap);
}

#[test]
fn encoder_refuses_broken_chains() {
    let epoch = Epoch::new(4, 2).unwrap();
    let tip = tip_after(9, 3, Epoch::new(3, 1).unwrap());
    let enc = RecordEncoder::new(1 << 20, 0, tip, epoch).unwrap();
    assert_eq!(
        enc.check(&entry(3, 11, b"")),
        Err(EncodeError::IndexGap {
            expected: 10,
            found: 11
        })
    );
    assert!(matches!(
        enc.check(&entry(2, 10, b"")),
        Err(EncodeError::TermRegression { .. })
    ));
    assert!(matches!(
        enc.check(&entry(5, 10, b"")),
        Err(EncodeError::TermAboveEpoch { .. })
    ));
    let low_term_tip = ChainTip {
        last_term: 1,
        ..tip
    };
    let old = RecordEncoder::new(1 << 20, 0, low_term_tip, Epoch::new(2, 9).unwrap()).unwrap();
    assert!(matches!(
        old.check(&entry(2, 10, b"")),
        Err(EncodeError::EpochRegression { .. })
    ));
    let big = vec![0u8; 1 << 20];
    assert!(matches!(
        enc.check(&entry(4, 10, &big)),
        Err(EncodeError::PayloadTooLarge { .. })
    ));
}

#[test]
fn write_buffer_splits_at_the_wrap() {
    let cap = 1u64 << 20;
    let epoch = Epoch::new(1, 1).unwrap();
    let tip = ChainTip::default();
    let mut enc = RecordEncoder::new(cap, cap - 192, tip, epoch).unwrap();
    let mut buf = WriteBuffer::new(cap, cap - 192).unwrap();
    enc.push(&mut buf, &entry(1, 0, b"x")).unwrap();
    enc.push(&mut buf, &entry(1, 1, &[1; 70])).unwrap();
    let segs = buf.segments();
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].physical, cap - 192);
    assert_eq!(segs[0].bytes.len(), 128 + 64, "record then wrap marker");
    assert_eq!(segs[1].physical, 0);
    assert_eq!(segs[1].bytes.len(), 192);
    assert_eq!(buf.end_lsn(), cap + 192);
    assert_eq!(buf.byte_len(), 384);
}

/// Issue 10, item 5: `RecordEncoder::new` asserted on the capacity and
/// the lsn, which a leader takes from a follower's grant: a bad grant
/// panicked the leader. Both constructors now refuse them with an error.
#[test]
fn a_bad_capacity_or_position_from_a_peer_is_an_error() {
    let tip = ChainTip::after(None);
    let epoch = Epoch::new(1, 1).unwrap();
    let max_lsn = crate::layout::MAX_LSN;
    for capacity in [0, 1, 3 << 20, 1 << 19, 1 << 41, u64::MAX] {
        assert_eq!(
            RecordEncoder::new(capacity, 0, tip, epoch).unwrap_err(),
            EncodeError::BadCapacity { capacity }
        );
        assert_eq!(
            WriteBuffer::new(capacity, 0).unwrap_err(),
            EncodeError::BadCapacity { capacity }
        );
    }
    for lsn in [1, 0xFFFFF, max_lsn + 64, u64::MAX - 63, u64::MAX] {
        assert_eq!(
            RecordEncoder::new(1 << 20, lsn, tip, epoch).unwrap_err(),
            EncodeError::BadLsn { lsn }
        );
        assert_eq!(
            WriteBuffer::new(1 << 20, lsn).unwrap_err(),
            EncodeError::BadLsn { lsn }
        );
    }
    assert!(RecordEncoder::new(1 << 40, max_lsn, tip, epoch).is_ok());
    assert!(WriteBuffer::new(1 << 40, max_lsn).is_ok());
}

/// Issue 10, item 6: an entry index of u64::MAX would overflow the
/// chain state (`index + 1`); the encoder refuses indexes above
/// MAX_INDEX and takes MAX_INDEX itself.
#[test]
fn the_encoder_refuses_indexes_above_max_index() {
    let epoch = Epoch::new(1, 1).unwrap();
    let mut enc = RecordEncoder::new(1 << 20, 0, ChainTip::after(None), epoch).unwrap();
    let mut sink = Collect(Vec::new());
    for index in [MAX_INDEX + 1, u64::MAX] {
        assert_eq!(
            enc.push(&mut sink, &entry(1, index, b"x")),
            Err(EncodeError::IndexOutOfRange { index })
        );
    }
    assert!(sink.0.is_empty());
    enc.push(&mut sink, &entry(1, MAX_INDEX, b"x")).unwrap();
    assert_eq!(enc.tip().next_index, MAX_INDEX + 1);
    assert_eq!(
        enc.check(&entry(1, MAX_INDEX + 1, b"x")),
        Err(EncodeError::IndexOutOfRange {
            index: MAX_INDEX + 1
        })
    );
}
