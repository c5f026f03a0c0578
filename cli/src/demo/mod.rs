//! `ringraft demo`: a local 3-node cluster, driven and checked step by step,
//! narrated for a person watching.
//!
//! The nodes are real child processes (this executable's `serve`, tcp
//! fabric, loopback ports, fsync durability by default), started and
//! stopped by the test kit's [`ProcessCluster`]; their data directories and
//! logs stay on disk afterwards. The demo appends records, reads them back,
//! kills the leader with SIGKILL, watches the failover, appends more,
//! compares every survivor's log, restarts the killed node and watches it
//! catch up, checks the history it recorded (appends, reads, the kill) with
//! the Jepsen checker against every node's final log, stops everything with
//! SIGTERM and checks every ring offline. It exits 0 only when every check
//! passed. This module owns the steps, their narration and their checks;
//! [`history`] what is recorded for the checker and the run files. The
//! processes are the kit's and the rules of a correct history are the
//! checker's.
//!
//! It must never leave a process behind: children run in their own process
//! group (so a terminal's Ctrl-C reaches only the demo, which then stops
//! them), die with the demo's main thread (`PR_SET_PDEATHSIG`), and are
//! killed by [`ProcessCluster`]'s `Drop` on any early return or panic. Every
//! step has a deadline. It must never panic on what a node answers: a wrong
//! answer is a failed check.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) mod certs;
mod history;
use history::{DemoHistory, final_log, text};

use ringraft_checker::FinalLogs;
use ringraft_client::proto::{Record, StatusResponse};
use ringraft_client::{Client, ClientError, ClientTls, Consistency};
use ringraft_testkit::leader::{NodeView, Observe, Wanted, wait_for_leader};
use ringraft_testkit::process::{
    NodePlace, ProcessCluster, ProcessOptions, Stopped, ringraft_binary,
};

/// Nodes in the demo cluster.
const NODES: u64 = 3;
/// Steps the demo narrates.
const TOTAL_STEPS: usize = 9;
/// Time a node's client API gets per call while polling.
const POLL_TIMEOUT: Duration = Duration::from_millis(700);
/// Time a node's client API gets per append or read (an fsync'ed commit on
/// a loaded machine can take a while; a retry elsewhere is exactly-once).
const DATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Polling period.
const POLL_PERIOD: Duration = Duration::from_millis(100);
/// How long a node may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the nodes get to exit after SIGTERM when the demo is
/// interrupted, before SIGKILL.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// Lines of a node's log shown when something went wrong.
const LOG_TAIL_LINES: usize = 8;
/// The nodes' `RUST_LOG` unless the demo's own environment sets one.
const DEFAULT_RUST_LOG: &str = "info,openraft=warn";

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
    /// TLS on the client API, client certificates required (a throwaway CA
    /// in the demo's directory).
    pub tls: bool,
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

/// The nodes of the demo in `base`: data `node<id>`, log `node<id>.log`,
/// rings in `shm` (the tcp fabric needs no tmpfs, so removing `base`
/// removes everything); node 1 bootstraps.
fn demo_cluster(
    exe: PathBuf,
    base: &Path,
    durability: &str,
    tls_args: Vec<String>,
) -> Result<ProcessCluster, String> {
    let addr = || {
        ringraft_testkit::ports::loopback_addr().map_err(|e| format!("no free loopback port: {e}"))
    };
    let mut places = BTreeMap::new();
    for id in 1..=NODES {
        let place = NodePlace {
            listen: addr()?,
            client: addr()?,
            metrics: None,
            data_dir: base.join(format!("node{id}")),
            ring_dir: base.join("shm"),
            log: base.join(format!("node{id}.log")),
            netns: None,
        };
        places.insert(id, place);
    }
    let binary = ringraft_binary(Some(exe)).map_err(|e| format!("this executable: {e}"))?;
    let mut options = ProcessOptions::new(binary, "tcp", 1);
    options.extra_serve_args = vec!["--durability".into(), durability.into()];
    options.extra_serve_args.extend(tls_args);
    let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| DEFAULT_RUST_LOG.into());
    options.env = vec![("RUST_LOG".into(), Some(rust_log))];
    options.die_with_parent = true;
    options.stdout_to_log = true;
    Ok(ProcessCluster::new(options, places))
}

/// The TLS material of `--tls` in `base/tls`: a throwaway CA, one
/// certificate for the nodes (all on loopback, dialled by IP address) and
/// one for the demo's client. Returns the nodes' flags (the CA also signs
/// the clients it admits), the client's files and its settings.
fn demo_tls(base: &Path) -> Result<(Vec<String>, certs::Files, ClientTls), String> {
    let dir = base.join("tls");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = certs::Ca::new("ringraft demo CA")?;
    let node = ca.write(&dir, "node")?;
    let client = ca.write(&dir, "client")?;
    let path = |p: &Path| p.display().to_string();
    let args = vec![
        "--tls-cert".into(),
        path(&node.cert),
        "--tls-key".into(),
        path(&node.key),
        "--tls-client-ca".into(),
        path(&node.ca),
    ];
    let tls = ClientTls::from_files(&client.ca, Some((&client.cert, &client.key)))
        .map_err(|e| e.to_string())?;
    Ok((args, client, tls))
}

/// The last lines of node `id`'s log, indented.
fn log_tail(cluster: &ProcessCluster, id: u64) -> String {
    let mut out = String::new();
    for l in cluster.log_tail(id, LOG_TAIL_LINES).lines() {
        let _ = writeln!(out, "      | {l}");
    }
    if out.is_empty() {
        out = "      | (empty)\n".into();
    }
    out
}

/// An error when a node that should run has exited.
fn check_alive(cluster: &ProcessCluster) -> Result<(), String> {
    for id in cluster.nodes() {
        if let Some(status) = cluster.exited(id) {
            return Err(format!(
                "node {id} exited unexpectedly ({status}); its log ends with:\n{}",
                log_tail(cluster, id)
            ));
        }
    }
    Ok(())
}

/// The client API addresses of `ids`.
fn endpoints(cluster: &ProcessCluster, ids: &[u64]) -> Vec<String> {
    ids.iter()
        .filter_map(|id| cluster.place(*id).ok().map(|p| p.client.clone()))
        .collect()
}

fn say(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line.as_ref());
    let _ = out.flush();
}

/// How the demo's clients reach the nodes: plaintext, or (`--tls`) TLS
/// with the demo's CA and client certificate.
#[derive(Clone, Default)]
struct Clients {
    tls: Option<ClientTls>,
}

impl Clients {
    /// A client for polling, each attempt bounded by [`POLL_TIMEOUT`].
    fn poll(&self, endpoints: Vec<String>, deadline: Duration) -> Client {
        self.with_tls(Client::new(endpoints, POLL_TIMEOUT).with_deadline(deadline))
    }

    /// A client for appends and reads, each attempt bounded by
    /// [`DATA_TIMEOUT`].
    fn data(&self, endpoints: Vec<String>, deadline: Duration) -> Client {
        self.with_tls(Client::new(endpoints, DATA_TIMEOUT).with_deadline(deadline))
    }

    fn with_tls(&self, client: Client) -> Client {
        match &self.tls {
            Some(tls) => client.with_tls(tls.clone()),
            None => client,
        }
    }
}

async fn status_of(cluster: &ProcessCluster, clients: &Clients, id: u64) -> Option<StatusResponse> {
    clients
        .poll(endpoints(cluster, &[id]), POLL_TIMEOUT)
        .status()
        .await
        .ok()
}

/// The demo's nodes as the kit's leader-waiting sees them: each node's
/// status over the client API; a node that exited ends the wait.
struct Watched<'a>(&'a ProcessCluster, &'a Clients);

impl Observe for Watched<'_> {
    fn running(&self) -> Vec<u64> {
        self.0.running()
    }

    async fn view(&self, id: u64) -> Option<NodeView> {
        let s = status_of(self.0, self.1, id).await?;
        Some(NodeView {
            id: s.id,
            term: s.term,
            leader: (s.leader_id != 0).then_some(s.leader_id),
            is_leader: s.state == "Leader",
        })
    }

    fn failed(&self) -> Option<String> {
        check_alive(self.0).err()
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

/// Checks that an append of `sent` records answered one increasing index
/// per record, all above `above`.
fn check_indexes(indexes: &[u64], sent: usize, above: u64) -> Result<(), String> {
    if indexes.len() != sent
        || indexes.windows(2).any(|w| w[0] >= w[1])
        || indexes.first().is_some_and(|first| *first <= above)
    {
        return Err(format!("append answered with bad indexes {indexes:?}"));
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

/// A run's cluster and what the demo recorded of it.
struct Demo {
    cluster: Arc<ProcessCluster>,
    /// How its clients reach the nodes.
    clients: Clients,
    /// `--tls`: the demo's CA and client certificate.
    tls: Option<certs::Files>,
    config: DemoConfig,
    base: PathBuf,
    /// Tags this run's records.
    run: u32,
    /// Every append, read and fault of the run, for the checker.
    history: DemoHistory,
    step_no: usize,
    started: Instant,
}

/// What the first leader was and what the first phase appended.
struct FirstPhase {
    leader: NodeView,
    batch: Vec<Vec<u8>>,
    last_index: u64,
}

impl Demo {
    fn timeout(&self) -> Duration {
        self.config.step_timeout
    }

    fn step(&mut self, title: &str) {
        self.step_no += 1;
        say(format!("\n[{}/{TOTAL_STEPS}] {title}", self.step_no));
    }

    fn place(&self, id: u64) -> Result<&NodePlace, String> {
        self.cluster.place(id).map_err(|e| e.to_string())
    }

    /// Appends `batch` through `endpoints` in one append (one history
    /// operation per record, sent to `via`, the leader the demo knows of),
    /// bounded by the step deadline; the indexes it answered.
    async fn append(
        &self,
        what: &str,
        via: u64,
        ids: &[u64],
        batch: &[Vec<u8>],
    ) -> StepResult<Vec<u64>> {
        let ops = self.history.invoke_appends(batch, via);
        let endpoints = endpoints(&self.cluster, ids);
        let answer = bounded(what, self.timeout(), async {
            self.clients
                .data(endpoints, self.timeout())
                .append(batch.to_vec())
                .await
                .map_err(|e| Failure::Check(format!("{what}: {e}")))
        })
        .await;
        self.history
            .appended(ops, answer.as_ref().ok().map(Vec::as_slice));
        answer
    }

    /// A linearizable read of node `id`'s whole log, bounded by the step
    /// deadline; recorded in the history when `recorded`.
    async fn read_all(&self, what: &str, id: u64, recorded: bool) -> StepResult<Vec<Record>> {
        let op = recorded.then(|| self.history.invoke_read());
        let endpoints = endpoints(&self.cluster, &[id]);
        let answer = bounded(what, self.timeout(), async {
            self.clients
                .data(endpoints, self.timeout())
                .read(1, 0, Consistency::Linearizable)
                .await
                .map_err(|e| Failure::Check(format!("linearizable read from node {id}: {e}")))
        })
        .await;
        if let Some(op) = op {
            self.history
                .read(op, answer.as_ref().ok().map(Vec::as_slice));
        }
        answer
    }

    /// Waits until every running node names the same running leader, in a
    /// term above `above_term`.
    async fn leader(&self, what: &str, above_term: u64) -> StepResult<NodeView> {
        let wanted = Wanted {
            above_term: Some(above_term),
            ..Wanted::any(POLL_PERIOD)
        };
        bounded(what, self.timeout(), async {
            wait_for_leader(
                &Watched(&self.cluster, &self.clients),
                &wanted,
                Duration::MAX,
            )
            .await
            .map_err(|e| Failure::Check(format!("{what}: {e}")))
        })
        .await
    }

    async fn start_nodes(&mut self) -> StepResult<()> {
        self.step("Starting 3 nodes (ringraft serve, tcp fabric on loopback)");
        for id in 1..=NODES {
            self.cluster.start(id).map_err(|e| e.to_string())?;
            let place = self.place(id)?;
            say(format!(
                "    node {id}: pid {}, raft {}, client API {}{}",
                self.cluster.pid(id).unwrap_or(0),
                place.listen,
                place.client,
                if id == 1 { ", --bootstrap" } else { "" }
            ));
        }
        Ok(())
    }

    async fn elect(&mut self) -> StepResult<NodeView> {
        self.step("Waiting for the nodes to elect a leader");
        let started = Instant::now();
        let first = self.leader("electing a leader", 0).await?;
        say(format!(
            "    node {} leads in term {} (after {:.1} s)",
            first.id,
            first.term,
            started.elapsed().as_secs_f64()
        ));
        self.check_tls_refusals(first.id).await?;
        Ok(first)
    }

    /// `--tls`: a client without a certificate, and a plaintext client,
    /// are refused by node `id` (and say why).
    async fn check_tls_refusals(&self, id: u64) -> StepResult<()> {
        let Some(files) = &self.tls else {
            return Ok(());
        };
        let endpoint = endpoints(&self.cluster, &[id]);
        let ca_only = ClientTls::from_files(&files.ca, None).map_err(|e| e.to_string())?;
        for (who, client) in [
            (
                "a client with the CA but without a certificate",
                Client::new(endpoint.clone(), POLL_TIMEOUT).with_tls(ca_only),
            ),
            (
                "a plaintext client",
                Client::new(endpoint.clone(), POLL_TIMEOUT),
            ),
        ] {
            let mut client = client.with_deadline(self.timeout());
            let answer = bounded(who, self.timeout(), async { Ok(client.status().await) }).await?;
            match answer {
                Err(ClientError::Tls(why)) => say(format!("    {who} is refused: {why}")),
                Ok(_) => {
                    return Err(
                        format!("{who} was answered by node {id}: TLS is not enforced").into(),
                    );
                }
                Err(e) => {
                    return Err(format!("{who}: expected a refusal for TLS, got: {e}").into());
                }
            }
        }
        Ok(())
    }

    async fn append_and_read_back(&mut self, leader: NodeView) -> StepResult<FirstPhase> {
        self.step(&format!(
            "Appending {} records, then reading them back (linearizable)",
            self.config.records
        ));
        let batch: Vec<Vec<u8>> = (0..self.config.records)
            .map(|k| record(self.run, k))
            .collect();
        let started = Instant::now();
        let all = self.cluster.running();
        let indexes = self.append("appending", leader.id, &all, &batch).await?;
        check_indexes(&indexes, batch.len(), 0)?;
        let (first, last) = (indexes[0], indexes[indexes.len() - 1]);
        say(format!(
            "    committed at indexes {first}..={last} in {:.1} ms (each acknowledged once a majority stored it)",
            started.elapsed().as_secs_f64() * 1e3
        ));
        say(format!("    e.g. index {first}: {:?}", text(&batch[0])));
        let records = self.read_all("reading back", leader.id, true).await?;
        check_records(&format!("node {}", leader.id), &records, &batch)?;
        say(format!(
            "    read {} records back from node {}: all intact",
            records.len(),
            leader.id
        ));
        Ok(FirstPhase {
            leader,
            batch,
            last_index: last,
        })
    }

    async fn show_status(&mut self) -> StepResult<()> {
        self.step("Status of every node");
        for id in self.cluster.running() {
            // Retried within the step's deadline: one attempt of
            // POLL_TIMEOUT is short for a loaded machine.
            let endpoints = endpoints(&self.cluster, &[id]);
            let s = bounded("status", self.timeout(), async {
                self.clients
                    .poll(endpoints, self.timeout())
                    .status()
                    .await
                    .map_err(|e| Failure::Check(format!("node {id} does not answer status: {e}")))
            })
            .await?;
            say(format!("    {}", describe(&s)));
        }
        Ok(())
    }

    async fn kill_leader(&mut self, old: &NodeView) -> StepResult<NodeView> {
        self.step(&format!(
            "kill -9 the leader (node {}, pid {})",
            old.id,
            self.cluster.pid(old.id).unwrap_or(0)
        ));
        self.history.kill_started(old.id);
        self.cluster.kill(old.id).map_err(|e| e.to_string())?;
        let killed_at = Instant::now();
        say(format!(
            "    node {} is gone (SIGKILL: no shutdown, no flush)",
            old.id
        ));
        let new = self.leader("failing over", old.term).await?;
        say(format!(
            "    failover: node {} leads in term {} (was node {} in term {}), {:.1} s after the kill",
            new.id,
            new.term,
            old.id,
            old.term,
            killed_at.elapsed().as_secs_f64()
        ));
        Ok(new)
    }

    /// Appends the second batch through the survivors and compares their
    /// logs; returns the log they agree on.
    async fn append_through_survivors(
        &mut self,
        first: &FirstPhase,
        leader: &NodeView,
    ) -> StepResult<Vec<Record>> {
        self.step(&format!(
            "Appending {} more records through the survivors, then reading everything back from each",
            self.config.records
        ));
        let survivors = self.cluster.running();
        let records = self.config.records;
        let batch: Vec<Vec<u8>> = (records..2 * records)
            .map(|k| record(self.run, k))
            .collect();
        let what = "appending after the failover";
        let indexes = self.append(what, leader.id, &survivors, &batch).await?;
        check_indexes(&indexes, batch.len(), first.last_index)?;
        say(format!(
            "    committed at indexes {}..={}",
            indexes[0],
            indexes[indexes.len() - 1]
        ));
        let expected: Vec<Vec<u8>> = first.batch.iter().chain(&batch).cloned().collect();
        let mut reference: Option<(u64, Vec<Record>)> = None;
        for &id in &survivors {
            let records = self.read_all("reading from a survivor", id, true).await?;
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
            reference.get_or_insert((id, records));
        }
        let (_, reference) = reference.ok_or_else(|| "no survivor to read from".to_string())?;
        say("    the survivors' logs are identical (index, term and bytes of every record)");
        Ok(reference)
    }

    /// Restarts node `old` and waits until it applied what `leader`
    /// committed and holds the survivors' log, `reference`.
    async fn restart_and_catch_up(
        &mut self,
        old: u64,
        leader: &NodeView,
        reference: &[Record],
    ) -> StepResult<()> {
        self.step(&format!("Restarting node {old} and letting it catch up"));
        let commit = status_of(&self.cluster, &self.clients, leader.id)
            .await
            .map_or(0, |s| s.commit_index);
        self.cluster.start(old).map_err(|e| e.to_string())?;
        self.history.kill_ended(old);
        let restarted = Instant::now();
        say(format!(
            "    node {old}: pid {}, same data directory",
            self.cluster.pid(old).unwrap_or(0)
        ));
        let target = commit.max(reference.last().map_or(0, |r| r.index));
        let (cluster, clients) = (&self.cluster, &self.clients);
        let caught_up = bounded("catching up", self.timeout(), async {
            loop {
                check_alive(cluster)?;
                if let Some(s) = status_of(cluster, clients, old).await
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
        let what = "reading from the restarted node";
        let records = self.read_all(what, old, true).await?;
        if records != reference {
            return Err(format!("node {old}'s log differs from the survivors'").into());
        }
        say(format!(
            "    node {old} holds the same {} records as the others",
            records.len()
        ));
        Ok(())
    }

    /// Reads every node's final log, writes the history and the logs to
    /// the demo's directory, and has the checker judge them.
    async fn check_history(&mut self) -> StepResult<()> {
        self.step("Checking the recorded history against every node's final log");
        let mut finals = FinalLogs::new();
        for id in self.cluster.nodes() {
            let records = self.read_all("reading a final log", id, false).await?;
            finals.insert(id, final_log(&records));
        }
        self.history.write_run_files(&self.base, &finals)?;
        say(format!(
            "    {} events recorded (appends, reads, the kill); final logs of {} nodes",
            self.history.len(),
            finals.len()
        ));
        let line = self.history.judge(&finals)?;
        say(format!("    {line}"));
        Ok(())
    }

    async fn stop_and_check_rings(&mut self) -> StepResult<()> {
        self.step("Stopping every node gracefully (SIGTERM), then checking every ring offline");
        for id in self.cluster.nodes() {
            let cluster = Arc::clone(&self.cluster);
            let started = Instant::now();
            let stopped = tokio::task::spawn_blocking(move || cluster.stop(id, STOP_TIMEOUT))
                .await
                .map_err(|e| format!("stopping node {id}: {e}"))?
                .map_err(|e| e.to_string())?;
            match stopped {
                Stopped::Exited(status) if status.success() => say(format!(
                    "    node {id} stopped cleanly in {:.1} s",
                    started.elapsed().as_secs_f64()
                )),
                Stopped::Exited(status) => {
                    return Err(format!(
                        "node {id} exited with {status} on SIGTERM; its log ends with:\n{}",
                        log_tail(&self.cluster, id)
                    )
                    .into());
                }
                Stopped::Killed => {
                    return Err(format!(
                        "node {id} did not exit within {STOP_TIMEOUT:?} of SIGTERM (killed)"
                    )
                    .into());
                }
                Stopped::NotRunning => return Err(format!("node {id} is not running").into()),
            }
        }
        for id in self.cluster.nodes() {
            self.check_ring(id)?;
        }
        Ok(())
    }

    /// The offline `wal check` of stopped node `id`: no damage inside.
    fn check_ring(&self, id: u64) -> Result<(), String> {
        let dir = &self.place(id)?.data_dir;
        let report =
            ringraft_wal::check(dir).map_err(|e| format!("wal check {}: {e}", dir.display()))?;
        let verdict = report
            .to_string()
            .lines()
            .last()
            .unwrap_or_default()
            .trim_start_matches("verdict")
            .trim()
            .to_string();
        say(format!(
            "    node {id}: {} valid entries (the records and Raft's own), {verdict}",
            report.entries
        ));
        if matches!(report.damage, ringraft_wal::Damage::CorruptInside(_)) {
            return Err(format!("wal check of node {id} found damage:\n{report}"));
        }
        Ok(())
    }

    async fn steps(&mut self) -> StepResult<()> {
        self.start_nodes().await?;
        let leader = self.elect().await?;
        let first = self.append_and_read_back(leader).await?;
        self.show_status().await?;
        let old = first.leader.clone();
        let new = self.kill_leader(&old).await?;
        let reference = self.append_through_survivors(&first, &new).await?;
        self.restart_and_catch_up(old.id, &new, &reference).await?;
        self.check_history().await?;
        self.stop_and_check_rings().await
    }

    /// Ends the run as `outcome` says; its exit code.
    async fn finish(&self, outcome: StepResult<()>) -> ExitCode {
        match outcome {
            Ok(()) => {
                say(format!(
                    "\nPASS: every check passed ({:.1} s).",
                    self.started.elapsed().as_secs_f64()
                ));
                ExitCode::SUCCESS
            }
            Err(Failure::Check(msg)) => {
                say(format!("\nFAIL: {msg}"));
                self.cluster.kill_all();
                ExitCode::from(1)
            }
            Err(Failure::Interrupted) => {
                say("\nInterrupted: stopping the nodes.");
                let cluster = Arc::clone(&self.cluster);
                let stopping =
                    tokio::task::spawn_blocking(move || cluster.stop_all(INTERRUPT_GRACE));
                if stopping.await.is_err() {
                    self.cluster.kill_all();
                }
                ExitCode::from(130)
            }
        }
    }

    fn left_on_disk(&self) {
        say("Left on disk for you to look at:");
        for id in self.cluster.nodes() {
            if let Ok(place) = self.place(id) {
                say(format!(
                    "    node {id}: data {}  log {}",
                    place.data_dir.display(),
                    place.log.display()
                ));
            }
        }
        if self.base.join("history.jsonl").is_file() {
            say(format!(
                "    history {}  final logs {}  (re-check: `ringraft-jepsen check {}`)",
                self.base.join("history.jsonl").display(),
                self.base.join("final").display(),
                self.base.display()
            ));
        }
        if let Some(files) = &self.tls {
            say(format!(
                "    TLS: the CA, the nodes' and the client's certificates and keys in {} \
                 (a client: `ringraft status --endpoints ... --ca {} --cert {} --key {}`)",
                self.base.join("tls").display(),
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            ));
        }
        let data_dir = self.place(1).map(|p| p.data_dir.display().to_string());
        say(format!(
            "    (e.g. `ringraft wal check --data-dir {}`; remove {} when done)",
            data_dir.unwrap_or_default(),
            self.base.display()
        ));
    }
}

/// Checks the options and makes the demo's directory; the directory, or
/// the message of a usage error.
fn prepare(config: &DemoConfig) -> Result<PathBuf, String> {
    if config.records == 0 || config.records > 1000 {
        return Err("--records must be in 1..=1000".into());
    }
    if config.durability != "memory" && config.durability != "fsync" {
        return Err("--durability must be memory or fsync".into());
    }
    match &config.dir {
        Some(dir) => {
            if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
                return Err(format!(
                    "{} is not empty; give a new or empty directory",
                    dir.display()
                ));
            }
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(dir.clone())
        }
        None => tempfile::Builder::new()
            .prefix("ringraft-demo-")
            .tempdir()
            .map(|d| d.keep())
            .map_err(|e| format!("creating a temp dir: {e}")),
    }
}

/// Runs the demo. Must be driven on the thread that outlives it (the
/// runtime's `block_on` thread): the nodes' death signal is tied to the
/// thread that started them.
pub async fn run(config: DemoConfig) -> ExitCode {
    let prepared = prepare(&config).and_then(|base| {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let (tls_args, tls) = match config.tls {
            true => {
                let (args, files, client) = demo_tls(&base)?;
                (args, Some((files, client)))
            }
            false => (Vec::new(), None),
        };
        let cluster = demo_cluster(exe, &base, &config.durability, tls_args)?;
        Ok((base, cluster, tls))
    });
    let (base, cluster, tls) = match prepared {
        Ok(p) => p,
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
    if let Some((files, _)) = &tls {
        say(format!(
            "    TLS on the client API (rustls), client certificates required: a throwaway CA in {}",
            files.ca.display()
        ));
    }
    say(format!("    data and logs: {}", base.display()));
    let run = rand::random::<u32>();
    let (tls, clients) = match tls {
        Some((files, client)) => (Some(files), Clients { tls: Some(client) }),
        None => (None, Clients::default()),
    };
    let mut demo = Demo {
        cluster: Arc::new(cluster),
        clients,
        tls,
        config,
        base,
        run,
        history: DemoHistory::new(run),
        step_no: 0,
        started: Instant::now(),
    };
    let outcome = tokio::select! {
        r = demo.steps() => r,
        // Without the handlers a signal ends the process; the children then
        // die with it (PR_SET_PDEATHSIG).
        _ = ringraft_testkit::signals::interrupted() => Err(Failure::Interrupted),
    };
    let code = demo.finish(outcome).await;
    demo.left_on_disk();
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_indexes_are_a_failed_check() {
        assert!(check_indexes(&[3, 4], 2, 2).is_ok());
        assert!(check_indexes(&[3], 2, 2).is_err(), "one index short");
        assert!(check_indexes(&[4, 3], 2, 2).is_err(), "decreasing");
        assert!(
            check_indexes(&[2, 3], 2, 2).is_err(),
            "not above the first phase"
        );
        assert!(check_indexes(&[], 0, 0).is_ok());
    }
}
