//! The follower's side of one connection, as a state machine without I/O:
//! which requests of which peer it takes, and what each one asks of the
//! node. What it owns:
//! - the checks a request must pass before anything is done with it: the
//!   vote of an AppendEntries, a snapshot part, a (pre-)vote request or a
//!   leader transfer names the peer that sent it (a peer that claims
//!   another node's vote is closed); a snapshot part is taken only under a
//!   vote no older than this node's; records written
//!   one-sided are taken only from the holder of this node's fence
//!   (DESIGN.md: adoption needs the writer's epoch equal to the fence); a
//!   grant goes only to the fence holder, and never to a leader the node's
//!   vote has superseded ([`refuse_grant`]); a node whose log is corrupt
//!   inside grants no vote and takes no leadership;
//! - putting split payloads together (two-sided entry batches, snapshots),
//!   in order and under their limits ([`AcceptorLimits`]): a two-sided
//!   batch is buffered only from the holder of this node's fence, a
//!   snapshot only from the leader of a vote no older than this node's;
//!   a peer past a limit is closed ([`Step::Close`]).
//!
//! It must never touch the ring, openraft or the connection: it returns a
//! [`Step`] and the glue (`server.rs`) performs it, reading the node's
//! state into a [`NodeView`] right before it asks (for an AppendEntries,
//! after it took the store's leader-request guard, so that no grant
//! overlaps it).

use openraft::raft::{TransferLeaderRequest, VoteRequest};
use ringraft_wal::{AdoptRequest, Epoch, LogPos, VoteRecord};

use crate::protocol::{AppendBody, Reply, Request, decode_entries};
use crate::types::{Command, Entry, LogId, SnapshotMeta, TypeConfig, Vote, term_of};

/// Largest snapshot a follower takes, in bytes.
pub use crate::state_machine::MAX_SNAPSHOT_BYTES;

/// What one connection's acceptor buffers of a split payload, at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptorLimits {
    /// The bytes of one two-sided entry batch
    /// ([`crate::NodeConfig::inline_batch_limit`]).
    pub inline_batch_bytes: u64,
    /// The bytes of one snapshot ([`crate::NodeConfig::max_snapshot_bytes`]).
    pub snapshot_bytes: u64,
}

impl Default for AcceptorLimits {
    fn default() -> Self {
        AcceptorLimits {
            inline_batch_bytes: crate::protocol::MAX_INLINE_BATCH_BYTES,
            snapshot_bytes: MAX_SNAPSHOT_BYTES,
        }
    }
}

/// What the acceptor needs to know of its node for one request.
#[derive(Clone, Copy, Debug)]
pub struct NodeView {
    /// This node.
    pub node_id: u64,
    /// The ring's fence.
    pub fence: Epoch,
    /// This node's vote, as saved.
    pub vote: Option<VoteRecord>,
    /// This node's log is corrupt inside until a leader re-replicates past
    /// the break: it grants no vote and takes no leadership.
    pub votes_blocked: bool,
}

/// The metadata of an AppendEntries, whatever way its entries travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendMeta {
    /// The leader's vote.
    pub vote: Vote,
    /// The log id before the entries.
    pub prev_log_id: Option<LogId>,
    /// The leader's commit.
    pub leader_commit: Option<LogId>,
}

/// What the node must do for a request.
#[derive(Debug)]
pub enum Step {
    /// Answer this, nothing else.
    Reply(Reply),
    /// The peer went past a limit or claimed another node's vote: answer
    /// [`Reply::Error`] with the reason, log it, and close the connection.
    Close(String),
    /// Grant write access to the holder of `epoch` (which the node checks
    /// again with [`refuse_grant`] around the rkey rotation), answering
    /// [`Reply::Granted`] or [`Reply::NotFenced`].
    Grant {
        /// The epoch the peer wrote into the fence.
        epoch: Epoch,
    },
    /// Check the records the fence holder wrote into the ring and, if they
    /// pass, hand them to openraft's AppendEntries with `meta`; if they do
    /// not, answer [`Reply::Rejected`].
    Adopt {
        /// The AppendEntries' metadata.
        meta: AppendMeta,
        /// Where the records are and what they must hold.
        request: AdoptRequest,
    },
    /// openraft's AppendEntries with entries that came two-sided (the node
    /// writes them itself: they need room in its ring) or none.
    Append {
        /// The AppendEntries' metadata.
        meta: AppendMeta,
        /// The entries.
        entries: Vec<Entry>,
    },
    /// openraft's vote (`pre`: a pre-vote).
    Vote {
        /// The request.
        request: VoteRequest<TypeConfig>,
        /// A pre-vote.
        pre: bool,
    },
    /// Refuse the vote: this node's log is corrupt inside. The answer
    /// carries its current vote and last log id.
    RefuseVote(VoteRequest<TypeConfig>),
    /// Install a complete snapshot.
    Install {
        /// The leader's vote.
        vote: Vote,
        /// The snapshot.
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
    },
    /// openraft's leader transfer.
    Transfer(TransferLeaderRequest<TypeConfig>),
    /// Propose forwarded commands, in order.
    Propose(Vec<Command>),
    /// Answer the leader's read index (`lease`: under its lease).
    ReadIndex {
        /// Under the lease.
        lease: bool,
    },
}

/// The acceptor of one connection. See the module docs.
#[derive(Debug)]
pub struct Acceptor {
    peer: u64,
    limits: AcceptorLimits,
    inline: Vec<u8>,
    inline_parts: u32,
    snapshot: Vec<u8>,
    snapshot_meta: Option<SnapshotMeta>,
}

impl Acceptor {
    /// The acceptor of a connection from node `peer` (authenticated by the
    /// handshake), buffering at most `limits`.
    pub fn new(peer: u64, limits: AcceptorLimits) -> Acceptor {
        Acceptor {
            peer,
            limits,
            inline: Vec::new(),
            inline_parts: 0,
            snapshot: Vec::new(),
            snapshot_meta: None,
        }
    }

    /// The peer.
    pub fn peer(&self) -> u64 {
        self.peer
    }

    /// Whether `request` may be taken while this connection's earlier
    /// requests are still with openraft: an AppendEntries whose entries
    /// were written one-sided, or that carries none. openraft takes them in
    /// order; anything else (a grant above all, which must see no leader
    /// request in flight; two-sided parts; votes) waits until the earlier
    /// ones are answered.
    pub fn pipelines(request: &Request) -> bool {
        matches!(
            request,
            Request::Append {
                body: AppendBody::Written { .. } | AppendBody::Empty,
                ..
            }
        )
    }

    /// Whether `request` is a call a follower forwarded (a proposal or a
    /// read index): many of those are in flight on one connection, and
    /// their answers go back in the order they came.
    pub fn forwarded(request: &Request) -> bool {
        matches!(request, Request::Propose(_) | Request::ReadIndex { .. })
    }

    /// What `request` asks of the node in the state `node`.
    pub fn on_request(&mut self, request: Request, node: &NodeView) -> Step {
        if let Some(vote) = claimed_vote(&request)
            && vote.leader_id.voted_for != self.peer
        {
            // A member claiming to be another.
            return Step::Close(format!(
                "node {} sent a vote for node {}",
                self.peer, vote.leader_id.voted_for
            ));
        }
        match request {
            Request::Grant { epoch } if epoch.leader_id() != self.peer => Step::Reply(
                Reply::Error(format!("epoch {epoch} is not node {}'s", self.peer)),
            ),
            Request::Grant { epoch } => Step::Grant { epoch },
            Request::Append {
                vote,
                prev_log_id,
                leader_commit,
                epoch,
                body,
            } => {
                let meta = AppendMeta {
                    vote,
                    prev_log_id,
                    leader_commit,
                };
                self.on_append(meta, epoch, body, node)
            }
            Request::Vote(request) | Request::PreVote(request) if node.votes_blocked => {
                Step::RefuseVote(request)
            }
            Request::Vote(request) => Step::Vote {
                request,
                pre: false,
            },
            Request::PreVote(request) => Step::Vote { request, pre: true },
            Request::Snapshot {
                vote,
                meta,
                offset,
                total,
                data,
            } => self.on_snapshot_part(vote, meta, offset, total, data, node),
            // openraft's election by leadership transfer ignores
            // `enable_elect`: the no-vote rule of a log corrupt inside is
            // enforced here.
            Request::TransferLeader(request)
                if *request.to_node_id() == node.node_id && node.votes_blocked =>
            {
                Step::Reply(Reply::Error(format!(
                    "node {} refuses the leadership: its log is corrupt inside until a leader \
                     re-replicates past the break",
                    node.node_id
                )))
            }
            Request::TransferLeader(request) => Step::Transfer(request),
            Request::Propose(commands)
                if commands.len() > crate::protocol::MAX_FORWARDED_COMMANDS =>
            {
                Step::Reply(Reply::Error(format!(
                    "{} commands in one forward",
                    commands.len()
                )))
            }
            Request::Propose(commands) => Step::Propose(commands),
            Request::ReadIndex { lease } => Step::ReadIndex { lease },
        }
    }

    /// True when `epoch` is the ring's fence and belongs to the peer.
    fn fenced_by_peer(&self, node: &NodeView, epoch: Epoch) -> bool {
        epoch.leader_id() == self.peer && node.fence == epoch
    }

    fn on_append(
        &mut self,
        meta: AppendMeta,
        epoch: Epoch,
        body: AppendBody,
        node: &NodeView,
    ) -> Step {
        match body {
            AppendBody::Empty => Step::Append {
                meta,
                entries: Vec::new(),
            },
            AppendBody::Written { .. } if !self.fenced_by_peer(node, epoch) => {
                Step::Reply(Reply::NotFenced { fence: node.fence })
            }
            AppendBody::Written {
                from_lsn,
                to_lsn,
                count,
                last,
            } => Step::Adopt {
                meta,
                request: AdoptRequest {
                    from_lsn,
                    to_lsn,
                    entries: count,
                    last: Some(LogPos {
                        term: term_of(&last),
                        index: last.index,
                    }),
                },
            },
            // Nothing of a two-sided batch is buffered, let alone decoded,
            // but from the fence holder.
            AppendBody::Inline { .. } if !self.fenced_by_peer(node, epoch) => {
                self.inline.clear();
                self.inline_parts = 0;
                Step::Reply(Reply::NotFenced { fence: node.fence })
            }
            AppendBody::Inline { part, parts, bytes } => {
                match self.on_inline_part(part, parts, bytes) {
                    Ok(Some(entries)) => Step::Append { meta, entries },
                    Ok(None) => Step::Reply(Reply::PartStored),
                    Err(InlineError::Order(message)) => Step::Reply(Reply::Error(message)),
                    Err(InlineError::Limit(message)) => Step::Close(message),
                }
            }
        }
    }

    /// Stores part `part` of `parts` of a two-sided batch; the entries once
    /// the last part came.
    fn on_inline_part(
        &mut self,
        part: u32,
        parts: u32,
        bytes: Vec<u8>,
    ) -> Result<Option<Vec<Entry>>, InlineError> {
        if part == 0 {
            self.inline.clear();
            self.inline_parts = 0;
        }
        if part != self.inline_parts || parts == 0 || part >= parts {
            self.inline.clear();
            return Err(InlineError::Order(format!(
                "inline part {part} of {parts} out of order"
            )));
        }
        let limit = self.limits.inline_batch_bytes;
        if self.inline.len() as u64 + bytes.len() as u64 > limit {
            let at = self.inline.len() as u64 + bytes.len() as u64;
            self.inline = Vec::new();
            self.inline_parts = 0;
            return Err(InlineError::Limit(format!(
                "a two-sided entry batch of {at} bytes or more is above the limit of {limit}"
            )));
        }
        self.inline.extend_from_slice(&bytes);
        self.inline_parts += 1;
        if self.inline_parts < parts {
            return Ok(None);
        }
        let bytes = std::mem::take(&mut self.inline);
        decode_entries(&bytes).map(Some).map_err(InlineError::Order)
    }

    fn on_snapshot_part(
        &mut self,
        vote: Vote,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
        node: &NodeView,
    ) -> Step {
        if total > self.limits.snapshot_bytes {
            self.snapshot = Vec::new();
            self.snapshot_meta = None;
            return Step::Close(format!(
                "a snapshot of {total} bytes is above the limit of {}",
                self.limits.snapshot_bytes
            ));
        }
        // Only the leader of a vote no older than this node's fills a
        // buffer (openraft checks the vote again when it installs).
        if let Some(saved) = node.vote
            && vote.leader_id.term < saved.term
        {
            self.snapshot = Vec::new();
            self.snapshot_meta = None;
            return Step::Reply(Reply::Error(format!(
                "a snapshot under term {} is older than this node's vote (term {})",
                vote.leader_id.term, saved.term
            )));
        }
        if offset == 0 {
            self.snapshot.clear();
            self.snapshot_meta = Some(meta.clone());
        }
        if offset != self.snapshot.len() as u64 || self.snapshot_meta.as_ref() != Some(&meta) {
            self.snapshot.clear();
            self.snapshot_meta = None;
            return Step::Reply(Reply::Error(format!(
                "snapshot part at {offset} out of order"
            )));
        }
        if offset + data.len() as u64 > total {
            self.snapshot.clear();
            return Step::Reply(Reply::Error("snapshot part beyond its total".into()));
        }
        self.snapshot.extend_from_slice(&data);
        if (self.snapshot.len() as u64) < total {
            return Step::Reply(Reply::PartStored);
        }
        self.snapshot_meta = None;
        Step::Install {
            vote,
            snapshot: openraft::Snapshot {
                meta,
                snapshot: std::mem::take(&mut self.snapshot),
            },
        }
    }
}

/// The vote a request claims to be the sender's own, if it carries one.
fn claimed_vote(request: &Request) -> Option<&Vote> {
    match request {
        Request::Append { vote, .. } | Request::Snapshot { vote, .. } => Some(vote),
        Request::Vote(request) | Request::PreVote(request) => Some(&request.vote),
        Request::TransferLeader(request) => Some(request.from_leader()),
        Request::Grant { .. } | Request::Propose(_) | Request::ReadIndex { .. } => None,
    }
}

/// Why a part of a two-sided batch was not taken.
enum InlineError {
    /// Out of order, or the entries do not decode: answered, the
    /// connection stays.
    Order(String),
    /// Above the limit: the connection is closed.
    Limit(String),
}

/// Why `epoch` may not be granted write access now: the fence found (or
/// the epoch of this node's vote where that is higher). Refused when
/// `epoch` is not the fence, or when it cannot be the epoch of a current
/// leader:
/// - its term is below this node's vote term. The fence may still hold a
///   deposed leader's epoch after the term advanced (the rkey was rotated
///   then, and no leader of the new term has fenced in yet); that leader
///   must not get write access back (DESIGN.md, fencing);
/// - this node's vote is committed (it knows the leader of that term) for
///   another leader of the same term.
pub fn refuse_grant(fence: Epoch, vote: Option<VoteRecord>, epoch: Epoch) -> Result<(), Epoch> {
    if fence != epoch {
        return Err(fence);
    }
    let Some(vote) = vote else {
        return Ok(());
    };
    let below_vote = epoch.term() < vote.term;
    // PLANTED BUG `regrant-stale-term` (test-only): the vote's term ignored.
    #[cfg(feature = "planted-bugs")]
    let below_vote = below_vote && !crate::planted::is_on(crate::planted::REGRANT_STALE_TERM);
    let superseded = below_vote
        || (vote.committed
            && epoch.term() == vote.term
            && vote.voted_for != Some(epoch.leader_id()));
    if !superseded {
        return Ok(());
    }
    let voted = vote
        .voted_for
        .and_then(|leader| Epoch::new(vote.term, leader))
        .or_else(|| Epoch::new(vote.term, 0))
        .unwrap_or(fence);
    Err(voted.max(fence))
}

#[cfg(test)]
mod tests {
    //! The acceptor's own rules on what it buffers and from whom (issue 15,
    //! item 2). The pair tests (`tests/`) play whole exchanges.
    use openraft::raft::{TransferLeaderRequest, VoteRequest};

    use super::*;

    const PEER: u64 = 1;
    const ME: u64 = 2;

    fn limits() -> AcceptorLimits {
        AcceptorLimits {
            inline_batch_bytes: 1000,
            snapshot_bytes: 5000,
        }
    }

    /// This node, its fence held by `fence_holder` in term 3, its vote in
    /// `vote_term` for the peer.
    fn node(fence_holder: u64, vote_term: u64) -> NodeView {
        NodeView {
            node_id: ME,
            fence: Epoch::new(3, fence_holder).unwrap(),
            vote: Some(VoteRecord {
                term: vote_term,
                voted_for: Some(PEER),
                committed: true,
            }),
            votes_blocked: false,
        }
    }

    fn inline(vote_for: u64, part: u32, parts: u32, len: usize) -> Request {
        Request::Append {
            vote: Vote::new_committed(3, vote_for),
            prev_log_id: None,
            leader_commit: None,
            epoch: Epoch::new(3, PEER).unwrap(),
            body: AppendBody::Inline {
                part,
                parts,
                bytes: vec![0; len],
            },
        }
    }

    fn snapshot(vote: Vote, offset: u64, total: u64, len: usize) -> Request {
        Request::Snapshot {
            vote,
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
            },
            offset,
            total,
            data: vec![0; len],
        }
    }

    fn closes(step: Step, why: &str) {
        match step {
            Step::Close(reason) => assert!(reason.contains(why), "{reason}"),
            other => panic!("not closed ({why}): {other:?}"),
        }
    }

    #[test]
    fn a_two_sided_batch_is_buffered_only_from_the_fence_holder() {
        let mut acceptor = Acceptor::new(PEER, limits());
        // The fence is another node's: not even the first part is kept.
        match acceptor.on_request(inline(PEER, 0, 2, 500), &node(3, 3)) {
            Step::Reply(Reply::NotFenced { fence }) => assert_eq!(fence.leader_id(), 3),
            other => panic!("a part buffered without the fence: {other:?}"),
        }
        assert!(acceptor.inline.capacity() == 0, "nothing is buffered");
        // The fence holder's parts are.
        assert!(matches!(
            acceptor.on_request(inline(PEER, 0, 2, 500), &node(PEER, 3)),
            Step::Reply(Reply::PartStored)
        ));
    }

    #[test]
    fn a_two_sided_batch_above_its_limit_closes_the_connection() {
        let mut acceptor = Acceptor::new(PEER, limits());
        let fenced = node(PEER, 3);
        assert!(matches!(
            acceptor.on_request(inline(PEER, 0, 3, 600), &fenced),
            Step::Reply(Reply::PartStored)
        ));
        closes(
            acceptor.on_request(inline(PEER, 1, 3, 600), &fenced),
            "above the limit of 1000",
        );
        assert_eq!(acceptor.inline.capacity(), 0, "the buffer is given back");
    }

    #[test]
    fn a_snapshot_above_its_limit_closes_the_connection_before_a_byte_is_kept() {
        let mut acceptor = Acceptor::new(PEER, limits());
        closes(
            acceptor.on_request(
                snapshot(Vote::new_committed(3, PEER), 0, 5001, 10),
                &node(PEER, 3),
            ),
            "above the limit of 5000",
        );
        assert_eq!(acceptor.snapshot.capacity(), 0);
        assert!(matches!(
            acceptor.on_request(
                snapshot(Vote::new_committed(3, PEER), 0, 5000, 10),
                &node(PEER, 3)
            ),
            Step::Reply(Reply::PartStored)
        ));
    }

    #[test]
    fn a_snapshot_is_taken_only_under_the_senders_own_and_current_vote() {
        let mut acceptor = Acceptor::new(PEER, limits());
        // A vote for another node: the peer claims to be someone else.
        closes(
            acceptor.on_request(
                snapshot(Vote::new_committed(3, 3), 0, 100, 10),
                &node(PEER, 3),
            ),
            "sent a vote for node 3",
        );
        // An older term than this node's vote: refused, nothing kept.
        match acceptor.on_request(
            snapshot(Vote::new_committed(2, PEER), 0, 100, 10),
            &node(PEER, 3),
        ) {
            Step::Reply(Reply::Error(reason)) => assert!(reason.contains("older"), "{reason}"),
            other => panic!("a stale leader's snapshot was taken: {other:?}"),
        }
        assert_eq!(acceptor.snapshot.capacity(), 0);
    }

    #[test]
    fn votes_and_transfers_must_be_the_senders_own() {
        let view = node(PEER, 3);
        let mut acceptor = Acceptor::new(PEER, limits());
        let forged = VoteRequest::new(Vote::new(4, 3), None);
        closes(
            acceptor.on_request(Request::Vote(forged.clone()), &view),
            "sent a vote for node 3",
        );
        closes(
            acceptor.on_request(Request::PreVote(forged), &view),
            "sent a vote for node 3",
        );
        let own = VoteRequest::new(Vote::new(4, PEER), None);
        assert!(matches!(
            acceptor.on_request(Request::Vote(own), &view),
            Step::Vote { pre: false, .. }
        ));
        let transfer = TransferLeaderRequest::new(Vote::new_committed(3, 3), ME, None);
        closes(
            acceptor.on_request(Request::TransferLeader(transfer), &view),
            "sent a vote for node 3",
        );
        let transfer = TransferLeaderRequest::new(Vote::new_committed(3, PEER), ME, None);
        assert!(matches!(
            acceptor.on_request(Request::TransferLeader(transfer), &view),
            Step::Transfer(_)
        ));
    }

    #[test]
    fn an_append_under_another_nodes_vote_closes_the_connection() {
        let mut acceptor = Acceptor::new(PEER, limits());
        closes(
            acceptor.on_request(inline(3, 0, 1, 10), &node(PEER, 3)),
            "sent a vote for node 3",
        );
    }
}
