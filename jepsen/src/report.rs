//! The checker's outputs in a run directory: `report.txt` (for people),
//! `report.json` (for tools), `plot.svg` (throughput and latency over time,
//! fault windows shaded) and `history.edn` (the history in Jepsen's EDN
//! format, for Knossos or Elle users).
//!
//! This module only renders what [`crate::checker`] decided and what the
//! history holds; it must never judge validity itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use crate::checker::{self, AnomalyKind, CheckError, Outcome, Run, Verdict};
use crate::history::{Event, EventType, Op, Phase, Process};

/// Anomalies listed in `report.txt` per kind (all are in `report.json`).
const MAX_TEXT_ANOMALIES_PER_KIND: usize = 20;
/// Most time buckets in the plot.
const MAX_PLOT_BUCKETS: u64 = 240;

/// Checks a run directory and writes `report.txt`, `report.json`,
/// `plot.svg` and `history.edn` into it. `Ok(true)`: valid; `Ok(false)`:
/// violations found; `Err`: the input is unusable (nothing is written then,
/// except `history.edn` and `plot.svg` when the history itself was readable).
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

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// `report.txt`.
pub fn render_text(run: &Run, verdict: &Verdict) -> String {
    let mut out = String::new();
    let info = &run.info;
    let s = &verdict.summary;
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
    if verdict.anomalies.is_empty() {
        let _ = writeln!(out, "Anomalies: none");
    } else {
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
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Verdict: {}",
        if verdict.valid { "VALID" } else { "INVALID" }
    );
    out
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

// ---------------------------------------------------------------- EDN

/// `history.edn`: one EDN map per line, in history order, as Jepsen writes
/// it: `{:index 0, :type :invoke, :f :append, :value {:data "x"}, :process 0, :time 12}`.
pub fn render_edn(events: &[Event]) -> String {
    let mut out = String::new();
    for (i, ev) in events.iter().enumerate() {
        out.push_str(&edn_event(i, ev));
        out.push('\n');
    }
    out
}

/// One event as an EDN map; `index` is its position in the history.
pub fn edn_event(index: usize, ev: &Event) -> String {
    let mut s = format!("{{:index {index}, :type :{}, :f ", ev.kind.as_str());
    match &ev.op {
        Op::Nemesis { fault, .. } => s.push_str(&edn_keyword_or_string(fault)),
        other => {
            s.push(':');
            s.push_str(other.f());
        }
    }
    s.push_str(", :value ");
    match &ev.op {
        Op::Append(v) => {
            let _ = write!(s, "{{:data {}", edn_string(&v.data));
            if let Some(index) = v.index {
                let _ = write!(s, ", :index {index}");
            }
            if let (Some(client), Some(seq)) = (v.client, v.seq) {
                let _ = write!(s, ", :client {client}, :seq {seq}");
            }
            s.push('}');
        }
        Op::Read(v) => {
            let _ = write!(
                s,
                "{{:from {}, :to {}, :consistency :{}",
                v.from,
                v.to.map_or("nil".to_string(), |t| t.to_string()),
                v.consistency.as_str()
            );
            if let Some(records) = &v.records {
                s.push_str(", :records [");
                for (i, rec) in records.iter().enumerate() {
                    if i > 0 {
                        s.push(' ');
                    }
                    let _ = write!(
                        s,
                        "{{:index {}, :data {}}}",
                        rec.index,
                        edn_string(&rec.data)
                    );
                }
                s.push(']');
            }
            s.push('}');
        }
        Op::Nemesis { value, .. } => s.push_str(&edn_value(value)),
    }
    match ev.process {
        Process::Client(p) => {
            let _ = write!(s, ", :process {p}");
        }
        Process::Nemesis => s.push_str(", :process :nemesis"),
    }
    let _ = write!(s, ", :time {}", ev.time);
    if let Op::Nemesis {
        phase: Some(phase), ..
    } = &ev.op
    {
        let _ = write!(s, ", :phase :{}", phase.as_str());
    }
    if let Some(node) = ev.node {
        let _ = write!(s, ", :node {node}");
    }
    if let Some(error) = &ev.error {
        let _ = write!(s, ", :error {}", edn_string(error));
    }
    s.push('}');
    s
}

/// An EDN string literal.
pub fn edn_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Whether `name` can be written as the EDN keyword `:name`.
fn is_keyword_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || "*+!-_?".contains(first))
        && chars.all(|c| c.is_ascii_alphanumeric() || "*+!-_?<>=.".contains(c))
}

fn edn_keyword_or_string(name: &str) -> String {
    if is_keyword_name(name) {
        format!(":{name}")
    } else {
        edn_string(name)
    }
}

/// A JSON value as EDN: objects become maps (keys as keywords where they can
/// be), arrays vectors, null nil.
pub fn edn_value(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => edn_string(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(edn_value).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{} {}", edn_keyword_or_string(k), edn_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

// ---------------------------------------------------------------- plot

/// A fault window for the plot.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultWindow {
    /// The fault (`partition`, `kill`, ...).
    pub fault: String,
    /// Its targets, as JSON text.
    pub targets: String,
    /// Start, ns.
    pub start: u64,
    /// End, ns (the end of the history for a window never closed).
    pub end: u64,
    /// A single-instant event (no window).
    pub instant: bool,
}

/// Fault windows from the nemesis events: a `start` opens a window that the
/// matching `stop` closes; a kill ends at a `restart`, a pause at a `resume`,
/// partitions at a `heal`. Events without a phase are instants.
pub fn fault_windows(events: &[Event]) -> Vec<FaultWindow> {
    let end_of_history = events.iter().map(|e| e.time).max().unwrap_or(0);
    let mut open: Vec<FaultWindow> = Vec::new();
    let mut done: Vec<FaultWindow> = Vec::new();
    let closes = |fault: &str, closer: &str, phase: Option<Phase>| -> bool {
        (closer == fault && phase == Some(Phase::Stop))
            || (closer == "restart" && fault == "kill")
            || (closer == "resume" && fault == "pause")
            || (closer == "heal" && fault.starts_with("partition"))
    };
    for ev in events {
        let Op::Nemesis {
            fault,
            value,
            phase,
        } = &ev.op
        else {
            continue;
        };
        let targets = value.to_string();
        // Close the oldest matching open window (same targets preferred).
        let matching: Vec<usize> = (0..open.len())
            .filter(|&i| closes(&open[i].fault, fault, *phase))
            .collect();
        let closing_all = fault == "heal";
        let chosen: Vec<usize> = if closing_all {
            matching
        } else {
            matching
                .iter()
                .copied()
                .find(|&i| open[i].targets == targets)
                .or(matching.first().copied())
                .into_iter()
                .collect()
        };
        let closed_something = !chosen.is_empty();
        for &i in chosen.iter().rev() {
            let mut w = open.remove(i);
            w.end = ev.time;
            done.push(w);
        }
        match phase {
            Some(Phase::Start) => open.push(FaultWindow {
                fault: fault.clone(),
                targets,
                start: ev.time,
                end: end_of_history,
                instant: false,
            }),
            Some(Phase::Stop) => {}
            None if closed_something && fault != "heal" => {}
            None => done.push(FaultWindow {
                fault: fault.clone(),
                targets,
                start: ev.time,
                end: ev.time,
                instant: true,
            }),
        }
    }
    done.extend(open);
    done.sort_by_key(|w| (w.start, w.end));
    done
}

/// Per time bucket: ok completions per second by f, failed/unknown per
/// second, and latency quantiles of ok operations by f.
struct Buckets {
    width_ns: u64,
    count: usize,
    ok_rate: BTreeMap<String, Vec<f64>>,
    bad_rate: Vec<f64>,
    /// f -> per bucket (p50, max) in ms, None when no op completed.
    latency_ms: BTreeMap<String, Vec<Option<(f64, f64)>>>,
}

fn bucket_width_ns(span_ns: u64) -> u64 {
    const STEPS_MS: [u64; 12] = [
        100, 250, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 300_000, 600_000,
    ];
    for ms in STEPS_MS {
        if span_ns / (ms * 1_000_000) < MAX_PLOT_BUCKETS {
            return ms * 1_000_000;
        }
    }
    span_ns / MAX_PLOT_BUCKETS + 1
}

fn buckets(events: &[Event], ops: &[checker::Operation], span_ns: u64) -> Buckets {
    let width_ns = bucket_width_ns(span_ns.max(1));
    let count = (span_ns / width_ns + 1) as usize;
    let per_s = 1e9 / width_ns as f64;
    let mut ok_rate: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut bad_rate = vec![0.0; count];
    let mut lat: BTreeMap<String, Vec<Vec<u64>>> = BTreeMap::new();
    for op in ops {
        let Some(done) = op.completion.map(|c| &events[c]) else {
            continue;
        };
        let b = ((done.time / width_ns) as usize).min(count - 1);
        let f = done.op.f().to_string();
        match op.outcome {
            Outcome::Ok => {
                ok_rate.entry(f.clone()).or_insert_with(|| vec![0.0; count])[b] += per_s;
                let latency = done.time.saturating_sub(events[op.invoke].time);
                lat.entry(f).or_insert_with(|| vec![Vec::new(); count])[b].push(latency);
            }
            _ => bad_rate[b] += per_s,
        }
    }
    let latency_ms = lat
        .into_iter()
        .map(|(f, per_bucket)| {
            let series = per_bucket
                .into_iter()
                .map(|mut v| {
                    if v.is_empty() {
                        return None;
                    }
                    v.sort_unstable();
                    let p50 = v[(v.len() - 1) / 2] as f64 / 1e6;
                    let max = v[v.len() - 1] as f64 / 1e6;
                    Some((p50, max))
                })
                .collect();
            (f, series)
        })
        .collect();
    Buckets {
        width_ns,
        count,
        ok_rate,
        bad_rate,
        latency_ms,
    }
}

fn svg_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fault_color(fault: &str) -> &'static str {
    match fault {
        f if f.starts_with("partition") => "#f4a582",
        "kill" | "restart" => "#d6604d",
        "pause" | "resume" => "#92c5de",
        "corrupt" | "truncate" => "#b2abd2",
        "membership" => "#a6dba0",
        "transfer" => "#fddbc7",
        _ => "#cccccc",
    }
}

const SERIES_COLORS: [&str; 4] = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];

/// `plot.svg`: ok throughput per second (top) and ok latency p50/max in ms
/// on a log scale (bottom), against seconds since the start, with the fault
/// windows shaded and labelled.
pub fn render_svg(events: &[Event]) -> String {
    const W: f64 = 1100.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 150.0;
    const PLOT_W: f64 = W - LEFT - RIGHT;
    const PANEL_H: f64 = 220.0;
    const LANE_H: f64 = 14.0;

    // Best effort: a history the checker rejects still gets a plot of what pairs.
    let ops = pair_leniently(events);
    let span_ns = events.iter().map(|e| e.time).max().unwrap_or(0).max(1);
    let b = buckets(events, &ops, span_ns);
    let windows = fault_windows(events);

    // Lanes for fault labels: greedy, so overlapping windows stack.
    let mut lane_end: Vec<u64> = Vec::new();
    let mut lanes = Vec::with_capacity(windows.len());
    for w in &windows {
        let end = w.end.max(w.start + span_ns / 50);
        let lane = lane_end
            .iter()
            .position(|&e| e <= w.start)
            .unwrap_or(lane_end.len());
        if lane == lane_end.len() {
            lane_end.push(end);
        } else {
            lane_end[lane] = end;
        }
        lanes.push(lane);
    }
    let label_h = LANE_H * lane_end.len().max(1) as f64 + 6.0;
    let top1 = 40.0 + label_h;
    let top2 = top1 + PANEL_H + 50.0;
    let height = top2 + PANEL_H + 50.0;
    let x_of = |ns: u64| LEFT + PLOT_W * (ns as f64 / span_ns as f64);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14">ringraft-jepsen: throughput and latency of ok operations (buckets of {} ms), fault windows shaded</text>"#,
        b.width_ns / 1_000_000
    );

    // Fault windows: shading across both panels, labels in lanes above.
    for (w, &lane) in windows.iter().zip(&lanes) {
        let x0 = x_of(w.start);
        let x1 = x_of(w.end).max(x0 + 1.5);
        let color = fault_color(&w.fault);
        let title = svg_escape(&format!(
            "{} {} from {:.3} s to {:.3} s",
            w.fault,
            w.targets,
            secs(w.start),
            secs(w.end)
        ));
        for (top, h) in [(top1, PANEL_H), (top2, PANEL_H)] {
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{h}" fill="{color}" fill-opacity="{}"><title>{title}</title></rect>"#,
                x1 - x0,
                if w.instant { 0.9 } else { 0.35 }
            );
        }
        let y = 34.0 + LANE_H * lane as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{}" fill="{color}"><title>{title}</title></rect>"#,
            y - 10.0,
            x1 - x0,
            LANE_H - 2.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{y:.1}" font-size="10">{}</text>"#,
            x0 + 2.0,
            svg_escape(&w.fault)
        );
    }

    // Top panel: throughput.
    let mut max_rate: f64 = b.bad_rate.iter().copied().fold(1.0, f64::max);
    for series in b.ok_rate.values() {
        max_rate = series.iter().copied().fold(max_rate, f64::max);
    }
    let rate_top = nice_ceiling(max_rate);
    axes(&mut s, top1, PANEL_H, PLOT_W, LEFT, span_ns, "ok ops/s");
    for i in 0..=4 {
        let v = rate_top * i as f64 / 4.0;
        let y = top1 + PANEL_H - PANEL_H * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 4.0,
            y + 4.0,
            fmt_num(v)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/>"##,
            LEFT + PLOT_W
        );
    }
    let x_mid = |i: usize| x_of(((i as u64) * b.width_ns + b.width_ns / 2).min(span_ns));
    let rate_y = |v: f64| top1 + PANEL_H - PANEL_H * (v / rate_top);
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    for (k, (f, series)) in b.ok_rate.iter().enumerate() {
        let color = SERIES_COLORS[k % SERIES_COLORS.len()];
        polyline(
            &mut s,
            (0..b.count).map(|i| Some((x_mid(i), rate_y(series[i])))),
            color,
            false,
        );
        legend.push((format!("{f} ok/s"), color, false));
    }
    if b.bad_rate.iter().any(|&v| v > 0.0) {
        polyline(
            &mut s,
            (0..b.count).map(|i| Some((x_mid(i), rate_y(b.bad_rate[i])))),
            "#d62728",
            false,
        );
        legend.push(("fail+info/s".into(), "#d62728", false));
    }
    draw_legend(&mut s, &legend, LEFT + PLOT_W + 10.0, top1 + 10.0);

    // Bottom panel: latency, log scale.
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for series in b.latency_ms.values() {
        for (p50, max) in series.iter().flatten() {
            lo = lo.min(*p50);
            hi = hi.max(*max);
        }
    }
    if hi <= 0.0 {
        (lo, hi) = (0.1, 10.0);
    }
    let decade_lo = lo.max(1e-3).log10().floor() as i32;
    let decade_hi = (hi.log10().ceil() as i32).max(decade_lo + 1);
    axes(
        &mut s,
        top2,
        PANEL_H,
        PLOT_W,
        LEFT,
        span_ns,
        "latency ms (log)",
    );
    let lat_y = |v: f64| {
        let t = (v.max(1e-3).log10() - decade_lo as f64) / (decade_hi - decade_lo) as f64;
        top2 + PANEL_H - PANEL_H * t
    };
    for d in decade_lo..=decade_hi {
        let v = 10f64.powi(d);
        let y = lat_y(v);
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 4.0,
            y + 4.0,
            fmt_num(v)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/>"##,
            LEFT + PLOT_W
        );
    }
    let mut legend: Vec<(String, &str, bool)> = Vec::new();
    for (k, (f, series)) in b.latency_ms.iter().enumerate() {
        let color = SERIES_COLORS[k % SERIES_COLORS.len()];
        polyline(
            &mut s,
            series
                .iter()
                .enumerate()
                .map(|(i, v)| v.map(|(p50, _)| (x_mid(i), lat_y(p50)))),
            color,
            false,
        );
        polyline(
            &mut s,
            series
                .iter()
                .enumerate()
                .map(|(i, v)| v.map(|(_, max)| (x_mid(i), lat_y(max)))),
            color,
            true,
        );
        legend.push((format!("{f} p50"), color, false));
        legend.push((format!("{f} max"), color, true));
    }
    draw_legend(&mut s, &legend, LEFT + PLOT_W + 10.0, top2 + 10.0);
    s.push_str("</svg>\n");
    s
}

fn pair_leniently(events: &[Event]) -> Vec<checker::Operation> {
    if let Ok(ops) = checker::pair_operations(events) {
        return ops;
    }
    let mut ops = Vec::new();
    let mut open: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, ev) in events.iter().enumerate() {
        let Process::Client(p) = ev.process else {
            continue;
        };
        if ev.kind == EventType::Invoke {
            open.insert(p, ops.len());
            ops.push(checker::Operation {
                process: p,
                invoke: i,
                completion: None,
                outcome: Outcome::Pending,
            });
        } else if let Some(op) = open.remove(&p) {
            ops[op].completion = Some(i);
            ops[op].outcome = match ev.kind {
                EventType::Ok => Outcome::Ok,
                EventType::Fail => Outcome::Fail,
                _ => Outcome::Info,
            };
        }
    }
    ops
}

fn axes(s: &mut String, top: f64, h: f64, w: f64, left: f64, span_ns: u64, label: &str) {
    let bottom = top + h;
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"##,
        top + h / 2.0,
        top + h / 2.0,
        svg_escape(label)
    );
    let span_s = secs(span_ns);
    let step = nice_ceiling(span_s / 10.0);
    let mut t = 0.0;
    while t <= span_s + 1e-9 {
        let x = left + w * (t / span_s);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{bottom}" y2="{:.1}" stroke="#444"/>"##,
            bottom + 4.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            bottom + 16.0,
            fmt_num(t)
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text>"##,
        left + w / 2.0,
        bottom + 32.0
    );
}

fn polyline(
    s: &mut String,
    points: impl Iterator<Item = Option<(f64, f64)>>,
    color: &str,
    dashed: bool,
) {
    // Break the line where a bucket has no data.
    let mut segment: Vec<String> = Vec::new();
    let dash = if dashed {
        r#" stroke-dasharray="4 3""#
    } else {
        ""
    };
    let flush = |segment: &mut Vec<String>, s: &mut String| {
        if segment.len() == 1 {
            let xy: Vec<&str> = segment[0].split(',').collect();
            let _ = writeln!(
                s,
                r#"<circle cx="{}" cy="{}" r="1.8" fill="{color}"/>"#,
                xy[0], xy[1]
            );
        } else if segment.len() > 1 {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{}"/>"#,
                segment.join(" ")
            );
        }
        segment.clear();
    };
    for p in points {
        match p {
            Some((x, y)) => segment.push(format!("{x:.1},{y:.1}")),
            None => flush(&mut segment, s),
        }
    }
    flush(&mut segment, s);
}

fn draw_legend(s: &mut String, items: &[(String, &str, bool)], x: f64, y: f64) {
    for (i, (label, color, dashed)) in items.iter().enumerate() {
        let yy = y + 16.0 * i as f64;
        let dash = if *dashed {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
            x + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 24.0,
            yy + 4.0,
            svg_escape(label)
        );
    }
}

/// 1, 2, 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v - 1e-12 {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Consistency, ReadRecord};

    #[test]
    fn edn_escapes_strings() {
        assert_eq!(
            edn_string("a\"b\\c\nd\te\u{1}é"),
            "\"a\\\"b\\\\c\\nd\\te\\u0001é\""
        );
    }

    #[test]
    fn edn_events_look_like_jepsen() {
        let ok = Event::append_completion(12345, 0, EventType::Ok, "x", Some(3));
        assert_eq!(
            edn_event(7, &ok),
            r#"{:index 7, :type :ok, :f :append, :value {:data "x", :index 3}, :process 0, :time 12345}"#
        );
        let read = Event::read_completion(
            9,
            2,
            EventType::Ok,
            1,
            None,
            Consistency::Lease,
            Some(vec![
                ReadRecord {
                    index: 1,
                    data: "a".into(),
                },
                ReadRecord {
                    index: 3,
                    data: "b".into(),
                },
            ]),
        )
        .with_node(3)
        .with_error("e\"");
        assert_eq!(
            edn_event(0, &read),
            r#"{:index 0, :type :ok, :f :read, :value {:from 1, :to nil, :consistency :lease, :records [{:index 1, :data "a"} {:index 3, :data "b"}]}, :process 2, :time 9, :node 3, :error "e\""}"#
        );
        let nem = Event::nemesis(
            5,
            "partition",
            json!({"groups": [[1], [2, 3]], "2x": null}),
            Some(Phase::Start),
        );
        assert_eq!(
            edn_event(1, &nem),
            r#"{:index 1, :type :info, :f :partition, :value {"2x" nil, :groups [[1] [2 3]]}, :process :nemesis, :time 5, :phase :start}"#
        );
    }

    #[test]
    fn fault_windows_pair_starts_with_their_ends() {
        let events = vec![
            Event::nemesis(10, "kill", json!([2]), Some(Phase::Start)),
            Event::nemesis(15, "partition", json!({"isolate": 1}), Some(Phase::Start)),
            Event::nemesis(20, "restart", json!([2]), None),
            Event::nemesis(30, "heal", Value::Null, None),
            Event::nemesis(40, "pause", json!([3]), Some(Phase::Start)),
            Event::nemesis(45, "transfer", json!({"to": 1}), None),
            Event::append_invoke(60, 0, "a"),
        ];
        let w = fault_windows(&events);
        let spans: Vec<(&str, u64, u64, bool)> = w
            .iter()
            .map(|w| (w.fault.as_str(), w.start, w.end, w.instant))
            .collect();
        assert_eq!(
            spans,
            vec![
                ("kill", 10, 20, false),
                ("partition", 15, 30, false),
                ("heal", 30, 30, true),
                ("pause", 40, 60, false),
                ("transfer", 45, 45, true),
            ]
        );
    }

    #[test]
    fn svg_has_both_panels_and_the_windows() {
        let mut events = vec![Event::nemesis(
            1_000_000_000,
            "partition",
            json!("x<y"),
            Some(Phase::Start),
        )];
        for i in 0..50u64 {
            let t = i * 100_000_000;
            events.push(Event::append_invoke(t, i, format!("v{i}")));
            events.push(Event::append_completion(
                t + 3_000_000,
                i,
                EventType::Ok,
                format!("v{i}"),
                Some(i + 1),
            ));
        }
        events.push(Event::nemesis(
            3_000_000_000,
            "partition",
            json!("x<y"),
            Some(Phase::Stop),
        ));
        events.sort_by_key(|e| e.time);
        let svg = render_svg(&events);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("ok ops/s") && svg.contains("latency ms (log)"));
        assert!(
            svg.contains("partition &quot;x&lt;y&quot; from 1.000 s to 3.000 s"),
            "{svg}"
        );
        assert!(svg.contains("append p50") && svg.contains("append max"));
    }

    #[test]
    fn nice_ceiling_rounds_up() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(10.0), 10.0);
        assert_eq!(nice_ceiling(11.0), 20.0);
        assert_eq!(nice_ceiling(0.03), 0.05);
    }
}
