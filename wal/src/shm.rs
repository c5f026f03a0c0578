//! Where a ring lives: a named file in a shared-memory directory (the *ring
//! dir*: `/dev/shm` by default, or any tmpfs mount), one per data directory,
//! never a page-cache mapping of a disk file.
//!
//! Why (DESIGN.md, "Where the ring lives"): Linux >= 6.5 refuses long-term
//! writable pins (`ibv_reg_mr` with remote write) of page-cache file mappings
//! (EFAULT on 6.12 with ext4, fine on tmpfs), and a NIC's DMA into such a
//! page does not mark it dirty. A tmpfs file survives the death of the
//! process (unlike a memfd), so a `kill -9` loses nothing; it does not
//! survive a reboot.
//!
//! This module owns the naming, the two records that bind a data directory
//! and its ring, the reservation of the ring's memory, and the removal of
//! rings whose data directory is gone. It never reads or writes a ring's
//! contents ([`crate::ring`] does).
//!
//! # Names and the two bindings
//!
//! A ring file is named `ringraft-<cluster id, hex>-<node id>-<ring id, 16
//! hex digits>.ring`, where the ring id is a random 64-bit number drawn when
//! the ring is created: two data directories, or two clusters, never share a
//! name. Two small records bind the pair, both in the format below:
//! - `<data dir>/ring-location` ([`LOCATION_FILE`]): which ring is this data
//!   directory's (its id, its generation and its path);
//! - `<ring dir>/ringraft-…​.owner`, beside the ring: which data directory
//!   owns the ring (its canonical path).
//!
//! Creation writes them in that order, then the ring: a ring file always has
//! an owner record, and an owner record's data directory already names the
//! ring.
//!
//! # Removal ("cleaned up when the data directory is removed")
//!
//! Every [`crate::Wal::open`] sweeps its ring dir ([`collect_garbage`]): a
//! ring (and its owner record) is deleted, with a log line, when the data
//! directory its owner record names no longer exists, or exists but its
//! `ring-location` names another ring (the directory was wiped and a new log
//! created in it). Anything else is left alone: a ring without a readable
//! owner record, an owner whose `ring-location` cannot be read (it may be
//! being created), a file that is not ours. So removing a data directory
//! (`rm -r DIR`) frees its ring at the next open of any node that uses the
//! same ring dir; [`remove`] (`ringraft wal remove`) frees it at once.
//!
//! The sweep cannot tell a removed data directory from a moved one, nor from
//! one on a file system that is not mounted: all three count as removed. A
//! ring that a process holds open (a running node holds a shared `flock` on
//! it) is never deleted, and an open binds the ring to its data directory's
//! current path again. So move a stopped node's data directory only when no other node
//! opens a ring in the same ring dir before it starts again, or its ring
//! (in `memory` durability: the log) is lost.
//!
//! # The ring's incarnation across a reboot
//!
//! The incarnation lives in the ring's header, in shared memory, and is
//! bumped at every open. When the ring is gone (a reboot) and recreated, the
//! new ring starts at `generation << 32`, where the generation (kept in
//! `ring-location`, on disk) is bumped at every recreation: the new ring's
//! incarnations are above every incarnation the lost one had (unless it was
//! opened 2^32 times).
//!
//! # Huge pages
//!
//! A hugetlbfs ring dir is refused: the ring file (a 4 KiB control block
//! plus the capacity) is not a multiple of the huge page size, and hugetlbfs
//! has no `write(2)`. Mount a tmpfs with `-o huge=always` (or
//! `huge=within_size`) instead: its files are backed by transparent huge
//! pages where the kernel can find them.
//!
//! # Binding record layout, version 1 (little-endian)
//!
//! ```text
//! offset  size  field
//! 0       8     magic "RRFTRLOC" (ring-location) or "RRFTOWNR" (owner)
//! 8       4     version = 1
//! 12      4     path length n, 1..=4096
//! 16      8     ring id (nonzero)
//! 24      8     generation
//! 32      n     path bytes: the ring file (ring-location) or the data
//!               directory (owner), absolute and canonical
//! 32+n    4     CRC32 of bytes 0..32+n
//! ```

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{LayoutError, Result, WalError};
use crate::layout::le_u32;
use crate::layout::le_u64;
use crate::meta::sync_dir;
use crate::ring::RING_FILE;

/// The default ring dir.
pub const DEFAULT_RING_DIR: &str = "/dev/shm";
/// Name of the record, in a data directory, that names its ring.
pub const LOCATION_FILE: &str = "ring-location";

const LOCATION_MAGIC: [u8; 8] = *b"RRFTRLOC";
const OWNER_MAGIC: [u8; 8] = *b"RRFTOWNR";
const BINDING_VERSION: u32 = 1;
const BINDING_FIXED_BYTES: usize = 32;
/// Longest path a binding record holds (Linux's PATH_MAX).
const MAX_BINDING_PATH_BYTES: usize = 4096;
const RING_PREFIX: &str = "ringraft-";
const RING_SUFFIX: &str = ".ring";
const OWNER_SUFFIX: &str = ".owner";
/// Incarnations of one ring generation: a recreated ring starts at
/// `generation << GENERATION_SHIFT`.
const GENERATION_SHIFT: u32 = 32;
/// `statfs` magic numbers (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// What `ring-location` says: which ring a data directory owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingLocation {
    /// The ring's random id (also in its file name).
    pub ring_id: u64,
    /// Bumped each time the ring is recreated after it was lost.
    pub generation: u64,
    /// The ring file.
    pub path: PathBuf,
}

impl RingLocation {
    /// The incarnation a ring of this generation starts from.
    pub fn first_incarnation(&self) -> u64 {
        self.generation << GENERATION_SHIFT
    }
}

/// Encodes a binding record (module docs).
fn encode_binding(magic: [u8; 8], ring_id: u64, generation: u64, path: &Path) -> Vec<u8> {
    let path = path.as_os_str().as_bytes();
    assert!(
        !path.is_empty() && path.len() <= MAX_BINDING_PATH_BYTES,
        "binding path of {} bytes",
        path.len()
    );
    let mut b = Vec::with_capacity(BINDING_FIXED_BYTES + path.len() + 4);
    b.extend_from_slice(&magic);
    b.extend_from_slice(&BINDING_VERSION.to_le_bytes());
    b.extend_from_slice(&(path.len() as u32).to_le_bytes());
    b.extend_from_slice(&ring_id.to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(path);
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes and checks a binding record: magic, CRC, version, lengths, a
/// nonzero ring id, an absolute path.
fn decode_binding(magic: [u8; 8], b: &[u8]) -> Result<RingLocation, LayoutError> {
    if b.len() < BINDING_FIXED_BYTES + 4 + 1 {
        return Err(LayoutError::Truncated {
            needed: BINDING_FIXED_BYTES + 5,
            found: b.len(),
        });
    }
    if b[0..8] != magic {
        return Err(LayoutError::BadMagic);
    }
    let body = b.len() - 4;
    let (stored, computed) = (le_u32(&b[body..]), crc32fast::hash(&b[..body]));
    if stored != computed {
        return Err(LayoutError::HeaderCrc { stored, computed });
    }
    let version = le_u32(&b[8..]);
    if version != BINDING_VERSION {
        return Err(LayoutError::UnsupportedVersion(version));
    }
    let len = le_u32(&b[12..]) as usize;
    if len == 0 || len > MAX_BINDING_PATH_BYTES || BINDING_FIXED_BYTES + len != body {
        return Err(LayoutError::BadField("path length"));
    }
    let ring_id = le_u64(&b[16..]);
    if ring_id == 0 {
        return Err(LayoutError::BadField("ring id"));
    }
    let generation = le_u64(&b[24..]);
    if generation > u64::MAX >> GENERATION_SHIFT {
        return Err(LayoutError::OutOfRange {
            field: "generation",
            value: generation,
            rule: "above 2^32 - 1: no incarnation range is left for it",
        });
    }
    let path = PathBuf::from(OsStr::from_bytes(&b[BINDING_FIXED_BYTES..body]));
    if !path.is_absolute() {
        return Err(LayoutError::BadField("path"));
    }
    Ok(RingLocation {
        ring_id,
        generation,
        path,
    })
}

fn read_binding(magic: [u8; 8], path: &Path) -> Result<RingLocation> {
    let bytes = fs::read(path).map_err(WalError::io("read", path))?;
    decode_binding(magic, &bytes).map_err(|source| WalError::Layout {
        path: path.to_path_buf(),
        source,
    })
}

/// Replaces `path` atomically with `bytes` (write a temporary file, fsync,
/// rename, fsync the directory), readable by the owner only.
fn store_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(WalError::io("create", &tmp))?;
        file.write_all(bytes).map_err(WalError::io("write", &tmp))?;
        file.sync_all().map_err(WalError::io("fsync", &tmp))?;
    }
    fs::rename(&tmp, path).map_err(WalError::io("rename", path))?;
    sync_dir(path)
}

/// Reads `<data_dir>/ring-location`; `None` when there is none.
///
/// # Errors
/// [`WalError::Io`] when it cannot be read, [`WalError::Layout`] when it is
/// not a valid record.
pub fn ring_location(data_dir: &Path) -> Result<Option<RingLocation>> {
    let path = data_dir.join(LOCATION_FILE);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WalError::Io {
            op: "stat",
            path,
            source: e,
        }),
        Ok(_) => read_binding(LOCATION_MAGIC, &path).map(Some),
    }
}

/// The ring file of `data_dir`, as its `ring-location` names it (whether it
/// still exists or not), or `<data_dir>/ring` for a data directory of the
/// layout before rings moved to shared memory.
///
/// # Errors
/// [`WalError::Incomplete`] when the directory names no ring, and the
/// errors of [`ring_location`].
pub fn ring_path(data_dir: &Path) -> Result<PathBuf> {
    if let Some(location) = ring_location(data_dir)? {
        return Ok(location.path);
    }
    let legacy = data_dir.join(RING_FILE);
    if legacy.exists() {
        return Ok(legacy);
    }
    Err(WalError::Incomplete {
        dir: data_dir.to_path_buf(),
        present: "the directory",
        missing: LOCATION_FILE,
    })
}

fn owner_path(ring: &Path) -> PathBuf {
    ring.with_extension(&OWNER_SUFFIX[1..])
}

fn ring_file_name(cluster_id: u64, node_id: u64, ring_id: u64) -> String {
    format!("{RING_PREFIX}{cluster_id:x}-{node_id}-{ring_id:016x}{RING_SUFFIX}")
}

fn random_ring_id() -> Result<u64> {
    loop {
        let mut bytes = [0u8; 8];
        // SAFETY: writes at most 8 bytes into a buffer of 8.
        let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(WalError::Io {
                op: "getrandom",
                path: PathBuf::from("(a ring id)"),
                source: e,
            });
        }
        if n as usize == bytes.len() {
            let id = u64::from_le_bytes(bytes);
            if id != 0 {
                return Ok(id);
            }
        }
    }
}

fn statfs(path: &Path) -> std::io::Result<libc::statfs> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    if rc == 0 {
        Ok(stat)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Bytes an unprivileged process may still allocate in the file system that
/// holds `dir` (`None` when `statfs` fails).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let stat = statfs(dir).ok()?;
    Some((stat.f_bavail as u64).saturating_mul(stat.f_bsize as u64))
}

/// Reserves `len` bytes for the ring file `file` at `path` up front
/// (`posix_fallocate`), so that a ring dir too small for it is an error now
/// rather than a SIGBUS at the first store into a page that cannot be
/// allocated. A file system without `fallocate` gets a sparse file and a
/// warning.
///
/// # Errors
/// [`WalError::RingDirFull`] when the file system has no room (ENOSPC),
/// [`WalError::Io`] for anything else (EFBIG: a file size limit).
pub(crate) fn reserve(file: &File, path: &Path, len: u64) -> Result<()> {
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| WalError::Config(format!("ring file of {len} bytes is too large")))?;
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC => {
            // Give back what was allocated before measuring what is free.
            let _ = file.set_len(0);
            let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
            Err(WalError::RingDirFull {
                free: free_bytes(&dir).unwrap_or(0),
                dir,
                needed: len,
            })
        }
        libc::EOPNOTSUPP | libc::EINVAL => {
            tracing::warn!(
                path = %path.display(),
                error = %std::io::Error::from_raw_os_error(rc),
                "posix_fallocate is not supported here; the ring file is sparse, and a ring \
                 dir that runs out of room may kill the process (SIGBUS) later"
            );
            file.set_len(len).map_err(WalError::io("set_len", path))
        }
        libc::EFBIG => Err(WalError::Io {
            op: "reserve (posix_fallocate hit a file size limit: see `ulimit -f`)",
            path: path.to_path_buf(),
            source: std::io::Error::from_raw_os_error(rc),
        }),
        _ => Err(WalError::Io {
            op: "reserve (posix_fallocate)",
            path: path.to_path_buf(),
            source: std::io::Error::from_raw_os_error(rc),
        }),
    }
}

/// Where a data directory's ring is, found at open (see [`find`]).
#[derive(Debug)]
pub(crate) struct RingPlace {
    data_dir: PathBuf,
    ring_dir: PathBuf,
    location: Option<RingLocation>,
    /// The ring file exists where `location` says.
    present: bool,
    /// A ring file of the layout before shared memory, `<data dir>/ring`.
    legacy: Option<PathBuf>,
}

/// Finds the ring of `data_dir` (which exists) for a node whose ring dir is
/// `ring_dir` (created if missing). Changes nothing in either directory,
/// except `ring-location` when the operator moved the ring into `ring_dir`.
///
/// # Errors
/// [`WalError::RingElsewhere`] when the ring exists in another ring dir,
/// [`WalError::Config`] for a hugetlbfs ring dir, and I/O or layout errors of
/// the two directories.
pub(crate) fn find(data_dir: &Path, ring_dir: &Path) -> Result<RingPlace> {
    fs::create_dir_all(ring_dir).map_err(WalError::io("create ring dir", ring_dir))?;
    let ring_dir = fs::canonicalize(ring_dir).map_err(WalError::io("resolve", ring_dir))?;
    let data_dir = fs::canonicalize(data_dir).map_err(WalError::io("resolve", data_dir))?;
    check_ring_dir(&ring_dir)?;
    let mut location = ring_location(&data_dir)?;
    let mut present = false;
    if let Some(found) = &mut location {
        present = found.path.exists();
        let here = found.path.file_name().map(|name| ring_dir.join(name));
        if present && here.as_ref() != Some(&found.path) {
            return Err(WalError::RingElsewhere {
                dir: data_dir,
                ring: found.path.clone(),
                configured: ring_dir,
            });
        }
        if let Some(here) = here.filter(|here| !present && here.exists()) {
            // The operator moved the ring into the configured ring dir.
            found.path = here;
            store_atomically(
                &data_dir.join(LOCATION_FILE),
                &encode_binding(LOCATION_MAGIC, found.ring_id, found.generation, &found.path),
            )?;
            tracing::info!(ring = %found.path.display(), "the ring was moved into the ring dir");
            present = true;
        }
    }
    let legacy = Some(data_dir.join(RING_FILE)).filter(|p| location.is_none() && p.exists());
    Ok(RingPlace {
        data_dir,
        ring_dir,
        location,
        present,
        legacy,
    })
}

fn check_ring_dir(ring_dir: &Path) -> Result<()> {
    let stat = statfs(ring_dir).map_err(WalError::io("statfs", ring_dir))?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between libcs
    let kind = stat.f_type as i64;
    if kind == HUGETLBFS_MAGIC {
        return Err(WalError::Config(format!(
            "ring dir {} is a hugetlbfs mount, which rings do not support (the ring file, \
             4 KiB + capacity, is not a multiple of the huge page size); use a tmpfs, with \
             -o huge=always for huge pages",
            ring_dir.display()
        )));
    }
    if kind != TMPFS_MAGIC {
        tracing::warn!(
            ring_dir = %ring_dir.display(),
            "the ring dir is not on tmpfs: the ring is then a page-cache mapping of a disk \
             file, which an RDMA device cannot register on Linux >= 6.5 (fine for the tcp \
             and inproc fabrics)"
        );
    }
    Ok(())
}

impl RingPlace {
    /// True when the data directory has a ring file (in the ring dir, or of
    /// the old layout).
    pub(crate) fn ring_exists(&self) -> bool {
        self.present || self.legacy.is_some()
    }

    /// True when the data directory named a ring that is gone.
    pub(crate) fn ring_lost(&self) -> bool {
        self.location.is_some() && !self.present
    }

    /// The canonical ring dir.
    pub(crate) fn ring_dir(&self) -> &Path {
        &self.ring_dir
    }

    /// The ring file, once it exists; moves a ring of the old layout into
    /// the ring dir first.
    pub(crate) fn ready(&mut self, cluster_id: u64, node_id: u64) -> Result<PathBuf> {
        if let Some(legacy) = self.legacy.take() {
            self.migrate(&legacy, cluster_id, node_id)?;
        }
        let location = self
            .location
            .as_ref()
            .expect("a ring that exists has a location");
        assert!(self.present, "ready() on a ring that does not exist");
        // A data directory that was moved (or an owner record lost) is bound
        // again, so that the sweep does not take the ring for an orphan.
        let owner = owner_path(&location.path);
        let bound = read_binding(OWNER_MAGIC, &owner)
            .is_ok_and(|o| o.ring_id == location.ring_id && o.path == self.data_dir);
        if !bound {
            store_atomically(
                &owner,
                &encode_binding(
                    OWNER_MAGIC,
                    location.ring_id,
                    location.generation,
                    &self.data_dir,
                ),
            )?;
            tracing::info!(
                ring = %location.path.display(),
                data_dir = %self.data_dir.display(),
                "bound the ring to its data directory again (was the directory moved?)"
            );
        }
        Ok(location.path.clone())
    }

    /// Names a new ring for this data directory: a fresh id, `generation`,
    /// stored in `ring-location` and in the owner record, in that order.
    /// Returns the ring's path and its first incarnation; the caller
    /// creates the file.
    pub(crate) fn bind_new(
        &mut self,
        cluster_id: u64,
        node_id: u64,
        generation: u64,
    ) -> Result<(PathBuf, u64)> {
        let ring_id = random_ring_id()?;
        let path = self
            .ring_dir
            .join(ring_file_name(cluster_id, node_id, ring_id));
        let location = RingLocation {
            ring_id,
            generation,
            path: path.clone(),
        };
        store_atomically(
            &self.data_dir.join(LOCATION_FILE),
            &encode_binding(LOCATION_MAGIC, ring_id, generation, &path),
        )?;
        store_atomically(
            &owner_path(&path),
            &encode_binding(OWNER_MAGIC, ring_id, generation, &self.data_dir),
        )?;
        let first = location.first_incarnation();
        self.location = Some(location);
        self.present = true;
        Ok((path, first))
    }

    /// The generation of a ring made to replace a lost one.
    pub(crate) fn next_generation(&self) -> Result<u64> {
        let location = self.location.as_ref().expect("a lost ring had a location");
        location
            .generation
            .checked_add(1)
            .filter(|g| *g <= u64::MAX >> GENERATION_SHIFT)
            .ok_or_else(|| WalError::Inconsistent {
                path: self.data_dir.join(LOCATION_FILE),
                what: "the ring was recreated 2^32 times: no generation is left".into(),
            })
    }

    /// Copies a ring file of the old layout into the ring dir (all of it:
    /// header, control words, records), then deletes it. A crash before
    /// `ring-location` names the copy leaves the old file in place (the next
    /// open copies again, and the sweep deletes the half copy, which it
    /// cannot while the copy is being made: the copier holds it); a crash
    /// after leaves a leftover old file, deleted at the next open.
    fn migrate(&mut self, legacy: &Path, cluster_id: u64, node_id: u64) -> Result<()> {
        let len = fs::metadata(legacy)
            .map_err(WalError::io("stat", legacy))?
            .len();
        let ring_id = random_ring_id()?;
        let path = self
            .ring_dir
            .join(ring_file_name(cluster_id, node_id, ring_id));
        store_atomically(
            &owner_path(&path),
            &encode_binding(OWNER_MAGIC, ring_id, 0, &self.data_dir),
        )?;
        {
            let mut source = File::open(legacy).map_err(WalError::io("open", legacy))?;
            let mut target = create_ring_file(&path)?;
            hold(&target, &path);
            reserve(&target, &path, len)
                .and_then(|()| {
                    std::io::copy(&mut source, &mut target)
                        .map_err(WalError::io("copy the ring into", &path))
                })
                .inspect_err(|_| {
                    let _ = fs::remove_file(&path);
                    let _ = fs::remove_file(owner_path(&path));
                })?;
        }
        store_atomically(
            &self.data_dir.join(LOCATION_FILE),
            &encode_binding(LOCATION_MAGIC, ring_id, 0, &path),
        )?;
        fs::remove_file(legacy).map_err(WalError::io("remove", legacy))?;
        sync_dir(legacy)?;
        tracing::info!(
            from = %legacy.display(),
            to = %path.display(),
            "moved the ring out of the data directory into shared memory"
        );
        self.location = Some(RingLocation {
            ring_id,
            generation: 0,
            path,
        });
        self.present = true;
        Ok(())
    }

    /// Deletes a ring file of the old layout that a finished migration left.
    pub(crate) fn remove_leftover(&self) {
        let legacy = self.data_dir.join(RING_FILE);
        if self.location.is_some() && legacy.exists() {
            match fs::remove_file(&legacy) {
                Ok(()) => tracing::info!(
                    path = %legacy.display(),
                    "removed the old ring file a finished move to shared memory left"
                ),
                Err(e) => tracing::warn!(path = %legacy.display(), error = %e, "cannot remove"),
            }
        }
    }
}

/// Takes a shared `flock` on an open ring file, held as long as the file
/// stays open: the sweep ([`collect_garbage`]) never deletes a ring that a
/// process holds, whatever its owner record says (a data directory renamed
/// or removed under a running node). Where `flock` is not supported the
/// ring works without that protection.
pub(crate) fn hold(file: &File, path: &Path) {
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } != 0 {
        tracing::warn!(
            path = %path.display(),
            error = %std::io::Error::last_os_error(),
            "cannot flock the ring: the ring dir's sweep cannot tell it is in use"
        );
    }
}

/// True when no process holds `file` (an exclusive `flock` was taken; it is
/// released when `file` is closed).
fn take_exclusive(file: &File) -> bool {
    // SAFETY: plain syscall on an open descriptor.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Creates a ring file (it must not exist), readable by the owner only.
pub(crate) fn create_ring_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(WalError::io("create", path))
}

/// Why a ring found in a ring dir is deleted.
fn stale_reason(ring_dir: &Path, ring_name: &str) -> Option<String> {
    let ring = ring_dir.join(ring_name);
    let owner = read_binding(OWNER_MAGIC, &owner_path(&ring)).ok()?;
    match fs::symlink_metadata(&owner.path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Some(format!(
                "its data directory {} no longer exists",
                owner.path.display()
            ));
        }
        Err(_) => return None,
        Ok(_) => {}
    }
    let location = match ring_location(&owner.path) {
        Ok(Some(location)) => location,
        Ok(None) if owner.path.join(RING_FILE).exists() => {
            return Some(format!(
                "it is a copy of the old ring {} that was never finished",
                owner.path.join(RING_FILE).display()
            ));
        }
        // Not (yet) readable: it may be being created. Leave it.
        Ok(None) | Err(_) => return None,
    };
    (location.ring_id != owner.ring_id || location.path != ring).then(|| {
        format!(
            "its data directory {} now uses the ring {}",
            owner.path.display(),
            location.path.display()
        )
    })
}

/// Deletes the rings in `ring_dir` whose data directory is gone or names
/// another ring (module docs), with their owner records, and returns the
/// rings deleted. Never fails: what it cannot read or delete it leaves, with
/// a warning.
pub fn collect_garbage(ring_dir: &Path) -> Vec<PathBuf> {
    let entries = match fs::read_dir(ring_dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(ring_dir = %ring_dir.display(), error = %e, "cannot sweep the ring dir");
            return Vec::new();
        }
    };
    let mut names = std::collections::BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(RING_PREFIX) {
            continue;
        }
        if let Some(stem) = name
            .strip_suffix(RING_SUFFIX)
            .or_else(|| name.strip_suffix(OWNER_SUFFIX))
        {
            names.insert(format!("{stem}{RING_SUFFIX}"));
        }
    }
    let mut deleted = Vec::new();
    for name in names {
        let Some(reason) = stale_reason(ring_dir, &name) else {
            continue;
        };
        let ring = ring_dir.join(&name);
        // Held until the ring is deleted: a process that opens it meanwhile
        // waits for the lock, then finds the file gone.
        let _lock = match File::open(&ring) {
            Ok(file) if take_exclusive(&file) => Some(file),
            Ok(_) => {
                tracing::info!(ring = %ring.display(), %reason, "a stale ring is in use: kept");
                continue;
            }
            Err(_) => None,
        };
        let removed = match fs::remove_file(&ring) {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => {
                tracing::warn!(ring = %ring.display(), %reason, error = %e, "cannot delete a stale ring");
                continue;
            }
        };
        // The owner record last, so that a ring never lacks one.
        if let Err(e) = fs::remove_file(owner_path(&ring))
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(ring = %ring.display(), error = %e, "cannot delete a stale owner record");
        }
        if removed {
            tracing::info!(ring = %ring.display(), %reason, "deleted a stale ring");
            deleted.push(ring);
        }
    }
    deleted
}

/// What [`remove`] deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removed {
    /// The ring file, when it existed.
    pub ring: Option<PathBuf>,
    /// The data directory.
    pub data_dir: PathBuf,
}

/// Deletes a data directory and its ring (with the ring's owner record).
/// The node must be stopped first: its mapping would outlive the file.
///
/// # Errors
/// [`WalError::Io`] when a file cannot be deleted (nothing after it is
/// deleted then), and the errors of [`ring_location`].
pub fn remove(data_dir: &Path) -> Result<Removed> {
    let mut ring = None;
    if let Some(location) = ring_location(data_dir)? {
        for (path, is_ring) in [
            (location.path.clone(), true),
            (owner_path(&location.path), false),
        ] {
            match fs::remove_file(&path) {
                Ok(()) if is_ring => ring = Some(path),
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(WalError::Io {
                        op: "remove",
                        path,
                        source,
                    });
                }
            }
        }
    }
    fs::remove_dir_all(data_dir).map_err(WalError::io("remove", data_dir))?;
    Ok(Removed {
        ring,
        data_dir: data_dir.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_round_trip_and_any_bit_flip_is_detected() {
        let path = Path::new("/dev/shm/ringraft-c0ffee-1-0123456789abcdef.ring");
        let b = encode_binding(LOCATION_MAGIC, 0x0123_4567_89ab_cdef, 3, path);
        assert_eq!(
            decode_binding(LOCATION_MAGIC, &b),
            Ok(RingLocation {
                ring_id: 0x0123_4567_89ab_cdef,
                generation: 3,
                path: path.to_path_buf(),
            })
        );
        assert_eq!(&b[0..8], b"RRFTRLOC");
        assert_eq!(le_u32(&b[12..]) as usize, path.as_os_str().len());
        assert_eq!(le_u64(&b[24..]), 3);
        assert_eq!(
            decode_binding(OWNER_MAGIC, &b),
            Err(LayoutError::BadMagic),
            "a location is not an owner record"
        );
        for bit in 0..b.len() * 8 {
            let mut bad = b.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_binding(LOCATION_MAGIC, &bad).is_err(), "bit {bit}");
        }
        for len in 0..b.len() {
            assert!(decode_binding(LOCATION_MAGIC, &b[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn crafted_bindings_are_refused_not_trusted() {
        let reseal = |mut b: Vec<u8>| {
            let body = b.len() - 4;
            let crc = crc32fast::hash(&b[..body]);
            b[body..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let good = encode_binding(OWNER_MAGIC, 7, 0, Path::new("/var/lib/ringraft"));
        let mut zero_id = good.clone();
        zero_id[16..24].fill(0);
        let mut relative = encode_binding(OWNER_MAGIC, 7, 0, Path::new("var/lib/ringraftx"));
        relative = reseal(relative);
        let mut long_len = good.clone();
        long_len[12..16].copy_from_slice(&5000u32.to_le_bytes());
        let mut generation = good.clone();
        generation[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        for (bad, what) in [
            (reseal(zero_id), "ring id"),
            (relative, "path"),
            (reseal(long_len), "path length"),
            (reseal(generation), "generation"),
        ] {
            let err = decode_binding(OWNER_MAGIC, &bad).unwrap_err();
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
    }

    #[test]
    fn ring_names_differ_by_cluster_node_and_id() {
        let a = ring_file_name(0xc0ffee, 1, 5);
        assert_eq!(a, "ringraft-c0ffee-1-0000000000000005.ring");
        assert_ne!(a, ring_file_name(0xc0ffee, 2, 5));
        assert_ne!(a, ring_file_name(0xc0ffef, 1, 5));
        assert_ne!(random_ring_id().unwrap(), random_ring_id().unwrap());
        assert_eq!(
            owner_path(Path::new(
                "/dev/shm/ringraft-c0ffee-1-0000000000000005.ring"
            )),
            Path::new("/dev/shm/ringraft-c0ffee-1-0000000000000005.owner")
        );
    }
}
