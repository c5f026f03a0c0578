//! Deterministic noise for tests and benchmarks: bytes from a xorshift
//! generator, so that a failure replays from its seed. It uses nothing of
//! the crate, so that the integration tests (`tests/common`) and the
//! benchmark (`benches/append.rs`) include this same file by path; in the
//! crate it is compiled only for tests.

/// `len` bytes of xorshift noise from `seed` (an even seed counts as the
/// odd one above it: the generator never starts from zero).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
