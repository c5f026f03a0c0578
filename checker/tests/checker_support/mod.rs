//! Builders for hand-made histories and final logs (shared by the checker tests).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use ringraft_checker::history::{Consistency, Event, EventType, FinalRecord, ReadRecord};
use ringraft_checker::{AnomalyKind, Verdict, check_history};

/// A history under construction: operations are added with explicit times and
/// sorted into time order by [`History::events`].
#[derive(Default)]
pub struct History {
    events: Vec<(u64, usize, Event)>,
}

impl History {
    fn push(&mut self, ev: Event) {
        let seq = self.events.len();
        self.events.push((ev.time, seq, ev));
    }

    /// An append by `process`, invoked at `t0`, acknowledged at `t1` with `index`.
    pub fn append_ok(
        &mut self,
        process: u64,
        data: &str,
        index: u64,
        t0: u64,
        t1: u64,
    ) -> &mut Self {
        self.push(Event::append_invoke(t0, process, data));
        self.push(Event::append_completion(
            t1,
            process,
            EventType::Ok,
            data,
            Some(index),
        ));
        self
    }

    /// An append that ended `fail` or `info` at `t1`.
    pub fn append_ended(
        &mut self,
        process: u64,
        data: &str,
        kind: EventType,
        t0: u64,
        t1: u64,
    ) -> &mut Self {
        self.push(Event::append_invoke(t0, process, data));
        self.push(Event::append_completion(t1, process, kind, data, None));
        self
    }

    /// An append by `process`, sent by `client` at `seq` of its send order,
    /// invoked at `t0`, acknowledged at `t1` with `index`.
    pub fn client_append_ok(
        &mut self,
        process: u64,
        (client, seq): (u64, u64),
        data: &str,
        index: u64,
        (t0, t1): (u64, u64),
    ) -> &mut Self {
        self.push(Event::append_invoke(t0, process, data).in_client(client, seq));
        self.push(
            Event::append_completion(t1, process, EventType::Ok, data, Some(index))
                .in_client(client, seq),
        );
        self
    }

    /// An append sent by `client` at `seq` of its send order that ended
    /// `fail` or `info` at `t1`.
    pub fn client_append_ended(
        &mut self,
        process: u64,
        (client, seq): (u64, u64),
        data: &str,
        kind: EventType,
        (t0, t1): (u64, u64),
    ) -> &mut Self {
        self.push(Event::append_invoke(t0, process, data).in_client(client, seq));
        self.push(Event::append_completion(t1, process, kind, data, None).in_client(client, seq));
        self
    }

    /// An append invoked and never completed.
    pub fn append_pending(&mut self, process: u64, data: &str, t0: u64) -> &mut Self {
        self.push(Event::append_invoke(t0, process, data));
        self
    }

    /// An ok read of `[from, to]` returning `records` (index, data).
    // One argument per field of the two events keeps the tests readable.
    #[allow(clippy::too_many_arguments)]
    pub fn read_ok(
        &mut self,
        process: u64,
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
        records: &[(u64, &str)],
        t0: u64,
        t1: u64,
    ) -> &mut Self {
        let records = records
            .iter()
            .map(|&(index, data)| ReadRecord {
                index,
                data: data.into(),
            })
            .collect();
        self.push(Event::read_invoke(t0, process, from, to, consistency));
        self.push(Event::read_completion(
            t1,
            process,
            EventType::Ok,
            from,
            to,
            consistency,
            Some(records),
        ));
        self
    }

    /// A raw event, kept at its place in time.
    pub fn raw(&mut self, ev: Event) -> &mut Self {
        self.push(ev);
        self
    }

    /// The events in time order (insertion order among equal times).
    pub fn events(&self) -> Vec<Event> {
        let mut sorted: Vec<&(u64, usize, Event)> = self.events.iter().collect();
        sorted.sort_by_key(|(t, seq, _)| (*t, *seq));
        sorted.into_iter().map(|(_, _, ev)| ev.clone()).collect()
    }
}

/// Final logs from `(node, [(index, data)])`, terms all 1.
pub fn finals(nodes: &[(u64, &[(u64, &str)])]) -> BTreeMap<u64, Vec<FinalRecord>> {
    nodes
        .iter()
        .map(|&(node, recs)| {
            (
                node,
                recs.iter()
                    .map(|&(index, data)| FinalRecord {
                        index,
                        term: 1,
                        data: data.into(),
                    })
                    .collect(),
            )
        })
        .collect()
}

/// The same log on nodes 1, 2 and 3.
pub fn same_on_three(recs: &[(u64, &str)]) -> BTreeMap<u64, Vec<FinalRecord>> {
    finals(&[(1, recs), (2, recs), (3, recs)])
}

/// Checks and returns the verdict; panics on a structural error.
pub fn verdict(h: &History, finals: &BTreeMap<u64, Vec<FinalRecord>>) -> Verdict {
    check_history(&h.events(), finals).expect("history is structurally valid")
}

/// The set of anomaly kinds in a verdict.
pub fn kinds(v: &Verdict) -> BTreeSet<AnomalyKind> {
    v.anomalies.iter().map(|a| a.kind).collect()
}

/// Asserts the verdict holds exactly these anomaly kinds.
pub fn assert_kinds(v: &Verdict, want: &[AnomalyKind]) {
    let want: BTreeSet<AnomalyKind> = want.iter().copied().collect();
    assert_eq!(kinds(v), want, "anomalies: {:#?}", v.anomalies);
    assert_eq!(v.valid, want.is_empty());
}
