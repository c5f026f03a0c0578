//! A 3-node cluster on the in-process fabric, run on one thread with paused
//! time, is a deterministic function of one seed (groundwork for the
//! simulator of issue 13): the same seed replays the same run, event for
//! event and at the same virtual instants; another seed gives another run
//! (its election timeouts differ).
//!
//! What the seed reaches: openraft's random draws (each node's seed, from
//! the cluster seed: `ringraft::rt`), the fabric's delays and every
//! device's rkeys and handshake nonces (the fabric's seed). What makes the
//! rest ordered: the nodes do no work outside the runtime's one thread
//! (`IoMode::Inline`: no flusher thread, no `spawn_blocking`), no
//! `tokio::select!` on the path draws a branch order, and watch channels
//! wake their waiters in order (`ringraft::watch`).
//!
//! The trace is every change of each node's openraft metrics that the
//! test looks at (state, term, leader, last log index, last applied index),
//! each proposal's commit index and the scenario's steps, stamped with the
//! virtual time since the start. Nothing here waits for real time: paused
//! time advances only when every task waits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringraft::{Durability, Node, NodeConfig};
use ringraft_testkit::inproc::{Cluster, Kind, deterministic};
use tokio::time::Instant;

/// The seed of the runs compared.
const SEED: u64 = 0x5eed;
/// Another seed.
const OTHER_SEED: u64 = 0x5eed + 1;
/// Commands proposed.
const COMMANDS: u64 = 50;
/// The leader is stopped before this command...
const STOP_AT: u64 = 20;
/// ...and restarted before this one.
const RESTART_AT: u64 = 35;
/// A safety net against hangs (virtual time); never what the test asserts.
const PATIENCE: Duration = Duration::from_secs(60);

/// What happened, in order, with virtual times.
#[derive(Clone, Default)]
struct Trace {
    start: Option<Instant>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Trace {
    fn new() -> Trace {
        Trace {
            start: Some(Instant::now()),
            lines: Arc::default(),
        }
    }

    fn record(&self, what: impl std::fmt::Display) {
        let at = self.start.expect("started").elapsed();
        self.lines
            .lock()
            .unwrap()
            .push(format!("{:>9.3} ms  {what}", at.as_secs_f64() * 1e3));
    }

    /// Records every change of what `node`'s metrics say about it, until
    /// it stops.
    fn follow(&self, node: &Node) -> tokio::task::JoinHandle<()> {
        let trace = self.clone();
        let id = node.id();
        let mut metrics = node.raft().metrics();
        tokio::spawn(async move {
            let mut last = String::new();
            loop {
                let now = {
                    let m = metrics.borrow_and_update();
                    format!(
                        "{:?} term {} leader {:?} last log {:?} applied {:?}",
                        m.state,
                        m.current_term,
                        m.current_leader,
                        m.last_log_index,
                        m.last_applied.map(|l| l.index)
                    )
                };
                if now != last {
                    trace.record(format_args!("node {id}: {now}"));
                    last = now;
                }
                if metrics.changed().await.is_err() {
                    trace.record(format_args!("node {id}: metrics closed"));
                    return;
                }
            }
        })
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// The scenario: elect, propose, stop the leader, propose, restart it,
/// propose, wait until every node applied everything.
async fn scenario(seed: u64, options: impl Fn(&mut NodeConfig)) -> Vec<String> {
    let trace = Trace::new();
    let mut cluster = Cluster::start_with(Kind::Inproc, 3, Durability::Fsync, seed, options).await;
    // Frames take a seeded 0.1..2 ms: the fabric's generator is on the path.
    cluster
        .fabric
        .set_delay(Duration::from_micros(100), Duration::from_millis(2));
    let mut followers = Vec::new();
    for id in 1..=3 {
        followers.push(trace.follow(cluster.node(id)));
    }
    trace.record("started");
    let mut stopped = None;
    for k in 0..COMMANDS {
        if k == STOP_AT {
            let leader = cluster.leader().await;
            trace.record(format_args!("stopping leader {leader}"));
            cluster.stop(leader).await;
            stopped = Some(leader);
        }
        if k == RESTART_AT {
            let id = stopped.take().expect("stopped before");
            trace.record(format_args!("restarting node {id}"));
            cluster.boot(id).await.expect("restarts");
            followers.push(trace.follow(cluster.node(id)));
        }
        let (index, _) = cluster
            .propose(format!("command {k}").into_bytes(), PATIENCE)
            .await
            .unwrap_or_else(|e| panic!("command {k}: {e}"));
        trace.record(format_args!("command {k} committed at {index}"));
    }
    let last = cluster.node(cluster.leader().await).status().last_log_index;
    cluster.wait_applied(last.expect("a log"), PATIENCE).await;
    trace.record("every node applied everything");
    for follower in followers {
        follower.abort();
    }
    trace.lines()
}

/// One run on a runtime of its own: one thread, paused time.
fn run(seed: u64, options: impl Fn(&mut NodeConfig)) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(scenario(seed, options))
}

/// The first line where two traces part, for the failure message.
fn first_difference(a: &[String], b: &[String]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    format!(
        "traces of {} and {} lines part at line {at}:\n  {}\n  {}",
        a.len(),
        b.len(),
        a.get(at).map_or("(end)", String::as_str),
        b.get(at).map_or("(end)", String::as_str)
    )
}

#[test]
fn a_cluster_run_is_a_function_of_its_seed() {
    let first = run(SEED, deterministic(SEED));
    // Shown with --nocapture.
    println!("{}", first.join("\n"));
    assert!(
        first.iter().any(|l| l.contains("stopping leader"))
            && first.iter().any(|l| l.contains("restarting node"))
            && first.iter().any(|l| l.contains("every node applied")),
        "the scenario ran through: {first:#?}"
    );
    let again = run(SEED, deterministic(SEED));
    assert!(
        first == again,
        "the same seed replays the same run; {}",
        first_difference(&first, &again)
    );
    let other = run(OTHER_SEED, deterministic(OTHER_SEED));
    assert!(first != other, "another seed gives another run");
    // The fabric of `SEED` (same delays, rkeys, nonces), the nodes' seeds
    // of another: openraft's draws (election timeouts, the tick's jitter)
    // follow the nodes' seeds.
    let other_nodes = run(SEED, deterministic(OTHER_SEED));
    assert!(
        first != other_nodes,
        "other node seeds give another run: openraft draws from them"
    );
}
