//! `ringraft-lab-node`: one ringraft [`Node`] per Soft-RoCE lab guest, and
//! the host-side driver that walks a cluster of them through a scenario
//! step by step (`deploy/softroce-vm/run-tests.sh`, test
//! `multi3_stale_leader`).
//!
//! **`node`** runs one member: fabric `rdma` (device `rxe0` unless told
//! otherwise; `tcp` to try the binary on one host), a fresh data directory,
//! a state machine that records what it applied ([`Recorder`]), and a
//! control port speaking a plain TCP line protocol: one request line, one
//! answer line, several requests per connection allowed.
//!
//! | request          | answer                                                         |
//! |------------------|----------------------------------------------------------------|
//! | `ping`           | `pong`                                                         |
//! | `status`         | JSON [`NodeStatus`]                                            |
//! | `propose <text>` | `ok <index>` once committed and applied, or `err <why>`        |
//! | `applied`        | JSON `[[index, "text"], ...]`: what the state machine applied  |
//! | `log`            | JSON [`RingLog`]: every entry in the ring, as the ring reads it |
//! | `metrics`        | JSON [`NodeMetrics`]: data-plane counters, rkey rotations, the device's counters |
//! | `transfer <id>`  | `ok` or `err <why>` (leadership handed to `<id>`)              |
//! | `freeze <delay_ms> <proposals>` | once `<proposals>` proposals are pending (bounded wait): `ok ...`, then the process SIGSTOPs itself `<delay_ms>` later |
//! | `quit`           | `ok`, then the node shuts down and the process exits           |
//!
//! **`driver`** runs on the host and talks to the nodes' control ports; each
//! subcommand is one step a bash scenario calls (`wait-leader`, `transfer`,
//! `propose`, `wait-applied`, `check`, ...). Every wait is bounded; every
//! request has a timeout, so a frozen (SIGSTOPped) node stalls a step for a
//! bounded time only.
//!
//! `freeze` is how a scenario stops a leader "mid-batch": the proposals are
//! in, their WRITEs are being posted, and the whole process (every thread)
//! stops `<delay_ms>` later, before any of its own reply timeouts (one
//! heartbeat interval) can fire and tear the queue pairs down. Only a
//! `SIGCONT` from outside (`kill -CONT`) resumes it. A stop fired from the
//! host through the guest agent took 0.3-0.5 s under TCG, too late.
//!
//! The control port is for a lab: it has no authentication; bind it to the
//! lab's private bridge only.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use ringraft::{Durability, Fabric, Node, NodeBuilder, NodeConfig, NodeError};
use ringraft_testkit::inproc::{AppliedLog, Recorder, SECRET};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Largest request line the control port accepts, in bytes.
const MAX_REQUEST_BYTES: u64 = 64 << 10;
/// Largest answer line the driver accepts, in bytes.
const MAX_ANSWER_BYTES: u64 = 64 << 20;
/// Ring data area of a lab node, in bytes.
const RING_CAPACITY_BYTES: u64 = 8 << 20;
/// Largest record payload of a lab node, in bytes.
const MAX_RECORD_BYTES: u64 = 64 << 10;
/// How long a node waits for its own graceful shutdown.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed to open a control connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two polls of the nodes' statuses.
const POLL_PERIOD: Duration = Duration::from_millis(200);
/// Pause before a proposal is retried (another leader, no leader yet).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Pause between two leader-transfer requests.
const TRANSFER_RETRY_PERIOD: Duration = Duration::from_secs(5);
/// How long `freeze` waits for the proposals it is told to expect.
const FREEZE_WAIT: Duration = Duration::from_secs(10);
/// Longest `freeze` delay accepted, ms.
const MAX_FREEZE_DELAY_MS: u64 = 10_000;

#[derive(Parser)]
#[command(
    name = "ringraft-lab-node",
    about = "A ringraft node with a control port, and the host-side driver of lab scenarios"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one node (in a lab guest).
    Node(NodeArgs),
    /// Drive the nodes through their control ports (on the host).
    Driver(DriverArgs),
}

#[derive(Args)]
struct NodeArgs {
    /// This node's id.
    #[arg(long)]
    id: u64,
    /// Every member as `id=host:port` (the Raft and fabric address),
    /// comma-separated, this node included.
    #[arg(long)]
    peers: String,
    /// Address of the control port.
    #[arg(long, default_value = "0.0.0.0:7200")]
    control: String,
    /// `rdma` or `tcp`.
    #[arg(long, default_value = "rdma")]
    fabric: String,
    /// RDMA device.
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// Parent of the data directory (on guest tmpfs); `node<id>` inside it
    /// is wiped at start: every run is a fresh cluster.
    #[arg(long, default_value = "/tmp/ringraft-lab")]
    data_dir: PathBuf,
    /// Initialize the cluster with the peers as voters (on one node).
    #[arg(long)]
    initialize: bool,
    /// Queue pairs: local ACK timeout exponent (4.096 µs × 2^exp per try).
    #[arg(long, default_value_t = 18)]
    ack_timeout_exp: u8,
    /// Queue pairs: transport retries (at most 6: rxe retries forever at 7).
    #[arg(long, default_value_t = 6)]
    retry_count: u8,
    /// Queue pairs: largest two-sided message, KiB. Every connection
    /// registers `max(recv_depth, 16)` receive buffers of this size; the
    /// library's default (1 MiB × 64) is heavy for 1 GiB lab guests under
    /// TCG, and the lab's messages are small.
    #[arg(long, default_value_t = 64)]
    max_message_kib: u32,
    /// Queue pairs: receive buffers posted per connection.
    #[arg(long, default_value_t = 16)]
    recv_depth: u32,
    /// Queue pairs: posted, uncompleted work requests at most.
    #[arg(long, default_value_t = 64)]
    max_outstanding: u32,
    /// Raft heartbeat interval, ms (also openraft's per-RPC timeout).
    #[arg(long, default_value_t = 300)]
    heartbeat_ms: u64,
    /// Election timeout, lower bound, ms.
    #[arg(long, default_value_t = 1000)]
    election_min_ms: u64,
    /// Election timeout, upper bound, ms.
    #[arg(long, default_value_t = 2000)]
    election_max_ms: u64,
    /// How long a `propose` may wait for its commit, seconds.
    #[arg(long, default_value_t = 30)]
    propose_timeout_s: u64,
    /// Write this process's id here once the node runs.
    #[arg(long)]
    pid_file: Option<PathBuf>,
}

#[derive(Args)]
struct DriverArgs {
    /// Every node's control port as `id=host:port`, comma-separated.
    #[arg(long)]
    nodes: String,
    /// Timeout of one control request other than a proposal, ms.
    #[arg(long, default_value_t = 3000)]
    io_timeout_ms: u64,
    #[command(subcommand)]
    step: Step,
}

#[derive(Subcommand)]
enum Step {
    /// Print every node's status (or why it did not answer).
    Status,
    /// Print every node's metrics.
    Metrics,
    /// Wait until the nodes of `--among` agree on a leader that is one of
    /// them and says it leads; print `leader <id> term <term>`.
    WaitLeader {
        /// Only these nodes (comma-separated ids); default all.
        #[arg(long)]
        among: Option<String>,
        /// Require this leader.
        #[arg(long)]
        is: Option<u64>,
        /// Require a leader other than this one.
        #[arg(long)]
        not: Option<u64>,
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
    },
    /// Hand leadership to `--to` (asking the current leader, again every few
    /// seconds) and wait until every node agrees.
    Transfer {
        #[arg(long)]
        to: u64,
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
    },
    /// Propose `--count` values `<prefix>-<k>`. Without `--to`, each goes
    /// to whoever leads among `--among`, retried on failure under a fresh
    /// name (`<prefix>-<k>.r<attempt>`: a failed attempt may still commit,
    /// and a value must never be applied twice). With `--to`, each value is
    /// sent once to that node, whatever happens.
    Propose {
        #[arg(long)]
        count: usize,
        #[arg(long)]
        to: Option<u64>,
        /// Only lead through these nodes (comma-separated ids); default all.
        #[arg(long)]
        among: Option<String>,
        #[arg(long, default_value = "v")]
        prefix: String,
        /// Proposals in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Exit 0 even if some values were not acknowledged.
        #[arg(long)]
        tolerate_failures: bool,
        /// Append every acknowledged value here, one per line, as acked.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Append every value here, one per line, before it is sent.
        #[arg(long)]
        sent_out: Option<PathBuf>,
        /// Time allowed for one proposal's answer, seconds.
        #[arg(long, default_value_t = 40)]
        request_timeout_s: u64,
        /// Time allowed for the whole step, seconds.
        #[arg(long, default_value_t = 120)]
        timeout_s: u64,
    },
    /// Wait until the nodes of `--among` answer, agree on a leader, and hold
    /// the same last log index and applied index (twice in a row); print it.
    WaitApplied {
        #[arg(long)]
        among: Option<String>,
        #[arg(long, default_value_t = 60)]
        timeout_s: u64,
    },
    /// Make node `--id` SIGSTOP itself `--delay-ms` after at least
    /// `--proposals` proposals are pending on it (see `freeze` above).
    Freeze {
        #[arg(long)]
        id: u64,
        #[arg(long, default_value_t = 100)]
        delay_ms: u64,
        #[arg(long, default_value_t = 1)]
        proposals: usize,
    },
    /// The safety checks after a scenario (see [`check`]).
    Check(CheckArgs),
    /// Ask every node to quit.
    Quit,
}

#[derive(Args)]
struct CheckArgs {
    /// Files of acknowledged values (one per line); every one must be
    /// applied exactly once on every node.
    #[arg(long)]
    acked: Vec<PathBuf>,
    /// Values proposed to the old leader while it was cut off (one per line).
    #[arg(long)]
    stale_sent: Option<PathBuf>,
    /// The old leader: it must end up a follower of another leader.
    #[arg(long)]
    old_leader: Option<u64>,
    /// The old leader's term: no ring may hold a stale value in a term up
    /// to it, nor an entry of that term after an entry of a later term.
    #[arg(long)]
    old_term: Option<u64>,
    /// Fail unless the old leader saw a WRITE refused by a follower's NIC
    /// (its `fenced_writes` counter).
    #[arg(long)]
    require_fenced_writes: bool,
    /// Time allowed for the nodes to converge, seconds.
    #[arg(long, default_value_t = 60)]
    timeout_s: u64,
}

// ------------------------------------------------------------ wire types

/// A node's answer to `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct NodeStatus {
    id: u64,
    /// openraft's server state (`Leader`, `Follower`, `Candidate`, `Learner`).
    state: String,
    leader: Option<u64>,
    term: u64,
    last_log_index: Option<u64>,
    commit: Option<u64>,
    applied: Option<u64>,
    /// The ring's fence: the term and leader of the epoch that may write.
    fence_term: u64,
    fence_leader: u64,
}

/// One entry of a node's ring, as the ring reads it (CRC and header checked).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RingEntry {
    index: u64,
    term: u64,
    /// The writer's epoch recorded in the record.
    epoch_term: u64,
    epoch_leader: u64,
    /// `normal`, `blank`, `membership`, or `unreadable`.
    kind: String,
    /// A normal entry's command, as text.
    data: Option<String>,
    /// Why the record could not be read or decoded.
    error: Option<String>,
}

/// A node's answer to `log`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RingLog {
    first_index: u64,
    next_index: u64,
    entries: Vec<RingEntry>,
}

/// A node's answer to `metrics`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeMetrics {
    proposals: u64,
    fence_changes: u64,
    rejected_records: u64,
    /// One-sided WRITEs of this node that a follower's NIC refused.
    fenced_writes: u64,
    bytes_written: u64,
    rkey_rotations: u64,
    fence_term: u64,
    fence_leader: u64,
    /// The device's counters (rxe: `hw_counters/*` and `counters/*`).
    device_counters: BTreeMap<String, u64>,
}

fn parse_members(list: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut members = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not id=host:port"))?;
        let id: u64 = id.parse().map_err(|e| format!("bad id in {item:?}: {e}"))?;
        if members.insert(id, addr.to_string()).is_some() {
            return Err(format!("id {id} appears twice"));
        }
    }
    if members.is_empty() {
        return Err("no members".into());
    }
    Ok(members)
}

fn parse_ids(list: &str) -> Result<Vec<u64>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e| format!("bad id {s:?}: {e}")))
        .collect()
}

/// Keeps an answer on one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node(args) => run_node(args),
        Command::Driver(args) => run_driver(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringraft-lab-node: {e}");
            ExitCode::FAILURE
        }
    }
}

// ------------------------------------------------------------------ node

struct NodeCtx {
    node: Node,
    applied: Arc<Mutex<AppliedLog>>,
    propose_timeout: Duration,
    quit: tokio::sync::Notify,
    /// `propose` requests being served now.
    pending_proposals: AtomicUsize,
    /// Wakes `freeze` waiters when a proposal starts.
    proposal_started: tokio::sync::Notify,
}

fn run_node(args: NodeArgs) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,ringraft=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(node_main(args))
}

async fn node_main(args: NodeArgs) -> Result<(), String> {
    let peers = parse_members(&args.peers)?;
    let listen = peers
        .get(&args.id)
        .ok_or_else(|| format!("node {} is not in --peers", args.id))?
        .clone();
    let fabric = match args.fabric.as_str() {
        "rdma" => Fabric::Rdma {
            device: Some(args.device.clone()),
        },
        "tcp" => Fabric::Tcp,
        other => return Err(format!("unknown fabric {other:?} (rdma or tcp)")),
    };
    let data_dir = args.data_dir.join(format!("node{}", args.id));
    match std::fs::remove_dir_all(&data_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("wiping {}: {e}", data_dir.display())),
    }
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;

    let mut config = NodeConfig::new(args.id, &data_dir, listen);
    config.peers = peers;
    config.durability = Durability::Memory;
    config.ring_capacity = RING_CAPACITY_BYTES;
    config.max_record_bytes = MAX_RECORD_BYTES;
    config.lock_memory = false;
    config.heartbeat_ms = args.heartbeat_ms;
    config.election_timeout_ms = (args.election_min_ms, args.election_max_ms);
    config.conn.retry_count = args.retry_count;
    config.conn.rnr_retry = args.retry_count;
    config.conn.ack_timeout_exp = args.ack_timeout_exp;
    config.conn.max_message_bytes = args.max_message_kib.saturating_mul(1024);
    config.conn.recv_depth = args.recv_depth;
    config.conn.max_outstanding = args.max_outstanding;
    tracing::info!(
        id = args.id,
        fabric = %args.fabric,
        retry_count = config.conn.retry_count,
        ack_timeout_exp = config.conn.ack_timeout_exp,
        retry_window = ?config.conn.retry_window(),
        max_message_bytes = config.conn.max_message_bytes,
        recv_depth = config.conn.recv_depth,
        heartbeat_ms = config.heartbeat_ms,
        election_timeout_ms = ?config.election_timeout_ms,
        "lab node starting"
    );

    let recorder = Recorder::default();
    let applied = recorder.log.clone();
    let node = NodeBuilder::new(config)
        .fabric(fabric)
        .secret(SECRET.to_vec())
        .state_machine(recorder)
        .start()
        .await
        .map_err(|e| format!("starting node {}: {e}", args.id))?;
    let listener = tokio::net::TcpListener::bind(&args.control)
        .await
        .map_err(|e| format!("control port {}: {e}", args.control))?;
    if args.initialize {
        node.initialize()
            .await
            .map_err(|e| format!("initialize: {e}"))?;
    }
    if let Some(path) = &args.pid_file {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| format!("pid file {}: {e}", path.display()))?;
    }
    tracing::info!(id = args.id, control = %args.control, "lab node ready");

    let ctx = Arc::new(NodeCtx {
        node: node.clone(),
        applied,
        propose_timeout: Duration::from_secs(args.propose_timeout_s),
        quit: tokio::sync::Notify::new(),
        pending_proposals: AtomicUsize::new(0),
        proposal_started: tokio::sync::Notify::new(),
    });
    let server = tokio::spawn(serve_control(listener, ctx.clone()));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    tokio::select! {
        _ = ctx.quit.notified() => tracing::info!("quit requested"),
        _ = terminate.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
    server.abort();
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, node.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown timed out");
    }
    Ok(())
}

async fn serve_control(listener: tokio::net::TcpListener, ctx: Arc<NodeCtx>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_client(stream, ctx.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_client(stream: tokio::net::TcpStream, ctx: Arc<NodeCtx>) {
    let (read, mut write) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        let n = match (&mut reader)
            .take(MAX_REQUEST_BYTES)
            .read_line(&mut line)
            .await
        {
            Ok(n) => n,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        if !line.ends_with('\n') && n as u64 >= MAX_REQUEST_BYTES {
            let _ = write.write_all(b"err request line too long\n").await;
            return;
        }
        let request = line.trim_end();
        let quit = request == "quit";
        let (mut answer, stop_in) = match request.strip_prefix("freeze ") {
            Some(args) => match freeze(args, &ctx).await {
                Ok((answer, delay)) => (answer, Some(delay)),
                Err(e) => (format!("err {e}"), None),
            },
            None => (answer(request, &ctx).await, None),
        };
        answer.push('\n');
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if let Some(delay) = stop_in {
            let _ = write.flush().await;
            stop_self_after(delay);
        }
        if quit {
            let _ = write.flush().await;
            ctx.quit.notify_one();
            return;
        }
    }
}

/// `freeze <delay_ms> <proposals>`: waits (bounded) until `<proposals>`
/// proposals are pending; returns the answer and the delay before the stop.
async fn freeze(args: &str, ctx: &NodeCtx) -> Result<(String, Duration), String> {
    let mut words = args.split_whitespace();
    let (Some(delay), Some(want), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!(
            "usage: freeze <delay_ms> <proposals>, got {args:?}"
        ));
    };
    let delay_ms: u64 = delay
        .parse()
        .map_err(|e| format!("bad delay {delay:?}: {e}"))?;
    if delay_ms > MAX_FREEZE_DELAY_MS {
        return Err(format!(
            "delay {delay_ms} ms is above {MAX_FREEZE_DELAY_MS}"
        ));
    }
    let want: usize = want
        .parse()
        .map_err(|e| format!("bad proposal count {want:?}: {e}"))?;
    let deadline = tokio::time::Instant::now() + FREEZE_WAIT;
    loop {
        // Registered before the count is read: no start is missed.
        let started = ctx.proposal_started.notified();
        let pending = ctx.pending_proposals.load(Ordering::SeqCst);
        if pending >= want {
            tracing::info!(pending, delay_ms, "freeze: stopping this process");
            return Ok((
                format!(
                    "ok pid {} stops in {delay_ms} ms, {pending} proposals pending",
                    std::process::id()
                ),
                Duration::from_millis(delay_ms),
            ));
        }
        if tokio::time::timeout_at(deadline, started).await.is_err() {
            return Err(format!(
                "only {pending} of {want} proposals pending after {}s",
                FREEZE_WAIT.as_secs()
            ));
        }
    }
}

/// SIGSTOPs this whole process after `delay`, from a plain thread (not a
/// runtime task: it must not wait behind busy workers).
fn stop_self_after(delay: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SAFETY: kill(2) with this process's own id and a valid signal
        // number; it touches no memory of ours.
        let rc = unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "SIGSTOP to self failed");
        }
    });
}

/// Counts a `propose` request as pending while it is served.
struct PendingProposal<'a>(&'a NodeCtx);

impl<'a> PendingProposal<'a> {
    fn start(ctx: &'a NodeCtx) -> Self {
        ctx.pending_proposals.fetch_add(1, Ordering::SeqCst);
        ctx.proposal_started.notify_waiters();
        PendingProposal(ctx)
    }
}

impl Drop for PendingProposal<'_> {
    fn drop(&mut self) {
        self.0.pending_proposals.fetch_sub(1, Ordering::SeqCst);
    }
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("err json: {e}"))
}

async fn answer(request: &str, ctx: &NodeCtx) -> String {
    let (verb, rest) = request.split_once(' ').unwrap_or((request, ""));
    match verb {
        "ping" => "pong".into(),
        "status" => json(&node_status(&ctx.node)),
        "propose" if !rest.is_empty() => {
            let _pending = PendingProposal::start(ctx);
            let proposal = ctx.node.propose(rest.as_bytes().to_vec());
            match tokio::time::timeout(ctx.propose_timeout, proposal).await {
                Ok(Ok((index, _))) => format!("ok {index}"),
                Ok(Err(NodeError::NotLeader { leader_id, .. })) => format!(
                    "err not-leader {}",
                    leader_id.map_or_else(|| "none".to_string(), |l| l.to_string())
                ),
                Ok(Err(e)) => format!("err {}", one_line(&e.to_string())),
                Err(_) => "err timeout".into(),
            }
        }
        "applied" => {
            let entries: Vec<(u64, String)> = ctx
                .applied
                .lock()
                .map(|log| {
                    log.entries
                        .iter()
                        .map(|(i, d)| (*i, String::from_utf8_lossy(d).into_owned()))
                        .collect()
                })
                .unwrap_or_default();
            json(&entries)
        }
        "log" => json(&ring_log(&ctx.node)),
        "metrics" => json(&node_metrics(&ctx.node)),
        "transfer" => match rest.parse::<u64>() {
            Ok(to) => match ctx.node.transfer_leader(to).await {
                Ok(()) => "ok".into(),
                Err(e) => format!("err {}", one_line(&e.to_string())),
            },
            Err(e) => format!("err bad id {rest:?}: {e}"),
        },
        "quit" => "ok".into(),
        _ => format!("err unknown request {:?}", one_line(request)),
    }
}

fn node_status(node: &Node) -> NodeStatus {
    let s = node.status();
    let fence = node.log_store().fence();
    NodeStatus {
        id: s.id,
        state: s.state,
        leader: s.leader_id,
        term: s.term,
        last_log_index: s.last_log_index,
        commit: s.commit_index,
        applied: s.applied_index,
        fence_term: fence.term(),
        fence_leader: fence.leader_id(),
    }
}

/// Reads every entry of the ring (the node's log) through the ring's own
/// checks (header, CRC, index, term).
fn ring_log(node: &Node) -> RingLog {
    node.log_store().with_wal(|wal| {
        let ring = wal.ring();
        let (first_index, next_index) = (ring.first_index(), ring.next_index());
        let entries = (first_index..next_index)
            .map(|index| match ring.read(index) {
                Ok(view) => {
                    let mut entry = RingEntry {
                        index,
                        term: view.term,
                        epoch_term: view.epoch.term(),
                        epoch_leader: view.epoch.leader_id(),
                        kind: String::new(),
                        data: None,
                        error: None,
                    };
                    match ringraft::log_store::decode_entry(view.term, view.index, view.payload) {
                        Ok(e) => match e.payload {
                            openraft::EntryPayload::Blank => entry.kind = "blank".into(),
                            openraft::EntryPayload::Normal(command) => {
                                entry.kind = "normal".into();
                                entry.data =
                                    Some(String::from_utf8_lossy(&command.data).into_owned());
                            }
                            openraft::EntryPayload::Membership(_) => {
                                entry.kind = "membership".into()
                            }
                        },
                        Err(e) => {
                            entry.kind = "unreadable".into();
                            entry.error = Some(e.to_string());
                        }
                    }
                    entry
                }
                Err(e) => RingEntry {
                    index,
                    term: ring.term_of(index).unwrap_or(0),
                    epoch_term: 0,
                    epoch_leader: 0,
                    kind: "unreadable".into(),
                    data: None,
                    error: Some(e.to_string()),
                },
            })
            .collect();
        RingLog {
            first_index,
            next_index,
            entries,
        }
    })
}

fn node_metrics(node: &Node) -> NodeMetrics {
    let m = node.metrics();
    let fence = node.log_store().fence();
    NodeMetrics {
        proposals: m.proposals.get(),
        fence_changes: m.fence_changes.get(),
        rejected_records: m.rejected_records.get(),
        fenced_writes: m.fenced_writes.get(),
        bytes_written: m.bytes_written.get(),
        rkey_rotations: node.rkey_rotations(),
        fence_term: fence.term(),
        fence_leader: fence.leader_id(),
        device_counters: node.device().counters().into_iter().collect(),
    }
}

// ---------------------------------------------------------------- driver

/// The nodes' control ports.
struct Control {
    nodes: BTreeMap<u64, String>,
    io_timeout: Duration,
}

impl Control {
    fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    fn among(&self, list: Option<&str>) -> Result<Vec<u64>, String> {
        let ids = match list {
            Some(list) => parse_ids(list)?,
            None => return Ok(self.ids()),
        };
        for id in &ids {
            if !self.nodes.contains_key(id) {
                return Err(format!("node {id} is not in --nodes"));
            }
        }
        Ok(ids)
    }

    /// One request to node `id`, answered within `timeout`.
    fn request(&self, id: u64, line: &str, timeout: Duration) -> Result<String, String> {
        let addr = self.nodes.get(&id).ok_or_else(|| format!("no node {id}"))?;
        let sockaddr: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|e| format!("node {id} at {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("node {id}: {addr} resolves to nothing"))?;
        let mut stream = TcpStream::connect_timeout(&sockaddr, CONNECT_TIMEOUT.min(timeout))
            .map_err(|e| format!("node {id} at {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|e| format!("node {id}: {e}"))?;
        stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("node {id}: sending: {e}"))?;
        let mut answer = String::new();
        BufReader::new(stream.take(MAX_ANSWER_BYTES))
            .read_line(&mut answer)
            .map_err(|e| format!("node {id}: no answer to {:?}: {e}", verb_of(line)))?;
        if !answer.ends_with('\n') {
            return Err(format!(
                "node {id}: incomplete answer to {:?}",
                verb_of(line)
            ));
        }
        answer.truncate(answer.trim_end().len());
        Ok(answer)
    }

    fn request_json<T: for<'de> Deserialize<'de>>(&self, id: u64, line: &str) -> Result<T, String> {
        let answer = self.request(id, line, self.io_timeout)?;
        serde_json::from_str(&answer).map_err(|e| {
            format!(
                "node {id}: bad answer to {line:?}: {e}: {}",
                answer.chars().take(200).collect::<String>()
            )
        })
    }

    fn status(&self, id: u64) -> Result<NodeStatus, String> {
        self.request_json(id, "status")
    }

    /// Every node's status, asked in parallel (a frozen node costs one
    /// timeout, not one per node).
    fn statuses(&self, ids: &[u64]) -> BTreeMap<u64, Result<NodeStatus, String>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| (*id, scope.spawn(move || self.status(*id))))
                .collect();
            handles
                .into_iter()
                .map(|(id, h)| {
                    (
                        id,
                        h.join()
                            .unwrap_or_else(|_| Err("status thread panicked".into())),
                    )
                })
                .collect()
        })
    }

    /// The leader the nodes of `among` agree on, if they all answer, all
    /// name the same leader, it is one of them and it says it leads.
    fn agreed_leader(&self, among: &[u64]) -> Option<(u64, u64)> {
        let statuses = self.statuses(among);
        let mut leaders = statuses
            .values()
            .map(|s| s.as_ref().ok().and_then(|s| s.leader));
        let first = leaders.next()??;
        if !leaders.all(|l| l == Some(first)) || !among.contains(&first) {
            return None;
        }
        match &statuses[&first] {
            Ok(s) if s.state == "Leader" => Some((first, s.term)),
            _ => None,
        }
    }

    /// A node of `among` that says it leads (the highest term wins).
    fn some_leader(&self, among: &[u64]) -> Option<u64> {
        self.statuses(among)
            .into_iter()
            .filter_map(|(id, s)| s.ok().filter(|s| s.state == "Leader").map(|s| (s.term, id)))
            .max()
            .map(|(_, id)| id)
    }
}

fn verb_of(line: &str) -> &str {
    line.split(' ').next().unwrap_or(line)
}

fn print_statuses(control: &Control, ids: &[u64]) {
    for (id, s) in control.statuses(ids) {
        match s {
            Ok(s) => println!("node {id}: {}", json(&s)),
            Err(e) => println!("node {id}: unreachable: {e}"),
        }
    }
}

fn run_driver(args: DriverArgs) -> Result<(), String> {
    let control = Control {
        nodes: parse_members(&args.nodes)?,
        io_timeout: Duration::from_millis(args.io_timeout_ms),
    };
    let all = control.ids();
    match args.step {
        Step::Status => {
            print_statuses(&control, &all);
            Ok(())
        }
        Step::Metrics => {
            for id in &all {
                match control.request(*id, "metrics", control.io_timeout) {
                    Ok(m) => println!("node {id}: {m}"),
                    Err(e) => println!("node {id}: unreachable: {e}"),
                }
            }
            Ok(())
        }
        Step::WaitLeader {
            among,
            is,
            not,
            timeout_s,
        } => {
            let among = control.among(among.as_deref())?;
            let deadline = Instant::now() + Duration::from_secs(timeout_s);
            loop {
                if let Some((leader, term)) = control.agreed_leader(&among)
                    && is.is_none_or(|want| want == leader)
                    && not.is_none_or(|avoid| avoid != leader)
                {
                    println!("leader {leader} term {term}");
                    return Ok(());
                }
                if Instant::now() > deadline {
                    print_statuses(&control, &among);
                    return Err(format!(
                        "no agreed leader among {among:?} (is {is:?}, not {not:?}) after {timeout_s}s"
                    ));
                }
                std::thread::sleep(POLL_PERIOD);
            }
        }
        Step::Transfer { to, timeout_s } => transfer(&control, to, timeout_s),
        Step::Propose {
            count,
            to,
            among,
            prefix,
            concurrency,
            tolerate_failures,
            out,
            sent_out,
            request_timeout_s,
            timeout_s,
        } => {
            let plan = ProposePlan {
                count,
                to,
                among: control.among(among.as_deref())?,
                prefix,
                concurrency: concurrency.max(1),
                request_timeout: Duration::from_secs(request_timeout_s),
                deadline: Instant::now() + Duration::from_secs(timeout_s),
                out: open_append(out.as_deref())?,
                sent_out: open_append(sent_out.as_deref())?,
            };
            let started = Instant::now();
            let acked = propose(&control, &plan);
            println!(
                "acked {acked}/{count} values with prefix {:?} in {:.1}s",
                plan.prefix,
                started.elapsed().as_secs_f64()
            );
            if acked < count && !tolerate_failures {
                return Err(format!("only {acked} of {count} values acknowledged"));
            }
            Ok(())
        }
        Step::WaitApplied { among, timeout_s } => {
            let among = control.among(among.as_deref())?;
            let index = wait_converged(&control, &among, Duration::from_secs(timeout_s))?;
            println!("applied {index:?}");
            Ok(())
        }
        Step::Freeze {
            id,
            delay_ms,
            proposals,
        } => {
            let answer = control.request(
                id,
                &format!("freeze {delay_ms} {proposals}"),
                FREEZE_WAIT + control.io_timeout,
            )?;
            println!("node {id}: {answer}");
            if answer.starts_with("ok") {
                Ok(())
            } else {
                Err(format!("node {id} did not arm the freeze: {answer}"))
            }
        }
        Step::Check(check_args) => check(&control, &check_args),
        Step::Quit => {
            for id in &all {
                match control.request(*id, "quit", control.io_timeout) {
                    Ok(a) => println!("node {id}: {a}"),
                    Err(e) => println!("node {id}: {e}"),
                }
            }
            Ok(())
        }
    }
}

fn transfer(control: &Control, to: u64, timeout_s: u64) -> Result<(), String> {
    let all = control.ids();
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    let mut last_request: Option<Instant> = None;
    loop {
        match control.agreed_leader(&all) {
            Some((leader, term)) if leader == to => {
                println!("leader {leader} term {term}");
                return Ok(());
            }
            Some((leader, _))
                if last_request.is_none_or(|t| t.elapsed() > TRANSFER_RETRY_PERIOD) =>
            {
                last_request = Some(Instant::now());
                match control.request(leader, &format!("transfer {to}"), control.io_timeout) {
                    Ok(a) => println!("asked node {leader} to hand leadership to {to}: {a}"),
                    Err(e) => println!("asking node {leader} to transfer: {e}"),
                }
            }
            _ => {}
        }
        if Instant::now() > deadline {
            print_statuses(control, &all);
            return Err(format!("node {to} did not become leader in {timeout_s}s"));
        }
        std::thread::sleep(POLL_PERIOD);
    }
}

fn open_append(path: Option<&Path>) -> Result<Option<Mutex<File>>, String> {
    path.map(|p| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map(Mutex::new)
            .map_err(|e| format!("{}: {e}", p.display()))
    })
    .transpose()
}

fn record(file: &Option<Mutex<File>>, value: &str) {
    if let Some(file) = file
        && let Ok(mut f) = file.lock()
        && let Err(e) = writeln!(f, "{value}").and_then(|()| f.flush())
    {
        eprintln!("recording {value:?}: {e}");
    }
}

struct ProposePlan {
    count: usize,
    to: Option<u64>,
    among: Vec<u64>,
    prefix: String,
    concurrency: usize,
    request_timeout: Duration,
    deadline: Instant,
    out: Option<Mutex<File>>,
    sent_out: Option<Mutex<File>>,
}

/// Proposes the plan's values from `concurrency` threads; returns how many
/// were acknowledged.
fn propose(control: &Control, plan: &ProposePlan) -> usize {
    let next = AtomicUsize::new(0);
    let acked = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..plan.concurrency {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= plan.count || Instant::now() > plan.deadline {
                        return;
                    }
                    if propose_one(control, plan, k) {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    acked.into_inner()
}

/// Proposes value `k` of the plan; true once acknowledged.
fn propose_one(control: &Control, plan: &ProposePlan, k: usize) -> bool {
    let base = format!("{}-{k}", plan.prefix);
    for attempt in 0.. {
        let value = if attempt == 0 {
            base.clone()
        } else {
            format!("{base}.r{attempt}")
        };
        let target = match plan.to {
            Some(to) => Some(to),
            None => control.some_leader(&plan.among),
        };
        if let Some(target) = target {
            record(&plan.sent_out, &value);
            match control.request(target, &format!("propose {value}"), plan.request_timeout) {
                Ok(answer) if answer.starts_with("ok ") => {
                    record(&plan.out, &value);
                    return true;
                }
                Ok(answer) => eprintln!("{value} via node {target}: {answer}"),
                Err(e) => eprintln!("{value} via node {target}: {e}"),
            }
        }
        if plan.to.is_some() || Instant::now() > plan.deadline {
            return false;
        }
        std::thread::sleep(RETRY_PAUSE);
    }
    false
}

/// Waits until the nodes of `among` answer, agree on a leader, and hold the
/// same last log index and applied index on two polls in a row.
fn wait_converged(
    control: &Control,
    among: &[u64],
    timeout: Duration,
) -> Result<Option<u64>, String> {
    let deadline = Instant::now() + timeout;
    let mut previous: Option<Vec<(Option<u64>, Option<u64>)>> = None;
    loop {
        let statuses = control.statuses(among);
        let views: Option<Vec<(Option<u64>, Option<u64>)>> = statuses
            .values()
            .map(|s| s.as_ref().ok().map(|s| (s.last_log_index, s.applied)))
            .collect();
        let agreed = control.agreed_leader(among).is_some();
        if let Some(views) = views {
            let same = views.windows(2).all(|w| w[0] == w[1]);
            let applied_all = views.iter().all(|(last, applied)| last == applied);
            if agreed && same && applied_all && previous.as_ref() == Some(&views) {
                return Ok(views[0].1);
            }
            previous = Some(views);
        } else {
            previous = None;
        }
        if Instant::now() > deadline {
            print_statuses(control, among);
            return Err(format!(
                "nodes {among:?} did not converge in {}s",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(POLL_PERIOD * 2);
    }
}

fn read_values(path: &Path) -> Result<Vec<String>, String> {
    let mut text = String::new();
    File::open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// Collects check results and prints them as they come.
#[derive(Default)]
struct Verdicts {
    failed: usize,
}

impl Verdicts {
    fn check(&mut self, ok: bool, what: &str, detail: impl std::fmt::Display) {
        println!("  {}  {what}: {detail}", if ok { "PASS" } else { "FAIL" });
        if !ok {
            self.failed += 1;
        }
    }
}

/// After a scenario: waits until every node converged on one leader (the
/// old leader, if given, a follower of another), then checks that
/// - every acknowledged value is applied exactly once on every node, and
///   the nodes applied the same sequence; no value is applied twice;
/// - the rings (the logs as each node's ring reads them) agree entry by
///   entry on their common range, and each one's terms never decrease;
/// - no ring holds a stale value (proposed to the old leader while it was
///   cut off) in a term up to the old leader's: the stale leader's records
///   never became valid anywhere, its own ring included; and no ring holds
///   an entry of the old term after an entry of a later term;
/// - and reports the data-plane counters: the old leader's WRITEs refused by
///   a follower's NIC (`fenced_writes`), rkey rotations, fences.
fn check(control: &Control, args: &CheckArgs) -> Result<(), String> {
    let all = control.ids();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    // The old leader must end up following someone else.
    if let Some(old) = args.old_leader {
        loop {
            let leader = control.agreed_leader(&all);
            if let Some((l, _)) = leader
                && l != old
            {
                break;
            }
            if Instant::now() > deadline {
                print_statuses(control, &all);
                return Err(format!(
                    "no agreed leader other than the old leader {old} in {}s",
                    args.timeout_s
                ));
            }
            std::thread::sleep(POLL_PERIOD);
        }
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let applied_index = wait_converged(control, &all, left.max(Duration::from_secs(5)))?;
    println!("converged: every node applied up to {applied_index:?}");

    let mut acked: Vec<String> = Vec::new();
    for path in &args.acked {
        acked.extend(read_values(path)?);
    }
    let stale: BTreeSet<String> = match &args.stale_sent {
        Some(path) => read_values(path)?.into_iter().collect(),
        None => BTreeSet::new(),
    };
    let mut statuses = BTreeMap::new();
    let mut applied: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    let mut logs: BTreeMap<u64, RingLog> = BTreeMap::new();
    let mut metrics: BTreeMap<u64, NodeMetrics> = BTreeMap::new();
    for id in &all {
        statuses.insert(*id, control.status(*id)?);
        applied.insert(*id, control.request_json(*id, "applied")?);
        logs.insert(*id, control.request_json(*id, "log")?);
        metrics.insert(*id, control.request_json(*id, "metrics")?);
    }
    let mut v = Verdicts::default();

    for (id, s) in &statuses {
        println!("node {id}: {}", json(s));
    }
    if let Some(old) = args.old_leader {
        let s = &statuses[&old];
        v.check(
            s.state == "Follower" && s.leader.is_some_and(|l| l != old),
            "the old leader stepped down and follows",
            format!("node {old} is {} of leader {:?}", s.state, s.leader),
        );
    }

    // Applied: every acknowledged value exactly once, everywhere.
    for (id, entries) in &applied {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, value) in entries {
            *counts.entry(value.as_str()).or_default() += 1;
        }
        let missing: Vec<&String> = acked
            .iter()
            .filter(|a| counts.get(a.as_str()).copied().unwrap_or(0) == 0)
            .collect();
        let twice: Vec<(&str, usize)> = counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (*k, *n))
            .collect();
        v.check(
            missing.is_empty(),
            &format!("node {id} applied every acknowledged value"),
            format!(
                "{} acknowledged, {} applied, missing {:?}",
                acked.len(),
                entries.len(),
                missing.iter().take(10).collect::<Vec<_>>()
            ),
        );
        v.check(
            twice.is_empty(),
            &format!("node {id} applied no value twice"),
            format!("{:?}", twice.iter().take(10).collect::<Vec<_>>()),
        );
    }
    let reference = applied.values().next().cloned().unwrap_or_default();
    for (id, entries) in &applied {
        v.check(
            *entries == reference,
            &format!("node {id} applied the same sequence as node {}", all[0]),
            format!("{} entries", entries.len()),
        );
    }

    // Rings: agreement on the common range, terms never decreasing.
    let first = logs.values().map(|l| l.first_index).max().unwrap_or(0);
    let next = logs.values().map(|l| l.next_index).min().unwrap_or(0);
    let at = |log: &RingLog, index: u64| -> Option<RingEntry> {
        log.entries.iter().find(|e| e.index == index).cloned()
    };
    let mut diverging = Vec::new();
    for index in first..next {
        let views: Vec<Option<(u64, Option<String>)>> = logs
            .values()
            .map(|l| at(l, index).map(|e| (e.term, e.data)))
            .collect();
        if !views.windows(2).all(|w| w[0] == w[1]) {
            diverging.push(index);
        }
    }
    v.check(
        diverging.is_empty(),
        "the rings agree entry by entry on their common range",
        format!(
            "indexes {first}..{next}, diverging at {:?}",
            diverging.iter().take(10).collect::<Vec<_>>()
        ),
    );
    for (id, log) in &logs {
        let unreadable: Vec<u64> = log
            .entries
            .iter()
            .filter(|e| e.error.is_some())
            .map(|e| e.index)
            .collect();
        v.check(
            unreadable.is_empty(),
            &format!("node {id}'s ring reads back whole"),
            format!(
                "{} entries ({}..{}), unreadable {:?}",
                log.entries.len(),
                log.first_index,
                log.next_index,
                unreadable.iter().take(10).collect::<Vec<_>>()
            ),
        );
        let decreasing: Vec<u64> = log
            .entries
            .windows(2)
            .filter(|w| w[1].term < w[0].term)
            .map(|w| w[1].index)
            .collect();
        v.check(
            decreasing.is_empty(),
            &format!("node {id}'s ring never goes back in term"),
            format!("{:?}", decreasing.iter().take(10).collect::<Vec<_>>()),
        );
        if let Some(old_term) = args.old_term {
            let first_later = log
                .entries
                .iter()
                .find(|e| e.term > old_term)
                .map(|e| e.index);
            let old_after: Vec<u64> = log
                .entries
                .iter()
                .filter(|e| e.term == old_term && first_later.is_some_and(|f| e.index > f))
                .map(|e| e.index)
                .collect();
            let old_count = log.entries.iter().filter(|e| e.term == old_term).count();
            v.check(
                old_after.is_empty(),
                &format!("node {id}'s ring has no entry of the old term {old_term} after a later term's"),
                format!(
                    "{old_count} entries of term {old_term}, first later-term entry at {first_later:?}"
                ),
            );
        }
        if !stale.is_empty() {
            let stale_records: Vec<(u64, u64, String)> = log
                .entries
                .iter()
                .filter_map(|e| {
                    let data = e.data.as_ref()?;
                    (stale.contains(data) && args.old_term.is_none_or(|t| e.term <= t))
                        .then(|| (e.index, e.term, data.clone()))
                })
                .collect();
            let re_proposed = log
                .entries
                .iter()
                .filter(|e| e.data.as_ref().is_some_and(|d| stale.contains(d)))
                .count()
                - stale_records.len();
            v.check(
                stale_records.is_empty(),
                &format!("node {id}'s ring holds no record the stale leader wrote"),
                format!(
                    "{} stale values sent; found {:?}; {re_proposed} committed later under a newer term",
                    stale.len(),
                    stale_records.iter().take(10).collect::<Vec<_>>()
                ),
            );
        }
    }

    // The fences and the data plane.
    let leader = statuses
        .values()
        .find(|s| s.state == "Leader")
        .map(|s| (s.id, s.term));
    for (id, m) in &metrics {
        println!(
            "node {id} metrics: fenced_writes {} rejected_records {} fence_changes {} rkey_rotations {} fence term {} leader {} proposals {} bytes_written {}",
            m.fenced_writes,
            m.rejected_records,
            m.fence_changes,
            m.rkey_rotations,
            m.fence_term,
            m.fence_leader,
            m.proposals,
            m.bytes_written
        );
        let interesting: Vec<String> = m
            .device_counters
            .iter()
            .filter(|(k, v)| **v > 0 && !k.starts_with("counters/"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("node {id} device: {}", interesting.join(" "));
    }
    if let Some((leader, term)) = leader {
        for (id, m) in &metrics {
            if *id == leader {
                continue;
            }
            v.check(
                m.fence_leader == leader && m.fence_term == term,
                &format!("node {id}'s fence is held by the leader"),
                format!(
                    "fence term {} leader {}, leader {leader} term {term}",
                    m.fence_term, m.fence_leader
                ),
            );
        }
    }
    if let Some(old) = args.old_leader {
        let fenced = metrics[&old].fenced_writes;
        println!("old leader {old}: {fenced} WRITE(s) refused by a follower's NIC (fenced_writes)");
        if args.require_fenced_writes {
            v.check(
                fenced > 0,
                "a follower's NIC refused the old leader's WRITEs",
                format!("fenced_writes {fenced}"),
            );
        }
    }
    if v.failed > 0 {
        return Err(format!("{} check(s) failed", v.failed));
    }
    println!("all checks passed");
    Ok(())
}
