//! Append throughput of the ring, against plain baselines on the same file
//! system.
//!
//! Groups (one benchmark per payload size and batch size; each reports both
//! records/s and bytes/s of payload through `Throughput::ElementsAndBytes`):
//! - `memory`: `Ring::append` of one batch, no sync;
//! - `fsync`: `Ring::append` of one batch, then `Ring::sync_and_ack` of its
//!   last index;
//! - `memcpy_baseline`: the same payload bytes copied into a memory mapping of
//!   a plain file as large as the ring's data area (no header, no CRC, no
//!   padding), advancing and wrapping at the end of the file;
//! - `pwrite_fdatasync_baseline`: the same payload bytes written with one
//!   positional `write_all_at` per record (advancing, wrapping at the end of a
//!   file as large as the ring's data area), then one `File::sync_data`
//!   (fdatasync) per batch.
//!
//! `memory` is to be read against `memcpy_baseline`, `fsync` against
//! `pwrite_fdatasync_baseline`.
//!
//! # Where the files live
//!
//! `/tmp` may be a tmpfs, on which fsync costs nothing, so the files go under
//! the workspace's target directory (`target/bench-tmp`, git-ignored with
//! `/target`), which is on the real disk. On the machine these benchmarks were
//! first run on that is ext4 on a virtio block device (`/dev/vda`, write-back
//! cache) — see `wal/BENCH.md`. `RINGRAFT_BENCH_DIR` overrides the parent
//! directory.
//!
//! # Keeping the ring from filling up
//!
//! The ring (256 MiB) is shared by the `memory` and `fsync` groups and filled
//! once over its length (up to the wrap marker) before measuring, so that the
//! extents of the preallocated file have been written once (no
//! unwritten-extent conversion in the measured loop; the baseline files are
//! pre-written the same way). The
//! ringraft benchmarks use `iter_custom`: before each batch, when
//! `free_bytes()` is below what the batch may need, the timer is paused, the
//! log is purged up to the last appended entry (`Wal::purge` stores the
//! metadata file with fsync) and the timer resumes. So purges are *excluded*
//! from the measured time; the O(1) room check is included.
//!
//! # Page-cache folios
//!
//! On Linux 6.x ext4 caches file data in large folios (up to 2 MiB) when it
//! reads ahead; a store through a mapping dirties a whole folio and `msync`
//! writes all of it back. `Ring::open` therefore drops the file's cached pages
//! and forbids read-ahead (see `fresh_page_cache` in `wal/src/ring.rs`); the
//! numbers in `wal/BENCH.md` were taken with that in place. Every ringraft
//! benchmark still starts writing at [`START`], the middle of the ring, and
//! the baselines start there too, so that no benchmark depends on where the
//! previous one left the tail.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use memmap2::{MmapMut, MmapOptions};
use ringraft_wal::record::record_len;
use ringraft_wal::{EntryRef, Epoch, LogPos, RingConfig, Wal};

#[path = "../src/test_noise.rs"]
mod noise;

/// Data area of the ring, and size of each baseline file.
const CAPACITY: u64 = 256 << 20;
/// Payload sizes measured.
const PAYLOADS: [(usize, &str); 3] = [(64, "64B"), (1 << 10, "1KiB"), (64 << 10, "64KiB")];
/// Batch sizes measured.
const BATCHES: [usize; 2] = [1, 64];
/// The single term every entry carries.
const TERM: u64 = 1;
const NODE_ID: u64 = 1;
/// Where in the data area (and in each baseline file) every benchmark starts
/// writing: the middle, away from the file's first MiBs, whose page-cache
/// folios are smaller (see "Page-cache folios" above).
const START: u64 = CAPACITY / 2;

fn config() -> RingConfig {
    RingConfig {
        capacity: CAPACITY,
        max_record_bytes: 64 << 10,
        cluster_id: 0xBE7C,
        node_id: NODE_ID,
        lock_memory: false,
    }
}

fn bench_parent() -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGRAFT_BENCH_DIR") {
        return PathBuf::from(dir);
    }
    let target = option_env!("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("bench-tmp")
}

/// `batch * size` distinct payload bytes (a non-trivial pattern), so that a
/// batch of large records does not copy from one cache-resident buffer.
fn payload_source(size: usize, batch: usize) -> Vec<u8> {
    noise::noise(0x9E37_79B9_7F4A_7C15, size * batch)
}

/// The ring under test: one data directory, fenced once, shared by all the
/// ringraft benchmarks.
struct Bench {
    wal: Wal,
    epoch: Epoch,
}

impl Bench {
    fn open(dir: &Path) -> Bench {
        // The ring stays beside the data directory, in the bench dir (a disk:
        // see the module docs), where these numbers were first taken; a node's
        // ring lives in /dev/shm, where msync costs nothing.
        let ring_dir = dir.with_extension("shm");
        let wal = Wal::open(dir, &ring_dir, &config()).expect("open wal");
        let epoch = Epoch::new(TERM, NODE_ID).expect("epoch");
        let found = wal
            .ring()
            .compare_exchange_fence(Epoch::ZERO, epoch)
            .expect("take fence");
        assert_eq!(found, Epoch::ZERO, "fresh ring has a zero fence");
        let mut bench = Bench { wal, epoch };
        bench.prefill();
        bench
    }

    /// Writes one full lap of 64 KiB records, durably, then purges it all.
    fn prefill(&mut self) {
        let source = payload_source(64 << 10, 64);
        let mut entries = Vec::with_capacity(64);
        while self.wal.ring().tail_lsn() < CAPACITY {
            if !self.fits(64 << 10, 64) {
                self.purge_all();
            }
            self.append(&source, 64 << 10, 64, &mut entries);
        }
        self.wal.ring_mut().sync().expect("sync");
        self.purge_all();
    }

    /// Moves the tail (untimed) into `START..START + 1 MiB` with filler
    /// records, makes everything durable and purges it all.
    fn rewind(&mut self) {
        let filler = payload_source(64 << 10, 1);
        let mut entries = Vec::with_capacity(1);
        while !(START..START + (1 << 20)).contains(&(self.wal.ring().tail_lsn() % CAPACITY)) {
            if !self.fits(64 << 10, 1) {
                self.purge_all();
            }
            self.append(&filler, 64 << 10, 1, &mut entries);
        }
        self.wal.ring_mut().sync().expect("sync");
        self.purge_all();
    }

    /// Whether a batch of `batch` records of `size` bytes surely fits:
    /// their records, plus at most one record's worth of tail the ring skips
    /// with a wrap marker.
    #[inline]
    fn fits(&self, size: usize, batch: usize) -> bool {
        let record = record_len(size as u64);
        self.wal.ring().free_bytes() >= (batch as u64 + 1) * record
    }

    /// Purges the whole log: up to the last appended entry (all of them carry
    /// `TERM`).
    fn purge_all(&mut self) {
        let next = self.wal.ring().next_index();
        if next > 0 {
            let last = LogPos {
                term: TERM,
                index: next - 1,
            };
            self.wal.purge(last).expect("purge");
        }
    }

    /// Appends one batch of `batch` records of `size` bytes taken from
    /// `source`; returns the last index.
    #[inline]
    fn append<'a>(
        &mut self,
        source: &'a [u8],
        size: usize,
        batch: usize,
        entries: &mut Vec<EntryRef<'a>>,
    ) -> u64 {
        let ring = self.wal.ring_mut();
        let first = ring.next_index();
        entries.clear();
        entries.extend(
            source
                .chunks_exact(size)
                .take(batch)
                .enumerate()
                .map(|(i, payload)| EntryRef {
                    term: TERM,
                    index: first + i as u64,
                    payload,
                }),
        );
        ring.append(self.epoch, entries).expect("append");
        first + batch as u64 - 1
    }

    /// `iters` batches; the timer is paused around each purge.
    fn run(
        &mut self,
        iters: u64,
        size: usize,
        batch: usize,
        source: &[u8],
        fsync: bool,
    ) -> Duration {
        if fsync {
            // Leftovers of the memory benchmarks (which never sync, so leave
            // much of the ring dirty) are flushed untimed. Memory mode does
            // not sync here: its baseline never flushes either.
            self.wal.ring_mut().sync().expect("sync");
        }
        let mut entries = Vec::with_capacity(batch);
        let mut total = Duration::ZERO;
        let mut start = Instant::now();
        for _ in 0..iters {
            if !self.fits(size, batch) {
                total += start.elapsed();
                self.purge_all();
                start = Instant::now();
            }
            let last = self.append(source, size, batch, &mut entries);
            if fsync {
                self.wal
                    .ring_mut()
                    .sync_and_ack(last)
                    .expect("sync_and_ack");
            }
        }
        total + start.elapsed()
    }
}

/// A preallocated file of `CAPACITY` bytes, written over once and synced.
fn baseline_file(path: &Path) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("create baseline file");
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, CAPACITY as libc::off_t) };
    assert_eq!(rc, 0, "posix_fallocate");
    let chunk = payload_source(1 << 20, 1);
    for offset in (0..CAPACITY).step_by(chunk.len()) {
        file.write_all_at(&chunk, offset).expect("prefill");
    }
    file.sync_all().expect("fsync");
    file
}

/// Where the next record of `len` bytes goes in a plain file of `CAPACITY`
/// bytes: at `pos`, or at 0 when it would run past the end.
#[inline]
fn advance(pos: &mut u64, len: usize) -> u64 {
    if *pos + len as u64 > CAPACITY {
        *pos = 0;
    }
    let at = *pos;
    *pos += len as u64;
    at
}

fn throughput(size: usize, batch: usize) -> Throughput {
    Throughput::ElementsAndBytes {
        elements: batch as u64,
        bytes: (size * batch) as u64,
    }
}

fn benches(c: &mut Criterion) {
    let parent = bench_parent();
    std::fs::create_dir_all(&parent).expect("create bench dir");
    let tmp = tempfile::Builder::new()
        .prefix("wal-append-")
        .tempdir_in(&parent)
        .expect("temp dir");
    eprintln!("bench files in {}", tmp.path().display());
    let mut bench = Bench::open(&tmp.path().join("wal"));

    for (group_name, fsync) in [("memory", false), ("fsync", true)] {
        let mut group = c.benchmark_group(group_name);
        for (size, label) in PAYLOADS {
            for batch in BATCHES {
                let source = payload_source(size, batch);
                bench.rewind();
                group.throughput(throughput(size, batch));
                group.bench_function(BenchmarkId::new(label, format!("batch{batch}")), |b| {
                    b.iter_custom(|iters| bench.run(iters, size, batch, &source, fsync))
                });
            }
        }
        group.finish();
    }
    drop(bench);

    let copy_file = baseline_file(&tmp.path().join("memcpy.dat"));
    // SAFETY: the file is private to this benchmark and not resized while
    // mapped.
    let mut map: MmapMut = unsafe {
        MmapOptions::new()
            .len(CAPACITY as usize)
            .map_mut(&copy_file)
    }
    .expect("mmap baseline");
    baseline(
        c,
        "memcpy_baseline",
        |map: &mut MmapMut, at, payload| {
            let at = at as usize;
            map[at..at + payload.len()].copy_from_slice(payload);
        },
        |map| {
            black_box(map.as_ptr());
        },
        &mut map,
    );
    drop(map);
    drop(copy_file);

    let mut file = baseline_file(&tmp.path().join("pwrite.dat"));
    baseline(
        c,
        "pwrite_fdatasync_baseline",
        |file: &mut File, at, payload| file.write_all_at(payload, at).expect("pwrite"),
        |file| file.sync_data().expect("fdatasync"),
        &mut file,
    );
}

/// One baseline group: every payload size and batch, each batch's payloads
/// written one after another at advancing positions by `write`, then
/// `finish` (a flush, or nothing) on `target`.
fn baseline<T>(
    c: &mut Criterion,
    name: &str,
    mut write: impl FnMut(&mut T, u64, &[u8]),
    mut finish: impl FnMut(&mut T),
    target: &mut T,
) {
    let mut group = c.benchmark_group(name);
    for (size, label) in PAYLOADS {
        for batch in BATCHES {
            let source = payload_source(size, batch);
            let mut pos = START;
            group.throughput(throughput(size, batch));
            group.bench_function(BenchmarkId::new(label, format!("batch{batch}")), |b| {
                b.iter(|| {
                    for payload in source.chunks_exact(size) {
                        let at = advance(&mut pos, size);
                        write(target, at, payload);
                    }
                    finish(target);
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = append;
    // 24 benchmarks; ~1 s warm-up + 4 s measurement each, plus the untimed
    // prefill of three 256 MiB files and a rewind before each ringraft
    // benchmark, keeps `cargo bench -p ringraft-wal --bench append` at about
    // 4 minutes on a 2-core machine (the build not counted).
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = benches
}
criterion_main!(append);
