//! A cluster of ringraft nodes in one process (feature `inproc`): nodes on
//! the in-process fabric (seeded faults) or on the tcp fabric over
//! loopback, each with its own data directory, a state machine that records
//! what it applied so that tests can check order and loss, and damage to a
//! stopped node's log. Owns the nodes, their temporary directories and the
//! fabric; it implements [`Observe`] for [`wait_for_leader`]. It never
//! judges a run (the tests assert) and never touches a running node's files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringraft::{
    Applied, Durability, Fabric, IoMode, Node, NodeBuilder, NodeConfig, NodeError, StateMachine,
};
use ringraft_transport::inproc;
use serde::{Deserialize, Serialize};

use ringraft::Session;
use ringraft::types::FIRST_SEQ;
use ringraft_checker::history::FinalRecord;
use ringraft_checker::{FinalLogs, Recorder as History, Verdict};

use crate::leader::{NodeView, Observe, Wanted, wait_for_leader};

/// The cluster secret of the tests.
pub const SECRET: &[u8] = b"ringraft integration test secret";

/// Which fabric the cluster runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// In-process fabric.
    Inproc,
    /// In-process fabric whose devices report HCA atomics (atomic only
    /// against the device's own atomics): nodes raise their own fence
    /// through a loopback connection.
    InprocHca,
    /// Software RNIC over loopback TCP.
    Tcp,
}

/// What a test state machine applied, shared with the test.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AppliedLog {
    /// (index, command) in apply order.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// The term of each entry of `entries` (same length, same order).
    #[serde(default)]
    pub terms: Vec<u64>,
}

impl AppliedLog {
    /// What was applied, as the checker's final log: (index, term, data),
    /// the data read as UTF-8 (lossily: the tests' commands are text).
    pub fn final_records(&self) -> Vec<FinalRecord> {
        assert_eq!(self.entries.len(), self.terms.len(), "one term per entry");
        self.entries
            .iter()
            .zip(&self.terms)
            .map(|((index, data), term)| {
                FinalRecord::new(*index, *term, String::from_utf8_lossy(data).into_owned())
            })
            .collect()
    }
}

/// A state machine that records every command; its answer is the count of
/// commands applied so far.
#[derive(Clone, Default)]
pub struct Recorder {
    /// What it applied (shared with the test).
    pub log: Arc<Mutex<AppliedLog>>,
}

impl StateMachine for Recorder {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        let mut log = self.log.lock().unwrap();
        batch
            .iter()
            .map(|a| {
                if let Some((last, _)) = log.entries.last() {
                    assert!(
                        a.index > *last,
                        "applied out of order: {} after {}",
                        a.index,
                        last
                    );
                }
                log.entries.push((a.index, a.data.to_vec()));
                log.terms.push(a.term);
                (log.entries.len() as u64).to_le_bytes().to_vec()
            })
            .collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(&*self.log.lock().unwrap(), bincode::config::standard())
            .unwrap()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let (log, _): (AppliedLog, _) =
            bincode::serde::decode_from_slice(snapshot, bincode::config::standard())
                .map_err(|e| e.to_string())?;
        *self.log.lock().unwrap() = log;
        Ok(())
    }
}

/// One member.
pub struct Member {
    /// Its configuration (reused on restart).
    pub config: NodeConfig,
    /// The running node, if up.
    pub node: Option<Node>,
    /// What its state machine applied.
    pub applied: Arc<Mutex<AppliedLog>>,
}

/// A cluster of nodes in this process.
pub struct Cluster {
    /// The fabric kind.
    pub kind: Kind,
    /// The in-process fabric (inproc only).
    pub fabric: inproc::Fabric,
    _dirs: Vec<tempfile::TempDir>,
    /// The members, by id.
    pub members: BTreeMap<u64, Member>,
    /// The client id of the next proposal's session.
    next_client_id: AtomicU64,
}

/// The node options of a run that is a function of the cluster's seed:
/// each node's openraft draws follow a seed of its own (the `id`-th of the
/// cluster seed's stream), and its storage works on the runtime's tasks
/// only ([`IoMode::Inline`]). For [`Cluster::start_with`] on the inproc
/// fabric (seeded by the same seed), run on a current-thread runtime with
/// paused time; the nodes keep their seeds across restarts.
pub fn deterministic(seed: u64) -> impl Fn(&mut NodeConfig) {
    move |config| {
        let seeds = ringraft::rt::Seeds::new(seed);
        let node_seed = (0..config.id.max(1))
            .map(|_| seeds.next())
            .last()
            .expect("at least one draw");
        config.seed = Some(node_seed);
        config.io = IoMode::Inline;
    }
}

/// The runtime of a deterministic run ([`deterministic`]): one thread,
/// time paused (it moves only when every task waits).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// Installs a tracing subscriber once (RUST_LOG decides what shows).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) and initializes the cluster on node 1.
    pub async fn start(kind: Kind, n: u64, durability: Durability, seed: u64) -> Cluster {
        Cluster::start_with(kind, n, durability, seed, |_| {}).await
    }

    /// Three nodes on the inproc fabric, `memory` durability, a function
    /// of `seed` ([`deterministic`]; run it on a [`paused_runtime`]), each
    /// node's configuration then adjusted by `adjust`.
    pub async fn start_deterministic(seed: u64, adjust: impl Fn(&mut NodeConfig)) -> Cluster {
        let seeded = deterministic(seed);
        Cluster::start_with(Kind::Inproc, 3, Durability::Memory, seed, |c| {
            seeded(c);
            adjust(c);
        })
        .await
    }

    /// Like [`Cluster::start`], adjusting every node's configuration.
    pub async fn start_with(
        kind: Kind,
        n: u64,
        durability: Durability,
        seed: u64,
        adjust: impl Fn(&mut NodeConfig),
    ) -> Cluster {
        init_tracing();
        let fabric = inproc::Fabric::new(seed);
        let mut dirs = Vec::new();
        let addrs: BTreeMap<u64, String> = (1..=n)
            .map(|id| {
                let addr = match kind {
                    Kind::Inproc | Kind::InprocHca => format!("node{id}"),
                    Kind::Tcp => crate::ports::loopback_addr().expect("a free loopback port"),
                };
                (id, addr)
            })
            .collect();
        let mut members = BTreeMap::new();
        // One ring dir for the cluster, like a host's /dev/shm, but the
        // test's own: nothing is left in /dev/shm.
        let ring_dir = tempfile::tempdir().unwrap();
        for (&id, addr) in &addrs {
            let dir = tempfile::tempdir().unwrap();
            let mut config = NodeConfig::new(id, dir.path(), addr.clone());
            config.ring_dir = ring_dir.path().to_path_buf();
            config.peers = addrs.clone();
            config.durability = durability;
            config.ring_capacity = 4 << 20;
            config.max_record_bytes = 64 << 10;
            config.lock_memory = false;
            config.conn.retry_count = 3;
            config.conn.ack_timeout_exp = 13;
            adjust(&mut config);
            dirs.push(dir);
            members.insert(
                id,
                Member {
                    config,
                    node: None,
                    applied: Arc::new(Mutex::new(AppliedLog::default())),
                },
            );
        }
        dirs.push(ring_dir);
        let mut cluster = Cluster {
            kind,
            fabric,
            _dirs: dirs,
            members,
            next_client_id: AtomicU64::new(1),
        };
        for id in 1..=n {
            cluster.boot(id).await.expect("node starts");
        }
        cluster.node(1).initialize().await.expect("initialize");
        cluster
    }

    fn fabric_of(&self, id: u64) -> Fabric {
        match self.kind {
            Kind::Inproc => Fabric::Inproc(self.fabric.clone()),
            Kind::InprocHca => {
                let config = ringraft_transport::DeviceConfig {
                    node_id: id,
                    secret: ringraft_transport::Secret::new(SECRET.to_vec()).unwrap(),
                    limits: Default::default(),
                };
                let addr = self.members[&id].config.listen.clone();
                Fabric::Device(self.fabric.device_with_atomics(
                    &addr,
                    config,
                    ringraft_transport::AtomicCapability::Hca,
                ))
            }
            Kind::Tcp => Fabric::Tcp,
        }
    }

    /// Starts (or restarts) node `id` over its data directory.
    pub async fn boot(&mut self, id: u64) -> Result<(), NodeError> {
        let fabric = self.fabric_of(id);
        let member = self.members.get_mut(&id).expect("member");
        assert!(member.node.is_none(), "node {id} is running");
        let recorder = Recorder::default();
        member.applied = recorder.log.clone();
        let node = NodeBuilder::new(member.config.clone())
            .fabric(fabric)
            .secret(SECRET.to_vec())
            .state_machine(recorder)
            .start()
            .await?;
        member.node = Some(node);
        Ok(())
    }

    /// Stops node `id` (Raft shut down, registrations dropped; the ring
    /// file keeps what a killed process would leave in memory mode).
    pub async fn stop(&mut self, id: u64) {
        let node = self
            .members
            .get_mut(&id)
            .expect("member")
            .node
            .take()
            .expect("running");
        node.shutdown().await;
        drop(node);
    }

    /// The running node `id`.
    pub fn node(&self, id: u64) -> &Node {
        self.members[&id]
            .node
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is down"))
    }

    /// The ring configuration of member `id` (to open its stopped data
    /// directory).
    pub fn ring_config(&self, id: u64) -> ringraft_wal::RingConfig {
        let cfg = &self.members[&id].config;
        ringraft_wal::RingConfig {
            capacity: cfg.ring_capacity,
            max_record_bytes: cfg.max_record_bytes,
            cluster_id: cfg.cluster_id,
            node_id: id,
            lock_memory: false,
        }
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.members[&id].config.data_dir.clone()
    }

    /// The ring dir of node `id` (the cluster's).
    pub fn ring_dir(&self, id: u64) -> PathBuf {
        self.members[&id].config.ring_dir.clone()
    }

    /// The ring file of node `id`.
    pub fn ring_path(&self, id: u64) -> PathBuf {
        ringraft_wal::ring_path(&self.data_dir(id)).unwrap()
    }

    /// Ids of running nodes.
    pub fn running(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|(_, m)| m.node.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// The member of the lowest id other than `leader`, running or not: a
    /// follower to stop, damage, partition or hand leadership to.
    pub fn follower_of(&self, leader: u64) -> u64 {
        self.members
            .keys()
            .copied()
            .find(|id| *id != leader)
            .expect("a cluster of one node has no follower")
    }

    /// Waits until the running nodes among `among` agree on a leader that is
    /// one of them, and returns it.
    pub async fn leader_among(&self, among: &[u64], timeout: Duration) -> u64 {
        let wanted = Wanted {
            among: Some(among.to_vec()),
            ..Wanted::any(Duration::from_millis(20))
        };
        match wait_for_leader(self, &wanted, timeout).await {
            Ok(leader) => leader.id,
            Err(e) => panic!("no agreed leader among {among:?}: {e}"),
        }
    }

    /// The leader agreed by every running node.
    pub async fn leader(&self) -> u64 {
        let running = self.running();
        self.leader_among(&running, Duration::from_secs(20)).await
    }

    /// Proposes `data` through whoever is leader, retrying on leader changes
    /// (at most `timeout`). Returns (index, answer).
    ///
    /// The proposal is a session of its own (a client id of this cluster's,
    /// seq [`FIRST_SEQ`]): a retry after [`NodeError::Unknown`] (the first
    /// try may have been committed) is answered from the session table
    /// instead of being applied a second time. Without it, a retried
    /// proposal whose first try had committed was in the log twice, and an
    /// exactly-once check failed on the harness, not on the node.
    pub async fn propose(
        &self,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<(u64, Vec<u8>), NodeError> {
        let session = Session {
            client_id: self.next_client_id.fetch_add(1, Ordering::Relaxed),
            seq: FIRST_SEQ,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let leader = self.leader().await;
            match self
                .node(leader)
                .propose_in_session(session, data.clone())
                .await
            {
                Ok(r) => return Ok((r.index, r.data)),
                Err(
                    e @ (NodeError::NotLeader { .. }
                    | NodeError::Unknown(_)
                    | NodeError::Busy(_)
                    | NodeError::Stopped(_)),
                ) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "proposal retried");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Cluster::propose`], recorded in `history`: the invocation before
    /// it is sent, `ok` with its index, `fail` for a refusal that proposed
    /// nothing, `info` when the outcome is unknown.
    pub async fn propose_recorded(
        &self,
        history: &History,
        data: &str,
        timeout: Duration,
    ) -> Result<(u64, Vec<u8>), NodeError> {
        let op = history.invoke_append(history.fresh_process(), data);
        let r = self.propose(data.as_bytes().to_vec(), timeout).await;
        match &r {
            Ok((index, _)) => history.ok(op, *index),
            Err(e @ (NodeError::NotLeader { .. } | NodeError::Busy(_) | NodeError::Config(_))) => {
                history.fail(op, e.to_string())
            }
            Err(e) => history.info(op, e.to_string()),
        }
        r
    }

    /// What each running node applied, as the checker's final logs.
    pub fn final_logs(&self) -> FinalLogs {
        self.running()
            .into_iter()
            .map(|id| (id, self.applied(id).final_records()))
            .collect()
    }

    /// Checks `history` against what the running nodes applied: nothing
    /// acknowledged lost, nothing applied twice, one order on every node
    /// (the checker's rules, [`ringraft_checker`]).
    pub fn check(&self, history: &History) -> Verdict {
        history.check(&self.final_logs())
    }

    /// What node `id`'s state machine applied.
    pub fn applied(&self, id: u64) -> AppliedLog {
        self.members[&id].applied.lock().unwrap().clone()
    }

    /// Waits until every running node applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) {
        for id in self.running() {
            self.node(id)
                .wait_applied(index, timeout)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "node {id} did not apply {index}: {e}; status {:?}",
                        self.node(id).status()
                    )
                });
        }
    }
}

impl Observe for Cluster {
    fn running(&self) -> Vec<u64> {
        Cluster::running(self)
    }
    async fn view(&self, id: u64) -> Option<NodeView> {
        let status = self.members.get(&id)?.node.as_ref()?.status();
        Some(NodeView {
            id,
            term: status.term,
            leader: status.leader_id,
            is_leader: status.state == "Leader",
        })
    }
}

/// Damage to a stopped node's log, wherever it keeps an entry (its ring,
/// its segments, or both): what a torn write or a flipped bit on disk
/// leaves for recovery to find.
pub mod damage {
    use super::Cluster;

    /// Where entry `index` of node `id`'s (stopped) log lies: in its ring (a
    /// byte offset in the ring file) and in its segments (a file and an offset).
    /// The log keeps an entry in one or both.
    pub struct Place {
        /// Byte offset of the record in the ring file.
        pub ring: Option<u64>,
        /// Segment file and byte offset of the record in it.
        pub segment: Option<(std::path::PathBuf, u64)>,
    }

    /// Where entry `index` of stopped node `id`'s log lies.
    pub fn place_of(c: &Cluster, id: u64, index: u64) -> Place {
        let wal =
            ringraft_wal::Wal::open(&c.data_dir(id), &c.ring_dir(id), &c.ring_config(id)).unwrap();
        let ring = wal
            .ring()
            .read(index)
            .ok()
            .map(|r| 4096 + r.lsn % c.members[&id].config.ring_capacity);
        drop(wal);
        let mut segment = None;
        let mut files: Vec<_> =
            std::fs::read_dir(c.data_dir(id).join(ringraft_wal::segment::SEGMENT_DIR))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
        files.sort();
        for path in files {
            let bytes = std::fs::read(&path).unwrap();
            let mut at = ringraft_wal::segment::SEGMENT_HEADER_BYTES;
            while at + 64 <= bytes.len() {
                let header: &[u8; 64] = bytes[at..at + 64].try_into().unwrap();
                let Ok(h) = ringraft_wal::record::RecordHeader::decode(header) else {
                    break;
                };
                if h.index == index {
                    segment = Some((path.clone(), at as u64));
                }
                at += h.record_len() as usize;
            }
        }
        assert!(
            ring.is_some() || segment.is_some(),
            "node {id}'s log does not hold {index}"
        );
        Place { ring, segment }
    }

    /// Node `id` (stopped) loses its log from entry `index` on, as a torn
    /// write would leave it: zeroes over the ring's records and the segments'.
    pub fn zero_from(c: &Cluster, id: u64, index: u64) {
        use std::os::unix::fs::FileExt;
        let place = place_of(c, id, index);
        if let Some(at) = place.ring {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(c.ring_path(id))
                .unwrap();
            let capacity = c.members[&id].config.ring_capacity;
            let len = (4096 + capacity - at).min(4096);
            f.write_all_at(&vec![0u8; len as usize], at).unwrap();
        }
        if let Some((path, at)) = place.segment {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let len = f.metadata().unwrap().len();
            f.write_all_at(&vec![0u8; (len - at) as usize], at).unwrap();
        }
    }

    /// Flips one bit of entry `index`'s payload in node `id`'s (stopped) log,
    /// wherever the log keeps it.
    pub fn flip_bit(c: &Cluster, id: u64, index: u64) {
        use std::os::unix::fs::FileExt;
        let place = place_of(c, id, index);
        let flip = |path: &std::path::Path, at: u64| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap();
            let mut b = [0u8];
            f.read_exact_at(&mut b, at + 70).unwrap();
            f.write_all_at(&[b[0] ^ 0x10], at + 70).unwrap();
        };
        if let Some(at) = place.ring {
            flip(&c.ring_path(id), at);
        }
        if let Some((path, at)) = place.segment {
            flip(&path, at);
        }
    }
}
