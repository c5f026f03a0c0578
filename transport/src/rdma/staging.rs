//! The staging ring: how a connection hands out pieces of its send staging
//! buffer to work requests. Plain arithmetic, no verbs.
//!
//! Pieces are allocated at the head and released at the tail, in
//! allocation order (a queue pair's send completions come in posting
//! order). Offsets are monotonic byte counts; a piece never wraps: when it
//! does not fit before the end, the bytes up to the end are skipped and
//! released with it.

/// Alignment of every piece (atomics need 8; 64 keeps pieces on cache lines).
pub(crate) const PIECE_ALIGN_BYTES: u64 = 64;

/// A piece of the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Offset of the first byte inside the buffer.
    pub offset: usize,
    /// Monotonic position where the piece (with any skipped bytes before
    /// it) began.
    begin: u64,
    /// Monotonic position after it: the tail moves here on release.
    end: u64,
}

/// Head/tail bookkeeping of a ring of `capacity` bytes.
#[derive(Debug)]
pub(crate) struct StagingRing {
    capacity: u64,
    head: u64,
    tail: u64,
}

impl StagingRing {
    /// A ring of `capacity_bytes`, rounded down to the alignment.
    pub(crate) fn new(capacity_bytes: usize) -> StagingRing {
        StagingRing {
            capacity: capacity_bytes as u64 / PIECE_ALIGN_BYTES * PIECE_ALIGN_BYTES,
            head: 0,
            tail: 0,
        }
    }

    /// A piece of `len` bytes (`len > 0`), or `None` when it does not fit now.
    pub(crate) fn allocate(&mut self, len: usize) -> Option<Piece> {
        let len = (len as u64).checked_next_multiple_of(PIECE_ALIGN_BYTES)?;
        if len == 0 || len > self.capacity {
            return None;
        }
        if self.head == self.tail {
            // Empty: start over at offset 0, so that any piece up to the
            // capacity fits.
            let start = self.head.checked_next_multiple_of(self.capacity)?;
            self.head = start;
            self.tail = start;
        }
        let at = self.head % self.capacity;
        let skip = if at + len > self.capacity {
            self.capacity - at
        } else {
            0
        };
        let used = self.head - self.tail;
        if used + skip + len > self.capacity {
            return None;
        }
        let piece = Piece {
            offset: ((at + skip) % self.capacity) as usize,
            begin: self.head,
            end: self.head + skip + len,
        };
        self.head = piece.end;
        Some(piece)
    }

    /// Gives back the oldest piece still held. Pieces must be released in
    /// allocation order; returns false (and changes nothing) otherwise.
    pub(crate) fn release(&mut self, piece: Piece) -> bool {
        if piece.begin != self.tail || piece.end > self.head {
            return false;
        }
        self.tail = piece.end;
        true
    }

    /// Takes back the newest piece (its work request was never posted).
    /// Returns false (and changes nothing) when it is not the newest.
    pub(crate) fn unallocate(&mut self, piece: Piece) -> bool {
        if piece.end != self.head || piece.begin < self.tail {
            return false;
        }
        self.head = piece.begin;
        true
    }

    /// Bytes held (including skipped ones).
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.head - self.tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_aligned_and_fifo() {
        let mut ring = StagingRing::new(1024);
        let a = ring.allocate(10).unwrap();
        let b = ring.allocate(100).unwrap();
        assert_eq!(a.offset, 0);
        assert_eq!(b.offset, 64);
        assert_eq!(ring.used(), 64 + 128);
        assert!(!ring.release(b), "out of order");
        assert!(ring.release(a));
        assert!(ring.release(b));
        assert_eq!(ring.used(), 0);
    }

    #[test]
    fn a_piece_never_wraps_and_fullness_is_exact() {
        let mut ring = StagingRing::new(1024);
        let a = ring.allocate(512).unwrap();
        let b = ring.allocate(384).unwrap();
        assert_eq!(b.offset, 512);
        // 128 bytes left at the end: a 256-byte piece skips them, but the
        // start is still held by `a`.
        assert_eq!(ring.allocate(256), None);
        assert!(ring.release(a));
        let c = ring.allocate(256).unwrap();
        assert_eq!(c.offset, 0, "skipped to the start");
        assert_eq!(ring.used(), 384 + 128 + 256);
        assert!(ring.release(b));
        assert!(ring.release(c));
        assert_eq!(ring.used(), 0);
        // An empty ring starts over at offset 0: the whole ring fits, then
        // nothing more.
        let whole = ring.allocate(1024).unwrap();
        assert_eq!(whole.offset, 0);
        assert_eq!(ring.allocate(1), None);
        assert!(ring.release(whole));
    }

    #[test]
    fn oversized_and_rollback() {
        let mut ring = StagingRing::new(256);
        assert_eq!(ring.allocate(257), None);
        assert_eq!(ring.allocate(0), None);
        let a = ring.allocate(64).unwrap();
        let b = ring.allocate(64).unwrap();
        assert!(!ring.unallocate(a), "only the newest");
        assert!(ring.unallocate(b));
        assert_eq!(ring.used(), 64);
        let b2 = ring.allocate(64).unwrap();
        assert_eq!(b2.offset, 64);
    }
}
