//! Generated histories: a simulated linearizable log driven by a seed yields
//! concurrent histories the checker must accept; each mutation of such a
//! history (the faults a broken cluster would show) must be caught.

mod checker_support;

use std::collections::BTreeMap;

use proptest::prelude::*;
use ringraft_checker::history::{Consistency, Event, EventType, FinalRecord, Op, ReadRecord};
use ringraft_checker::{AnomalyKind as K, check_history};

/// splitmix64: a tiny deterministic generator for the simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

enum Pending {
    Append {
        data: String,
        applied: Option<u64>,
    },
    Read {
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
        seen: Option<Vec<ReadRecord>>,
    },
}

struct Sim {
    rng: Rng,
    events: Vec<Event>,
    /// The log: index -> data (gaps are blank entries).
    log: BTreeMap<u64, String>,
    next_index: u64,
    /// Highest index an append was acknowledged at.
    max_acked: u64,
    time: u64,
    /// Per client slot: its current process and its outstanding operation.
    procs: Vec<(u64, Option<Pending>)>,
    next_process: u64,
    next_data: u64,
}

/// Simulates `clients` processes against one linearizable log: each operation
/// takes effect at one step between its invocation and its completion.
fn simulate(
    seed: u64,
    clients: u64,
    steps: usize,
) -> (Vec<Event>, BTreeMap<u64, Vec<FinalRecord>>) {
    let mut sim = Sim {
        rng: Rng(seed),
        events: Vec::new(),
        log: BTreeMap::new(),
        next_index: 1,
        max_acked: 0,
        time: 0,
        procs: (0..clients).map(|p| (p, None)).collect(),
        next_process: clients,
        next_data: 0,
    };
    for _ in 0..steps {
        sim.time += 1 + sim.rng.below(3);
        let slot = sim.rng.below(clients) as usize;
        sim.step(slot);
    }
    // Operations still outstanding stay pending (possibly applied).
    let finals = sim.finals();
    (sim.events, finals)
}

impl Sim {
    /// One step of the client in `slot`: invoke, take effect, or complete.
    fn step(&mut self, slot: usize) {
        let process = self.procs[slot].0;
        match self.procs[slot].1.take() {
            None => {
                let pending = self.invoke(process);
                self.procs[slot].1 = Some(pending);
            }
            Some(Pending::Append {
                data,
                applied: None,
            }) if self.rng.chance(60) => {
                let index = self.apply_append(data.clone());
                self.procs[slot].1 = Some(Pending::Append {
                    data,
                    applied: Some(index),
                });
            }
            Some(Pending::Read {
                from,
                to,
                consistency,
                seen: None,
            }) if self.rng.chance(60) => {
                let seen = self.apply_read(from, to, consistency);
                self.procs[slot].1 = Some(Pending::Read {
                    from,
                    to,
                    consistency,
                    seen: Some(seen),
                });
            }
            Some(Pending::Append { data, applied }) => {
                let kind = self.complete_append(process, data, applied);
                self.finish(slot, kind);
            }
            Some(read @ Pending::Read { .. }) => {
                let kind = self.complete_read(process, read);
                self.finish(slot, kind);
            }
        }
    }

    /// A new operation of `process`: an append of fresh data (55 %) or a
    /// read of any consistency.
    fn invoke(&mut self, process: u64) -> Pending {
        let time = self.time;
        if self.rng.chance(55) {
            self.next_data += 1;
            let data = format!("v{}", self.next_data);
            self.events
                .push(Event::append_invoke(time, process, data.clone()));
            return Pending::Append {
                data,
                applied: None,
            };
        }
        let consistency = match self.rng.below(3) {
            0 => Consistency::Linearizable,
            1 => Consistency::Lease,
            _ => Consistency::Stale,
        };
        let from = 1 + self.rng.below(self.next_index + 1);
        let to = if self.rng.chance(50) {
            None
        } else {
            Some(from + self.rng.below(6))
        };
        self.events
            .push(Event::read_invoke(time, process, from, to, consistency));
        Pending::Read {
            from,
            to,
            consistency,
            seen: None,
        }
    }

    /// The append takes effect now; a blank entry sometimes precedes it.
    fn apply_append(&mut self, data: String) -> u64 {
        if self.rng.chance(15) {
            self.next_index += 1;
        }
        let index = self.next_index;
        self.next_index += 1;
        self.log.insert(index, data);
        index
    }

    /// The read takes effect now: what the log holds in its range (a stale
    /// read: any prefix of it, as a lagging node would serve).
    fn apply_read(
        &mut self,
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
    ) -> Vec<ReadRecord> {
        let mut limit = to.unwrap_or(u64::MAX);
        if consistency == Consistency::Stale {
            limit = limit.min(self.rng.below(self.next_index + 1));
        }
        if limit < from {
            return Vec::new();
        }
        self.log
            .range(from..=limit)
            .map(|(&index, data)| ReadRecord {
                index,
                data: data.clone(),
            })
            .collect()
    }

    /// The append completes: mostly `ok` if it took effect, else `fail` or
    /// `info`.
    fn complete_append(&mut self, process: u64, data: String, applied: Option<u64>) -> EventType {
        let kind = match applied {
            Some(_) if self.rng.chance(85) => EventType::Ok,
            None if self.rng.chance(50) => EventType::Fail,
            _ => EventType::Info,
        };
        let index = if kind == EventType::Ok { applied } else { None };
        if let Some(i) = index {
            self.max_acked = self.max_acked.max(i);
        }
        self.events.push(Event::append_completion(
            self.time, process, kind, data, index,
        ));
        kind
    }

    /// The read completes: mostly `ok` if it took effect, else `fail` or
    /// `info`.
    fn complete_read(&mut self, process: u64, read: Pending) -> EventType {
        let Pending::Read {
            from,
            to,
            consistency,
            seen,
        } = read
        else {
            unreachable!("complete_read is given reads")
        };
        let kind = match &seen {
            Some(_) if self.rng.chance(90) => EventType::Ok,
            _ if self.rng.chance(50) => EventType::Fail,
            _ => EventType::Info,
        };
        let records = if kind == EventType::Ok { seen } else { None };
        self.events.push(Event::read_completion(
            self.time,
            process,
            kind,
            from,
            to,
            consistency,
            records,
        ));
        kind
    }

    /// Jepsen's rule: a process whose operation is unknown is replaced.
    fn finish(&mut self, slot: usize, kind: EventType) {
        if kind == EventType::Info {
            self.procs[slot].0 = self.next_process;
            self.next_process += 1;
        }
    }

    /// Node 1 holds the whole committed log; the others may lag, but only
    /// behind the last acknowledged append (they must hold every ack).
    fn finals(&mut self) -> BTreeMap<u64, Vec<FinalRecord>> {
        let full: Vec<FinalRecord> = self
            .log
            .iter()
            .map(|(&index, data)| FinalRecord {
                index,
                term: 1,
                data: data.clone(),
            })
            .collect();
        let mut finals = BTreeMap::new();
        finals.insert(1, full.clone());
        for node in 2..=3u64 {
            let keep = full.iter().filter(|r| r.index <= self.max_acked).count();
            let len = keep + self.rng.below((full.len() - keep) as u64 + 1) as usize;
            finals.insert(node, full[..len].to_vec());
        }
        finals
    }
}

fn acked(events: &[Event]) -> Vec<(usize, String, u64)> {
    events
        .iter()
        .enumerate()
        .filter_map(|(i, ev)| match (&ev.kind, &ev.op) {
            (EventType::Ok, Op::Append(v)) => Some((i, v.data.clone(), v.index?)),
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn simulated_linearizable_histories_are_valid(seed in any::<u64>(), clients in 1u64..6, steps in 0usize..400) {
        let (events, finals) = simulate(seed, clients, steps);
        let v = check_history(&events, &finals).expect("structurally valid");
        prop_assert!(v.valid, "anomalies: {:#?}", v.anomalies);
    }

    #[test]
    fn a_lost_acknowledged_append_is_caught(seed in any::<u64>(), pick in any::<u64>(), node in 1u64..=3) {
        let (events, mut finals) = simulate(seed, 4, 300);
        let acks = acked(&events);
        prop_assume!(!acks.is_empty());
        let (_, data, _) = &acks[(pick % acks.len() as u64) as usize];
        finals.get_mut(&node).unwrap().retain(|r| &r.data != data);
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == K::LostAppend && a.nodes.contains(&node)), "{:#?}", v.anomalies);
    }

    #[test]
    fn a_wrong_acknowledged_index_is_caught(seed in any::<u64>(), pick in any::<u64>(), shift in 1u64..5) {
        let (mut events, finals) = simulate(seed, 4, 300);
        let acks = acked(&events);
        prop_assume!(!acks.is_empty());
        let (at, _, _) = acks[(pick % acks.len() as u64) as usize];
        if let Op::Append(v) = &mut events[at].op {
            v.index = v.index.map(|i| i + shift);
        }
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == K::WrongIndex || a.kind == K::LostAppend), "{:#?}", v.anomalies);
    }

    #[test]
    fn a_phantom_or_duplicate_record_is_caught(seed in any::<u64>(), pick in any::<u64>(), phantom in any::<bool>()) {
        let (events, mut finals) = simulate(seed, 4, 300);
        let full = finals[&1].clone();
        let last = full.last().map_or(0, |r| r.index);
        let (data, want) = if phantom || full.is_empty() {
            ("never-appended".to_string(), K::Phantom)
        } else {
            (full[(pick % full.len() as u64) as usize].data.clone(), K::Duplicate)
        };
        for log in finals.values_mut() {
            log.retain(|r| r.index <= last);
            log.push(FinalRecord { index: last + 1, term: 9, data: data.clone() });
        }
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == want), "{:#?}", v.anomalies);
    }

    #[test]
    fn nodes_that_diverge_are_caught(seed in any::<u64>(), pick in any::<u64>()) {
        let (events, mut finals) = simulate(seed, 4, 300);
        let log = finals.get_mut(&2).unwrap();
        prop_assume!(!log.is_empty());
        let at = (pick % log.len() as u64) as usize;
        log[at].data = "other".into();
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == K::Divergence), "{:#?}", v.anomalies);
    }

    #[test]
    fn a_read_record_that_was_never_there_is_caught(seed in any::<u64>(), pick in any::<u64>()) {
        let (mut events, finals) = simulate(seed, 4, 300);
        let reads: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, ev)| matches!(&ev.op, Op::Read(r) if r.records.as_ref().is_some_and(|rs| !rs.is_empty())))
            .map(|(i, _)| i)
            .collect();
        prop_assume!(!reads.is_empty());
        let at = reads[(pick % reads.len() as u64) as usize];
        if let Op::Read(r) = &mut events[at].op {
            let records = r.records.as_mut().unwrap();
            let k = (pick % records.len() as u64) as usize;
            records[k].data = format!("{}-changed", records[k].data);
        }
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == K::ReadLostValue), "{:#?}", v.anomalies);
    }

    #[test]
    fn a_failed_append_that_appears_is_caught(seed in any::<u64>(), pick in any::<u64>()) {
        let (mut events, finals) = simulate(seed, 4, 300);
        let acks = acked(&events);
        prop_assume!(!acks.is_empty());
        let (at, _, _) = acks[(pick % acks.len() as u64) as usize];
        events[at].kind = EventType::Fail;
        if let Op::Append(v) = &mut events[at].op {
            v.index = None;
        }
        let v = check_history(&events, &finals).unwrap();
        prop_assert!(v.anomalies.iter().any(|a| a.kind == K::FailedAppendPresent), "{:#?}", v.anomalies);
    }
}
