//! Helpers shared by the wal integration tests.
#![allow(dead_code)]

use std::ops::Range;
use std::path::{Path, PathBuf};

use ringraft_wal::{
    AdoptRequest, ChainTip, EntryRef, Epoch, LogPos, RecordEncoder, Ring, RingConfig, Wal,
    WriteBuffer,
};

#[path = "../../src/test_noise.rs"]
pub mod noise;
pub mod segments;

pub const CAP: u64 = 1 << 20;
pub const MAX_RECORD: u64 = 16 << 10;

pub fn config(node_id: u64) -> RingConfig {
    RingConfig {
        capacity: CAP,
        max_record_bytes: MAX_RECORD,
        cluster_id: 0xC0FFEE,
        node_id,
        lock_memory: false,
    }
}

pub fn epoch(term: u64, leader: u64) -> Epoch {
    Epoch::new(term, leader).unwrap()
}

/// A test's data directory, `<temp>/data`, whose ring dir is `<temp>/shm`
/// (see [`ring_dir_of`]): rings never land in the machine's /dev/shm, and
/// both go when the test ends.
pub struct TestDir {
    root: tempfile::TempDir,
    data: PathBuf,
}

impl TestDir {
    /// The data directory (created empty).
    pub fn path(&self) -> &Path {
        &self.data
    }

    /// The temporary directory that holds both.
    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

/// A new [`TestDir`].
pub fn tempdir() -> TestDir {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    TestDir { root, data }
}

/// The ring dir of the tests' data directory `dir`: `shm` beside it.
pub fn ring_dir_of(dir: &Path) -> PathBuf {
    dir.parent()
        .expect("a data directory has a parent")
        .join("shm")
}

/// The ring file of data directory `dir`.
pub fn ring_path(dir: &Path) -> PathBuf {
    ringraft_wal::ring_path(dir).unwrap()
}

/// The ring file of data directory `dir`, open for reading and writing
/// behind the ring's back (what a crafted or damaged file needs).
pub fn ring_file(dir: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ring_path(dir))
        .unwrap()
}

/// Opens data directory `dir` with `config`, its ring in [`ring_dir_of`].
pub fn open_with(dir: &Path, config: &RingConfig) -> Result<Wal, ringraft_wal::WalError> {
    Wal::open(dir, &ring_dir_of(dir), config)
}

pub fn open(dir: &Path) -> Wal {
    open_with(dir, &config(1)).unwrap()
}

/// Opens data directory `dir` as [`open`] does and takes the ring's fence
/// for `e`: the node is ready to append as the leader of `e`.
pub fn open_fenced(dir: &Path, e: Epoch) -> Wal {
    let wal = open(dir);
    take_fence(wal.ring(), e);
    wal
}

/// A payload that tells which entry it belongs to.
pub fn payload(index: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (index as usize * 31 + i) as u8).collect()
}

/// Appends `n` entries of `term` under `e` after the log's last one,
/// payload length from `len_of`.
pub fn append_n(ring: &mut Ring, e: Epoch, term: u64, n: u64, len_of: impl Fn(u64) -> usize) {
    let first = ring.next_index();
    append_range(ring, e, term, first..first + n, len_of);
}

/// Appends the entries `indexes` of `term` under `e`, one append each,
/// payload length from `len_of`.
pub fn append_range(
    ring: &mut Ring,
    e: Epoch,
    term: u64,
    indexes: Range<u64>,
    len_of: impl Fn(u64) -> usize,
) {
    for index in indexes {
        let p = payload(index, len_of(index));
        ring.append(
            e,
            &[EntryRef {
                term,
                index,
                payload: &p,
            }],
        )
        .unwrap();
    }
}

/// Takes the fence of `ring` for `e` from whatever it holds.
pub fn take_fence(ring: &Ring, e: Epoch) {
    let current = ring.fence();
    assert_eq!(ring.compare_exchange_fence(current, e).unwrap(), current);
}

/// Plays a remote leader: encodes `entries` (as (index, term, payload))
/// after `tip` at `start_lsn` and writes them into the ring's data area as
/// a one-sided WRITE would.
pub fn remote_write(
    ring: &Ring,
    start_lsn: u64,
    tip: ChainTip,
    e: Epoch,
    entries: &[(u64, u64, Vec<u8>)],
) -> WriteBuffer {
    let mut encoder = RecordEncoder::new(CAP, start_lsn, tip, e).unwrap();
    let mut buf = WriteBuffer::new(CAP, start_lsn).unwrap();
    for (index, term, p) in entries {
        encoder
            .push(
                &mut buf,
                &EntryRef {
                    term: *term,
                    index: *index,
                    payload: p,
                },
            )
            .unwrap();
    }
    let data = ring.regions().data;
    for seg in buf.segments() {
        assert!(seg.physical as usize + seg.bytes.len() <= data.len);
        // SAFETY: in bounds of the data area; the test is the only writer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                seg.bytes.as_ptr(),
                data.addr.add(seg.physical as usize),
                seg.bytes.len(),
            )
        };
    }
    buf
}

/// The request that asks a follower to adopt `entries` (as (index, term,
/// payload)), which a remote leader wrote as `buf` ([`remote_write`]): its
/// lsn range, count and last log id.
pub fn adopt_request(buf: &WriteBuffer, entries: &[(u64, u64, Vec<u8>)]) -> AdoptRequest {
    AdoptRequest {
        from_lsn: buf.start_lsn(),
        to_lsn: buf.end_lsn(),
        entries: entries.len() as u64,
        last: entries.last().map(|(index, term, _)| LogPos {
            term: *term,
            index: *index,
        }),
    }
}

/// Everything the log holds, as (index, term, payload).
pub fn contents(ring: &Ring) -> Vec<(u64, u64, Vec<u8>)> {
    (ring.first_index()..ring.next_index())
        .map(|i| {
            let r = ring.read(i).unwrap();
            (r.index, r.term, r.payload.to_vec())
        })
        .collect()
}

pub fn last(term: u64, index: u64) -> Option<LogPos> {
    Some(LogPos { term, index })
}

/// Compares logs by (index, term, payload length, payload hash) so that a
/// failure prints something readable.
pub fn summary(log: &[(u64, u64, Vec<u8>)]) -> Vec<(u64, u64, usize, u32)> {
    log.iter()
        .map(|(i, t, p)| (*i, *t, p.len(), crc32fast::hash(p)))
        .collect()
}

#[macro_export]
macro_rules! assert_log_eq {
    ($left:expr, $right:expr $(, $($arg:tt)*)?) => {
        assert_eq!($crate::common::summary(&$left), $crate::common::summary(&$right) $(, $($arg)*)?)
    };
}
