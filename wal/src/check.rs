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
//!
//! When the directory has a `log/` folder, its segment files are checked
//! too ([`crate::check_segments`]), with the same verdicts, against the
//! ring's identity and acknowledged watermark.

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
use crate::ring::ring_file_len;
use crate::segment::SEGMENT_DIR;
use crate::segment_log::{SegmentRecovery, check_segments};
use crate::validate::{Geometry, LogPos};

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The directory checked.
    pub dir: PathBuf,
    /// Its ring file (in the ring dir, see [`crate::shm`]).
    pub ring: PathBuf,
    /// False when the ring is gone (a reboot cleared shared memory): the
    /// log is then the segments alone, and the ring's fields are empty.
    pub ring_present: bool,
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
    /// The segment files, when the directory has a `log/` folder.
    pub segments: Option<SegmentRecovery>,
}

impl CheckReport {
    /// True when the log (the ring or the segments) breaks below the
    /// highest index the node had acknowledged: entries it vouched for are
    /// gone.
    pub fn corrupt_in_acknowledged_range(&self) -> bool {
        let below = |damage: Damage| {
            matches!(
                damage,
                Damage::CorruptInside(Evidence::BelowWatermark { .. })
            )
        };
        below(self.damage) || self.segments.as_ref().is_some_and(|s| below(s.damage))
    }
}

fn verdict(damage: Damage, position: impl Fn(u64) -> String) -> String {
    match damage {
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
             (index {index}, {epoch}) lies at {}, past the break",
            position(lsn)
        ),
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.header;
        writeln!(f, "data dir      {}", self.dir.display())?;
        writeln!(f, "ring file     {}", self.ring.display())?;
        if !self.ring_present {
            writeln!(
                f,
                "ring          GONE (shared memory was cleared: a reboot?): the log is the \
                 segments; the node recreates the ring when it starts"
            )?;
            if let Some(segments) = &self.segments {
                write!(f, "{}", SegmentsDisplay(segments))?;
            }
            return Ok(());
        }
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
        write!(
            f,
            "verdict       {}",
            verdict(self.damage, |lsn| format!("lsn {lsn}"))
        )?;
        if let Some(segments) = &self.segments {
            writeln!(f)?;
            write!(f, "{}", SegmentsDisplay(segments))?;
        }
        Ok(())
    }
}

/// The segment lines of a check report.
struct SegmentsDisplay<'a>(&'a SegmentRecovery);

impl fmt::Display for SegmentsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        match s.last {
            Some(last) => writeln!(
                f,
                "segments      {} files, {} bytes: index {}..={} ({} entries, last term {})",
                s.segments, s.disk_bytes, s.first_index, last.index, s.entries, last.term
            )?,
            None => writeln!(
                f,
                "segments      {} files, {} bytes: empty",
                s.segments, s.disk_bytes
            )?,
        }
        match &s.stop {
            Some(stop) => writeln!(
                f,
                "  first invalid {} at offset {}: {}",
                stop.path.display(),
                stop.offset,
                stop.reason
            )?,
            None => writeln!(
                f,
                "  first invalid none: the last segment's data ends cleanly"
            )?,
        }
        write!(
            f,
            "  verdict     {}",
            verdict(s.damage, |lsn| format!("ring lsn {lsn} in a segment"))
        )
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
            return check_without_ring(dir, meta, ring_path);
        }
        opened => opened.map_err(WalError::io("open", &ring_path))?,
    };
    check_with_ring(dir, meta, &meta_path, ring_path, &file)
}

/// The report when the ring file is gone: after a reboot the segments are
/// the log; without a segment folder either, the ring is gone.
fn check_without_ring(dir: &Path, meta: Meta, ring_path: PathBuf) -> Result<CheckReport> {
    let segment_dir = dir.join(SEGMENT_DIR);
    if !segment_dir.is_dir() {
        return Err(WalError::RingGone {
            dir: dir.to_path_buf(),
            ring: ring_path,
        });
    }
    // After a reboot: the segments are the log.
    let segments = check_segments(
        &crate::disk::RealDisk,
        &segment_dir,
        meta.cluster_id,
        meta.node_id,
        None,
    )?;
    let purged = meta.purged.map(|p| p.log);
    let last = crate::ring::durable_end(segments.last, purged);
    Ok(CheckReport {
        dir: dir.to_path_buf(),
        ring: ring_path,
        ring_present: false,
        header: RingHeader {
            capacity: 0,
            cluster_id: meta.cluster_id,
            node_id: meta.node_id,
            incarnation: 0,
        },
        fence: Epoch::ZERO,
        head_word: 0,
        commit_hint: None,
        acked: None,
        start_lsn: 0,
        first_index: segments.first_index.max(purged.map_or(0, |p| p.index + 1)),
        last,
        entries: 0,
        end_lsn: 0,
        stop: None,
        damage: Damage::None,
        segments: Some(segments),
        meta,
    })
}

/// The words of the ring's control block after its header, each checked.
struct ControlWords {
    fence: Epoch,
    head_word: u64,
    acked: Option<u64>,
    commit_hint: Option<u64>,
}

/// The report for a directory whose ring file is there (`file`): the ring
/// scanned from its head word, with the segments (if any) below it.
fn check_with_ring(
    dir: &Path,
    meta: Meta,
    meta_path: &Path,
    ring_path: PathBuf,
    file: &File,
) -> Result<CheckReport> {
    let (control, header, map) = map_ring(file, &meta, meta_path, &ring_path)?;
    let ControlWords {
        fence,
        head_word,
        acked,
        commit_hint,
    } = control_words(&control, &ring_path)?;
    let start_lsn = head_word;
    let purged = meta.purged.map(|p| p.log);
    let segment_dir = dir.join(SEGMENT_DIR);
    // The watermark is judged on the whole log below (in `memory`
    // durability the segments may end before it while the ring goes on).
    let segments = if segment_dir.is_dir() {
        Some(check_segments(
            &crate::disk::RealDisk,
            &segment_dir,
            header.cluster_id,
            header.node_id,
            None,
        )?)
    } else {
        None
    };
    let mut report = scan(
        &map[CONTROL_BLOCK_BYTES..],
        ScanInput {
            geometry: Geometry::loosest(header.capacity),
            start_lsn,
            anchor: None,
            fence,
            acked: None,
        },
    );
    // Where the log stands without the ring, and with it.
    let durable_last = segments.as_ref().and_then(|s| s.last);
    let base = crate::ring::durable_end(durable_last, purged);
    let anchor = match report.entries.first() {
        Some(first) => first.index.checked_sub(1).and(base),
        None => base,
    };
    // The log reaches as far as the ring or the segments do.
    let ring_next = report
        .entries
        .last()
        .map_or(base.map_or(0, |b| b.index + 1), |e| e.index + 1);
    let log_next = ring_next.max(durable_last.map_or(0, |d| d.index + 1));
    report.damage = whole_log_damage(acked, log_next, report.damage);
    Ok(CheckReport {
        dir: dir.to_path_buf(),
        ring: ring_path,
        ring_present: true,
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
        segments,
    })
}

/// Reads the ring's control block and header, checks them against the
/// metadata and the file's size, and maps the file read-only.
fn map_ring(
    file: &File,
    meta: &Meta,
    meta_path: &Path,
    ring_path: &Path,
) -> Result<(Vec<u8>, RingHeader, memmap2::Mmap)> {
    let mut control = vec![0u8; CONTROL_BLOCK_BYTES];
    file.read_exact_at(&mut control, 0)
        .map_err(WalError::io("read control block", ring_path))?;
    let header = RingHeader::decode(&control).map_err(|source| WalError::Layout {
        path: ring_path.to_path_buf(),
        source,
    })?;
    meta.check_identity(meta_path, header.cluster_id, header.node_id)?;
    let len = ring_file_len(file, ring_path, header.capacity)?;
    // SAFETY: a read-only mapping of a file that the checker does not change;
    // the caller checks a directory no running node owns (offline).
    let map = unsafe { MmapOptions::new().len(len).map(file) }
        .map_err(WalError::io("mmap", ring_path))?;
    Ok((control, header, map))
}

/// Decodes the fence, head word, acknowledged watermark and commit hint of
/// the control block, each checked as recovery checks it.
fn control_words(control: &[u8], ring_path: &Path) -> Result<ControlWords> {
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
                path: ring_path.to_path_buf(),
                source,
            })?;
        }
    }
    // The ring is scanned from its head word, like recovery does: what lies
    // before it is in the segments.
    // A log position: line aligned and at most MAX_LSN (scanning from
    // anything else is a bug the scan asserts against).
    crate::layout::check_lsn("head", head_word).map_err(|source| WalError::Layout {
        path: ring_path.to_path_buf(),
        source,
    })?;
    Ok(ControlWords {
        fence,
        head_word,
        acked,
        commit_hint,
    })
}

/// The ring scan's `damage` judged on the whole log, which reaches
/// `log_next` with the segments: below the watermark is corrupt inside,
/// and a break in the ring that the segments cover lost nothing.
fn whole_log_damage(acked: Option<u64>, log_next: u64, damage: Damage) -> Damage {
    match (acked, damage) {
        (Some(acked), _) if log_next <= acked => {
            Damage::CorruptInside(crate::recovery::Evidence::BelowWatermark {
                acked,
                recovered_next_index: log_next,
            })
        }
        // A break in the ring that the segments cover lost nothing.
        (_, Damage::CorruptInside(crate::recovery::Evidence::WellFormedBeyond { index, .. }))
            if log_next > index =>
        {
            Damage::None
        }
        (_, damage) => damage,
    }
}
