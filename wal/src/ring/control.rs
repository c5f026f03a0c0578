//! The ring's control words (fence, commit hint, acknowledged watermark,
//! head) and the regions a fabric registers. Control words are only ever
//! touched atomically here; this module must never read or write records.

use std::sync::atomic::Ordering;

use crate::control_word::{CONTROL_WORD_BYTES, FenceWord, HeadWord};
use crate::error::{Result, WalError};
use crate::layout::{
    ACKED_OFFSET, COMMIT_OFFSET, CONTROL_BLOCK_BYTES, Epoch, MAX_INDEX, decode_index_word,
    encode_index_word,
};

use super::{RawRegion, Ring, RingRegions};

impl Ring {
    // ----- control words ---------------------------------------------------

    /// The fence word: the epoch of the leader allowed to write.
    pub fn fence(&self) -> Epoch {
        FenceWord::from_word(self.word(FenceWord::OFFSET).load(Ordering::Acquire)).epoch()
    }

    /// Compare-and-swap of the fence with a CPU atomic, upward only.
    ///
    /// DESIGN.md: RDMA atomics are atomic only against other RDMA atomics of
    /// the same device, so a node whose device reports `IBV_ATOMIC_HCA` must
    /// change its own fence through a loopback connection instead. This is
    /// for devices with global atomics and for software fabrics, whose
    /// atomics are these same CPU atomics. Returns the value found.
    pub fn compare_exchange_fence(&self, current: Epoch, new: Epoch) -> Result<Epoch> {
        if new <= current {
            return Err(WalError::FenceDownward {
                current,
                proposed: new,
            });
        }
        let found = match self.word(FenceWord::OFFSET).compare_exchange(
            FenceWord::new(current).to_word(),
            FenceWord::new(new).to_word(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(v) | Err(v) => v,
        };
        Ok(FenceWord::from_word(found).epoch())
    }

    /// The leader's last commit hint.
    pub fn commit_hint(&self) -> Option<u64> {
        decode_index_word(self.word(COMMIT_OFFSET).load(Ordering::Acquire))
    }

    /// Records the leader's commit hint. It comes from a peer's message and
    /// is only a hint: an index above [`MAX_INDEX`] is stored as `MAX_INDEX`.
    pub fn set_commit_hint(&self, index: Option<u64>) {
        self.word(COMMIT_OFFSET).store(
            encode_index_word(index.map(|i| i.min(MAX_INDEX))),
            Ordering::Release,
        );
    }

    /// The highest index this node acknowledged.
    pub fn acked(&self) -> Option<u64> {
        decode_index_word(self.word(ACKED_OFFSET).load(Ordering::Acquire))
    }

    /// Raises the acknowledged watermark to `index` (memory durability: no
    /// msync). `index` must be in the log.
    pub fn mark_acked(&self, index: u64) {
        assert!(
            index < self.tip.next_index,
            "acknowledging {index}, beyond the log's end {}",
            self.tip.next_index
        );
        self.word(ACKED_OFFSET)
            .fetch_max(encode_index_word(Some(index)), Ordering::AcqRel);
    }

    /// Fsync durability: makes every record written so far durable, then
    /// raises the acknowledged watermark to `index` and makes it (and the
    /// fence) durable. Only after this may the node acknowledge `index`.
    pub fn sync_and_ack(&mut self, index: u64) -> Result<()> {
        self.sync_data()?;
        self.mark_acked(index);
        self.sync_control()
    }

    /// Makes every record written so far and the control block durable.
    pub fn sync(&mut self) -> Result<()> {
        self.sync_data()?;
        self.sync_control()
    }

    /// The parts a fabric registers; see the module docs.
    pub fn regions(&self) -> RingRegions {
        // SAFETY: both offsets are inside the mapping.
        let at = |offset: usize, len: usize| RawRegion {
            addr: unsafe { self.base.as_ptr().add(offset) },
            len,
        };
        RingRegions {
            data: at(CONTROL_BLOCK_BYTES, self.geometry.capacity as usize),
            fence: at(FenceWord::OFFSET, CONTROL_WORD_BYTES),
            head: at(HeadWord::OFFSET, CONTROL_WORD_BYTES),
        }
    }
}
