//! Damage to the tail of a stopped node's ring file (in its ring dir, found
//! from `<data-dir>/ring-location`, as `wal check` finds it): the
//! nemesis's model of a torn or lost write. It finds where the valid records
//! end with the WAL's own offline checker, then flips (corrupt) or zeroes
//! (truncate) bytes just below that end, across the last one to four
//! 64-byte lines, wrapping at the end of the data area. It must never touch
//! a running node's ring.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ringraft_wal::layout::CONTROL_BLOCK_BYTES;

use crate::substrate::TailDamage;

/// Record alignment in the ring, bytes.
pub const LINE_BYTES: u64 = 64;
/// Most lines damaged at once.
pub const MAX_DAMAGED_LINES: u64 = 4;

/// Damages the tail of the ring in `data_dir`; says what it did.
pub fn damage_tail(data_dir: &Path, damage: TailDamage, seed: u64) -> Result<String, String> {
    let report = ringraft_wal::check(data_dir)
        .map_err(|e| format!("wal check {}: {e}", data_dir.display()))?;
    let valid = report.end_lsn.saturating_sub(report.start_lsn);
    if valid == 0 {
        return Ok(format!(
            "{}: the ring holds no records; nothing damaged",
            data_dir.display()
        ));
    }
    let capacity = report.header.capacity;
    let lines = 1 + seed % MAX_DAMAGED_LINES;
    let bytes = (lines * LINE_BYTES).min(valid);
    let from_lsn = report.end_lsn - bytes;
    let path = report.ring.clone();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lsn = from_lsn;
    while lsn < report.end_lsn {
        let physical = lsn % capacity;
        let len = (report.end_lsn - lsn).min(capacity - physical);
        let offset = CONTROL_BLOCK_BYTES as u64 + physical;
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| format!("{}: read at {offset}: {e}", path.display()))?;
        match damage {
            TailDamage::Truncate => buf.fill(0),
            TailDamage::Corrupt => {
                for (k, b) in buf.iter_mut().enumerate() {
                    // Every 7th byte flipped: inside a header or a payload,
                    // the record's CRC no longer matches.
                    if k % 7 == (seed % 7) as usize {
                        *b ^= 0xA5;
                    }
                }
            }
        }
        file.write_all_at(&buf, offset)
            .map_err(|e| format!("{}: write at {offset}: {e}", path.display()))?;
        lsn += len;
    }
    file.sync_all()
        .map_err(|e| format!("{}: fsync: {e}", path.display()))?;
    Ok(format!(
        "{}: {} lsn {from_lsn}..{} ({bytes} bytes; valid range was index {}..={:?})",
        data_dir.display(),
        damage.as_str(),
        report.end_lsn,
        report.first_index,
        report.last.map(|l| l.index)
    ))
}
