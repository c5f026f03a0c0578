//! Failover in milliseconds: a follower that finds its leader gone through
//! the fabric starts an election at once, instead of waiting out the
//! leader's lease and an election timeout (together 450..600 ms with the
//! defaults).
//!
//! "Gone" is confirmed, not suspected: the leader's connection to this
//! node ended (the server saw its receive fail), and a probe of the
//! leader's listen address is refused: the leader's host answers that no
//! socket listens there (`Device::probe`; on `rdma`, the bootstrap port
//! the queue pairs are set up through). A node's listener lives as long as
//! its Raft core runs (`Node::shutdown` stops the core first), so a
//! refused probe means the leader can no longer serve a lease read: its
//! lease may end early. That is what `TransferLeaderRequest` does in
//! openraft: it drops this node's lease on the old leader and elects this
//! node with a vote request marked as a leadership transfer, which voters
//! grant even while their own lease of the old leader runs (the Raft
//! dissertation's 4.2.3; here the old leader cannot hand over, so the
//! fabric's word stands in for it). The assumption: the network does not
//! forge refusals (`NodeConfig::fast_failover` turns this off where it
//! may). A leader that is only slow, paused or cut off keeps its
//! connections or times out without a refusal: it is replaced by the
//! ordinary election, after its lease.
//!
//! Every follower that confirms the death would stand at once; to avoid a
//! split vote they take turns: the voters other than the dead leader, by
//! id, each one heartbeat interval after the one before, and a turn is
//! skipped once a new leader (a new vote) is known. A follower whose log
//! is behind loses its turn's vote and the next one stands.
//!
//! Owns the decision to stand on a confirmed death; it must never stand
//! on a suspicion (a timeout, a silence) nor while this node may not vote
//! (`LogStore::votes_blocked`).

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::TransferLeaderRequest;
use ringraft_transport::{Device, Probe};
use tokio::sync::mpsc;

use crate::log_store::LogStore;
use crate::metrics::Metrics;
use crate::types::Raft;

/// Ended connections queued for the watcher, at most; more are dropped
/// (a death ends one connection per peer; the rest are the same news).
const LOST_QUEUE: usize = 64;
/// Probes of one address before its answer counts: the connection can end
/// a moment before the dying process's listening socket closes.
const PROBES: u32 = 4;

/// Where the server reports a peer whose connection ended.
#[derive(Clone, Debug)]
pub(crate) struct LostPeers(mpsc::Sender<u64>);

impl LostPeers {
    /// Reports that `peer`'s connection to this node ended, not closed by
    /// this node. Never waits: when the queue is full the news is dropped.
    pub(crate) fn report(&self, peer: u64) {
        let _ = self.0.try_send(peer);
    }
}

/// What the watcher needs of its node.
pub(super) struct Watcher {
    pub(super) id: u64,
    pub(super) raft: Raft,
    pub(super) device: Device,
    pub(super) store: LogStore,
    pub(super) metrics: Arc<Metrics>,
    /// The heartbeat interval: one turn.
    pub(super) turn: Duration,
    /// One probe's time limit.
    pub(super) probe_timeout: Duration,
}

/// A reporter and the receiver its watcher runs on.
pub(super) fn lost_peers() -> (LostPeers, mpsc::Receiver<u64>) {
    let (tx, rx) = mpsc::channel(LOST_QUEUE);
    (LostPeers(tx), rx)
}

impl Watcher {
    /// Handles each reported peer in turn, until the reporters are gone.
    pub(super) async fn run(self, mut lost: mpsc::Receiver<u64>) {
        // The leadership last acted on: its other connections' ends are
        // the same news.
        let mut handled = None;
        while let Some(peer) = lost.recv().await {
            let vote = self.raft.metrics().borrow_watched().vote;
            if handled.as_ref() == Some(&vote) {
                continue;
            }
            if self.on_lost(peer).await {
                handled = Some(vote);
            }
        }
    }

    /// Acts on the end of `peer`'s connection; whether it found the leader
    /// gone.
    async fn on_lost(&self, peer: u64) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(peer)
            || peer == self.id
            || m.state == ServerState::Leader
            || !m.vote.is_committed()
        {
            return false;
        }
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        if !voters.contains(&self.id) || self.store.votes_blocked() {
            return false;
        }
        let Some(addr) = membership.get_node(&peer).map(|n| n.addr.clone()) else {
            return false;
        };
        if !self.refused(&addr).await {
            return false;
        }
        self.metrics.dead_leaders.inc();
        let vote = m.vote;
        if self.raft.metrics().borrow_watched().vote != vote {
            // Another node stood while this one probed.
            return true;
        }
        let turn = voters
            .iter()
            .filter(|v| **v != peer && **v < self.id)
            .count() as u32;
        tracing::info!(
            leader = peer,
            %addr,
            turn,
            "the leader is gone (its connection ended, its address refuses): standing for election"
        );
        if turn > 0 && self.new_vote_within(&vote, self.turn * turn).await {
            return true;
        }
        if self.store.votes_blocked() || self.raft.metrics().borrow_watched().vote != vote {
            return true;
        }
        self.metrics.fast_elections.inc();
        tracing::info!(
            leader = peer,
            turn,
            "no new leader by this node's turn: standing"
        );
        // `None`: no log requirement on this node (it stands on its own log;
        // the voters judge it).
        let request = TransferLeaderRequest::new(vote, self.id, None);
        if let Err(e) = self.raft.handle_transfer_leader(request).await {
            tracing::warn!(error = %e, "standing for election after the leader's death");
        }
        true
    }

    /// Whether `addr` refuses a probe, asked up to [`PROBES`] times a
    /// moment apart (the first answer that is not a refusal is not final:
    /// the dying process may not have closed its listening socket yet).
    async fn refused(&self, addr: &str) -> bool {
        for attempt in 0..PROBES {
            match self.device.probe(addr, self.probe_timeout).await {
                Probe::Refused => return true,
                Probe::Listening | Probe::Unknown(_) if attempt + 1 < PROBES => {
                    tokio::time::sleep(self.turn / 10).await;
                }
                Probe::Listening | Probe::Unknown(_) => {}
            }
        }
        false
    }

    /// Whether this node's vote moves on from `vote` within `wait`.
    async fn new_vote_within(&self, vote: &crate::types::Vote, wait: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        let changed = async {
            loop {
                if metrics.borrow_watched().vote != *vote {
                    return;
                }
                if metrics.changed().await.is_err() {
                    // The core stopped: nothing to stand in.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(wait, changed).await.is_ok()
    }
}
