//! The runner end to end on the `local` substrate (no root): a short run
//! with the planted bug `ack-before-replication` must be flagged by the
//! checker, and a short clean run under kill, pause, ring damage,
//! membership changes and leader transfers must pass.
//!
//! The daemon comes from another package, so the test builds it once, with
//! `--features ringraft/planted-bugs`, into its own target directory
//! (`target/planted`), so that no normal build ever carries the planted
//! code. The clean run uses the same binary without `RINGRAFT_PLANTED_BUG`,
//! where the planted code is inert. `RINGRAFT_JEPSEN_BIN=<path>` skips the
//! build and uses that binary.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use ringraft_jepsen::checker::{AnomalyKind, check};
use ringraft_jepsen::nemesis::Fault;
use ringraft_jepsen::runner::{Requirements, RunConfig, SubstrateKind, run};

/// One run at a time: the machine is small and the runs are timed.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn daemon() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(path) = std::env::var("RINGRAFT_JEPSEN_BIN") {
            return PathBuf::from(path);
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = root.join("target").join("planted");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args([
                "build",
                "-p",
                "ringraft-cli",
                "--bin",
                "ringraft",
                "--features",
                "ringraft/planted-bugs",
                "--target-dir",
            ])
            .arg(&target)
            .status()
            .expect("run cargo build for the daemon");
        assert!(status.success(), "building the planted daemon failed");
        target.join("debug").join("ringraft")
    })
    .clone()
}

fn config(out: PathBuf, seed: u64, nemeses: &[Fault], planted: Option<&str>) -> RunConfig {
    RunConfig {
        substrate: SubstrateKind::Local,
        nodes: 3,
        duration: Duration::from_secs(15),
        clients: 3,
        seed,
        nemeses: nemeses.to_vec(),
        out,
        planted_bug: planted.map(str::to_string),
        ringraft_bin: daemon(),
        jepsen_bin: PathBuf::from(env!("CARGO_BIN_EXE_ringraft-jepsen")),
        lab_sh: PathBuf::from("/nonexistent"),
        // A safety net, not a budget: the runner stops waiting as soon as
        // the nodes agree, and a node read before it caught up (a loaded
        // machine catches up slowly) would lack acknowledged appends.
        converge_timeout: Duration::from_secs(300),
        extra_serve_args: Vec::new(),
        node_log: None,
        data_fs: Default::default(),
        require: Requirements::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_ack_before_replication_is_caught() {
    let bin = daemon();
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let summary = run(config(
        out.clone(),
        2,
        &[Fault::Kill],
        Some("ack-before-replication"),
    ))
    .await
    .expect("the run completes");
    assert!(summary.workload.append_ok > 0, "{summary:?}");
    assert!(summary.nemesis.windows.get("kill").copied().unwrap_or(0) > 0);
    let log = std::fs::read_to_string(out.join("logs/n1.log")).unwrap();
    assert!(
        log.contains("PLANTED BUG ack-before-replication IS ON"),
        "{bin:?}"
    );
    let verdict = check(&out).expect("the run directory is usable");
    assert!(!verdict.valid, "the planted bug went unnoticed");
    assert!(
        verdict
            .anomalies
            .iter()
            .any(|a| a.kind == AnomalyKind::LostAppend),
        "expected lost acknowledged appends, got {:?}",
        verdict.counts_by_kind()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_run_under_faults_is_valid() {
    daemon();
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut config = config(
        out.clone(),
        3,
        &[
            Fault::Kill,
            Fault::Pause,
            Fault::Corrupt,
            Fault::Membership,
            Fault::Transfer,
        ],
        None,
    );
    config.require.fences = true;
    let summary = run(config).await.expect("the run completes");
    assert!(summary.workload.append_ok > 0, "{summary:?}");
    // After every fault the leader holds every follower's ring. A run
    // that fails this is kept (its node logs) for diagnosis: it failed
    // about once in five full-suite runs, cause not found yet.
    if !summary.unmet.is_empty() {
        let kept = dir.keep();
        let tails: String = (1..=3)
            .map(|n| {
                let log =
                    std::fs::read_to_string(out.join(format!("logs/n{n}.log"))).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("--- the last lines of node {n}'s log:\n{tail}\n")
            })
            .collect();
        panic!(
            "{:?} (run directory kept: {kept:?})\n{tails}",
            summary.unmet
        );
    }
    assert_eq!(summary.fences.len(), 3, "{:?}", summary.fences);
    assert!(!summary.nemesis.windows.is_empty(), "{summary:?}");
    let log = std::fs::read_to_string(out.join("logs/n1.log")).unwrap();
    assert!(!log.contains("PLANTED BUG"), "a planted bug was on");
    let verdict = check(&out).expect("the run directory is usable");
    assert!(
        verdict.valid,
        "violations in a clean run: {:?}\n{}",
        verdict.counts_by_kind(),
        std::fs::read_to_string(out.join("history.jsonl"))
            .map(|h| h.len().to_string())
            .unwrap_or_default()
    );
}
