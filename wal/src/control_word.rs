//! Typed views of the ring's remotely readable control words, the fence and
//! the head, for the owner and for a peer that READs them over a fabric.
//! This module owns their byte encoding only; it must never touch a ring's
//! mapping (the ring loads and stores the words atomically) nor judge a
//! decoded value (whether a head lies in a ring's window is the caller's
//! rule).
//!
//! Both words are 8 bytes, little-endian, each on its own cache line of the
//! control block (table in [`crate::layout`]):
//!
//! ```text
//! offset  size  word    value
//! 64      8     fence   an Epoch: term << 16 | leader_id (u64 LE)
//! 128     8     head    the lsn of the oldest byte still needed (u64 LE)
//! ```

use crate::layout::{Epoch, FENCE_OFFSET, HEAD_OFFSET};

/// Size of a control word, in bytes.
pub const CONTROL_WORD_BYTES: usize = 8;

/// A control word READ from a peer was not [`CONTROL_WORD_BYTES`] long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a {word} word is {CONTROL_WORD_BYTES} bytes, not {found}")]
pub struct WordLength {
    /// Which word: "fence" or "head".
    pub word: &'static str,
    /// How many bytes were given.
    pub found: usize,
}

fn word_bytes(bytes: &[u8], word: &'static str) -> Result<[u8; CONTROL_WORD_BYTES], WordLength> {
    bytes.try_into().map_err(|_| WordLength {
        word,
        found: bytes.len(),
    })
}

/// The fence word: the [`Epoch`] of the writer allowed into the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceWord(Epoch);

impl FenceWord {
    /// Offset of the word in the control block.
    pub const OFFSET: usize = FENCE_OFFSET;

    /// The fence word holding `epoch`.
    pub fn new(epoch: Epoch) -> FenceWord {
        FenceWord(epoch)
    }

    /// The word as an integer loaded from the control block (or compared
    /// and swapped by a fabric's atomics).
    pub fn from_word(word: u64) -> FenceWord {
        FenceWord(Epoch(word))
    }

    /// The integer stored in the control block.
    pub fn to_word(self) -> u64 {
        self.0.0
    }

    /// Decodes the bytes of an 8-byte READ of the word.
    ///
    /// # Errors
    /// [`WordLength`] when `bytes` is not 8 bytes long.
    pub fn from_bytes(bytes: &[u8]) -> Result<FenceWord, WordLength> {
        word_bytes(bytes, "fence").map(|b| FenceWord::from_word(u64::from_le_bytes(b)))
    }

    /// The bytes as they lie in the control block.
    pub fn to_bytes(self) -> [u8; CONTROL_WORD_BYTES] {
        self.to_word().to_le_bytes()
    }

    /// The epoch the fence holds.
    pub fn epoch(self) -> Epoch {
        self.0
    }
}

/// The head word: the lsn of the oldest byte of the ring still needed; a
/// leader may write up to `head + capacity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HeadWord(u64);

impl HeadWord {
    /// Offset of the word in the control block.
    pub const OFFSET: usize = HEAD_OFFSET;

    /// The head word holding `lsn`.
    pub fn new(lsn: u64) -> HeadWord {
        HeadWord(lsn)
    }

    /// The word as an integer loaded from the control block.
    pub fn from_word(word: u64) -> HeadWord {
        HeadWord(word)
    }

    /// The integer stored in the control block.
    pub fn to_word(self) -> u64 {
        self.0
    }

    /// Decodes the bytes of an 8-byte READ of the word.
    ///
    /// # Errors
    /// [`WordLength`] when `bytes` is not 8 bytes long.
    pub fn from_bytes(bytes: &[u8]) -> Result<HeadWord, WordLength> {
        word_bytes(bytes, "head").map(|b| HeadWord::from_word(u64::from_le_bytes(b)))
    }

    /// The bytes as they lie in the control block.
    pub fn to_bytes(self) -> [u8; CONTROL_WORD_BYTES] {
        self.0.to_le_bytes()
    }

    /// The lsn the head holds (not checked against [`crate::layout::MAX_LSN`]:
    /// that is the reader's rule).
    pub fn lsn(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_word_round_trips_in_little_endian() {
        let epoch = Epoch::new(5, 3).unwrap();
        let word = FenceWord::new(epoch);
        let bytes = word.to_bytes();
        assert_eq!(bytes, ((5u64 << 16) | 3).to_le_bytes());
        assert_eq!(FenceWord::from_bytes(&bytes), Ok(word));
        assert_eq!(FenceWord::from_word(word.to_word()), word);
        assert_eq!(FenceWord::from_bytes(&bytes).unwrap().epoch(), epoch);
        assert!(FenceWord::new(Epoch::new(6, 0).unwrap()) > word);
    }

    #[test]
    fn head_word_round_trips_in_little_endian() {
        for lsn in [0, 1, 4096, crate::layout::MAX_LSN, u64::MAX] {
            let word = HeadWord::new(lsn);
            assert_eq!(word.to_bytes(), lsn.to_le_bytes());
            assert_eq!(HeadWord::from_bytes(&word.to_bytes()), Ok(word));
            assert_eq!(HeadWord::from_word(word.to_word()).lsn(), lsn);
        }
    }

    #[test]
    fn a_word_of_the_wrong_length_is_an_error() {
        for len in [0, 7, 9, 16] {
            let bytes = vec![0u8; len];
            assert_eq!(
                FenceWord::from_bytes(&bytes),
                Err(WordLength {
                    word: "fence",
                    found: len
                })
            );
            assert_eq!(
                HeadWord::from_bytes(&bytes),
                Err(WordLength {
                    word: "head",
                    found: len
                })
            );
        }
    }

    #[test]
    fn the_words_sit_where_the_layout_says() {
        assert_eq!(FenceWord::OFFSET, 64);
        assert_eq!(HeadWord::OFFSET, 128);
    }
}
