//! The disk, behind a small synchronous trait, so that a simulated disk can
//! replace the real one (a deterministic simulator is planned).
//!
//! [`Disk`] is a directory-level view (create, open, list, remove files,
//! sync a directory) and [`DiskFile`] a file-level one (positioned vectored
//! write, positioned read, data sync, set length, preallocate). Nothing here
//! spawns a thread or awaits: every call returns when the OS call returns,
//! so a simulator can run the callers step by step. [`RealDisk`] implements
//! them with std and libc.
//!
//! Errors carry the path and the operation ([`WalError::Io`]); a full disk
//! or quota (ENOSPC, EDQUOT) is [`WalError::DiskFull`], so that the caller
//! can refuse appends with a clear status while reads go on.
//!
//! # The observer (a simulation aid)
//!
//! One [`DiskObserver`] per process may be installed
//! ([`install_observer`]): it is told before and after every change
//! [`RealDisk`] and [`RealFile`] make (create, remove, directory sync,
//! write, data sync, set length, preallocate), and may refuse one before
//! it happens. The simulator's power loss (`sim/src/power.rs`) uses it to
//! know which bytes of a file were written since its last sync, and to
//! refuse every write of a node whose power it cut. Without an observer a
//! change costs one atomic load more, nothing next to the system call.
//! Production code never installs one.

use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Result, WalError};

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reads only (the offline checker, readers).
    ReadOnly,
    /// Reads and writes.
    ReadWrite,
}

/// A directory of files on some disk.
pub trait Disk: Send + Sync + 'static {
    /// An open file of this disk.
    type File: DiskFile;

    /// Creates `dir` and its missing parents.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn create_dir_all(&self, dir: &Path) -> Result<()>;

    /// The names of the entries of `dir` (files and directories, in no
    /// particular order; names that are not UTF-8 are left out). A missing
    /// `dir` lists as empty.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn list(&self, dir: &Path) -> Result<Vec<String>>;

    /// Creates a new empty file, read-write; fails when it exists.
    ///
    /// # Errors
    /// [`WalError::Io`] (also when the file exists), [`WalError::DiskFull`].
    fn create_new(&self, path: &Path) -> Result<Self::File>;

    /// Opens an existing file.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn open(&self, path: &Path, access: Access) -> Result<Self::File>;

    /// Removes a file. Open handles of it keep working until dropped.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn remove(&self, path: &Path) -> Result<()>;

    /// Makes the creations and removals of entries in `dir` durable.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn sync_dir(&self, dir: &Path) -> Result<()>;
}

/// An open file of a [`Disk`]. Shared between threads (positioned I/O only,
/// no cursor).
pub trait DiskFile: Send + Sync + 'static {
    /// The path it was opened at (for error messages).
    fn path(&self) -> &Path;

    /// The file's length in bytes.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn size(&self) -> Result<u64>;

    /// Writes all of `bufs`, one after the other, at `offset`: one
    /// positioned vectored write (more only when the OS writes less than
    /// asked or `bufs` has more than `IOV_MAX` parts).
    ///
    /// # Errors
    /// [`WalError::DiskFull`] when the disk is full, [`WalError::Io`]
    /// otherwise; some of the bytes may have been written.
    fn write_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()>;

    /// Reads into `buf` from `offset` until `buf` is full or the file ends;
    /// returns how many bytes were read.
    ///
    /// # Errors
    /// [`WalError::Io`] when the OS refuses.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;

    /// Makes the file's data (and the metadata needed to read it back)
    /// durable: `fdatasync`.
    ///
    /// # Errors
    /// [`WalError::DiskFull`] or [`WalError::Io`]: after a failure, what
    /// was written since the last successful sync may be lost.
    fn sync_data(&self) -> Result<()>;

    /// Sets the file's length (cutting or extending with zeroes).
    ///
    /// # Errors
    /// [`WalError::Io`], [`WalError::DiskFull`].
    fn set_len(&self, len: u64) -> Result<()>;

    /// Allocates disk space for the file's first `len` bytes, extending it
    /// with zeroes to at least `len` (never shrinking it), so that writes
    /// below `len` cannot fail for lack of space.
    ///
    /// # Errors
    /// [`WalError::DiskFull`] when the space is not there, [`WalError::Io`].
    fn preallocate(&self, len: u64) -> Result<()>;
}

/// A change [`RealDisk`] or [`RealFile`] is about to make, or made: what a
/// [`DiskObserver`] is told.
#[derive(Clone, Copy, Debug)]
pub enum DiskOp<'a> {
    /// A new file at `path` ([`Disk::create_new`]).
    Create {
        /// The file.
        path: &'a Path,
    },
    /// The file at `path` is removed ([`Disk::remove`]).
    Remove {
        /// The file.
        path: &'a Path,
    },
    /// The entries of `dir` are made durable ([`Disk::sync_dir`]).
    SyncDir {
        /// The directory.
        dir: &'a Path,
    },
    /// `len` bytes written to `file` at `offset` ([`DiskFile::write_at`]).
    Write {
        /// The file (before the write, the observer may read what the
        /// write covers).
        file: &'a RealFile,
        /// Where the write starts.
        offset: u64,
        /// How many bytes it writes.
        len: u64,
    },
    /// `file`'s data made durable ([`DiskFile::sync_data`]).
    SyncData {
        /// The file.
        file: &'a RealFile,
    },
    /// `file`'s length set to `len` ([`DiskFile::set_len`]).
    SetLen {
        /// The file.
        file: &'a RealFile,
        /// The new length.
        len: u64,
    },
    /// `file` extended with zeroes to at least `len`
    /// ([`DiskFile::preallocate`]).
    Preallocate {
        /// The file.
        file: &'a RealFile,
        /// The length asked for.
        len: u64,
    },
}

/// Sees every change [`RealDisk`] and [`RealFile`] make, process-wide: a
/// simulation aid (module docs). Called on the thread that makes the
/// change; it must not make changes through [`RealDisk`] itself.
pub trait DiskObserver: Send + Sync + 'static {
    /// `op` is about to happen. An error refuses it: the operation fails
    /// with that error and changes nothing.
    ///
    /// # Errors
    /// Whatever the observer wants the operation to fail with.
    fn before(&self, op: DiskOp<'_>) -> std::io::Result<()>;

    /// `op` happened (it succeeded).
    fn after(&self, op: DiskOp<'_>);
}

static OBSERVER: OnceLock<Box<dyn DiskObserver>> = OnceLock::new();

/// Installs the process's [`DiskObserver`] (a simulation aid: module docs).
///
/// # Errors
/// One is installed already: `observer` is given back.
pub fn install_observer(
    observer: Box<dyn DiskObserver>,
) -> std::result::Result<(), Box<dyn DiskObserver>> {
    OBSERVER.set(observer)
}

/// Tells the observer, if any, that `op` is about to happen.
fn before(op: DiskOp<'_>) -> std::io::Result<()> {
    match OBSERVER.get() {
        Some(observer) => observer.before(op),
        None => Ok(()),
    }
}

/// Tells the observer, if any, that `op` happened.
fn after(op: DiskOp<'_>) {
    if let Some(observer) = OBSERVER.get() {
        observer.after(op);
    }
}

/// The real disk: std and libc.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealDisk;

/// A file of [`RealDisk`].
#[derive(Debug)]
pub struct RealFile {
    file: File,
    path: PathBuf,
}

impl RealFile {
    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Disk for RealDisk {
    type File = RealFile;

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(WalError::io("create directory", dir))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(WalError::io("list", dir)(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(WalError::io("list", dir))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create_new(&self, path: &Path) -> Result<RealFile> {
        let op = DiskOp::Create { path };
        before(op).map_err(|e| WalError::from_io("create", path, 0, e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
            .map_err(|e| WalError::from_io("create", path, 0, e))?;
        after(op);
        Ok(RealFile {
            file,
            path: path.to_path_buf(),
        })
    }

    fn open(&self, path: &Path, access: Access) -> Result<RealFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(access == Access::ReadWrite)
            .open(path)
            .map_err(WalError::io("open", path))?;
        Ok(RealFile {
            file,
            path: path.to_path_buf(),
        })
    }

    fn remove(&self, path: &Path) -> Result<()> {
        let op = DiskOp::Remove { path };
        before(op)
            .and_then(|()| std::fs::remove_file(path))
            .map_err(WalError::io("remove", path))?;
        after(op);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        let op = DiskOp::SyncDir { dir };
        before(op)
            .and_then(|()| File::open(dir))
            .and_then(|d| d.sync_all())
            .map_err(WalError::io("sync directory", dir))?;
        after(op);
        Ok(())
    }
}

impl DiskFile for RealFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn size(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(WalError::io("stat", &self.path))?
            .len())
    }

    fn write_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let fail = |e: std::io::Error| WalError::from_io("write", &self.path, total as u64, e);
        let op = DiskOp::Write {
            file: self,
            offset,
            len: total as u64,
        };
        before(op).map_err(fail)?;
        let mut slices: Vec<IoSlice<'_>> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b))
            .collect();
        let mut parts: &mut [IoSlice<'_>] = &mut slices;
        let mut position = offset;
        // IOV_MAX is 1024 on Linux.
        const IOV_MAX: usize = 1024;
        while !parts.is_empty() {
            let batch = parts.len().min(IOV_MAX);
            let position_arg = libc::off_t::try_from(position)
                .map_err(|_| fail(std::io::Error::from_raw_os_error(libc::EFBIG)))?;
            // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the slices
            // borrow live buffers for the duration of the call.
            let written = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    parts.as_ptr().cast::<libc::iovec>(),
                    batch as libc::c_int,
                    position_arg,
                )
            };
            if written < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(fail(err));
            }
            if written == 0 {
                return Err(fail(std::io::Error::from(std::io::ErrorKind::WriteZero)));
            }
            position += written as u64;
            IoSlice::advance_slices(&mut parts, written as usize);
        }
        after(op);
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(WalError::io("read", &self.path)(e)),
            }
        }
        Ok(done)
    }

    fn sync_data(&self) -> Result<()> {
        let op = DiskOp::SyncData { file: self };
        before(op)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| WalError::from_io("fdatasync", &self.path, 0, e))?;
        after(op);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        let op = DiskOp::SetLen { file: self, len };
        before(op)
            .and_then(|()| self.file.set_len(len))
            .map_err(|e| WalError::from_io("set length", &self.path, 0, e))?;
        after(op);
        Ok(())
    }

    fn preallocate(&self, len: u64) -> Result<()> {
        let op = DiskOp::Preallocate { file: self, len };
        before(op).map_err(|e| WalError::from_io("preallocate", &self.path, len, e))?;
        self.allocate(len)?;
        after(op);
        Ok(())
    }
}

impl RealFile {
    /// The work of [`DiskFile::preallocate`] (the observer is told around
    /// it, by the caller).
    fn allocate(&self, len: u64) -> Result<()> {
        let current = self.size()?;
        if current >= len {
            return Ok(());
        }
        let fail = |e| WalError::from_io("preallocate", &self.path, len - current, e);
        let len_arg = libc::off_t::try_from(len)
            .map_err(|_| fail(std::io::Error::from_raw_os_error(libc::EFBIG)))?;
        // SAFETY: a plain syscall on an fd we own.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len_arg) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // A file system without fallocate (tmpfs has it; some FUSE ones
            // do not): extend with zeroes instead; space is found on write.
            return self.set_len(len);
        }
        Err(fail(err))
    }
}
