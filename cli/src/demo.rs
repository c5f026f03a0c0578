//! `ringraft demo`: a local 3-node cluster, driven and checked step by step,
//! narrated for a person watching.
//!
//! The nodes are real child processes (this executable's `serve`, tcp
//! fabric, loopback ports, fsync durability by default) whose data
//! directories and logs stay on disk afterwards. The demo appends records,
//! reads them back, kills the leader with SIGKILL, watches the failover,
//! appends more, compares every survivor's log, restarts the killed node and
//! watches it catch up, stops everything with SIGTERM and checks every ring
//! offline. It exits 0 only when every check passed.
//!
//! It must never leave a process behind: children run in their own process
//! group (so a terminal's Ctrl-C reaches only the demo, which then stops
//! them), die with the demo's main thread (`PR_SET_PDEATHSIG`), and are
//! killed by [`Cluster`]'s `Drop` on any early return or panic. Every step
//! has a deadline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ringraft_client::proto::{Record, StatusResponse};
use ringraft_client::{Client, Consistency};

/// Nodes in the demo cluster.
const NODES: u64 = 3;
/// Ring data area per node, bytes (small: the demo writes little).
const RING_CAPACITY_BYTES: u64 = 8 << 20;
/// Time a node's client API gets per call while polling.
const POLL_TIMEOUT: Duration = Duration::from_millis(700);
/// Time a node's client API gets per append or read (an fsync'ed commit on
/// a loaded machine can take a while; a retry elsewhere is exactly-once).
const DATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Polling period.
const POLL_PERIOD: Duration = Duration::from_millis(100);
/// How long a node may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of a node's log shown when something went wrong.
const LOG_TAIL_LINES: usize = 8;

/// What to run.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Where the data directories and logs go (created; must be empty if it
    /// exists). `None`: a new directory under the system's temp dir.
    pub dir: Option<PathBuf>,
    /// Records appended before the failover, and again after it.
    pub records: usize,
    /// Deadline of every step.
    pub step_timeout: Duration,
    /// memory or fsync.
    pub durability: String,
}

/// Why the demo stopped.
enum Failure {
    /// A check failed or a step could not finish.
    Check(String),
    /// SIGINT or SIGTERM.
    Interrupted,
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::Check(s)
    }
}

type StepResult<T> = Result<T, Failure>;

struct DemoNode {
    id: u64,
    listen: String,
    client: String,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// The cluster: its nodes and their processes. Dropping it kills every
/// process still running.
struct Cluster {
    exe: PathBuf,
    peers: String,
    /// Where the nodes' rings live: `shm` in the demo's directory.
    ring_dir: PathBuf,
    durability: String,
    nodes: BTreeMap<u64, DemoNode>,
}

fn free_port() -> Result<u16, String> {
    ringraft_testkit::ports::free_port().map_err(|e| format!("no free loopback port: {e}"))
}

impl Cluster {
    fn new(exe: PathBuf, base: PathBuf, durability: String) -> Result<Cluster, String> {
        let mut nodes = BTreeMap::new();
        for id in 1..=NODES {
            nodes.insert(
                id,
                DemoNode {
                    id,
                    listen: format!("127.0.0.1:{}", free_port()?),
                    client: format!("127.0.0.1:{}", free_port()?),
                    dir: base.join(format!("node{id}")),
                    log: base.join(format!("node{id}.log")),
                    child: None,
                },
            );
        }
        let peers = nodes
            .values()
            .map(|n| format!("{}={}", n.id, n.listen))
            .collect::<Vec<_>>()
            .join(",");
        Ok(Cluster {
            exe,
            peers,
            ring_dir: base.join("shm"),
            durability,
            nodes,
        })
    }

    /// Starts node `id` (appending to its log). Must run on the thread that
    /// stays alive as long as the demo: the child's death signal is tied to
    /// it.
    fn start(&mut self, id: u64) -> Result<u32, String> {
        let n = &self.nodes[&id];
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--id".into(),
            id.to_string(),
            "--data-dir".into(),
            n.dir.display().to_string(),
            // The rings stay with the demo's files (the tcp fabric needs no
            // tmpfs), so that removing its directory removes everything.
            "--ring-dir".into(),
            self.ring_dir.display().to_string(),
            "--listen".into(),
            n.listen.clone(),
            "--client".into(),
            n.client.clone(),
            "--peers".into(),
            self.peers.clone(),
            "--fabric".into(),
            "tcp".into(),
            "--durability".into(),
            self.durability.clone(),
            "--ring-capacity".into(),
            RING_CAPACITY_BYTES.to_string(),
            "--max-record".into(),
            "65536".into(),
        ];
        if id == 1 {
            args.push("--bootstrap".into());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .map_err(|e| format!("log file {}: {e}", n.log.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("log file {}: {e}", n.log.display()))?;
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = Command::new(&self.exe);
        cmd.args(&args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls (prctl, getppid); it touches no
        // memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The demo died between fork and prctl: do not outlive it.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the demo exited"));
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting node {id} ({}): {e}", self.exe.display()))?;
        let pid = child.id();
        self.nodes.get_mut(&id).expect("node exists").child = Some(child);
        Ok(pid)
    }

    fn live(&self) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|n| n.child.is_some())
            .map(|n| n.id)
            .collect()
    }

    fn endpoints(&self, ids: &[u64]) -> Vec<String> {
        ids.iter().map(|id| self.nodes[id].client.clone()).collect()
    }

    /// An error when a node that should run has exited.
    fn check_alive(&mut self) -> Result<(), String> {
        for n in self.nodes.values_mut() {
            if let Some(c) = n.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                n.child = None;
                return Err(format!(
                    "node {} exited unexpectedly ({status}); its log ends with:\n{}",
                    n.id,
                    log_tail(&n.log)
                ));
            }
        }
        Ok(())
    }

    fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].child.as_ref().map(Child::id)
    }

    /// SIGKILL, then reap.
    fn kill9(&mut self, id: u64) -> Result<(), String> {
        let n = self.nodes.get_mut(&id).expect("node exists");
        let mut child = n
            .child
            .take()
            .ok_or_else(|| format!("node {id} is not running"))?;
        child
            .kill()
            .map_err(|e| format!("kill -9 node {id}: {e}"))?;
        child
            .wait()
            .map_err(|e| format!("reaping node {id}: {e}"))?;
        Ok(())
    }

    /// SIGTERM, then wait for a clean exit.
    async fn stop(&mut self, id: u64) -> Result<Duration, String> {
        let n = self.nodes.get_mut(&id).expect("node exists");
        let Some(mut child) = n.child.take() else {
            return Err(format!("node {id} is not running"));
        };
        let started = Instant::now();
        signal(child.id(), libc::SIGTERM);
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(started.elapsed()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "node {id} exited with {status} on SIGTERM; its log ends with:\n{}",
                        log_tail(&n.log)
                    ));
                }
                Ok(None) if started.elapsed() > STOP_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "node {id} did not exit within {STOP_TIMEOUT:?} of SIGTERM (killed)"
                    ));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(format!("waiting for node {id}: {e}")),
            }
        }
    }

    /// Every child still running: SIGTERM, a short grace, then SIGKILL.
    async fn stop_all_quickly(&mut self) {
        for n in self.nodes.values() {
            if let Some(c) = &n.child {
                signal(c.id(), libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let mut running = false;
            for n in self.nodes.values_mut() {
                if let Some(c) = n.child.as_mut() {
                    match c.try_wait() {
                        Ok(None) => running = true,
                        _ => n.child = None,
                    }
                }
            }
            if !running {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill_all();
    }

    fn kill_all(&mut self) {
        for n in self.nodes.values_mut() {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a pid of a child we have not reaped yet (so
        // the pid cannot have been reused).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// The last lines of a log file, indented.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(LOG_TAIL_LINES);
    let mut out = String::new();
    for l in &lines[from..] {
        let _ = writeln!(out, "      | {l}");
    }
    if out.is_empty() {
        out = "      | (empty)\n".into();
    }
    out
}

fn say(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}

fn client(endpoints: Vec<String>, deadline: Duration) -> Client {
    Client::new(endpoints, POLL_TIMEOUT).with_deadline(deadline)
}

fn data_client(endpoints: Vec<String>, deadline: Duration) -> Client {
    Client::new(endpoints, DATA_TIMEOUT).with_deadline(deadline)
}

async fn status_of(cluster: &Cluster, id: u64) -> Option<StatusResponse> {
    client(cluster.endpoints(&[id]), POLL_TIMEOUT)
        .status()
        .await
        .ok()
}

/// Waits until every running node names the same running leader, whose
/// term is above `above_term`; returns its status.
async fn wait_for_leader(cluster: &mut Cluster, above_term: u64) -> StepResult<StatusResponse> {
    loop {
        cluster.check_alive()?;
        let live = cluster.live();
        let mut views = Vec::new();
        for id in &live {
            views.push(status_of(cluster, *id).await);
        }
        if let Some(Some(first)) = views.first()
            && first.leader_id != 0
            && live.contains(&first.leader_id)
            && views
                .iter()
                .all(|v| v.as_ref().is_some_and(|v| v.leader_id == first.leader_id))
        {
            let k = live
                .iter()
                .position(|id| *id == first.leader_id)
                .expect("the leader is live");
            let leader = views[k].clone().expect("every view is present");
            if leader.state == "Leader" && leader.term > above_term {
                return Ok(leader);
            }
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

fn describe(s: &StatusResponse) -> String {
    format!(
        "node {}: {:<9} leader {}, term {}, commit {}, applied {}",
        s.id,
        s.state.to_lowercase(),
        if s.leader_id == 0 {
            "unknown".to_string()
        } else {
            s.leader_id.to_string()
        },
        s.term,
        s.commit_index,
        s.applied_index
    )
}

/// Checks that `records` hold exactly `expected`, in order, at increasing
/// indexes.
fn check_records(who: &str, records: &[Record], expected: &[Vec<u8>]) -> Result<(), String> {
    if records.len() != expected.len() {
        return Err(format!(
            "{who} returned {} records, expected {}",
            records.len(),
            expected.len()
        ));
    }
    for (k, (r, e)) in records.iter().zip(expected).enumerate() {
        if r.data != *e {
            return Err(format!(
                "{who}: record {k} (index {}) is {:?}, expected {:?}",
                r.index,
                String::from_utf8_lossy(&r.data),
                String::from_utf8_lossy(e)
            ));
        }
    }
    if records.windows(2).any(|w| w[0].index >= w[1].index) {
        return Err(format!("{who}: indexes are not increasing"));
    }
    Ok(())
}

/// Runs `step` with the step deadline.
async fn bounded<T>(
    what: &str,
    timeout: Duration,
    step: impl std::future::Future<Output = StepResult<T>>,
) -> StepResult<T> {
    match tokio::time::timeout(timeout, step).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Check(format!(
            "{what}: no result within {} s (--step-timeout)",
            timeout.as_secs()
        ))),
    }
}

fn record(run: u32, k: usize) -> Vec<u8> {
    format!("demo {run:08x} record {k:03}: hello from ringraft").into_bytes()
}

async fn read_all(cluster: &Cluster, id: u64, deadline: Duration) -> Result<Vec<Record>, String> {
    data_client(cluster.endpoints(&[id]), deadline)
        .read(1, 0, Consistency::Linearizable)
        .await
        .map_err(|e| format!("linearizable read from node {id}: {e}"))
}

async fn steps(cluster: &mut Cluster, config: &DemoConfig) -> StepResult<()> {
    let timeout = config.step_timeout;
    let run = rand::random::<u32>();
    let total_steps = 8;
    let mut step_no = 0;
    let mut step = |title: &str| {
        step_no += 1;
        say(format!("\n[{step_no}/{total_steps}] {title}"));
    };

    step("Starting 3 nodes (ringraft serve, tcp fabric on loopback)");
    for id in 1..=NODES {
        let pid = cluster.start(id)?;
        let n = &cluster.nodes[&id];
        say(format!(
            "    node {id}: pid {pid}, raft {}, client API {}{}",
            n.listen,
            n.client,
            if id == 1 { ", --bootstrap" } else { "" }
        ));
    }

    step("Waiting for the nodes to elect a leader");
    let started = Instant::now();
    let first = bounded("electing a leader", timeout, wait_for_leader(cluster, 0)).await?;
    let old_leader = first.leader_id;
    say(format!(
        "    node {} leads in term {} (after {:.1} s)",
        old_leader,
        first.term,
        started.elapsed().as_secs_f64()
    ));

    step(&format!(
        "Appending {} records, then reading them back (linearizable)",
        config.records
    ));
    let all = cluster.endpoints(&cluster.live());
    let batch1: Vec<Vec<u8>> = (0..config.records).map(|k| record(run, k)).collect();
    let started = Instant::now();
    let indexes = bounded("appending", timeout, async {
        data_client(all.clone(), timeout)
            .append(batch1.clone())
            .await
            .map_err(|e| Failure::Check(format!("append: {e}")))
    })
    .await?;
    if indexes.len() != batch1.len() || indexes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("append answered with bad indexes {indexes:?}").into());
    }
    say(format!(
        "    committed at indexes {}..={} in {:.1} ms (each acknowledged once a majority stored it)",
        indexes[0],
        indexes[indexes.len() - 1],
        started.elapsed().as_secs_f64() * 1e3
    ));
    say(format!(
        "    e.g. index {}: {:?}",
        indexes[0],
        String::from_utf8_lossy(&batch1[0])
    ));
    let records = bounded("reading back", timeout, async {
        read_all(cluster, old_leader, timeout)
            .await
            .map_err(Failure::Check)
    })
    .await?;
    check_records(&format!("node {old_leader}"), &records, &batch1)?;
    say(format!(
        "    read {} records back from node {old_leader}: all intact",
        records.len()
    ));

    step("Status of every node");
    for id in cluster.live() {
        // Retried within the step's deadline: one attempt of POLL_TIMEOUT is
        // short for a loaded machine.
        let s = bounded("status", timeout, async {
            client(cluster.endpoints(&[id]), timeout)
                .status()
                .await
                .map_err(|e| Failure::Check(format!("node {id} does not answer status: {e}")))
        })
        .await?;
        say(format!("    {}", describe(&s)));
    }

    step(&format!(
        "kill -9 the leader (node {old_leader}, pid {})",
        cluster.pid(old_leader).unwrap_or(0)
    ));
    cluster.kill9(old_leader)?;
    let killed_at = Instant::now();
    say(format!(
        "    node {old_leader} is gone (SIGKILL: no shutdown, no flush)"
    ));
    let new = bounded(
        "failing over",
        timeout,
        wait_for_leader(cluster, first.term),
    )
    .await?;
    say(format!(
        "    failover: node {} leads in term {} (was node {} in term {}), {:.1} s after the kill",
        new.leader_id,
        new.term,
        old_leader,
        first.term,
        killed_at.elapsed().as_secs_f64()
    ));

    step(&format!(
        "Appending {} more records through the survivors, then reading everything back from each",
        config.records
    ));
    let survivors = cluster.live();
    let batch2: Vec<Vec<u8>> = (config.records..2 * config.records)
        .map(|k| record(run, k))
        .collect();
    let indexes2 = bounded("appending after the failover", timeout, async {
        data_client(cluster.endpoints(&survivors), timeout)
            .append(batch2.clone())
            .await
            .map_err(|e| Failure::Check(format!("append after the failover: {e}")))
    })
    .await?;
    if indexes2.len() != batch2.len()
        || indexes2.windows(2).any(|w| w[0] >= w[1])
        || indexes2[0] <= indexes[indexes.len() - 1]
    {
        return Err(format!("append answered with bad indexes {indexes2:?}").into());
    }
    say(format!(
        "    committed at indexes {}..={}",
        indexes2[0],
        indexes2[indexes2.len() - 1]
    ));
    let expected: Vec<Vec<u8>> = batch1.iter().chain(&batch2).cloned().collect();
    let mut reference: Option<(u64, Vec<Record>)> = None;
    for id in &survivors {
        let records = bounded("reading from a survivor", timeout, async {
            read_all(cluster, *id, timeout)
                .await
                .map_err(Failure::Check)
        })
        .await?;
        check_records(&format!("node {id}"), &records, &expected)?;
        if let Some((ref_id, reference)) = &reference
            && reference != &records
        {
            return Err(format!("node {id}'s log differs from node {ref_id}'s").into());
        }
        say(format!(
            "    node {id}: {} records, all intact, indexes {}..={}",
            records.len(),
            records[0].index,
            records[records.len() - 1].index
        ));
        reference.get_or_insert((*id, records));
    }
    say("    the survivors' logs are identical (index, term and bytes of every record)");
    let (_, reference) = reference.expect("two survivors");

    step(&format!(
        "Restarting node {old_leader} and letting it catch up"
    ));
    let pid = cluster.start(old_leader)?;
    let restarted = Instant::now();
    say(format!(
        "    node {old_leader}: pid {pid}, same data directory"
    ));
    let target = new.commit_index.max(reference[reference.len() - 1].index);
    let caught_up = bounded("catching up", timeout, async {
        loop {
            cluster.check_alive()?;
            if let Some(s) = status_of(cluster, old_leader).await
                && s.applied_index >= target
                && s.leader_id != 0
            {
                return Ok(s);
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    })
    .await?;
    say(format!(
        "    caught up after {:.1} s: {}",
        restarted.elapsed().as_secs_f64(),
        describe(&caught_up)
    ));
    let records = bounded("reading from the restarted node", timeout, async {
        read_all(cluster, old_leader, timeout)
            .await
            .map_err(Failure::Check)
    })
    .await?;
    check_records(&format!("node {old_leader}"), &records, &expected)?;
    if records != reference {
        return Err(format!("node {old_leader}'s log differs from the survivors'").into());
    }
    say(format!(
        "    node {old_leader} holds the same {} records as the others",
        records.len()
    ));

    step("Stopping every node gracefully (SIGTERM), then checking every ring offline");
    for id in 1..=NODES {
        let took = cluster.stop(id).await?;
        say(format!(
            "    node {id} stopped cleanly in {:.1} s",
            took.as_secs_f64()
        ));
    }
    for n in cluster.nodes.values() {
        let report = ringraft_wal::check(&n.dir)
            .map_err(|e| format!("wal check {}: {e}", n.dir.display()))?;
        let verdict = report
            .to_string()
            .lines()
            .last()
            .unwrap_or_default()
            .trim_start_matches("verdict")
            .trim()
            .to_string();
        say(format!(
            "    node {}: {} valid entries (the records and Raft's own), {verdict}",
            n.id, report.entries
        ));
        if matches!(report.damage, ringraft_wal::Damage::CorruptInside(_)) {
            return Err(format!("wal check of node {} found damage:\n{report}", n.id).into());
        }
    }
    Ok(())
}

/// Runs the demo. Must be driven on the thread that outlives it (the
/// runtime's `block_on` thread): the nodes' death signal is tied to the
/// thread that started them.
pub async fn run(config: DemoConfig) -> ExitCode {
    if config.records == 0 || config.records > 1000 {
        eprintln!("ringraft demo: --records must be in 1..=1000");
        return ExitCode::from(2);
    }
    if config.durability != "memory" && config.durability != "fsync" {
        eprintln!("ringraft demo: --durability must be memory or fsync");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ringraft demo: cannot find this executable: {e}");
            return ExitCode::from(2);
        }
    };
    let base = match &config.dir {
        Some(dir) => {
            if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
                eprintln!(
                    "ringraft demo: {} is not empty; give a new or empty directory",
                    dir.display()
                );
                return ExitCode::from(2);
            }
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("ringraft demo: {}: {e}", dir.display());
                return ExitCode::from(2);
            }
            dir.clone()
        }
        None => match tempfile::Builder::new().prefix("ringraft-demo-").tempdir() {
            Ok(d) => d.keep(),
            Err(e) => {
                eprintln!("ringraft demo: creating a temp dir: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut cluster = match Cluster::new(exe, base.clone(), config.durability.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringraft demo: {e}");
            return ExitCode::from(2);
        }
    };
    say("ringraft demo: a 3-node replicated log on this machine");
    say(format!(
        "    fabric tcp (the software RNIC), durability {}, every step bounded by {} s",
        config.durability,
        config.step_timeout.as_secs()
    ));
    say(format!("    data and logs: {}", base.display()));
    let started = Instant::now();
    let outcome = tokio::select! {
        r = steps(&mut cluster, &config) => r,
        // Without the handlers a signal ends the process; the children then
        // die with it (PR_SET_PDEATHSIG).
        _ = ringraft_testkit::signals::interrupted() => Err(Failure::Interrupted),
    };
    let code = match outcome {
        Ok(()) => {
            say(format!(
                "\nPASS: every check passed ({:.1} s).",
                started.elapsed().as_secs_f64()
            ));
            ExitCode::SUCCESS
        }
        Err(Failure::Check(msg)) => {
            say(format!("\nFAIL: {msg}"));
            cluster.kill_all();
            ExitCode::from(1)
        }
        Err(Failure::Interrupted) => {
            say("\nInterrupted: stopping the nodes.");
            cluster.stop_all_quickly().await;
            ExitCode::from(130)
        }
    };
    say("Left on disk for you to look at:");
    for n in cluster.nodes.values() {
        say(format!(
            "    node {}: data {}  log {}",
            n.id,
            n.dir.display(),
            n.log.display()
        ));
    }
    say(format!(
        "    (e.g. `{} wal check --data-dir {}`; remove {} when done)",
        "ringraft",
        cluster.nodes[&1].dir.display(),
        base.display()
    ));
    code
}
