//! Writing the log: local appends, adoption of records a remote writer put
//! into the ring (check in place, then commit), scratch clearing and
//! truncation. It must never write past `head + capacity` nor adopt a
//! record that failed the validator's rules.

use std::sync::atomic::Ordering;

use crate::error::{AdoptError, Result, WalError};
use crate::layout::{ACKED_OFFSET, Epoch, encode_index_word};
use crate::record::{
    EntryRef, RECORD_HEADER_BYTES, RecordEncoder, RecordKind, RecordSink, span_end,
};
use crate::validate::{ChainTip, Check, Invalid, LogPos};

use super::{AdoptRequest, Extended, RecordView, Ring, Slot};

/// One record of a [`PreparedAdoption`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PreparedRecord {
    lsn: u64,
    index: u64,
    term: u64,
    payload_len: u32,
    epoch: Epoch,
}

/// Records a remote writer put into the ring, checked in place and not yet
/// part of the log (see [`Ring::prepare_adoption`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedAdoption {
    request: AdoptRequest,
    fence: Epoch,
    base_tip: ChainTip,
    tip: ChainTip,
    end_lsn: u64,
    records: Vec<PreparedRecord>,
}

impl PreparedAdoption {
    /// What the control message said.
    pub fn request(&self) -> AdoptRequest {
        self.request
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are no entries (a heartbeat).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The fence they were checked against.
    pub fn fence(&self) -> Epoch {
        self.fence
    }
}

impl Ring {
    // ----- writing -----------------------------------------------------------

    /// Appends entries written by this node (a leader's own writes, or a
    /// conflicting suffix a follower received two-sided), as the writer
    /// holding `epoch`. All or nothing: on error nothing is written.
    pub fn append(&mut self, epoch: Epoch, entries: &[EntryRef<'_>]) -> Result<Extended> {
        let fence = self.fence();
        if epoch > fence {
            return Err(WalError::EpochAboveFence { epoch, fence });
        }
        for e in entries {
            if e.payload.len() as u64 > self.geometry.max_payload_bytes {
                return Err(WalError::RecordTooLarge {
                    len: e.payload.len() as u64,
                    max: self.geometry.max_payload_bytes,
                });
            }
        }
        let mut encoder =
            RecordEncoder::new(self.geometry.capacity, self.tail_lsn, self.tip, epoch)
                .expect("the ring's capacity was checked at open and its tail is a log position");
        encoder.check_batch(entries)?;
        let end_lsn = span_end(
            self.tail_lsn,
            self.geometry.capacity,
            entries.iter().map(|e| e.payload.len() as u64),
        );
        self.check_room(end_lsn)?;
        let (start_lsn, start_tip) = (self.tail_lsn, self.tip);
        let mut sink = MapSink {
            data: self.data_ptr(),
            capacity: self.geometry.capacity,
        };
        if self.slots.is_empty()
            && let Some(first) = entries.first()
        {
            self.first_index = first.index;
        }
        for entry in entries {
            let placed = encoder.push(&mut sink, entry).expect("batch checked above");
            self.slots.push_back(Slot {
                lsn: placed.lsn,
                term: placed.term,
            });
        }
        assert_eq!(
            encoder.next_lsn(),
            end_lsn,
            "span_end and the encoder agree"
        );
        self.mark_dirty(self.tail_lsn, end_lsn);
        self.tail_lsn = end_lsn;
        self.tip = encoder.tip();
        debug_assert_eq!(self.verify_from(start_lsn, start_tip), Ok(()));
        Ok(Extended {
            last: self.last_log(),
            tail_lsn: self.tail_lsn,
        })
    }

    /// Adopts in place the records a remote writer put at
    /// `request.from_lsn..request.to_lsn`: each must pass the validator in
    /// its adoption context (epoch equal to the current fence) and together
    /// they must be the entries the control message names. All or nothing.
    /// The same as [`Ring::prepare_adoption`] then [`Ring::commit_adoption`].
    pub fn adopt(&mut self, request: AdoptRequest) -> Result<Extended> {
        let prepared = self.prepare_adoption(request)?;
        self.commit_adoption(prepared)
    }

    /// Checks the records of `request` in place without taking them into the
    /// log, so that they can be read ([`Ring::prepared_records`]) and handed
    /// to the consensus layer, which decides whether they enter the log.
    pub fn prepare_adoption(&self, request: AdoptRequest) -> Result<PreparedAdoption> {
        let limit_lsn = self.window_end();
        if request.from_lsn != self.tail_lsn {
            return Err(AdoptError::NotAtTail {
                from_lsn: request.from_lsn,
                tail_lsn: self.tail_lsn,
            }
            .into());
        }
        if request.to_lsn < request.from_lsn || request.to_lsn > limit_lsn {
            return Err(AdoptError::BadRange {
                from_lsn: request.from_lsn,
                to_lsn: request.to_lsn,
                limit_lsn,
            }
            .into());
        }
        let fence = self.fence();
        let check = Check::Adoption { fence };
        let mut tip = self.tip;
        let mut lsn = request.from_lsn;
        let mut records = Vec::new();
        while lsn < request.to_lsn {
            let valid = self
                .validate_in_place(lsn, tip, check)
                .map_err(|reason| AdoptError::Rejected { lsn, reason })?;
            if valid.next_lsn > request.to_lsn && valid.header.kind == RecordKind::Entry {
                return Err(AdoptError::EndMismatch {
                    expected: request.to_lsn,
                    found: valid.next_lsn,
                }
                .into());
            }
            if valid.header.kind == RecordKind::Entry {
                records.push(PreparedRecord {
                    lsn,
                    index: valid.header.index,
                    term: valid.header.term,
                    payload_len: valid.header.payload_len,
                    epoch: valid.header.epoch,
                });
            }
            tip = valid.tip;
            lsn = valid.next_lsn;
        }
        let found_last = records.last().map(|r| LogPos {
            term: r.term,
            index: r.index,
        });
        if records.len() as u64 != request.entries || found_last != request.last {
            return Err(AdoptError::EntriesMismatch {
                expected_count: request.entries,
                expected_last: request.last,
                found_count: records.len() as u64,
                found_last,
            }
            .into());
        }
        // A trailing wrap marker moves the tail to the next lap.
        if lsn > limit_lsn {
            return Err(AdoptError::BadRange {
                from_lsn: request.from_lsn,
                to_lsn: lsn,
                limit_lsn,
            }
            .into());
        }
        Ok(PreparedAdoption {
            request,
            fence,
            base_tip: self.tip,
            tip,
            end_lsn: lsn,
            records,
        })
    }

    /// The entries of a prepared adoption, read in place.
    pub fn prepared_records<'a>(
        &'a self,
        prepared: &'a PreparedAdoption,
    ) -> impl Iterator<Item = RecordView<'a>> + 'a {
        prepared.records.iter().map(|r| RecordView {
            index: r.index,
            term: r.term,
            lsn: r.lsn,
            epoch: r.epoch,
            payload: self.bytes(r.lsn + RECORD_HEADER_BYTES as u64, r.payload_len as usize),
        })
    }

    /// Takes prepared records into the log. Fails, changing nothing, when the
    /// log or the fence moved since they were prepared.
    pub fn commit_adoption(&mut self, prepared: PreparedAdoption) -> Result<Extended> {
        if prepared.request.from_lsn != self.tail_lsn || prepared.base_tip != self.tip {
            return Err(AdoptError::NotAtTail {
                from_lsn: prepared.request.from_lsn,
                tail_lsn: self.tail_lsn,
            }
            .into());
        }
        let fence = self.fence();
        if fence != prepared.fence {
            return Err(AdoptError::Rejected {
                lsn: prepared.request.from_lsn,
                reason: Invalid::NotFenceHolder {
                    fence,
                    found: prepared.fence,
                },
            }
            .into());
        }
        if self.slots.is_empty()
            && let Some(first) = prepared.records.first()
        {
            self.first_index = first.index;
        }
        self.slots.extend(prepared.records.iter().map(|r| Slot {
            lsn: r.lsn,
            term: r.term,
        }));
        self.mark_dirty(self.tail_lsn, prepared.end_lsn);
        self.tail_lsn = prepared.end_lsn;
        self.tip = prepared.tip;
        Ok(Extended {
            last: self.last_log(),
            tail_lsn: self.tail_lsn,
        })
    }

    /// Erases scratch bytes a remote writer left beyond the adopted tail, up
    /// to `to_lsn` (bounded by the window): after a rejected adoption, so that
    /// neither a later adoption nor recovery finds the rejected records.
    pub fn clear_scratch(&mut self, to_lsn: u64) {
        self.clear_scratch_between(self.tail_lsn, to_lsn);
    }

    /// Erases the scratch bytes in `from_lsn..to_lsn`, clipped to what lies
    /// beyond the adopted tail and inside the window: the part of a rejected
    /// batch that no other prepared adoption covers.
    pub fn clear_scratch_between(&mut self, from_lsn: u64, to_lsn: u64) {
        let from_lsn = from_lsn.max(self.tail_lsn);
        let to_lsn = to_lsn.min(self.window_end());
        if to_lsn > from_lsn {
            self.zero_range(from_lsn, to_lsn);
        }
    }

    /// Removes every entry after `last_kept` (all of them when `None`), and
    /// erases their records so that recovery cannot bring them back.
    pub fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<()> {
        // `last_kept` is the caller's; at u64::MAX nothing is after it.
        let keep_next = last_kept.map_or(0, |i| i.saturating_add(1));
        if keep_next >= self.tip.next_index || self.slots.is_empty() {
            return Ok(());
        }
        if keep_next < self.first_index && self.anchor.is_some() {
            return Err(WalError::Conflict(format!(
                "cannot truncate after {last_kept:?}: entries up to {} are purged",
                self.first_index.saturating_sub(1)
            )));
        }
        let (new_tail, new_tip, keep) = if keep_next <= self.first_index {
            (self.head_lsn, ChainTip::after(self.anchor), 0)
        } else {
            let index = keep_next - 1;
            let slot = self.slot(index).expect("index checked above");
            let header = self.stored_header(slot.lsn);
            (
                slot.lsn + header.record_len(),
                ChainTip {
                    next_index: keep_next,
                    last_term: slot.term,
                    epoch: header.epoch,
                    unanchored: false,
                },
                keep_next - self.first_index,
            )
        };
        self.zero_range(new_tail, self.tail_lsn);
        self.slots.truncate(keep as usize);
        if self.slots.is_empty() {
            self.first_index = self.anchor.map_or(0, |a| a.index + 1);
        }
        self.tail_lsn = new_tail;
        self.tip = new_tip;
        let acked = self.word(ACKED_OFFSET);
        let keep_word = encode_index_word(last_kept);
        acked.fetch_min(keep_word, Ordering::AcqRel);
        Ok(())
    }
}

/// Writes records straight into the mapping.
struct MapSink {
    data: *mut u8,
    capacity: u64,
}

impl RecordSink for MapSink {
    fn put_record(&mut self, lsn: u64, header: &[u8; RECORD_HEADER_BYTES], payload: &[u8]) {
        let physical = (lsn & (self.capacity - 1)) as usize;
        assert!(physical + RECORD_HEADER_BYTES + payload.len() <= self.capacity as usize);
        // SAFETY: in bounds (asserted); the bytes lie at or beyond the tail
        // and below head + capacity (checked by `append`), where only this
        // node writes while it appends locally.
        unsafe {
            let dst = self.data.add(physical);
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, RECORD_HEADER_BYTES);
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                dst.add(RECORD_HEADER_BYTES),
                payload.len(),
            );
        }
    }
}
