//! Errors of the `wal` crate.
//!
//! Everything that comes from a file, a remote writer or a caller is reported
//! with the context needed to act on it; nothing from outside the process
//! panics. A broken invariant of our own (an index map out of step with the
//! ring, say) is a bug and is asserted instead.

use std::path::{Path, PathBuf};

use crate::layout::Epoch;
use crate::record::EncodeError;
use crate::validate::{Invalid, LogPos};

/// A control block or metadata header that cannot be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: {found} bytes, need {needed}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes found.
        found: usize,
    },
    /// Not a ringraft file.
    #[error("bad magic: not a ringraft file")]
    BadMagic,
    /// The header's CRC does not match.
    #[error("header CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrc {
        /// CRC stored.
        stored: u32,
        /// CRC computed.
        computed: u32,
    },
    /// A layout version this build does not read.
    #[error("unsupported layout version {0}")]
    UnsupportedVersion(u32),
    /// A control block size other than 4096.
    #[error("control block size {0} is not 4096")]
    ControlBlockSize(u32),
    /// Reserved bytes are not zero.
    #[error("reserved bytes are not zero")]
    ReservedNotZero,
    /// A capacity that is not a power of two within bounds.
    #[error("capacity {0} is not a power of two between 1 MiB and 1 TiB")]
    BadCapacity(u64),
    /// A field holds a value its type does not allow.
    #[error("invalid field {0}")]
    BadField(&'static str),
    /// A field holds a number outside the range the format allows.
    #[error("{field} is {value:#x}: {rule}")]
    OutOfRange {
        /// The field, as the file layout names it.
        field: &'static str,
        /// The value found.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
}

/// Why records a remote writer put into the ring were not adopted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    /// The records do not start where the adopted log ends.
    #[error("records start at lsn {from_lsn}, but the adopted log ends at {tail_lsn}")]
    NotAtTail {
        /// Where the control message says they start.
        from_lsn: u64,
        /// Where the adopted log ends.
        tail_lsn: u64,
    },
    /// The range is reversed or runs beyond `head + capacity`.
    #[error("lsn range {from_lsn}..{to_lsn} is not within the window ending at {limit_lsn}")]
    BadRange {
        /// Start of the range.
        from_lsn: u64,
        /// End of the range.
        to_lsn: u64,
        /// `head + capacity`.
        limit_lsn: u64,
    },
    /// A record in the range is invalid.
    #[error("record at lsn {lsn} rejected: {reason}")]
    Rejected {
        /// Position of the record.
        lsn: u64,
        /// Why.
        reason: Invalid,
    },
    /// The records do not end exactly at the range's end.
    #[error("records end at lsn {found}, the control message said {expected}")]
    EndMismatch {
        /// End given by the control message.
        expected: u64,
        /// End the records reach.
        found: u64,
    },
    /// The records are not the entries the control message names.
    #[error(
        "records hold {found_count} entries ending at {found_last:?}, expected {expected_count} ending at {expected_last:?}"
    )]
    EntriesMismatch {
        /// Entry count named by the message.
        expected_count: u64,
        /// Last log id named by the message.
        expected_last: Option<LogPos>,
        /// Entry count found.
        found_count: u64,
        /// Last log id found.
        found_last: Option<LogPos>,
    },
}

/// Errors of the write-ahead log.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file's header cannot be decoded.
    #[error("{path}: {source}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: LayoutError,
    },
    /// A file belongs to another cluster or node, or has another shape.
    #[error("{path} belongs elsewhere: its {field} is {found}, this node expects {expected}")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Which identity field differs.
        field: &'static str,
        /// The value configured.
        expected: u64,
        /// The value in the file.
        found: u64,
    },
    /// The data directory holds one of the two files but not the other.
    #[error(
        "{dir}: {present} exists but {missing} does not; refusing to guess (restore it or start from an empty directory)"
    )]
    Incomplete {
        /// The data directory.
        dir: PathBuf,
        /// The file that exists.
        present: &'static str,
        /// The file that is missing.
        missing: &'static str,
    },
    /// The ring dir has no room for the ring (ENOSPC when its memory was
    /// reserved).
    #[error(
        "{dir}: no room for a ring of {needed} bytes ({free} bytes free); give the ring dir \
         more room (a bigger /dev/shm: `docker run --shm-size=...`, or \
         `mount -o remount,size=... /dev/shm`), lower the ring capacity, or point the ring \
         dir (`--ring-dir`) at a bigger tmpfs"
    )]
    RingDirFull {
        /// The ring dir.
        dir: PathBuf,
        /// Bytes the ring file needs (control block and data area).
        needed: u64,
        /// Bytes free in the ring dir after the failed reservation.
        free: u64,
    },
    /// The data directory's ring exists, but in another ring dir than the
    /// one configured.
    #[error(
        "{dir}: its ring is {ring}, outside the configured ring dir {configured}; set the ring \
         dir back to where the ring is, or stop the node and move the ring file and its \
         .owner file into {configured}"
    )]
    RingElsewhere {
        /// The data directory.
        dir: PathBuf,
        /// Its ring file.
        ring: PathBuf,
        /// The ring dir configured.
        configured: PathBuf,
    },
    /// The data directory names a ring that no longer exists (shared memory
    /// is cleared at a reboot).
    #[error(
        "{dir}: its ring {ring} is gone (shared memory does not survive a reboot); the node \
         recreates it when it starts, from the metadata file"
    )]
    RingGone {
        /// The data directory.
        dir: PathBuf,
        /// The ring file it names.
        ring: PathBuf,
    },
    /// The control block and the metadata file disagree.
    #[error("{path}: {what}")]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// What disagrees.
        what: String,
    },
    /// An earlier msync failed: nothing written since can be called durable.
    #[error(
        "{path}: an earlier msync failed ({first}); restart the node to recover from what is on disk"
    )]
    SyncFailed {
        /// The ring file.
        path: PathBuf,
        /// The first failure.
        first: String,
    },
    /// A configuration value is out of bounds.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The ring has no room until the log is purged; wait and retry.
    #[error("ring full: need {needed} bytes, {free} free until head advances")]
    RingFull {
        /// Bytes the operation needs.
        needed: u64,
        /// Bytes free before `head + capacity`.
        free: u64,
    },
    /// The log reached the end of the lsn space ([`crate::layout::MAX_LSN`]):
    /// nothing more can be written to this ring, ever. Not retryable: the
    /// node needs a new ring (an empty data directory and a snapshot).
    #[error(
        "the log would end at lsn {end_lsn}, beyond the end of the lsn space ({max_lsn}); \
         this ring can take no more records: start the node from an empty data directory"
    )]
    LsnSpaceExhausted {
        /// Where the write would end.
        end_lsn: u64,
        /// The end of the lsn space.
        max_lsn: u64,
    },
    /// A record above the configured maximum.
    #[error("record of {len} bytes is above the maximum of {max}")]
    RecordTooLarge {
        /// Payload length.
        len: u64,
        /// Configured maximum.
        max: u64,
    },
    /// A writer that does not hold an epoch the ring would accept.
    #[error("writer's {epoch} is above the ring's fence {fence}")]
    EpochAboveFence {
        /// Writer's epoch.
        epoch: Epoch,
        /// Ring's fence.
        fence: Epoch,
    },
    /// The fence may only move upward.
    #[error("fence can only move upward: {current} to {proposed} refused")]
    FenceDownward {
        /// Current fence.
        current: Epoch,
        /// Proposed fence.
        proposed: Epoch,
    },
    /// An entry does not continue the log.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// Remotely written records were not adopted.
    #[error(transparent)]
    Adopt(#[from] AdoptError),
    /// The index is not in the log.
    #[error("index {index} is not in the log (it holds {first}..{next})")]
    NotInLog {
        /// The index asked for.
        index: u64,
        /// First index held.
        first: u64,
        /// One past the last index held.
        next: u64,
    },
    /// A truncation or purge that contradicts the log.
    #[error("{0}")]
    Conflict(String),
    /// The disk (or the quota) is full: appends are refused until space is
    /// freed; reads go on. Retry after retention or a trim freed space.
    #[error(
        "{path}: disk full (no space for {needed} more bytes); appends are refused until space is freed, reads go on"
    )]
    DiskFull {
        /// The file that could not grow.
        path: PathBuf,
        /// Bytes the operation needed (0 when the OS did not say, e.g. a flush).
        needed: u64,
    },
    /// An earlier write or flush of the segment log failed: what was
    /// written since may not be on disk (the kernel may have dropped the
    /// dirty pages), so nothing more is written or called durable.
    #[error(
        "{path}: an earlier {op} failed ({first}); restart the node to recover from what is on disk"
    )]
    LogFailed {
        /// The file the first failure named.
        path: PathBuf,
        /// The operation that failed.
        op: &'static str,
        /// The first failure.
        first: String,
    },
    /// The index is below the first index the segment log retains
    /// (removed by retention or a trim).
    #[error("index {index} was removed by retention: the log retains {first}..{next}")]
    Trimmed {
        /// The index asked for.
        index: u64,
        /// First retained index.
        first: u64,
        /// One past the last index held.
        next: u64,
    },
    /// A stored record no longer passes its checks.
    #[error("record {index} at lsn {lsn} is corrupt in memory: {detail}")]
    Corrupt {
        /// Its index.
        index: u64,
        /// Its position.
        lsn: u64,
        /// What failed.
        detail: String,
    },
}

impl WalError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> WalError {
        let path = path.into();
        move |source| WalError::Io { op, path, source }
    }

    /// An I/O error of `op` on `path` that tried to write `needed` bytes:
    /// [`WalError::DiskFull`] when the OS said the disk or the quota is
    /// full (ENOSPC, EDQUOT), [`WalError::Io`] otherwise.
    pub fn from_io(
        op: &'static str,
        path: &std::path::Path,
        needed: u64,
        source: std::io::Error,
    ) -> WalError {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => WalError::DiskFull {
                path: path.to_path_buf(),
                needed,
            },
            _ => WalError::Io {
                op,
                path: path.to_path_buf(),
                source,
            },
        }
    }

    /// True when waiting (for a purge) and retrying can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, WalError::RingFull { .. } | WalError::DiskFull { .. })
    }

    /// Fails with [`WalError::Foreign`] for the first of `fields` (its name,
    /// the value this node expects, the value found in the file at `path`)
    /// whose two values differ: the file belongs to another cluster or node,
    /// or has another shape.
    pub(crate) fn check_owner(path: &Path, fields: &[(&'static str, u64, u64)]) -> Result<()> {
        for &(field, expected, found) in fields {
            if expected != found {
                return Err(WalError::Foreign {
                    path: path.to_path_buf(),
                    field,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }
}

/// Result of `wal` operations.
pub type Result<T, E = WalError> = std::result::Result<T, E>;
