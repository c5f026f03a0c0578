//! The command line of `ringraft-compare` and its bounds (pure: parsing
//! and checking only, so that tests drive it directly).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::report::{Durability, System};

/// Concurrent clients, at most.
pub const MAX_CLIENTS: usize = 1024;
/// Record (or value) size, at most: under etcd's default request limit
/// (1.5 MiB) and ringraft's default `--max-record` (1 MiB).
pub const MAX_RECORD_BYTES: usize = 1 << 20;
/// Warm-up or measured duration, at most.
pub const MAX_DURATION_SECS: u64 = 3600;
/// gRPC connections the clients share, at most.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections by default: one per client up to this many, then clients
/// share them round-robin (etcd's own `benchmark` tool likewise spreads
/// `--clients` over a few `--conns`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;
/// Floor iterations, at most.
pub const MAX_FLOOR_ITERATIONS: usize = 1_000_000;

/// The load generator of `scripts/compare.sh`.
#[derive(Parser, Debug)]
#[command(name = "ringraft-compare", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Closed-loop load against a running 3-node cluster; appends one JSON
    /// line (the run's result) to --out.
    Load(LoadArgs),
    /// Measures the physical floor (4 KiB pwrite+fdatasync in --dir, a
    /// loopback TCP round trip); appends one JSON line to --out.
    Floor(FloorArgs),
    /// Reads a results file and prints the side-by-side table; writes it as
    /// markdown to --markdown.
    Table(TableArgs),
}

/// `load`.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Which system the endpoints run.
    #[arg(long, value_enum)]
    pub system: System,
    /// The durability the cluster runs with (a label for the results: the
    /// script starts the cluster).
    #[arg(long, value_enum)]
    pub durability: Durability,
    /// Round number (a label for the results).
    #[arg(long, default_value_t = 1)]
    pub round: u32,
    /// Client API addresses of the members, `host:port`, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// Concurrent closed-loop clients.
    #[arg(long)]
    pub clients: usize,
    /// Bytes per record (ringraft) or per value (etcd): a number, or with
    /// B, KiB or MiB.
    #[arg(long, value_parser = parse_bytes)]
    pub size: usize,
    /// gRPC connections the clients share (default: one per client, at
    /// most 8).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 2)]
    pub warmup_secs: u64,
    /// Seconds measured.
    #[arg(long, default_value_t = 10)]
    pub duration_secs: u64,
    /// How long the cluster may take to elect a leader and accept a first
    /// write, seconds.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_secs: u64,
    /// How long one operation may take before it counts as failed,
    /// milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub op_timeout_ms: u64,
    /// Results file (JSON lines, appended to).
    #[arg(long)]
    pub out: PathBuf,
}

/// `load`'s arguments, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// The system.
    pub system: System,
    /// The durability label.
    pub durability: Durability,
    /// The round label.
    pub round: u32,
    /// Endpoints, `host:port`.
    pub endpoints: Vec<String>,
    /// Clients.
    pub clients: usize,
    /// Bytes per operation.
    pub size: usize,
    /// Shared connections.
    pub connections: usize,
    /// Warm-up.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Bound on the wait for a leader.
    pub ready_timeout: Duration,
    /// Bound on one operation.
    pub op_timeout: Duration,
}

impl LoadArgs {
    /// Checks the bounds.
    ///
    /// # Errors
    /// A message naming the flag out of bounds.
    pub fn check(&self) -> Result<LoadConfig, String> {
        if self.endpoints.iter().any(|e| e.trim().is_empty()) || self.endpoints.is_empty() {
            return Err("--endpoints: an empty address".into());
        }
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return Err(format!(
                "--clients {} is not in 1..={MAX_CLIENTS}",
                self.clients
            ));
        }
        if !(1..=MAX_RECORD_BYTES).contains(&self.size) {
            return Err(format!(
                "--size {} is not in 1..={MAX_RECORD_BYTES}",
                self.size
            ));
        }
        let connections = self
            .connections
            .unwrap_or_else(|| self.clients.min(DEFAULT_MAX_CONNECTIONS));
        if !(1..=MAX_CONNECTIONS.min(self.clients)).contains(&connections) {
            return Err(format!(
                "--connections {connections} is not in 1..={} (at most one per client)",
                MAX_CONNECTIONS.min(self.clients)
            ));
        }
        if self.warmup_secs > MAX_DURATION_SECS {
            return Err(format!("--warmup-secs is above {MAX_DURATION_SECS}"));
        }
        if !(1..=MAX_DURATION_SECS).contains(&self.duration_secs) {
            return Err(format!("--duration-secs is not in 1..={MAX_DURATION_SECS}"));
        }
        if !(1..=MAX_DURATION_SECS).contains(&self.ready_timeout_secs) {
            return Err(format!(
                "--ready-timeout-secs is not in 1..={MAX_DURATION_SECS}"
            ));
        }
        if !(1..=MAX_DURATION_SECS * 1000).contains(&self.op_timeout_ms) {
            return Err(format!(
                "--op-timeout-ms is not in 1..={}",
                MAX_DURATION_SECS * 1000
            ));
        }
        Ok(LoadConfig {
            system: self.system,
            durability: self.durability,
            round: self.round,
            endpoints: self
                .endpoints
                .iter()
                .map(|e| e.trim().to_string())
                .collect(),
            clients: self.clients,
            size: self.size,
            connections,
            warmup: Duration::from_secs(self.warmup_secs),
            duration: Duration::from_secs(self.duration_secs),
            ready_timeout: Duration::from_secs(self.ready_timeout_secs),
            op_timeout: Duration::from_millis(self.op_timeout_ms),
        })
    }
}

/// `floor`.
#[derive(Args, Debug, Clone)]
pub struct FloorArgs {
    /// Directory to write the test file in (the one the data dirs are in).
    #[arg(long)]
    pub dir: PathBuf,
    /// Round number (a label for the results).
    #[arg(long, default_value_t = 1)]
    pub round: u32,
    /// pwrite+fdatasync iterations (each kind).
    #[arg(long, default_value_t = 2000)]
    pub fsync_iterations: usize,
    /// Loopback round trips.
    #[arg(long, default_value_t = 20_000)]
    pub rtt_iterations: usize,
    /// Results file (JSON lines, appended to).
    #[arg(long)]
    pub out: PathBuf,
}

impl FloorArgs {
    /// Checks the bounds.
    ///
    /// # Errors
    /// A message naming the flag out of bounds.
    pub fn check(&self) -> Result<(), String> {
        for (flag, n) in [
            ("--fsync-iterations", self.fsync_iterations),
            ("--rtt-iterations", self.rtt_iterations),
        ] {
            if !(1..=MAX_FLOOR_ITERATIONS).contains(&n) {
                return Err(format!("{flag} {n} is not in 1..={MAX_FLOOR_ITERATIONS}"));
            }
        }
        Ok(())
    }
}

/// `table`.
#[derive(Args, Debug, Clone)]
pub struct TableArgs {
    /// Results file written by `load` and `floor`.
    #[arg(long)]
    pub results: PathBuf,
    /// Where to write the markdown.
    #[arg(long)]
    pub markdown: PathBuf,
    /// The command that made the results (shown above the table).
    #[arg(long)]
    pub command: Option<String>,
    /// When they were made.
    #[arg(long)]
    pub date: Option<String>,
    /// The machine.
    #[arg(long)]
    pub machine: Option<String>,
    /// The systems' versions and flags.
    #[arg(long)]
    pub systems: Option<String>,
}

/// Parses a byte count: `4096`, `64B`, `4KiB`, `1MiB` (also `k`/`K`/`KB`
/// and `m`/`M`/`MB` as powers of two, which is what a record size means
/// here).
///
/// # Errors
/// A message when it is not a number with a known unit, or overflows.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let number: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 64, 4KiB)"))?;
    let shift = match unit.trim() {
        "" | "B" | "b" => 0,
        "k" | "K" | "KB" | "KiB" | "kiB" | "kB" => 10,
        "m" | "M" | "MB" | "MiB" => 20,
        other => return Err(format!("{text:?}: unknown unit {other:?} (B, KiB, MiB)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ringraft-compare").chain(args.iter().copied()))
    }

    fn load(extra: &[&str]) -> Result<LoadConfig, String> {
        let mut args = vec![
            "load",
            "--system",
            "etcd",
            "--durability",
            "memory",
            "--endpoints",
            "127.0.0.1:1,127.0.0.1:2",
            "--out",
            "/tmp/r.jsonl",
        ];
        args.extend(extra);
        match parse(&args).map_err(|e| e.to_string())?.command {
            Command::Load(l) => l.check(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn byte_counts_take_binary_units() {
        assert_eq!(parse_bytes("64"), Ok(64));
        assert_eq!(parse_bytes("64B"), Ok(64));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes(" 1MiB "), Ok(1 << 20));
        assert!(parse_bytes("4 GB").is_err());
        assert!(parse_bytes("KiB").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes(&format!("{}M", usize::MAX)).is_err());
    }

    #[test]
    fn load_arguments_parse_with_defaults() {
        let c = load(&["--clients", "64", "--size", "4KiB"]).unwrap();
        assert_eq!(c.system, System::Etcd);
        assert_eq!(c.durability, Durability::Memory);
        assert_eq!(c.endpoints, vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(c.clients, 64);
        assert_eq!(c.size, 4096);
        assert_eq!(
            c.connections, DEFAULT_MAX_CONNECTIONS,
            "64 clients share 8 connections"
        );
        assert_eq!(c.warmup, Duration::from_secs(2));
        assert_eq!(c.duration, Duration::from_secs(10));
        assert_eq!(c.round, 1);
        let one = load(&["--clients", "1", "--size", "64", "--round", "2"]).unwrap();
        assert_eq!(one.connections, 1);
        assert_eq!(one.round, 2);
    }

    #[test]
    fn load_arguments_out_of_bounds_are_refused_by_name() {
        for (extra, flag) in [
            (vec!["--clients", "0", "--size", "64"], "--clients"),
            (vec!["--clients", "2000", "--size", "64"], "--clients"),
            (vec!["--clients", "1", "--size", "0"], "--size"),
            (vec!["--clients", "1", "--size", "2MiB"], "--size"),
            (
                vec!["--clients", "2", "--size", "64", "--connections", "3"],
                "--connections",
            ),
            (
                vec!["--clients", "1", "--size", "64", "--duration-secs", "0"],
                "--duration-secs",
            ),
            (
                vec!["--clients", "1", "--size", "64", "--op-timeout-ms", "0"],
                "--op-timeout-ms",
            ),
        ] {
            let err = load(&extra).unwrap_err();
            assert!(err.contains(flag), "{extra:?}: {err}");
        }
        assert!(load(&["--clients", "1"]).is_err(), "--size is required");
        assert!(
            parse(&["load", "--system", "zookeeper"]).is_err(),
            "unknown systems are refused"
        );
    }

    #[test]
    fn floor_and_table_arguments_parse() {
        let Command::Floor(f) = parse(&["floor", "--dir", "/tmp", "--out", "o"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!((f.fsync_iterations, f.rtt_iterations), (2000, 20_000));
        assert!(f.check().is_ok());
        let zero = FloorArgs {
            fsync_iterations: 0,
            ..f
        };
        assert!(zero.check().unwrap_err().contains("--fsync-iterations"));
        let Command::Table(t) = parse(&[
            "table",
            "--results",
            "r",
            "--markdown",
            "m.md",
            "--command",
            "scripts/compare.sh",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(t.command.as_deref(), Some("scripts/compare.sh"));
        assert_eq!(t.date, None);
    }
}
