//! Seed inputs of the `segments` fuzz target (format in
//! `fuzz_targets/segments.rs`), made by the segment log itself: a clean log
//! over a few segments, the same with its last record torn, with a byte
//! flipped in the middle, with its last segment's header zeroed, each with
//! and without an acknowledged index.
//!
//! ```sh
//! cargo run --example segment_seeds -- corpus/segments
//! ```

use std::path::Path;

use ringraft_wal::disk::RealDisk;
use ringraft_wal::{
    ChainTip, EntryRef, Epoch, RecordEncoder, SegmentConfig, SegmentLog, WriteBuffer,
};

/// Writes a log of `batches` batches and returns its segment files' bytes.
fn log_files(batches: u64) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = SegmentConfig {
        segment_bytes: 4096,
        max_record_bytes: 8192,
        zero_ahead_bytes: 4096,
        ..SegmentConfig::new(7, 1)
    };
    let (mut log, _) = SegmentLog::open(RealDisk, dir.path(), config, None).expect("open");
    let capacity = 1u64 << 40;
    let mut term = 1;
    let mut encoder = RecordEncoder::new(
        capacity,
        0,
        ChainTip::after(None),
        Epoch::new(1, 1).unwrap(),
    )
    .unwrap();
    for k in 0..batches {
        if k % 3 == 2 {
            term += 1;
            encoder = RecordEncoder::new(
                capacity,
                encoder.next_lsn(),
                encoder.tip(),
                Epoch::new(term, 1).unwrap(),
            )
            .unwrap();
        }
        let mut buf = WriteBuffer::new(capacity, encoder.next_lsn()).unwrap();
        for i in 0..(k % 3 + 1) {
            let tip = encoder.tip();
            let index = if tip.unanchored { 0 } else { tip.next_index };
            let payload = vec![(index * 7 + i) as u8; ((k * 131 + i * 57) % 900) as usize];
            encoder
                .push(
                    &mut buf,
                    &EntryRef {
                        term,
                        index,
                        payload: &payload,
                    },
                )
                .unwrap();
        }
        log.append(&[&buf.segments()[0].bytes]).expect("append");
    }
    log.sync().expect("sync");
    drop(log);
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn encode(flags: u8, acked: u64, files: &[Vec<u8>]) -> Vec<u8> {
    let mut input = vec![flags];
    input.extend_from_slice(&acked.to_le_bytes());
    input.push(files.len() as u8);
    for file in files {
        input.extend_from_slice(&(file.len() as u16).to_le_bytes());
        input.extend_from_slice(file);
    }
    input
}

fn last_record_start(file: &[u8]) -> usize {
    (64..file.len())
        .step_by(64)
        .rev()
        .find(|o| file[*o..o + 4] == *b"RRec")
        .expect("a record")
}

fn main() {
    let out = std::env::args().nth(1).expect("usage: segment_seeds DIR");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    let clean = log_files(9);
    assert!(
        clean.len() >= 3 && clean.len() <= 4,
        "{} files",
        clean.len()
    );
    let mut torn = clean.clone();
    let last = torn.last_mut().unwrap();
    let start = last_record_start(last);
    last.truncate(start + 100);
    let mut flipped = clean.clone();
    flipped[1][64 + 80] ^= 0x10;
    let mut headless = clean.clone();
    headless.last_mut().unwrap()[..64].fill(0);
    let mut seeds = Vec::new();
    for (name, files) in [
        ("clean", &clean),
        ("torn", &torn),
        ("flipped", &flipped),
        ("headless", &headless),
    ] {
        seeds.push((name.to_string(), encode(0, 0, files)));
        seeds.push((format!("{name}-acked"), encode(4, 12, files)));
        seeds.push((format!("{name}-resealed"), encode(3, 0, files)));
    }
    for (name, bytes) in seeds {
        std::fs::write(out.join(name), bytes).unwrap();
    }
}
