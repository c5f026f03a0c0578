//! Decoding bincode from outside input without letting a length prefix
//! allocate more than the input could hold.
//!
//! bincode allocates a byte string or a string as soon as it has read its
//! length, before its bytes: a few bytes that claim a 4 GiB string make a
//! 4 GiB allocation, bounded only by the configuration's limit on claimed
//! bytes. That limit is a constant of the type, so [`decode`] picks the
//! smallest of a ladder of limits that a valid encoding of `bytes.len()`
//! bytes can need: every value bincode decodes takes at least one byte of
//! input and claims at most 16 bytes (a `u128`), and a byte string claims
//! exactly its length. An input of `n` bytes may then claim at most
//! `16 n + 64` bytes, rounded up to the next power of four (and never more
//! than the caller's cap, rounded the same way).
//!
//! Owns the ladder. Never: decode with the crate's configuration
//! unbounded, or change what a valid input decodes to.

use bincode::config::Config;
use bincode::error::DecodeError;
use serde::de::DeserializeOwned;

/// Bytes a valid encoding may claim per byte of input, at most.
const CLAIM_PER_BYTE: usize = 16;
/// Claims allowed beyond `CLAIM_PER_BYTE` per byte (a tiny input).
const SLACK: usize = 64;

/// Decodes a `T` from the start of `bytes` with bincode's standard
/// configuration (serde), claiming at most what `bytes.len()` can justify
/// and at most about `cap` bytes; `(value, bytes used)`.
///
/// # Errors
/// bincode's, among them [`DecodeError::LimitExceeded`] for a length that
/// claims more than the input can hold.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], cap: usize) -> Result<(T, usize), DecodeError> {
    let need = bytes
        .len()
        .saturating_mul(CLAIM_PER_BYTE)
        .saturating_add(SLACK)
        .min(cap);
    macro_rules! ladder {
        ($($limit:expr),*) => {
            $(
                if need <= $limit {
                    return with(bytes, bincode::config::standard().with_limit::<{ $limit }>());
                }
            )*
        };
    }
    ladder!(
        1 << 10,
        4 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
        16 << 20,
        64 << 20,
        256 << 20,
        1 << 30
    );
    with(
        bytes,
        bincode::config::standard().with_limit::<{ 4 << 30 }>(),
    )
}

fn with<T: DeserializeOwned>(bytes: &[u8], config: impl Config) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_input_that_claims_a_huge_string_is_refused_before_allocating() {
        // A string of 2^32 - 1 bytes claimed in 5 bytes of varint.
        let claim = [0xfc, 0xff, 0xff, 0xff, 0xff];
        let r = decode::<String>(&claim, 4 << 30);
        assert!(matches!(r, Err(DecodeError::LimitExceeded)), "{r:?}");
    }

    #[test]
    fn valid_encodings_decode_as_before_at_every_size() {
        let cases: Vec<(Vec<u64>, Vec<u8>, String)> = vec![
            (vec![], vec![], String::new()),
            (vec![u64::MAX; 3], vec![7; 100], "x".repeat(10)),
            // Many one-byte integers: each claims 8 bytes.
            (vec![1; 100_000], vec![0; 300_000], "y".repeat(70_000)),
        ];
        for case in cases {
            let bytes = bincode::serde::encode_to_vec(&case, bincode::config::standard()).unwrap();
            let (back, used): ((Vec<u64>, Vec<u8>, String), usize) =
                decode(&bytes, 4 << 30).unwrap();
            assert_eq!((back, used), (case, bytes.len()));
        }
    }

    #[test]
    fn the_callers_cap_still_holds() {
        let bytes =
            bincode::serde::encode_to_vec(vec![0u8; 5000], bincode::config::standard()).unwrap();
        assert!(decode::<Vec<u8>>(&bytes, 4 << 10).is_err());
        assert!(decode::<Vec<u8>>(&bytes, 16 << 10).is_ok());
    }
}
