//! Raw access to the mapping: reading a record, the data pointer, control
//! words as atomics, slices over owned records, in-place validation,
//! zeroing and msync. The only module that forms pointers into the
//! mapping; it must never form a slice over bytes a remote writer may
//! still change (see the parent module's docs).

use std::sync::atomic::AtomicU64;

use crate::error::{Result, WalError};
use crate::layout::{CONTROL_BLOCK_BYTES, Epoch, MAX_LSN};
use crate::record::{RECORD_HEADER_BYTES, RecordHeader, RecordKind};
use crate::validate::{ChainTip, Check, Geometry, Invalid, validate_header, validate_payload};

use super::{RecordView, Ring, Slot};

impl Ring {
    // ----- reading -----------------------------------------------------------

    /// Reads entry `index`, checking its header and CRC.
    pub fn read(&self, index: u64) -> Result<RecordView<'_>> {
        let slot = self.slot(index).ok_or(WalError::NotInLog {
            index,
            first: self.first_index,
            next: self.tip.next_index,
        })?;
        let corrupt = |detail: String| WalError::Corrupt {
            index,
            lsn: slot.lsn,
            detail,
        };
        let header_bytes = self.header_bytes(slot.lsn);
        // The loosest geometry, as recovery's: a record the log holds may
        // have been written under a higher record limit than today's.
        let geometry = Geometry::loosest(self.geometry.capacity);
        let payload_len = validate_header(header_bytes, slot.lsn, geometry)
            .map_err(|reason| corrupt(reason.to_string()))?;
        let payload = self.bytes(slot.lsn + RECORD_HEADER_BYTES as u64, payload_len as usize);
        // The chain was checked when the record entered the log; here the
        // record must still be itself: CRC, layout, index and term.
        let own_chain = ChainTip {
            next_index: index,
            last_term: crate::layout::le_u64(&header_bytes[40..]),
            epoch: Epoch::ZERO,
            unanchored: false,
        };
        let any_fence = Check::Recovery {
            fence: Epoch(u64::MAX),
        };
        let valid = validate_payload(header_bytes, payload, geometry, own_chain, any_fence)
            .map_err(|reason| corrupt(reason.to_string()))?;
        if valid.header.kind != RecordKind::Entry || valid.header.term != slot.term {
            return Err(corrupt(format!(
                "holds a {:?} of term {}, the log says an entry of term {}",
                valid.header.kind, valid.header.term, slot.term
            )));
        }
        Ok(RecordView {
            index,
            term: valid.header.term,
            lsn: slot.lsn,
            epoch: valid.header.epoch,
            payload,
        })
    }
}

impl Ring {
    // ----- internals ---------------------------------------------------------

    pub(super) fn slot(&self, index: u64) -> Option<Slot> {
        let offset = index.checked_sub(self.first_index)?;
        self.slots.get(usize::try_from(offset).ok()?).copied()
    }

    pub(super) fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the data area starts right after the control block.
        unsafe { self.base.as_ptr().add(CONTROL_BLOCK_BYTES) }
    }

    pub(super) fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset < CONTROL_BLOCK_BYTES);
        // SAFETY: the mapping is page aligned and `offset` is a multiple of 8
        // inside the control block, so the word is aligned and in bounds; it
        // is only ever accessed atomically (locally and by the fabric's
        // atomics), and lives as long as `self`.
        unsafe { &*(self.base.as_ptr().add(offset) as *const AtomicU64) }
    }

    pub(super) fn write_control(&mut self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= CONTROL_BLOCK_BYTES);
        // SAFETY: in bounds; the static header is not remotely accessible.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(offset),
                bytes.len(),
            )
        };
    }

    /// `len` bytes at logical `lsn`, which must not straddle the end.
    pub(super) fn bytes(&self, lsn: u64, len: usize) -> &[u8] {
        let physical = self.geometry.physical(lsn) as usize;
        assert!(
            physical + len <= self.geometry.capacity as usize,
            "straddling read"
        );
        // SAFETY: in bounds (checked). Callers only read records the ring owns
        // or a finished remote write named by a control message (module docs).
        unsafe { std::slice::from_raw_parts(self.data_ptr().add(physical), len) }
    }

    pub(super) fn header_bytes(&self, lsn: u64) -> &[u8; RECORD_HEADER_BYTES] {
        self.bytes(lsn, RECORD_HEADER_BYTES)
            .try_into()
            .expect("64 bytes")
    }

    /// The header of a record the ring owns (asserted: it was validated).
    pub(super) fn stored_header(&self, lsn: u64) -> RecordHeader {
        let header = RecordHeader::decode(self.header_bytes(lsn)).unwrap_or_else(|defect| {
            panic!("owned record at lsn {lsn} lost its header: {defect:?}")
        });
        assert_eq!(header.lsn, lsn, "owned record moved");
        header
    }

    pub(super) fn validate_in_place(
        &self,
        lsn: u64,
        tip: ChainTip,
        check: Check,
    ) -> Result<crate::validate::Valid, Invalid> {
        let header = self.header_bytes(lsn);
        let payload_len = validate_header(header, lsn, self.geometry)?;
        let payload = self.bytes(lsn + RECORD_HEADER_BYTES as u64, payload_len as usize);
        validate_payload(header, payload, self.geometry, tip, check)
    }

    /// Debug check that the records from `lsn` to the tail continue `tip`
    /// under the recovery rules: what this ring writes, it can recover.
    pub(super) fn verify_from(&self, mut lsn: u64, mut tip: ChainTip) -> Result<(), Invalid> {
        let check = Check::Recovery {
            fence: self.fence(),
        };
        while lsn < self.tail_lsn {
            let valid = self.validate_in_place(lsn, tip, check)?;
            tip = valid.tip;
            lsn = valid.next_lsn;
        }
        assert_eq!(tip, self.tip, "the chain state matches the records");
        Ok(())
    }

    pub(super) fn check_room(&self, end_lsn: u64) -> Result<()> {
        if end_lsn > MAX_LSN {
            return Err(WalError::LsnSpaceExhausted {
                end_lsn,
                max_lsn: MAX_LSN,
            });
        }
        let limit = self.head_lsn + self.geometry.capacity;
        if end_lsn > limit {
            return Err(WalError::RingFull {
                needed: end_lsn - self.tail_lsn,
                free: limit - self.tail_lsn,
            });
        }
        Ok(())
    }

    pub(super) fn zero_range(&mut self, from: u64, to: u64) {
        debug_assert!(to - from <= self.geometry.capacity);
        let mut lsn = from;
        while lsn < to {
            let physical = self.geometry.physical(lsn);
            let run = (self.geometry.capacity - physical).min(to - lsn);
            // SAFETY: in bounds (the run stops at the end of the area); the
            // range is the ring's own (truncated entries or scratch beyond the
            // tail that no fence holder is writing: see `clear_scratch`).
            unsafe {
                std::ptr::write_bytes(self.data_ptr().add(physical as usize), 0, run as usize)
            };
            lsn += run;
        }
        self.mark_dirty(from, to);
    }

    pub(super) fn mark_dirty(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        self.unsynced = Some(match self.unsynced {
            Some((lo, hi)) => (lo.min(from), hi.max(to)),
            None => (from, to),
        });
    }

    pub(super) fn sync_data(&mut self) -> Result<()> {
        self.check_not_poisoned()?;
        let Some((from, to)) = self.unsynced else {
            return Ok(());
        };
        let capacity = self.geometry.capacity;
        let (a, b) = (self.geometry.physical(from), self.geometry.physical(to));
        let ranges = if to - from >= capacity {
            [(0, capacity), (0, 0)]
        } else if a < b || b == 0 {
            [(a, if b == 0 { capacity } else { b }), (0, 0)]
        } else {
            [(a, capacity), (0, b)]
        };
        for (start, end) in ranges.into_iter().filter(|(s, e)| s < e) {
            let flushed = self
                .map
                .flush_range(CONTROL_BLOCK_BYTES + start as usize, (end - start) as usize);
            self.poison_on_error(flushed)?;
        }
        self.unsynced = None;
        Ok(())
    }

    pub(super) fn sync_control(&mut self) -> Result<()> {
        self.check_not_poisoned()?;
        let flushed = self.map.flush_range(0, CONTROL_BLOCK_BYTES);
        self.poison_on_error(flushed)
    }

    /// A failed msync may have dropped the dirty pages it could not write
    /// (they are then clean and a retry "succeeds" without writing them), so
    /// after one failure nothing the ring holds can be called durable: every
    /// later sync fails too, and the node must restart and recover.
    pub(super) fn poison_on_error(&mut self, result: std::io::Result<()>) -> Result<()> {
        result.map_err(|source| {
            self.sync_failed = Some(source.to_string());
            WalError::Io {
                op: "msync",
                path: self.path.clone(),
                source,
            }
        })
    }

    pub(super) fn check_not_poisoned(&self) -> Result<()> {
        match &self.sync_failed {
            Some(first) => Err(WalError::SyncFailed {
                path: self.path.clone(),
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }
}
