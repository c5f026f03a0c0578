//! The checker: reads what the clients saw (the history) and what the nodes
//! hold at the end (their final committed logs), and decides whether that is
//! a legal outcome of a replicated, linearizable append-only log.
//!
//! It owns pairing invocations with completions, building the total order
//! from the nodes' final logs, and every rule listed in `jepsen/CHECKER.md`.
//! It must never depend on ringraft's code: it trusts nothing but the files,
//! and it never panics on them (bad input is a [`CheckError`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::history::{
    self, Consistency, Event, EventType, FinalRecord, HistoryError, MissingNode, Op, Process,
    RunInfo,
};

/// Most structural problems listed in one [`CheckError::Structure`].
const MAX_STRUCTURE_PROBLEMS: usize = 20;

/// The run cannot be checked: missing or garbled files, or a history that
/// breaks the contract's structure (a runner bug, not a cluster bug).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file is missing or does not parse.
    #[error(transparent)]
    File(#[from] HistoryError),
    /// The `final/` directory could not be listed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// No node's final log could be read, so nothing can be checked.
    #[error("{}: no final log of any node (final/<id>.jsonl); nothing to check against", dir.display())]
    NoFinalLogs {
        /// The `final/` directory.
        dir: PathBuf,
    },
    /// The history breaks the structural rules of the contract.
    #[error("history is structurally invalid ({} problem(s)):\n  {}", problems.len(), problems.join("\n  "))]
    Structure {
        /// One line per problem (at most [`MAX_STRUCTURE_PROBLEMS`]).
        problems: Vec<String>,
    },
}

/// The final outcome of a client operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It took effect.
    Ok,
    /// It definitely did not take effect.
    Fail,
    /// Unknown.
    Info,
    /// Invoked but never completed in the history: treated as unknown.
    Pending,
}

/// A client operation: an invocation paired with its completion.
#[derive(Debug, Clone)]
pub struct Operation {
    /// The client process.
    pub process: u64,
    /// Position of the invocation in the history.
    pub invoke: usize,
    /// Position of the completion, if any.
    pub completion: Option<usize>,
    /// How it ended.
    pub outcome: Outcome,
}

impl Operation {
    /// Time of the invocation.
    pub fn invoke_time(&self, events: &[Event]) -> u64 {
        events[self.invoke].time
    }

    /// Time of the completion, if any.
    pub fn complete_time(&self, events: &[Event]) -> Option<u64> {
        self.completion.map(|c| events[c].time)
    }

    /// The completion event if there is one, else the invocation.
    pub fn last_event<'a>(&self, events: &'a [Event]) -> &'a Event {
        &events[self.completion.unwrap_or(self.invoke)]
    }
}

/// Pairs invocations with completions, enforcing the history's structure:
/// a completion follows an invocation of the same operation by the same
/// process, a process has one outstanding operation, a process never invokes
/// again after `info`, append data are unique, time does not go backwards
/// within an operation. Nemesis events are skipped.
pub fn pair_operations(events: &[Event]) -> Result<Vec<Operation>, CheckError> {
    let mut problems = Vec::new();
    let problem = |problems: &mut Vec<String>, at: usize, ev: &Event, what: String| {
        if problems.len() < MAX_STRUCTURE_PROBLEMS {
            problems.push(format!(
                "event #{} (time {} ns, process {}): {what}",
                at + 1,
                ev.time,
                ev.process
            ));
        }
    };
    let mut ops: Vec<Operation> = Vec::new();
    let mut outstanding: HashMap<u64, usize> = HashMap::new(); // process -> op
    let mut retired: HashSet<u64> = HashSet::new(); // processes that saw info
    let mut append_data: HashMap<&str, usize> = HashMap::new(); // data -> event
    let mut client_seqs: HashMap<(u64, u64), usize> = HashMap::new(); // (client, seq) -> event
    for (at, ev) in events.iter().enumerate() {
        let Process::Client(process) = ev.process else {
            continue;
        };
        if ev.kind == EventType::Invoke {
            if retired.contains(&process) {
                problem(
                    &mut problems,
                    at,
                    ev,
                    "process invokes again after an info completion".into(),
                );
                continue;
            }
            if let Some(&op) = outstanding.get(&process) {
                let first = &events[ops[op].invoke];
                problem(
                    &mut problems,
                    at,
                    ev,
                    format!(
                        "second outstanding operation (its {} invoked at {} ns is not complete)",
                        first.op.f(),
                        first.time
                    ),
                );
                continue;
            }
            if let Op::Append(v) = &ev.op
                && let Some(prev) = append_data.insert(&v.data, at)
            {
                problem(
                    &mut problems,
                    at,
                    ev,
                    format!(
                        "append data {:?} already invoked at event #{}; data must be unique",
                        v.data,
                        prev + 1
                    ),
                );
            }
            if let Op::Append(v) = &ev.op
                && let (Some(client), Some(seq)) = (v.client, v.seq)
                && let Some(prev) = client_seqs.insert((client, seq), at)
            {
                problem(
                    &mut problems,
                    at,
                    ev,
                    format!(
                        "client {client}'s seq {seq} already invoked at event #{}; a client's seqs must be unique",
                        prev + 1
                    ),
                );
            }
            outstanding.insert(process, ops.len());
            ops.push(Operation {
                process,
                invoke: at,
                completion: None,
                outcome: Outcome::Pending,
            });
            continue;
        }
        let Some(op) = outstanding.remove(&process) else {
            problem(
                &mut problems,
                at,
                ev,
                format!("{} completion without an outstanding invocation", ev.op.f()),
            );
            continue;
        };
        let inv = &events[ops[op].invoke];
        let matches = match (&inv.op, &ev.op) {
            // A completion may leave out the client and seq of its invocation.
            (Op::Append(a), Op::Append(b)) => {
                a.data == b.data
                    && b.client.is_none_or(|c| a.client == Some(c))
                    && b.seq.is_none_or(|q| a.seq == Some(q))
            }
            (Op::Read(a), Op::Read(b)) => {
                a.from == b.from && a.to == b.to && a.consistency == b.consistency
            }
            _ => false,
        };
        if !matches {
            problem(
                &mut problems,
                at,
                ev,
                format!(
                    "completion {:?} does not match its invocation {:?}",
                    ev.op, inv.op
                ),
            );
        }
        if ev.time < inv.time {
            problem(
                &mut problems,
                at,
                ev,
                format!(
                    "completes at {} ns, before its invocation at {} ns",
                    ev.time, inv.time
                ),
            );
        }
        ops[op].completion = Some(at);
        ops[op].outcome = match ev.kind {
            EventType::Ok => Outcome::Ok,
            EventType::Fail => Outcome::Fail,
            EventType::Info => {
                retired.insert(process);
                Outcome::Info
            }
            EventType::Invoke => unreachable!("handled above"),
        };
    }
    if problems.is_empty() {
        Ok(ops)
    } else {
        Err(CheckError::Structure { problems })
    }
}

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
    fn new(op: &Operation, events: &[Event]) -> OpRef {
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
            node: events[op.invoke].node.or(last.node),
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
            self.outcome_str(),
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

impl OpRef {
    fn outcome_str(&self) -> &'static str {
        match self.outcome {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        }
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
    /// How many anomalies of each kind.
    pub fn counts_by_kind(&self) -> BTreeMap<AnomalyKind, usize> {
        let mut counts = BTreeMap::new();
        for a in &self.anomalies {
            *counts.entry(a.kind).or_insert(0) += 1;
        }
        counts
    }
}

/// Everything a run directory holds, loaded.
#[derive(Debug, Clone)]
pub struct Run {
    /// The directory.
    pub dir: PathBuf,
    /// `run.json`.
    pub info: RunInfo,
    /// `history.jsonl`.
    pub events: Vec<Event>,
    /// `final/<id>.jsonl`, by node id.
    pub finals: BTreeMap<u64, Vec<FinalRecord>>,
    /// Nodes without a final log: `final/missing.json`, plus nodes of
    /// `run.json` that have neither a file nor an entry there.
    pub missing: Vec<MissingNode>,
}

/// Loads a run directory (see `notes/jepsen-format.md`).
pub fn load_run(dir: &Path) -> Result<Run, CheckError> {
    let info = history::read_run_info(&dir.join("run.json"))?;
    let events = history::read_history(&dir.join("history.jsonl"))?;
    let final_dir = dir.join("final");
    let io = |source| CheckError::Io {
        path: final_dir.clone(),
        source,
    };
    let mut finals = BTreeMap::new();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&final_dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == "missing.json" {
            missing = history::read_missing(&entry.path())?;
        } else if let Some(id) = name
            .strip_suffix(".jsonl")
            .and_then(|s| s.parse::<u64>().ok())
        {
            finals.insert(id, history::read_final_log(&entry.path())?);
        }
    }
    if finals.is_empty() {
        return Err(CheckError::NoFinalLogs { dir: final_dir });
    }
    for &node in &info.nodes {
        if !finals.contains_key(&node) && !missing.iter().any(|m| m.node == node) {
            missing.push(MissingNode {
                node,
                reason: "no final log, and not listed in final/missing.json".into(),
            });
        }
    }
    missing.sort_by_key(|m| m.node);
    Ok(Run {
        dir: dir.to_path_buf(),
        info,
        events,
        finals,
        missing,
    })
}

/// Loads and checks a run directory.
pub fn check(run_dir: &Path) -> Result<Verdict, CheckError> {
    let run = load_run(run_dir)?;
    check_run(&run)
}

/// Checks a loaded run.
pub fn check_run(run: &Run) -> Result<Verdict, CheckError> {
    let mut verdict = check_history(&run.events, &run.finals)?;
    verdict.unchecked_nodes = run.missing.clone();
    Ok(verdict)
}

/// Checks a history against the nodes' final logs (`node id -> records`).
/// An error means the history is structurally broken; anomalies of the
/// cluster are in the [`Verdict`].
pub fn check_history(
    events: &[Event],
    finals: &BTreeMap<u64, Vec<FinalRecord>>,
) -> Result<Verdict, CheckError> {
    let ops = pair_operations(events)?;
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
    let mut anomalies = ck.anomalies;
    anomalies.sort_by_key(|a| a.kind); // stable: keeps discovery order within a kind
    Ok(Verdict {
        valid: anomalies.is_empty(),
        anomalies,
        summary: ck.summary,
        unchecked_nodes: Vec::new(),
    })
}

/// The nodes' final logs merged into one order.
struct TotalOrder<'a> {
    /// index -> data, the majority value where nodes disagree.
    by_index: BTreeMap<u64, &'a str>,
    /// data -> every (node, index) holding it.
    placements: HashMap<&'a str, Vec<(u64, u64)>>,
    /// Per node: index -> data.
    per_node: BTreeMap<u64, BTreeMap<u64, &'a str>>,
}

struct Checker<'a> {
    events: &'a [Event],
    ops: &'a [Operation],
    anomalies: Vec<Anomaly>,
    summary: Summary,
}

impl<'a> Checker<'a> {
    fn report(
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

    fn op_ref(&self, op: usize) -> OpRef {
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

    fn build_total_order(&mut self, finals: &'a BTreeMap<u64, Vec<FinalRecord>>) -> TotalOrder<'a> {
        let mut per_node: BTreeMap<u64, BTreeMap<u64, &'a str>> = BTreeMap::new();
        for (&node, records) in finals {
            let mut log = BTreeMap::new();
            let mut prev: Option<u64> = None;
            for rec in records {
                if let Some(p) = prev
                    && rec.index <= p
                {
                    self.report(
                        AnomalyKind::FinalLogOrder,
                        format!(
                            "node {node}'s final log has index {} after index {p}",
                            rec.index
                        ),
                        vec![],
                        vec![node],
                        vec![p, rec.index],
                    );
                }
                prev = Some(prev.map_or(rec.index, |p| p.max(rec.index)));
                log.entry(rec.index).or_insert(rec.data.as_str());
            }
            self.summary.final_log_len.insert(node, records.len());
            self.summary
                .final_log_last_index
                .insert(node, log.keys().next_back().copied().unwrap_or(0));
            per_node.insert(node, log);
        }

        // Merge index by index; flag disagreement.
        let all_indexes: BTreeSet<u64> = per_node
            .values()
            .flat_map(|log| log.keys().copied())
            .collect();
        let mut by_index = BTreeMap::new();
        for index in all_indexes {
            let mut holders: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
            let mut gaps = Vec::new();
            for (&node, log) in &per_node {
                match log.get(&index) {
                    Some(data) => holders.entry(data).or_default().push(node),
                    // A node whose log reaches past this index but has no
                    // record here holds a non-record entry: it disagrees.
                    None if log.keys().next_back().is_some_and(|&last| last > index) => {
                        gaps.push(node)
                    }
                    None => {}
                }
            }
            let Some((&chosen, _)) = holders.iter().max_by(|a, b| {
                // Most holders wins; on a tie, the value held by the lowest node id.
                a.1.len().cmp(&b.1.len()).then_with(|| b.1[0].cmp(&a.1[0]))
            }) else {
                unreachable!("every index came from some node's log")
            };
            by_index.insert(index, chosen);
            if holders.len() > 1 || !gaps.is_empty() {
                let mut parts: Vec<String> = holders
                    .iter()
                    .map(|(data, nodes)| format!("{data:?} on nodes {nodes:?}"))
                    .collect();
                if !gaps.is_empty() {
                    parts.push(format!("no record (but later ones) on nodes {gaps:?}"));
                }
                let nodes = holders
                    .values()
                    .flatten()
                    .chain(&gaps)
                    .copied()
                    .collect::<BTreeSet<_>>();
                self.report(
                    AnomalyKind::Divergence,
                    format!("nodes disagree at index {index}: {}", parts.join("; ")),
                    self.ops_for_data(holders.keys().copied()),
                    nodes.into_iter().collect(),
                    vec![index],
                );
            }
        }
        self.summary.total_order_len = by_index.len();

        let mut placements: HashMap<&'a str, Vec<(u64, u64)>> = HashMap::new();
        for (&node, log) in &per_node {
            for (&index, &data) in log {
                placements.entry(data).or_default().push((node, index));
            }
        }
        TotalOrder {
            by_index,
            placements,
            per_node,
        }
    }

    /// The append operations of these data (for evidence).
    fn ops_for_data<'d>(&self, data: impl IntoIterator<Item = &'d str>) -> Vec<OpRef> {
        let by_data = self.appends_by_data();
        data.into_iter()
            .filter_map(|d| by_data.get(d).map(|&op| self.op_ref(op)))
            .collect()
    }

    fn appends_by_data(&self) -> HashMap<&'a str, usize> {
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

    fn check_appends(&mut self, order: &TotalOrder<'a>) {
        let by_data = self.appends_by_data();

        // Values in the logs: duplicates, phantoms, failed appends.
        let mut placed: Vec<(&str, &Vec<(u64, u64)>)> =
            order.placements.iter().map(|(d, p)| (*d, p)).collect();
        placed.sort_by_key(|(_, p)| p.iter().map(|&(_, i)| i).min());
        for (data, places) in placed {
            let indexes: BTreeSet<u64> = places.iter().map(|&(_, i)| i).collect();
            let op = by_data.get(data).copied();
            let ops: Vec<OpRef> = op.map(|o| self.op_ref(o)).into_iter().collect();
            let nodes: BTreeSet<u64> = places.iter().map(|&(n, _)| n).collect();
            if indexes.len() > 1 {
                let outcome = op.map_or("never invoked".to_string(), |o| {
                    format!("{:?}", self.ops[o].outcome)
                });
                self.report(
                    AnomalyKind::Duplicate,
                    format!(
                        "{data:?} (append outcome: {}) appears at {} indexes: {}",
                        outcome.to_lowercase(),
                        indexes.len(),
                        describe_places(places)
                    ),
                    ops.clone(),
                    nodes.iter().copied().collect(),
                    indexes.iter().copied().collect(),
                );
            }
            match op.map(|o| self.ops[o].outcome) {
                None => self.report(
                    AnomalyKind::Phantom,
                    format!(
                        "{data:?} is in final logs ({}) but no client ever appended it",
                        describe_places(places)
                    ),
                    vec![],
                    nodes.iter().copied().collect(),
                    indexes.iter().copied().collect(),
                ),
                Some(Outcome::Fail) => self.report(
                    AnomalyKind::FailedAppendPresent,
                    format!(
                        "{data:?} was reported failed but is in final logs ({})",
                        describe_places(places)
                    ),
                    ops,
                    nodes.iter().copied().collect(),
                    indexes.iter().copied().collect(),
                ),
                Some(Outcome::Info | Outcome::Pending) => self.summary.unknown_appends_present += 1,
                Some(Outcome::Ok) => {}
            }
        }

        // Acknowledged appends: on every node, exactly at the acknowledged index.
        for (i, op) in self.ops.iter().enumerate() {
            let Op::Append(inv) = &self.events[op.invoke].op else {
                continue;
            };
            match op.outcome {
                Outcome::Ok => {}
                Outcome::Info | Outcome::Pending => {
                    if !order.placements.contains_key(inv.data.as_str()) {
                        self.summary.unknown_appends_absent += 1;
                    }
                    continue;
                }
                Outcome::Fail => continue,
            }
            self.summary.acked_appends += 1;
            let Some(Op::Append(done)) = op.completion.map(|c| &self.events[c].op) else {
                unreachable!("an ok operation has a completion")
            };
            let Some(acked_index) = done.index else {
                unreachable!("an ok append carries an index (parser)")
            };
            let data = inv.data.as_str();
            let mut lacking = Vec::new();
            let mut elsewhere = Vec::new();
            for (&node, log) in &order.per_node {
                let here = log.get(&acked_index) == Some(&data);
                let others: Vec<u64> = log
                    .iter()
                    .filter(|&(_, &d)| d == data)
                    .map(|(&i, _)| i)
                    .collect();
                if others.is_empty() {
                    lacking.push(node);
                } else if !here {
                    elsewhere.push((node, others));
                }
            }
            if !lacking.is_empty() {
                let scope = if lacking.len() == order.per_node.len() {
                    "every node".to_string()
                } else {
                    format!("nodes {lacking:?}")
                };
                let at_index: Vec<String> = lacking
                    .iter()
                    .map(|n| match order.per_node[n].get(&acked_index) {
                        Some(d) => format!("node {n} has {d:?} there"),
                        None => format!("node {n} has no record there"),
                    })
                    .collect();
                self.report(
                    AnomalyKind::LostAppend,
                    format!(
                        "acknowledged append {data:?} (index {acked_index}) is missing from the final log of {scope} ({})",
                        at_index.join("; ")
                    ),
                    vec![self.op_ref(i)],
                    lacking,
                    vec![acked_index],
                );
            }
            if !elsewhere.is_empty() {
                let desc: Vec<String> = elsewhere
                    .iter()
                    .map(|(n, idx)| format!("node {n} at {idx:?}"))
                    .collect();
                let mut indexes: BTreeSet<u64> = elsewhere
                    .iter()
                    .flat_map(|(_, i)| i.iter().copied())
                    .collect();
                indexes.insert(acked_index);
                self.report(
                    AnomalyKind::WrongIndex,
                    format!(
                        "append {data:?} was acknowledged at index {acked_index} but sits at {}",
                        desc.join(", ")
                    ),
                    vec![self.op_ref(i)],
                    elsewhere.iter().map(|(n, _)| *n).collect(),
                    indexes.into_iter().collect(),
                );
            }
        }
    }

    fn check_reads(&mut self, order: &TotalOrder<'a>) {
        let by_data = self.appends_by_data();
        // Acknowledged appends sorted by claimed index, for the recency rule.
        let mut acks: Vec<(u64, u64, usize)> = Vec::new(); // (index, ok time, op)
        for (i, op) in self.ops.iter().enumerate() {
            if op.outcome != Outcome::Ok {
                continue;
            }
            if let Some(Op::Append(v)) = op.completion.map(|c| &self.events[c].op)
                && let Some(index) = v.index
            {
                acks.push((
                    index,
                    self.events[op.completion.unwrap_or(op.invoke)].time,
                    i,
                ));
            }
        }
        acks.sort_unstable();
        let min_ok_time = SparseMin::new(acks.iter().map(|a| a.1).collect());

        for (r, op) in self.ops.iter().enumerate() {
            if op.outcome != Outcome::Ok {
                continue;
            }
            let Some(Op::Read(read)) = op.completion.map(|c| &self.events[c].op) else {
                continue;
            };
            let Some(records) = &read.records else {
                unreachable!("an ok read carries records (parser)")
            };
            self.summary.reads_checked += 1;
            self.summary.read_records_checked += records.len() as u64;
            let invoked = op.invoke_time(self.events);
            let completed = op.complete_time(self.events).unwrap_or(invoked);

            // Shape: increasing, within [from, to].
            let mut prev: Option<u64> = None;
            for rec in records {
                let out_of_range =
                    rec.index < read.from || read.to.is_some_and(|to| rec.index > to);
                let not_increasing = prev.is_some_and(|p| rec.index <= p);
                if out_of_range || not_increasing {
                    self.report(
                        AnomalyKind::ReadMalformed,
                        format!(
                            "read of [{}, {}] returned index {}{}",
                            read.from,
                            fmt_to(read.to),
                            rec.index,
                            if not_increasing {
                                " after a higher or equal index"
                            } else {
                                " outside the range"
                            }
                        ),
                        vec![self.op_ref(r)],
                        op_node(op, self.events),
                        vec![rec.index],
                    );
                }
                prev = Some(prev.map_or(rec.index, |p| p.max(rec.index)));
            }

            // Every record returned is the final order's record at that index.
            for rec in records {
                let data = rec.data.as_str();
                if let Some(&a) = by_data.get(data)
                    && self.ops[a].invoke_time(self.events) > completed
                {
                    self.report(
                        AnomalyKind::ReadFromFuture,
                        format!(
                            "read returned {data:?} at index {} but its append was invoked only at {} ns, after the read completed at {completed} ns",
                            rec.index,
                            self.ops[a].invoke_time(self.events)
                        ),
                        vec![self.op_ref(r), self.op_ref(a)],
                        op_node(op, self.events),
                        vec![rec.index],
                    );
                }
                match order.by_index.get(&rec.index) {
                    Some(&d) if d == data => continue,
                    _ => {}
                }
                let mut ops = vec![self.op_ref(r)];
                ops.extend(by_data.get(data).map(|&a| self.op_ref(a)));
                let at_index = match order.by_index.get(&rec.index) {
                    Some(d) => format!("the final order has {d:?} at index {}", rec.index),
                    None => format!("the final order has no record at index {}", rec.index),
                };
                match order.placements.get(data) {
                    Some(places) => {
                        let mut indexes: BTreeSet<u64> = places.iter().map(|&(_, i)| i).collect();
                        indexes.insert(rec.index);
                        self.report(
                            AnomalyKind::ReadMismatch,
                            format!(
                                "read returned {data:?} at index {}; {at_index}, and {data:?} sits at {}",
                                rec.index,
                                describe_places(places)
                            ),
                            ops,
                            op_node(op, self.events),
                            indexes.into_iter().collect(),
                        )
                    }
                    None => {
                        let origin = match by_data.get(data).map(|&a| self.ops[a].outcome) {
                            None => "it was never appended (no client invoked it)".to_string(),
                            Some(o) => format!(
                                "its append ended {:?}, and it is in no final log (lost)",
                                o
                            )
                            .to_lowercase(),
                        };
                        self.report(
                            AnomalyKind::ReadLostValue,
                            format!(
                                "read returned {data:?} at index {}; {at_index}; {origin}",
                                rec.index
                            ),
                            ops,
                            op_node(op, self.events),
                            vec![rec.index],
                        )
                    }
                }
            }

            // No record of the final order skipped inside the returned span.
            let returned: HashMap<u64, &str> = records
                .iter()
                .map(|rec| (rec.index, rec.data.as_str()))
                .collect();
            if let Some(last) = records.last().map(|rec| rec.index)
                && last >= read.from
            {
                let skipped: Vec<u64> = order
                    .by_index
                    .range(read.from..=last)
                    .filter(|(i, _)| !returned.contains_key(i))
                    .map(|(&i, _)| i)
                    .collect();
                if !skipped.is_empty() {
                    self.report(
                        AnomalyKind::ReadMissingRecord,
                        format!(
                            "read of [{}, {}] returned up to index {last} but skipped final-order records at {}",
                            read.from,
                            fmt_to(read.to),
                            fmt_list(&skipped)
                        ),
                        vec![self.op_ref(r)],
                        op_node(op, self.events),
                        skipped,
                    );
                }
            }

            // Recency: sees every append acknowledged before it was invoked.
            if read.consistency == Consistency::Stale {
                continue;
            }
            let hi = read.to.unwrap_or(u64::MAX);
            if hi < read.from {
                continue;
            }
            let lo_pos = acks.partition_point(|a| a.0 < read.from);
            let hi_pos = acks.partition_point(|a| a.0 <= hi);
            let mut missed: Vec<usize> = Vec::new(); // positions in acks
            // Inside the returned span: look at each acknowledged append.
            let span_end = records
                .last()
                .map_or(lo_pos, |rec| acks.partition_point(|a| a.0 <= rec.index))
                .min(hi_pos);
            for (pos, &(index, ok_time, a)) in acks.iter().enumerate().take(span_end).skip(lo_pos) {
                if ok_time >= invoked {
                    continue;
                }
                let Some(Op::Append(v)) = &self.ops[a].completion.map(|c| &self.events[c].op)
                else {
                    continue;
                };
                if returned.get(&index) != Some(&v.data.as_str()) {
                    missed.push(pos);
                }
            }
            // Past the returned span: any acknowledged before the invoke is missed.
            if span_end < hi_pos && min_ok_time.min(span_end, hi_pos) < invoked {
                missed.extend((span_end..hi_pos).filter(|&p| acks[p].1 < invoked));
            }
            if let Some(&first) = missed.first() {
                let (index, ok_time, a) = acks[first];
                let count_note = if missed.len() > 1 {
                    format!(" ({} acknowledged appends missed in all)", missed.len())
                } else {
                    String::new()
                };
                self.report(
                    AnomalyKind::StaleRead,
                    format!(
                        "{} read of [{}, {}] invoked at {invoked} ns returned {} record(s){} but missed index {index}, acknowledged at {ok_time} ns{count_note}",
                        read.consistency.as_str(),
                        read.from,
                        fmt_to(read.to),
                        records.len(),
                        records.last().map_or(String::new(), |rec| format!(" up to index {}", rec.index)),
                    ),
                    vec![self.op_ref(r), self.op_ref(a)],
                    op_node(op, self.events),
                    missed.iter().map(|&p| acks[p].0).collect(),
                );
            }
        }
    }

    fn check_real_time_order(&mut self, order: &TotalOrder<'a>) {
        // Earlier: acknowledged appends (completion time, claimed index).
        // Later: acknowledged appends (claimed index) and unknown-outcome
        // appends found in the final order (their index there), by invoke time.
        let mut earlier: Vec<(u64, u64, usize)> = Vec::new(); // (ok time, index, op)
        let mut later: Vec<(u64, u64, usize)> = Vec::new(); // (invoke time, index, op)
        for (i, op) in self.ops.iter().enumerate() {
            let Op::Append(inv) = &self.events[op.invoke].op else {
                continue;
            };
            let invoked = op.invoke_time(self.events);
            match op.outcome {
                Outcome::Ok => {
                    let done = op.last_event(self.events);
                    if let Op::Append(v) = &done.op
                        && let Some(index) = v.index
                    {
                        earlier.push((done.time, index, i));
                        later.push((invoked, index, i));
                    }
                }
                Outcome::Info | Outcome::Pending => {
                    if let Some(index) = order
                        .placements
                        .get(inv.data.as_str())
                        .and_then(|p| p.iter().map(|&(_, i)| i).min())
                    {
                        later.push((invoked, index, i));
                    }
                }
                Outcome::Fail => {}
            }
        }
        earlier.sort_unstable();
        later.sort_unstable();
        let mut next = 0;
        let mut best: Option<(u64, usize)> = None; // highest index acknowledged so far, and its op
        for &(invoked, index, b) in &later {
            while next < earlier.len() && earlier[next].0 < invoked {
                let (_, ai, a) = earlier[next];
                if best.is_none_or(|(bi, _)| ai > bi) {
                    best = Some((ai, a));
                }
                next += 1;
            }
            if let Some((ai, a)) = best
                && ai >= index
            {
                let a_done = self.ops[a].complete_time(self.events).unwrap_or(0);
                self.report(
                    AnomalyKind::RealTimeOrder,
                    format!(
                        "append acknowledged at index {ai} (completed {a_done} ns) precedes an append invoked at {invoked} ns that got index {index} ({:?})",
                        self.ops[b].outcome
                    ),
                    vec![self.op_ref(a), self.op_ref(b)],
                    vec![],
                    vec![ai, index],
                );
            }
        }
    }
}

impl<'a> Checker<'a> {
    /// Where an append is in the log: an `ok` one at its acknowledged index,
    /// an unknown-outcome one where the final order holds it (its lowest
    /// index), a failed one nowhere.
    fn placed_index(&self, op: &Operation, order: &TotalOrder<'a>) -> Option<u64> {
        let Op::Append(inv) = &self.events[op.invoke].op else {
            return None;
        };
        match op.outcome {
            Outcome::Ok => match &op.last_event(self.events).op {
                Op::Append(v) => v.index,
                _ => None,
            },
            Outcome::Info | Outcome::Pending => order
                .placements
                .get(inv.data.as_str())
                .and_then(|p| p.iter().map(|&(_, i)| i).min()),
            Outcome::Fail => None,
        }
    }

    /// Issue 10, item 3: every client's appends that are in the log appear
    /// in its send order (`value.seq`), even when it had several in flight:
    /// the acknowledged ones at their acknowledged index, the unknown ones
    /// where the final order holds them.
    fn check_client_order(&mut self, order: &TotalOrder<'a>) {
        let mut by_client: BTreeMap<u64, Vec<(u64, u64, usize)>> = BTreeMap::new(); // client -> (seq, index, op)
        for (i, op) in self.ops.iter().enumerate() {
            let Op::Append(inv) = &self.events[op.invoke].op else {
                continue;
            };
            let (Some(client), Some(seq)) = (inv.client, inv.seq) else {
                continue;
            };
            if let Some(index) = self.placed_index(op, order) {
                by_client.entry(client).or_default().push((seq, index, i));
            }
        }
        for (client, mut appends) in by_client {
            appends.sort_unstable();
            for pair in appends.windows(2) {
                let [(seq_a, index_a, a), (seq_b, index_b, b)] = *pair else {
                    unreachable!("windows of two")
                };
                if index_b <= index_a {
                    self.report(
                        AnomalyKind::ClientOrder,
                        format!(
                            "client {client} sent seq {seq_a} before seq {seq_b}, but they are at indexes {index_a} and {index_b} ({:?}, {:?})",
                            self.ops[a].outcome, self.ops[b].outcome
                        ),
                        vec![self.op_ref(a), self.op_ref(b)],
                        vec![],
                        vec![index_a, index_b],
                    );
                }
            }
        }
    }
}

fn op_node(op: &Operation, events: &[Event]) -> Vec<u64> {
    op.last_event(events)
        .node
        .or(events[op.invoke].node)
        .into_iter()
        .collect()
}

fn fmt_to(to: Option<u64>) -> String {
    to.map_or("tail".to_string(), |t| t.to_string())
}

fn fmt_list(items: &[u64]) -> String {
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

fn describe_places(places: &[(u64, u64)]) -> String {
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

/// Range-minimum over a fixed array (sparse table, O(1) query).
struct SparseMin {
    levels: Vec<Vec<u64>>,
}

impl SparseMin {
    fn new(values: Vec<u64>) -> SparseMin {
        let mut levels = vec![values];
        let mut width = 1;
        while width * 2 <= levels[0].len() {
            let prev = &levels[levels.len() - 1];
            let next: Vec<u64> = (0..prev.len() - width)
                .map(|i| prev[i].min(prev[i + width]))
                .collect();
            levels.push(next);
            width *= 2;
        }
        SparseMin { levels }
    }

    /// Minimum of positions `[lo, hi)`; `u64::MAX` when empty.
    fn min(&self, lo: usize, hi: usize) -> u64 {
        if lo >= hi {
            return u64::MAX;
        }
        let level = (usize::BITS - 1 - (hi - lo).leading_zeros()) as usize;
        let row = &self.levels[level];
        row[lo].min(row[hi - (1 << level)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_min_matches_a_scan() {
        let values: Vec<u64> = (0..37u64).map(|i| (i * 7919) % 101).collect();
        let table = SparseMin::new(values.clone());
        for lo in 0..values.len() {
            for hi in lo..=values.len() {
                let want = values[lo..hi].iter().copied().min().unwrap_or(u64::MAX);
                assert_eq!(table.min(lo, hi), want, "[{lo}, {hi})");
            }
        }
        assert_eq!(SparseMin::new(vec![]).min(0, 0), u64::MAX);
    }
}
