//! The clients: each one a session (`Session`: a client id, consecutive
//! seqs) appending through a node the seed picks, retrying the same seq on
//! that node across timeouts and leader changes (exactly-once by the
//! session table; the node forwards to the leader), one append in flight
//! at a time; every invocation and completion goes into the history with
//! the client, the seq and the node it was sent to, for the checker's
//! exactly-once, client-order and stale-leader rules. An append whose
//! outcome stays unknown (its node stopped, or it ran out of patience)
//! ends that session: the client goes on in a new one (a session's seqs
//! are applied in order, so it could not go past the unknown one).
//!
//! It owns what the clients do and their counts; it never injects a fault
//! and never judges (a refusal a client cannot explain is reported, not
//! asserted).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use ringraft::{NodeError, Session};
use ringraft_checker::Recorder;
use ringraft_checker::history::{Event, EventType};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::world::{Nodes, Trace, World};

/// How long one attempt may take (simulated).
const ATTEMPT: Duration = Duration::from_secs(2);
/// How long a client keeps retrying one append before it gives up on it
/// (its outcome is then unknown: `info`).
const PATIENCE: Duration = Duration::from_secs(20);
/// The client id of the barrier the run ends with.
const BARRIER_CLIENT: u64 = u64::MAX >> 1;

/// What the clients did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Operations completed (any outcome).
    pub operations: u64,
    /// Appends acknowledged.
    pub acknowledged: u64,
}

#[derive(Default)]
struct Counters {
    operations: AtomicU64,
    acknowledged: AtomicU64,
    /// A client saw what no fault explains.
    failure: std::sync::Mutex<Option<String>>,
}

/// The running clients.
pub struct Clients {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

/// What a client needs of the world.
#[derive(Clone)]
struct Ctx {
    nodes: Nodes,
    history: Recorder,
    trace: Trace,
    counters: Arc<Counters>,
}

impl Counters {
    /// Keeps the first thing a client saw that no fault explains.
    fn fail(&self, why: String) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert(why);
    }
}

impl Clients {
    /// Starts `count` clients, each with a generator of its own derived
    /// from the world's seed.
    pub fn spawn(world: &World, count: u64) -> Clients {
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let ctx = Ctx {
            nodes: world.nodes.clone(),
            history: world.history.clone(),
            trace: world.trace.clone(),
            counters: counters.clone(),
        };
        let tasks = (1..=count)
            .map(|client| {
                let rng = StdRng::seed_from_u64(world.seed ^ client.wrapping_mul(0x9e37_79b9));
                tokio::spawn(client_loop(ctx.clone(), client, rng, stopped.clone()))
            })
            .collect();
        Clients {
            stop,
            tasks,
            counters,
        }
    }

    /// What a client saw that no fault explains, if anything.
    pub fn failure(&self) -> Option<String> {
        self.counters
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the clients (each finishes its append in flight) and returns
    /// their counts.
    pub async fn stop(self) -> Stats {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        Stats {
            operations: self.counters.operations.load(Ordering::Relaxed),
            acknowledged: self.counters.acknowledged.load(Ordering::Relaxed),
        }
    }
}

/// Sessions one client may go through (its session ids are
/// `client * SESSIONS_PER_CLIENT + n`).
const SESSIONS_PER_CLIENT: u64 = 1 << 20;

async fn client_loop(ctx: Ctx, client: u64, mut rng: StdRng, stopped: watch::Receiver<bool>) {
    let mut session = client * SESSIONS_PER_CLIENT;
    let mut seq = ringraft::types::FIRST_SEQ;
    while !*stopped.borrow() {
        let data = format!("c{session}-{seq}");
        if append(&ctx, &mut rng, session, seq, &data, PATIENCE)
            .await
            .is_some()
        {
            seq += 1;
        } else {
            session += 1;
            seq = ringraft::types::FIRST_SEQ;
        }
        let pause = Duration::from_millis(rng.random_range(0..30));
        tokio::time::sleep(pause).await;
    }
}

/// One append of `data` as seq `seq` of session `client`, retried until
/// acknowledged or `patience` runs out; recorded. Returns its index.
async fn append(
    ctx: &Ctx,
    rng: &mut StdRng,
    client: u64,
    seq: u64,
    data: &str,
    patience: Duration,
) -> Option<u64> {
    let process = ctx.history.fresh_process();
    let session = Session {
        client_id: client,
        seq,
    };
    let deadline = Instant::now() + patience;
    // The node it is sent to, for all its attempts: the checker's
    // stale-leader rules judge an acknowledgement by where it was asked.
    let node_id = pick_node(ctx, rng, deadline).await?;
    ctx.history.record(
        Event::append_invoke(0, process, data)
            .in_client(client, seq)
            .with_node(node_id),
    );
    let mut last_error = String::from("no attempt");
    while Instant::now() < deadline {
        // A restarted node is a new handle; a stopped one ends the append.
        let Some((_, node)) = ctx
            .nodes
            .running()
            .into_iter()
            .find(|(id, _)| *id == node_id)
        else {
            last_error = format!("node {node_id} stopped");
            break;
        };
        let attempt = node.propose_in_session(session, data.as_bytes().to_vec());
        match tokio::time::timeout(ATTEMPT, attempt).await {
            Ok(Ok(response)) => {
                let ok = EventType::Ok;
                let index = Some(response.index);
                ctx.history
                    .record(Event::append_completion(0, process, ok, data, index));
                ctx.counters.operations.fetch_add(1, Ordering::Relaxed);
                ctx.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
                ctx.trace
                    .event(|| format!("client {client} seq {seq} ok at {}", response.index));
                return Some(response.index);
            }
            Ok(Err(e)) => {
                if let Some(why) = unexplained(&e) {
                    ctx.counters
                        .fail(format!("client {client} seq {seq}: {why}"));
                }
                last_error = e.to_string();
            }
            Err(_) => last_error = format!("no answer within {ATTEMPT:?}"),
        }
        ctx.trace
            .event(|| format!("client {client} seq {seq} retried: {last_error}"));
        let backoff = Duration::from_millis(rng.random_range(10..60));
        tokio::time::sleep(backoff).await;
    }
    ctx.trace
        .event(|| format!("client {client} seq {seq} unknown: {last_error}"));
    ctx.history.record(
        Event::append_completion(0, process, EventType::Info, data, None).with_error(last_error),
    );
    ctx.counters.operations.fetch_add(1, Ordering::Relaxed);
    None
}

/// A running node the seed picks, waiting for one until `deadline`.
async fn pick_node(ctx: &Ctx, rng: &mut StdRng, deadline: Instant) -> Option<u64> {
    loop {
        let running = ctx.nodes.running();
        if !running.is_empty() {
            return Some(running[rng.random_range(0..running.len())].0);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Errors a client under faults must never see.
fn unexplained(e: &NodeError) -> Option<String> {
    match e {
        NodeError::TooLarge(_) | NodeError::Config(_) => Some(e.to_string()),
        _ => None,
    }
}

/// The run's last append (a client of its own), acknowledged once the
/// faults are healed: the index every node must reach.
pub async fn barrier(world: &World, patience: Duration) -> Result<u64, String> {
    let ctx = Ctx {
        nodes: world.nodes.clone(),
        history: world.history.clone(),
        trace: world.trace.clone(),
        counters: Arc::default(),
    };
    let mut rng = StdRng::seed_from_u64(world.seed.rotate_left(17));
    append(&ctx, &mut rng, BARRIER_CLIENT, 1, "barrier", patience)
        .await
        .ok_or_else(|| format!("no append acknowledged within {patience:?} after the heal"))
}
