//! Membership: initializing the cluster, adding learners, promoting and
//! removing members, handing leadership over.
//!
//! Owns the calls into openraft's membership API; it must never change
//! membership but through openraft (no local edits of the member list).

use std::collections::{BTreeMap, BTreeSet};

use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{ChangeMembers, ServerState};

use super::error::{raft_error, write_error};
use super::{Node, NodeError};
use crate::rt;
use crate::types::{NodeInfo, Raft, TypeConfig};

type WriteError = RaftError<TypeConfig, ClientWriteError<TypeConfig>>;

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
        self.change_membership(move |raft| async move {
            raft.add_learner(id, NodeInfo { addr }, true).await
        })
        .await
    }

    /// Makes learners `ids` voters.
    pub async fn promote(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        self.change_membership(move |raft| async move {
            raft.change_membership(ChangeMembers::AddVoterIds(ids), false)
                .await
        })
        .await
    }

    /// Removes members `ids`, learners first, then voters (which leave
    /// entirely). The leader may remove itself: it leads until the change
    /// is committed, then the others elect a leader among themselves;
    /// meanwhile it refuses further changes ([`NodeError::NotMember`]).
    pub async fn remove(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        let (voters, learners): (BTreeSet<u64>, BTreeSet<u64>) = {
            let metrics = self.inner.raft.metrics().borrow_watched().clone();
            let membership = metrics.membership_config.membership();
            let voters: BTreeSet<u64> = membership.voter_ids().collect();
            ids.iter().partition(|id| voters.contains(id))
        };
        if !learners.is_empty() {
            self.change_membership(move |raft| async move {
                raft.change_membership(ChangeMembers::RemoveNodes(learners), false)
                    .await
            })
            .await?;
        }
        if !voters.is_empty() {
            // retain = false: a removed voter does not stay a learner.
            self.change_membership(move |raft| async move {
                raft.change_membership(ChangeMembers::RemoveVoters(voters), false)
                    .await
            })
            .await?;
        }
        Ok(())
    }

    /// Runs the membership change `change` on openraft, one at a time on
    /// this node, and only while this node leads as a member.
    ///
    /// openraft alpha.37 keeps a leader that removed itself leading until
    /// it steps down, and a further change on it trips the core's assertion
    /// "Only leader is allowed to call update_effective_membership()" (the
    /// core panics and stops: seen in the Jepsen runs, reproduced by
    /// `tests/faults.rs`'s `the_leader_removes_itself_and_the_others_go_on`).
    /// So the core's state is checked first, and the change runs in a task
    /// that holds the lock until openraft answers (both steps of a joint
    /// change): a caller that gives up (a client's deadline) never leaves a
    /// change half-sent behind the next check.
    async fn change_membership<F, Fut>(&self, change: F) -> Result<(), NodeError>
    where
        F: FnOnce(Raft) -> Fut + Send + 'static,
        Fut: Future<Output = Result<ClientWriteResponse<TypeConfig>, WriteError>> + Send,
    {
        let one_at_a_time = self.inner.membership_change.clone().lock_owned().await;
        let id = self.id();
        let (state, member) = self
            .inner
            .raft
            .with_raft_state(move |st| {
                let membership = &st.membership_state;
                let member = membership.effective().membership().get_node(&id).is_some()
                    || membership
                        .committed()
                        .membership()
                        .voter_ids()
                        .any(|v| v == id);
                (st.server_state, member)
            })
            .await
            .map_err(|f| NodeError::Stopped(f.to_string()))?;
        if state == ServerState::Leader && !member {
            return Err(NodeError::NotMember(id));
        }
        if state != ServerState::Leader {
            let metrics = self.inner.raft.metrics().borrow_watched().clone();
            let leader_id = metrics.current_leader.filter(|l| *l != id);
            let leader_addr = leader_id.and_then(|l| {
                let membership = metrics.membership_config.membership();
                membership.get_node(&l).map(|n| n.addr.clone())
            });
            return Err(NodeError::NotLeader {
                leader_id,
                leader_addr,
            });
        }
        let raft = self.inner.raft.clone();
        let running = rt::spawn(&self.inner.seeds, async move {
            let _one_at_a_time = one_at_a_time;
            change(raft).await
        });
        match running.await {
            Ok(result) => result.map(|_| ()).map_err(write_error),
            Err(e) => Err(NodeError::Stopped(format!("membership change: {e}"))),
        }
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
