//! The checker's answer: the anomaly kinds (one per rule), the evidence of
//! each anomaly, the counts, and the [`Verdict`] with a readable
//! [`Display`](fmt::Display) for `assert!(v.valid, "{v}")`.
//!
//! This module owns those types and their rendering as text; it must never
//! decide anything (the rules do) and never read or write files.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};

use crate::history::{Event, MissingNode, Op};
use crate::pairing::{Operation, Outcome};

/// Anomalies the [`Display`](fmt::Display) of a [`Verdict`] lists per kind.
const MAX_SHOWN_PER_KIND: usize = 10;

/// What rule an anomaly breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// An acknowledged append is missing from a node's final log.
    LostAppend,
    /// An acknowledged append sits at another index than acknowledged.
    WrongIndex,
    /// A value appears at more than one index.
    Duplicate,
    /// Two nodes disagree at an index (different data, or a record on one and
    /// a gap on the other within both logs).
    Divergence,
    /// A node's final log is not in strictly increasing index order.
    FinalLogOrder,
    /// A final log holds a value that no client ever appended.
    Phantom,
    /// An append that failed definitely appears in a final log.
    FailedAppendPresent,
    /// A read returned a record the final order does not hold at that index
    /// while the value is elsewhere in it (or the index holds other data).
    ReadMismatch,
    /// A read returned a value that is in no final log (later lost, or never
    /// appended).
    ReadLostValue,
    /// A read returned a value whose append was invoked after the read ended.
    ReadFromFuture,
    /// A read skipped a record of the final order inside the range it returned.
    ReadMissingRecord,
    /// A read's records are out of its range or not increasing.
    ReadMalformed,
    /// A linearizable (or lease) read missed an append acknowledged before the
    /// read was invoked.
    StaleRead,
    /// An append invoked after another was acknowledged got a lower index.
    RealTimeOrder,
    /// A client's appends are in the log out of its send order.
    ClientOrder,
    /// A node's final log goes back in term: an entry of a lower term after
    /// one of a higher term.
    TermRegression,
    /// Two nodes hold the same record at an index under different terms.
    TermDivergence,
    /// An entry of a deposed leader's term sits after an entry of a later
    /// term: the old leader wrote after the new one fenced it in.
    DeposedTermEntry,
    /// A value sent to a leader while it was isolated is in a final log
    /// under that leader's term (or an older one): a deposed leader's write
    /// became valid.
    StaleLeaderWrite,
    /// An append sent to a leader while it was isolated was acknowledged
    /// before the isolation was healed: it cannot have had a quorum.
    StaleLeaderAck,
    /// The history itself is broken (a recorder's bug, not the cluster's);
    /// only [`crate::Recorder::check`] reports it, as
    /// [`crate::check_history`] returns a [`crate::CheckError`] instead.
    MalformedHistory,
}

impl AnomalyKind {
    /// The kebab-case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostAppend => "lost-append",
            AnomalyKind::WrongIndex => "wrong-index",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::Divergence => "divergence",
            AnomalyKind::FinalLogOrder => "final-log-order",
            AnomalyKind::Phantom => "phantom",
            AnomalyKind::FailedAppendPresent => "failed-append-present",
            AnomalyKind::ReadMismatch => "read-mismatch",
            AnomalyKind::ReadLostValue => "read-lost-value",
            AnomalyKind::ReadFromFuture => "read-from-future",
            AnomalyKind::ReadMissingRecord => "read-missing-record",
            AnomalyKind::ReadMalformed => "read-malformed",
            AnomalyKind::StaleRead => "stale-read",
            AnomalyKind::RealTimeOrder => "real-time-order",
            AnomalyKind::ClientOrder => "client-order",
            AnomalyKind::TermRegression => "term-regression",
            AnomalyKind::TermDivergence => "term-divergence",
            AnomalyKind::DeposedTermEntry => "deposed-term-entry",
            AnomalyKind::StaleLeaderWrite => "stale-leader-write",
            AnomalyKind::StaleLeaderAck => "stale-leader-ack",
            AnomalyKind::MalformedHistory => "malformed-history",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A client operation as cited in an anomaly's evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpRef {
    /// The client process.
    pub process: u64,
    /// `append` or `read`.
    pub f: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Invocation time, ns since the run started.
    pub invoke_time: u64,
    /// Completion time, if it completed.
    pub complete_time: Option<u64>,
    /// The node the client talked to last.
    pub node: Option<u64>,
    /// The value (for a read: the range and how many records it returned).
    pub value: Value,
}

impl OpRef {
    pub(crate) fn new(op: &Operation, events: &[Event]) -> OpRef {
        let last = op.last_event(events);
        let value = match &last.op {
            Op::Read(r) => json!({
                "from": r.from,
                "to": r.to,
                "consistency": r.consistency.as_str(),
                "records_returned": r.records.as_ref().map(Vec::len),
                "last_index_returned": r.records.as_ref().and_then(|rs| rs.last()).map(|rec| rec.index),
            }),
            _ => last.value_json(),
        };
        OpRef {
            process: op.process,
            f: last.op.f().to_string(),
            outcome: op.outcome,
            invoke_time: op.invoke_time(events),
            complete_time: op.complete_time(events),
            node: op.node(events),
            value,
        }
    }
}

impl fmt::Display for OpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {} {} {} {} invoked {} ns",
            self.process,
            self.f,
            self.value,
            self.outcome.as_str(),
            self.invoke_time
        )?;
        if let Some(t) = self.complete_time {
            write!(f, ", completed {t} ns")?;
        }
        if let Some(n) = self.node {
            write!(f, ", node {n}")?;
        }
        Ok(())
    }
}

/// One violation, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Anomaly {
    /// The rule broken.
    pub kind: AnomalyKind,
    /// What happened, in words, with the specifics.
    pub message: String,
    /// The client operations involved.
    pub ops: Vec<OpRef>,
    /// The nodes involved.
    pub nodes: Vec<u64>,
    /// The log indexes involved.
    pub indexes: Vec<u64>,
}

/// Counts the report shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Client events by `f`, then by type (`invoke`, `ok`, `fail`, `info`).
    pub events_by_f_type: BTreeMap<String, BTreeMap<String, u64>>,
    /// Client operations invoked but never completed.
    pub pending_ops: u64,
    /// Nemesis events by fault.
    pub nemesis_events: BTreeMap<String, u64>,
    /// Records in each node's final log.
    pub final_log_len: BTreeMap<u64, usize>,
    /// Highest index in each node's final log.
    pub final_log_last_index: BTreeMap<u64, u64>,
    /// Records in the total order built from all final logs.
    pub total_order_len: usize,
    /// Acknowledged appends checked.
    pub acked_appends: u64,
    /// Unknown-outcome appends (info or pending) found in the total order.
    pub unknown_appends_present: u64,
    /// Unknown-outcome appends not in the total order.
    pub unknown_appends_absent: u64,
    /// Ok reads checked, and the records they returned.
    pub reads_checked: u64,
    /// Records returned by ok reads.
    pub read_records_checked: u64,
}

/// The checker's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// No anomaly found.
    pub valid: bool,
    /// Every anomaly, grouped by kind in rule order.
    pub anomalies: Vec<Anomaly>,
    /// Counts.
    pub summary: Summary,
    /// Nodes whose final log could not be read (not checked).
    pub unchecked_nodes: Vec<MissingNode>,
}

impl Verdict {
    /// The verdict on a history that could not be checked: invalid, with
    /// one [`AnomalyKind::MalformedHistory`] anomaly saying why.
    pub fn malformed(error: crate::CheckError) -> Verdict {
        Verdict {
            valid: false,
            anomalies: vec![Anomaly {
                kind: AnomalyKind::MalformedHistory,
                message: error.to_string(),
                ops: vec![],
                nodes: vec![],
                indexes: vec![],
            }],
            summary: Summary::default(),
            unchecked_nodes: vec![],
        }
    }

    /// How many anomalies of each kind.
    pub fn counts_by_kind(&self) -> BTreeMap<AnomalyKind, usize> {
        let mut counts = BTreeMap::new();
        for a in &self.anomalies {
            *counts.entry(a.kind).or_insert(0) += 1;
        }
        counts
    }
}

impl fmt::Display for Verdict {
    /// One line of counts, then each anomaly with its operations (at most
    /// `MAX_SHOWN_PER_KIND` per kind), then the nodes not checked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = self.counts_by_kind();
        let s = &self.summary;
        write!(
            f,
            "{}: {} anomalies; {} acknowledged appends, {} ok reads, total order of {} records",
            if self.valid { "VALID" } else { "INVALID" },
            self.anomalies.len(),
            s.acked_appends,
            s.reads_checked,
            s.total_order_len
        )?;
        let mut shown: BTreeMap<AnomalyKind, usize> = BTreeMap::new();
        for a in &self.anomalies {
            let n = shown.entry(a.kind).or_insert(0);
            *n += 1;
            if *n > MAX_SHOWN_PER_KIND {
                if *n == MAX_SHOWN_PER_KIND + 1 {
                    write!(f, "\n  [{}] ... {} in all", a.kind, counts[&a.kind])?;
                }
                continue;
            }
            write!(f, "\n  [{}] {}", a.kind, a.message)?;
            for op in &a.ops {
                write!(f, "\n      op: {op}")?;
            }
        }
        for m in &self.unchecked_nodes {
            write!(f, "\n  node {} NOT CHECKED: {}", m.node, m.reason)?;
        }
        Ok(())
    }
}
