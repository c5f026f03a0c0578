//! A node's data directory: the ring file and the metadata file, opened and
//! kept consistent together.
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
use crate::validate::LogPos;

/// What recovery found when the directory was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// True when the directory was empty and a new log was created.
    pub created: bool,
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
    fn from_scan(created: bool, ring: &Ring, report: &ScanReport) -> Recovery {
        Recovery {
            created,
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
    /// holds neither file, and recovers the log.
    ///
    /// Errors, never defaults: a ring without its metadata file, a file of
    /// another cluster or node, a corrupt metadata file or ring header.
    pub fn open(dir: &Path, config: &RingConfig) -> Result<Wal> {
        config.geometry()?;
        fs::create_dir_all(dir).map_err(WalError::io("create directory", dir))?;
        let ring_path = dir.join(RING_FILE);
        let meta_path = dir.join(META_FILE);
        let mut created = false;
        match (ring_path.exists(), meta_path.exists()) {
            (false, false) => {
                // Metadata first: a crash before the ring exists leaves a
                // pristine metadata file, which the next open completes.
                Meta::new(config.cluster_id, config.node_id).store(&meta_path)?;
                Ring::create(&ring_path, config)?;
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
                if meta != Meta::new(config.cluster_id, config.node_id) {
                    return Err(WalError::Incomplete {
                        dir: dir.to_path_buf(),
                        present: META_FILE,
                        missing: RING_FILE,
                    });
                }
                Ring::create(&ring_path, config)?;
                created = true;
            }
            (true, true) => {}
        }
        let meta = Meta::load(&meta_path, config.cluster_id, config.node_id)?;
        let (ring, report) = Ring::open(&ring_path, config, meta.purged)?;
        let recovery = Recovery::from_scan(created, &ring, &report);
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

    fn store(&mut self, meta: Meta) -> Result<()> {
        meta.store(&self.meta_path)?;
        self.meta = meta;
        Ok(())
    }
}
