//! One run: build the substrate, start the cluster, run the clients and the
//! nemesis for the duration, then heal, restart, restore the membership,
//! wait (bounded) for the nodes to agree, write every node's final log, stop
//! the nodes, run `ringraft wal check` on each, collect the logs and tear the
//! substrate down (also when anything above fails, and on Ctrl-C). Writes the
//! files of the contract (`run.json`, `history.jsonl`, `final/`) plus
//! `wal-check/n<id>.txt`, `logs/n<id>.log` and `runner.json` (what the
//! runner itself saw). Judging the run is the checker's job, not this
//! module's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringraft_client::proto::StatusResponse;
use ringraft_client::{Client, Consistency as ApiConsistency};
use ringraft_testkit::leader::{self, NodeView, Observe, Wanted};
use ringraft_testkit::signals;
use serde_json::json;

use crate::history::{FinalRecord, HistoryWriter, MissingNode, RunInfo, write_final_log};
use crate::nemesis::{self, Fault, FreezeOutcome, Nemesis, NemesisStats};
use crate::substrate::{
    ClusterSpec, DataFs, Substrate, local::Local, netns::Netns, softroce::SoftRoce,
};
use crate::workload::{self, WorkloadConfig, WorkloadStats};

/// Which substrate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubstrateKind {
    /// Processes on 127.0.0.1 (no partitions; no root).
    Local,
    /// One network namespace per node on a bridge (root).
    Netns,
    /// One Soft-RoCE QEMU guest per node (root, the lab).
    Softroce,
}

impl SubstrateKind {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            SubstrateKind::Local => "local",
            SubstrateKind::Netns => "netns",
            SubstrateKind::Softroce => "softroce",
        }
    }
}

/// A run's parameters.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Where the nodes live.
    pub substrate: SubstrateKind,
    /// Cluster size.
    pub nodes: u64,
    /// Length of the workload phase.
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: u64,
    /// Seed of the schedule and the operation mix.
    pub seed: u64,
    /// Faults to inject.
    pub nemeses: Vec<Fault>,
    /// The run directory (created; must not hold a previous run).
    pub out: PathBuf,
    /// Planted bug to switch on (the binary must be built with it).
    pub planted_bug: Option<String>,
    /// The `ringraft` binary.
    pub ringraft_bin: PathBuf,
    /// This harness's binary.
    pub jepsen_bin: PathBuf,
    /// `deploy/softroce-vm/lab.sh` (softroce only).
    pub lab_sh: PathBuf,
    /// Bound on the wait for the nodes to agree at the end.
    pub converge_timeout: Duration,
    /// Extra `ringraft serve` flags of every node.
    pub extra_serve_args: Vec<String>,
    /// `RUST_LOG` of the nodes (`None`: the daemon's default).
    pub node_log: Option<String>,
    /// The data directories' file system (softroce).
    pub data_fs: DataFs,
    /// What the run must show besides a valid history.
    pub require: Requirements,
}

/// What a run must show besides a valid history (the lab's stale-leader
/// scenario asks for both); a run that does not is a failed run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requirements {
    /// At least one freeze stopped the leader, and the others' NICs refused
    /// its resent WRITEs ([`FreezeOutcome::refused`]).
    pub nic_refusal: bool,
    /// At the end, every follower's fence names the leader and its term.
    pub fences: bool,
    /// At the end, every node's `ringraft wal check` exits 0 (its ring
    /// reads back whole: at most a torn tail).
    pub clean_wals: bool,
}

/// How long the fences get to settle on the leader at the end.
const FENCE_SETTLE_BOUND: Duration = Duration::from_secs(60);

/// Why a run could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad parameters.
    #[error("{0}")]
    Config(String),
    /// The substrate failed.
    #[error("substrate: {0}")]
    Substrate(#[from] crate::substrate::SubstrateError),
    /// A file could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The cluster never came up.
    #[error("the cluster did not elect a leader within {0:?}")]
    NoLeader(Duration),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted")]
    Interrupted,
}

/// What the runner saw (also written to `runner.json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunSummary {
    /// The run directory.
    pub out: PathBuf,
    /// The substrate.
    pub substrate: SubstrateKind,
    /// Faults actually injected (the substrate may not support some).
    pub nemeses: Vec<String>,
    /// Client-side counts.
    pub workload: WorkloadStats,
    /// Nemesis windows and errors.
    pub nemesis: NemesisStats,
    /// Whether the nodes agreed at the end within the bound.
    pub converged: bool,
    /// Nodes whose final log could not be read.
    pub missing: Vec<MissingNode>,
    /// `ringraft wal check` status per node.
    pub wal_check_status: Vec<(u64, i32)>,
    /// Each node's fence at the end, as (node, fence term, fence leader),
    /// when [`Requirements::fences`] asked for it.
    pub fences: Vec<(u64, u64, u64)>,
    /// The [`Requirements`] the run did not meet, each with why.
    pub unmet: Vec<String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Now as RFC 3339 (UTC, seconds).
pub fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

async fn blocking<T: Send + 'static>(
    substrate: &Arc<dyn Substrate>,
    f: impl FnOnce(&dyn Substrate) -> T + Send + 'static,
) -> T {
    let s = substrate.clone();
    match tokio::task::spawn_blocking(move || f(&*s)).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The nodes' statuses over gRPC, for the test kit's leader wait: every
/// node of the substrate must answer.
struct OverGrpc<'a>(&'a dyn Substrate);

impl Observe for OverGrpc<'_> {
    fn running(&self) -> Vec<u64> {
        self.0.nodes()
    }
    async fn view(&self, id: u64) -> Option<NodeView> {
        let status = nemesis::status(&self.0.client_endpoint(id)).await?;
        Some(NodeView {
            id,
            term: status.term,
            leader: (status.leader_id != 0).then_some(status.leader_id),
            is_leader: status.state == "Leader",
        })
    }
}

/// Waits until every node agrees on a leader; bounded.
async fn wait_for_leader(substrate: &dyn Substrate, bound: Duration) -> Result<u64, RunError> {
    let wanted = Wanted::any(Duration::from_millis(200));
    leader::wait_for_leader(&OverGrpc(substrate), &wanted, bound)
        .await
        .map(|leader| leader.id)
        .map_err(|_| RunError::NoLeader(bound))
}

/// Runs one test; the substrate is torn down whatever happens.
pub async fn run(config: RunConfig) -> Result<RunSummary, RunError> {
    if config.nodes == 0 || config.nodes > 9 {
        return Err(RunError::Config(format!(
            "--nodes {}: expected 1..=9",
            config.nodes
        )));
    }
    if config.out.join("history.jsonl").exists() {
        return Err(RunError::Config(format!(
            "{} already holds a run (history.jsonl); choose another --out",
            config.out.display()
        )));
    }
    std::fs::create_dir_all(&config.out).map_err(io(&config.out))?;
    let out = config.out.canonicalize().map_err(io(&config.out))?;
    let nodes: Vec<u64> = (1..=config.nodes).collect();
    let spec = ClusterSpec {
        nodes: nodes.clone(),
        ringraft_bin: config.ringraft_bin.clone(),
        jepsen_bin: config.jepsen_bin.clone(),
        run_dir: out.clone(),
        planted_bug: config.planted_bug.clone(),
        extra_serve_args: config.extra_serve_args.clone(),
        node_log: config.node_log.clone(),
        data_fs: config.data_fs,
    };
    eprintln!(
        "ringraft-jepsen: run in {} ({} substrate, {} nodes, seed {}{})",
        out.display(),
        config.substrate.as_str(),
        config.nodes,
        config.seed,
        config
            .planted_bug
            .as_ref()
            .map(|b| format!(", PLANTED BUG {b}"))
            .unwrap_or_default()
    );
    let kind = config.substrate;
    let lab_sh = config.lab_sh.clone();
    let lab_timeout_s = config.duration.as_secs() + 900;
    let substrate: Arc<dyn Substrate> = tokio::task::spawn_blocking(move || {
        Ok::<Arc<dyn Substrate>, crate::substrate::SubstrateError>(match kind {
            SubstrateKind::Local => Arc::new(Local::new(spec)?),
            SubstrateKind::Netns => Arc::new(Netns::new(spec)?),
            SubstrateKind::Softroce => Arc::new(SoftRoce::new(spec, lab_sh, lab_timeout_s)?),
        })
    })
    .await
    .map_err(|e| RunError::Config(format!("substrate setup task: {e}")))??;

    let interrupted = Arc::new(AtomicBool::new(false));
    let result = tokio::select! {
        r = run_on(&config, &out, substrate.clone(), interrupted.clone()) => r,
        _ = signals::interrupted() => {
            interrupted.store(true, Ordering::SeqCst);
            Err(RunError::Interrupted)
        }
    };
    let logs = out.join("logs");
    let teardown = blocking(&substrate, move |s| {
        let collected = s.collect_logs(&logs);
        let _ = s.heal();
        (collected, s.teardown())
    })
    .await;
    if let Err(e) = teardown.0 {
        eprintln!("ringraft-jepsen: collecting logs: {e}");
    }
    teardown.1?;
    let summary = result?;
    let path = out.join("runner.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&summary).map_err(|e| io(&path)(std::io::Error::other(e)))?,
    )
    .map_err(io(&path))?;
    Ok(summary)
}

async fn run_on(
    config: &RunConfig,
    out: &Path,
    substrate: Arc<dyn Substrate>,
    _interrupted: Arc<AtomicBool>,
) -> Result<RunSummary, RunError> {
    let nodes = substrate.nodes();
    for &id in &nodes {
        blocking(&substrate, move |s| s.start(id)).await?;
    }
    let leader = wait_for_leader(&*substrate, Duration::from_secs(90)).await?;
    eprintln!("ringraft-jepsen: cluster up, leader {leader}");

    let injected = nemesis::names(&nemesis::supported(&*substrate, &config.nemeses));
    let info = RunInfo {
        seed: config.seed,
        substrate: config.substrate.as_str().to_string(),
        nodes: nodes.clone(),
        nemeses: injected.clone(),
        duration_s: config.duration.as_secs_f64(),
        clients: config.clients,
        planted_bug: config.planted_bug.clone(),
        started_at: rfc3339_now(),
    };
    write_pretty_json(&out.join("run.json"), &info)?;

    let slow = config.substrate == SubstrateKind::Softroce;
    let (workload_stats, nemesis_stats) =
        run_workload(config, out, &substrate, &nodes, slow).await?;
    let converged = make_whole(config, &substrate, &nodes).await?;
    let missing = collect_final_logs(out, &*substrate, &nodes, slow).await?;
    let (fences, mut unmet) = if config.require.fences {
        check_fences(&*substrate, &nodes).await
    } else {
        (Vec::new(), Vec::new())
    };
    let wal_check_status = check_wals(out, &substrate, &nodes).await?;
    if config.require.nic_refusal {
        unmet.extend(unmet_refusal(&nemesis_stats.freezes));
    }
    if config.require.clean_wals {
        unmet.extend(
            wal_check_status
                .iter()
                .filter(|(_, status)| *status != 0)
                .map(|(id, status)| {
                    format!("wal check: node {id} exited {status} (wal-check/n{id}.txt)")
                }),
        );
    }
    for why in &unmet {
        eprintln!("ringraft-jepsen: requirement not met: {why}");
    }
    Ok(RunSummary {
        out: out.to_path_buf(),
        substrate: config.substrate,
        nemeses: injected,
        workload: workload_stats,
        nemesis: nemesis_stats,
        converged,
        missing,
        wal_check_status,
        fences,
        unmet,
    })
}

/// Why `freezes` do not meet [`Requirements::nic_refusal`], if they do not.
pub fn unmet_refusal(freezes: &[FreezeOutcome]) -> Option<String> {
    let frozen: Vec<&FreezeOutcome> = freezes.iter().filter(|f| f.frozen).collect();
    if frozen.is_empty() {
        return Some(format!(
            "nic refusal: no freeze stopped a leader ({} freezes)",
            freezes.len()
        ));
    }
    let refused = frozen.iter().any(|f| {
        f.refused
            .as_ref()
            .is_some_and(|r| r.values().any(|n| *n > 0))
    });
    (!refused).then(|| {
        let seen: Vec<String> = frozen
            .iter()
            .map(|f| format!("node {} term {}: {:?}", f.node, f.term, f.refused))
            .collect();
        format!(
            "nic refusal: no follower's NIC refused a frozen leader's WRITEs ({})",
            seen.join("; ")
        )
    })
}

/// Polls the nodes' statuses (bounded) until one leads and every other
/// node's fence names it and its term; returns the fences last seen and,
/// if they never settled, why.
async fn check_fences(
    substrate: &dyn Substrate,
    nodes: &[u64],
) -> (Vec<(u64, u64, u64)>, Vec<String>) {
    let deadline = Instant::now() + FENCE_SETTLE_BOUND;
    loop {
        let mut statuses = Vec::new();
        for &id in nodes {
            statuses.push((id, nemesis::status(&substrate.client_endpoint(id)).await));
        }
        let fences = statuses
            .iter()
            .filter_map(|(id, s)| s.as_ref().map(|s| (*id, s.fence_term, s.fence_leader)))
            .collect();
        let why = fence_problem(&statuses);
        match why {
            None => return (fences, Vec::new()),
            Some(why) if Instant::now() >= deadline => {
                return (fences, vec![format!("fences: {why}")]);
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// What is wrong with the fences in `statuses`, if anything: a node that
/// does not answer, no leader, or a follower whose fence names another
/// leader or term.
pub fn fence_problem(statuses: &[(u64, Option<StatusResponse>)]) -> Option<String> {
    if let Some((id, _)) = statuses.iter().find(|(_, s)| s.is_none()) {
        return Some(format!("node {id} does not answer status"));
    }
    let statuses: Vec<&StatusResponse> = statuses.iter().filter_map(|(_, s)| s.as_ref()).collect();
    let Some(leader) = statuses.iter().find(|s| s.state == "Leader") else {
        return Some("no node leads".into());
    };
    let wrong: Vec<String> = statuses
        .iter()
        .filter(|s| s.id != leader.id && (s.fence_leader, s.fence_term) != (leader.id, leader.term))
        .map(|s| {
            format!(
                "node {} is fenced by node {} term {}",
                s.id, s.fence_leader, s.fence_term
            )
        })
        .collect();
    (!wrong.is_empty()).then(|| {
        format!(
            "leader {} term {}, but {}",
            leader.id,
            leader.term,
            wrong.join(", ")
        )
    })
}

/// Writes `value` as pretty JSON to `path`.
fn write_pretty_json(path: &Path, value: &impl serde::Serialize) -> Result<(), RunError> {
    std::fs::write(
        path,
        serde_json::to_vec_pretty(value).map_err(|e| io(path)(std::io::Error::other(e)))?,
    )
    .map_err(io(path))
}

/// Runs the clients and the nemesis for the run's duration, recording the
/// history in `out/history.jsonl`; returns what each did.
async fn run_workload(
    config: &RunConfig,
    out: &Path,
    substrate: &Arc<dyn Substrate>,
    nodes: &[u64],
    slow: bool,
) -> Result<(WorkloadStats, NemesisStats), RunError> {
    let started = Instant::now();
    let history_path = out.join("history.jsonl");
    let history = Arc::new(
        HistoryWriter::create(&history_path, started)
            .map_err(|e| RunError::Config(e.to_string()))?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let endpoints: Vec<String> = nodes
        .iter()
        .map(|id| substrate.client_endpoint(*id))
        .collect();
    let workload_config = WorkloadConfig {
        clients: config.clients,
        endpoints: endpoints.clone(),
        per_endpoint: Duration::from_millis(if slow { 3000 } else { 1000 }),
        op_deadline: Duration::from_secs(if slow { 15 } else { 5 }),
        think: Duration::from_millis(10),
        seed: config.seed,
    };
    let clients = tokio::spawn(workload::run(
        workload_config,
        history.clone(),
        stop.clone(),
    ));
    let nemesis = Nemesis::new(
        substrate.clone(),
        history.clone(),
        &config.nemeses,
        config.seed,
    );
    let faults = tokio::spawn(nemesis.run(stop.clone()));
    tokio::time::sleep(config.duration).await;
    stop.store(true, Ordering::SeqCst);
    let nemesis_stats = faults
        .await
        .map_err(|e| RunError::Config(format!("nemesis task: {e}")))?;
    let workload_stats = clients
        .await
        .map_err(|e| RunError::Config(format!("client task: {e}")))?
        .map_err(io(&history_path))?;
    eprintln!(
        "ringraft-jepsen: workload done: {} appends ok, {} unknown, {} reads ok, {} failed",
        workload_stats.append_ok,
        workload_stats.append_info,
        workload_stats.read_ok,
        workload_stats.read_fail
    );
    Ok((workload_stats, nemesis_stats))
}

/// Makes the cluster whole: heal, resume, restart, restore the
/// membership; returns whether the nodes then agreed within the run's
/// convergence timeout.
async fn make_whole(
    config: &RunConfig,
    substrate: &Arc<dyn Substrate>,
    nodes: &[u64],
) -> Result<bool, RunError> {
    blocking(substrate, |s| s.heal()).await?;
    for &id in nodes {
        let running = blocking(substrate, move |s| s.is_running(id)).await;
        if running {
            let _ = blocking(substrate, move |s| s.resume(id)).await;
        } else {
            blocking(substrate, move |s| s.start(id)).await?;
        }
    }
    let settle = Instant::now() + config.converge_timeout;
    restore_membership(&**substrate, settle).await;
    let converged = wait_converged(&**substrate, settle).await;
    if !converged {
        eprintln!(
            "ringraft-jepsen: the nodes did not agree within {:?}; reading their logs anyway",
            config.converge_timeout
        );
    }
    Ok(converged)
}

/// Reads every node's final log into `out/final/<id>.jsonl`; returns the
/// nodes that could not be read (also written to `out/final/missing.json`).
async fn collect_final_logs(
    out: &Path,
    substrate: &dyn Substrate,
    nodes: &[u64],
    slow: bool,
) -> Result<Vec<MissingNode>, RunError> {
    let final_dir = out.join("final");
    std::fs::create_dir_all(&final_dir).map_err(io(&final_dir))?;
    let mut missing = Vec::new();
    for &id in nodes {
        let endpoint = substrate.client_endpoint(id);
        let mut client = Client::new(vec![endpoint], Duration::from_secs(5))
            .with_deadline(Duration::from_secs(if slow { 60 } else { 20 }));
        match client.read(1, 0, ApiConsistency::Stale).await {
            Ok(records) => {
                let records: Vec<FinalRecord> = records
                    .into_iter()
                    .map(|r| FinalRecord {
                        index: r.index,
                        term: r.term,
                        data: String::from_utf8_lossy(&r.data).into_owned(),
                    })
                    .collect();
                let path = final_dir.join(format!("{id}.jsonl"));
                write_final_log(&path, &records).map_err(|e| RunError::Config(e.to_string()))?;
            }
            Err(e) => missing.push(MissingNode {
                node: id,
                reason: e.to_string(),
            }),
        }
    }
    if !missing.is_empty() {
        write_pretty_json(&final_dir.join("missing.json"), &missing)?;
    }
    Ok(missing)
}

/// Stops the nodes and checks their rings, writing each check's output to
/// `out/wal-check/n<id>.txt`; returns each node's exit status.
async fn check_wals(
    out: &Path,
    substrate: &Arc<dyn Substrate>,
    nodes: &[u64],
) -> Result<Vec<(u64, i32)>, RunError> {
    let wal_dir = out.join("wal-check");
    std::fs::create_dir_all(&wal_dir).map_err(io(&wal_dir))?;
    let mut wal_check_status = Vec::new();
    for &id in nodes {
        blocking(substrate, move |s| s.stop(id)).await?;
        let check = blocking(substrate, move |s| s.wal_check(id)).await;
        let (status, text) = match check {
            Ok(c) => (c.status, c.output),
            Err(e) => (-1, format!("could not run wal check: {e}\n")),
        };
        let path = wal_dir.join(format!("n{id}.txt"));
        std::fs::write(&path, format!("{text}\nexit status {status}\n")).map_err(io(&path))?;
        wal_check_status.push((id, status));
    }
    Ok(wal_check_status)
}

/// Makes every node a voter again (a membership step cut short may have
/// left one removed or a learner); bounded by `deadline`.
async fn restore_membership(substrate: &dyn Substrate, deadline: Instant) {
    let endpoints: Vec<String> = substrate
        .nodes()
        .iter()
        .map(|id| substrate.client_endpoint(*id))
        .collect();
    let mut client =
        Client::new(endpoints, Duration::from_secs(2)).with_deadline(Duration::from_secs(10));
    while Instant::now() < deadline {
        let members = match client.members().await {
            Ok(m) => m,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let missing: Vec<u64> = substrate
            .nodes()
            .into_iter()
            .filter(|id| !members.iter().any(|m| m.id == *id))
            .collect();
        let learners: Vec<u64> = members.iter().filter(|m| !m.voter).map(|m| m.id).collect();
        if missing.is_empty() && learners.is_empty() {
            return;
        }
        for id in &missing {
            let _ = client.add_learner(*id, substrate.listen_addr(*id)).await;
        }
        let mut promote = learners;
        promote.extend(missing);
        let _ = client.promote(promote).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every node answers with the same commit index, applied that
/// far, and the same leader; false at the deadline.
async fn wait_converged(substrate: &dyn Substrate, deadline: Instant) -> bool {
    loop {
        let mut views = Vec::new();
        for id in substrate.nodes() {
            views.push(nemesis::status(&substrate.client_endpoint(id)).await);
        }
        if let Some(Some(first)) = views.first()
            && first.leader_id != 0
            && views.iter().all(|v| {
                v.as_ref().is_some_and(|v| {
                    v.leader_id == first.leader_id
                        && v.commit_index == first.commit_index
                        && v.applied_index == v.commit_index
                        && v.last_log_index == first.last_log_index
                })
            })
        {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The summary line of a run (for run.sh and the terminal).
pub fn summary_json(summary: &RunSummary) -> serde_json::Value {
    json!({
        "out": summary.out,
        "substrate": summary.substrate,
        "nemeses": summary.nemeses,
        "workload": summary.workload,
        "nemesis_windows": summary.nemesis.windows,
        "converged": summary.converged,
        "freezes": summary.nemesis.freezes,
        "fences": summary.fences,
        "unmet": summary.unmet,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ringraft_client::proto::StatusResponse;

    use super::{fence_problem, unmet_refusal};
    use crate::nemesis::FreezeOutcome;

    fn status(id: u64, state: &str, term: u64, fence: (u64, u64)) -> (u64, Option<StatusResponse>) {
        let s = StatusResponse {
            id,
            state: state.into(),
            term,
            fence_term: fence.0,
            fence_leader: fence.1,
            ..Default::default()
        };
        (id, Some(s))
    }

    #[test]
    fn fences_must_name_the_leader_and_its_term() {
        let settled = [
            status(1, "Follower", 4, (4, 2)),
            status(2, "Leader", 4, (3, 1)),
            status(3, "Follower", 4, (4, 2)),
        ];
        assert_eq!(fence_problem(&settled), None);
        let old_term = [
            status(1, "Follower", 4, (3, 2)),
            status(2, "Leader", 4, (3, 1)),
            status(3, "Follower", 4, (4, 2)),
        ];
        let why = fence_problem(&old_term).unwrap();
        assert!(why.contains("node 1 is fenced by node 2 term 3"), "{why}");
        let other_leader = [
            status(1, "Follower", 4, (4, 3)),
            status(2, "Leader", 4, (0, 0)),
        ];
        assert!(fence_problem(&other_leader).is_some());
        let silent = [status(1, "Leader", 4, (0, 0)), (2, None)];
        assert!(
            fence_problem(&silent)
                .unwrap()
                .contains("node 2 does not answer")
        );
        let leaderless = [
            status(1, "Follower", 4, (4, 2)),
            status(2, "Candidate", 5, (4, 2)),
        ];
        assert_eq!(fence_problem(&leaderless).as_deref(), Some("no node leads"));
    }

    #[test]
    fn a_refusal_needs_a_frozen_leader_and_a_refusing_follower() {
        let freeze = |frozen, refused: Option<&[(u64, u64)]>| FreezeOutcome {
            node: 1,
            term: 2,
            frozen,
            new_leader: Some(2),
            refused: refused.map(|r| r.iter().copied().collect::<BTreeMap<_, _>>()),
        };
        assert!(unmet_refusal(&[]).is_some(), "no freeze at all");
        assert!(
            unmet_refusal(&[freeze(true, None)]).is_some(),
            "not countable"
        );
        assert!(unmet_refusal(&[freeze(true, Some(&[(2, 0), (3, 0)]))]).is_some());
        assert!(
            unmet_refusal(&[freeze(false, Some(&[(2, 1)]))]).is_some(),
            "not frozen"
        );
        assert_eq!(
            unmet_refusal(&[freeze(true, Some(&[(2, 0), (3, 1)]))]),
            None
        );
    }
}
