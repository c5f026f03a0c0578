//! The append rules: every value in a final log was appended by a client
//! and not reported failed, sits at one index only (`phantom`,
//! `failed-append-present`, `duplicate`); every acknowledged append is on
//! every node at its acknowledged index (`lost-append`, `wrong-index`).
//!
//! This module owns those rules; it must never judge reads or orderings.

use std::collections::{BTreeSet, HashMap};

use super::order::TotalOrder;
use super::{Checker, describe_places, sorted_distinct};
use crate::history::Op;
use crate::pairing::Outcome;
use crate::verdict::{AnomalyKind, OpRef};

impl<'a> Checker<'a> {
    pub(crate) fn check_appends(&mut self, order: &TotalOrder<'a>) {
        let by_data = self.appends_by_data();
        let mut placed: Vec<(&str, &Vec<(u64, u64)>)> =
            order.placements.iter().map(|(d, p)| (*d, p)).collect();
        placed.sort_by_key(|(_, p)| p.iter().map(|&(_, i)| i).min());
        for (data, places) in placed {
            self.check_placed_value(data, places, &by_data);
        }
        for i in 0..self.ops.len() {
            self.check_acknowledged(i, order);
        }
    }

    /// A value in the logs: one index only, appended by a client, not failed.
    fn check_placed_value(
        &mut self,
        data: &str,
        places: &[(u64, u64)],
        by_data: &HashMap<&'a str, usize>,
    ) {
        let indexes = sorted_distinct(places.iter().map(|&(_, i)| i));
        let op = by_data.get(data).copied();
        let ops: Vec<OpRef> = op.map(|o| self.op_ref(o)).into_iter().collect();
        let nodes = sorted_distinct(places.iter().map(|&(n, _)| n));
        if indexes.len() > 1 {
            let outcome = op.map_or("never invoked", |o| self.ops[o].outcome.as_str());
            self.report(
                AnomalyKind::Duplicate,
                format!(
                    "{data:?} (append outcome: {outcome}) appears at {} indexes: {}",
                    indexes.len(),
                    describe_places(places)
                ),
                ops.clone(),
                nodes.clone(),
                indexes.clone(),
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
                nodes,
                indexes,
            ),
            Some(Outcome::Fail) => self.report(
                AnomalyKind::FailedAppendPresent,
                format!(
                    "{data:?} was reported failed but is in final logs ({})",
                    describe_places(places)
                ),
                ops,
                nodes,
                indexes,
            ),
            Some(Outcome::Info | Outcome::Pending) => self.summary.unknown_appends_present += 1,
            Some(Outcome::Ok) => {}
        }
    }

    /// Operation `i`, if an acknowledged append: on every node, exactly at
    /// the acknowledged index. Unknown-outcome appends are only counted.
    fn check_acknowledged(&mut self, i: usize, order: &TotalOrder<'a>) {
        let op = &self.ops[i];
        let Op::Append(inv) = &self.events[op.invoke].op else {
            return;
        };
        match op.outcome {
            Outcome::Ok => {}
            Outcome::Info | Outcome::Pending => {
                if !order.placements.contains_key(inv.data.as_str()) {
                    self.summary.unknown_appends_absent += 1;
                }
                return;
            }
            Outcome::Fail => return,
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
        // Where each node holds it, from the placements (built from the
        // same logs, by node and then index): scanning every node's whole
        // log for every acknowledged append was quadratic.
        let places = order.placements.get(data).map_or(&[][..], Vec::as_slice);
        for (&node, log) in &order.per_node {
            let here = log.get(&acked_index) == Some(&data);
            let others: Vec<u64> = places
                .iter()
                .filter(|&&(n, _)| n == node)
                .map(|&(_, i)| i)
                .collect();
            if others.is_empty() {
                lacking.push(node);
            } else if !here {
                elsewhere.push((node, others));
            }
        }
        if !lacking.is_empty() {
            self.report_lost(i, data, acked_index, lacking, order);
        }
        if !elsewhere.is_empty() {
            self.report_wrong_index(i, data, acked_index, elsewhere);
        }
    }

    fn report_lost(
        &mut self,
        i: usize,
        data: &str,
        acked_index: u64,
        lacking: Vec<u64>,
        order: &TotalOrder<'a>,
    ) {
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

    fn report_wrong_index(
        &mut self,
        i: usize,
        data: &str,
        acked_index: u64,
        elsewhere: Vec<(u64, Vec<u64>)>,
    ) {
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
