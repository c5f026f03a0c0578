//! A node's data directory: the metadata file, and the ring file it names
//! in the ring dir (shared memory, see [`crate::shm`]), opened and kept
//! consistent together.
//!
//! The data directory holds `meta` and `ring-location`; the ring lives in
//! the ring dir. A reboot clears the ring and keeps the metadata file: the
//! next open recreates the ring, empty at the purge point, its fence from
//! the durable vote ([`Recovery::ring_recreated`]).
//!
//! The one ordering rule between the two files lives here: a purge stores
//! the new purge point in the metadata file (durably) *before* it advances
//! `head` in the ring, so that `head` never runs ahead of the point recovery
//! starts from.

use std::fs;
use std::path::{Path, PathBuf};

use crate::disk::RealDisk;
use crate::error::{Result, WalError};
use crate::layout::{Epoch, RingHeader};
use crate::meta::{META_FILE, Meta, VoteRecord};
use crate::recovery::{Damage, Evidence, ScanReport, Stop};
use crate::ring::{Anchoring, RING_FILE, Ring, RingConfig};
use crate::segment::SEGMENT_DIR;
use crate::segment_log::{SegmentConfig, SegmentLog, SegmentReader, SegmentRecovery};
use crate::shm;
use crate::validate::LogPos;

/// What recovery found when the directory was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// True when the directory was empty and a new log was created.
    pub created: bool,
    /// True when the data directory's ring was gone (shared memory is
    /// cleared at a reboot) and a new, empty one was made: anchored at the
    /// metadata file's purge point, its fence rebuilt from the durable vote.
    /// Entries the lost ring held beyond the purge point are not in it.
    pub ring_recreated: bool,
    /// The ring's incarnation as of this open.
    pub incarnation: u64,
    /// The fence found.
    pub fence: Epoch,
    /// The first index in the log.
    pub first_index: u64,
    /// The last log id (the last purged one when the log is empty).
    pub last: Option<LogPos>,
    /// Entries recovered.
    pub entries: u64,
    /// Where recovery started.
    pub head_lsn: u64,
    /// Where the log ends.
    pub tail_lsn: u64,
    /// The highest index the node had acknowledged.
    pub acked: Option<u64>,
    /// The first invalid record, where the scan stopped.
    pub stop: Option<Stop>,
    /// How the log ended.
    pub damage: Damage,
}

impl Recovery {
    fn from_scan(created: bool, recreated: bool, ring: &Ring, report: &ScanReport) -> Recovery {
        Recovery {
            created,
            ring_recreated: recreated,
            incarnation: ring.header().incarnation,
            fence: ring.fence(),
            first_index: ring.first_index(),
            last: ring.last_log(),
            entries: report.entries.len() as u64,
            head_lsn: ring.head_lsn(),
            tail_lsn: ring.tail_lsn(),
            acked: ring.acked(),
            stop: report.stop,
            damage: report.damage,
        }
    }

    /// True when the log lost entries inside it: the node must not grant
    /// votes until a leader has re-replicated past the break.
    pub fn corrupt_inside(&self) -> bool {
        matches!(self.damage, Damage::CorruptInside(_))
    }
}

/// An open data directory. See the module docs.
pub struct Wal {
    dir: PathBuf,
    meta_path: PathBuf,
    ring: Ring,
    meta: Meta,
    recovery: Recovery,
    /// The segment log's writer, until the flusher takes it.
    segments: Option<SegmentLog<RealDisk>>,
    /// Reads of the segments (entries the ring gave back).
    reader: SegmentReader<RealDisk>,
    /// The first index the segments must still be given.
    flush_from: u64,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("ring", &self.ring)
            .field("segments", &self.reader)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens the data directory `dir`, creating it and an empty log when it
    /// holds neither the metadata file nor a ring, and recovers the log. The
    /// ring lives in `ring_dir` (a shared-memory directory: `/dev/shm`,
    /// [`crate::shm::DEFAULT_RING_DIR`], or another tmpfs mount; created if
    /// missing), under a name bound to this directory ([`crate::shm`]).
    /// Every open also deletes the rings in `ring_dir` whose data directory
    /// is gone ([`crate::shm::collect_garbage`]).
    ///
    /// A ring that is gone while the metadata file is not (a reboot cleared
    /// shared memory) is recreated empty at the metadata file's purge point,
    /// with its fence rebuilt from the durable vote
    /// ([`Recovery::ring_recreated`]).
    ///
    /// Errors, never defaults: a ring without its metadata file, a file of
    /// another cluster or node, a corrupt metadata file or ring header, a
    /// ring in another ring dir ([`WalError::RingElsewhere`]), a ring dir
    /// too small for the ring ([`WalError::RingDirFull`]).
    pub fn open(dir: &Path, ring_dir: &Path, config: &RingConfig) -> Result<Wal> {
        config.geometry()?;
        fs::create_dir_all(dir).map_err(WalError::io("create directory", dir))?;
        let meta_path = dir.join(META_FILE);
        let (place, ring_path, created, recreated) = place_ring(dir, ring_dir, config, &meta_path)?;
        let meta = Meta::load(&meta_path, config.cluster_id, config.node_id)?;
        let (mut ring, report) = Ring::open(&ring_path, config)?;
        if recreated {
            rebuild_fence(&ring, meta.vote)?;
            ring.sync()?;
        }
        let acked = ring.acked();
        let segment_config = SegmentConfig {
            max_record_bytes: config.max_record_bytes,
            ..SegmentConfig::new(config.cluster_id, config.node_id)
        };
        let (mut segments, durable) =
            SegmentLog::open(RealDisk, &dir.join(SEGMENT_DIR), segment_config, None)?;
        let reader = segments.reader();
        let anchoring = ring.anchor_on(
            segments.last_log(),
            segments.lsn_end(),
            meta.purged.map(|p| p.log),
            |index| reader.term_of(index),
        );
        if let Some(after) = anchoring.durable_conflict_after {
            tracing::info!(
                dir = %dir.display(),
                ?after,
                "the segments hold entries the ring replaced (a truncation cut short): removed"
            );
            segments.truncate_after(after)?;
        }
        let mut recovery = Recovery::from_scan(created, recreated, &ring, &report);
        recovery.first_index = first_index(&ring, &reader, meta.purged.map(|p| p.log));
        recovery.damage = recovered_damage(&ring, acked, durable.damage, recovery.damage);
        recovery.entries = ring.next_index().saturating_sub(recovery.first_index);
        log_recovery(dir, &ring_path, recreated, &recovery, &durable, &anchoring);
        shm::collect_garbage(place.ring_dir());
        Ok(Wal {
            dir: dir.to_path_buf(),
            meta_path,
            ring,
            meta,
            recovery,
            segments: Some(segments),
            reader,
            flush_from: anchoring.flush_from,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The ring, for appending, adopting, truncating and syncing.
    pub fn ring_mut(&mut self) -> &mut Ring {
        &mut self.ring
    }

    /// The ring's static header.
    pub fn header(&self) -> RingHeader {
        self.ring.header()
    }

    /// The metadata as last stored.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// What recovery found at open.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Stores the vote durably.
    pub fn save_vote(&mut self, vote: VoteRecord) -> Result<()> {
        self.store(Meta {
            vote: Some(vote),
            ..self.meta
        })
    }

    /// Stores the last committed log id durably.
    pub fn save_committed(&mut self, committed: Option<LogPos>) -> Result<()> {
        self.store(Meta {
            committed,
            ..self.meta
        })
    }

    // ----- the log: segments + ring ------------------------------------------

    /// The segment log's writer, for the flusher; `None` once taken.
    pub fn take_segments(&mut self) -> Option<SegmentLog<RealDisk>> {
        self.segments.take()
    }

    /// A reader of the segments (entries the ring gave back).
    pub fn segment_reader(&self) -> SegmentReader<RealDisk> {
        self.reader.clone()
    }

    /// The first index the flusher must still give the segments, as of the
    /// open (everything below is in them).
    pub fn flush_from(&self) -> u64 {
        self.flush_from
    }

    /// The last purged log id: the metadata file's purge point.
    pub fn last_purged(&self) -> Option<LogPos> {
        self.meta.purged.map(|p| p.log)
    }

    /// The first index of the log: in the segments, or in the ring when it
    /// holds older entries than they do, never at or below the purge point.
    pub fn first_index(&self) -> u64 {
        first_index(&self.ring, &self.reader, self.last_purged())
    }

    /// The term of entry `index`, from the ring or the segments.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        if index < self.first_index() {
            return None;
        }
        self.ring
            .term_of(index)
            .or_else(|| self.reader.term_of(index))
    }

    /// Removes every entry after `last_kept` from the ring: in place while
    /// the ring holds `last_kept`, else (the entries kept are all in the
    /// segments) by emptying it and continuing after `last_kept`. The
    /// caller truncates the segments the same way (through the flusher).
    pub fn truncate_after(&mut self, last_kept: Option<LogPos>) -> Result<()> {
        let keep_next = last_kept.map_or(0, |p| p.index.saturating_add(1));
        if keep_next >= self.ring.next_index() {
            return Ok(());
        }
        if keep_next > self.ring.first_index() {
            return self.ring.truncate_after(last_kept.map(|p| p.index));
        }
        self.ring.reset_after(last_kept);
        Ok(())
    }

    /// The metadata with `upto` as its purge point, and where it goes;
    /// `None` when the log is purged that far already. Store it with
    /// [`Meta::store`] (no lock needed), then [`Wal::set_meta`].
    pub fn purge_meta(&self, upto: LogPos) -> Option<(PathBuf, Meta)> {
        if self.last_purged().is_some_and(|p| p.index >= upto.index) {
            return None;
        }
        let meta = Meta {
            purged: Some(crate::meta::PurgePoint {
                log: upto,
                next_lsn: 0,
            }),
            ..self.meta
        };
        Some((self.meta_path.clone(), meta))
    }

    /// The metadata with `vote`, and where it goes (see
    /// [`Wal::purge_meta`]).
    pub fn vote_meta(&self, vote: VoteRecord) -> (PathBuf, Meta) {
        (
            self.meta_path.clone(),
            Meta {
                vote: Some(vote),
                ..self.meta
            },
        )
    }

    /// Takes `meta` as the metadata, once the caller stored it durably.
    pub fn set_meta(&mut self, meta: Meta) {
        self.meta = meta;
    }

    /// Purges the log up to and including `upto` (which may lie beyond the
    /// log, after a snapshot): stores the purge point, then lets the ring
    /// forget the entries (the segments' whole files below it are the
    /// flusher's to remove). Returns false when that was purged already.
    /// Blocking (the metadata file is fsynced); the log store does the
    /// same in two steps to keep its lock free during the write.
    pub fn purge(&mut self, upto: LogPos) -> Result<bool> {
        // A purge point the ring's entries contradict is refused.
        self.ring.purge_point(upto)?;
        let first = self.ring.first_index();
        if self.ring.needs_anchor()
            && upto.index.checked_add(1) == Some(first)
            && self.ring.term_of(first).is_some_and(|t| t < upto.term)
        {
            return Err(WalError::Conflict(format!(
                "purge point {upto:?} has a term above the first entry's"
            )));
        }
        let Some((path, meta)) = self.purge_meta(upto) else {
            return Ok(false);
        };
        meta.store(&path)?;
        self.set_meta(meta);
        self.purge_ring(upto);
        Ok(true)
    }

    /// After the purge point moved to `upto`: the ring forgets the entries
    /// up to it (all of them, and the log continues after `upto`, when it
    /// lies beyond the log: a snapshot was installed).
    pub fn purge_ring(&mut self, upto: LogPos) {
        if upto.index < self.ring.first_index() {
            // A log that began right after `upto` gets it as its anchor.
            if self.ring.needs_anchor() && upto.index + 1 == self.ring.first_index() {
                let next_lsn = self.ring.head_lsn();
                self.ring.apply_purge(crate::meta::PurgePoint {
                    log: upto,
                    next_lsn,
                });
            }
        } else if upto.index < self.ring.next_index() {
            self.ring.release_through(upto.index);
        } else {
            let next_lsn = self.ring.tail_lsn();
            self.ring.apply_purge(crate::meta::PurgePoint {
                log: upto,
                next_lsn,
            });
        }
    }

    /// The ring's path (in the ring dir).
    pub fn ring_path(&self) -> &Path {
        self.ring.path()
    }

    fn store(&mut self, meta: Meta) -> Result<()> {
        meta.store(&self.meta_path)?;
        self.meta = meta;
        Ok(())
    }
}

/// The first index of a log held by `ring` and the segments of `reader`,
/// purged up to `purged`.
fn first_index(ring: &Ring, reader: &SegmentReader<RealDisk>, purged: Option<LogPos>) -> u64 {
    let (segments_first, segments_next) = reader.range();
    let held = if segments_next > segments_first {
        segments_first.min(ring.first_index())
    } else {
        ring.first_index()
    };
    held.max(purged.map_or(0, |p| p.index + 1))
}

/// Finds where the ring of `dir` lives in `ring_dir` and makes it ready:
/// creates the metadata file and the ring for a new log, recreates a ring
/// that is gone, refuses a ring without its metadata file or a metadata
/// file (not pristine) without its ring when the ring was not lost.
/// Returns the place, the ring's path, and whether the log was created or
/// its ring recreated.
fn place_ring(
    dir: &Path,
    ring_dir: &Path,
    config: &RingConfig,
    meta_path: &Path,
) -> Result<(shm::RingPlace, PathBuf, bool, bool)> {
    // ----- where the ring lives (issue 11, item 1: crate::shm) -----
    let mut place = shm::find(dir, ring_dir)?;
    let (mut created, mut recreated) = (false, false);
    // A ring made where one was lost starts a new generation of
    // incarnations (crate::shm).
    let generation = if place.ring_lost() {
        place.next_generation()?
    } else {
        0
    };
    match (place.ring_exists(), meta_path.exists()) {
        (false, false) => {
            // Metadata first: a crash before the ring exists leaves a
            // pristine metadata file, which the next open completes.
            Meta::new(config.cluster_id, config.node_id).store(meta_path)?;
            let (path, incarnation) =
                place.bind_new(config.cluster_id, config.node_id, generation)?;
            Ring::create(&path, config, incarnation)?;
            created = true;
        }
        (true, false) => {
            return Err(WalError::Incomplete {
                dir: dir.to_path_buf(),
                present: RING_FILE,
                missing: META_FILE,
            });
        }
        (false, true) => {
            let meta = Meta::load(meta_path, config.cluster_id, config.node_id)?;
            if meta == Meta::new(config.cluster_id, config.node_id) {
                created = true;
            } else if place.ring_lost() {
                recreated = true;
            } else {
                return Err(WalError::Incomplete {
                    dir: dir.to_path_buf(),
                    present: META_FILE,
                    missing: RING_FILE,
                });
            }
            let (path, incarnation) =
                place.bind_new(config.cluster_id, config.node_id, generation)?;
            Ring::create(&path, config, incarnation)?;
        }
        (true, true) => {}
    }
    let ring_path = place.ready(config.cluster_id, config.node_id)?;
    place.remove_leftover();
    // ----- end of where the ring lives -----
    Ok((place, ring_path, created, recreated))
}

/// The damage of the recovered log, from the segments' (`durable`) and the
/// ring's (`scanned`) verdicts: corruption inside the segments stands; the
/// ring's stands unless the segments cover it; otherwise the log must
/// still reach the watermark `acked` the ring kept.
fn recovered_damage(ring: &Ring, acked: Option<u64>, durable: Damage, scanned: Damage) -> Damage {
    let log_next = ring.next_index();
    // A break in the ring that the segments cover lost nothing.
    let covered = |evidence: Evidence| match evidence {
        Evidence::BelowWatermark { acked, .. } => log_next > acked,
        Evidence::WellFormedBeyond { index, .. } => log_next > index,
    };
    match (durable, scanned) {
        (d @ Damage::CorruptInside(_), _) => d,
        // The whole log (segments and ring) breaks where it ends, whatever
        // the ring alone reached (the offline checker says the same).
        (_, Damage::CorruptInside(e @ Evidence::BelowWatermark { acked, .. })) if !covered(e) => {
            Damage::CorruptInside(Evidence::BelowWatermark {
                acked,
                recovered_next_index: log_next,
            })
        }
        (_, d @ Damage::CorruptInside(e)) if !covered(e) => d,
        (a, b) => {
            let next_index = ring.next_index();
            match acked {
                // The ring (shared memory) kept the watermark, the log
                // no longer reaches it.
                Some(acked) if next_index <= acked => {
                    Damage::CorruptInside(Evidence::BelowWatermark {
                        acked,
                        recovered_next_index: next_index,
                    })
                }
                _ if a == Damage::TornTail || b == Damage::TornTail => Damage::TornTail,
                _ => Damage::None,
            }
        }
    }
}

/// Logs what recovery did when it did more than open a clean log: a
/// recreated ring (a warning), a break in the ring or the segments, or
/// ring entries dropped while anchoring.
fn log_recovery(
    dir: &Path,
    ring_path: &Path,
    recreated: bool,
    recovery: &Recovery,
    durable: &SegmentRecovery,
    anchoring: &Anchoring,
) {
    if recreated {
        tracing::warn!(
            dir = %dir.display(),
            ring = %ring_path.display(),
            fence = %recovery.fence,
            first_index = recovery.first_index,
            last = ?recovery.last,
            "the ring was gone (a reboot?): recreated empty after the segments' last \
             entry, fence rebuilt from the vote"
        );
    }
    if recovery.stop.is_some() || durable.stop.is_some() || anchoring.dropped > 0 {
        tracing::info!(
            dir = %dir.display(),
            entries = recovery.entries,
            ring_stop = ?recovery.stop,
            segment_stop = ?durable.stop,
            ring_entries_dropped = anchoring.dropped,
            damage = ?recovery.damage,
            "wal recovered"
        );
    }
}

/// The fence of a recreated ring, from the durable vote: the vote's leader's
/// epoch when the vote is committed (a quorum granted it: that leader holds
/// the term), else the vote's term with no leader (`term << 16`), which any
/// leader of that term may raise. Never below the vote's term; the old
/// fence may have been higher (a leader fenced this node before it saved
/// that leader's vote), which is safe: the fence only filters writers, and
/// openraft's vote, which is durable, decides who leads.
fn rebuild_fence(ring: &Ring, vote: Option<VoteRecord>) -> Result<()> {
    let Some(vote) = vote else {
        return Ok(());
    };
    let leader = if vote.committed {
        vote.voted_for.unwrap_or(0)
    } else {
        0
    };
    let epoch = Epoch::new(vote.term, leader).ok_or_else(|| {
        WalError::Config(format!(
            "vote term {} with leader {leader} does not fit an epoch",
            vote.term
        ))
    })?;
    if epoch > Epoch::ZERO {
        let found = ring.compare_exchange_fence(Epoch::ZERO, epoch)?;
        assert_eq!(found, Epoch::ZERO, "a new ring's fence is zero");
    }
    Ok(())
}
