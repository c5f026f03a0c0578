//! Why an exchange with a peer failed, and how openraft is told. Every
//! error of the leader's side is one of these: what a peer sent that breaks
//! the protocol is [`ReplicationError::Protocol`], never a panic.

use openraft::error::{NetworkError, RPCError, StreamingError, Unreachable};
use ringraft_transport::TransportError;
use ringraft_wal::record::EncodeError;
use ringraft_wal::{Epoch, WordLength};

use crate::types::{TypeConfig, Vote};

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
    /// A leader of a higher term exists: this one steps down.
    #[error("a higher vote {0}")]
    HigherVote(Vote),
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
    /// The vote's term does not fit an epoch with this node's id.
    #[error("term {term} or node id {node} does not fit an epoch")]
    NoEpoch {
        /// The term.
        term: u64,
        /// This node.
        node: u64,
    },
}

/// The internal name of the leader side's error.
pub(crate) type Failure = ReplicationError;

impl ReplicationError {
    /// Whether openraft should take the peer as unreachable (it backs off)
    /// rather than as a failed exchange.
    fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ReplicationError::Unreachable { .. } | ReplicationError::RingFull { .. }
        )
    }
}

pub(super) fn rpc_error(f: Failure) -> RPCError<TypeConfig> {
    if f.is_unreachable() {
        RPCError::Unreachable(Unreachable::new(&f))
    } else {
        RPCError::Network(NetworkError::new(&f))
    }
}

pub(super) fn streaming_error(f: Failure) -> StreamingError<TypeConfig> {
    StreamingError::Unreachable(Unreachable::new(&f))
}
