//! Purging and anchoring: the purge point, moving `head`, copying records
//! out to the segments, releasing room, and joining the ring to the
//! durable log when it is opened. It must never drop a record the
//! segments do not hold yet, and never move `head` past the tail.

use std::sync::atomic::Ordering;

use crate::control_word::HeadWord;
use crate::error::{Result, WalError};
use crate::layout::{ACKED_OFFSET, MAX_LSN, check_index, check_term, encode_index_word};
use crate::meta::PurgePoint;
use crate::validate::{ChainTip, LogPos};

use super::{Anchoring, Ring, durable_end};

impl Ring {
    /// Where the log would continue after purging up to and including
    /// `upto`; `None` when that is already purged. `upto` may lie beyond the
    /// log (after a snapshot), then the whole log goes.
    pub fn purge_point(&self, upto: LogPos) -> Result<Option<PurgePoint>> {
        check_term("purge term", upto.term)
            .and_then(|()| check_index("purge index", upto.index))
            .map_err(|e| WalError::Conflict(format!("purge to {upto:?} refused: {e}")))?;
        if self.anchor.is_none() && !self.slots.is_empty() && upto.index < self.first_index {
            // A log that began at an arbitrary index gets its purge point
            // right before its first entry (see `Ring::needs_anchor`).
            if upto.index + 1 != self.first_index {
                return Err(WalError::Conflict(format!(
                    "purge to {upto:?} leaves a gap before the first entry {}",
                    self.first_index
                )));
            }
            return Ok(Some(PurgePoint {
                log: upto,
                next_lsn: self.head_lsn,
            }));
        }
        if upto.index < self.first_index {
            return match self.anchor {
                Some(a) if a.index == upto.index && a.term != upto.term => Err(WalError::Conflict(
                    format!("purge to {upto:?}, but {a:?} was purged already"),
                )),
                _ => Ok(None),
            };
        }
        let next_lsn = match self.slot(upto.index) {
            Some(slot) => {
                if slot.term != upto.term {
                    return Err(WalError::Conflict(format!(
                        "purge to {upto:?}, but the log holds term {} at that index",
                        slot.term
                    )));
                }
                slot.lsn + self.stored_header(slot.lsn).record_len()
            }
            None => self.tail_lsn,
        };
        Ok(Some(PurgePoint {
            log: upto,
            next_lsn,
        }))
    }

    /// True when the log began at an arbitrary index and has no purge point
    /// (recovery accepts its first record after a purge right before it
    /// without knowing the purged entry's term: [`Ring::anchor_on`]).
    pub fn needs_anchor(&self) -> bool {
        self.anchor.is_none() && !self.slots.is_empty()
    }

    /// Purges up to `point` (from [`Ring::purge_point`]) and advances `head`.
    /// The caller stores the purge point in the metadata file first.
    pub fn apply_purge(&mut self, point: PurgePoint) {
        assert!(
            point.next_lsn >= self.head_lsn && point.next_lsn <= self.tail_lsn,
            "purge point {point:?} outside {}..{}",
            self.head_lsn,
            self.tail_lsn
        );
        let drop = (point.log.index + 1)
            .min(self.tip.next_index)
            .saturating_sub(self.first_index);
        self.slots.drain(..drop as usize);
        self.first_index = point.log.index + 1;
        self.anchor = Some(point.log);
        if self.slots.is_empty() {
            self.tip = ChainTip::after(Some(point.log));
        }
        self.head_lsn = point.next_lsn;
        self.word(HeadWord::OFFSET)
            .store(HeadWord::new(point.next_lsn).to_word(), Ordering::Release);
    }
}

impl Ring {
    // ----- feeding the durable log (the segments) -----------------------------

    /// Copies the records of entries `from_index..` into `out`: whole
    /// records in the ring's format (header, payload, padding), wrap markers
    /// left out, at most `max_bytes` unless the first record alone is
    /// larger (it is copied whole). Returns the last index copied, `None`
    /// when the ring holds no entry at or after `from_index`.
    ///
    /// Every record copied is one the ring owns (appended or adopted), so
    /// no remote writer changes it while it is copied.
    pub fn copy_records(
        &self,
        from_index: u64,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Option<u64> {
        let start = from_index.max(self.first_index);
        let mut last = None;
        let mut copied = 0usize;
        for index in start..self.tip.next_index {
            let slot = self.slot(index).expect("index inside the ring");
            let len = self.stored_header(slot.lsn).record_len() as usize;
            if last.is_some() && copied + len > max_bytes {
                break;
            }
            out.extend_from_slice(self.bytes(slot.lsn, len));
            copied += len;
            last = Some(index);
        }
        last
    }

    /// Bytes of the ring's window in use: from `head` to the adopted tail.
    pub fn used_bytes(&self) -> u64 {
        self.tail_lsn - self.head_lsn
    }

    /// Forgets the entries up to and including `index` and advances `head`
    /// past them, giving their bytes back to writers. The caller guarantees
    /// they are in the durable log (the segments) already: the ring is only
    /// the window of recent entries. Entries not in the ring are ignored;
    /// `index` beyond the ring's last entry empties it.
    ///
    /// No metadata is stored: after a killed process, recovery starts from
    /// the `head` word in shared memory and takes the entry before the first
    /// record there from the segments.
    pub fn release_through(&mut self, index: u64) {
        if index < self.first_index || self.slots.is_empty() {
            return;
        }
        let last = index.min(self.tip.next_index - 1);
        let slot = self.slot(last).expect("index inside the ring");
        let next_lsn = slot.lsn + self.stored_header(slot.lsn).record_len();
        self.apply_purge(PurgePoint {
            log: LogPos {
                index: last,
                term: slot.term,
            },
            next_lsn,
        });
    }

    /// Forgets the oldest entries, none beyond `through`, until at most
    /// `max_used` bytes of the window are in use (or no entry up to
    /// `through` is left): [`Ring::release_through`] of as few entries as
    /// that takes. Returns true when `head` moved.
    pub fn release_to_fit(&mut self, max_used: u64, through: u64) -> bool {
        if self.used_bytes() <= max_used || through < self.first_index || self.slots.is_empty() {
            return false;
        }
        let last = through.min(self.tip.next_index - 1);
        let mut release = None;
        for index in self.first_index..=last {
            let slot = self.slot(index).expect("index inside the ring");
            release = Some(index);
            let next_lsn = slot.lsn + self.stored_header(slot.lsn).record_len();
            if self.tail_lsn - next_lsn <= max_used {
                break;
            }
        }
        match release {
            Some(index) => {
                self.release_through(index);
                true
            }
            None => false,
        }
    }

    /// Empties the ring and makes the log continue after `anchor` (the last
    /// entry of the durable log, `None` for an empty log), erasing every
    /// record between `head` and the tail. `head` does not move back: a
    /// leader may still have writes in flight up to `head + capacity`, and
    /// the next record goes at the old `head`, from where no such write can
    /// alias it. For a truncation below the ring's first entry (the entries
    /// kept are all in the segments) and for recovery.
    pub fn reset_after(&mut self, anchor: Option<LogPos>) {
        self.empty_from_head(anchor);
        let acked = self.word(ACKED_OFFSET);
        acked.fetch_min(encode_index_word(anchor.map(|a| a.index)), Ordering::AcqRel);
    }

    /// [`Ring::reset_after`] for recovery: the acknowledged watermark stays
    /// where it was. It is the evidence of what this node acknowledged: a
    /// log that recovery leaves below it is corrupt inside, and must stay
    /// so on the next open too (the node grants no vote until a leader
    /// re-replicates past it), not be forgotten because this open lowered
    /// the watermark to what it found.
    fn empty_from_head(&mut self, anchor: Option<LogPos>) {
        self.zero_range(self.head_lsn, self.tail_lsn);
        self.slots.clear();
        self.anchor = anchor;
        self.first_index = anchor.map_or(0, |a| a.index + 1);
        self.tip = ChainTip::after(anchor);
        self.tail_lsn = self.head_lsn;
    }

    /// Recovery: joins the ring's records (as [`Ring::open`] found them) to
    /// the durable log. `durable_last` is the segments' last entry,
    /// `purged` the log's purge point (the metadata file's), and
    /// `durable_term` gives the segments' term of an index.
    ///
    /// The ring is the newer of the two (the segments are written from it,
    /// and `head` only passes records the segments hold), so where both
    /// hold an index and disagree, the ring wins from there on. Records
    /// the ring holds below the purge point are forgotten. A ring whose
    /// first record does not continue the durable log (a gap, or another
    /// term before it) is emptied: its records cannot be placed.
    pub fn anchor_on(
        &mut self,
        durable_last: Option<LogPos>,
        durable_lsn_end: u64,
        purged: Option<LogPos>,
        durable_term: impl Fn(u64) -> Option<u64>,
    ) -> Anchoring {
        // Where the log stands without the ring.
        let base = durable_end(durable_last, purged);
        if let Some(p) = purged {
            self.release_through(p.index);
        }
        let Some(first_slot) = self.slots.front().copied() else {
            return self.empty_after(base, durable_lsn_end, 0);
        };
        let first = self.first_index;
        let prev_term = self.stored_header(first_slot.lsn).prev_term;
        let last = self.tip.next_index - 1;
        if !continues_durable(first, prev_term, base, &durable_term) {
            let dropped = self.tip.next_index - first;
            tracing::warn!(
                first,
                last,
                prev_term,
                ?base,
                "the ring's records do not continue the durable log: dropped"
            );
            return self.empty_after(base, durable_lsn_end, dropped);
        }
        // A log that began at its first record (nothing durable or purged
        // before it) stays unanchored.
        if base.is_some() {
            self.anchor = first.checked_sub(1).map(|index| LogPos {
                index,
                term: prev_term,
            });
        }
        // The first index both hold with different terms, if any.
        let durable_next = durable_last.map_or(0, |d| d.index + 1);
        let overlap_end = durable_next.min(last + 1);
        let conflict = (first..overlap_end).find(|&k| durable_term(k) != self.term_of(k));
        match conflict {
            Some(k) => Anchoring {
                flush_from: k,
                durable_conflict_after: Some(k.checked_sub(1)),
                dropped: 0,
            },
            None => {
                if durable_next > self.tip.next_index {
                    // The segments reach further (the ring's scan stopped
                    // early: damage the segments do not share).
                    self.empty_from_head(durable_last);
                    self.move_empty_window(durable_lsn_end);
                }
                Anchoring {
                    flush_from: durable_next.max(first),
                    durable_conflict_after: None,
                    dropped: 0,
                }
            }
        }
    }

    /// Recovery leaving the ring empty after the durable log's end `base`,
    /// its window at `durable_lsn_end` or beyond, with `dropped` records
    /// forgotten.
    fn empty_after(
        &mut self,
        base: Option<LogPos>,
        durable_lsn_end: u64,
        dropped: u64,
    ) -> Anchoring {
        self.empty_from_head(base);
        self.move_empty_window(durable_lsn_end);
        Anchoring {
            flush_from: base.map_or(0, |b| b.index + 1),
            durable_conflict_after: None,
            dropped,
        }
    }

    /// Recovery of an empty ring: its window starts at `lsn` or beyond, so
    /// that its records continue the segments' lsn order (a ring recreated
    /// after a reboot starts at lsn 0). Nobody writes into a ring being
    /// recovered, so `head` may move.
    pub(super) fn move_empty_window(&mut self, lsn: u64) {
        assert!(
            self.slots.is_empty(),
            "moving the window of a ring with entries"
        );
        if lsn > self.head_lsn && lsn <= MAX_LSN {
            self.head_lsn = lsn;
            self.tail_lsn = lsn;
            self.word(HeadWord::OFFSET)
                .store(HeadWord::new(lsn).to_word(), Ordering::Release);
        }
    }
}

/// Whether a ring whose first record is `first` (after `prev_term`)
/// continues the durable log ending at `base`, whose terms `durable_term`
/// gives.
fn continues_durable(
    first: u64,
    prev_term: u64,
    base: Option<LogPos>,
    durable_term: &impl Fn(u64) -> Option<u64>,
) -> bool {
    match (first.checked_sub(1), base) {
        // The log's very beginning, or nothing before it anywhere.
        (None, _) | (Some(_), None) => true,
        // A gap between the durable log and the ring.
        (Some(before), Some(base)) if before > base.index => false,
        (Some(before), Some(_)) => match durable_term(before) {
            // The segments hold its predecessor: the terms must agree.
            Some(term) => term == prev_term,
            // Written right after a purge (a snapshot installed): its
            // writer did not know the purged entry's term. Or the ring
            // reaches back before the segments' first entry.
            None => true,
        },
    }
}
