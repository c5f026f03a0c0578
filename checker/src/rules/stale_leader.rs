//! The stale-leader rules, over the windows in which a leader was isolated
//! from a majority and then deposed ([`crate::history::ISOLATED_LEADER`]
//! events): nothing sent to it in the window is acknowledged before the
//! heal (`stale-leader-ack`), nothing sent to it in the window is in a
//! final log under its term or an older one (`stale-leader-write`), and no
//! final log holds an entry of its term after an entry of a later term
//! (`deposed-term-entry`).
//!
//! This module owns parsing those windows and the three rules; it must
//! never guess a window from other nemesis events (only the recorder knows
//! which node led which term).

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::{Checker, fmt_list, sorted_distinct};
use crate::error::CheckError;
use crate::history::{Event, FinalLogs, FinalRecord, ISOLATED_LEADER, Op, Phase};
use crate::pairing::{MAX_STRUCTURE_PROBLEMS, Outcome};
use crate::verdict::AnomalyKind;

/// Node `node`, leader of `term`, isolated from `start` until `end` (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsolationWindow {
    /// The isolated leader.
    pub node: u64,
    /// The term it led.
    pub term: u64,
    /// When it was isolated.
    pub start: u64,
    /// When it was healed; `None`: never in the history.
    pub end: Option<u64>,
}

impl IsolationWindow {
    /// Whether `time` falls inside the window.
    pub fn contains(&self, time: u64) -> bool {
        time >= self.start && self.end.is_none_or(|end| time < end)
    }
}

/// The stale-leader windows of a history: each `start` of
/// [`ISOLATED_LEADER`] with the next `stop` for the same node and term.
///
/// # Errors
///
/// [`CheckError::Structure`] when such an event has no phase, a value that
/// is not `{"node": N, "term": T}`, or a `stop` without a `start`.
pub fn isolation_windows(events: &[Event]) -> Result<Vec<IsolationWindow>, CheckError> {
    let mut windows: Vec<IsolationWindow> = Vec::new();
    let mut problems = Vec::new();
    for (at, ev) in events.iter().enumerate() {
        let (value, phase) = match &ev.op {
            Op::Nemesis {
                fault,
                value,
                phase,
            } if fault == ISOLATED_LEADER => (value, phase),
            _ => continue,
        };
        let problem = |what: &str| format!("event #{} (time {} ns): {what}", at + 1, ev.time);
        let Some((node, term)) = node_and_term(value) else {
            problems.push(problem(&format!(
                "{ISOLATED_LEADER} needs the value {{\"node\": N, \"term\": T}}, not {value}"
            )));
            continue;
        };
        match phase {
            Some(Phase::Start) => windows.push(IsolationWindow {
                node,
                term,
                start: ev.time,
                end: None,
            }),
            Some(Phase::Stop) => match windows
                .iter_mut()
                .find(|w| w.node == node && w.term == term && w.end.is_none())
            {
                Some(w) => w.end = Some(ev.time),
                None => problems.push(problem(&format!(
                    "node {node} (term {term}) healed but never isolated"
                ))),
            },
            None => problems.push(problem(&format!(
                "{ISOLATED_LEADER} needs a phase (start: isolated, stop: healed)"
            ))),
        }
    }
    if problems.is_empty() {
        Ok(windows)
    } else {
        problems.truncate(MAX_STRUCTURE_PROBLEMS);
        Err(CheckError::Structure { problems })
    }
}

fn node_and_term(value: &Value) -> Option<(u64, u64)> {
    Some((value.get("node")?.as_u64()?, value.get("term")?.as_u64()?))
}

impl Checker<'_> {
    pub(crate) fn check_stale_leaders(&mut self, windows: &[IsolationWindow], finals: &FinalLogs) {
        let mut placed: HashMap<&str, Vec<(u64, &FinalRecord)>> = HashMap::new();
        for (&node, records) in finals {
            for rec in records {
                placed
                    .entry(rec.data.as_str())
                    .or_default()
                    .push((node, rec));
            }
        }
        let mut deposed_terms = BTreeSet::new();
        for w in windows {
            let sent = self.sent_to(w);
            self.check_stale_acks(w, &sent);
            self.check_stale_writes(w, &sent, &placed);
            if deposed_terms.insert(w.term) {
                for (&node, records) in finals {
                    self.check_deposed_term(w, node, records);
                }
            }
        }
    }

    /// The appends sent to the isolated leader inside its window.
    fn sent_to(&self, w: &IsolationWindow) -> Vec<usize> {
        (0..self.ops.len())
            .filter(|&i| {
                let op = &self.ops[i];
                matches!(self.events[op.invoke].op, Op::Append(_))
                    && op.node(self.events) == Some(w.node)
                    && w.contains(op.invoke_time(self.events))
            })
            .collect()
    }

    /// An isolated leader has no quorum: it acknowledges nothing sent to it
    /// until the heal.
    fn check_stale_acks(&mut self, w: &IsolationWindow, sent: &[usize]) {
        for &i in sent {
            let op = &self.ops[i];
            let Some(done) = op.complete_time(self.events) else {
                continue;
            };
            if op.outcome != Outcome::Ok || !w.contains(done) {
                continue;
            }
            let index = match &op.last_event(self.events).op {
                Op::Append(v) => v.index,
                _ => None,
            };
            self.report(
                AnomalyKind::StaleLeaderAck,
                format!(
                    "node {} was isolated as leader of term {} from {} ns{}, yet acknowledged an append sent to it at {} ns (at {done} ns, index {})",
                    w.node,
                    w.term,
                    w.start,
                    w.end.map_or(String::new(), |e| format!(" to {e} ns")),
                    op.invoke_time(self.events),
                    index.map_or("none".to_string(), |i| i.to_string())
                ),
                vec![self.op_ref(i)],
                vec![w.node],
                index.into_iter().collect(),
            );
        }
    }

    /// What the isolated leader was sent never becomes valid under its term
    /// (or an older one); under a later term it may (a client's retry).
    fn check_stale_writes(
        &mut self,
        w: &IsolationWindow,
        sent: &[usize],
        placed: &HashMap<&str, Vec<(u64, &FinalRecord)>>,
    ) {
        for &i in sent {
            let Op::Append(v) = &self.events[self.ops[i].invoke].op else {
                continue;
            };
            let stale: Vec<(u64, u64, u64)> = placed
                .get(v.data.as_str())
                .into_iter()
                .flatten()
                .filter(|(_, rec)| rec.term <= w.term)
                .map(|&(node, rec)| (node, rec.index, rec.term))
                .collect();
            if stale.is_empty() {
                continue;
            }
            let places: Vec<String> = stale
                .iter()
                .map(|(node, index, term)| format!("node {node} index {index} term {term}"))
                .collect();
            self.report(
                AnomalyKind::StaleLeaderWrite,
                format!(
                    "{:?} was sent to node {} while it was isolated as leader of term {}, yet a final log holds it under term {} or older: {}",
                    v.data,
                    w.node,
                    w.term,
                    w.term,
                    places.join(", ")
                ),
                vec![self.op_ref(i)],
                sorted_distinct(stale.iter().map(|s| s.0)),
                sorted_distinct(stale.iter().map(|s| s.1)),
            );
        }
    }

    /// Once a later term's entry is in a log, no entry of the deposed term
    /// follows it: the old leader wrote nothing after it was fenced out.
    fn check_deposed_term(&mut self, w: &IsolationWindow, node: u64, records: &[FinalRecord]) {
        let Some(first_later) = records.iter().find(|r| r.term > w.term).map(|r| r.index) else {
            return;
        };
        let after: Vec<u64> = records
            .iter()
            .filter(|r| r.term == w.term && r.index > first_later)
            .map(|r| r.index)
            .collect();
        if after.is_empty() {
            return;
        }
        self.report(
            AnomalyKind::DeposedTermEntry,
            format!(
                "node {node}'s final log holds entries of the deposed term {} (node {}'s) after index {first_later} of a later term, at {}",
                w.term,
                w.node,
                fmt_list(&after)
            ),
            vec![],
            vec![node],
            after,
        );
    }
}
