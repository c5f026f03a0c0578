//! Pairing a history's invocations with their completions into client
//! operations, and the structural rules of a history (one outstanding
//! operation per process, no invocation after `info`, unique append data and
//! client seqs, completions that match their invocation and do not precede
//! it).
//!
//! This module owns [`Operation`], [`Outcome`] and the one pairing every
//! consumer uses (the rules, the report's plot). It must never judge a
//! cluster: a structural problem is the recorder's bug, not an anomaly.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::CheckError;
use crate::history::{Event, EventType, Op, Process};

/// Most structural problems listed in one [`CheckError::Structure`].
pub(crate) const MAX_STRUCTURE_PROBLEMS: usize = 20;

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

impl Outcome {
    /// The lowercase name used in messages and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        }
    }
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

    /// The node the operation went to: the invocation's, else the
    /// completion's.
    pub fn node(&self, events: &[Event]) -> Option<u64> {
        events[self.invoke].node.or(self.last_event(events).node)
    }
}

/// Pairs invocations with completions, enforcing the history's structure:
/// a completion follows an invocation of the same operation by the same
/// process, a process has one outstanding operation, a process never invokes
/// again after `info`, append data are unique, time does not go backwards
/// within an operation. Nemesis events are skipped.
///
/// # Errors
///
/// [`CheckError::Structure`] listing the problems (at most
/// `MAX_STRUCTURE_PROBLEMS`) when any rule above is broken.
pub fn pair_operations(events: &[Event]) -> Result<Vec<Operation>, CheckError> {
    let pairing = Pairer::run(events);
    if pairing.problems.is_empty() {
        Ok(pairing.ops)
    } else {
        Err(CheckError::Structure {
            problems: pairing.problems,
        })
    }
}

/// The same pairing as [`pair_operations`], best effort: events that break
/// the structure are left out instead of failing the whole history (for a
/// plot of a history the rules refuse).
pub fn pair_operations_best_effort(events: &[Event]) -> Vec<Operation> {
    Pairer::run(events).ops
}

/// The pairing in progress, one event at a time.
struct Pairer<'a> {
    events: &'a [Event],
    ops: Vec<Operation>,
    problems: Vec<String>,
    /// process -> its outstanding operation (position in `ops`).
    outstanding: HashMap<u64, usize>,
    /// Processes that saw an `info` completion.
    retired: HashSet<u64>,
    /// append data -> the event that invoked it.
    append_data: HashMap<&'a str, usize>,
    /// (client, seq) -> the event that invoked it.
    client_seqs: HashMap<(u64, u64), usize>,
}

impl<'a> Pairer<'a> {
    fn run(events: &'a [Event]) -> Pairer<'a> {
        let mut p = Pairer {
            events,
            ops: Vec::new(),
            problems: Vec::new(),
            outstanding: HashMap::new(),
            retired: HashSet::new(),
            append_data: HashMap::new(),
            client_seqs: HashMap::new(),
        };
        for (at, ev) in events.iter().enumerate() {
            let Process::Client(process) = ev.process else {
                continue;
            };
            if ev.kind == EventType::Invoke {
                p.invoke(at, process, ev);
            } else {
                p.complete(at, process, ev);
            }
        }
        p
    }

    fn problem(&mut self, at: usize, ev: &Event, what: String) {
        if self.problems.len() < MAX_STRUCTURE_PROBLEMS {
            self.problems.push(format!(
                "event #{} (time {} ns, process {}): {what}",
                at + 1,
                ev.time,
                ev.process
            ));
        }
    }

    fn invoke(&mut self, at: usize, process: u64, ev: &'a Event) {
        if self.retired.contains(&process) {
            self.problem(
                at,
                ev,
                "process invokes again after an info completion".into(),
            );
            return;
        }
        if let Some(&op) = self.outstanding.get(&process) {
            let first = &self.events[self.ops[op].invoke];
            let what = format!(
                "second outstanding operation (its {} invoked at {} ns is not complete)",
                first.op.f(),
                first.time
            );
            self.problem(at, ev, what);
            return;
        }
        if let Op::Append(v) = &ev.op {
            self.check_unique_append(at, ev, v);
        }
        self.outstanding.insert(process, self.ops.len());
        self.ops.push(Operation {
            process,
            invoke: at,
            completion: None,
            outcome: Outcome::Pending,
        });
    }

    /// Append data, and a client's seqs, are unique in a history.
    fn check_unique_append(&mut self, at: usize, ev: &Event, v: &'a crate::history::AppendValue) {
        if let Some(prev) = self.append_data.insert(&v.data, at) {
            let what = format!(
                "append data {:?} already invoked at event #{}; data must be unique",
                v.data,
                prev + 1
            );
            self.problem(at, ev, what);
        }
        if let (Some(client), Some(seq)) = (v.client, v.seq)
            && let Some(prev) = self.client_seqs.insert((client, seq), at)
        {
            let what = format!(
                "client {client}'s seq {seq} already invoked at event #{}; a client's seqs must be unique",
                prev + 1
            );
            self.problem(at, ev, what);
        }
    }

    fn complete(&mut self, at: usize, process: u64, ev: &Event) {
        let Some(op) = self.outstanding.remove(&process) else {
            let what = format!("{} completion without an outstanding invocation", ev.op.f());
            self.problem(at, ev, what);
            return;
        };
        let inv = &self.events[self.ops[op].invoke];
        if !completes(inv, ev) {
            let what = format!(
                "completion {:?} does not match its invocation {:?}",
                ev.op, inv.op
            );
            self.problem(at, ev, what);
        }
        if ev.time < inv.time {
            let what = format!(
                "completes at {} ns, before its invocation at {} ns",
                ev.time, inv.time
            );
            self.problem(at, ev, what);
        }
        self.ops[op].completion = Some(at);
        self.ops[op].outcome = match ev.kind {
            EventType::Ok => Outcome::Ok,
            EventType::Fail => Outcome::Fail,
            EventType::Info => {
                self.retired.insert(process);
                Outcome::Info
            }
            EventType::Invoke => unreachable!("invocations are paired by Pairer::invoke"),
        };
    }
}

/// Whether completion `ev` is of the operation invocation `inv` started.
fn completes(inv: &Event, ev: &Event) -> bool {
    match (&inv.op, &ev.op) {
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
    }
}
