//! `ringraft-jepsen`: the harness's command line. `run` runs one test and
//! then checks it; `check` checks a run directory; `damage-tail` is the
//! nemesis's ring damage as a command (run inside a lab guest).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ringraft_jepsen::nemesis::Fault;
use ringraft_jepsen::runner::{self, Requirements, RunConfig, SubstrateKind};
use ringraft_jepsen::substrate::{DataFs, TailDamage};

#[derive(Parser)]
#[command(
    name = "ringraft-jepsen",
    about = "Jepsen-style fault testing of ringraft clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a cluster under faults, record the history, then check it.
    Run {
        /// Where the nodes live.
        #[arg(long, value_enum, default_value = "local")]
        substrate: SubstrateKind,
        /// Cluster size.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Length of the workload phase, seconds.
        #[arg(long, default_value_t = 30)]
        duration: u64,
        /// Concurrent clients.
        #[arg(long, default_value_t = 4)]
        clients: u64,
        /// Seed of the fault schedule and the operation mix.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Faults: partition, kill, pause, corrupt, membership, transfer,
        /// freeze (softroce substrate only; not part of all), all, none
        /// (comma-separated).
        #[arg(long, default_value = "kill,pause")]
        nemesis: String,
        /// The run directory (must not hold a run).
        #[arg(long)]
        out: PathBuf,
        /// Switch on a planted bug (the daemon must be built with
        /// `--features ringraft/planted-bugs`).
        #[arg(long)]
        planted_bug: Option<String>,
        /// The `ringraft` binary (default: next to this one).
        #[arg(long)]
        ringraft_bin: Option<PathBuf>,
        /// The lab front end (softroce).
        #[arg(long, default_value = "deploy/softroce-vm/lab.sh")]
        lab_sh: PathBuf,
        /// Bound on the wait for the nodes to agree at the end, seconds.
        #[arg(long, default_value_t = 60)]
        converge_timeout: u64,
        /// Only record; do not check.
        #[arg(long)]
        no_check: bool,
        /// An extra `ringraft serve` flag of every node (repeat for more;
        /// a flag and its value as two: `--serve-arg=--rdma-retry-count
        /// --serve-arg=6`).
        #[arg(long = "serve-arg", allow_hyphen_values = true)]
        serve_args: Vec<String>,
        /// `RUST_LOG` of the nodes (default: the daemon's).
        #[arg(long)]
        node_log: Option<String>,
        /// The file system of the nodes' data directories (softroce).
        #[arg(long, value_enum, default_value = "tmpfs")]
        lab_data_fs: DataFs,
        /// Fail the run unless a freeze stopped the leader and the others'
        /// NICs refused its resent WRITEs (softroce, with
        /// `--node-log ...,ringraft_transport::rdma::conn=debug`).
        #[arg(long)]
        require_nic_refusal: bool,
        /// Fail the run unless, at the end, every follower's fence names
        /// the leader and its term.
        #[arg(long)]
        require_fences: bool,
        /// Fail the run unless every node's `ringraft wal check` exits 0 at
        /// the end.
        #[arg(long)]
        require_clean_wal: bool,
    },
    /// Check a run directory: report.txt, report.json, plot.svg,
    /// history.edn; exit 0 valid, 1 violation, 2 unusable input.
    Check {
        /// The run directory.
        run_dir: PathBuf,
    },
    /// Damage the tail of a stopped node's ring (corrupt or truncate).
    #[command(hide = true)]
    DamageTail {
        /// The node's data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// corrupt or truncate.
        #[arg(long)]
        mode: String,
        /// Seed (how much, which bytes).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

fn check(run_dir: &std::path::Path) -> ExitCode {
    let result = ringraft_jepsen::report::check_and_report(run_dir);
    if let Err(e) = &result {
        eprintln!("ringraft-jepsen check: {e}");
    }
    let code = ringraft_jepsen::report::exit_code(&result);
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}

/// The run's faults, this binary's path and the `ringraft` binary's, or
/// the exit code after saying what is wrong.
fn run_inputs(
    nemesis: &str,
    ringraft_bin: Option<PathBuf>,
) -> Result<(Vec<Fault>, PathBuf, PathBuf), ExitCode> {
    let nemeses = match Fault::parse_list(nemesis) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("ringraft-jepsen: --nemesis: {e}");
            return Err(ExitCode::from(2));
        }
    };
    let jepsen_bin = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ringraft-jepsen: where am I? {e}");
            return Err(ExitCode::from(2));
        }
    };
    // `ringraft` beside this binary unless --ringraft-bin says.
    let ringraft_bin = match ringraft_testkit::process::ringraft_binary(ringraft_bin) {
        Ok(path) => path,
        Err(e) => {
            eprintln!(
                "ringraft-jepsen: no ringraft binary: {e} (build it, or pass --ringraft-bin)"
            );
            return Err(ExitCode::from(2));
        }
    };
    Ok((nemeses, jepsen_bin, ringraft_bin))
}

/// Runs `config`, prints the summary, and checks the run unless
/// `no_check`.
fn run_and_check(config: RunConfig, no_check: bool) -> ExitCode {
    let out = config.out.clone();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringraft-jepsen: tokio: {e}");
            return ExitCode::from(2);
        }
    };
    let unmet = match rt.block_on(runner::run(config)) {
        Ok(summary) => {
            println!("{}", runner::summary_json(&summary));
            summary.unmet
        }
        Err(e) => {
            eprintln!("ringraft-jepsen: run failed: {e}");
            return ExitCode::from(2);
        }
    };
    let code = if no_check {
        ExitCode::SUCCESS
    } else {
        check(&out)
    };
    // A valid history does not excuse a requirement the run did not meet.
    if !unmet.is_empty() {
        for why in &unmet {
            println!("REQUIREMENT NOT MET: {why}");
        }
        return ExitCode::from(1);
    }
    code
}

/// Damages the tail of the ring in `data_dir` (`mode` corrupt or
/// truncate).
fn damage_tail(data_dir: &std::path::Path, mode: &str, seed: u64) -> ExitCode {
    let damage = match mode {
        "corrupt" => TailDamage::Corrupt,
        "truncate" => TailDamage::Truncate,
        other => {
            eprintln!("ringraft-jepsen: --mode {other}: expected corrupt or truncate");
            return ExitCode::from(2);
        }
    };
    match ringraft_jepsen::tail::damage_tail(data_dir, damage, seed) {
        Ok(what) => {
            println!("{what}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringraft-jepsen: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            substrate,
            nodes,
            duration,
            clients,
            seed,
            nemesis,
            out,
            planted_bug,
            ringraft_bin,
            lab_sh,
            converge_timeout,
            no_check,
            serve_args,
            node_log,
            lab_data_fs,
            require_nic_refusal,
            require_fences,
            require_clean_wal,
        } => {
            let (nemeses, jepsen_bin, ringraft_bin) = match run_inputs(&nemesis, ringraft_bin) {
                Ok(inputs) => inputs,
                Err(code) => return code,
            };
            let config = RunConfig {
                substrate,
                nodes,
                duration: Duration::from_secs(duration),
                clients,
                seed,
                nemeses,
                out: out.clone(),
                planted_bug,
                ringraft_bin,
                jepsen_bin,
                lab_sh: absolute(lab_sh),
                converge_timeout: Duration::from_secs(converge_timeout),
                extra_serve_args: serve_args,
                node_log,
                data_fs: lab_data_fs,
                require: Requirements {
                    nic_refusal: require_nic_refusal,
                    fences: require_fences,
                    clean_wals: require_clean_wal,
                },
            };
            run_and_check(config, no_check)
        }
        Command::Check { run_dir } => check(&run_dir),
        Command::DamageTail {
            data_dir,
            mode,
            seed,
        } => damage_tail(&data_dir, &mode, seed),
    }
}
