//! The term rules over the final logs: a node's log never goes back in term
//! (`term-regression`), and nodes that hold the same record at an index
//! hold it under the same term (`term-divergence`): Raft's log matching
//! property, as far as records show it.
//!
//! This module owns those two rules; it must never look at client
//! operations (a record's term is the only thing it judges).

use std::collections::BTreeMap;

use super::{Checker, fmt_list};
use crate::history::FinalLogs;
use crate::verdict::AnomalyKind;

impl Checker<'_> {
    pub(crate) fn check_terms(&mut self, finals: &FinalLogs) {
        for (&node, records) in finals {
            self.check_term_regression(node, records);
        }
        self.check_term_divergence(finals);
    }

    /// Terms in one node's final log never decrease along its indexes.
    fn check_term_regression(&mut self, node: u64, records: &[crate::history::FinalRecord]) {
        let mut highest: Option<(u64, u64)> = None; // (term, index)
        let mut regressions: Vec<u64> = Vec::new();
        let mut first: Option<(u64, u64, u64, u64)> = None; // (index, term, after index, after term)
        for rec in records {
            match highest {
                Some((term, index)) if rec.term < term => {
                    regressions.push(rec.index);
                    first.get_or_insert((rec.index, rec.term, index, term));
                }
                Some((term, _)) if rec.term == term => {}
                _ => highest = Some((rec.term, rec.index)),
            }
        }
        let Some((index, term, after_index, after_term)) = first else {
            return;
        };
        self.report(
            AnomalyKind::TermRegression,
            format!(
                "node {node}'s final log goes back in term: index {index} has term {term} after index {after_index} of term {after_term} ({} record(s) of a lower term after a higher one, at {})",
                regressions.len(),
                fmt_list(&regressions)
            ),
            vec![],
            vec![node],
            regressions,
        );
    }

    /// Nodes holding the same data at an index hold it under one term.
    fn check_term_divergence(&mut self, finals: &FinalLogs) {
        // (index, data) -> term -> nodes
        let mut terms: BTreeMap<(u64, &str), BTreeMap<u64, Vec<u64>>> = BTreeMap::new();
        for (&node, records) in finals {
            for rec in records {
                terms
                    .entry((rec.index, rec.data.as_str()))
                    .or_default()
                    .entry(rec.term)
                    .or_default()
                    .push(node);
            }
        }
        for ((index, data), by_term) in terms {
            if by_term.len() < 2 {
                continue;
            }
            let parts: Vec<String> = by_term
                .iter()
                .map(|(term, nodes)| format!("term {term} on nodes {nodes:?}"))
                .collect();
            let mut nodes: Vec<u64> = by_term.values().flatten().copied().collect();
            nodes.sort_unstable();
            nodes.dedup();
            self.report(
                AnomalyKind::TermDivergence,
                format!(
                    "nodes hold {data:?} at index {index} under different terms: {}",
                    parts.join("; ")
                ),
                self.ops_for_data([data]),
                nodes,
                vec![index],
            );
        }
    }
}
