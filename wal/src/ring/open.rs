//! Creating and opening a ring file: the header checks, the mapping, the
//! page-cache and mlock setup, and the recovery scan that rebuilds the
//! index → lsn map. It must never write a record, and never touch the
//! data area once the ring may be registered with a fabric.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use memmap2::{MmapMut, MmapOptions};

use crate::control_word::HeadWord;
use crate::error::{LayoutError, Result, WalError};
use crate::layout::{CONTROL_BLOCK_BYTES, RING_HEADER_BYTES, RingHeader, check_index};
use crate::meta::sync_dir;
use crate::recovery::{ScanInput, ScanReport, scan};
use crate::validate::{ChainTip, Geometry};

use super::{Ring, RingConfig, Slot};

impl Ring {
    /// Creates a new ring file at `path` (it must not exist, and is readable
    /// by its owner only), its memory reserved up front, with an empty log,
    /// a zero fence and the given incarnation (0 for a new data directory;
    /// see [`crate::shm`] for a ring recreated after a reboot). Open it with
    /// [`Ring::open`]. On error the file is removed.
    ///
    /// # Errors
    /// [`WalError::RingDirFull`] when the ring dir has no room for it.
    pub fn create(path: &Path, config: &RingConfig, incarnation: u64) -> Result<()> {
        config.geometry()?;
        let file = crate::shm::create_ring_file(path)?;
        let total = CONTROL_BLOCK_BYTES as u64 + config.capacity;
        let header = RingHeader {
            capacity: config.capacity,
            cluster_id: config.cluster_id,
            node_id: config.node_id,
            incarnation,
        };
        crate::shm::reserve(&file, path, total)
            .and_then(|()| {
                file.write_all_at(&header.encode(), 0)
                    .map_err(WalError::io("write header", path))?;
                file.sync_all().map_err(WalError::io("fsync", path))
            })
            .inspect_err(|_| {
                let _ = std::fs::remove_file(path);
            })?;
        sync_dir(path)
    }

    /// Opens the ring at `path`, checks that it is this node's, bumps its
    /// incarnation, and scans the records from its `head` word on. The
    /// first record found starts the chain (its predecessor is in the
    /// segments, where `head` was advanced from): the caller anchors the
    /// ring on the durable log with [`Ring::anchor_on`]. Returns the ring
    /// and the scan's report.
    pub fn open(path: &Path, config: &RingConfig) -> Result<(Ring, ScanReport)> {
        let geometry = config.geometry()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(WalError::io("open", path))?;
        crate::shm::hold(&file, path);
        let header = read_own_header(&file, path, config)?;
        let mut map = map_ring(&file, path, config)?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap returns a non-null pointer");
        let memory_locked = config.lock_memory && lock_memory(&map, path);

        let mut ring = Ring {
            path: path.to_path_buf(),
            _file: file,
            map,
            base,
            geometry,
            header,
            anchor: None,
            first_index: 0,
            slots: VecDeque::new(),
            tip: ChainTip::after(None),
            head_lsn: 0,
            tail_lsn: 0,
            unsynced: None,
            sync_failed: None,
            memory_locked,
        };
        // Check the control words before writing anything.
        let head_word =
            HeadWord::from_word(ring.word(HeadWord::OFFSET).load(Ordering::Acquire)).lsn();
        // A log position: line aligned and at most MAX_LSN (the scan
        // below asserts it).
        crate::layout::check_lsn("head", head_word).map_err(|source| WalError::Layout {
            path: path.to_path_buf(),
            source,
        })?;
        ring.head_lsn = head_word;
        check_index_words(path, &ring)?;
        ring.write_control(0, &header.encode());

        let input = ScanInput {
            geometry: Geometry::loosest(geometry.capacity),
            start_lsn: ring.head_lsn,
            anchor: ring.anchor,
            fence: ring.fence(),
            acked: ring.acked(),
        };
        // SAFETY: the ring is not registered with any fabric yet, so nothing
        // else writes the data area while the scan reads it.
        let area =
            unsafe { std::slice::from_raw_parts(ring.data_ptr(), geometry.capacity as usize) };
        let report = scan(area, input);
        if let (None, Some(first)) = (ring.anchor, report.entries.first()) {
            ring.first_index = first.index;
        }
        ring.slots = report
            .entries
            .iter()
            .map(|e| Slot {
                lsn: e.lsn,
                term: e.term,
            })
            .collect();
        ring.tip = report.tip;
        ring.tail_lsn = report.end_lsn;
        ring.sync_control()?;
        Ok((ring, report))
    }
}

/// Step of [`Ring::open`]: reads the static header, bumps its incarnation
/// and checks that the ring is this node's (cluster, node, capacity).
fn read_own_header(file: &File, path: &Path, config: &RingConfig) -> Result<RingHeader> {
    let mut line = [0u8; RING_HEADER_BYTES];
    file.read_exact_at(&mut line, 0)
        .map_err(WalError::io("read header", path))?;
    let mut header = RingHeader::decode(&line).map_err(|source| WalError::Layout {
        path: path.to_path_buf(),
        source,
    })?;
    header.incarnation = header
        .incarnation
        .checked_add(1)
        .ok_or_else(|| WalError::Layout {
            path: path.to_path_buf(),
            source: LayoutError::OutOfRange {
                field: "incarnation",
                value: header.incarnation,
                rule: "no incarnation is left to bump it to",
            },
        })?;
    WalError::check_owner(
        path,
        &[
            ("cluster id", config.cluster_id, header.cluster_id),
            ("node id", config.node_id, header.node_id),
            ("capacity", config.capacity, header.capacity),
        ],
    )?;
    Ok(header)
}

/// Checks that the ring file at `path` is as large as its header says
/// (control block and a data area of `capacity` bytes) and returns that
/// size, the length to map. Shared by [`Ring::open`] and the offline
/// checker.
pub(crate) fn ring_file_len(file: &File, path: &Path, capacity: u64) -> Result<usize> {
    let total = CONTROL_BLOCK_BYTES as u64 + capacity;
    let size = file.metadata().map_err(WalError::io("stat", path))?.len();
    if size != total {
        return Err(WalError::Inconsistent {
            path: path.to_path_buf(),
            what: format!("file is {size} bytes, its header says {total}"),
        });
    }
    usize::try_from(total)
        .map_err(|_| WalError::Config(format!("ring of {total} bytes does not fit in memory")))
}

/// Step of [`Ring::open`]: checks the file's size against the header, sets
/// up a fresh page cache and maps the file.
fn map_ring(file: &File, path: &Path, config: &RingConfig) -> Result<MmapMut> {
    let len = ring_file_len(file, path, config.capacity)?;
    fresh_page_cache(file, path)?;
    // SAFETY: the file is ours (a ring of this node, checked above) and is
    // not resized while mapped: the ring keeps it open and never truncates
    // it. Concurrent writers other than a registered fabric are outside
    // the contract (one process owns a data directory).
    let map =
        unsafe { MmapOptions::new().len(len).map_mut(file) }.map_err(WalError::io("mmap", path))?;
    map.advise(memmap2::Advice::Random)
        .map_err(WalError::io("madvise", path))?;
    Ok(map)
}

/// Checks the control words that hold `index + 1` (the acknowledged
/// watermark and the commit hint): an index above [`MAX_INDEX`] is no index
/// this ring can hold.
fn check_index_words(path: &Path, ring: &Ring) -> Result<()> {
    for (field, index) in [
        ("acknowledged watermark", ring.acked()),
        ("commit hint", ring.commit_hint()),
    ] {
        if let Some(index) = index {
            check_index(field, index).map_err(|source| WalError::Layout {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Starts the ring from an empty page cache, faulted in page by page.
///
/// This matters for a ring file on a disk (a ring dir that is not a tmpfs,
/// e.g. the wal's own benchmark); on tmpfs both calls do nothing.
///
/// Linux (6.x) caches ext4 files in large folios (up to 2 MiB) when it reads
/// ahead. A store through the mapping dirties a whole folio, and msync then
/// writes all of it back: a 64-byte append cost ~3 ms to sync instead of
/// ~0.3 ms (measured, wal/BENCH.md). So at open: write back what a previous
/// instance left dirty, drop the file's cached pages (they may have come in
/// through read-ahead, from a `cp` or an older process), and forbid
/// read-ahead on the descriptor and, before any page is touched, on the
/// mapping, so that every page is faulted in as its own 4 KiB folio.
fn fresh_page_cache(file: &File, path: &Path) -> Result<()> {
    file.sync_data().map_err(WalError::io("fdatasync", path))?;
    for (advice, what) in [
        (libc::POSIX_FADV_DONTNEED, "posix_fadvise(DONTNEED)"),
        (libc::POSIX_FADV_RANDOM, "posix_fadvise(RANDOM)"),
    ] {
        // SAFETY: plain syscall on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice) };
        if rc != 0 {
            return Err(WalError::Io {
                op: what,
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
    }
    Ok(())
}

fn lock_memory(map: &MmapMut, path: &Path) -> bool {
    match map.lock() {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                path = %path.display(),
                bytes = map.len(),
                %error,
                "mlock of the ring failed (RLIMIT_MEMLOCK?); the ring works but may be paged out"
            );
            false
        }
    }
}
