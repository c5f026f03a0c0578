//! The node API's errors: [`NodeError`], and the mapping of admission and
//! openraft errors onto it.
//!
//! Owns the error type and its conversions; it must never decide to retry
//! or act on an error (callers do).

use openraft::error::{ClientWriteError, RaftError};

use crate::admission::AdmissionError;
use crate::types::TypeConfig;

/// Errors of the node API.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NodeError {
    /// This node is not the leader; the leader, if known.
    #[error("not the leader; leader is {leader_id:?} at {leader_addr:?}")]
    NotLeader {
        /// The leader's id.
        leader_id: Option<u64>,
        /// The leader's address.
        leader_addr: Option<String>,
    },
    /// This node leads but is no longer a member (it removed itself and
    /// steps down once the removal is committed): it takes no membership
    /// change; ask another node.
    #[error(
        "node {0} was removed from the cluster and is handing leadership over; \
         ask another node"
    )]
    NotMember(u64),
    /// A configuration value is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The data directory cannot be used.
    #[error("storage: {0}")]
    Storage(String),
    /// The fabric cannot be used.
    #[error("fabric: {0}")]
    Fabric(String),
    /// The outcome is unknown (the leader changed under the proposal); retry
    /// with the same session to get exactly-once.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The node stopped.
    #[error("the node stopped: {0}")]
    Stopped(String),
    /// Anything else openraft reports.
    #[error("{0}")]
    Raft(String),
    /// A wait timed out.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A session's command reached the log before its predecessor was
    /// applied, so it was not applied (see [`Session`](crate::Session)): retry it, with the
    /// same session and seq, once the earlier seqs are acknowledged.
    #[error(
        "client {client_id}: seq {seq} came before seq {expected}, which is not applied yet; \
         retry it after the earlier ones (a session the cluster forgot stays out of order: \
         start a new one)"
    )]
    OutOfOrder {
        /// The session's client.
        client_id: u64,
        /// The command's seq.
        seq: u64,
        /// The seq the session waits for.
        expected: u64,
    },
    /// The ring stayed full for the whole admission wait: nothing was
    /// proposed; retry later (backpressure, see [`crate::admission`]).
    #[error("{0}")]
    Busy(String),
    /// The proposal can never fit the ring (a command above the largest
    /// record, or too many at once).
    #[error("{0}")]
    TooLarge(String),
    /// This node's disk is full: the proposal was refused (nothing was
    /// proposed). Reads go on; appends are taken again once space is freed.
    #[error("{0}")]
    DiskFull(String),
    /// A read below the first index this node holds: the records there
    /// were trimmed (retention, [`Node::trim`](crate::Node::trim)), or, on a node that a
    /// snapshot caught up, never reached it.
    #[error(
        "index {index} is below the first index this node holds ({first}): \
         records before it were trimmed"
    )]
    Trimmed {
        /// The index asked for.
        index: u64,
        /// The first index held.
        first: u64,
    },
}

impl From<AdmissionError> for NodeError {
    fn from(e: AdmissionError) -> NodeError {
        match e {
            AdmissionError::Busy { .. } => NodeError::Busy(e.to_string()),
            AdmissionError::DiskFull { why } => NodeError::DiskFull(why),
            AdmissionError::RecordTooLarge { .. } | AdmissionError::BatchTooLarge { .. } => {
                NodeError::TooLarge(e.to_string())
            }
        }
    }
}

/// Maps a membership or write error; a follower's ForwardToLeader becomes
/// [`NodeError::NotLeader`].
pub(super) fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> NodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NotLeader {
            leader_id: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        },
        other => raft_error(other),
    }
}

pub(super) fn raft_error<E: std::fmt::Display + std::fmt::Debug>(
    e: RaftError<TypeConfig, E>,
) -> NodeError {
    match e {
        RaftError::Fatal(f) => NodeError::Stopped(f.to_string()),
        RaftError::APIError(e) => NodeError::Raft(e.to_string()),
    }
}
