//! The segment log over crafted segment files (issue 11, item 2):
//! `SegmentLog::open` and the offline `check_segments` must give a verdict
//! or an error for any files, never panic or hang, and agree; what `open`
//! keeps reads back; and the log `open` leaves behind opens clean again,
//! unless it was corrupt inside (which `open` reports and does not cut).
//!
//! Input (shorter inputs are padded with zeroes):
//!
//! ```text
//! offset  size  field
//! 0       1     flags: 1 = reseal segment header CRCs, 2 = reseal record
//!               CRCs, 4 = pass `acked`
//! 1       8     acked index (u64 LE), with flag 4
//! 9       1     number of files (modulo 5)
//! 10      ..    per file: length (u16 LE, at most 16 KiB), then its bytes
//! ```
//!
//! A file is named after the first index its header holds (bytes 32..40),
//! or after its position when that name is taken. The cluster and node ids
//! the log expects are the first file's (bytes 16..32), so that files of
//! one writer are not refused as foreign.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use ringraft_wal::disk::RealDisk;
use ringraft_wal::record::{RECORD_CRC_OFFSET, RECORD_HEADER_BYTES, RECORD_MAGIC};
use ringraft_wal::segment::{SEGMENT_HEADER_BYTES, SEGMENT_MAGIC, segment_name};
use ringraft_wal::{Damage, SegmentConfig, SegmentLog, check_segments};
use ringraft_wal_fuzz::scratch_dir;

const RESEAL_HEADERS: u8 = 1;
const RESEAL_RECORDS: u8 = 2;
const PASS_ACKED: u8 = 4;
const MAX_FILE_BYTES: usize = 16 << 10;

fn le_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn reseal(file: &mut [u8], flags: u8) {
    if flags & RESEAL_HEADERS != 0
        && file.len() >= SEGMENT_HEADER_BYTES
        && file[..8] == SEGMENT_MAGIC
    {
        let crc = crc32fast::hash(&file[..60]);
        file[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    if flags & RESEAL_RECORDS != 0 {
        let mut at = SEGMENT_HEADER_BYTES;
        while at + RECORD_HEADER_BYTES <= file.len() {
            if u32::from_le_bytes(file[at..at + 4].try_into().expect("4")) == RECORD_MAGIC {
                let len = u32::from_le_bytes(file[at + 8..at + 12].try_into().expect("4")) as usize;
                let start = at + RECORD_HEADER_BYTES;
                if let Some(payload) = file.get(start..start.saturating_add(len)) {
                    let mut hasher = crc32fast::Hasher::new();
                    hasher.update(&file[at..at + RECORD_CRC_OFFSET]);
                    hasher.update(payload);
                    let crc = hasher.finalize();
                    file[at + RECORD_CRC_OFFSET..at + 64].copy_from_slice(&crc.to_le_bytes());
                }
            }
            at += 64;
        }
    }
}

/// Writes the input's files into `dir` (emptied first); returns the
/// cluster and node ids of the first file and `acked`.
fn lay_out(input: &[u8], dir: &Path) -> (u64, u64, Option<u64>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("scratch log dir");
    let mut padded = input.to_vec();
    padded.resize(padded.len().max(10), 0);
    let flags = padded[0];
    let acked = (flags & PASS_ACKED != 0).then(|| le_u64(&padded[1..9]));
    let files = padded[9] % 5;
    let mut rest = &padded[10..];
    let mut ids = (0, 0);
    for k in 0..files as u64 {
        if rest.len() < 2 {
            break;
        }
        let len = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(MAX_FILE_BYTES);
        rest = &rest[2..];
        let take = len.min(rest.len());
        let mut file = rest[..take].to_vec();
        rest = &rest[take..];
        reseal(&mut file, flags);
        if k == 0 && file.len() >= 32 {
            ids = (le_u64(&file[16..24]), le_u64(&file[24..32]));
        }
        let named = if file.len() >= 40 {
            le_u64(&file[32..40])
        } else {
            k
        };
        let mut path = dir.join(segment_name(named));
        if path.exists() {
            path = dir.join(segment_name(k));
        }
        if !path.exists() {
            std::fs::write(&path, &file).expect("write a segment file");
        }
    }
    (ids.0, ids.1, acked)
}

fuzz_target!(|input: &[u8]| {
    let dir = scratch_dir().join("log");
    let (cluster_id, node_id, acked) = lay_out(input, &dir);
    let config = SegmentConfig {
        segment_bytes: 4096,
        max_record_bytes: 8192,
        zero_ahead_bytes: 4096,
        ..SegmentConfig::new(cluster_id, node_id)
    };
    let checked = check_segments(&RealDisk, &dir, cluster_id, node_id, acked);
    let opened = SegmentLog::open(RealDisk, &dir, config, acked);
    let (log, recovery) = match (checked, opened) {
        (Ok(checked), Ok((log, recovery))) => {
            assert_eq!(checked.damage, recovery.damage, "check and open disagree");
            assert_eq!(checked.stop, recovery.stop);
            assert_eq!(checked.entries, recovery.entries);
            assert_eq!(checked.last, recovery.last);
            assert_eq!(checked.first_index, recovery.first_index);
            (log, recovery)
        }
        (Err(_), Err(_)) => return,
        (checked, opened) => panic!(
            "check and open disagree: {:?} / {:?}",
            checked.map(|r| r.damage),
            opened.map(|(_, r)| r.damage)
        ),
    };
    let reader = log.reader();
    let (first, next) = reader.range();
    assert_eq!(next - first, recovery.entries);
    for index in first..next {
        reader.read(index).expect("a kept entry reads back");
    }
    if recovery.entries > 0 {
        let all = reader
            .read_range(first, next, u64::MAX)
            .expect("the kept range reads back");
        assert_eq!(all.len() as u64, recovery.entries);
    }
    drop(log);
    if matches!(recovery.damage, Damage::CorruptInside(_)) {
        return;
    }
    // What open left behind is a clean log with the same entries.
    let (log, again) = SegmentLog::open(RealDisk, &dir, config, None).expect("reopen");
    assert_eq!(again.damage, Damage::None, "{again:?} after {recovery:?}");
    assert_eq!(again.stop, None, "{again:?} after {recovery:?}");
    assert_eq!(
        (again.entries, again.last),
        (recovery.entries, recovery.last)
    );
    drop(log);
});
