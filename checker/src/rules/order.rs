//! The total order: the nodes' final logs merged index by index, and the
//! rules that concern the final logs alone (`final-log-order`,
//! `divergence`).
//!
//! This module owns [`TotalOrder`] and its construction; it must never look
//! at client operations except to cite them as evidence.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::Checker;
use crate::history::FinalLogs;
use crate::verdict::AnomalyKind;

/// One node's final log: index -> data.
pub(crate) type NodeLog<'a> = BTreeMap<u64, &'a str>;

/// The nodes' final logs merged into one order.
pub(crate) struct TotalOrder<'a> {
    /// index -> data, the majority value where nodes disagree.
    pub(crate) by_index: BTreeMap<u64, &'a str>,
    /// data -> every (node, index) holding it.
    pub(crate) placements: HashMap<&'a str, Vec<(u64, u64)>>,
    /// Per node: index -> data.
    pub(crate) per_node: BTreeMap<u64, NodeLog<'a>>,
}

impl TotalOrder<'_> {
    /// The lowest index at which the final order holds `data`.
    pub(crate) fn lowest_index_of(&self, data: &str) -> Option<u64> {
        self.placements
            .get(data)
            .and_then(|p| p.iter().map(|&(_, i)| i).min())
    }
}

impl<'a> Checker<'a> {
    /// Merges the final logs (flagging `final-log-order` and `divergence`).
    pub(crate) fn build_total_order(&mut self, finals: &'a FinalLogs) -> TotalOrder<'a> {
        let per_node: BTreeMap<u64, NodeLog<'a>> = finals
            .iter()
            .map(|(&node, records)| (node, self.node_log(node, records)))
            .collect();
        let all_indexes: BTreeSet<u64> = per_node
            .values()
            .flat_map(|log| log.keys().copied())
            .collect();
        let by_index: BTreeMap<u64, &'a str> = all_indexes
            .into_iter()
            .map(|index| (index, self.merge_index(index, &per_node)))
            .collect();
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

    /// One node's records by index (the first of a repeated index stands),
    /// flagging indexes that do not increase.
    fn node_log(&mut self, node: u64, records: &'a [crate::history::FinalRecord]) -> NodeLog<'a> {
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
        log
    }

    /// The order's record at `index`: the value most nodes hold there (on a
    /// tie, the one held by the lowest node id); any disagreement, or a
    /// node with no record there while its log goes further, is a
    /// divergence.
    fn merge_index(&mut self, index: u64, per_node: &BTreeMap<u64, NodeLog<'a>>) -> &'a str {
        let mut holders: BTreeMap<&'a str, Vec<u64>> = BTreeMap::new();
        let mut gaps = Vec::new();
        for (&node, log) in per_node {
            match log.get(&index) {
                Some(data) => holders.entry(data).or_default().push(node),
                // A node whose log reaches past this index but has no
                // record here holds a non-record entry: it disagrees.
                None if log.keys().next_back().is_some_and(|&last| last > index) => gaps.push(node),
                None => {}
            }
        }
        let Some((&chosen, _)) = holders.iter().max_by(|a, b| {
            // Most holders wins; on a tie, the value held by the lowest node id.
            a.1.len().cmp(&b.1.len()).then_with(|| b.1[0].cmp(&a.1[0]))
        }) else {
            unreachable!("every index came from some node's log")
        };
        if holders.len() > 1 || !gaps.is_empty() {
            self.report_divergence(index, &holders, &gaps);
        }
        chosen
    }

    fn report_divergence(&mut self, index: u64, holders: &BTreeMap<&str, Vec<u64>>, gaps: &[u64]) {
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
            .chain(gaps)
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
