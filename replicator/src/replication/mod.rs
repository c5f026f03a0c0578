//! The replication protocol's decisions, as state machines without I/O
//! (sans-IO, after quinn-proto): no tokio, no transport connection, no
//! clock inside. Events come in with the time they happen at; operations
//! come out for the glue to perform on a connection.
//!
//! - [`link`]: the leader's side of one follower ([`Link`]): the fence
//!   (READ, CAS, grant), the view of the follower's ring, one-sided and
//!   two-sided batches, flow control, pipelining, matching replies to
//!   requests;
//! - [`acceptor`]: the follower's side of one connection ([`Acceptor`]):
//!   which requests of which peer it takes, the fence and vote checks,
//!   reassembling split payloads, under limits;
//! - `checks`: what a peer sends, checked before any use (pure);
//! - [`error`]: why an exchange failed ([`ReplicationError`]).
//!
//! The glue lives in `network/` (the leader's side, openraft's
//! `RaftNetworkV2`) and `server.rs` (the acceptor's side); the simulator
//! (`ringraft-sim`) drives the same glue over a simulated fabric.

pub mod acceptor;
pub(crate) mod checks;
pub mod error;
pub mod link;
#[cfg(test)]
mod tests;

use openraft::raft::AppendEntriesRequest;

pub use acceptor::Acceptor;
pub use error::ReplicationError;
pub use link::{Answer, Completion, Link, LinkConfig, LinkEvent, Op, OpId, Ticket};

use crate::types::TypeConfig;

/// openraft's AppendEntries.
pub type AppendRequest = AppendEntriesRequest<TypeConfig>;
