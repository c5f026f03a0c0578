//! How to make a write durable on this machine: latency of one write plus
//! its flush, per method and per write size, to choose the segment log's
//! write path (`wal/BENCH.md`, "Segment writes").
//!
//! ```sh
//! cargo run --release -p ringraft-wal --example write_methods --features io-uring-bench -- \
//!     [--iters 2000] [--rounds 2] [--dir DIR]
//! ```
//!
//! Methods (each appends `iters` writes of one size at consecutive offsets
//! of a fresh file, timing each write together with what makes it
//! durable):
//! - `grow`: pwrite + fdatasync, the file growing with each write;
//! - `falloc`: the same into a file preallocated with `fallocate` (unwritten
//!   extents: the first write to a block converts it, a metadata change);
//! - `zeroed`: the same into a file written with zeroes and fsynced before;
//! - `zeroahead`: the same into a fallocated file, the write carrying zeroes
//!   up to the next 1 MiB boundary whenever it passes the zeroed part (one
//!   pwritev), so that extents are converted once per MiB, not per write;
//! - `dsync`: pwrite on an `O_DSYNC` file (zero-filled), no separate flush;
//! - `direct`: pwrite on an `O_DIRECT | O_DSYNC` file (zero-filled), each
//!   write padded to whole 4 KiB blocks from an aligned buffer;
//! - `uring`: one io_uring submission of a write linked to an fdatasync,
//!   into a zero-filled file (feature `io-uring-bench`);
//! - `seglog`: `SegmentLog::append` of one record of that size (payload =
//!   size - 64) + `SegmentLog::sync`, 64 MiB segments preallocated, zeroes
//!   1 MiB ahead (the defaults): the log's own path end to end;
//! - `seglog-nz`: the same with `zero_ahead_bytes: 0`.
//!
//! Files go under `target/bench-tmp` (on the real disk; `/tmp` may be a
//! tmpfs) unless `--dir` says otherwise. The methods take turns write by
//! write (all files open at once, the first to go rotating), so that a
//! change in the machine's load falls on all of them alike; 50 writes of
//! each are a warm-up, not counted.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ringraft_wal::{
    ChainTip, EntryRef, Epoch, RealDisk, RecordEncoder, SegmentConfig, SegmentLog, WriteBuffer,
};

const SIZES: [usize; 4] = [64, 512, 4096, 65536];
const BLOCK: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Grow,
    Falloc,
    Zeroed,
    ZeroAhead,
    Dsync,
    Direct,
    #[cfg(feature = "io-uring-bench")]
    Uring,
    SegLog,
    SegLogNoZero,
}

impl Method {
    fn all() -> Vec<Method> {
        vec![
            Method::Grow,
            Method::Falloc,
            Method::Zeroed,
            Method::ZeroAhead,
            Method::Dsync,
            Method::Direct,
            #[cfg(feature = "io-uring-bench")]
            Method::Uring,
            Method::SegLog,
            Method::SegLogNoZero,
        ]
    }

    fn name(self) -> &'static str {
        match self {
            Method::Grow => "grow: pwrite+fdatasync, growing file",
            Method::Falloc => "falloc: pwrite+fdatasync, fallocated file",
            Method::Zeroed => "zeroed: pwrite+fdatasync, zero-filled file",
            Method::ZeroAhead => "zeroahead: pwritev+fdatasync, fallocated, zeroes 1 MiB ahead",
            Method::Dsync => "dsync: pwrite, O_DSYNC, zero-filled",
            Method::Direct => "direct: pwrite, O_DIRECT|O_DSYNC, zero-filled",
            #[cfg(feature = "io-uring-bench")]
            Method::Uring => "uring: write->fdatasync linked, zero-filled",
            Method::SegLog => "seglog: SegmentLog append+sync",
            Method::SegLogNoZero => "seglog-nz: the same, no zero-ahead",
        }
    }
}

struct Args {
    iters: usize,
    rounds: usize,
    dir: PathBuf,
}

fn parse_args() -> Args {
    let mut args = Args {
        iters: 2000,
        rounds: 2,
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tmp"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--iters" => args.iters = value.parse().expect("--iters N"),
            "--rounds" => args.rounds = value.parse().expect("--rounds N"),
            "--dir" => args.dir = PathBuf::from(value),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

fn fresh(path: &Path, custom_flags: i32) -> File {
    let _ = std::fs::remove_file(path);
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(custom_flags)
        .open(path)
        .expect("create bench file")
}

fn fill_zeroes(path: &Path, len: u64) {
    let file = fresh(path, 0);
    let zeroes = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = zeroes.len().min((len - at) as usize);
        file.write_all_at(&zeroes[..n], at).unwrap();
        at += n as u64;
    }
    file.sync_all().unwrap();
}

/// A buffer aligned to 4 KiB, for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, BLOCK).unwrap();
        // SAFETY: a non-zero size; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated and initialised (zeroed) in `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLOCK).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// Sets up `method` for `iters` durable writes of `size` bytes into a
/// fresh file of `dir` and returns what does write `i` (0..iters, in
/// order).
fn writer(method: Method, size: usize, iters: usize, dir: &Path) -> Box<dyn FnMut(usize)> {
    let path = dir.join(format!("write-methods-{size}-{method:?}"));
    let payload = vec![0xA5u8; size];
    let total = (iters * size.next_multiple_of(BLOCK)) as u64;
    match method {
        Method::Grow | Method::Falloc | Method::Zeroed => {
            positioned_writer(method, &path, payload, size, total)
        }
        Method::ZeroAhead => zero_ahead_writer(&path, payload, size, total),
        Method::Dsync => {
            fill_zeroes(&path, total);
            let file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .open(&path)
                .unwrap();
            Box::new(move |i| file.write_all_at(&payload, (i * size) as u64).unwrap())
        }
        Method::Direct => direct_writer(&path, size, total),
        #[cfg(feature = "io-uring-bench")]
        Method::Uring => uring_writer(&path, payload, size, total),
        Method::SegLog | Method::SegLogNoZero => segment_log_writer(method, size, iters, dir),
    }
}

/// `Grow`, `Falloc` and `Zeroed`: a positioned write and `fdatasync`
/// into a file grown by the writes, preallocated, or filled with zeroes.
fn positioned_writer(
    method: Method,
    path: &Path,
    payload: Vec<u8>,
    size: usize,
    total: u64,
) -> Box<dyn FnMut(usize)> {
    let file = match method {
        Method::Grow => fresh(path, 0),
        Method::Falloc => {
            let file = fresh(path, 0);
            // SAFETY: a plain syscall on an fd we own.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, total as i64) };
            assert_eq!(rc, 0, "fallocate");
            file.sync_all().unwrap();
            file
        }
        _ => {
            fill_zeroes(path, total);
            OpenOptions::new().write(true).open(path).unwrap()
        }
    };
    Box::new(move |i| {
        file.write_all_at(&payload, (i * size) as u64).unwrap();
        file.sync_data().unwrap();
    })
}

/// `ZeroAhead`: a preallocated file, each write carrying zeroes up to the
/// next MiB boundary when it passes the zeroed region.
fn zero_ahead_writer(
    path: &Path,
    payload: Vec<u8>,
    size: usize,
    total: u64,
) -> Box<dyn FnMut(usize)> {
    const AHEAD: u64 = 1 << 20;
    let file = fresh(path, 0);
    // SAFETY: a plain syscall on an fd we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, (total + AHEAD) as i64) };
    assert_eq!(rc, 0, "fallocate");
    file.sync_all().unwrap();
    let zeroes = vec![0u8; AHEAD as usize];
    let mut zeroed_to = 0u64;
    Box::new(move |i| {
        let at = (i * size) as u64;
        let end = at + size as u64;
        let mut parts: Vec<&[u8]> = vec![&payload];
        if end > zeroed_to {
            let to = end.next_multiple_of(AHEAD);
            parts.push(&zeroes[..(to - end) as usize]);
            zeroed_to = to;
        }
        let slices: Vec<std::io::IoSlice<'_>> =
            parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
        // SAFETY: IoSlice is ABI-compatible with iovec; the buffers
        // live through the call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                slices.as_ptr().cast(),
                slices.len() as i32,
                at as i64,
            )
        };
        assert_eq!(n as usize, parts.iter().map(|p| p.len()).sum::<usize>());
        file.sync_data().unwrap();
    })
}

/// `Direct`: `O_DIRECT | O_DSYNC` writes of block-aligned buffers.
fn direct_writer(path: &Path, size: usize, total: u64) -> Box<dyn FnMut(usize)> {
    fill_zeroes(path, total);
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(path)
        .unwrap();
    let block = size.next_multiple_of(BLOCK);
    let buf = Aligned::new(block);
    Box::new(move |i| {
        file.write_all_at(buf.as_slice(), (i * block) as u64)
            .unwrap()
    })
}

/// `Uring`: a write linked to an `fdatasync` through io_uring.
#[cfg(feature = "io-uring-bench")]
fn uring_writer(path: &Path, payload: Vec<u8>, size: usize, total: u64) -> Box<dyn FnMut(usize)> {
    use io_uring::{IoUring, opcode, squeue, types};
    fill_zeroes(path, total);
    let file = OpenOptions::new().write(true).open(path).unwrap();
    let mut ring = IoUring::new(8).unwrap();
    Box::new(move |i| {
        // The closure owns the file, so its fd stays open.
        let fd = types::Fd(file.as_raw_fd());
        let write = opcode::Write::new(fd, payload.as_ptr(), size as u32)
            .offset((i * size) as u64)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(1);
        let sync = opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(2);
        // SAFETY: the payload outlives the submission: we wait for
        // both completions before returning.
        unsafe {
            let mut queue = ring.submission();
            queue.push(&write).unwrap();
            queue.push(&sync).unwrap();
        }
        ring.submit_and_wait(2).unwrap();
        for completion in ring.completion() {
            assert!(
                completion.result() >= 0,
                "io_uring op failed: {}",
                completion.result()
            );
        }
    })
}

/// `SegLog` and `SegLogNoZero`: [`SegmentLog::append`] and `sync` of one
/// pre-encoded record, with or without zeroes ahead.
fn segment_log_writer(
    method: Method,
    size: usize,
    iters: usize,
    dir: &Path,
) -> Box<dyn FnMut(usize)> {
    let log_dir = dir.join(format!("write-methods-{size}-{method:?}.d"));
    let _ = std::fs::remove_dir_all(&log_dir);
    let config = SegmentConfig {
        max_record_bytes: 1 << 20,
        zero_ahead_bytes: if method == Method::SegLog { 1 << 20 } else { 0 },
        ..SegmentConfig::new(1, 1)
    };
    let (mut log, _) = SegmentLog::open(RealDisk, &log_dir, config, None).unwrap();
    let epoch = Epoch::new(1, 1).unwrap();
    let capacity = 1u64 << 40;
    let mut encoder = RecordEncoder::new(capacity, 0, ChainTip::after(None), epoch).unwrap();
    let body = vec![0xA5u8; size.saturating_sub(64)];
    let batches: Vec<Vec<u8>> = (0..iters)
        .map(|i| {
            let mut buf = WriteBuffer::new(capacity, encoder.next_lsn()).unwrap();
            encoder
                .push(
                    &mut buf,
                    &EntryRef {
                        term: 1,
                        index: i as u64,
                        payload: &body,
                    },
                )
                .unwrap();
            buf.segments()[0].bytes.clone()
        })
        .collect();
    Box::new(move |i| {
        log.append(&[&batches[i]]).unwrap();
        log.sync().unwrap();
    })
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank] as f64 / 1000.0
}

fn main() {
    let args = parse_args();
    std::fs::create_dir_all(&args.dir).unwrap();
    let methods = Method::all();
    const WARM_UP: usize = 50;
    let mut results: Vec<Vec<Vec<u64>>> = vec![vec![Vec::new(); methods.len()]; SIZES.len()];
    for round in 0..args.rounds {
        for (s, size) in SIZES.iter().enumerate() {
            eprintln!("round {round}: {size} B");
            let total = WARM_UP + args.iters;
            let mut writers: Vec<Box<dyn FnMut(usize)>> = methods
                .iter()
                .map(|m| writer(*m, *size, total, &args.dir))
                .collect();
            // Write i of every method, one after the other (rotating which
            // goes first), so that the machine's load falls on all alike.
            for i in 0..total {
                for k in 0..methods.len() {
                    let m = (i + k) % methods.len();
                    let start = Instant::now();
                    writers[m](i);
                    let nanos = start.elapsed().as_nanos() as u64;
                    if i >= WARM_UP {
                        results[s][m].push(nanos);
                    }
                }
            }
            drop(writers);
            for entry in std::fs::read_dir(&args.dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if name.starts_with(&format!("write-methods-{size}-")) {
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path).unwrap();
                    } else {
                        std::fs::remove_file(&path).unwrap();
                    }
                }
            }
        }
    }
    println!("| method | size | p50 µs | p99 µs | p99.9 µs | mean µs | writes |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (s, size) in SIZES.iter().enumerate() {
        for (m, method) in methods.iter().enumerate() {
            let mut samples = results[s][m].clone();
            samples.sort_unstable();
            let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
            println!(
                "| {} | {size} | {:.0} | {:.0} | {:.0} | {mean:.0} | {} |",
                method.name(),
                percentile(&samples, 0.5),
                percentile(&samples, 0.99),
                percentile(&samples, 0.999),
                samples.len()
            );
        }
    }
}
