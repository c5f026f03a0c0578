//! The simulated world: a cluster of real nodes on the in-process fabric
//! (`ringraft_testkit::inproc`), the registry of the running ones that the
//! clients use, the history the checker judges, and the trace. [`run`] is
//! one seed's run: start, clients, faults (each followed by the step
//! checks), heal, converge, final check.
//!
//! It owns the order of a run; what a fault does is [`crate::nemesis`]'s,
//! what a client does [`crate::workload`]'s, what must hold
//! [`crate::checks`]'.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ringraft::{Durability, Node};
use ringraft_checker::Recorder;
use ringraft_testkit::inproc::{Cluster, Kind};
use tokio::time::Instant;

use crate::landing::LandingCheck;
use crate::{Options, Outcome, checks, nemesis, power, workload};

/// The running nodes, as the clients see them: a node stopped by the
/// nemesis leaves, a restarted one comes back.
#[derive(Clone, Default)]
pub struct Nodes(Arc<Mutex<BTreeMap<u64, Node>>>);

impl Nodes {
    /// The running nodes, by id.
    pub fn running(&self) -> Vec<(u64, Node)> {
        let nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        nodes.iter().map(|(id, n)| (*id, n.clone())).collect()
    }

    /// Node `id`, if it runs.
    pub fn get(&self, id: u64) -> Option<Node> {
        let nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        nodes.get(&id).cloned()
    }

    /// Node `id` is up (`Some`) or down.
    pub fn set(&self, id: u64, node: Option<Node>) {
        let mut nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match node {
            Some(node) => nodes.insert(id, node),
            None => nodes.remove(&id),
        };
    }
}

/// The trace: every event of the run with its simulated time, when asked
/// for.
#[derive(Clone)]
pub struct Trace {
    on: bool,
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
    /// Paths that differ from run to run (the nodes' temporary
    /// directories), and what the trace says instead: an error message
    /// that names a file must not make two runs of a seed differ.
    masks: Arc<Vec<(String, String)>>,
}

impl Trace {
    fn new(on: bool, start: Instant, masks: Vec<(String, String)>) -> Trace {
        Trace {
            on,
            start,
            lines: Arc::default(),
            masks: Arc::new(masks),
        }
    }

    /// Records `what` (built only when the trace is on).
    pub fn event(&self, what: impl FnOnce() -> String) {
        if self.on {
            let at = self.start.elapsed();
            let mut what = what();
            for (path, name) in self.masks.iter() {
                what = what.replace(path.as_str(), name);
            }
            let line = format!("{:>10.3} {what}", at.as_secs_f64());
            self.lines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(line);
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.lines.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One seed's world.
pub struct World {
    /// The seed.
    pub seed: u64,
    /// The cluster.
    pub cluster: Cluster,
    /// The running nodes, shared with the clients.
    pub nodes: Nodes,
    /// The history (simulated time).
    pub history: Recorder,
    /// The trace.
    pub trace: Trace,
    /// The nemesis' source of choices.
    pub rng: StdRng,
    /// Faults injected so far.
    pub faults: u64,
    /// What landed in the rings by remote WRITE.
    pub landings: LandingCheck,
}

impl World {
    /// Starts node `id` again and lets the clients use it.
    pub async fn boot(&mut self, id: u64) -> Result<(), String> {
        self.cluster
            .boot(id)
            .await
            .map_err(|e| format!("node {id} does not start again: {e}"))?;
        self.nodes.set(id, Some(self.cluster.node(id).clone()));
        self.trace.event(|| format!("node {id} started"));
        Ok(())
    }

    /// Stops node `id`; the clients stop using it.
    pub async fn stop(&mut self, id: u64) {
        self.nodes.set(id, None);
        self.cluster.stop(id).await;
        self.trace.event(|| format!("node {id} stopped"));
    }

    /// The leader the running nodes agree on and its term, waiting at most
    /// `patience` (simulated).
    pub async fn leader(&self, patience: Duration) -> Option<(u64, u64)> {
        let deadline = Instant::now() + patience;
        loop {
            let views: Vec<_> = self
                .cluster
                .running()
                .into_iter()
                .map(|id| self.cluster.node(id).status())
                .collect();
            if let Some(leader) = views.iter().find(|s| s.state == "Leader")
                && views
                    .iter()
                    .all(|s| s.leader_id == Some(leader.id) && s.term == leader.term)
            {
                return Some((leader.id, leader.term));
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Runs one seed (in simulated time: call it on a paused runtime).
pub async fn run(seed: u64, options: &Options) -> Outcome {
    let start = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let durability = if rng.random_bool(0.5) {
        Durability::Memory
    } else {
        Durability::Fsync
    };
    // Every node's openraft draws from the seed, and its disk I/O runs
    // inline (no thread of its own): the run is a function of the seed.
    let nodes_seeded = ringraft_testkit::inproc::deterministic(seed);
    // A flush of the simulated disk takes time (a power loss may strike
    // while one is in flight).
    let flush_latency = power::flush_latency(seed);
    let cluster = Cluster::start_with(Kind::Inproc, options.nodes, durability, seed, |config| {
        nodes_seeded(config);
        config.simulated_flush_latency = flush_latency;
    })
    .await;
    let nodes = Nodes::default();
    for id in cluster.running() {
        nodes.set(id, Some(cluster.node(id).clone()));
    }
    let names = cluster
        .members
        .iter()
        .map(|(id, member)| (member.config.listen.clone(), *id))
        .collect();
    let landings = LandingCheck::install(&cluster.fabric, names, nodes.clone())
        .expect("a new fabric has no landing observer yet");
    let history =
        Recorder::with_clock(move || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let mut masks: Vec<(String, String)> = cluster
        .members
        .iter()
        .map(|(id, member)| {
            let dir = member.config.data_dir.display().to_string();
            (dir, format!("<node {id}'s data dir>"))
        })
        .collect();
    if let Some(member) = cluster.members.values().next() {
        let rings = member.config.ring_dir.display().to_string();
        masks.push((rings, "<ring dir>".to_string()));
    }
    // Longer paths first: one may start with another.
    masks.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let trace = Trace::new(options.trace, start, masks);
    trace.event(|| {
        format!(
            "seed {seed}: {} nodes, {durability:?}, flushes take {flush_latency:?}",
            options.nodes
        )
    });
    let mut world = World {
        seed,
        cluster,
        nodes,
        history,
        trace,
        rng,
        faults: 0,
        landings,
    };
    power::watch_world(&world);
    let clients = workload::Clients::spawn(&world, options.clients);
    let failure = run_faults(&mut world, options, &clients).await;
    let stats = clients.stop().await;
    let failure = match failure {
        Some(failure) => Some(failure),
        None => finish(&mut world, options).await.err(),
    };
    world.cluster.fabric.heal();
    power::forget_world(&world);
    Outcome {
        seed,
        failure,
        operations: stats.operations,
        acknowledged: stats.acknowledged,
        faults: world.faults,
        simulated: start.elapsed(),
        trace: world.trace.take(),
    }
}

/// The faults, each followed by the step checks; the first broken check.
async fn run_faults(
    world: &mut World,
    options: &Options,
    clients: &workload::Clients,
) -> Option<String> {
    for _ in 0..options.faults {
        if let Err(e) = nemesis::step(world).await {
            return Some(e);
        }
        world.faults += 1;
        if let Err(e) = checks::after_step(world) {
            return Some(e);
        }
        if let Some(e) = clients.failure() {
            return Some(e);
        }
    }
    None
}

/// Heals everything, lets the cluster agree and checks the end state.
async fn finish(world: &mut World, options: &Options) -> Result<(), String> {
    nemesis::heal_all(world).await?;
    let index = workload::barrier(world, options.converge).await?;
    for id in world.cluster.running() {
        world
            .cluster
            .node(id)
            .wait_applied(index, options.converge)
            .await
            .map_err(|e| format!("node {id} did not apply the barrier {index}: {e}"))?;
    }
    world.trace.event(|| format!("converged at {index}"));
    checks::at_end(world)
}
