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
    events: Vec<Event>,
    /// The log: index -> data (gaps are blank entries).
    log: BTreeMap<u64, String>,
    next_index: u64,
    /// Highest index an append was acknowledged at.
    max_acked: u64,
}

/// Simulates `clients` processes against one linearizable log: each operation
/// takes effect at one step between its invocation and its completion.
fn simulate(
    seed: u64,
    clients: u64,
    steps: usize,
) -> (Vec<Event>, BTreeMap<u64, Vec<FinalRecord>>) {
    let mut rng = Rng(seed);
    let mut sim = Sim {
        events: Vec::new(),
        log: BTreeMap::new(),
        next_index: 1,
        max_acked: 0,
    };
    let mut time = 0u64;
    let mut next_process = clients;
    let mut procs: Vec<(u64, Option<Pending>)> = (0..clients).map(|p| (p, None)).collect();
    let mut next_data = 0u64;
    for _ in 0..steps {
        time += 1 + rng.below(3);
        let slot = rng.below(clients) as usize;
        let process = procs[slot].0;
        match procs[slot].1.take() {
            None => {
                let pending = if rng.chance(55) {
                    next_data += 1;
                    let data = format!("v{next_data}");
                    sim.events
                        .push(Event::append_invoke(time, process, data.clone()));
                    Pending::Append {
                        data,
                        applied: None,
                    }
                } else {
                    let consistency = match rng.below(3) {
                        0 => Consistency::Linearizable,
                        1 => Consistency::Lease,
                        _ => Consistency::Stale,
                    };
                    let from = 1 + rng.below(sim.next_index + 1);
                    let to = if rng.chance(50) {
                        None
                    } else {
                        Some(from + rng.below(6))
                    };
                    sim.events
                        .push(Event::read_invoke(time, process, from, to, consistency));
                    Pending::Read {
                        from,
                        to,
                        consistency,
                        seen: None,
                    }
                };
                procs[slot].1 = Some(pending);
            }
            Some(Pending::Append {
                data,
                applied: None,
            }) if rng.chance(60) => {
                // Takes effect now; a blank entry sometimes precedes it.
                if rng.chance(15) {
                    sim.next_index += 1;
                }
                let index = sim.next_index;
                sim.next_index += 1;
                sim.log.insert(index, data.clone());
                procs[slot].1 = Some(Pending::Append {
                    data,
                    applied: Some(index),
                });
            }
            Some(Pending::Read {
                from,
                to,
                consistency,
                seen: None,
            }) if rng.chance(60) => {
                let mut limit = to.unwrap_or(u64::MAX);
                if consistency == Consistency::Stale {
                    // A lagging node: any prefix of the log.
                    limit = limit.min(rng.below(sim.next_index + 1));
                }
                let seen = if limit < from {
                    Vec::new()
                } else {
                    sim.log
                        .range(from..=limit)
                        .map(|(&index, data)| ReadRecord {
                            index,
                            data: data.clone(),
                        })
                        .collect()
                };
                procs[slot].1 = Some(Pending::Read {
                    from,
                    to,
                    consistency,
                    seen: Some(seen),
                });
            }
            Some(Pending::Append { data, applied }) => {
                let kind = match applied {
                    Some(_) if rng.chance(85) => EventType::Ok,
                    None if rng.chance(50) => EventType::Fail,
                    _ => EventType::Info,
                };
                let index = if kind == EventType::Ok { applied } else { None };
                if let Some(i) = index {
                    sim.max_acked = sim.max_acked.max(i);
                }
                sim.events
                    .push(Event::append_completion(time, process, kind, data, index));
                finish(&mut procs[slot], kind, &mut next_process);
            }
            Some(Pending::Read {
                from,
                to,
                consistency,
                seen,
            }) => {
                let kind = match &seen {
                    Some(_) if rng.chance(90) => EventType::Ok,
                    _ if rng.chance(50) => EventType::Fail,
                    _ => EventType::Info,
                };
                let records = if kind == EventType::Ok { seen } else { None };
                sim.events.push(Event::read_completion(
                    time,
                    process,
                    kind,
                    from,
                    to,
                    consistency,
                    records,
                ));
                finish(&mut procs[slot], kind, &mut next_process);
            }
        }
    }
    // Operations still outstanding stay pending (possibly applied).
    let full: Vec<FinalRecord> = sim
        .log
        .iter()
        .map(|(&index, data)| FinalRecord {
            index,
            term: 1,
            data: data.clone(),
        })
        .collect();
    let mut finals = BTreeMap::new();
    // Node 1 holds the whole committed log; the others may lag, but only
    // behind the last acknowledged append (they must hold every ack).
    finals.insert(1, full.clone());
    for node in 2..=3u64 {
        let keep = full.iter().filter(|r| r.index <= sim.max_acked).count();
        let len = keep + rng.below((full.len() - keep) as u64 + 1) as usize;
        finals.insert(node, full[..len].to_vec());
    }
    (sim.events, finals)
}

fn finish(slot: &mut (u64, Option<Pending>), kind: EventType, next_process: &mut u64) {
    if kind == EventType::Info {
        // Jepsen's rule: a process whose operation is unknown is replaced.
        slot.0 = *next_process;
        *next_process += 1;
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
