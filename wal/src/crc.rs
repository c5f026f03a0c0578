//! CRC-32 arithmetic (IEEE, reflected, the checksum crc32fast computes):
//! carrying a checksum past `n` more bytes, and so the checksum of any range
//! of a buffer from the checksums of two of its prefixes.
//!
//! CRC-32 is linear over GF(2): for any byte strings `a` and `b`,
//! `crc(a ‖ b) = shift(crc(a), |b|) ^ crc(b)`, where `shift(c, n)`
//! multiplies `c` by `x^(8n)` modulo the CRC polynomial (zlib's
//! `crc32_combine`). Hence, with `prefix(k) = crc(area[..k])`,
//! `crc(area[i..j]) = prefix(j) ^ shift(prefix(i), j - i)`.
//!
//! Recovery uses it to check many overlapping candidate records in time
//! linear in the data area ([`crate::recovery`]). Pure code, no I/O.

use std::sync::OnceLock;

/// The CRC-32 polynomial, reflected.
const POLY: u32 = 0xEDB8_8320;

/// `a(x) * b(x) mod p(x)`, both in CRC-32's reflected bit order (bit 31 is
/// the coefficient of `x^0`).
fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    for bit in (0..32).rev() {
        if a & (1 << bit) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `x^(8 * d * 256^j) mod p(x)` for every byte position `j` of a `u64`
/// length and every byte value `d`: a shift by `n` bytes is the product of
/// at most eight of them.
fn byte_shift_table() -> &'static [[u32; 256]; 8] {
    static TABLE: OnceLock<Box<[[u32; 256]; 8]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        // x^(2^k) mod p for k in 0..67: x^1 is 1 << 30 in reflected order.
        let mut x_pow2 = [0u32; 67];
        x_pow2[0] = 1 << 30;
        for k in 1..x_pow2.len() {
            x_pow2[k] = mult_mod_p(x_pow2[k - 1], x_pow2[k - 1]);
        }
        let mut table = Box::new([[0u32; 256]; 8]);
        for (j, row) in table.iter_mut().enumerate() {
            row[0] = 1 << 31; // x^0
            for d in 1..256usize {
                // Bit `b` of byte `j` stands for 8 * 2^(8j + b) bits: x^(2^(8j + b + 3)).
                let low = d.trailing_zeros() as usize;
                row[d] = mult_mod_p(row[d & (d - 1)], x_pow2[8 * j + low + 3]);
            }
        }
        table
    })
}

/// Carries the checksum `crc` of some bytes past `n` more bytes, as if they
/// were zeroes with no init/xorout: `crc(a ‖ b) = shift(crc(a), |b|) ^ crc(b)`.
pub(crate) fn shift(crc: u32, n: u64) -> u32 {
    let table = byte_shift_table();
    let mut x_pow = 1u32 << 31;
    for (j, row) in table.iter().enumerate() {
        let d = (n >> (8 * j)) as u8;
        if d != 0 {
            x_pow = mult_mod_p(x_pow, row[d as usize]);
        }
    }
    mult_mod_p(x_pow, crc)
}

/// The checksums of every 64-byte-aligned prefix of a buffer, which give the
/// checksum of any range in constant time (module docs). Takes 4 bytes per
/// 64-byte line.
pub(crate) struct PrefixCrcs {
    /// `lines[k] = crc(buf[..64 * k])`.
    lines: Vec<u32>,
}

/// Granularity of [`PrefixCrcs`], in bytes.
const LINE: usize = 64;

impl PrefixCrcs {
    /// Checksums every line of `buf` once.
    pub(crate) fn new(buf: &[u8]) -> PrefixCrcs {
        let mut lines = Vec::with_capacity(buf.len() / LINE + 1);
        lines.push(0);
        let mut hasher = crc32fast::Hasher::new();
        for line in buf.chunks_exact(LINE) {
            hasher.update(line);
            lines.push(hasher.clone().finalize());
        }
        PrefixCrcs { lines }
    }

    /// The checksum of `buf[start..end]` (`buf` as given to
    /// [`PrefixCrcs::new`]), with `start` a multiple of 64. Reads the at most
    /// 63 bytes after the last whole line of the range and returns how many
    /// it checksummed, with the checksum.
    pub(crate) fn range(&self, buf: &[u8], start: usize, end: usize) -> (u32, usize) {
        assert!(start.is_multiple_of(LINE) && start <= end && end <= buf.len());
        let whole = end - end % LINE;
        let tail = &buf[whole..end];
        let prefix_end = shift(self.lines[whole / LINE], tail.len() as u64) ^ crc32fast::hash(tail);
        let crc = prefix_end ^ shift(self.lines[start / LINE], (end - start) as u64);
        (crc, tail.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_noise::noise;

    #[test]
    fn shift_combines_like_concatenation() {
        let data = noise(7, 5000);
        for split in [0, 1, 63, 64, 65, 1000, 4999, 5000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                shift(crc32fast::hash(a), b.len() as u64) ^ crc32fast::hash(b),
                crc32fast::hash(&data),
                "split at {split}"
            );
        }
        assert_eq!(shift(0x1234_5678, 0), 0x1234_5678);
        assert_eq!(shift(0, 1 << 40), 0);
    }

    #[test]
    fn shift_handles_every_byte_of_a_length() {
        // A shift by n is the same as n shifts by one, and shifts add up.
        let crc = 0xDEAD_BEEF;
        let mut one_by_one = crc;
        for _ in 0..300 {
            one_by_one = shift(one_by_one, 1);
        }
        assert_eq!(shift(crc, 300), one_by_one);
        for (a, b) in [(1u64 << 20, 1u64 << 39), (0xFF, 0xFF00), (12345, 1 << 56)] {
            assert_eq!(shift(shift(crc, a), b), shift(crc, a + b), "{a} + {b}");
        }
    }

    #[test]
    fn ranges_from_prefixes_match_direct_checksums() {
        let buf = noise(11, 64 * 40);
        let prefixes = PrefixCrcs::new(&buf);
        for start in (0..buf.len()).step_by(64) {
            for end in [
                start,
                start + 1,
                start + 63,
                start + 64,
                start + 100,
                buf.len(),
            ] {
                if end > buf.len() {
                    continue;
                }
                let (crc, read) = prefixes.range(&buf, start, end);
                assert_eq!(crc, crc32fast::hash(&buf[start..end]), "{start}..{end}");
                assert_eq!(read, end % 64);
            }
        }
    }
}
