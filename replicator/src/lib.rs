//! # ringraft
//!
//! Raft log replication whose data plane is one-sided RDMA. openraft runs
//! the protocol over two-sided messages; log entries reach followers as
//! records the leader WRITEs straight into their epoch-fenced WAL rings
//! (`ringraft-wal`), over any `ringraft-transport` fabric.
//!
//! - [`types`]: the openraft type configuration, commands and responses;
//! - [`admission`]: backpressure: proposals wait for room in the ring before
//!   they reach openraft;
//! - [`log_store`]: openraft's log storage over the ring (local appends,
//!   adoption in place, durability modes, revocation on term change);
//! - [`flusher`]: group commit beside the Raft core: the ring's records
//!   into the segment log, one write and one flush per round;
//! - [`state_machine`]: the application's [`StateMachine`] with client
//!   sessions and durable snapshots;
//! - [`protocol`]: the control plane's messages;
//! - [`network`]: the leader side (fence CAS, grants, one-sided appends,
//!   pipelining, snapshots);
//! - [`server`]: the follower side (adoption checks, votes, snapshots);
//! - [`fencing`]: registrations, revocation and the node's own fence;
//! - [`hooks`]: points where a test holds a node to script an interleaving;
//! - [`rt`]: the runtime openraft runs on, with seeded randomness;
//! - [`watch`]: a watch channel that wakes its waiters in order;
//! - [`node`]: the embedding API ([`NodeBuilder`], [`Node`]).
//!
//! # Determinism
//!
//! A node configured with a seed ([`NodeConfig::seed`]) and
//! [`IoMode::Inline`] (no thread of its own, nothing on `spawn_blocking`),
//! on the in-process fabric (whose delays, rkeys and nonces follow the
//! fabric's seed), on a single-threaded tokio runtime with paused time, runs
//! as a function of those seeds: the same seeds replay the same run. The
//! defaults (no seed, [`IoMode::Threads`]) are production's.

pub mod admission;
pub mod fencing;
pub mod flusher;
pub mod hooks;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod node;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod protocol;
pub mod replication;
pub mod rt;
pub mod server;
pub mod state_machine;
pub mod types;
pub mod watch;

pub use log_store::{Durability, IoMode, LocalGuard, LogStore, RingGuard, WeakLogStore};
pub use network::ReplicationError;
pub use node::{
    Fabric, InFlight, LogRead, LogRecord, Node, NodeBuilder, NodeConfig, NodeError,
    ReadConsistency, Status,
};
pub use state_machine::{Applied, SmStore, StateMachine};
pub use types::{Command, Control, NodeInfo, Response, Session, TypeConfig};
