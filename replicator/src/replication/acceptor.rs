//! The follower's side of one connection, as a state machine without I/O:
//! which requests of which peer it takes, and what each one asks of the
//! node. What it owns:
//! - the checks a request must pass before anything is done with it: the
//!   vote of an AppendEntries names the peer that sent it; records written
//!   one-sided are taken only from the holder of this node's fence
//!   (DESIGN.md: adoption needs the writer's epoch equal to the fence); a
//!   grant goes only to the fence holder, and never to a leader the node's
//!   vote has superseded ([`refuse_grant`]); a node whose log is corrupt
//!   inside grants no vote and takes no leadership;
//! - putting split payloads together (two-sided entry batches, snapshots),
//!   in order and under their limits.
//!
//! It must never touch the ring, openraft or the connection: it returns a
//! [`Step`] and the glue (`server.rs`) performs it, reading the node's
//! state into a [`NodeView`] right before it asks (for an AppendEntries,
//! after it took the store's leader-request guard, so that no grant
//! overlaps it).

use openraft::raft::{TransferLeaderRequest, VoteRequest};
use ringraft_wal::{AdoptRequest, Epoch, LogPos, VoteRecord};

use crate::protocol::{AppendBody, MAX_INLINE_BATCH_BYTES, Reply, Request, decode_entries};
use crate::types::{Command, Entry, LogId, SnapshotMeta, TypeConfig, Vote, term_of};

/// Largest snapshot a follower takes, in bytes.
pub use crate::state_machine::MAX_SNAPSHOT_BYTES;

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
    inline: Vec<u8>,
    inline_parts: u32,
    snapshot: Vec<u8>,
    snapshot_meta: Option<SnapshotMeta>,
}

impl Acceptor {
    /// The acceptor of a connection from node `peer` (authenticated by the
    /// handshake).
    pub fn new(peer: u64) -> Acceptor {
        Acceptor {
            peer,
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
                if vote.leader_id.voted_for != self.peer {
                    return Step::Reply(Reply::Error(format!(
                        "node {} sent a vote for node {}",
                        self.peer, vote.leader_id.voted_for
                    )));
                }
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
            } => self.on_snapshot_part(vote, meta, offset, total, data),
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
            AppendBody::Inline { part, parts, bytes } => {
                let entries = match self.on_inline_part(part, parts, bytes) {
                    Ok(Some(entries)) => entries,
                    Ok(None) => return Step::Reply(Reply::PartStored),
                    Err(message) => return Step::Reply(Reply::Error(message)),
                };
                if !entries.is_empty() && !self.fenced_by_peer(node, epoch) {
                    return Step::Reply(Reply::NotFenced { fence: node.fence });
                }
                Step::Append { meta, entries }
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
    ) -> Result<Option<Vec<Entry>>, String> {
        if part == 0 {
            self.inline.clear();
            self.inline_parts = 0;
        }
        if part != self.inline_parts || parts == 0 || part >= parts {
            self.inline.clear();
            return Err(format!("inline part {part} of {parts} out of order"));
        }
        if self.inline.len() as u64 + bytes.len() as u64 > MAX_INLINE_BATCH_BYTES {
            self.inline.clear();
            return Err("inline entry batch too large".into());
        }
        self.inline.extend_from_slice(&bytes);
        self.inline_parts += 1;
        if self.inline_parts < parts {
            return Ok(None);
        }
        let bytes = std::mem::take(&mut self.inline);
        decode_entries(&bytes).map(Some)
    }

    fn on_snapshot_part(
        &mut self,
        vote: Vote,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) -> Step {
        if total > MAX_SNAPSHOT_BYTES {
            return Step::Reply(Reply::Error(format!(
                "snapshot of {total} bytes is above the limit"
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
