//! Retention: trims ([`Node::trim`]) and the background task that gives
//! back the storage of trimmed entries and trims what the configured
//! retention lets go.
//!
//! Owns when to snapshot, purge and trim for retention; it must never purge
//! what no snapshot covers, nor trim anywhere but through a log entry.

use std::time::Duration;

use super::{Inner, Node, NodeError};
use crate::types::{Command, Control, TypeConfig};

/// How often retention looks at the log (also after every trim).
const RETENTION_CHECK: Duration = Duration::from_secs(1);
/// How long one retention step waits for a trim.
const RETENTION_WAIT: Duration = Duration::from_secs(30);

/// Runs [`Node::keep_retention`] after every change of the first index kept
/// and every [`RETENTION_CHECK`], while the node lives.
pub(super) async fn keep_retention(
    node: std::sync::Weak<Inner>,
    mut first: crate::watch::Receiver<u64>,
) {
    let mut tick = tokio::time::interval(RETENTION_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Biased: both wake the same step, and an unbiased select draws
        // its order from the runtime's unseeded generator.
        tokio::select! {
            biased;
            changed = first.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let Some(inner) = node.upgrade() else { return };
        Node { inner }.keep_retention().await;
    }
}

impl Node {
    /// Trims the log: the records below `before` are gone on every node,
    /// from the index of the trim's own entry on (a trim is a log entry;
    /// `before` is cut to that index, and a trim never moves the first
    /// index back). The storage is given back once a snapshot covers it.
    /// Returns the first index kept.
    pub async fn trim(&self, before: u64) -> Result<u64, NodeError> {
        let command = Command {
            session: None,
            data: Vec::new(),
            control: Some(Control::Trim { before }),
        };
        let answer = self
            .write_anywhere(vec![command], None)
            .await?
            .pop()
            .expect("one answer per command");
        let first: [u8; 8] = answer.data.as_slice().try_into().map_err(|_| {
            NodeError::Unknown(format!(
                "a trim was answered with {} bytes",
                answer.data.len()
            ))
        })?;
        Ok(u64::from_le_bytes(first))
    }

    /// One round of retention: gives back the storage of trimmed entries
    /// (a snapshot, then openraft's purge), and, on the leader, trims what
    /// [`NodeConfig::retain_bytes`] and [`NodeConfig::retain_age`] let go.
    async fn keep_retention(&self) {
        use openraft::async_runtime::WatchReceiver;
        let raft = &self.inner.raft;
        let first = *self.inner.sm.watch_first().borrow();
        if first > 1 {
            let m = raft.metrics().borrow_watched().clone();
            if let Some(upto) = self.purge_point(first, &m)
                && m.purged.is_none_or(|p| p.index < upto)
            {
                // openraft purges only what a snapshot covers: take one
                // first (purged at a later round; no waiting here, so that
                // trims go on meanwhile).
                if m.snapshot.is_none_or(|s| s.index < upto) {
                    let _ = raft.trigger().snapshot().await;
                } else {
                    let _ = raft.trigger().purge_log(upto).await;
                }
            }
        }
        let config = &self.inner.config;
        if config.retain_bytes.is_none() && config.retain_age.is_none() {
            return;
        }
        let m = raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(config.id) {
            return;
        }
        let applied = m.last_applied.map_or(0, |l| l.index);
        let written_before = config
            .retain_age
            .and_then(|age| std::time::SystemTime::now().checked_sub(age));
        let point = self
            .inner
            .store
            .segments()
            .retention_point(config.retain_bytes, written_before)
            .min(applied + 1);
        tracing::debug!(node = config.id, point, first, applied, "retention looked");
        if point > first.max(1) {
            match tokio::time::timeout(RETENTION_WAIT, self.trim(point)).await {
                Ok(Ok(kept)) => {
                    tracing::info!(node = config.id, first = kept, "retention trimmed the log")
                }
                Ok(Err(e)) => {
                    tracing::warn!(node = config.id, error = %e, "retention: trim failed")
                }
                Err(_) => tracing::warn!(node = config.id, "retention: trim timed out"),
            }
        }
    }

    /// How far openraft may purge below the first index kept, `first`.
    /// Followers purge up to it. A leader keeps the entries a lagging
    /// follower still needs, so that it catches up from the segments rather
    /// than by a snapshot (which carries the trim, not the records between
    /// the trim and the snapshot): as long as the bytes kept for it stay
    /// within those of the retained log, i.e. the data directory within
    /// twice the retention.
    /// `None`: nothing may be purged yet.
    fn purge_point(&self, first: u64, m: &openraft::RaftMetrics<TypeConfig>) -> Option<u64> {
        let upto = Some(first - 1);
        let Some(replication) = &m.replication else {
            return upto;
        };
        let lowest_next = replication
            .iter()
            .filter(|(id, _)| **id != self.inner.config.id)
            .map(|(_, matched)| matched.map_or(0, |l| l.index + 1))
            .min()
            .unwrap_or(first);
        if lowest_next >= first {
            return upto;
        }
        let segments = self.inner.store.segments();
        match (segments.bytes_from(lowest_next), segments.bytes_from(first)) {
            (Some(needed), Some(kept)) if needed - kept <= kept => lowest_next.checked_sub(1),
            _ => upto,
        }
    }
}
