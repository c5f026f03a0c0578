//! Where the nodes of a run live and how faults reach them.
//!
//! A [`Substrate`] starts and stops `ringraft serve` processes, sends them
//! signals, cuts the network between them and damages a stopped node's ring.
//! It owns every resource it creates (processes, namespaces, bridges,
//! iptables rules, lab guests) and releases them in
//! [`Substrate::teardown`], which every implementation also runs on drop, so
//! an error or a panic in the runner leaves nothing behind. A substrate
//! never decides *which* fault to inject: that is the nemesis's job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringraft_testkit::process::ProcessError;

pub mod local;
pub mod netns;
pub mod process;
pub mod softroce;

/// Why a substrate operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SubstrateError {
    /// The substrate cannot do this (e.g. partitions on `local`).
    #[error("the {substrate} substrate cannot {what}")]
    Unsupported {
        /// The substrate.
        substrate: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// A command or a file operation failed, or a node id is not part of
    /// the cluster or in the wrong state: the failures a substrate shares
    /// with the node processes it runs (testkit's [`ProcessError`]).
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl SubstrateError {
    /// A command failed: `what` was being done, `detail` its output or
    /// status.
    pub(crate) fn command(what: impl Into<String>, detail: impl Into<String>) -> SubstrateError {
        ProcessError::Command {
            what: what.into(),
            detail: detail.into(),
        }
        .into()
    }

    /// Node `node` is not part of the cluster, or in the wrong state.
    pub(crate) fn node(node: u64, why: impl Into<String>) -> SubstrateError {
        ProcessError::Node {
            node,
            why: why.into(),
        }
        .into()
    }

    /// A file operation on `path` failed.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> SubstrateError {
        ProcessError::Io {
            path: path.into(),
            source,
        }
        .into()
    }
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, SubstrateError>;

/// How to damage the tail of a stopped node's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailDamage {
    /// Flip bytes inside the last records (a bad sector, a torn write).
    Corrupt,
    /// Zero the last records (a write that never reached the media).
    Truncate,
}

impl TailDamage {
    /// The name used on the command line and in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            TailDamage::Corrupt => "corrupt",
            TailDamage::Truncate => "truncate",
        }
    }
}

/// What every substrate needs to start nodes.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Node ids, 1..=n.
    pub nodes: Vec<u64>,
    /// The `ringraft` binary.
    pub ringraft_bin: PathBuf,
    /// This harness's binary (for `damage-tail` inside a guest).
    pub jepsen_bin: PathBuf,
    /// The run directory (logs and, where local, data dirs go below it).
    pub run_dir: PathBuf,
    /// Planted bug to switch on in every node (env `RINGRAFT_PLANTED_BUG`).
    pub planted_bug: Option<String>,
    /// Extra `ringraft serve` flags.
    pub extra_serve_args: Vec<String>,
    /// `RUST_LOG` of the nodes (`None`: the daemon's default).
    pub node_log: Option<String>,
    /// Where a node's data directory lives (softroce only: the others keep
    /// it in the run directory).
    pub data_fs: DataFs,
}

/// The file system of a node's data directory (`--lab-data-fs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFs {
    /// The guest's tmpfs.
    #[default]
    Tmpfs,
    /// An ext4 file system on a loop device (a disk file system's page
    /// cache: what kernels >= 6.5 refuse to pin for remote write; the ring
    /// itself stays in /dev/shm).
    Ext4,
}

/// The result of `ringraft wal check` on one node.
#[derive(Debug, Clone)]
pub struct WalCheck {
    /// Its exit status (0 clean or torn tail, 1 corrupt inside the
    /// acknowledged range, other: could not check).
    pub status: i32,
    /// What it printed.
    pub output: String,
}

/// A place to run a cluster. See the module docs.
pub trait Substrate: Send + Sync {
    /// `local`, `netns` or `softroce`.
    fn name(&self) -> &'static str;
    /// The node ids.
    fn nodes(&self) -> Vec<u64>;
    /// The client API address of node `id` (reachable from the harness).
    fn client_endpoint(&self, id: u64) -> String;
    /// The control-plane address of node `id` (`--listen`, for membership).
    fn listen_addr(&self, id: u64) -> String;
    /// Starts (or restarts) node `id`; no-op when it runs.
    fn start(&self, id: u64) -> Result<()>;
    /// Kills node `id` with SIGKILL and waits for it to go.
    fn kill(&self, id: u64) -> Result<()>;
    /// Stops node `id` with SIGTERM (graceful), SIGKILL after a bound.
    fn stop(&self, id: u64) -> Result<()>;
    /// Whether node `id` runs (paused counts as running).
    fn is_running(&self, id: u64) -> bool;
    /// SIGSTOP.
    fn pause(&self, id: u64) -> Result<()>;
    /// SIGCONT.
    fn resume(&self, id: u64) -> Result<()>;
    /// Arms a freeze of node `id` (the `freeze` nemesis): a watcher next to
    /// the process SIGSTOPs it `delay` after at least `in_flight` proposals
    /// are pending on it (its `ringraft_proposals_in_flight` metric), or
    /// gives up after `bound`. Returns once the watcher runs. A stop sent
    /// from the harness comes too late where a command takes long to reach
    /// the node (a lab guest under TCG). Default: unsupported, and the
    /// nemesis pauses the node itself.
    fn arm_freeze(&self, id: u64, in_flight: u64, delay: Duration, bound: Duration) -> Result<()> {
        let _ = (id, in_flight, delay, bound);
        Err(SubstrateError::Unsupported {
            substrate: self.name(),
            what: "freeze a node from next to it",
        })
    }
    /// Whether node `id`'s process is stopped now (after
    /// [`Substrate::arm_freeze`]). Default: unsupported.
    fn is_stopped(&self, id: u64) -> Result<bool> {
        let _ = id;
        Err(SubstrateError::Unsupported {
            substrate: self.name(),
            what: "tell whether a node is stopped",
        })
    }
    /// How many of node `id`'s queue pairs from node `from` its RDMA device
    /// has put in the error state so far, by its log: a responder NIC that
    /// refuses a request (a WRITE with a revoked rkey: a fenced-out leader's)
    /// does that. Needs the daemon's `ringraft_transport::rdma::conn=debug`
    /// log ([`ClusterSpec::node_log`]). Default: unsupported.
    fn nic_refusals(&self, id: u64, from: u64) -> Result<u64> {
        let _ = (id, from);
        Err(SubstrateError::Unsupported {
            substrate: self.name(),
            what: "count a node's NIC refusals",
        })
    }
    /// Whether [`Substrate::partition`] works.
    fn can_partition(&self) -> bool;
    /// Whether [`Substrate::drop_one_way`] works.
    fn can_drop_one_way(&self) -> bool;
    /// Drops all traffic between nodes of different groups (nodes in no
    /// group keep talking to everyone). Replaces any earlier partition.
    fn partition(&self, groups: &[Vec<u64>]) -> Result<()>;
    /// Drops the packets from `from` to `to` only.
    fn drop_one_way(&self, from: u64, to: u64) -> Result<()>;
    /// Removes every network fault.
    fn heal(&self) -> Result<()>;
    /// Damages the tail of stopped node `id`'s ring; says what it did.
    fn damage_tail(&self, id: u64, damage: TailDamage, seed: u64) -> Result<String>;
    /// `ringraft wal check` of stopped node `id`.
    fn wal_check(&self, id: u64) -> Result<WalCheck>;
    /// Copies the nodes' logs into `dir`.
    fn collect_logs(&self, dir: &Path) -> Result<()>;
    /// Kills every node and removes everything the substrate created.
    /// Idempotent.
    fn teardown(&self) -> Result<()>;
}

/// Runs a command, failing with its output when it does not succeed.
pub(crate) fn run_cmd(what: &str, cmd: &mut std::process::Command) -> Result<String> {
    let out = cmd
        .output()
        .map_err(|e| SubstrateError::command(what, e.to_string()))?;
    if !out.status.success() {
        return Err(SubstrateError::command(
            what,
            format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
