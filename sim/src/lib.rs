//! # ringraft-sim
//!
//! A seeded cluster simulator (after TigerBeetle's VOPR and FoundationDB's
//! simulation): a cluster of real ringraft nodes (the sans-IO replication
//! core and its glue, the wal ring, openraft) runs on one thread with
//! simulated time (tokio's paused clock) over the in-process fabric; clients
//! append in sessions and read; a nemesis injects faults chosen by the
//! seed; the run is checked after every fault and at the end by
//! `ringraft-checker` (nothing acknowledged lost, nothing applied twice, one
//! order on every node and per client, no stale leader's acknowledgement)
//! and by the simulator's own agreement check on the applied logs.
//!
//! - [`world`]: the cluster, the registry of running nodes, the trace;
//! - [`workload`]: the clients;
//! - [`nemesis`]: the faults ([`membership`]: removing a follower and
//!   adding it back);
//! - [`power`]: power loss (a simulated disk over the real one: what was
//!   not synced is lost, the ring in shared memory too);
//! - [`checks`]: what must hold after every step and at the end.
//! - [`nemesis`]: the faults;
//! - [`regrant`]: the scripted fault that lets a deposed leader ask a
//!   node whose term advanced for a grant;
//! - [`checks`]: what must hold after every step and at the end;
//! - [`landing`]: what the fabric's NICs let land in the rings.
//!
//! It must never read the wall clock or an unseeded random source in the
//! simulated world: everything a run does follows from its seed (see
//! `README.md` for what is and is not deterministic yet).

pub mod checks;
pub mod landing;
pub mod late_landing;
pub mod membership;
pub mod nemesis;
pub mod power;
pub mod regrant;
pub mod stale_adoption;
pub mod workload;
pub mod world;

use std::time::Duration;

/// What a run does.
#[derive(Clone, Debug)]
pub struct Options {
    /// Nodes in the cluster.
    pub nodes: u64,
    /// Clients appending in sessions.
    pub clients: u64,
    /// Faults the nemesis injects, one after another.
    pub faults: u64,
    /// Record the trace (every event with its simulated time).
    pub trace: bool,
    /// How long, in simulated time, the cluster gets to agree after the
    /// last fault is healed.
    pub converge: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nodes: 3,
            clients: 3,
            faults: 6,
            trace: false,
            converge: Duration::from_secs(30),
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Its seed.
    pub seed: u64,
    /// Why it failed (`None`: every check held).
    pub failure: Option<String>,
    /// Client operations that completed (ok, failed or unknown).
    pub operations: u64,
    /// Appends acknowledged.
    pub acknowledged: u64,
    /// Faults injected.
    pub faults: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// The trace, when asked for.
    pub trace: Vec<String>,
}

impl Outcome {
    /// One line: the seed, its verdict and its counts.
    pub fn line(&self) -> String {
        let verdict = match &self.failure {
            None => "ok".to_string(),
            Some(why) => format!("FAILED: {why}"),
        };
        format!(
            "seed {}: {verdict} ({} operations, {} acknowledged, {} faults, {:.1} s simulated)",
            self.seed,
            self.operations,
            self.acknowledged,
            self.faults,
            self.simulated.as_secs_f64()
        )
    }
}

/// Runs seed `seed` on a runtime of its own (one thread, paused clock). A
/// panic anywhere in the run (a node's task included: tokio would only
/// end that task) fails it.
pub fn run_seed(seed: u64, options: &Options) -> Outcome {
    panics::watch();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(world::run(seed, options))
    }));
    drop(runtime);
    let mut outcome = run.unwrap_or_else(|_| Outcome {
        seed,
        failure: None,
        operations: 0,
        acknowledged: 0,
        faults: 0,
        simulated: Duration::ZERO,
        trace: Vec::new(),
    });
    if let Some(panic) = panics::take().into_iter().next() {
        outcome.failure = Some(format!("panicked: {panic}"));
    }
    outcome
}

/// Panics on this thread (the run's: a current-thread runtime polls every
/// task on the thread that runs it).
mod panics {
    use std::cell::RefCell;
    use std::sync::Once;

    thread_local! {
        static SEEN: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    }

    /// From now on, panics on this thread are kept (and still printed).
    pub(crate) fn watch() {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let default = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                SEEN.with(|seen| {
                    if let Some(seen) = seen.borrow_mut().as_mut() {
                        seen.push(info.to_string());
                    }
                });
                default(info);
            }));
        });
        SEEN.with(|seen| *seen.borrow_mut() = Some(Vec::new()));
    }

    /// The panics kept since [`watch`].
    pub(crate) fn take() -> Vec<String> {
        SEEN.with(|seen| seen.borrow_mut().take().unwrap_or_default())
    }
}
