//! The offline checker: reads a node's data directory without changing a
//! byte and reports the valid range, the first invalid record and why, and
//! whether corruption lies inside what the node had acknowledged.
//! `ringraft wal check --data-dir DIR` prints its report.
//!
//! The ring is found through the data directory's `ring-location`
//! ([`crate::shm::ring_path`]), so no ring dir needs to be given; a ring
//! that is gone (after a reboot) is [`WalError::RingGone`].
//!
//! The directory may hold anything: every word read from either file is
//! checked as [`crate::Wal::open`] checks it (the metadata file's ranges,
//! the ring header, the acknowledged watermark and the commit hint) and a
//! value out of range is an error naming the file and the field. The
//! incarnation is only reported, not bumped, so any value is fine here.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::MmapOptions;

use crate::error::{Result, WalError};
use crate::layout::{
    ACKED_OFFSET, COMMIT_OFFSET, CONTROL_BLOCK_BYTES, Epoch, FENCE_OFFSET, HEAD_OFFSET, RingHeader,
    check_index, decode_index_word, le_u64,
};
use crate::meta::{META_FILE, Meta};
use crate::recovery::{Damage, Evidence, ScanInput, Stop, scan};
use crate::validate::{Geometry, LogPos};

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The directory checked.
    pub dir: PathBuf,
    /// Its ring file (in the ring dir, see [`crate::shm`]).
    pub ring: PathBuf,
    /// The ring's static header.
    pub header: RingHeader,
    /// The metadata file.
    pub meta: Meta,
    /// The fence word.
    pub fence: Epoch,
    /// The head word.
    pub head_word: u64,
    /// The commit hint.
    pub commit_hint: Option<u64>,
    /// The acknowledged-index watermark.
    pub acked: Option<u64>,
    /// Where the scan started (the metadata file's purge point).
    pub start_lsn: u64,
    /// First index of the valid range.
    pub first_index: u64,
    /// Last log id of the valid range (the purge point when it is empty).
    pub last: Option<LogPos>,
    /// Valid entries.
    pub entries: u64,
    /// Where the valid range ends.
    pub end_lsn: u64,
    /// The first invalid record.
    pub stop: Option<Stop>,
    /// How the log ended.
    pub damage: Damage,
}

impl CheckReport {
    /// True when the log breaks below the highest index the node had
    /// acknowledged: entries it vouched for are gone.
    pub fn corrupt_in_acknowledged_range(&self) -> bool {
        matches!(
            self.damage,
            Damage::CorruptInside(Evidence::BelowWatermark { .. })
        )
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.header;
        writeln!(f, "data dir      {}", self.dir.display())?;
        writeln!(f, "ring file     {}", self.ring.display())?;
        writeln!(
            f,
            "ring          cluster {:#x}, node {}, capacity {} bytes, incarnation {}",
            h.cluster_id, h.node_id, h.capacity, h.incarnation
        )?;
        writeln!(f, "fence         {}", self.fence)?;
        match self.meta.vote {
            Some(v) => writeln!(
                f,
                "vote          term {}, voted for {}, {}",
                v.term,
                v.voted_for
                    .map_or("nobody".to_string(), |id| id.to_string()),
                if v.committed {
                    "committed"
                } else {
                    "not committed"
                }
            )?,
            None => writeln!(f, "vote          none")?,
        }
        match self.meta.purged {
            Some(p) => writeln!(
                f,
                "purged        up to index {} (term {}), log continues at lsn {}",
                p.log.index, p.log.term, p.next_lsn
            )?,
            None => writeln!(f, "purged        nothing")?,
        }
        writeln!(f, "acknowledged  {}", opt(self.acked))?;
        writeln!(f, "commit hint   {}", opt(self.commit_hint))?;
        match (self.entries, self.last) {
            (0, _) => writeln!(
                f,
                "valid range   empty (lsn {}..{})",
                self.start_lsn, self.end_lsn
            )?,
            (n, Some(last)) => writeln!(
                f,
                "valid range   index {}..={} ({} entries, last term {}), lsn {}..{}",
                self.first_index, last.index, n, last.term, self.start_lsn, self.end_lsn
            )?,
            (_, None) => unreachable!("entries without a last log id"),
        }
        match self.stop {
            Some(stop) => writeln!(f, "first invalid lsn {}: {}", stop.lsn, stop.reason)?,
            None => writeln!(f, "first invalid none: the valid records fill the ring")?,
        }
        let verdict = match self.damage {
            Damage::None => "clean: the log ends where the writes ended".to_string(),
            Damage::TornTail => {
                "torn tail: the last unacknowledged write was cut; nothing acknowledged is missing"
                    .to_string()
            }
            Damage::CorruptInside(Evidence::BelowWatermark {
                acked,
                recovered_next_index,
            }) => format!(
                "CORRUPT inside the acknowledged range: the log breaks at index {recovered_next_index}, \
                 but the node acknowledged up to {acked}"
            ),
            Damage::CorruptInside(Evidence::WellFormedBeyond { lsn, index, epoch }) => format!(
                "CORRUPT inside the log (beyond the acknowledged range): a well-formed record \
                 (index {index}, {epoch}) lies at lsn {lsn}, past the break"
            ),
        };
        write!(f, "verdict       {verdict}")
    }
}

fn opt(index: Option<u64>) -> String {
    index.map_or_else(|| "none".to_string(), |i| format!("index {i}"))
}

/// Checks the data directory `dir` without writing to it.
pub fn check(dir: &Path) -> Result<CheckReport> {
    let meta_path = dir.join(META_FILE);
    let meta = Meta::read(&meta_path)?;
    let ring_path = crate::shm::ring_path(dir)?;
    let file = match File::open(&ring_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(WalError::RingGone {
                dir: dir.to_path_buf(),
                ring: ring_path,
            });
        }
        opened => opened.map_err(WalError::io("open", &ring_path))?,
    };
    let mut control = vec![0u8; CONTROL_BLOCK_BYTES];
    file.read_exact_at(&mut control, 0)
        .map_err(WalError::io("read control block", &ring_path))?;
    let header = RingHeader::decode(&control).map_err(|source| WalError::Layout {
        path: ring_path.clone(),
        source,
    })?;
    meta.check_identity(&meta_path, header.cluster_id, header.node_id)?;
    let total = CONTROL_BLOCK_BYTES as u64 + header.capacity;
    let size = file
        .metadata()
        .map_err(WalError::io("stat", &ring_path))?
        .len();
    if size != total {
        return Err(WalError::Inconsistent {
            path: ring_path,
            what: format!("file is {size} bytes, its header says {total}"),
        });
    }
    let len = usize::try_from(total)
        .map_err(|_| WalError::Config(format!("ring of {total} bytes does not fit in memory")))?;
    // SAFETY: a read-only mapping of a file that the checker does not change;
    // the caller checks a directory no running node owns (offline).
    let map = unsafe { MmapOptions::new().len(len).map(&file) }
        .map_err(WalError::io("mmap", &ring_path))?;
    let fence = Epoch(le_u64(&control[FENCE_OFFSET..]));
    let head_word = le_u64(&control[HEAD_OFFSET..]);
    let acked = decode_index_word(le_u64(&control[ACKED_OFFSET..]));
    let commit_hint = decode_index_word(le_u64(&control[COMMIT_OFFSET..]));
    for (field, index) in [
        ("acknowledged watermark", acked),
        ("commit hint", commit_hint),
    ] {
        if let Some(index) = index {
            check_index(field, index).map_err(|source| WalError::Layout {
                path: ring_path.clone(),
                source,
            })?;
        }
    }
    let start_lsn = meta.purged.map_or(0, |p| p.next_lsn);
    if head_word > start_lsn {
        return Err(WalError::Inconsistent {
            path: ring_path,
            what: format!(
                "head word {head_word} is beyond the metadata file's purge point {start_lsn}"
            ),
        });
    }
    let anchor = meta.purged.map(|p| p.log);
    let report = scan(
        &map[CONTROL_BLOCK_BYTES..],
        ScanInput {
            geometry: Geometry::loosest(header.capacity),
            start_lsn,
            anchor,
            fence,
            acked,
        },
    );
    Ok(CheckReport {
        dir: dir.to_path_buf(),
        ring: ring_path,
        header,
        meta,
        fence,
        head_word,
        commit_hint,
        acked,
        start_lsn,
        first_index: report
            .entries
            .first()
            .map_or(anchor.map_or(0, |a| a.index + 1), |e| e.index),
        last: report.last_log(anchor),
        entries: report.entries.len() as u64,
        end_lsn: report.end_lsn,
        stop: report.stop,
        damage: report.damage,
    })
}
