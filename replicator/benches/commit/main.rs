//! Commit benchmark: latency (p50, p99) and throughput of 64-byte proposals
//! on a 3-node cluster in this process, with 1 and with 64 concurrent
//! proposers, for ringraft (`memory` and `fsync` durability, on the `inproc`
//! fabric and on the `tcp` fabric over loopback) and, in the same run, for a
//! baseline: openraft with an in-memory log and direct in-process calls
//! between the nodes' `Raft` handles (no ring, no RDMA semantics), the same
//! openraft configuration and the same state machine. The ratio columns are
//! ringraft ÷ baseline at the same number of proposers.
//!
//! A commit's latency runs from the `propose()` call (`client_write` for the
//! baseline) to its `Ok` return: committed by a quorum and applied on the
//! leader. Each case starts a fresh cluster, waits for a leader, warms up,
//! then measures until `--secs` passed or `--commits` were made, whichever
//! comes first; throughput is commits over that wall time.
//!
//! ```text
//! cargo bench -p ringraft --bench commit
//! cargo bench -p ringraft --bench commit -- --secs 5 --warmup 1 --proposers 1,16,64 tcp baseline
//! ```
//!
//! Options (each also an environment variable):
//! - `--secs S` (`RINGRAFT_BENCH_SECS`, default 10): measured seconds per case;
//! - `--warmup S` (`RINGRAFT_BENCH_WARMUP`, default 2): warm-up seconds per case;
//! - `--commits N` (`RINGRAFT_BENCH_COMMITS`, default 5000000): cap per case;
//! - `--entry-bytes N` (`RINGRAFT_BENCH_ENTRY_BYTES`, default 64): application
//!   bytes per entry;
//! - `--proposers LIST` (`RINGRAFT_BENCH_PROPOSERS`, default `1,64`);
//! - `--threads N` (`RINGRAFT_BENCH_THREADS`, default: the CPUs): tokio
//!   worker threads, shared by the three nodes and the proposers;
//! - `--dir PATH` (`RINGRAFT_BENCH_DIR`, default `<workspace>/target/bench-tmp`):
//!   where the data directories go (on the real disk, for `fsync`);
//! - `--settle S` (`RINGRAFT_BENCH_SETTLE`, default 30): before each case,
//!   wait up to S seconds until other processes use less than 10 % of the
//!   CPUs (the machine may be shared); what they used during each case is
//!   reported either way;
//! - free arguments: keep only the cases whose label (e.g.
//!   `ringraft/tcp/fsync/64`, `baseline/1`) contains one of them.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) every case runs
//! briefly, as a smoke test (0.05 s warm-up, 0.15 s measured, 4 MiB rings
//! instead of the default 64 MiB so that the nodes start fast): it checks
//! that every case commits, and its numbers mean nothing.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use ringraft::types::Raft;
use ringraft::{
    Applied, Command, Durability, Fabric, Node, NodeBuilder, NodeConfig, NodeInfo, SmStore,
    StateMachine,
};

/// Bytes of every proposal unless `--entry-bytes` says otherwise.
const ENTRY_BYTES: usize = 64;
/// The cluster secret.
const SECRET: &[u8] = b"ringraft commit benchmark secret";
/// How long a cluster may take to elect its first leader.
const ELECTION_WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// The state machine: the same trivial one for ringraft and the baseline.
// ---------------------------------------------------------------------------

/// Counts what it applied; answers each command with the count.
#[derive(Default)]
struct Counter {
    applied: u64,
}

impl StateMachine for Counter {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        batch
            .iter()
            .map(|_| {
                self.applied += 1;
                self.applied.to_le_bytes().to_vec()
            })
            .collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.applied.to_le_bytes().to_vec()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.applied = u64::from_le_bytes(snapshot.try_into().map_err(|_| "bad snapshot")?);
        Ok(())
    }
}

mod baseline;
mod machine;

use baseline::{DirectNetwork, MemLog, Registry, raft_config_like_ringraft};
use machine::{CpuSample, CpuShare, cpu_share, file_system_of, settle};

// ---------------------------------------------------------------------------
// Clusters.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Ringraft { tcp: bool, durability: Durability },
    Baseline,
}

impl System {
    fn label(&self) -> String {
        match self {
            System::Ringraft { tcp, durability } => format!(
                "ringraft/{}/{}",
                if *tcp { "tcp" } else { "inproc" },
                durability_name(*durability)
            ),
            System::Baseline => "baseline".into(),
        }
    }
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Memory => "memory",
        Durability::Fsync => "fsync",
    }
}

/// Where proposals go.
#[derive(Clone)]
enum Leader {
    Ringraft(Node),
    Baseline(Raft),
}

impl Leader {
    async fn propose(&self, data: Vec<u8>) -> Result<(), String> {
        match self {
            Leader::Ringraft(node) => node
                .propose(data)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Leader::Baseline(raft) => raft
                .client_write(Command {
                    session: None,
                    data,
                    control: None,
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }
}

enum Cluster {
    Ringraft(Vec<Node>),
    Baseline(Vec<Raft>, Registry),
}

impl Cluster {
    /// Starts a 3-node cluster of `system` under `dir`; `ring_capacity`
    /// overrides ringraft's default ring size.
    async fn start(system: System, dir: &Path, ring_capacity: Option<u64>) -> Cluster {
        match system {
            System::Ringraft { tcp, durability } => {
                Cluster::start_ringraft(tcp, durability, dir, ring_capacity).await
            }
            System::Baseline => Cluster::start_baseline(dir).await,
        }
    }

    /// Three ringraft nodes over the inproc fabric, or tcp on loopback.
    async fn start_ringraft(
        tcp: bool,
        durability: Durability,
        dir: &Path,
        ring_capacity: Option<u64>,
    ) -> Cluster {
        let fabric = ringraft_transport::inproc::Fabric::new(1);
        let addrs: BTreeMap<u64, String> = (1..=3)
            .map(|id| {
                let addr = if tcp {
                    ringraft_testkit::ports::loopback_addr().expect("bind an ephemeral port")
                } else {
                    format!("node{id}")
                };
                (id, addr)
            })
            .collect();
        let mut nodes = Vec::new();
        for (&id, addr) in &addrs {
            let data_dir = dir.join(format!("n{id}"));
            std::fs::create_dir_all(&data_dir).expect("data dir");
            let mut config = NodeConfig::new(id, data_dir, addr.clone());
            config.peers = addrs.clone();
            config.durability = durability;
            // The default 64 MiB ring is more than RLIMIT_MEMLOCK
            // allows here.
            config.lock_memory = false;
            if let Some(capacity) = ring_capacity {
                config.ring_capacity = capacity;
            }
            let node = NodeBuilder::new(config)
                .fabric(if tcp {
                    Fabric::Tcp
                } else {
                    Fabric::Inproc(fabric.clone())
                })
                .secret(SECRET.to_vec())
                .state_machine(Counter::default())
                .start()
                .await
                .unwrap_or_else(|e| panic!("node {id} starts: {e}"));
            nodes.push(node);
        }
        nodes[0].initialize().await.expect("initialize");
        Cluster::Ringraft(nodes)
    }

    /// Three openraft nodes with an in-memory log, calling each other
    /// directly.
    async fn start_baseline(dir: &Path) -> Cluster {
        let defaults = NodeConfig::new(0, dir, "");
        let config = raft_config_like_ringraft(&defaults);
        let registry: Registry = Arc::default();
        let mut rafts = Vec::new();
        for id in 1..=3u64 {
            let data_dir = dir.join(format!("n{id}"));
            std::fs::create_dir_all(&data_dir).expect("data dir");
            let sm = SmStore::open(Box::new(Counter::default()), Some(&data_dir))
                .expect("state machine");
            // ringraft's type config runs openraft with seeded randomness:
            // Raft starts inside a seed scope (`ringraft::rt`), drawn from
            // the OS like a node's without a configured seed.
            let raft = ringraft::rt::scoped(
                ringraft::rt::Seeds::from_entropy().next(),
                Raft::new(
                    id,
                    config.clone(),
                    DirectNetwork {
                        registry: registry.clone(),
                    },
                    MemLog::default(),
                    sm,
                ),
            )
            .await
            .expect("raft starts");
            registry
                .write()
                .expect("registry lock")
                .insert(id, raft.clone());
            rafts.push(raft);
        }
        let members: BTreeMap<u64, NodeInfo> = (1..=3u64)
            .map(|id| {
                (
                    id,
                    NodeInfo {
                        addr: format!("node{id}"),
                    },
                )
            })
            .collect();
        rafts[0].initialize(members).await.expect("initialize");
        Cluster::Baseline(rafts, registry)
    }

    fn rafts(&self) -> Vec<Raft> {
        match self {
            Cluster::Ringraft(nodes) => nodes.iter().map(|n| n.raft().clone()).collect(),
            Cluster::Baseline(rafts, _) => rafts.clone(),
        }
    }

    /// Waits until every node agrees on a leader that knows it leads.
    async fn leader(&self) -> Leader {
        let deadline = Instant::now() + ELECTION_WAIT;
        let rafts = self.rafts();
        loop {
            let views: Vec<_> = rafts
                .iter()
                .map(|r| {
                    let m = r.metrics().borrow_watched().clone();
                    (m.id, m.state, m.current_leader)
                })
                .collect();
            if let Some(leader) = views[0].2
                && views.iter().all(|v| v.2 == Some(leader))
                && views
                    .iter()
                    .any(|v| v.0 == leader && v.1 == ServerState::Leader)
            {
                let k = (leader - 1) as usize;
                return match self {
                    Cluster::Ringraft(nodes) => Leader::Ringraft(nodes[k].clone()),
                    Cluster::Baseline(rafts, _) => Leader::Baseline(rafts[k].clone()),
                };
            }
            assert!(Instant::now() < deadline, "no leader: {views:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn shutdown(self) {
        match self {
            Cluster::Ringraft(nodes) => {
                for node in &nodes {
                    node.shutdown().await;
                }
            }
            Cluster::Baseline(rafts, registry) => {
                registry.write().expect("registry lock").clear();
                for raft in &rafts {
                    let _ = raft.shutdown().await;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Measurement.
// ---------------------------------------------------------------------------

struct Outcome {
    /// Commit latencies, nanoseconds.
    hist: Histogram<u64>,
    commits: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
}

impl Outcome {
    fn p_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
    fn throughput(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("histogram bounds")
}

/// `proposers` tasks propose in a loop until `secs` passed or `cap` commits
/// were made.
async fn drive(leader: &Leader, proposers: usize, secs: f64, cap: u64, bytes: usize) -> Outcome {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let issued = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(proposers);
    for _ in 0..proposers {
        let leader = leader.clone();
        let issued = issued.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = new_hist();
            let mut errors = 0u64;
            let mut first_error = None;
            while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < cap {
                let data = vec![0x5a; bytes];
                let t = Instant::now();
                match leader.propose(data).await {
                    Ok(()) => {
                        let ns = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                        hist.saturating_record(ns.max(1));
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (hist, errors, first_error)
        }));
    }
    let mut hist = new_hist();
    let mut errors = 0;
    let mut first_error = None;
    for task in tasks {
        let (h, e, f) = task.await.expect("proposer task");
        hist.add(&h).expect("histograms merge");
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    Outcome {
        commits: hist.len(),
        hist,
        errors,
        first_error,
        elapsed: started.elapsed(),
    }
}

struct Settings {
    secs: f64,
    warmup: f64,
    commits: u64,
    /// Bytes of application data per entry.
    entry_bytes: usize,
    proposers: Vec<usize>,
    threads: usize,
    settle: f64,
    dir: PathBuf,
    filters: Vec<String>,
    smoke: bool,
    /// Ring size of the ringraft nodes; `None`: `NodeConfig::new`'s default.
    ring_capacity: Option<u64>,
}

fn settings() -> Settings {
    let env = |name: &str| std::env::var(name).ok();
    let mut secs = env("RINGRAFT_BENCH_SECS");
    let mut warmup = env("RINGRAFT_BENCH_WARMUP");
    let mut commits = env("RINGRAFT_BENCH_COMMITS");
    let mut entry_bytes = env("RINGRAFT_BENCH_ENTRY_BYTES");
    let mut proposers = env("RINGRAFT_BENCH_PROPOSERS");
    let mut threads = env("RINGRAFT_BENCH_THREADS");
    let mut dir = env("RINGRAFT_BENCH_DIR");
    let mut settle = env("RINGRAFT_BENCH_SETTLE");
    let mut filters = Vec::new();
    let mut bench = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            Some(
                args.next()
                    .unwrap_or_else(|| panic!("{name} needs a value")),
            )
        };
        match arg.as_str() {
            "--bench" => bench = true,
            "--secs" => secs = value("--secs"),
            "--warmup" => warmup = value("--warmup"),
            "--commits" => commits = value("--commits"),
            "--entry-bytes" => entry_bytes = value("--entry-bytes"),
            "--proposers" => proposers = value("--proposers"),
            "--threads" => threads = value("--threads"),
            "--dir" => dir = value("--dir"),
            "--settle" => settle = value("--settle"),
            // What libtest's harness would be given (cargo test).
            "--test" | "--nocapture" | "--quiet" | "-q" => {}
            other if other.starts_with("--") => panic!("unknown option {other}"),
            other => filters.push(other.to_string()),
        }
    }
    let parse_f64 = |v: Option<String>, default: f64| {
        v.map_or(default, |v| v.parse().expect("a number of seconds"))
    };
    let smoke = !bench;
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    Settings {
        secs: parse_f64(secs, if smoke { 0.15 } else { 10.0 }),
        warmup: parse_f64(warmup, if smoke { 0.05 } else { 2.0 }),
        commits: commits.map_or(5_000_000, |v| v.parse().expect("a count")),
        entry_bytes: entry_bytes.map_or(ENTRY_BYTES, |v| v.parse().expect("a number of bytes")),
        proposers: proposers
            .as_deref()
            .unwrap_or("1,64")
            .split(',')
            .map(|p| p.trim().parse().expect("a number of proposers"))
            .collect(),
        threads: threads.map_or(cpus, |v| v.parse().expect("a number of threads")),
        settle: parse_f64(settle, if smoke { 0.0 } else { 30.0 }),
        dir: dir.map(PathBuf::from).unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
                .join("bench-tmp")
        }),
        filters,
        smoke,
        ring_capacity: smoke.then_some(4 << 20),
    }
}

/// `v` with three significant figures.
fn sig3(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    if magnitude >= 2 {
        let unit = 10f64.powi(magnitude - 2);
        format!("{:.0}", (v / unit).round() * unit)
    } else {
        format!("{:.*}", (2 - magnitude) as usize, v)
    }
}

struct Row {
    system: System,
    proposers: usize,
    outcome: Outcome,
    cpu: CpuShare,
}

impl Row {
    /// CPU time this process (proposers and all three nodes) spent per
    /// commit during the measured seconds, µs: less sensitive than latency
    /// and throughput to what else runs on the machine.
    fn cpu_us_per_commit(&self) -> f64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let own_secs = self.cpu.own / 100.0 * cpus * self.outcome.elapsed.as_secs_f64();
        own_secs * 1e6 / self.outcome.commits.max(1) as f64
    }
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(io::stderr)
            .try_init();
    }
    let s = settings();
    std::fs::create_dir_all(&s.dir).expect("bench dir");
    let bench_dir = s.dir.canonicalize().expect("bench dir");
    let root = tempfile::Builder::new()
        .prefix("commit-")
        .tempdir_in(&bench_dir)
        .expect("bench data dir");
    let fs = file_system_of(root.path());
    let cases = cases(&s);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(s.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");

    eprintln!(
        "commit bench: {} cases, {} s warm-up + {} s (at most {} commits) each, {} B entries, \
         {} tokio worker threads, data under {}{}",
        cases.len(),
        s.warmup,
        s.secs,
        s.commits,
        s.entry_bytes,
        s.threads,
        root.path().display(),
        if s.smoke {
            " (smoke run: no --bench)"
        } else {
            ""
        }
    );
    let rows: Vec<Row> = cases
        .iter()
        .enumerate()
        .map(|(k, (system, proposers))| {
            let label = format!("{}/{proposers}", system.label());
            let dir = root
                .path()
                .join(format!("{k:02}-{}", label.replace('/', "-")));
            run_case(&runtime, &s, &label, &dir, *system, *proposers)
        })
        .collect();
    runtime.shutdown_timeout(Duration::from_secs(5));
    print_table(&s, fs, &rows);
}

/// The cases the settings select: every system at every proposer count,
/// kept when its label contains one of the filters (or there are none).
fn cases(s: &Settings) -> Vec<(System, usize)> {
    let mut systems = vec![System::Baseline];
    for tcp in [false, true] {
        for durability in [Durability::Memory, Durability::Fsync] {
            systems.push(System::Ringraft { tcp, durability });
        }
    }
    systems
        .iter()
        .flat_map(|sys| s.proposers.iter().map(move |p| (*sys, *p)))
        .filter(|(sys, p)| {
            let label = format!("{}/{p}", sys.label());
            s.filters.is_empty() || s.filters.iter().any(|f| label.contains(f.as_str()))
        })
        .collect()
}

/// One case on a fresh cluster in `dir`: settle, start, warm up, measure,
/// shut down, remove its data; reports its line on stderr.
fn run_case(
    runtime: &tokio::runtime::Runtime,
    s: &Settings,
    label: &str,
    dir: &Path,
    system: System,
    proposers: usize,
) -> Row {
    if s.settle > 0.0 {
        let (waited, share) = settle(Duration::from_secs_f64(s.settle), 10.0);
        if waited > Duration::from_secs(2) {
            eprintln!(
                "{label:>26}: waited {:.0} s for the machine to settle (others {:.0} %, steal {:.0} %)",
                waited.as_secs_f64(),
                share.others,
                share.steal
            );
        }
    }
    let (outcome, cpu) = runtime.block_on(async {
        let cluster = Cluster::start(system, dir, s.ring_capacity).await;
        let leader = cluster.leader().await;
        if s.warmup > 0.0 {
            let warm = drive(&leader, proposers, s.warmup, u64::MAX, s.entry_bytes).await;
            assert!(
                warm.commits > 0,
                "{label}: nothing committed in the warm-up: {:?}",
                warm.first_error
            );
        }
        let before = CpuSample::now();
        let outcome = drive(&leader, proposers, s.secs, s.commits, s.entry_bytes).await;
        let cpu = cpu_share(before, CpuSample::now());
        cluster.shutdown().await;
        (outcome, cpu)
    });
    // Each node's ring is in /dev/shm (the default): remove it with its
    // data directory.
    for id in 1..=3 {
        let _ = ringraft_wal::remove(&dir.join(format!("n{id}")));
    }
    let _ = std::fs::remove_dir_all(dir);
    report_case(label, &outcome, &cpu);
    assert!(outcome.commits > 0, "{label}: nothing committed");
    Row {
        system,
        proposers,
        outcome,
        cpu,
    }
}

/// A case's line on stderr.
fn report_case(label: &str, outcome: &Outcome, cpu: &CpuShare) {
    eprintln!(
        "{label:>26}: {:>8} commits in {:.2} s, p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs, \
         {} commits/s, {} errors{}; CPU: bench {:.0} %, others {:.0} %, steal {:.0} %",
        outcome.commits,
        outcome.elapsed.as_secs_f64(),
        sig3(outcome.p_us(0.5)),
        sig3(outcome.p_us(0.99)),
        sig3(outcome.p_us(0.999)),
        sig3(outcome.hist.max() as f64 / 1000.0),
        sig3(outcome.throughput()),
        outcome.errors,
        outcome
            .first_error
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        cpu.own,
        cpu.others,
        cpu.steal,
    );
}

/// The table on stdout: every row beside the baseline at the same number
/// of proposers, then the failed proposals.
fn print_table(s: &Settings, fs: Option<(String, String, String)>, rows: &[Row]) {
    println!();
    println!(
        "3-node cluster in one process, {} B entries; {} CPUs, {} tokio worker \
         threads; data dirs on {}; {} s warm-up, {} s measured per row",
        s.entry_bytes,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        s.threads,
        fs.map(|(kind, device, point)| format!("{kind} ({device} at {point})"))
            .unwrap_or_else(|| "an unknown file system".into()),
        s.warmup,
        s.secs,
    );
    println!();
    println!(
        "| system | fabric | durability | proposers | p50 µs | p99 µs | commits/s \
         | p50 ÷ baseline | p99 ÷ baseline | commits/s ÷ baseline | CPU µs/commit \
         | CPU µs/commit ÷ baseline | CPU: bench % | CPU: others % |"
    );
    println!("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        print_row(row, rows);
    }
    println!();
    println!(
        "CPU columns: share of all {} CPUs during the measured seconds, used by this process \
         and by everything else (other processes and hypervisor steal); CPU µs/commit: this \
         process's CPU time (proposers and all three nodes) over its commits.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    for row in rows.iter().filter(|r| r.outcome.errors > 0) {
        println!(
            "{}/{}: {} proposals failed during the measured seconds (not counted; first: {})",
            row.system.label(),
            row.proposers,
            row.outcome.errors,
            row.outcome.first_error.as_deref().unwrap_or("?"),
        );
    }
}

/// One row of the table, with its ratios to the baseline's row.
fn print_row(row: &Row, rows: &[Row]) {
    let base = rows
        .iter()
        .find(|b| b.system == System::Baseline && b.proposers == row.proposers);
    let ratio = |f: &dyn Fn(&Row) -> f64| base.map_or("–".to_string(), |b| sig3(f(row) / f(b)));
    let (system, fabric, durability) = match row.system {
        System::Ringraft { tcp, durability } => (
            "ringraft",
            if tcp { "tcp (loopback)" } else { "inproc" },
            durability_name(durability),
        ),
        System::Baseline => ("openraft baseline", "direct calls", "memory (BTreeMap)"),
    };
    println!(
        "| {system} | {fabric} | {durability} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |",
        row.proposers,
        sig3(row.outcome.p_us(0.5)),
        sig3(row.outcome.p_us(0.99)),
        sig3(row.outcome.throughput()),
        ratio(&|r| r.outcome.p_us(0.5)),
        ratio(&|r| r.outcome.p_us(0.99)),
        ratio(&|r| r.outcome.throughput()),
        sig3(row.cpu_us_per_commit()),
        ratio(&|r| r.cpu_us_per_commit()),
        row.cpu.own,
        row.cpu.others + row.cpu.steal,
    );
}
