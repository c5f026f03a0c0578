//! A node's configuration: [`NodeConfig`], the [`Fabric`] it runs on and
//! the [`ReadConsistency`] a read asks for.
//!
//! Owns the plain data and its defaults; it must never open, start or
//! validate against anything outside itself (that is [`super::start`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ringraft_transport::{ConnConfig, Device};

use crate::log_store::{Durability, IoMode};
use crate::protocol::MAX_MESSAGE_BYTES;

/// Which fabric a node uses.
#[derive(Clone, Debug)]
pub enum Fabric {
    /// The software RNIC over TCP.
    Tcp,
    /// A node of an in-process fabric (tests).
    Inproc(ringraft_transport::inproc::Fabric),
    /// A real RDMA device (the first active one when `None`).
    Rdma {
        /// Device name, e.g. `rxe0`.
        device: Option<String>,
    },
    /// `rdma` when the build has it and a device is active, else `tcp`.
    Auto {
        /// Device name for rdma.
        rdma_device: Option<String>,
    },
    /// A device opened by the caller (its node id and secret must be this
    /// node's).
    Device(Device),
}

/// A node's configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id (at most 65535: it is packed into fence epochs).
    pub id: u64,
    /// The cluster's id; data directories and peers of another cluster are
    /// refused.
    pub cluster_id: u64,
    /// The control-plane and fabric address (`host:port`; any name on the
    /// inproc fabric).
    pub listen: String,
    /// The initial voters, by id and listen address (this node included),
    /// used by [`Node::initialize`](crate::Node::initialize).
    pub peers: BTreeMap<u64, String>,
    /// Where the metadata file and the snapshot live (the ring's name is
    /// kept there too).
    pub data_dir: PathBuf,
    /// The shared-memory directory the ring file lives in (default
    /// `/dev/shm`; any tmpfs mount, see `ringraft_wal::shm`): a file there
    /// survives the death of the process, not a reboot, and an RDMA device
    /// can register it on every kernel.
    pub ring_dir: PathBuf,
    /// When an entry counts as stored.
    pub durability: Durability,
    /// Ring data area capacity, bytes (power of two, >= 1 MiB).
    pub ring_capacity: u64,
    /// Largest record payload, bytes. It also bounds what a follower
    /// buffers of a two-sided entry batch: 256 entries of this size (see
    /// [`NodeConfig::inline_batch_limit`]).
    pub max_record_bytes: u64,
    /// Largest snapshot this node takes from a leader, bytes (at most
    /// [`crate::state_machine::MAX_SNAPSHOT_BYTES`], 4 GiB, the default):
    /// what a follower buffers of one snapshot transfer. A larger snapshot
    /// is refused and its connection closed.
    pub max_snapshot_bytes: u64,
    /// Lock the ring in memory.
    pub lock_memory: bool,
    /// Election timeout range, milliseconds.
    pub election_timeout_ms: (u64, u64),
    /// Heartbeat interval, milliseconds.
    pub heartbeat_ms: u64,
    /// Take a snapshot every this many entries.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind the last snapshot before openraft
    /// purges it (whole segments below the purge point are deleted).
    /// `u64::MAX` keeps the log until a trim ([`Node::trim`](crate::Node::trim), or the
    /// retention below) removes it: what a node whose log is its data
    /// (the daemon) uses.
    pub keep_after_snapshot: u64,
    /// Retention by size: the leader trims the log ([`Node::trim`](crate::Node::trim)) so that
    /// the records kept take at most this many bytes of segments.
    pub retain_bytes: Option<u64>,
    /// Retention by age: the leader trims every closed segment last
    /// written longer ago than this.
    pub retain_age: Option<Duration>,
    /// How long a proposal waits for room in a full ring before it is
    /// refused with [`NodeError::Busy`](crate::NodeError::Busy), milliseconds (below the forwarding
    /// timeout, 10 × the largest election timeout). See [`crate::admission`].
    pub admission_wait_ms: u64,
    /// Queue pair parameters of every connection.
    pub conn: ConnConfig,
    /// The seed of openraft's random draws in this node (election
    /// timeouts, see [`crate::rt`]); `None` (the default): drawn from the
    /// OS at start, so that nodes and runs differ. A seed makes a node's
    /// draws reproducible, not its run: that also takes [`IoMode::Inline`],
    /// a seeded fabric (the in-process one) and a single-threaded runtime
    /// with paused time.
    pub seed: Option<u64>,
    /// Where the storage's blocking work runs (default
    /// [`IoMode::Threads`]; [`IoMode::Inline`] for a deterministic
    /// simulation).
    pub io: IoMode,
    /// With [`IoMode::Inline`] only: how long each flush of the segments
    /// takes in the runtime's time (a simulated disk's latency, set by the
    /// simulator so that a power loss can strike while a flush is in
    /// flight). Zero (the default): a flush takes no simulated time.
    /// Ignored with [`IoMode::Threads`].
    pub simulated_flush_latency: Duration,
    /// Replace a leader at once when the fabric confirms it is gone (its
    /// connection to this node ended and nothing listens at its address
    /// any more), instead of after its lease and an election timeout
    /// (`super::failover`). Default on. Turn it off where the network
    /// between the nodes may forge TCP resets (an `iptables REJECT
    /// --reject-with tcp-reset` rule): a forged refusal would end a live
    /// leader's lease early, and lease reads assume it cannot.
    pub fast_failover: bool,
}

/// Entries in one AppendEntries (openraft's `max_payload_entries`).
pub const MAX_BATCH_ENTRIES: u64 = 256;
/// Room for an entry's log id and encoding next to its payload.
const ENTRY_FRAMING_BYTES: u64 = 64;

impl NodeConfig {
    /// How long a proposal waits for a leader to become writable, or for
    /// a leader to be known: three of the largest election timeouts (a
    /// lease and an election fit).
    pub(crate) fn lease_patience(&self) -> Duration {
        Duration::from_millis(self.election_timeout_ms.1.saturating_mul(3))
    }

    /// The most a follower buffers of one two-sided entry batch: a batch
    /// holds at most 256 entries (openraft's `max_payload_entries`) of at most
    /// `max_record_bytes` each (with their log ids and framing), and never
    /// more than [`crate::protocol::MAX_INLINE_BATCH_BYTES`].
    pub fn inline_batch_limit(&self) -> u64 {
        (MAX_BATCH_ENTRIES * (self.max_record_bytes + ENTRY_FRAMING_BYTES))
            .min(crate::protocol::MAX_INLINE_BATCH_BYTES)
    }

    /// A configuration with defaults: memory durability, 64 MiB ring in
    /// `/dev/shm`, 1 MiB records, 150..300 ms elections, 50 ms heartbeats.
    pub fn new(id: u64, data_dir: impl Into<PathBuf>, listen: impl Into<String>) -> NodeConfig {
        NodeConfig {
            id,
            cluster_id: 0x5249_4e47,
            listen: listen.into(),
            peers: BTreeMap::new(),
            data_dir: data_dir.into(),
            ring_dir: PathBuf::from(ringraft_wal::DEFAULT_RING_DIR),
            durability: Durability::Memory,
            ring_capacity: 64 << 20,
            max_record_bytes: 1 << 20,
            max_snapshot_bytes: crate::state_machine::MAX_SNAPSHOT_BYTES,
            lock_memory: true,
            election_timeout_ms: (150, 300),
            heartbeat_ms: 50,
            snapshot_every_entries: 10_000,
            keep_after_snapshot: 100,
            retain_bytes: None,
            retain_age: None,
            admission_wait_ms: 1000,
            conn: ConnConfig {
                max_message_bytes: MAX_MESSAGE_BYTES,
                ..ConnConfig::default()
            },
            seed: None,
            io: IoMode::Threads,
            simulated_flush_latency: Duration::ZERO,
            fast_failover: true,
        }
    }
}

/// How a read is made consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadConsistency {
    /// Linearizable: the leader confirms its leadership with a quorum
    /// (ReadIndex), then the read waits until this node applied that far.
    Linearizable,
    /// Linearizable under the leader's lease (no quorum round trip; assumes
    /// bounded clock drift).
    Lease,
    /// Whatever this node applied (may be stale).
    Stale,
}
