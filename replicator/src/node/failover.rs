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
//! skipped once a new leader (a new vote) is known.
//!
//! A follower whose log is behind loses its turn's vote: the voters whose
//! log is longer refuse it, and it has voted for itself in the term after
//! the dead leader's. A later turn that stood in that same term would split
//! the vote with it (and an ordinary election, an election timeout later,
//! would follow). So a voter that refuses such a candidate for its log
//! (the server tells the watcher, [`FailoverNews::answered`]) takes
//! the candidate's term as its own (it casts, locally, the vote it refused
//! to send: it can then vote for no one else in that term, which is all a
//! vote promises) and stands in the term after it. It stands at once when
//! the candidate cannot win without it (the other live voters are no
//! quorum), else at its turn.
//!
//! Owns the decision to stand on a confirmed death; it must never stand
//! on a suspicion (a timeout, a silence) nor while this node may not vote
//! (`LogStore::votes_blocked`).

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::{TransferLeaderRequest, VoteRequest};
use ringraft_transport::{Device, Probe};
use tokio::sync::{mpsc, watch};

use crate::log_store::LogStore;
use crate::metrics::Metrics;
use crate::types::{LogId, Raft, TypeConfig, Vote};

/// Ended connections queued for the watcher, at most; more are dropped
/// (a death ends one connection per peer; the rest are the same news).
const LOST_QUEUE: usize = 64;
/// Probes of one address before its answer counts: the connection can end
/// a moment before the dying process's listening socket closes.
const PROBES: u32 = 4;

/// What the server tells the watcher: peers whose connection ended, and
/// candidates it refused for their log.
#[derive(Clone, Debug)]
pub(crate) struct FailoverNews {
    lost: mpsc::Sender<u64>,
    behind: watch::Sender<Option<Vote>>,
}

impl FailoverNews {
    /// Reports that `peer`'s connection to this node ended, not closed by
    /// this node. Never waits: when the queue is full the news is dropped.
    pub(crate) fn lost(&self, peer: u64) {
        let _ = self.lost.try_send(peer);
    }

    /// Told of this node's answer to a vote `request`: a refusal of a
    /// leadership-transfer election because the candidate's log is behind
    /// this node's (`last_log_id`, as the answer gives it) is news.
    pub(crate) fn answered(
        &self,
        request: &VoteRequest<TypeConfig>,
        granted: bool,
        last_log_id: Option<&LogId>,
    ) {
        if !granted && request.leadership_transfer && last_log_id > request.last_log_id.as_ref() {
            self.behind.send_replace(Some(request.vote));
        }
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
    /// The last candidate this node refused for its log.
    pub(super) behind: watch::Receiver<Option<Vote>>,
}

/// A reporter and what its watcher runs on: the ended connections and the
/// refused candidates.
pub(super) fn failover_news() -> (
    FailoverNews,
    mpsc::Receiver<u64>,
    watch::Receiver<Option<Vote>>,
) {
    let (lost, lost_rx) = mpsc::channel(LOST_QUEUE);
    let (behind, behind_rx) = watch::channel(None);
    (FailoverNews { lost, behind }, lost_rx, behind_rx)
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
        // The candidates that cannot win without this node: the other
        // live voters are no quorum.
        let others_live = voters
            .iter()
            .filter(|v| **v != peer && **v != self.id)
            .count();
        let needed = others_live * 2 <= voters.len();
        let behind = match self.wait_turn(&vote, self.turn * turn, needed).await {
            Turn::NewVote => return true,
            Turn::Came => candidate_after(&vote, &self.behind.borrow()),
            Turn::Behind(candidate) => Some(candidate),
        };
        if self.store.votes_blocked() || self.raft.metrics().borrow_watched().vote != vote {
            return true;
        }
        let from = match &behind {
            None => vote,
            Some(candidate) => match self.take_term_of(candidate).await {
                Some(adopted) => adopted,
                None => return true,
            },
        };
        self.metrics.fast_elections.inc();
        match behind {
            None => tracing::info!(
                leader = peer,
                turn,
                "no new leader by this node's turn: standing"
            ),
            Some(candidate) => tracing::info!(
                leader = peer,
                turn,
                %candidate,
                "a candidate whose log is behind this node's stood: standing in the term after it"
            ),
        }
        // `None`: no log requirement on this node (it stands on its own log;
        // the voters judge it).
        let request = TransferLeaderRequest::new(from, self.id, None);
        if let Err(e) = self.raft.handle_transfer_leader(request).await {
            tracing::warn!(error = %e, "standing for election after the leader's death");
        }
        true
    }

    /// Waits for this node's turn (`wait`), or until its vote moves on from
    /// `vote`, or until it refuses a candidate of the term after `vote`
    /// for its log (when `needed`: that candidate cannot win without it).
    async fn wait_turn(&self, vote: &Vote, wait: Duration, needed: bool) -> Turn {
        let mut behind = self.behind.clone();
        let refused = async {
            loop {
                if needed
                    && let Some(candidate) = candidate_after(vote, &behind.borrow_and_update())
                {
                    return candidate;
                }
                if behind.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            biased;
            moved = self.new_vote_within(vote, wait) => if moved { Turn::NewVote } else { Turn::Came },
            candidate = refused => Turn::Behind(candidate),
        }
    }

    /// Makes `candidate`'s term this node's own by casting, locally, the
    /// vote it refused to send (stated as a request with this node's own
    /// log, which is what passes the log check; the answer goes nowhere).
    /// Returns this node's new vote, or `None` when it did not take it
    /// (the vote moved on meanwhile, or the candidate is known to have
    /// won).
    async fn take_term_of(&self, candidate: &Vote) -> Option<Vote> {
        let last_log_id = match self
            .raft
            .with_raft_state(|st| st.log_ids.last().cloned())
            .await
        {
            Ok(last) => last,
            Err(e) => {
                tracing::warn!(error = %e, "reading the log's end to stand after a candidate");
                return None;
            }
        };
        let mut request = VoteRequest::new(*candidate, last_log_id);
        request.leadership_transfer = true;
        match self.raft.vote(request).await {
            // A committed vote: the candidate won meanwhile (and this node
            // heard of it): nothing to stand in.
            Ok(answer) if answer.vote_granted && !answer.vote.is_committed() => Some(answer.vote),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "taking the term of a candidate this node refused");
                None
            }
        }
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
    async fn new_vote_within(&self, vote: &Vote, wait: Duration) -> bool {
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

/// `refused`, the last candidate this node refused for its log, when it
/// stood in the term after `vote`'s.
fn candidate_after(vote: &Vote, refused: &Option<Vote>) -> Option<Vote> {
    refused.filter(|candidate| candidate.leader_id().term == vote.leader_id().term + 1)
}

/// How a wait for this node's turn ended.
enum Turn {
    /// A new vote is known: someone else stood.
    NewVote,
    /// The turn came.
    Came,
    /// This node refused the candidate for its log, and the candidate
    /// cannot win without it.
    Behind(Vote),
}
