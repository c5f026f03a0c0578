//! Why an exchange with a peer failed, and how openraft is told.

use openraft::error::{NetworkError, RPCError, StreamingError, Unreachable};

use crate::types::{TypeConfig, Vote};

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Could not reach the peer (connect, handshake).
    Unreachable(String),
    /// The connection broke or the peer answered nonsense.
    Network(String),
    /// The follower's fence holds a higher term: step down.
    HigherVote(Vote),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(s) => write!(f, "unreachable: {s}"),
            Failure::Network(s) => write!(f, "network: {s}"),
            Failure::HigherVote(v) => write!(f, "higher vote {v}"),
        }
    }
}

#[derive(Debug)]
struct Message(String);
impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Message {}

pub(super) fn rpc_error(f: Failure) -> RPCError<TypeConfig> {
    match f {
        Failure::Unreachable(s) => RPCError::Unreachable(Unreachable::new(&Message(s))),
        other => RPCError::Network(NetworkError::new(&Message(other.to_string()))),
    }
}

pub(super) fn streaming_error(f: Failure) -> StreamingError<TypeConfig> {
    match f {
        Failure::Unreachable(s) => StreamingError::Unreachable(Unreachable::new(&Message(s))),
        other => StreamingError::Unreachable(Unreachable::new(&Message(other.to_string()))),
    }
}
