//! The rules: given a history paired into operations and the nodes' final
//! logs, every anomaly of a replicated, linearizable, append-only log
//! (the table in `checker/CHECKER.md`).
//!
//! This module owns [`check_history`] and the rules' shared state; each
//! family of rules lives in a submodule of its own. It must never read
//! files, the clock or a random source, and never depend on ringraft's
//! code: the rules judge the history and the final logs only.

mod appends;
mod order;
mod ordering;
mod reads;
mod stale_leader;
mod terms;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::CheckError;
use crate::history::{Event, FinalLogs, Op, Process};
use crate::pairing::{Operation, Outcome, pair_operations};
use crate::verdict::{Anomaly, AnomalyKind, OpRef, Summary, Verdict};

pub use stale_leader::{IsolationWindow, isolation_windows};

/// Checks a history against the nodes' final logs (`node id -> records`).
/// An error means the history is structurally broken; anomalies of the
/// cluster are in the [`Verdict`]. Pure: no I/O, no clock, no randomness
/// (the deterministic simulator calls it too).
///
/// # Errors
///
/// [`CheckError::Structure`] when the history breaks the structural rules
/// (see [`crate::pair_operations`]).
pub fn check_history(events: &[Event], finals: &FinalLogs) -> Result<Verdict, CheckError> {
    let ops = pair_operations(events)?;
    let windows = isolation_windows(events)?;
    let mut ck = Checker {
        events,
        ops: &ops,
        anomalies: Vec::new(),
        summary: Summary::default(),
    };
    ck.count_events();
    let order = ck.build_total_order(finals);
    ck.check_appends(&order);
    ck.check_reads(&order);
    ck.check_real_time_order(&order);
    ck.check_client_order(&order);
    ck.check_terms(finals);
    ck.check_stale_leaders(&windows, finals);
    let mut anomalies = ck.anomalies;
    anomalies.sort_by_key(|a| a.kind); // stable: keeps discovery order within a kind
    Ok(Verdict {
        valid: anomalies.is_empty(),
        anomalies,
        summary: ck.summary,
        unchecked_nodes: Vec::new(),
    })
}

/// The rules' shared state: the history, its operations, and what they
/// found so far.
pub(crate) struct Checker<'a> {
    pub(crate) events: &'a [Event],
    pub(crate) ops: &'a [Operation],
    pub(crate) anomalies: Vec<Anomaly>,
    pub(crate) summary: Summary,
}

impl<'a> Checker<'a> {
    pub(crate) fn report(
        &mut self,
        kind: AnomalyKind,
        message: String,
        ops: Vec<OpRef>,
        nodes: Vec<u64>,
        indexes: Vec<u64>,
    ) {
        self.anomalies.push(Anomaly {
            kind,
            message,
            ops,
            nodes,
            indexes,
        });
    }

    pub(crate) fn op_ref(&self, op: usize) -> OpRef {
        OpRef::new(&self.ops[op], self.events)
    }

    fn count_events(&mut self) {
        for ev in self.events {
            match ev.process {
                Process::Nemesis => {
                    *self
                        .summary
                        .nemesis_events
                        .entry(ev.op.f().to_string())
                        .or_insert(0) += 1
                }
                Process::Client(_) => {
                    *self
                        .summary
                        .events_by_f_type
                        .entry(ev.op.f().to_string())
                        .or_default()
                        .entry(ev.kind.as_str().to_string())
                        .or_insert(0) += 1;
                }
            }
        }
        self.summary.pending_ops = self
            .ops
            .iter()
            .filter(|o| o.outcome == Outcome::Pending)
            .count() as u64;
    }

    /// The append operations of these data (for evidence).
    pub(crate) fn ops_for_data<'d>(&self, data: impl IntoIterator<Item = &'d str>) -> Vec<OpRef> {
        let by_data = self.appends_by_data();
        data.into_iter()
            .filter_map(|d| by_data.get(d).map(|&op| self.op_ref(op)))
            .collect()
    }

    pub(crate) fn appends_by_data(&self) -> HashMap<&'a str, usize> {
        let events = self.events;
        self.ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match &events[op.invoke].op {
                Op::Append(v) => Some((v.data.as_str(), i)),
                _ => None,
            })
            .collect()
    }
}

pub(crate) fn op_node(op: &Operation, events: &[Event]) -> Vec<u64> {
    op.last_event(events)
        .node
        .or(events[op.invoke].node)
        .into_iter()
        .collect()
}

pub(crate) fn fmt_to(to: Option<u64>) -> String {
    to.map_or("tail".to_string(), |t| t.to_string())
}

pub(crate) fn fmt_list(items: &[u64]) -> String {
    const SHOWN: usize = 10;
    let mut s = items
        .iter()
        .take(SHOWN)
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(", ... ({} in all)", items.len()));
    }
    s
}

/// The distinct values of `items`, in ascending order.
pub(crate) fn sorted_distinct(items: impl IntoIterator<Item = u64>) -> Vec<u64> {
    items
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

pub(crate) fn describe_places(places: &[(u64, u64)]) -> String {
    let mut by_index: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(node, index) in places {
        by_index.entry(index).or_default().push(node);
    }
    by_index
        .iter()
        .map(|(index, nodes)| format!("index {index} on nodes {nodes:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
