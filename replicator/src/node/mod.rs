//! The embedding API: a [`Node`] is one member of a ringraft cluster inside
//! the application's process.
//!
//! ```no_run
//! # async fn demo(sm: impl ringraft::StateMachine) -> Result<(), ringraft::NodeError> {
//! use ringraft::{Fabric, NodeBuilder, NodeConfig, ReadConsistency};
//! let mut config = NodeConfig::new(1, "/var/lib/app/raft", "10.0.0.1:7100");
//! config.peers = [(1, "10.0.0.1:7100".into()), (2, "10.0.0.2:7100".into()), (3, "10.0.0.3:7100".into())].into();
//! let node = NodeBuilder::new(config)
//!     .fabric(Fabric::Auto { rdma_device: None })
//!     .secret(b"a cluster secret of 16+ bytes".to_vec())
//!     .state_machine(sm)
//!     .start()
//!     .await?;
//! node.initialize().await?; // on one node, once
//! let (index, answer) = node.propose(b"set x 1".to_vec()).await?;
//! let value = node.read(ReadConsistency::Linearizable, |sm| sm.snapshot().len()).await?;
//! node.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Owns the [`Node`] handle and what it holds (`Inner`); each job lives
//! in a module of its own: `config`, `error`, `start` (the builder),
//! `propose`, `links` (the links forwarded calls take), `failover` (a
//! leader the fabric finds gone is replaced at once), `read`,
//! `retention`, `membership`, `status`. It must
//! never hold the protocol logic itself: that is openraft's, the log
//! store's and the network's.

use std::sync::Arc;

use ringraft_transport::Device;

use crate::admission::Admission;
use crate::fencing::{FencedRing, NodeGuard};
use crate::log_store::LogStore;
use crate::metrics::Metrics;
use crate::network::NetCtx;
use crate::state_machine::SmStore;
use crate::types::Raft;

mod coalesce;
mod config;
mod error;
mod failover;
mod links;
mod membership;
mod propose;
mod read;
mod retention;
mod start;
mod status;

pub(crate) use failover::FailoverNews;
pub(crate) use propose::submit_here;

pub use config::{Fabric, NodeConfig, ReadConsistency};
pub use error::NodeError;
pub use propose::InFlight;
pub use read::{LogRead, LogRecord};
pub use start::NodeBuilder;
pub use status::Status;

struct Inner {
    config: NodeConfig,
    listen_addr: String,
    device: Device,
    raft: Raft,
    store: LogStore,
    admission: Admission,
    sm: SmStore,
    ring: Arc<FencedRing>,
    guard: NodeGuard,
    metrics: Arc<Metrics>,
    net_ctx: Arc<NetCtx>,
    /// Links to the leader (its id, and the link) for forwarded proposals
    /// and read indexes, each with many in flight at once
    /// ([`crate::network::Forwarder`]).
    leader_links: links::LinkPool<(u64, crate::network::Forwarder)>,
    /// A follower's read indexes from the leader, shared by the reads that
    /// wait for the same round: `[ReadIndex, lease]` ([`read`]).
    read_rounds: [coalesce::Coalesce<Result<Option<u64>, NodeError>>; 2],
    /// Held across each membership change ([`membership`]): one at a time
    /// from this node, each checked against the core's state first.
    membership_change: Arc<tokio::sync::Mutex<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The seeds of the node's scopes ([`crate::rt`]).
    seeds: Arc<crate::rt::Seeds>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A running member of a cluster. Clones share it.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl Node {
    /// This node's id.
    pub fn id(&self) -> u64 {
        self.inner.config.id
    }

    /// The address it listens on.
    pub fn listen_addr(&self) -> &str {
        &self.inner.listen_addr
    }

    /// The openraft handle (for what this API does not cover). The parts
    /// of openraft's API that spawn a task (`on_leader_change`,
    /// `on_cluster_leader_change`, `stream_append`) panic outside a seed
    /// scope ([`crate::rt`]): call them within [`Node::scoped`].
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Runs `future` in a seed scope of this node's ([`crate::rt`]): what a
    /// direct call of openraft's API that spawns a task needs.
    pub fn scoped<F: std::future::Future>(
        &self,
        future: F,
    ) -> impl std::future::Future<Output = F::Output> {
        crate::rt::scoped(self.inner.seeds.next(), future)
    }

    /// The log store.
    pub fn log_store(&self) -> &LogStore {
        &self.inner.store
    }

    /// The admission gate in front of this node's proposals.
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// Data-plane metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// How many times the ring's data rkey was rotated (term changes and
    /// grants).
    pub fn rkey_rotations(&self) -> u64 {
        self.inner.ring.rotations()
    }

    /// How many times this node raised its own fence: (with a CPU CAS,
    /// through the loopback connection).
    pub fn self_fences(&self) -> (u64, u64) {
        self.inner.guard.self_fences()
    }

    /// The fabric device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Resolves once this node's Raft core has stopped, with why: after
    /// [`Node::shutdown`], or on its own (a fatal storage error, or a panic
    /// inside openraft). A node whose core stopped proposes, reads and
    /// votes no more while its metrics stay frozen at their last values:
    /// an application should stop serving from it (`ringraft serve` exits
    /// with an error) and call [`Node::shutdown`] to flush.
    pub async fn core_stopped(&self) -> String {
        // Only the core holds the metrics' sender: the watch ends with it.
        // The server metrics (state, leader, membership), which change
        // rarely: the full metrics change several times per entry, and a
        // daemon waiting here woke that often.
        let mut metrics = self.inner.raft.server_metrics();
        while metrics.changed().await.is_ok() {}
        match self.inner.raft.with_raft_state(|_| ()).await {
            Err(fatal) => fatal.to_string(),
            Ok(()) => "openraft's metrics ended while its core still answers".into(),
        }
    }

    /// Stops Raft and the fabric side gracefully: pending IO is flushed.
    pub async fn shutdown(&self) {
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        for task in &self.inner.tasks {
            task.abort();
        }
        // Everything in the ring reaches the segments, flushed, in either
        // durability: a clean stop keeps the log through a reboot.
        if let Err(e) = self.inner.store.flush_all().await {
            tracing::warn!(error = %e, "final flush of the segments");
        }
        self.inner.ring.release();
    }
}
