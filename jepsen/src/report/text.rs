//! `report.txt`: the run's parameters, what the clients did, what the nodes
//! hold, what was checked, the anomalies by kind, and the verdict.
//!
//! This module owns the text layout of a report; it must never judge the
//! history (every figure comes from the checker's [`Verdict`]).

use std::fmt::Write as _;

use crate::checker::{AnomalyKind, Run, Verdict};

/// Anomalies listed in `report.txt` per kind (all are in `report.json`).
const MAX_TEXT_ANOMALIES_PER_KIND: usize = 20;

/// `report.txt`.
pub fn render_text(run: &Run, verdict: &Verdict) -> String {
    let mut out = String::new();
    write_run(&mut out, run);
    write_client_ops(&mut out, verdict);
    write_final_logs(&mut out, verdict);
    write_anomalies(&mut out, verdict);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Verdict: {}",
        if verdict.valid { "VALID" } else { "INVALID" }
    );
    out
}

fn write_run(out: &mut String, run: &Run) {
    let info = &run.info;
    let _ = writeln!(out, "ringraft-jepsen report: {}", run.dir.display());
    let _ = writeln!(
        out,
        "seed {} | substrate {} | nodes {:?} | clients {} | duration {} s | nemeses [{}] | planted bug {} | started {}",
        info.seed,
        info.substrate,
        info.nodes,
        info.clients,
        info.duration_s,
        info.nemeses.join(", "),
        info.planted_bug.as_deref().unwrap_or("none"),
        info.started_at
    );
    let _ = writeln!(out);
}

fn write_client_ops(out: &mut String, verdict: &Verdict) {
    let s = &verdict.summary;
    let _ = writeln!(out, "Client operations (events by f and type):");
    let _ = writeln!(
        out,
        "  {:<8} {:>9} {:>9} {:>9} {:>9}",
        "f", "invoke", "ok", "fail", "info"
    );
    for (f, by_type) in &s.events_by_f_type {
        let get = |t: &str| by_type.get(t).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<8} {:>9} {:>9} {:>9} {:>9}",
            f,
            get("invoke"),
            get("ok"),
            get("fail"),
            get("info")
        );
    }
    let _ = writeln!(
        out,
        "  never completed (treated as info): {}",
        s.pending_ops
    );
    if !s.nemesis_events.is_empty() {
        let list: Vec<String> = s
            .nemesis_events
            .iter()
            .map(|(f, n)| format!("{f} {n}"))
            .collect();
        let _ = writeln!(out, "Nemesis events: {}", list.join(", "));
    }
    let _ = writeln!(out);
}

fn write_final_logs(out: &mut String, verdict: &Verdict) {
    let s = &verdict.summary;
    let _ = writeln!(out, "Final logs:");
    for (node, len) in &s.final_log_len {
        let last = s.final_log_last_index.get(node).copied().unwrap_or(0);
        let _ = writeln!(out, "  node {node}: {len} records, last index {last}");
    }
    for m in &verdict.unchecked_nodes {
        let _ = writeln!(out, "  node {}: NOT CHECKED ({})", m.node, m.reason);
    }
    let _ = writeln!(out, "  total order: {} records", s.total_order_len);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Checked: {} acknowledged appends; unknown-outcome appends {} present, {} absent; {} ok reads returning {} records",
        s.acked_appends,
        s.unknown_appends_present,
        s.unknown_appends_absent,
        s.reads_checked,
        s.read_records_checked
    );
    let _ = writeln!(out);
}

fn write_anomalies(out: &mut String, verdict: &Verdict) {
    if verdict.anomalies.is_empty() {
        let _ = writeln!(out, "Anomalies: none");
        return;
    }
    let counts = verdict.counts_by_kind();
    let list: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        out,
        "Anomalies: {} ({})",
        verdict.anomalies.len(),
        list.join(", ")
    );
    let mut kind: Option<AnomalyKind> = None;
    let mut shown = 0;
    for a in &verdict.anomalies {
        if kind != Some(a.kind) {
            kind = Some(a.kind);
            shown = 0;
            let _ = writeln!(out, "\n  [{}] x{}", a.kind, counts[&a.kind]);
        }
        shown += 1;
        if shown > MAX_TEXT_ANOMALIES_PER_KIND {
            if shown == MAX_TEXT_ANOMALIES_PER_KIND + 1 {
                let _ = writeln!(out, "  ... more in report.json");
            }
            continue;
        }
        let _ = writeln!(out, "  - {}", a.message);
        for op in &a.ops {
            let _ = writeln!(out, "      op: {op}");
        }
        if !a.nodes.is_empty() {
            let _ = writeln!(out, "      nodes: {:?}", a.nodes);
        }
    }
}
