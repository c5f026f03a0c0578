//! Writes seed inputs for the fuzz targets, made by the wal itself: real
//! data directories (clean, wrapped, purged, torn, corrupt inside, begun at
//! an arbitrary index, several epochs) described as `check` / `open`
//! inputs, and real remote batches as `adopt` inputs.
//!
//! `cargo run --example seeds -- CORPUS_DIR` (from wal/fuzz; seed.sh runs it)
//! writes CORPUS_DIR/{check,open,adopt}/NAME.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ringraft_wal::layout::CONTROL_BLOCK_BYTES;
use ringraft_wal::{EntryRef, Epoch, LogPos, RecordEncoder, RingConfig, Wal, WriteBuffer};
use ringraft_wal_fuzz::{
    ADOPT_PURGE, ADOPT_RESEAL, AdoptInput, DirInput, RESEAL_HEADER, RESEAL_META, RESEAL_RECORDS,
    adopt_config, adopt_setup, ring_dir_of,
};

const CAP: u64 = 1 << 20;

fn config() -> RingConfig {
    RingConfig {
        capacity: CAP,
        max_record_bytes: 64 << 10,
        cluster_id: 0x5EED,
        node_id: 1,
        lock_memory: false,
    }
}

fn epoch(term: u64, leader: u64) -> Epoch {
    Epoch::new(term, leader).expect("a small epoch")
}

fn take_fence(wal: &Wal, e: Epoch) {
    let current = wal.ring().fence();
    wal.ring()
        .compare_exchange_fence(current, e)
        .expect("upward");
}

/// Appends `n` entries of `term` under `e`, with payload lengths from `len`.
fn append(wal: &mut Wal, e: Epoch, term: u64, n: u64, len: impl Fn(u64) -> usize) {
    for _ in 0..n {
        let index = wal.ring().next_index();
        let payload: Vec<u8> = (0..len(index))
            .map(|i| (index as usize + i) as u8)
            .collect();
        let entry = EntryRef {
            term,
            index,
            payload: &payload,
        };
        match wal.ring_mut().append(e, &[entry]) {
            Ok(_) => {}
            Err(err) if err.is_retryable() => {
                let first = wal.ring().first_index();
                let upto = first + (wal.ring().next_index() - first) / 2;
                wal.purge(LogPos { term, index: upto }).expect("purge");
                wal.ring_mut()
                    .append(e, &[entry])
                    .expect("append after purge");
            }
            Err(err) => panic!("append: {err}"),
        }
    }
}

/// Builds a data directory with `build`, then describes it as an input.
fn dir_seed(build: impl FnOnce(&Path)) -> DirInput {
    let root = tempfile::tempdir().expect("a temporary directory");
    let dir = root.path().join("data");
    fs::create_dir(&dir).expect("a data directory");
    build(&dir);
    DirInput::from_dir(&dir, RESEAL_META | RESEAL_HEADER | RESEAL_RECORDS)
}

/// Opens data directory `d` of a seed, its ring beside it.
fn open(d: &Path, config: &RingConfig) -> Wal {
    Wal::open(d, &ring_dir_of(d), config).expect("open a seed's data directory")
}

fn flip(dir: &Path, lsn: u64, offset: u64) {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ringraft_wal::ring_path(dir).expect("a ring"))
        .expect("open the ring file");
    let at = CONTROL_BLOCK_BYTES as u64 + lsn % CAP + offset;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0x10], at).expect("write");
}

fn dir_seeds() -> Vec<(&'static str, DirInput)> {
    let e1 = epoch(1, 1);
    let e2 = epoch(2, 2);
    let mut seeds = vec![
        ("empty", dir_seed(|d| drop(open(d, &config())))),
        (
            "clean",
            dir_seed(|d| {
                let mut wal = open(d, &config());
                take_fence(&wal, e1);
                append(&mut wal, e1, 1, 40, |i| (i * 37 % 300) as usize);
                wal.ring_mut().sync_and_ack(39).unwrap();
            }),
        ),
        (
            "wrapped-and-purged",
            dir_seed(|d| {
                let mut wal = open(d, &config());
                take_fence(&wal, e1);
                append(&mut wal, e1, 1, 300, |_| 8000);
                let last = wal.ring().next_index() - 1;
                wal.purge(LogPos {
                    term: 1,
                    index: last - 3,
                })
                .unwrap();
                wal.ring_mut().sync_and_ack(last).unwrap();
            }),
        ),
        (
            "two-epochs",
            dir_seed(|d| {
                let mut wal = open(d, &config());
                take_fence(&wal, e1);
                append(&mut wal, e1, 1, 10, |i| i as usize);
                take_fence(&wal, e2);
                append(&mut wal, e2, 2, 10, |i| i as usize * 3);
                wal.ring_mut().sync_and_ack(15).unwrap();
            }),
        ),
        (
            "begun-at-1000",
            dir_seed(|d| {
                let mut wal = open(d, &config());
                take_fence(&wal, e1);
                let entry = EntryRef {
                    term: 1,
                    index: 1000,
                    payload: b"first",
                };
                wal.ring_mut().append(e1, &[entry]).unwrap();
                append(&mut wal, e1, 1, 5, |_| 10);
                wal.ring_mut().sync().unwrap();
            }),
        ),
    ];
    // Damaged logs: a torn tail, and corruption inside (below the
    // watermark and before well-formed records). Records keep their bad
    // CRCs: no reseal of records.
    for (name, acked, victim) in [("torn-tail", 18, 19), ("corrupt-below-watermark", 19, 10)] {
        let mut input = dir_seed(|d| {
            let mut wal = open(d, &config());
            take_fence(&wal, e1);
            append(&mut wal, e1, 1, 20, |_| 200);
            wal.ring_mut().sync_and_ack(acked).unwrap();
            let lsn = wal.ring().read(victim).unwrap().lsn;
            drop(wal);
            flip(d, lsn, 100);
        });
        input.flags = RESEAL_META | RESEAL_HEADER;
        seeds.push((name, input));
    }
    seeds
}

fn adopt_seeds() -> Vec<(&'static str, AdoptInput)> {
    let mut seeds = Vec::new();
    for (name, local_entries, flags) in [
        ("fresh", 0u8, ADOPT_RESEAL),
        ("after-local", 5, ADOPT_RESEAL),
        ("anchored", 6, ADOPT_RESEAL | ADOPT_PURGE),
    ] {
        // Replay the target's setup to learn the tail a leader writes at.
        let dir = tempfile::tempdir().unwrap();
        let mut wal = open(&dir.path().join("data"), &adopt_config());
        adopt_setup(&mut wal, local_entries, flags & ADOPT_PURGE != 0);
        let ring = wal.ring();
        let writer = epoch(2, 2);
        let mut encoder =
            RecordEncoder::new(CAP, ring.tail_lsn(), ring.tip(), writer).expect("a ring's tail");
        let mut buffer = WriteBuffer::new(CAP, ring.tail_lsn()).expect("a ring's tail");
        let first = ring.next_index();
        for index in first..first + 6 {
            let payload = vec![index as u8; (index * 53 % 400) as usize];
            encoder
                .push(
                    &mut buffer,
                    &EntryRef {
                        term: 2,
                        index,
                        payload: &payload,
                    },
                )
                .expect("a batch that continues the log");
        }
        let bytes: Vec<u8> = buffer
            .segments()
            .iter()
            .flat_map(|s| s.bytes.clone())
            .collect();
        seeds.push((
            name,
            AdoptInput {
                flags,
                local_entries,
                epoch: writer.0,
                span: buffer.end_lsn() - buffer.start_lsn(),
                entries: 6,
                last: Some(LogPos {
                    term: 2,
                    index: first + 5,
                }),
                bytes,
            },
        ));
    }
    seeds
}

fn main() {
    let out = std::env::args_os().nth(1).expect("usage: seeds CORPUS_DIR");
    let out = Path::new(&out);
    for target in ["check", "open"] {
        let dir = out.join(target);
        fs::create_dir_all(&dir).expect("create the corpus directory");
        for (name, input) in dir_seeds() {
            fs::write(dir.join(name), input.to_bytes()).expect("write a seed");
        }
    }
    let dir = out.join("adopt");
    fs::create_dir_all(&dir).expect("create the corpus directory");
    for (name, input) in adopt_seeds() {
        fs::write(dir.join(name), input.to_bytes()).expect("write a seed");
    }
    println!("seeds written to {}", out.display());
}
