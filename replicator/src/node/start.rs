//! Starting a node: [`NodeBuilder`] and the steps of [`NodeBuilder::start`]
//! (check the configuration, open the fabric device, open the storage,
//! listen, start Raft and the node's background tasks).
//!
//! Everything from opening the storage on runs in the node's seed scope
//! ([`crate::rt`]): openraft's tasks (started by `Raft::new`) take their
//! seeds from it, and the node's own tasks are spawned with seeds of the
//! node's [`Seeds`].
//!
//! Owns the order in which a node's parts are made and wired together; it
//! must never run protocol logic itself, nor start Raft before the ring is
//! registered and the flusher runs, nor outside the node's seed scope.

use std::sync::Arc;
use std::time::Duration;

use openraft::SnapshotPolicy;
use ringraft_transport::{Device, DeviceConfig, DeviceLimits, Secret};
use ringraft_wal::{RingConfig, Wal};

use super::retention::keep_retention;
use super::{Fabric, Inner, Node, NodeConfig, NodeError};
use crate::admission::Admission;
use crate::fencing::{FencedRing, NodeGuard};
use crate::log_store::LogStore;
use crate::metrics::Metrics;
use crate::network::{NetCtx, NetworkFactory};
use crate::protocol::{Hello, encode};
use crate::replication::acceptor::AcceptorLimits;
use crate::rt::{self, Seeds};
use crate::server::{self, ServerCtx};
use crate::state_machine::{SmStore, StateMachine};
use crate::types::Raft;

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
    /// listening and starts Raft, in the node's seed scope
    /// ([`NodeConfig::seed`], else one drawn from the OS).
    pub async fn start(self) -> Result<Node, NodeError> {
        let seeds = Arc::new(match self.config.seed {
            Some(seed) => Seeds::new(seed),
            None => Seeds::from_entropy(),
        });
        rt::scoped(seeds.next(), self.start_in_scope(seeds)).await
    }

    async fn start_in_scope(self, seeds: Arc<Seeds>) -> Result<Node, NodeError> {
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
        check_config(&config)?;
        let device = open_device(&config, &fabric, secret)?;
        let storage = open_storage(&config, &device, hooks.clone())?;
        let sm_store = SmStore::open(sm, Some(&config.data_dir))
            .map_err(|e| NodeError::Storage(e.to_string()))?;
        let listener = listen(&config, &device, &storage).await?;
        let listen_addr = listener.local_addr();
        let raft_config = raft_config(&config)?;
        let metrics = Arc::new(Metrics::default());
        let net_ctx = Arc::new(NetCtx {
            device: device.clone(),
            node_id: config.id,
            cluster_id: config.cluster_id,
            conn_config: config.conn.clone(),
            metrics: metrics.clone(),
            log: storage.store.downgrade(),
            spare: Default::default(),
        });
        let net = NetworkFactory::new(net_ctx.clone());
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            net,
            storage.store.clone(),
            sm_store.clone(),
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let (failover, lost_rx, behind) = super::failover::failover_news();
        let server_ctx = ServerCtx {
            raft: raft.clone(),
            store: storage.store.clone(),
            ring: storage.ring.clone(),
            hooks,
            admission: storage.admission.clone(),
            seeds: seeds.clone(),
            next_connection: std::sync::atomic::AtomicU64::new(1),
            failover,
            metrics: metrics.clone(),
            limits: AcceptorLimits {
                inline_batch_bytes: config.inline_batch_limit(),
                snapshot_bytes: config.max_snapshot_bytes,
            },
        };
        let mut tasks = spawn_tasks(listener, server_ctx, &raft, &storage, &seeds);
        if config.fast_failover {
            let watcher = super::failover::Watcher {
                id: config.id,
                raft: raft.clone(),
                device: device.clone(),
                store: storage.store.clone(),
                metrics: metrics.clone(),
                turn: Duration::from_millis(config.heartbeat_ms),
                probe_timeout: Duration::from_millis(config.election_timeout_ms.0),
                behind,
            };
            tasks.push(rt::spawn(&seeds, watcher.run(lost_rx)));
        }
        tracing::info!(
            node = config.id,
            listen = %listen_addr,
            backend = %device.backend(),
            durability = ?config.durability,
            "node started"
        );
        let Storage {
            store,
            ring,
            guard,
            admission,
            ..
        } = storage;
        let forward_links = super::links::forward_links(device.backend(), &net_ctx.conn_config);
        let inner = Arc::new_cyclic(|node| {
            tasks.push(rt::spawn(
                &seeds,
                keep_retention(node.clone(), sm_store.watch_first()),
            ));
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
                leader_links: super::links::LinkPool::new(forward_links),
                read_rounds: [
                    super::coalesce::Coalesce::new(),
                    super::coalesce::Coalesce::new(),
                ],
                membership_change: Arc::new(tokio::sync::Mutex::new(())),
                tasks,
                seeds: seeds.clone(),
            }
        });
        Ok(Node { inner })
    }
}

/// What [`open_storage`] opened: the log store over the ring registered
/// with the fabric, its guard and the admission gate in front of it.
struct Storage {
    store: LogStore,
    ring: Arc<FencedRing>,
    guard: NodeGuard,
    admission: Admission,
    /// The ring's capacity in bytes.
    capacity: u64,
    /// The ring's incarnation.
    incarnation: u64,
}

/// Refuses configurations that cannot work, before anything is opened.
fn check_config(config: &NodeConfig) -> Result<(), NodeError> {
    config.conn.validate().map_err(NodeError::Config)?;
    let forward_timeout_ms = config.election_timeout_ms.1.saturating_mul(10);
    if config.admission_wait_ms >= forward_timeout_ms {
        return Err(NodeError::Config(format!(
            "admission_wait_ms {} must be below the forwarding timeout, 10 x the largest \
             election timeout ({forward_timeout_ms} ms)",
            config.admission_wait_ms
        )));
    }
    let max_snapshot = crate::state_machine::MAX_SNAPSHOT_BYTES;
    if config.max_snapshot_bytes == 0 || config.max_snapshot_bytes > max_snapshot {
        return Err(NodeError::Config(format!(
            "max_snapshot_bytes {} is not in 1..={max_snapshot}",
            config.max_snapshot_bytes
        )));
    }
    Ok(())
}

/// Opens the fabric device `fabric` names, with this node's id.
fn open_device(config: &NodeConfig, fabric: &Fabric, secret: Secret) -> Result<Device, NodeError> {
    let device_config = DeviceConfig {
        node_id: config.id,
        secret,
        limits: DeviceLimits::default(),
    };
    Ok(match fabric {
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
    })
}

/// Opens the WAL, registers its ring with `device`, and builds the log
/// store, its guard and the admission gate; starts the flusher.
fn open_storage(
    config: &NodeConfig,
    device: &Device,
    hooks: Option<crate::hooks::Hooks>,
) -> Result<Storage, NodeError> {
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
        unsafe { FencedRing::register(device, regions) }
            .map_err(|e| NodeError::Fabric(e.to_string()))?,
    );
    let guard = NodeGuard::new(
        ring.clone(),
        device.clone(),
        config.id,
        config.cluster_id,
        config.listen.clone(),
        hooks,
    );
    let store = LogStore::with_io(
        wal,
        config.id,
        config.durability,
        config.io,
        Arc::new(guard.clone()),
    );
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
    // ring takes to the segments, on a thread of its own or as a task
    // (`config.io`).
    // A weak callback: the flusher must not keep the store alive through
    // the admission, which holds the store.
    store
        .start_flusher_with(
            admission.space_freed_callback(),
            config.simulated_flush_latency,
        )
        .map_err(|e| NodeError::Storage(format!("start the flusher: {e}")))?;
    Ok(Storage {
        store,
        ring,
        guard,
        admission,
        capacity,
        incarnation,
    })
}

/// Listens on the configured address; initiators of this cluster are
/// answered with this node's [`Hello`].
async fn listen(
    config: &NodeConfig,
    device: &Device,
    storage: &Storage,
) -> Result<ringraft_transport::Listener, NodeError> {
    let hello = Hello {
        cluster_id: config.cluster_id,
        node_id: config.id,
        fence: storage.ring.fence(),
        head: storage.ring.head(),
        capacity: storage.capacity,
        incarnation: storage.incarnation,
    };
    let hello_bytes = encode(&hello).map_err(NodeError::Config)?;
    // The peers' hosts are members' sources from the start: their
    // reconnects get past a flood of strangers on our port.
    if device.backend() != ringraft_transport::Backend::Inproc {
        device.member_sources(peer_hosts(config).await);
    }
    device
        .listen(
            &config.listen,
            config.conn.clone(),
            accept_members_of(config.cluster_id, hello_bytes),
        )
        .await
        .map_err(|e| NodeError::Fabric(format!("listen on {}: {e}", config.listen)))
}

/// The addresses of the configured peers' hosts (other than this node),
/// as far as they resolve within [`PEER_LOOKUP`]; one that does not is
/// left to be learnt when it proves the secret.
async fn peer_hosts(config: &NodeConfig) -> Vec<std::net::IpAddr> {
    let mut hosts = Vec::new();
    for (id, addr) in &config.peers {
        if *id == config.id {
            continue;
        }
        if let Ok(literal) = addr.parse::<std::net::SocketAddr>() {
            hosts.push(literal.ip());
            continue;
        }
        match tokio::time::timeout(PEER_LOOKUP, tokio::net::lookup_host(addr.as_str())).await {
            Ok(Ok(found)) => hosts.extend(found.map(|a| a.ip())),
            Ok(Err(error)) => {
                tracing::debug!(peer = id, %addr, %error, "peer address does not resolve")
            }
            Err(_) => tracing::debug!(peer = id, %addr, "peer address lookup timed out"),
        }
    }
    hosts
}

/// How long a peer's host name may take to resolve at start.
const PEER_LOOKUP: std::time::Duration = std::time::Duration::from_secs(2);

/// openraft's configuration for this node, validated.
fn raft_config(config: &NodeConfig) -> Result<openraft::Config, NodeError> {
    openraft::Config {
        cluster_name: format!("ringraft-{:x}", config.cluster_id),
        election_timeout_min: config.election_timeout_ms.0,
        election_timeout_max: config.election_timeout_ms.1,
        heartbeat_interval: config.heartbeat_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        max_in_snapshot_log_to_keep: config.keep_after_snapshot,
        max_payload_entries: super::config::MAX_BATCH_ENTRIES,
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
    .map_err(|e| NodeError::Config(e.to_string()))
}

/// Spawns the follower-side server on `listener` with `ctx`, the
/// admission waker and, when this node may not vote yet, the task that
/// lets it again.
fn spawn_tasks(
    listener: ringraft_transport::Listener,
    ctx: ServerCtx,
    raft: &Raft,
    storage: &Storage,
    seeds: &Arc<Seeds>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let server = server::spawn(listener, Arc::new(ctx));
    let pressure = rt::spawn(
        seeds,
        wake_admission_on_change(raft.clone(), storage.admission.clone()),
    );
    let mut tasks = vec![server, pressure];
    if storage.store.votes_blocked() {
        // DESIGN.md, recovery: a node that forgot entries inside its log
        // neither votes (the server refuses) nor stands for election until
        // a leader re-replicated past the break.
        raft.runtime_config().elect(false);
        tasks.push(rt::spawn(
            seeds,
            reenable_elections(raft.clone(), storage.store.clone()),
        ));
    }
    tasks
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
/// free room), while any wait. The flusher wakes them too, each time it
/// gives ring bytes back: room never waits for a snapshot, because entries
/// leave the ring as soon as they are in the segments. openraft's metrics
/// change several times per entry: watched while nobody waits, they woke
/// this task that often for nothing.
async fn wake_admission_on_change(raft: Raft, admission: Admission) {
    let mut metrics = raft.metrics();
    loop {
        admission.someone_waits().await;
        if metrics.changed().await.is_err() {
            return;
        }
        admission.space_freed();
    }
}

async fn reenable_elections(raft: Raft, store: LogStore) {
    while store.votes_blocked() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    raft.runtime_config().elect(true);
}
