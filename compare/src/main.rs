//! `ringraft-compare`: see the library's docs and `scripts/compare.sh`.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use ringraft_compare::args::{Cli, Command, FloorArgs, TableArgs};
use ringraft_compare::report::{self, FloorResult, Meta, ResultLine};
use ringraft_compare::{floor, load};

fn append_line(path: &std::path::Path, line: &ResultLine) -> Result<(), String> {
    let json = serde_json::to_string(line).map_err(|e| format!("encoding the result: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(file, "{json}").map_err(|e| format!("{}: {e}", path.display()))
}

fn run_floor(args: &FloorArgs) -> Result<String, String> {
    args.check()?;
    let dir = args.dir.display().to_string();
    let fdatasync = floor::fdatasync_latency(&args.dir, args.fsync_iterations, true)
        .map_err(|e| format!("pwrite+fdatasync in {dir}: {e}"))?;
    let fdatasync_append = floor::fdatasync_latency(&args.dir, args.fsync_iterations, false)
        .map_err(|e| format!("appending pwrite+fdatasync in {dir}: {e}"))?;
    let rtt = floor::loopback_rtt(args.rtt_iterations)
        .map_err(|e| format!("loopback round trip: {e}"))?;
    let summary = format!(
        "floor: 4 KiB pwrite+fdatasync p50 {} ms p99 {} ms (appending: p50 {} ms p99 {} ms); loopback round trip p50 {} ms p99 {} ms",
        report::fmt_ms(fdatasync.value_at_quantile(0.5) as f64 / 1e6),
        report::fmt_ms(fdatasync.value_at_quantile(0.99) as f64 / 1e6),
        report::fmt_ms(fdatasync_append.value_at_quantile(0.5) as f64 / 1e6),
        report::fmt_ms(fdatasync_append.value_at_quantile(0.99) as f64 / 1e6),
        report::fmt_ms(rtt.value_at_quantile(0.5) as f64 / 1e6),
        report::fmt_ms(rtt.value_at_quantile(0.99) as f64 / 1e6),
    );
    append_line(
        &args.out,
        &ResultLine::Floor(FloorResult {
            round: args.round,
            dir,
            fdatasync_ns: report::to_buckets(&fdatasync),
            fdatasync_append_ns: report::to_buckets(&fdatasync_append),
            rtt_ns: report::to_buckets(&rtt),
        }),
    )?;
    Ok(summary)
}

fn run_table(args: &TableArgs) -> Result<String, String> {
    let text = std::fs::read_to_string(&args.results)
        .map_err(|e| format!("{}: {e}", args.results.display()))?;
    let lines =
        report::parse_results(&text).map_err(|e| format!("{}: {e}", args.results.display()))?;
    let table =
        report::build_table(&lines).map_err(|e| format!("{}: {e}", args.results.display()))?;
    let markdown = report::render_markdown(
        &table,
        &Meta {
            command: args.command.clone(),
            date: args.date.clone(),
            machine: args.machine.clone(),
            systems: args.systems.clone(),
        },
    );
    std::fs::write(&args.markdown, &markdown)
        .map_err(|e| format!("{}: {e}", args.markdown.display()))?;
    Ok(markdown)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Load(args) => args.check().and_then(|config| {
            let runtime =
                tokio::runtime::Runtime::new().map_err(|e| format!("starting the runtime: {e}"))?;
            let result = runtime
                .block_on(load::run(&config))
                .map_err(|e| e.to_string())?;
            let summary = report::summarize(&[&result]).map_err(|e| e.to_string())?;
            append_line(&args.out, &ResultLine::Run(result.clone()))?;
            Ok(format!(
                "{} {} {} clients {}: p50 {} ms p99 {} ms p999 {} ms, {} ops/s{}",
                result.system,
                result.durability,
                result.clients,
                report::fmt_size(result.size_bytes),
                report::fmt_ms(summary.p50_ms),
                report::fmt_ms(summary.p99_ms),
                report::fmt_ms(summary.p999_ms),
                report::fmt_rate(summary.ops_per_s),
                match (&result.first_error, result.errors) {
                    (Some(e), n) if n > 0 => format!(", {n} errors (first: {e})"),
                    _ => String::new(),
                }
            ))
        }),
        Command::Floor(args) => run_floor(&args),
        Command::Table(args) => run_table(&args),
    };
    match result {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringraft-compare: {e}");
            ExitCode::FAILURE
        }
    }
}
