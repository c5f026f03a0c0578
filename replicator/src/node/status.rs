//! Views of a node: its [`Status`], openraft's metrics watch and the
//! leader's replication lag.
//!
//! Owns read-only summaries of openraft's metrics; it must never change
//! the node (no calls that write, trigger or wait).

use std::collections::{BTreeMap, BTreeSet};

use super::Node;
use crate::types::TypeConfig;

/// A short summary of a node's view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// This node.
    pub id: u64,
    /// Its role.
    pub state: String,
    /// The leader it knows.
    pub leader_id: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The last log index.
    pub last_log_index: Option<u64>,
    /// The committed index.
    pub commit_index: Option<u64>,
    /// The applied index.
    pub applied_index: Option<u64>,
    /// Voters.
    pub voters: BTreeSet<u64>,
    /// Learners.
    pub learners: BTreeSet<u64>,
    /// Members' addresses.
    pub members: BTreeMap<u64, String>,
}

impl Node {
    /// openraft's metrics, as a watch (`changed().await`, `borrow_watched()`
    /// through [`openraft::async_runtime::WatchReceiver`]).
    pub fn watch(
        &self,
    ) -> openraft::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>> {
        self.inner.raft.metrics()
    }

    /// On the leader: how many entries each follower is behind its last log
    /// entry (empty elsewhere).
    pub fn replication_lag(&self) -> BTreeMap<u64, u64> {
        use openraft::async_runtime::WatchReceiver;
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let (Some(replication), Some(last)) = (m.replication.as_ref(), m.last_log_index) else {
            return BTreeMap::new();
        };
        replication
            .iter()
            .map(|(id, matched)| {
                let next = matched.as_ref().map_or(0, |l| l.index + 1);
                (*id, (last + 1).saturating_sub(next))
            })
            .collect()
    }

    /// This node's current view.
    pub fn status(&self) -> Status {
        use openraft::async_runtime::WatchReceiver;
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        Status {
            id: m.id,
            state: format!("{:?}", m.state),
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            commit_index: m.cluster_committed.map(|c| c.index),
            applied_index: m.last_applied.map(|a| a.index),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            members: membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
        }
    }
}
