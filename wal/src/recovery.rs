//! Crash recovery as a pure scan of the data area.
//!
//! The scan starts at the purge point (the lsn and log id kept in the
//! metadata file), applies the chain rules in their recovery context, and
//! stops at the first record that breaks them: the tail beyond is garbage,
//! not an error. Then it tells *how* the log ended, because the replicator
//! must not let a node that forgot acknowledged entries vote (Alagappan et
//! al., "Protocol-Aware Recovery for Consensus-Based Storage", FAST'18):
//!
//! - [`Damage::None`]: the stop position holds no record of this lap (zeroes,
//!   or a record of an earlier lap): the log simply ends there;
//! - [`Damage::TornTail`]: a record of this lap is there but fails its CRC,
//!   the chain or the epoch rules: the last, unacknowledged write was cut;
//! - [`Damage::CorruptInside`]: the break lies below the acknowledged-index
//!   watermark, or well-formed records of the same writer (or a newer one)
//!   follow the break: something inside the log was lost.
//!
//! [`crate::ring`] runs this scan when it opens a ring, and
//! [`crate::check`](mod@crate::check) runs it offline. No I/O here.
//!
//! # Cost
//!
//! Linear in the capacity whatever the area holds: the scan checksums fewer
//! than 6 × capacity bytes ([`ScanReport::checksummed_bytes`]). The valid
//! records do not overlap, so checking them costs at most one capacity.
//! The search beyond the break must check every line that looks like a
//! record (good magic, lsn and length), and such candidates may overlap: a
//! fence holder can fill the tail with headers that each claim half the
//! ring and carry a bad CRC, which, checked one by one, cost capacity²/128
//! bytes (hours for a 1 GiB ring). So the search checksums candidates
//! directly while that stays within one capacity, and beyond it checksums
//! each line of the area once and derives every candidate's CRC from those
//! prefix checksums (`crate::crc`), in constant time per candidate and
//! with 4 bytes of memory per line. The verdict is the same either way.

use crate::crc::PrefixCrcs;
use crate::layout::{Epoch, LINE_BYTES, MAX_LSN};
use crate::record::{RECORD_CRC_OFFSET, RECORD_HEADER_BYTES, RecordKind, record_crc};
use crate::validate::{
    ChainTip, Check, Geometry, Invalid, LogPos, stored_crc, validate_at, validate_fields,
    validate_header,
};

/// Where a scan starts and what it checks against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanInput {
    /// Capacity and record size limit.
    pub geometry: Geometry,
    /// The purge point: the lsn of the oldest byte still needed (`head`).
    pub start_lsn: u64,
    /// The last purged log id, which the first record must follow; `None`
    /// when nothing was ever purged (the log starts at index 0).
    pub anchor: Option<LogPos>,
    /// The ring's fence.
    pub fence: Epoch,
    /// The highest index this node acknowledged, if any.
    pub acked: Option<u64>,
}

/// A valid entry found by the scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    /// Raft index.
    pub index: u64,
    /// Raft term.
    pub term: u64,
    /// Logical offset of the record.
    pub lsn: u64,
    /// Epoch of the writer.
    pub epoch: Epoch,
}

/// Where and why a scan stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    /// The position of the first invalid record.
    pub lsn: u64,
    /// Why it is invalid.
    pub reason: Invalid,
}

/// Why the scan judged the log damaged inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The log breaks below the highest index this node acknowledged.
    BelowWatermark {
        /// The highest acknowledged index.
        acked: u64,
        /// The index the recovered log would take next.
        recovered_next_index: u64,
    },
    /// A well-formed record of this lap, written under an epoch no older than
    /// the last valid record's, lies beyond the break.
    WellFormedBeyond {
        /// Its position.
        lsn: u64,
        /// Its index.
        index: u64,
        /// Its epoch.
        epoch: Epoch,
    },
}

/// How the recovered log ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The log ends cleanly.
    None,
    /// The last write was torn; nothing acknowledged is missing.
    TornTail,
    /// The log is corrupt inside: entries it once held are gone.
    CorruptInside(Evidence),
}

/// The outcome of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanReport {
    /// The valid entries, in index order.
    pub entries: Vec<Located>,
    /// Where the next record goes: one past the last valid record (the start
    /// of the next lap after a trailing wrap marker).
    pub end_lsn: u64,
    /// The chain state after the last valid record.
    pub tip: ChainTip,
    /// The first invalid record; `None` when the valid records fill the whole
    /// window (`start_lsn + capacity`).
    pub stop: Option<Stop>,
    /// How the log ended.
    pub damage: Damage,
    /// Bytes the scan fed to CRC32: its work, fewer than 6 × capacity
    /// whatever the area holds (module docs).
    pub checksummed_bytes: u64,
}

impl ScanReport {
    /// The last valid entry's log id, or the anchor when there is none.
    pub fn last_log(&self, anchor: Option<LogPos>) -> Option<LogPos> {
        self.entries
            .last()
            .map(|e| LogPos {
                term: e.term,
                index: e.index,
            })
            .or(anchor)
    }
}

/// Scans `area` (the whole data area) from `input.start_lsn`.
///
/// # Panics
/// When `area` is not the whole data area, or the purge point is not a log
/// position (`start_lsn` line aligned and at most [`MAX_LSN`], the anchor's
/// index at most [`crate::layout::MAX_INDEX`]): the callers check the
/// values they read from files ([`crate::PurgePoint::check`]) first.
pub fn scan(area: &[u8], input: ScanInput) -> ScanReport {
    let geometry = input.geometry;
    assert_eq!(
        area.len() as u64,
        geometry.capacity,
        "area is the whole data area"
    );
    assert!(
        input.start_lsn.is_multiple_of(LINE_BYTES as u64) && input.start_lsn <= MAX_LSN,
        "scan from {}, which is no log position",
        input.start_lsn
    );
    let check = Check::Recovery { fence: input.fence };
    let limit_lsn = geometry.window_end(input.start_lsn);
    let mut entries = Vec::new();
    let mut tip = ChainTip::after(input.anchor);
    let mut lsn = input.start_lsn;
    let mut stop = None;
    let mut checksums = Checksums::new(area);
    while lsn < limit_lsn {
        checksums.count_record_at(area, lsn, geometry);
        match validate_at(area, lsn, geometry, tip, check) {
            Ok(valid) if valid.next_lsn > limit_lsn => {
                stop = Some(Stop {
                    lsn,
                    reason: Invalid::OutsideWindow {
                        end_lsn: valid.next_lsn,
                        limit_lsn,
                    },
                });
                break;
            }
            Ok(valid) => {
                if valid.header.kind == RecordKind::Entry {
                    entries.push(Located {
                        index: valid.header.index,
                        term: valid.header.term,
                        lsn,
                        epoch: valid.header.epoch,
                    });
                }
                tip = valid.tip;
                lsn = valid.next_lsn;
            }
            Err(reason) => {
                stop = Some(Stop { lsn, reason });
                break;
            }
        }
    }
    let damage = classify(&mut checksums, &input, tip, stop, limit_lsn);
    ScanReport {
        entries,
        end_lsn: lsn,
        tip,
        stop,
        damage,
        checksummed_bytes: checksums.bytes,
    }
}

/// The CRC work of a scan: counted, and bounded (module docs).
struct Checksums<'a> {
    area: &'a [u8],
    /// Bytes fed to CRC32 so far.
    bytes: u64,
    /// Bytes the search beyond the break checksummed record by record.
    direct_bytes: u64,
    /// Built once the direct budget (one capacity) is spent.
    prefixes: Option<PrefixCrcs>,
}

impl<'a> Checksums<'a> {
    fn new(area: &'a [u8]) -> Checksums<'a> {
        Checksums {
            area,
            bytes: 0,
            direct_bytes: 0,
            prefixes: None,
        }
    }

    /// Counts the CRC [`validate_at`] computes for the record at `lsn`:
    /// header bytes 0..60 and the payload, when the header lets it get that
    /// far.
    fn count_record_at(&mut self, area: &[u8], lsn: u64, geometry: Geometry) {
        let physical = geometry.physical(lsn) as usize;
        let header = header_at(area, physical);
        if let Ok(payload_len) = validate_header(header, lsn, geometry) {
            self.bytes += (RECORD_CRC_OFFSET + payload_len as usize) as u64;
        }
    }

    /// Whether the CRC of the record at `physical` (whose header claims
    /// `payload_len` bytes, checked to fit in the area) matches.
    fn record_crc_matches(&mut self, physical: usize, payload_len: usize) -> bool {
        let header = header_at(self.area, physical);
        let payload_start = physical + RECORD_HEADER_BYTES;
        let payload_end = payload_start + payload_len;
        let cost = (RECORD_CRC_OFFSET + payload_len) as u64;
        if self.prefixes.is_none() && self.direct_bytes + cost <= self.area.len() as u64 {
            self.direct_bytes += cost;
            self.bytes += cost;
            return record_crc(header, &self.area[payload_start..payload_end])
                == stored_crc(header);
        }
        let area = self.area;
        let prefixes = self.prefixes.get_or_insert_with(|| {
            self.bytes += area.len() as u64;
            PrefixCrcs::new(area)
        });
        let (payload_crc, tail_bytes) = prefixes.range(area, payload_start, payload_end);
        let header_crc = crc32fast::hash(&header[..RECORD_CRC_OFFSET]);
        self.bytes += (RECORD_CRC_OFFSET + tail_bytes) as u64;
        crate::crc::shift(header_crc, payload_len as u64) ^ payload_crc == stored_crc(header)
    }
}

fn header_at(area: &[u8], physical: usize) -> &[u8; RECORD_HEADER_BYTES] {
    area[physical..physical + RECORD_HEADER_BYTES]
        .try_into()
        .expect("64 bytes")
}

fn classify(
    checksums: &mut Checksums<'_>,
    input: &ScanInput,
    tip: ChainTip,
    stop: Option<Stop>,
    limit_lsn: u64,
) -> Damage {
    if let Some(acked) = input.acked
        && tip.next_index <= acked
    {
        return Damage::CorruptInside(Evidence::BelowWatermark {
            acked,
            recovered_next_index: tip.next_index,
        });
    }
    let Some(stop) = stop else {
        return Damage::None;
    };
    if let Some(evidence) = well_formed_beyond(checksums, input, tip, stop.lsn, limit_lsn) {
        return Damage::CorruptInside(evidence);
    }
    if stop.reason.is_end_of_log() {
        Damage::None
    } else {
        Damage::TornTail
    }
}

/// Looks past the break for a record of this lap that is intact on its own
/// (magic, lsn, length, CRC, layout) and could only have been written after
/// the lost one: an epoch between the last valid record's and the fence, an
/// index at or above the one the log needed next.
///
/// The header's own checks come first and the CRC last, so that no CRC is
/// spent on a record that fails anyway; the CRC itself costs constant time
/// once the direct budget is spent ([`Checksums::record_crc_matches`]).
fn well_formed_beyond(
    checksums: &mut Checksums<'_>,
    input: &ScanInput,
    tip: ChainTip,
    break_lsn: u64,
    limit_lsn: u64,
) -> Option<Evidence> {
    let geometry = input.geometry;
    let area = checksums.area;
    let mut lsn = break_lsn + LINE_BYTES as u64;
    while lsn < limit_lsn {
        let physical = geometry.physical(lsn) as usize;
        let header = header_at(area, physical);
        if let Ok(payload_len) = validate_header(header, lsn, geometry) {
            // Judge the record on its own: a chain that starts at it and an
            // epoch window from the last valid record's to the fence.
            let own_chain = ChainTip {
                next_index: crate::layout::le_u64(&header[32..]),
                last_term: crate::layout::le_u64(&header[40..]),
                epoch: tip.epoch,
                unanchored: false,
            };
            if let Ok(valid) = validate_fields(
                header,
                geometry,
                own_chain,
                Check::Recovery { fence: input.fence },
            ) && valid.header.kind == RecordKind::Entry
                && valid.header.index >= tip.next_index
                && checksums.record_crc_matches(physical, payload_len as usize)
            {
                return Some(Evidence::WellFormedBeyond {
                    lsn,
                    index: valid.header.index,
                    epoch: valid.header.epoch,
                });
            }
        }
        lsn += LINE_BYTES as u64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RecordEncoder, RecordHeader};
    use crate::test_area::{Area, CAP, entry, epoch};

    const GEO: Geometry = Geometry {
        capacity: CAP,
        max_payload_bytes: 1 << 16,
    };

    fn input(
        start_lsn: u64,
        anchor: Option<LogPos>,
        fence: Epoch,
        acked: Option<u64>,
    ) -> ScanInput {
        ScanInput {
            geometry: GEO,
            start_lsn,
            anchor,
            fence,
            acked,
        }
    }

    /// Writes `n` entries of `term` under `e` from `lsn` after `tip`.
    fn write(
        area: &mut Area,
        lsn: u64,
        tip: ChainTip,
        e: Epoch,
        term: u64,
        n: u64,
    ) -> RecordEncoder {
        let mut enc = RecordEncoder::new(CAP, lsn, tip, e).unwrap();
        for i in 0..n {
            let payload = vec![i as u8; (i * 37 % 300) as usize];
            enc.push(area, &entry(term, tip.next_index + i, &payload))
                .unwrap();
        }
        enc
    }

    #[test]
    fn empty_area_recovers_empty_and_clean() {
        let area = Area(vec![0; CAP as usize]);
        let r = scan(&area.0, input(0, None, Epoch::ZERO, None));
        assert!(r.entries.is_empty());
        assert_eq!(r.end_lsn, 0);
        assert_eq!(r.damage, Damage::None);
        assert_eq!(r.stop.unwrap().reason, Invalid::BadMagic { found: 0 });
    }

    #[test]
    fn clean_log_recovers_every_entry() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let enc = write(&mut area, 0, ChainTip::default(), e, 1, 50);
        let r = scan(&area.0, input(0, None, e, Some(49)));
        assert_eq!(r.entries.len(), 50);
        assert_eq!(r.end_lsn, enc.next_lsn());
        assert_eq!(r.tip, enc.tip());
        assert_eq!(r.damage, Damage::None);
        assert_eq!(r.last_log(None), Some(LogPos { term: 1, index: 49 }));
    }

    #[test]
    fn scan_follows_wraps_from_a_purge_point() {
        let e = epoch(2, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let anchor = LogPos { term: 1, index: 99 };
        let start = 5 * CAP - 4096;
        let enc = write(&mut area, start, ChainTip::after(Some(anchor)), e, 2, 40);
        assert!(enc.next_lsn() > 5 * CAP, "the batch crossed a lap");
        let r = scan(&area.0, input(start, Some(anchor), e, None));
        assert_eq!(r.entries.len(), 40);
        assert_eq!(r.entries[0].index, 100);
        assert_eq!(r.end_lsn, enc.next_lsn());
        // The old lap's bytes beyond the tail are not read as new.
        assert!(matches!(
            r.stop.unwrap().reason,
            Invalid::BadMagic { .. } | Invalid::LsnMismatch { .. }
        ));
        assert_eq!(r.damage, Damage::None);
    }

    #[test]
    fn torn_last_record_is_a_torn_tail() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        write(&mut area, 0, ChainTip::default(), e, 1, 10);
        let r = scan(&area.0, input(0, None, e, Some(8)));
        let last = r.entries[9];
        area.0[last.lsn as usize + 64] ^= 1;
        let r = scan(&area.0, input(0, None, e, Some(8)));
        assert_eq!(r.entries.len(), 9);
        assert_eq!(r.damage, Damage::TornTail);
        assert!(matches!(
            r.stop.unwrap().reason,
            Invalid::CrcMismatch { .. }
        ));
    }

    #[test]
    fn break_below_watermark_is_corruption_inside() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        write(&mut area, 0, ChainTip::default(), e, 1, 10);
        let lsn9 = scan(&area.0, input(0, None, e, None)).entries[9].lsn;
        area.0[lsn9 as usize + 70] ^= 4;
        let r = scan(&area.0, input(0, None, e, Some(9)));
        assert_eq!(
            r.damage,
            Damage::CorruptInside(Evidence::BelowWatermark {
                acked: 9,
                recovered_next_index: 9
            })
        );
    }

    #[test]
    fn well_formed_records_beyond_the_break_are_corruption_inside() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        write(&mut area, 0, ChainTip::default(), e, 1, 10);
        let before = scan(&area.0, input(0, None, e, None));
        let lsn4 = before.entries[4].lsn;
        area.0[lsn4 as usize] ^= 0xff; // magic of entry 4: looks like the end
        let r = scan(&area.0, input(0, None, e, None));
        assert_eq!(r.entries.len(), 4);
        assert_eq!(
            r.stop.unwrap().reason,
            Invalid::BadMagic {
                found: crate::record::RECORD_MAGIC ^ 0xff
            }
        );
        assert_eq!(
            r.damage,
            Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: before.entries[5].lsn,
                index: 5,
                epoch: e
            })
        );
    }

    #[test]
    fn stale_writer_records_beyond_the_tail_are_not_corruption() {
        // The new leader's records end before a stale leader's longer batch.
        let old = epoch(1, 1);
        let new = epoch(2, 2);
        let mut area = Area(vec![0; CAP as usize]);
        let base = write(&mut area, 0, ChainTip::default(), old, 1, 5);
        write(&mut area, base.next_lsn(), base.tip(), old, 1, 20);
        write(&mut area, base.next_lsn(), base.tip(), new, 2, 3);
        let r = scan(&area.0, input(0, None, new, Some(7)));
        assert_eq!(r.entries.len(), 8);
        assert_eq!(r.entries[7].term, 2);
        assert_ne!(r.stop, None);
        assert!(
            !matches!(r.damage, Damage::CorruptInside(_)),
            "{:?}",
            r.damage
        );
    }

    #[test]
    fn older_epochs_are_kept_and_a_broken_prev_term_ends_the_log() {
        let e1 = epoch(1, 1);
        let e2 = epoch(2, 2);
        let e3 = epoch(3, 3);
        let mut area = Area(vec![0; CAP as usize]);
        let a = write(&mut area, 0, ChainTip::default(), e1, 1, 3);
        let b = write(&mut area, a.next_lsn(), a.tip(), e2, 2, 3);
        // Entry 6 claims prev_term 1 although entry 5 has term 2.
        let bad_tip = ChainTip {
            last_term: 1,
            ..b.tip()
        };
        write(&mut area, b.next_lsn(), bad_tip, e3, 3, 1);
        let r = scan(&area.0, input(0, None, e3, None));
        assert_eq!(
            r.entries.len(),
            6,
            "records of older epochs are a valid log"
        );
        assert_eq!(
            r.stop.unwrap().reason,
            Invalid::PrevTermMismatch {
                index: 6,
                expected: 2,
                found: 1
            }
        );
        assert_eq!(r.damage, Damage::TornTail);
    }

    #[test]
    fn previous_lap_records_are_rejected() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        // Lap 0 filled with entries; then the log was purged to lsn CAP and
        // restarted there with index 1000: the scan must not read lap 0's
        // records as lap 1's.
        write(&mut area, 0, ChainTip::default(), e, 1, 500);
        let anchor = LogPos {
            term: 1,
            index: 999,
        };
        let r = scan(&area.0, input(CAP, Some(anchor), e, None));
        assert!(r.entries.is_empty());
        assert_eq!(
            r.stop.unwrap().reason,
            Invalid::LsnMismatch {
                expected: CAP,
                found: 0
            }
        );
        assert_eq!(r.damage, Damage::None);
    }

    #[test]
    fn a_full_window_has_no_stop() {
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        // 64-byte records (empty payloads) fill the whole area exactly.
        let mut enc = RecordEncoder::new(CAP, 0, ChainTip::default(), e).unwrap();
        for i in 0..CAP / 64 {
            enc.push(&mut area, &entry(1, i, &[])).unwrap();
        }
        let r = scan(&area.0, input(0, None, e, None));
        assert_eq!(r.entries.len() as u64, CAP / 64);
        assert_eq!(r.stop, None);
        assert_eq!(r.end_lsn, CAP);
        assert_eq!(r.damage, Damage::None);
    }

    /// The search beyond the break gives the same verdict when it derives
    /// CRCs from prefix checksums (after spending its direct budget on
    /// overlapping candidates) as when it checksums records one by one.
    #[test]
    fn evidence_beyond_many_overlapping_candidates_is_still_found() {
        let geometry = Geometry::loosest(CAP);
        let e = epoch(1, 1);
        let mut area = Area(vec![0; CAP as usize]);
        let base = write(&mut area, 0, ChainTip::default(), e, 1, 10);
        let break_lsn = base.next_lsn();
        // Candidates from the break on: good magic, lsn and length, bad CRC.
        for lsn in (break_lsn..CAP - 64).step_by(64) {
            let header = RecordHeader {
                kind: RecordKind::Entry,
                payload_len: (CAP / 2 - 64).min(CAP - lsn - 64) as u32,
                lsn,
                term: 1,
                index: 10,
                prev_term: 1,
                epoch: e,
                crc: 0xBAD,
            };
            area.0[lsn as usize..][..64].copy_from_slice(&header.encode());
        }
        // A well-formed record on the last line, and one inside the area
        // whose payload is not a whole number of lines.
        write(&mut area, CAP - 64, base.tip(), e, 1, 1);
        let scan_input = ScanInput {
            geometry,
            ..input(0, None, e, None)
        };
        let report = scan(&area.0, scan_input);
        assert_eq!(report.entries.len(), 10);
        assert_eq!(
            report.damage,
            Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: CAP - 64,
                index: 10,
                epoch: e
            })
        );
        assert!(
            report.checksummed_bytes < 6 * CAP,
            "{}",
            report.checksummed_bytes
        );
        // An odd-length record in the middle, found the same way.
        let middle = CAP / 2;
        let tip = ChainTip {
            next_index: 12,
            ..base.tip()
        };
        let mut enc = RecordEncoder::new(CAP, middle, tip, e).unwrap();
        enc.push(&mut area, &entry(1, 12, &[7; 1001])).unwrap();
        let report = scan(&area.0, scan_input);
        assert_eq!(
            report.damage,
            Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: middle,
                index: 12,
                epoch: e
            })
        );
        // Spoil its CRC: the candidates are checked in table mode and the
        // evidence is the last line again.
        area.0[middle as usize + 64 + 500] ^= 1;
        assert_eq!(
            scan(&area.0, scan_input).damage,
            Damage::CorruptInside(Evidence::WellFormedBeyond {
                lsn: CAP - 64,
                index: 10,
                epoch: e
            })
        );
    }
}
