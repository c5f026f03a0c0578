//! The ordering rules: an append invoked after another was acknowledged
//! lands after it (`real-time-order`), and a client's appends land in its
//! send order (`client-order`).
//!
//! This module owns those two rules; it must never judge what the logs hold
//! (the append rules do), only where appends are relative to each other.

use std::collections::BTreeMap;

use super::Checker;
use super::order::TotalOrder;
use crate::history::Op;
use crate::pairing::{Operation, Outcome};
use crate::verdict::AnomalyKind;

impl<'a> Checker<'a> {
    pub(crate) fn check_real_time_order(&mut self, order: &TotalOrder<'a>) {
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
                    if let Some(index) = order.lowest_index_of(&inv.data) {
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
            Outcome::Info | Outcome::Pending => order.lowest_index_of(&inv.data),
            Outcome::Fail => None,
        }
    }

    /// Issue 10, item 3: every client's appends that are in the log appear
    /// in its send order (`value.seq`), even when it had several in flight:
    /// the acknowledged ones at their acknowledged index, the unknown ones
    /// where the final order holds them.
    pub(crate) fn check_client_order(&mut self, order: &TotalOrder<'a>) {
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
