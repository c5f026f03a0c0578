//! How long `SegmentLog::open` takes to recover a log: it reads every
//! segment whole and checks every record (CRC and chain), one segment in
//! memory at a time (`wal/BENCH.md`, "Segment recovery").
//!
//! ```sh
//! cargo run --release -p ringraft-wal --example segment_recovery -- [--mib 256] [--record 4096] [--dir DIR]
//! ```
//!
//! Writes `--mib` MiB of records of `--record` bytes (payload = record -
//! 64) into a fresh log with the default configuration (64 MiB segments),
//! syncs, drops the page cache of the files it wrote (`posix_fadvise
//! DONTNEED`, so the first open reads from the disk), then opens it twice:
//! cold and warm.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use ringraft_wal::{
    ChainTip, EntryRef, Epoch, RealDisk, RecordEncoder, SegmentConfig, SegmentLog, WriteBuffer,
};

fn main() {
    let mut mib = 256u64;
    let mut record = 4096usize;
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tmp");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--mib" => mib = value.parse().expect("--mib N"),
            "--record" => record = value.parse().expect("--record BYTES"),
            "--dir" => dir = PathBuf::from(value),
            other => panic!("unknown flag {other}"),
        }
    }
    let log_dir = dir.join("segment-recovery");
    let _ = std::fs::remove_dir_all(&log_dir);
    let config = SegmentConfig::new(1, 1);
    let (mut log, _) = SegmentLog::open(RealDisk, &log_dir, config, None).unwrap();
    let capacity = 1u64 << 40;
    let epoch = Epoch::new(1, 1).unwrap();
    let mut encoder = RecordEncoder::new(capacity, 0, ChainTip::after(None), epoch).unwrap();
    let payload = vec![0x5Au8; record.saturating_sub(64)];
    let records = (mib << 20) / record as u64;
    let batch = 64u64;
    let mut index = 0u64;
    while index < records {
        let mut buf = WriteBuffer::new(capacity, encoder.next_lsn()).unwrap();
        for _ in 0..batch.min(records - index) {
            encoder
                .push(
                    &mut buf,
                    &EntryRef {
                        term: 1,
                        index,
                        payload: &payload,
                    },
                )
                .unwrap();
            index += 1;
        }
        log.append(&[&buf.segments()[0].bytes]).unwrap();
    }
    log.sync().unwrap();
    let disk_bytes = log.disk_bytes();
    drop(log);
    for entry in std::fs::read_dir(&log_dir).unwrap() {
        let file = std::fs::File::open(entry.unwrap().path()).unwrap();
        // SAFETY: a plain syscall on an fd we own.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    for label in ["cold", "warm"] {
        let start = Instant::now();
        let (log, recovery) = SegmentLog::open(RealDisk, &log_dir, config, None).unwrap();
        let elapsed = start.elapsed();
        assert_eq!(recovery.entries, records);
        println!(
            "{label}: open of {records} records of {record} B ({} segments, {:.0} MiB on disk) took {:.0} ms ({:.0} MiB/s)",
            recovery.segments,
            disk_bytes as f64 / (1 << 20) as f64,
            elapsed.as_secs_f64() * 1000.0,
            disk_bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
        );
        drop(log);
    }
    std::fs::remove_dir_all(&log_dir).unwrap();
}
