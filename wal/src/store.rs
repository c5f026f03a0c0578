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

use crate::error::{Result, WalError};
use crate::layout::{Epoch, RingHeader};
use crate::meta::{META_FILE, Meta, VoteRecord};
use crate::recovery::{Damage, ScanReport, Stop};
use crate::ring::{RING_FILE, Ring, RingConfig};
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
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    meta_path: PathBuf,
    ring: Ring,
    meta: Meta,
    recovery: Recovery,
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
                Meta::new(config.cluster_id, config.node_id).store(&meta_path)?;
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
                let meta = Meta::load(&meta_path, config.cluster_id, config.node_id)?;
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
        let meta = Meta::load(&meta_path, config.cluster_id, config.node_id)?;
        let (mut ring, report) = Ring::open(&ring_path, config, meta.purged)?;
        if recreated {
            rebuild_fence(&ring, meta.vote)?;
            ring.sync()?;
        }
        let recovery = Recovery::from_scan(created, recreated, &ring, &report);
        if recreated {
            tracing::warn!(
                dir = %dir.display(),
                ring = %ring_path.display(),
                fence = %recovery.fence,
                first_index = recovery.first_index,
                "the ring was gone (a reboot?): recreated empty at the purge point, fence \
                 rebuilt from the vote"
            );
        }
        if let Some(stop) = recovery.stop {
            tracing::info!(
                dir = %dir.display(),
                entries = recovery.entries,
                stop_lsn = stop.lsn,
                reason = %stop.reason,
                damage = ?recovery.damage,
                "wal recovered"
            );
        }
        shm::collect_garbage(place.ring_dir());
        Ok(Wal {
            dir: dir.to_path_buf(),
            meta_path,
            ring,
            meta,
            recovery,
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

    /// Purges the log up to and including `upto` (which may lie beyond the
    /// log, after a snapshot). Returns false when that was purged already.
    pub fn purge(&mut self, upto: LogPos) -> Result<bool> {
        let Some(point) = self.ring.purge_point(upto)? else {
            return Ok(false);
        };
        if self.ring.needs_anchor() && point.log.index < self.ring.first_index() {
            self.ring.anchor_first(point.log)?;
        }
        self.store(Meta {
            purged: Some(point),
            ..self.meta
        })?;
        self.ring.apply_purge(point);
        Ok(true)
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
