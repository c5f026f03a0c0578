//! The read rules: each `ok` read's records are well formed
//! (`read-malformed`), agree with the total order (`read-mismatch`,
//! `read-lost-value`, `read-from-future`, `read-missing-record`), and a
//! linearizable or lease read sees every append acknowledged before it was
//! invoked (`stale-read`).
//!
//! This module owns those rules and the range-minimum table they use; it
//! must never judge appends or the final logs themselves.

use std::collections::{BTreeSet, HashMap};

use super::order::TotalOrder;
use super::{Checker, describe_places, fmt_list, fmt_to, op_node};
use crate::history::{Consistency, Op, ReadRecord, ReadValue};
use crate::pairing::Outcome;
use crate::verdict::AnomalyKind;

/// Acknowledged appends sorted by claimed index, for the recency rule.
struct Acks {
    /// (index, ok time, op), by index.
    by_index: Vec<(u64, u64, usize)>,
    /// Range minimum of the ok times, by position in `by_index`.
    min_ok_time: SparseMin,
}

impl Acks {
    fn new(ck: &Checker<'_>) -> Acks {
        let mut by_index: Vec<(u64, u64, usize)> = Vec::new();
        for (i, op) in ck.ops.iter().enumerate() {
            if op.outcome != Outcome::Ok {
                continue;
            }
            if let Some(Op::Append(v)) = op.completion.map(|c| &ck.events[c].op)
                && let Some(index) = v.index
            {
                by_index.push((index, op.last_event(ck.events).time, i));
            }
        }
        by_index.sort_unstable();
        let min_ok_time = SparseMin::new(by_index.iter().map(|a| a.1).collect());
        Acks {
            by_index,
            min_ok_time,
        }
    }
}

/// One `ok` read under check.
struct Read<'e> {
    /// Its operation.
    op: usize,
    /// The range and consistency asked for.
    value: &'e ReadValue,
    /// What it returned.
    records: &'e [ReadRecord],
    /// Invocation and completion times.
    invoked: u64,
    completed: u64,
}

impl<'a> Checker<'a> {
    pub(crate) fn check_reads(&mut self, order: &TotalOrder<'a>) {
        let by_data = self.appends_by_data();
        let acks = Acks::new(self);
        let (events, ops) = (self.events, self.ops);
        for (r, op) in ops.iter().enumerate() {
            if op.outcome != Outcome::Ok {
                continue;
            }
            let Some(Op::Read(value)) = op.completion.map(|c| &events[c].op) else {
                continue;
            };
            let Some(records) = &value.records else {
                unreachable!("an ok read carries records (parser)")
            };
            self.summary.reads_checked += 1;
            self.summary.read_records_checked += records.len() as u64;
            let invoked = op.invoke_time(events);
            let read = Read {
                op: r,
                value,
                records,
                invoked,
                completed: op.complete_time(events).unwrap_or(invoked),
            };
            self.check_read_shape(&read);
            for rec in read.records {
                self.check_read_record(&read, rec, order, &by_data);
            }
            let returned: HashMap<u64, &str> = records
                .iter()
                .map(|rec| (rec.index, rec.data.as_str()))
                .collect();
            self.check_read_gaps(&read, &returned, order);
            if value.consistency != Consistency::Stale {
                self.check_read_recency(&read, &returned, &acks);
            }
        }
    }

    /// Shape: increasing, within `[from, to]`.
    fn check_read_shape(&mut self, read: &Read<'_>) {
        let v = read.value;
        let mut prev: Option<u64> = None;
        for rec in read.records {
            let out_of_range = rec.index < v.from || v.to.is_some_and(|to| rec.index > to);
            let not_increasing = prev.is_some_and(|p| rec.index <= p);
            if out_of_range || not_increasing {
                self.report(
                    AnomalyKind::ReadMalformed,
                    format!(
                        "read of [{}, {}] returned index {}{}",
                        v.from,
                        fmt_to(v.to),
                        rec.index,
                        if not_increasing {
                            " after a higher or equal index"
                        } else {
                            " outside the range"
                        }
                    ),
                    vec![self.op_ref(read.op)],
                    op_node(&self.ops[read.op], self.events),
                    vec![rec.index],
                );
            }
            prev = Some(prev.map_or(rec.index, |p| p.max(rec.index)));
        }
    }

    /// A record returned is the final order's record at that index, and its
    /// append was invoked before the read ended.
    fn check_read_record(
        &mut self,
        read: &Read<'_>,
        rec: &ReadRecord,
        order: &TotalOrder<'a>,
        by_data: &HashMap<&'a str, usize>,
    ) {
        let data = rec.data.as_str();
        let node = op_node(&self.ops[read.op], self.events);
        if let Some(&a) = by_data.get(data)
            && self.ops[a].invoke_time(self.events) > read.completed
        {
            self.report(
                AnomalyKind::ReadFromFuture,
                format!(
                    "read returned {data:?} at index {} but its append was invoked only at {} ns, after the read completed at {} ns",
                    rec.index,
                    self.ops[a].invoke_time(self.events),
                    read.completed
                ),
                vec![self.op_ref(read.op), self.op_ref(a)],
                node.clone(),
                vec![rec.index],
            );
        }
        if order.by_index.get(&rec.index) == Some(&data) {
            return;
        }
        let mut ops = vec![self.op_ref(read.op)];
        ops.extend(by_data.get(data).map(|&a| self.op_ref(a)));
        let at_index = match order.by_index.get(&rec.index) {
            Some(d) => format!("the final order has {d:?} at index {}", rec.index),
            None => format!("the final order has no record at index {}", rec.index),
        };
        if let Some(places) = order.placements.get(data) {
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
                node,
                indexes.into_iter().collect(),
            );
            return;
        }
        let origin = match by_data.get(data).map(|&a| self.ops[a].outcome) {
            None => "it was never appended (no client invoked it)".to_string(),
            Some(o) => format!(
                "its append ended {}, and it is in no final log (lost)",
                o.as_str()
            ),
        };
        self.report(
            AnomalyKind::ReadLostValue,
            format!(
                "read returned {data:?} at index {}; {at_index}; {origin}",
                rec.index
            ),
            ops,
            node,
            vec![rec.index],
        );
    }

    /// No record of the final order skipped inside the returned span.
    fn check_read_gaps(
        &mut self,
        read: &Read<'_>,
        returned: &HashMap<u64, &str>,
        order: &TotalOrder<'a>,
    ) {
        let v = read.value;
        let Some(last) = read.records.last().map(|rec| rec.index) else {
            return;
        };
        if last < v.from {
            return;
        }
        let skipped: Vec<u64> = order
            .by_index
            .range(v.from..=last)
            .filter(|(i, _)| !returned.contains_key(i))
            .map(|(&i, _)| i)
            .collect();
        if skipped.is_empty() {
            return;
        }
        self.report(
            AnomalyKind::ReadMissingRecord,
            format!(
                "read of [{}, {}] returned up to index {last} but skipped final-order records at {}",
                v.from,
                fmt_to(v.to),
                fmt_list(&skipped)
            ),
            vec![self.op_ref(read.op)],
            op_node(&self.ops[read.op], self.events),
            skipped,
        );
    }

    /// Recency: sees every append acknowledged before it was invoked.
    fn check_read_recency(&mut self, read: &Read<'_>, returned: &HashMap<u64, &str>, acks: &Acks) {
        let v = read.value;
        let hi = v.to.unwrap_or(u64::MAX);
        if hi < v.from {
            return;
        }
        let missed = self.missed_acks(read, returned, acks, hi);
        let Some(&first) = missed.first() else {
            return;
        };
        let (index, ok_time, a) = acks.by_index[first];
        let count_note = if missed.len() > 1 {
            format!(" ({} acknowledged appends missed in all)", missed.len())
        } else {
            String::new()
        };
        self.report(
            AnomalyKind::StaleRead,
            format!(
                "{} read of [{}, {}] invoked at {} ns returned {} record(s){} but missed index {index}, acknowledged at {ok_time} ns{count_note}",
                v.consistency.as_str(),
                v.from,
                fmt_to(v.to),
                read.invoked,
                read.records.len(),
                read.records
                    .last()
                    .map_or(String::new(), |rec| format!(" up to index {}", rec.index)),
            ),
            vec![self.op_ref(read.op), self.op_ref(a)],
            op_node(&self.ops[read.op], self.events),
            missed.iter().map(|&p| acks.by_index[p].0).collect(),
        );
    }

    /// Positions in `acks` of the appends acknowledged before the read was
    /// invoked, in its range `[from, hi]`, that it did not return.
    fn missed_acks(
        &self,
        read: &Read<'_>,
        returned: &HashMap<u64, &str>,
        acks: &Acks,
        hi: u64,
    ) -> Vec<usize> {
        let by_index = &acks.by_index;
        let lo_pos = by_index.partition_point(|a| a.0 < read.value.from);
        let hi_pos = by_index.partition_point(|a| a.0 <= hi);
        let mut missed: Vec<usize> = Vec::new();
        // Inside the returned span: look at each acknowledged append.
        let span_end = read
            .records
            .last()
            .map_or(lo_pos, |rec| by_index.partition_point(|a| a.0 <= rec.index))
            .min(hi_pos);
        for (pos, &(index, ok_time, a)) in by_index.iter().enumerate().take(span_end).skip(lo_pos) {
            if ok_time >= read.invoked {
                continue;
            }
            let Some(Op::Append(v)) = &self.ops[a].completion.map(|c| &self.events[c].op) else {
                continue;
            };
            if returned.get(&index) != Some(&v.data.as_str()) {
                missed.push(pos);
            }
        }
        // Past the returned span: any acknowledged before the invoke is missed.
        if span_end < hi_pos && acks.min_ok_time.min(span_end, hi_pos) < read.invoked {
            missed.extend((span_end..hi_pos).filter(|&p| by_index[p].1 < read.invoked));
        }
        missed
    }
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
