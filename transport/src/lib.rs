//! # ringraft-transport
//!
//! One async API shaped like reliable-connected (RC) verbs, over three
//! backends:
//! - `rdma` (cargo feature `rdma`): real RDMA through a safe wrapper over
//!   rdma-sys (RNICs and Soft-RoCE);
//! - [`tcp`]: a software RNIC over TCP, for hosts without RDMA;
//! - [`inproc`]: an in-process fabric with seeded fault injection, for
//!   tests.
//!
//! Every backend keeps the verbs semantics the replicator relies on:
//! registrations with access flags and rkeys (rotating an rkey revokes the
//! old one), one-sided WRITE / READ / compare-and-swap / fetch-and-add that
//! run none of the target's application code, two-sided SEND/RECV with
//! posted receives (receiver-not-ready when none is posted), RC ordering (a
//! WRITE lands before the SEND posted after it is delivered), queue pair
//! access flags (`set_remote_access`), and the verbs' errors: remote access
//! error, remote invalid request, RNR retries exceeded, transport retries
//! exceeded, and the error state in which every posted request is flushed.
//! A connection in error is never reused: reconnect.
//!
//! Connections start with a handshake in which both sides prove the cluster
//! secret (HMAC-SHA256 challenge/response) before anything that addresses
//! memory is revealed ([`handshake`]).
//!
//! This crate knows nothing of Raft or of the ring format.

#![warn(missing_docs)]

mod api;
mod bootstrap;
pub mod bounded;
mod entropy;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
pub mod handshake;
pub mod inproc;
mod limits;
mod soft;
pub mod source;
pub mod tcp;
pub mod throttle;
pub mod types;
mod work;

pub mod conformance;
#[cfg(feature = "rdma")]
pub mod rdma;

pub use api::{
    AcceptPolicy, Buffer, Chained, Completion, Connection, Device, DeviceConfig, Listener,
    MemoryRegion, Probe, reveal_to_all,
};
pub use error::{Result, TransportError, WcError};
pub use handshake::{PeerInfo, Secret};
pub use source::Source;
pub use throttle::Throttle;
pub use types::{
    Access, AtomicCapability, Backend, ConnConfig, DeviceLimits, Received, RemoteAddr, RemoteRegion,
};

/// Logging for the crate's tools (its binaries, feature `tools`): the
/// `RUST_LOG` filter, else `warn`, to stderr (stdout carries their results).
#[cfg(feature = "tools")]
pub fn init_tool_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
