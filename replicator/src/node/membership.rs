//! Membership: initializing the cluster, adding learners, promoting and
//! removing members, handing leadership over.
//!
//! Owns the calls into openraft's membership API; it must never change
//! membership but through openraft (no local edits of the member list).

use std::collections::{BTreeMap, BTreeSet};

use openraft::ChangeMembers;
use openraft::error::RaftError;

use super::error::{raft_error, write_error};
use super::{Node, NodeError};
use crate::types::NodeInfo;

impl Node {
    /// Initializes the cluster with the configured peers as voters. Harmless
    /// when the cluster is already initialized (here or elsewhere).
    pub async fn initialize(&self) -> Result<(), NodeError> {
        let members: BTreeMap<u64, NodeInfo> = self
            .inner
            .config
            .peers
            .iter()
            .map(|(id, addr)| (*id, NodeInfo { addr: addr.clone() }))
            .collect();
        if members.is_empty() {
            return Err(NodeError::Config("no peers to initialize with".into()));
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(raft_error(e)),
        }
    }

    /// Adds a learner (a non-voting member that receives the log).
    pub async fn add_learner(&self, id: u64, addr: String) -> Result<(), NodeError> {
        self.inner
            .raft
            .add_learner(id, NodeInfo { addr }, true)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Makes learners `ids` voters.
    pub async fn promote(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        self.inner
            .raft
            .change_membership(ChangeMembers::AddVoterIds(ids), false)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Removes members `ids` (voters are demoted and removed).
    pub async fn remove(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        self.inner
            .raft
            .change_membership(ChangeMembers::RemoveVoters(ids.clone()), false)
            .await
            .map_err(write_error)?;
        self.inner
            .raft
            .change_membership(ChangeMembers::RemoveNodes(ids), false)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Asks the leader to hand leadership to `to`.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), NodeError> {
        self.inner
            .raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| NodeError::Stopped(e.to_string()))
    }
}
