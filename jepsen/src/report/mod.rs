//! The checker's outputs in a run directory: `report.txt` (for people,
//! `text`), `report.json` (for tools), `plot.svg` (throughput and latency
//! over time, fault windows shaded: `plot` computes the series, `svg`
//! draws them) and `history.edn` (the history in Jepsen's EDN format, for
//! Knossos or Elle users: `edn`).
//!
//! This module only renders what the checker (`ringraft-checker`) decided
//! and what the history holds, with the checker's pairing of operations; it
//! must never judge validity itself, nor pair operations its own way.

mod edn;
mod plot;
mod svg;
mod text;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::checker::{self, CheckError, Run, Verdict};

pub use edn::{edn_event, edn_string, edn_value, render_edn};
pub use plot::{FaultWindow, fault_windows};
pub use svg::render_svg;
pub use text::render_text;

/// Checks a run directory and writes `report.txt`, `report.json`,
/// `plot.svg` and `history.edn` into it. `Ok(true)`: valid; `Ok(false)`:
/// violations found; `Err`: the input is unusable (nothing is written then,
/// except `history.edn` and `plot.svg` when the history itself was readable).
///
/// # Errors
///
/// A [`CheckError`] when the run cannot be loaded or checked, or an output
/// cannot be written.
pub fn check_and_report(run_dir: &Path) -> Result<bool, CheckError> {
    let run = checker::load_run(run_dir)?;
    // Jepsen's EDN and the plot are useful even when the checker refuses.
    write_file(&run_dir.join("history.edn"), &render_edn(&run.events))?;
    write_file(&run_dir.join("plot.svg"), &render_svg(&run.events))?;
    let verdict = checker::check_run(&run)?;
    write_file(&run_dir.join("report.txt"), &render_text(&run, &verdict))?;
    let json =
        serde_json::to_string_pretty(&render_json(&run, &verdict)).expect("report JSON serializes");
    write_file(&run_dir.join("report.json"), &(json + "\n"))?;
    Ok(verdict.valid)
}

/// The process exit status for a [`check_and_report`] result: 0 valid,
/// 1 violation, 2 unusable input.
pub fn exit_code(result: &Result<bool, CheckError>) -> i32 {
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(_) => 2,
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), CheckError> {
    std::fs::write(path, text).map_err(|source| CheckError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Nanoseconds as seconds.
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// `report.json`.
pub fn render_json(run: &Run, verdict: &Verdict) -> Value {
    let counts: BTreeMap<String, usize> = verdict
        .counts_by_kind()
        .into_iter()
        .map(|(k, n)| (k.name().to_string(), n))
        .collect();
    json!({
        "valid": verdict.valid,
        "run": run.info,
        "summary": verdict.summary,
        "unchecked_nodes": verdict.unchecked_nodes,
        "anomaly_counts": counts,
        "anomalies": verdict.anomalies,
    })
}
