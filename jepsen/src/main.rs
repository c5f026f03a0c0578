//! `ringraft-jepsen`: the harness's command line. `run` runs one test and
//! then checks it; `check` checks a run directory; `damage-tail` is the
//! nemesis's ring damage as a command (run inside a lab guest).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ringraft_jepsen::nemesis::Fault;
use ringraft_jepsen::runner::{self, RunConfig, SubstrateKind};
use ringraft_jepsen::substrate::TailDamage;

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
        /// all, none (comma-separated).
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
        } => {
            let nemeses = match Fault::parse_list(&nemesis) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ringraft-jepsen: --nemesis: {e}");
                    return ExitCode::from(2);
                }
            };
            let jepsen_bin = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("ringraft-jepsen: where am I? {e}");
                    return ExitCode::from(2);
                }
            };
            // `ringraft` beside this binary unless --ringraft-bin says.
            let ringraft_bin = match ringraft_testkit::process::ringraft_binary(ringraft_bin) {
                Ok(path) => path,
                Err(e) => {
                    eprintln!(
                        "ringraft-jepsen: no ringraft binary: {e} (build it, or pass --ringraft-bin)"
                    );
                    return ExitCode::from(2);
                }
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
            };
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("ringraft-jepsen: tokio: {e}");
                    return ExitCode::from(2);
                }
            };
            match rt.block_on(runner::run(config)) {
                Ok(summary) => {
                    println!("{}", runner::summary_json(&summary));
                }
                Err(e) => {
                    eprintln!("ringraft-jepsen: run failed: {e}");
                    return ExitCode::from(2);
                }
            }
            if no_check {
                return ExitCode::SUCCESS;
            }
            check(&out)
        }
        Command::Check { run_dir } => check(&run_dir),
        Command::DamageTail {
            data_dir,
            mode,
            seed,
        } => {
            let damage = match mode.as_str() {
                "corrupt" => TailDamage::Corrupt,
                "truncate" => TailDamage::Truncate,
                other => {
                    eprintln!("ringraft-jepsen: --mode {other}: expected corrupt or truncate");
                    return ExitCode::from(2);
                }
            };
            match ringraft_jepsen::tail::damage_tail(&data_dir, damage, seed) {
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
    }
}
