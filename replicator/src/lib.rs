//! # ringraft
//!
//! Raft log replication whose data plane is one-sided RDMA: openraft runs
//! the protocol; log entries reach followers as records a leader WRITEs
//! straight into their epoch-fenced WAL rings.
//!
//! Work in progress: the log store over the ring and the state machine
//! adapter come first.

pub mod log_store;
pub mod state_machine;
pub mod types;

pub use log_store::{Durability, LocalGuard, LogStore, RingGuard};
pub use state_machine::{Applied, SmStore, StateMachine};
pub use types::{Command, NodeInfo, Response, Session, TypeConfig};
