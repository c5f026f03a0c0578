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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ReadPolicy, SnapshotPolicy};
use ringraft_transport::{ConnConfig, Device, DeviceConfig, DeviceLimits, Secret};
use ringraft_wal::{RingConfig, Wal};

use crate::admission::{Admission, AdmissionError};
use crate::fencing::{FencedRing, NodeGuard};
use crate::log_store::{Durability, LogStore};
use crate::metrics::Metrics;
use crate::network::{NetCtx, NetworkFactory};
use crate::protocol::{Hello, MAX_MESSAGE_BYTES, encode};
use crate::server::{self, ServerCtx};
use crate::state_machine::{SmStore, StateMachine};
use crate::types::{Command, Control, NodeInfo, Raft, Response, Session, TypeConfig};

/// Attempts of a proposal through leader changes.
const FORWARD_ATTEMPTS: usize = 20;

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
    /// used by [`Node::initialize`].
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
    /// Largest record payload, bytes.
    pub max_record_bytes: u64,
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
    /// `u64::MAX` keeps the log until a trim ([`Node::trim`], or the
    /// retention below) removes it: what a node whose log is its data
    /// (the daemon) uses.
    pub keep_after_snapshot: u64,
    /// Retention by size: the leader trims the log ([`Node::trim`]) so that
    /// the records kept take at most this many bytes of segments.
    pub retain_bytes: Option<u64>,
    /// Retention by age: the leader trims every closed segment last
    /// written longer ago than this.
    pub retain_age: Option<Duration>,
    /// How long a proposal waits for room in a full ring before it is
    /// refused with [`NodeError::Busy`], milliseconds (below the forwarding
    /// timeout, 10 × the largest election timeout). See [`crate::admission`].
    pub admission_wait_ms: u64,
    /// Queue pair parameters of every connection.
    pub conn: ConnConfig,
}

impl NodeConfig {
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

/// Errors of the node API.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// This node is not the leader; the leader, if known.
    #[error("not the leader; leader is {leader_id:?} at {leader_addr:?}")]
    NotLeader {
        /// The leader's id.
        leader_id: Option<u64>,
        /// The leader's address.
        leader_addr: Option<String>,
    },
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
    /// applied, so it was not applied (see [`Session`]): retry it, with the
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
    /// were trimmed (retention, [`Node::trim`]), or, on a node that a
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

/// How often retention looks at the log (also after every trim).
const RETENTION_CHECK: Duration = Duration::from_secs(1);
/// How long one retention step waits for a trim.
const RETENTION_WAIT: Duration = Duration::from_secs(30);

/// Runs [`Node::keep_retention`] after every change of the first index kept
/// and every [`RETENTION_CHECK`], while the node lives.
async fn keep_retention(
    node: std::sync::Weak<Inner>,
    mut first: tokio::sync::watch::Receiver<u64>,
) {
    let mut tick = tokio::time::interval(RETENTION_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = first.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let Some(inner) = node.upgrade() else { return };
        Node { inner }.keep_retention().await;
    }
}

/// An application record, read back from the log ([`Node::read_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its log index.
    pub index: u64,
    /// The term of its entry.
    pub term: u64,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// A piece of the log ([`Node::read_log`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRead {
    /// The records applied in the range read, in index order (entries that
    /// carry none, such as blank, membership and trim entries or a
    /// session's duplicates, leave gaps).
    pub records: Vec<LogRecord>,
    /// Where the next read continues.
    pub next: u64,
    /// The last applied index when the read was made.
    pub applied: u64,
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

/// Builds and starts a [`Node`].
pub struct NodeBuilder {
    config: NodeConfig,
    fabric: Fabric,
    secret: Option<Vec<u8>>,
    state_machine: Option<Box<dyn StateMachine>>,
    hooks: Option<crate::hooks::Hooks>,
}

impl NodeBuilder {
    /// A builder; the fabric defaults to [`Fabric::Auto`].
    pub fn new(config: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            config,
            fabric: Fabric::Auto { rdma_device: None },
            secret: None,
            state_machine: None,
            hooks: None,
        }
    }

    /// Test hooks: points where a test can hold this node (see
    /// [`crate::hooks`]).
    pub fn hooks(mut self, hooks: crate::hooks::Hooks) -> NodeBuilder {
        self.hooks = Some(hooks);
        self
    }

    /// The fabric.
    pub fn fabric(mut self, fabric: Fabric) -> NodeBuilder {
        self.fabric = fabric;
        self
    }

    /// The cluster secret (at least 16 bytes), proven in every handshake.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> NodeBuilder {
        self.secret = Some(secret.into());
        self
    }

    /// The application's state machine.
    pub fn state_machine(mut self, sm: impl StateMachine) -> NodeBuilder {
        self.state_machine = Some(Box::new(sm));
        self
    }

    /// Opens the data directory, registers the ring with the fabric, starts
    /// listening and starts Raft.
    pub async fn start(self) -> Result<Node, NodeError> {
        let NodeBuilder {
            config,
            fabric,
            secret,
            state_machine,
            hooks,
        } = self;
        let secret =
            Secret::new(secret.ok_or_else(|| NodeError::Config("no cluster secret".into()))?)
                .map_err(|e| NodeError::Config(e.to_string()))?;
        let sm = state_machine.ok_or_else(|| NodeError::Config("no state machine".into()))?;
        config.conn.validate().map_err(NodeError::Config)?;
        let forward_timeout_ms = config.election_timeout_ms.1.saturating_mul(10);
        if config.admission_wait_ms >= forward_timeout_ms {
            return Err(NodeError::Config(format!(
                "admission_wait_ms {} must be below the forwarding timeout, 10 x the largest \
                 election timeout ({forward_timeout_ms} ms)",
                config.admission_wait_ms
            )));
        }
        let device_config = DeviceConfig {
            node_id: config.id,
            secret,
            limits: DeviceLimits::default(),
        };
        let device = match &fabric {
            Fabric::Tcp => Device::tcp(device_config),
            Fabric::Inproc(f) => f.device(&config.listen, device_config),
            Fabric::Rdma { device } => Device::open(
                ringraft_transport::Backend::Rdma,
                device.as_deref(),
                device_config,
            )
            .map_err(|e| NodeError::Fabric(e.to_string()))?,
            Fabric::Auto { rdma_device } => Device::auto(rdma_device.as_deref(), device_config),
            Fabric::Device(device) => device.clone(),
        };
        let ring_config = RingConfig {
            capacity: config.ring_capacity,
            max_record_bytes: config.max_record_bytes,
            cluster_id: config.cluster_id,
            node_id: config.id,
            lock_memory: config.lock_memory,
        };
        let wal = Wal::open(&config.data_dir, &config.ring_dir, &ring_config)
            .map_err(|e| NodeError::Storage(e.to_string()))?;
        let regions = wal.ring().regions();
        let capacity = wal.ring().geometry().capacity;
        let incarnation = wal.ring().header().incarnation;
        // SAFETY: the ring's mapping lives in the wal, which the store owns;
        // `FencedRing` keeps a clone of the store (below) so the mapping
        // outlives the registrations.
        let ring = Arc::new(
            unsafe { FencedRing::register(&device, regions) }
                .map_err(|e| NodeError::Fabric(e.to_string()))?,
        );
        let guard = NodeGuard::new(
            ring.clone(),
            device.clone(),
            config.id,
            config.cluster_id,
            config.listen.clone(),
            hooks.clone(),
        );
        let store = LogStore::new(wal, config.id, config.durability, Arc::new(guard.clone()));
        guard.bind(&store);
        let admission = Admission::new(
            Arc::new(store.clone()),
            capacity,
            config.max_record_bytes,
            Duration::from_millis(config.admission_wait_ms),
        )
        .map_err(NodeError::Config)?;
        ring.keep_alive(store.clone());
        // Group commit beside the Raft core: the flusher writes what the
        // ring takes to the segments, on a thread of its own.
        let freed = admission.clone();
        store
            .start_flusher(move || freed.space_freed())
            .map_err(|e| NodeError::Storage(format!("start the flusher: {e}")))?;
        let sm_store = SmStore::open(sm, Some(&config.data_dir))
            .map_err(|e| NodeError::Storage(e.to_string()))?;

        let hello = Hello {
            cluster_id: config.cluster_id,
            node_id: config.id,
            fence: ring.fence(),
            head: ring.head(),
            capacity,
            incarnation,
        };
        let hello_bytes = encode(&hello).map_err(NodeError::Config)?;
        let listener = device
            .listen(
                &config.listen,
                config.conn.clone(),
                accept_members_of(config.cluster_id, hello_bytes),
            )
            .await
            .map_err(|e| NodeError::Fabric(format!("listen on {}: {e}", config.listen)))?;
        let listen_addr = listener.local_addr();

        let raft_config = openraft::Config {
            cluster_name: format!("ringraft-{:x}", config.cluster_id),
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            heartbeat_interval: config.heartbeat_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
            max_in_snapshot_log_to_keep: config.keep_after_snapshot,
            max_payload_entries: 256,
            // A follower's log can legitimately revert: a torn tail after a
            // crash, a damaged ring truncated at recovery (DESIGN.md,
            // recovery). Safety is kept by the voting rule for logs corrupt
            // inside, not by forbidding reversion, which openraft would
            // answer with a panic of the leader.
            allow_log_reversion: Some(true),
            // A restarted leader goes through an election (a new term)
            // like any node: its ring may have lost a tail the cluster
            // committed (unsynced in `memory` mode, torn, or damaged while
            // down). Restored as leader of its old term, it would give new
            // entries the log ids its followers already hold with other
            // data, and they would keep theirs (openraft's default restores
            // leadership at startup).
            enable_leader_restore: Some(false),
            // The leader replicates entries as soon as they are in its ring,
            // while its own flusher makes them durable: its flush overlaps
            // the followers' (it still counts itself only once flushed).
            broadcast_submitted_on_append: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::Config(e.to_string()))?;
        let metrics = Arc::new(Metrics::default());
        let net_ctx = Arc::new(NetCtx {
            device: device.clone(),
            node_id: config.id,
            cluster_id: config.cluster_id,
            conn_config: config.conn.clone(),
            metrics: metrics.clone(),
            spare: Default::default(),
        });
        let net = NetworkFactory::new(net_ctx.clone());
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            net,
            store.clone(),
            sm_store.clone(),
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let server = server::spawn(
            listener,
            Arc::new(ServerCtx {
                raft: raft.clone(),
                store: store.clone(),
                ring: ring.clone(),
                hooks,
                admission: admission.clone(),
            }),
        );
        let pressure = tokio::spawn(wake_admission_on_change(raft.clone(), admission.clone()));
        let mut tasks = vec![server, pressure];
        if store.votes_blocked() {
            // DESIGN.md, recovery: a node that forgot entries inside its log
            // neither votes (the server refuses) nor stands for election until
            // a leader re-replicated past the break.
            raft.runtime_config().elect(false);
            tasks.push(tokio::spawn(reenable_elections(
                raft.clone(),
                store.clone(),
            )));
        }
        tracing::info!(
            node = config.id,
            listen = %listen_addr,
            backend = %device.backend(),
            durability = ?config.durability,
            "node started"
        );
        let inner = Arc::new_cyclic(|node| {
            tasks.push(tokio::spawn(keep_retention(
                node.clone(),
                sm_store.watch_first(),
            )));
            Inner {
                config,
                listen_addr,
                device,
                raft,
                store,
                admission,
                sm: sm_store,
                ring,
                guard,
                metrics,
                net_ctx,
                leader_link: tokio::sync::Mutex::new(None),
                tasks,
            }
        });
        Ok(Node { inner })
    }
}

/// The accept policy: initiators of this cluster get this node's [`Hello`];
/// others are refused with a reason.
fn accept_members_of(cluster_id: u64, hello: Vec<u8>) -> ringraft_transport::AcceptPolicy {
    Arc::new(move |peer| {
        let join: crate::protocol::Join = crate::protocol::decode(&peer.reveal.app_data)
            .map_err(|e| format!("node {} sent no cluster id: {e}", peer.node_id))?;
        if join.cluster_id != cluster_id {
            tracing::warn!(
                peer = peer.node_id,
                theirs = join.cluster_id,
                "refused a node of another cluster"
            );
            return Err(format!(
                "node {} belongs to cluster {:#x}, this is cluster {cluster_id:#x}",
                peer.node_id, join.cluster_id
            ));
        }
        Ok(hello.clone())
    })
}

/// Wakes the proposals waiting for ring room ([`crate::admission`]) at
/// every change openraft reports (a truncation or an installed snapshot may
/// free room). The flusher wakes them too, each time it gives ring bytes
/// back: room never waits for a snapshot, because entries leave the ring as
/// soon as they are in the segments.
async fn wake_admission_on_change(raft: Raft, admission: Admission) {
    use openraft::async_runtime::WatchReceiver;
    let mut metrics = raft.metrics();
    while metrics.changed().await.is_ok() {
        admission.space_freed();
    }
}

async fn reenable_elections(raft: Raft, store: LogStore) {
    while store.votes_blocked() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    raft.runtime_config().elect(true);
}

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
    /// A connection to the leader, for forwarded proposals and read indexes.
    leader_link: tokio::sync::Mutex<Option<(u64, crate::network::PeerNet)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
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

/// A short summary of a node's view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// This node.
    pub id: u64,
    /// Its role.
    pub state: String,
    /// The leader it knows.
    pub leader_id: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The last log index.
    pub last_log_index: Option<u64>,
    /// The committed index.
    pub commit_index: Option<u64>,
    /// The applied index.
    pub applied_index: Option<u64>,
    /// Voters.
    pub voters: BTreeSet<u64>,
    /// Learners.
    pub learners: BTreeSet<u64>,
    /// Members' addresses.
    pub members: BTreeMap<u64, String>,
}

/// Proposes `commands` on this node's Raft as one batch and waits for each
/// answer. The batch reaches the Raft core as one message
/// (`Raft::client_write_many`), so a leader gives the commands consecutive
/// log entries in this order; proposing them one by one, concurrently, let
/// them land in any order (issue 10, item 3). The one place where client
/// commands enter the log: the local write path and the leader's side of a
/// forwarded proposal (`server.rs`) both come here.
///
/// # Errors
/// [`Fatal`](openraft::error::Fatal) when Raft stopped. Each command's own
/// outcome is in the vector; on a node that does not lead, every one is
/// `ForwardToLeader`.
pub(crate) async fn propose_here(
    raft: &Raft,
    admission: &crate::admission::Admission,
    commands: Vec<Command>,
) -> Result<Vec<Result<Response, ClientWriteError<TypeConfig>>>, NodeError> {
    use futures::TryStreamExt;
    let count = commands.len();
    if count == 0 {
        return Ok(Vec::new());
    }
    // Backpressure (crate::admission): room in this node's ring first, held
    // until openraft has answered the whole batch.
    let admitted = admission.admit(&commands).await?;
    let raft = raft.clone();
    let write = async move {
        let mut answers = raft.client_write_many(commands).await?;
        let mut results = Vec::with_capacity(count);
        while let Some(result) = answers.try_next().await? {
            results.push(result.map(|written| written.response));
        }
        Ok::<_, openraft::error::Fatal<TypeConfig>>(results)
    };
    let results = admitted
        .during(write)
        .await
        .map_err(|fatal| NodeError::Stopped(fatal.to_string()))?;
    assert_eq!(
        results.len(),
        count,
        "openraft answers every command of a batch"
    );
    Ok(results)
}

/// Bytes of a forwarded command beyond its data, at most (bincode: the
/// session's tag and two varints, the data's length).
const FORWARDED_COMMAND_OVERHEAD_BYTES: usize = 32;

/// The longest prefix of `commands` (at least one) that one forwarded
/// proposal carries: at most [`MAX_FORWARDED_COMMANDS`](crate::protocol::MAX_FORWARDED_COMMANDS)
/// commands, within one control message.
fn forward_piece(commands: &[Command]) -> &[Command] {
    let mut bytes = 0usize;
    let mut count = 0;
    for command in commands
        .iter()
        .take(crate::protocol::MAX_FORWARDED_COMMANDS)
    {
        bytes = bytes.saturating_add(command.data.len() + FORWARDED_COMMAND_OVERHEAD_BYTES);
        if count > 0 && bytes > crate::protocol::MAX_PART_BYTES {
            break;
        }
        count += 1;
    }
    &commands[..count]
}

/// The answers to `commands`, or the first error: an unknown outcome, or a
/// session's seq refused as out of order.
fn settled(
    commands: &[Command],
    results: impl IntoIterator<Item = Result<Response, NodeError>>,
) -> Result<Vec<Response>, NodeError> {
    commands
        .iter()
        .zip(results)
        .map(|(command, result)| {
            let response = result?;
            match (response.out_of_order, command.session) {
                (None, _) => Ok(response),
                (Some(expected), Some(s)) => Err(NodeError::OutOfOrder {
                    client_id: s.client_id,
                    seq: s.seq,
                    expected,
                }),
                (Some(_), None) => Err(NodeError::Unknown(format!(
                    "an out-of-order answer to a command without a session: {response}"
                ))),
            }
        })
        .collect()
}

/// Maps a membership or write error; a follower's ForwardToLeader becomes
/// [`NodeError::NotLeader`].
fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> NodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NotLeader {
            leader_id: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        },
        other => raft_error(other),
    }
}

fn raft_error<E: std::fmt::Display + std::fmt::Debug>(e: RaftError<TypeConfig, E>) -> NodeError {
    match e {
        RaftError::Fatal(f) => NodeError::Stopped(f.to_string()),
        RaftError::APIError(e) => NodeError::Raft(e.to_string()),
    }
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

    /// The openraft handle (for what this API does not cover).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
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

    /// Initializes the cluster with the configured peers as voters. Harmless
    /// when the cluster is already initialized (here or elsewhere).
    pub async fn initialize(&self) -> Result<(), NodeError> {
        let members: BTreeMap<u64, NodeInfo> = self
            .inner
            .config
            .peers
            .iter()
            .map(|(id, addr)| (*id, NodeInfo { addr: addr.clone() }))
            .collect();
        if members.is_empty() {
            return Err(NodeError::Config("no peers to initialize with".into()));
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(raft_error(e)),
        }
    }

    /// Appends `data`, waits until it is committed and applied, and returns
    /// its index and the state machine's answer. Concurrent proposals are
    /// batched by openraft. On a follower the proposal is forwarded to the
    /// leader; [`NodeError::NotLeader`] only when no leader can be reached.
    /// A full ring makes it wait for room ([`crate::admission`]); after
    /// [`NodeConfig::admission_wait_ms`] it fails with [`NodeError::Busy`]
    /// (nothing was proposed: retry).
    pub async fn propose(&self, data: Vec<u8>) -> Result<(u64, Vec<u8>), NodeError> {
        let r = self.propose_batch(None, vec![data]).await?;
        let r = r.into_iter().next().expect("one answer per record");
        Ok((r.index, r.data))
    }

    /// Appends `data` in a client session: a retry with the same session is
    /// answered with the original result instead of being applied again, and
    /// a seq whose predecessor is not applied yet is refused with
    /// [`NodeError::OutOfOrder`] (see [`Session`]).
    pub async fn propose_in_session(
        &self,
        session: Session,
        data: Vec<u8>,
    ) -> Result<Response, NodeError> {
        let r = self.propose_batch(Some(session), vec![data]).await?;
        Ok(r.into_iter().next().expect("one answer per record"))
    }

    /// Appends `records` as one batch, waits until all are committed and
    /// applied, and returns one answer per record, in order. The batch
    /// reaches the Raft core as one message, so the records get consecutive
    /// log indexes in this order (a batch forwarded by a follower travels in
    /// pieces of at most [`MAX_FORWARDED_COMMANDS`](crate::protocol::MAX_FORWARDED_COMMANDS)
    /// records and about one control message of bytes, each committed
    /// before the next is sent: indexes then increase from piece to piece).
    /// With `session`, record `k` carries seq `session.seq + k`: retries are
    /// answered from the session table, and the records are applied only
    /// in seq order after the session's earlier seqs.
    ///
    /// # Errors
    /// [`NodeError::OutOfOrder`] when the session's earlier seqs were not
    /// applied yet (records before the refused one may have been applied:
    /// retry the whole batch with the same seqs); [`NodeError::Unknown`] when
    /// the outcome is unknown (retry with the same session);
    /// [`NodeError::NotLeader`] when no leader can be reached;
    /// [`NodeError::Config`] for a seq below [`FIRST_SEQ`](crate::types::FIRST_SEQ)
    /// or one that overflows.
    pub async fn propose_batch(
        &self,
        session: Option<Session>,
        records: Vec<Vec<u8>>,
    ) -> Result<Vec<Response>, NodeError> {
        let _in_flight = self.inner.metrics.proposals_in_flight.track();
        if let Some(s) = session
            && (s.seq < crate::types::FIRST_SEQ
                || s.seq.checked_add(records.len() as u64).is_none())
        {
            return Err(NodeError::Config(format!(
                "session seqs run from {} to u64::MAX; {} records from seq {} do not fit",
                crate::types::FIRST_SEQ,
                records.len(),
                s.seq
            )));
        }
        let commands: Vec<Command> = records
            .into_iter()
            .zip(0u64..)
            .map(|(data, k)| Command {
                session: session.map(|s| Session {
                    client_id: s.client_id,
                    seq: s.seq + k,
                }),
                data,
                control: None,
            })
            .collect();
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let count = commands.len() as u64;
        let responses = self.write_anywhere(commands).await?;
        self.inner.metrics.commit_latency.observe(started.elapsed());
        self.inner.metrics.proposals.inc_by(count);
        Ok(responses)
    }

    /// Proposes `commands` here when this node leads, else forwards them to
    /// the leader over the control plane (following leader changes a few
    /// times); answers in the commands' order.
    async fn write_anywhere(&self, commands: Vec<Command>) -> Result<Vec<Response>, NodeError> {
        let mut answered: Vec<Response> = Vec::with_capacity(commands.len());
        let mut last_error = None;
        for _attempt in 0..FORWARD_ATTEMPTS {
            let rest = &commands[answered.len()..];
            let results =
                propose_here(&self.inner.raft, &self.inner.admission, rest.to_vec()).await?;
            let forward = match results.first() {
                Some(Err(ClientWriteError::ForwardToLeader(f))) => f.clone(),
                _ => {
                    let results = results
                        .into_iter()
                        .map(|r| r.map_err(|e| NodeError::Unknown(e.to_string())));
                    answered.extend(settled(rest, results)?);
                    return Ok(answered);
                }
            };
            let Some(leader) = forward.leader_id.filter(|l| *l != self.id()) else {
                // No leader yet (or one just elected here): wait a bit.
                last_error = Some(NodeError::NotLeader {
                    leader_id: forward.leader_id,
                    leader_addr: forward.leader_node.map(|n| n.addr),
                });
                tokio::time::sleep(Duration::from_millis(self.inner.config.heartbeat_ms)).await;
                continue;
            };
            // Forward the rest in pieces that fit a control message, one
            // after the other: each is applied before the next is sent, so
            // the order holds.
            while answered.len() < commands.len() {
                let piece = forward_piece(&commands[answered.len()..]);
                let request = crate::protocol::Request::Propose(piece.to_vec());
                match self.leader_call(leader, request).await? {
                    crate::protocol::Reply::Proposed(answers) if answers.len() == piece.len() => {
                        let results = answers.into_iter().map(|a| a.map_err(NodeError::Unknown));
                        answered.extend(settled(piece, results)?);
                    }
                    crate::protocol::Reply::NotLeader(_) => {
                        last_error = Some(NodeError::NotLeader {
                            leader_id: Some(leader),
                            leader_addr: None,
                        });
                        tokio::time::sleep(Duration::from_millis(self.inner.config.heartbeat_ms))
                            .await;
                        break;
                    }
                    other => {
                        return Err(NodeError::Unknown(format!("unexpected answer {other:?}")));
                    }
                }
            }
            if answered.len() == commands.len() {
                return Ok(answered);
            }
        }
        Err(last_error.unwrap_or(NodeError::NotLeader {
            leader_id: None,
            leader_addr: None,
        }))
    }

    /// One request to the leader `leader` over the control plane.
    async fn leader_call(
        &self,
        leader: u64,
        request: crate::protocol::Request,
    ) -> Result<crate::protocol::Reply, NodeError> {
        let addr = self
            .status()
            .members
            .get(&leader)
            .cloned()
            .ok_or(NodeError::NotLeader {
                leader_id: Some(leader),
                leader_addr: None,
            })?;
        let mut link = self.inner.leader_link.lock().await;
        if link.as_ref().is_none_or(|(id, _)| *id != leader) {
            *link = Some((
                leader,
                crate::network::PeerNet::new(self.inner.net_ctx.clone(), leader, addr),
            ));
        }
        let (_, net) = link.as_mut().expect("just set");
        let ttl = Duration::from_millis(self.inner.config.election_timeout_ms.1 * 10);
        net.call(&request, ttl)
            .await
            .map_err(|f| NodeError::Unknown(format!("forwarding to the leader {leader}: {f}")))
    }

    /// Reads the state machine with the given consistency. On a follower, a
    /// linearizable or lease read asks the leader for its read index (the
    /// leader confirms its leadership first), waits until this node applied
    /// that far, then reads locally.
    pub async fn read<T>(
        &self,
        consistency: ReadConsistency,
        f: impl FnOnce(&dyn StateMachine) -> T,
    ) -> Result<T, NodeError> {
        let policy = match consistency {
            ReadConsistency::Stale => None,
            ReadConsistency::Linearizable => Some(ReadPolicy::ReadIndex),
            ReadConsistency::Lease => Some(ReadPolicy::LeaseRead),
        };
        if let Some(policy) = policy {
            match self.inner.raft.ensure_linearizable(policy.clone()).await {
                Ok(_) => {}
                Err(RaftError::APIError(
                    openraft::error::LinearizableReadError::ForwardToLeader(fwd),
                )) => {
                    // A follower: the leader confirms its leadership and
                    // gives its read index; the read is served here once
                    // this node applied that far.
                    let leader =
                        fwd.leader_id
                            .filter(|l| *l != self.id())
                            .ok_or(NodeError::NotLeader {
                                leader_id: fwd.leader_id,
                                leader_addr: None,
                            })?;
                    let lease = policy == ReadPolicy::LeaseRead;
                    match self
                        .leader_call(leader, crate::protocol::Request::ReadIndex { lease })
                        .await?
                    {
                        crate::protocol::Reply::ReadIndex(index) => {
                            let timeout =
                                Duration::from_millis(self.inner.config.election_timeout_ms.1 * 10);
                            self.wait_applied(index, timeout).await?;
                        }
                        crate::protocol::Reply::NotLeader(l) => {
                            return Err(NodeError::NotLeader {
                                leader_id: l,
                                leader_addr: None,
                            });
                        }
                        other => {
                            return Err(NodeError::Raft(format!("unexpected answer {other:?}")));
                        }
                    }
                }
                Err(other) => return Err(raft_error(other)),
            }
        }
        Ok(self.inner.sm.read(f).await)
    }

    /// Waits until this node applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), NodeError> {
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .map(|_| ())
            .map_err(|e| NodeError::Timeout(e.to_string()))
    }

    /// Reads the application records in `from..=to` (cut to what this node
    /// applied), stopping once `max_bytes` of records were read (at least
    /// one entry is read when the range is not empty). The records come
    /// from the log itself (ring and segments): the state machine keeps
    /// none. A read at a consistency above stale first calls
    /// [`Node::read`].
    ///
    /// # Errors
    /// [`NodeError::Trimmed`] when `from` is below the first index this
    /// node holds; [`NodeError::Storage`] when the log cannot be read.
    pub async fn read_log(&self, from: u64, to: u64, max_bytes: u64) -> Result<LogRead, NodeError> {
        let (first, applied, _) = self.inner.sm.read_view(1, 0).await;
        let to = to.min(applied);
        let held = first.max(self.inner.store.first_index());
        if from < held {
            return Err(NodeError::Trimmed {
                index: from,
                first: held,
            });
        }
        if from > to {
            return Ok(LogRead {
                records: Vec::new(),
                next: from,
                applied,
            });
        }
        let entries = match self
            .inner
            .store
            .read_entries_within(from, to + 1, max_bytes)
        {
            Ok(entries) if entries.first().is_some_and(|e| e.log_id.index == from) => entries,
            // Purged since the check above.
            Ok(_) => {
                return Err(NodeError::Trimmed {
                    index: from,
                    first: self.inner.store.first_index(),
                });
            }
            Err(e) => {
                let first = self.inner.store.first_index();
                if from < first {
                    return Err(NodeError::Trimmed { index: from, first });
                }
                return Err(NodeError::Storage(format!("read {from}..={to}: {e}")));
            }
        };
        let last = entries.last().expect("non-empty").log_id.index;
        let (first, _, skipped) = self.inner.sm.read_view(from, last).await;
        if from < first {
            return Err(NodeError::Trimmed { index: from, first });
        }
        let records = entries
            .into_iter()
            .filter_map(|e| match e.payload {
                openraft::EntryPayload::Normal(Command {
                    data,
                    control: None,
                    ..
                }) if !skipped.contains(&e.log_id.index) => Some(LogRecord {
                    index: e.log_id.index,
                    term: crate::types::term_of(&e.log_id),
                    data,
                }),
                _ => None,
            })
            .collect();
        Ok(LogRead {
            records,
            next: last + 1,
            applied,
        })
    }

    /// A watch of the last applied index.
    pub fn watch_applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.sm.watch_applied()
    }

    /// A watch of the first index kept (0 while nothing was trimmed).
    pub fn watch_first_index(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.sm.watch_first()
    }

    /// Trims the log: the records below `before` are gone on every node,
    /// from the index of the trim's own entry on (a trim is a log entry;
    /// `before` is cut to that index, and a trim never moves the first
    /// index back). The storage is given back once a snapshot covers it.
    /// Returns the first index kept.
    pub async fn trim(&self, before: u64) -> Result<u64, NodeError> {
        let command = Command {
            session: None,
            data: Vec::new(),
            control: Some(Control::Trim { before }),
        };
        let answer = self
            .write_anywhere(vec![command])
            .await?
            .pop()
            .expect("one answer per command");
        let first: [u8; 8] = answer.data.as_slice().try_into().map_err(|_| {
            NodeError::Unknown(format!(
                "a trim was answered with {} bytes",
                answer.data.len()
            ))
        })?;
        Ok(u64::from_le_bytes(first))
    }

    /// One round of retention: gives back the storage of trimmed entries
    /// (a snapshot, then openraft's purge), and, on the leader, trims what
    /// [`NodeConfig::retain_bytes`] and [`NodeConfig::retain_age`] let go.
    async fn keep_retention(&self) {
        use openraft::async_runtime::WatchReceiver;
        let raft = &self.inner.raft;
        let first = *self.inner.sm.watch_first().borrow();
        if first > 1 {
            let m = raft.metrics().borrow_watched().clone();
            if let Some(upto) = self.purge_point(first, &m)
                && m.purged.is_none_or(|p| p.index < upto)
            {
                // openraft purges only what a snapshot covers: take one
                // first (purged at a later round; no waiting here, so that
                // trims go on meanwhile).
                if m.snapshot.is_none_or(|s| s.index < upto) {
                    let _ = raft.trigger().snapshot().await;
                } else {
                    let _ = raft.trigger().purge_log(upto).await;
                }
            }
        }
        let config = &self.inner.config;
        if config.retain_bytes.is_none() && config.retain_age.is_none() {
            return;
        }
        let m = raft.metrics().borrow_watched().clone();
        if m.current_leader != Some(config.id) {
            return;
        }
        let applied = m.last_applied.map_or(0, |l| l.index);
        let written_before = config
            .retain_age
            .and_then(|age| std::time::SystemTime::now().checked_sub(age));
        let point = self
            .inner
            .store
            .segments()
            .retention_point(config.retain_bytes, written_before)
            .min(applied + 1);
        if point > first.max(1) {
            match tokio::time::timeout(RETENTION_WAIT, self.trim(point)).await {
                Ok(Ok(kept)) => {
                    tracing::info!(node = config.id, first = kept, "retention trimmed the log")
                }
                Ok(Err(e)) => {
                    tracing::warn!(node = config.id, error = %e, "retention: trim failed")
                }
                Err(_) => tracing::warn!(node = config.id, "retention: trim timed out"),
            }
        }
    }

    /// How far openraft may purge below the first index kept, `first`.
    /// Followers purge up to it. A leader keeps the entries a lagging
    /// follower still needs, so that it catches up from the segments rather
    /// than by a snapshot (which carries the trim, not the records between
    /// the trim and the snapshot): as long as the bytes kept for it stay
    /// within those of the retained log, i.e. the data directory within
    /// twice the retention.
    /// `None`: nothing may be purged yet.
    fn purge_point(&self, first: u64, m: &openraft::RaftMetrics<TypeConfig>) -> Option<u64> {
        let upto = Some(first - 1);
        let Some(replication) = &m.replication else {
            return upto;
        };
        let lowest_next = replication
            .iter()
            .filter(|(id, _)| **id != self.inner.config.id)
            .map(|(_, matched)| matched.map_or(0, |l| l.index + 1))
            .min()
            .unwrap_or(first);
        if lowest_next >= first {
            return upto;
        }
        let segments = self.inner.store.segments();
        match (segments.bytes_from(lowest_next), segments.bytes_from(first)) {
            (Some(needed), Some(kept)) if needed - kept <= kept => lowest_next.checked_sub(1),
            _ => upto,
        }
    }

    /// Adds a learner (a non-voting member that receives the log).
    pub async fn add_learner(&self, id: u64, addr: String) -> Result<(), NodeError> {
        self.inner
            .raft
            .add_learner(id, NodeInfo { addr }, true)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Makes learners `ids` voters.
    pub async fn promote(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        self.inner
            .raft
            .change_membership(ChangeMembers::AddVoterIds(ids), false)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Removes members `ids` (voters are demoted and removed).
    pub async fn remove(&self, ids: BTreeSet<u64>) -> Result<(), NodeError> {
        self.inner
            .raft
            .change_membership(ChangeMembers::RemoveVoters(ids.clone()), false)
            .await
            .map_err(write_error)?;
        self.inner
            .raft
            .change_membership(ChangeMembers::RemoveNodes(ids), false)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Asks the leader to hand leadership to `to`.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), NodeError> {
        self.inner
            .raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| NodeError::Stopped(e.to_string()))
    }

    /// openraft's metrics, as a watch (`changed().await`, `borrow_watched()`
    /// through [`openraft::async_runtime::WatchReceiver`]).
    pub fn watch(
        &self,
    ) -> openraft::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>> {
        self.inner.raft.metrics()
    }

    /// On the leader: how many entries each follower is behind its last log
    /// entry (empty elsewhere).
    pub fn replication_lag(&self) -> BTreeMap<u64, u64> {
        use openraft::async_runtime::WatchReceiver;
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let (Some(replication), Some(last)) = (m.replication.as_ref(), m.last_log_index) else {
            return BTreeMap::new();
        };
        replication
            .iter()
            .map(|(id, matched)| {
                let next = matched.as_ref().map_or(0, |l| l.index + 1);
                (*id, (last + 1).saturating_sub(next))
            })
            .collect()
    }

    /// This node's current view.
    pub fn status(&self) -> Status {
        use openraft::async_runtime::WatchReceiver;
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        Status {
            id: m.id,
            state: format!("{:?}", m.state),
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            commit_index: m.cluster_committed.map(|c| c.index),
            applied_index: m.last_applied.map(|a| a.index),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            members: membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
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
