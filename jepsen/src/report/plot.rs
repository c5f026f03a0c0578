//! The plot's data: fault windows from the nemesis events, and per time
//! bucket the throughput and latency of the operations as the checker
//! paired them.
//!
//! This module owns those series; it must never draw (that is [`super::svg`])
//! nor pair operations itself.

use std::collections::BTreeMap;

use crate::checker::{Operation, Outcome};
use crate::history::{Event, Op, Phase};

/// Most time buckets in the plot.
const MAX_PLOT_BUCKETS: u64 = 240;

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
pub(super) struct Buckets {
    /// Width of a bucket, ns.
    pub(super) width_ns: u64,
    /// Number of buckets.
    pub(super) count: usize,
    /// f -> ok completions per second, per bucket.
    pub(super) ok_rate: BTreeMap<String, Vec<f64>>,
    /// Failed and unknown completions per second, per bucket.
    pub(super) bad_rate: Vec<f64>,
    /// f -> per bucket (p50, max) in ms, None when no op completed.
    pub(super) latency_ms: BTreeMap<String, Vec<Option<(f64, f64)>>>,
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

/// The series of the plot over `span_ns`, from the checker's pairing of
/// the operations.
pub(super) fn buckets(events: &[Event], ops: &[Operation], span_ns: u64) -> Buckets {
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

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
}
