//! `ringraft-sim`: runs seeds of the simulator.
//!
//! - `ringraft-sim --seeds 0..200`: one line per failing seed and a summary;
//!   exit 1 if any seed failed;
//! - `ringraft-sim --seed 7 --trace`: one run, its trace printed;
//! - `ringraft-sim --planted NAME --seeds 0..200 --until-failure` (a build
//!   with the `planted-bugs` feature): the same with a planted bug on,
//!   stopping at the first seed that finds it.
//!
//! Exit codes: 0 every seed passed, 1 a seed failed, 2 a usage error.

use std::ops::Range;
use std::process::ExitCode;

use clap::Parser;
use ringraft_sim::{Options, run_seed};

#[derive(Parser, Debug)]
#[command(
    name = "ringraft-sim",
    about = "A seeded cluster simulator for ringraft"
)]
struct Args {
    /// Seeds to run, as `A..B` (B excluded).
    #[arg(long, value_parser = parse_range, conflicts_with = "seed")]
    seeds: Option<Range<u64>>,
    /// One seed to run.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the run's trace (with --seed).
    #[arg(long, requires = "seed")]
    trace: bool,
    /// Nodes in the cluster (3 or 5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=5))]
    nodes: u64,
    /// Clients appending.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=64))]
    clients: u64,
    /// Faults per run.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    faults: u64,
    /// Switch a planted bug on (a build with the `planted-bugs` feature):
    /// regrant-stale-term, skip-epoch-check, ack-before-flush.
    #[arg(long, value_name = "NAME")]
    planted: Option<String>,
    /// Stop at the first failing seed.
    #[arg(long)]
    until_failure: bool,
}

/// Switches the planted bug `name` on, or says why it cannot be.
fn plant(name: &str) -> Result<(), String> {
    #[cfg(feature = "planted-bugs")]
    {
        ringraft::planted::choose(name)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        Err(format!(
            "--planted {name}: this build has no planted bugs (build with --features planted-bugs)"
        ))
    }
}

fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?} is not a range A..B"))?;
    let a: u64 = a.parse().map_err(|e| format!("{a:?}: {e}"))?;
    let b: u64 = b.parse().map_err(|e| format!("{b:?}: {e}"))?;
    if a >= b {
        return Err(format!("the range {a}..{b} is empty"));
    }
    Ok(a..b)
}

fn main() -> ExitCode {
    // The nodes' logs stay quiet unless RUST_LOG asks for them (the trace
    // is the run's account).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if let Some(name) = &args.planted
        && let Err(e) = plant(name)
    {
        eprintln!("ringraft-sim: {e}");
        return ExitCode::from(2);
    }
    let options = Options {
        nodes: args.nodes,
        clients: args.clients,
        faults: args.faults,
        trace: args.trace,
        ..Options::default()
    };
    let seeds = match (args.seeds, args.seed) {
        (Some(range), None) => range,
        (None, Some(seed)) => seed..seed + 1,
        _ => {
            eprintln!("ringraft-sim: give --seeds A..B or --seed S");
            return ExitCode::from(2);
        }
    };
    let (mut failed, mut runs) = (0u64, 0u64);
    for seed in seeds {
        let outcome = run_seed(seed, &options);
        runs += 1;
        for line in &outcome.trace {
            println!("{line}");
        }
        if outcome.failure.is_some() {
            failed += 1;
            println!("{}", outcome.line());
            if args.until_failure {
                break;
            }
        } else if options.trace || runs == 1 && args.seed.is_some() {
            println!("{}", outcome.line());
        }
    }
    println!("{runs} seeds run, {failed} failed");
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
