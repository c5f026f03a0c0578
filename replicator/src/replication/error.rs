//! Why an exchange with a peer failed. Every error of the leader's side is
//! one of these: what a peer sent that breaks the protocol is
//! [`ReplicationError::Protocol`], never a panic. How openraft is told is
//! the network glue's (`network::error`).

use ringraft_transport::TransportError;
use ringraft_wal::record::EncodeError;
use ringraft_wal::{Epoch, WordLength};

/// Why an exchange with a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// The peer could not be reached: connecting, the handshake, or another
    /// node answered at its address.
    #[error("node {node} is unreachable: {why}")]
    Unreachable {
        /// The peer.
        node: u64,
        /// What happened.
        why: String,
    },
    /// The fabric failed an operation (the connection is gone or in the
    /// error state).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// No answer in time.
    #[error("no answer from node {node} in time")]
    Timeout {
        /// The peer.
        node: u64,
    },
    /// No connection to post on (it was dropped by an earlier failure).
    #[error("not connected")]
    NotConnected,
    /// The peer broke the protocol: a bad handshake, grant, tail or head,
    /// an answer of the wrong kind.
    #[error("node {node} broke the protocol: {what}")]
    Protocol {
        /// The peer.
        node: u64,
        /// What it sent.
        what: String,
    },
    /// A READ of a control word returned another length.
    #[error(transparent)]
    Word(#[from] WordLength),
    /// The peer could not handle the request and said why.
    #[error("node {node} answered an error: {message}")]
    Remote {
        /// The peer.
        node: u64,
        /// Its message.
        message: String,
    },
    /// The follower's fence holds another leader's epoch: its ring is not
    /// this leader's (a lower one: the grant races a fence change).
    #[error("node {node} is fenced by {by}")]
    Fenced {
        /// The follower.
        node: u64,
        /// The epoch its fence holds.
        by: Epoch,
    },
    /// The follower refused the records written into its ring at adoption
    /// (nothing was appended).
    #[error("node {node} refused the written records: {reason}")]
    Rejected {
        /// The follower.
        node: u64,
        /// Its reason.
        reason: String,
    },
    /// The follower's ring had no room within the wait.
    #[error("node {node}'s ring is full (head {head_lsn}, need up to {need_lsn} with the reserve)")]
    RingFull {
        /// The follower.
        node: u64,
        /// Its head.
        head_lsn: u64,
        /// Where the batch (and the follower's reserve) would end.
        need_lsn: u64,
    },
    /// The entries do not encode as records continuing the follower's log.
    #[error(transparent)]
    Records(#[from] EncodeError),
    /// An entry's payload or a message does not encode, or a message does
    /// not decode.
    #[error("encoding: {0}")]
    Codec(String),
    /// An earlier batch's answer changed what this leader knows of the
    /// follower's log (a conflict, a higher vote): a batch pipelined behind
    /// it was not sent.
    #[error("node {node}'s log changed under a pipelined batch; it was not sent")]
    Overtaken {
        /// The follower.
        node: u64,
    },
    /// The vote's term does not fit an epoch with this node's id.
    #[error("term {term} or node id {node} does not fit an epoch")]
    NoEpoch {
        /// The term.
        term: u64,
        /// This node.
        node: u64,
    },
}

impl ReplicationError {
    /// Whether openraft should take the peer as unreachable (it backs off)
    /// rather than as a failed exchange.
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ReplicationError::Unreachable { .. } | ReplicationError::RingFull { .. }
        )
    }
}
