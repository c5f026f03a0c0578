//! Hand-made histories: a valid concurrent one passes, and each anomaly kind
//! is detected (and only it).

mod checker_support;

use ringraft_checker::history::{Consistency as C, Event, EventType, Phase};
use ringraft_checker::{AnomalyKind as K, CheckError, check_history};
use serde_json::json;

use checker_support::{History, assert_kinds, finals, same_on_three, verdict};

/// Appends overlap, some end unknown or failed, index 1 is a blank entry,
/// one node lags by an unacknowledged tail, reads of all three consistencies.
fn valid_history() -> History {
    let mut h = History::default();
    h.append_ok(0, "a", 2, 0, 10)
        .append_ok(1, "b", 3, 5, 20)
        .append_ended(2, "c", EventType::Info, 12, 40)
        .append_ended(3, "d", EventType::Fail, 15, 25)
        .append_ended(4, "e", EventType::Info, 30, 60)
        .append_pending(5, "f", 45)
        .append_ok(0, "g", 5, 35, 50)
        .read_ok(0, 1, None, C::Linearizable, &[(2, "a"), (3, "b")], 25, 30)
        .read_ok(1, 1, Some(10), C::Stale, &[(2, "a")], 22, 28)
        .read_ok(6, 3, Some(4), C::Lease, &[(3, "b"), (4, "c")], 50, 55)
        .read_ok(
            7,
            1,
            None,
            C::Linearizable,
            &[(2, "a"), (3, "b"), (4, "c"), (5, "g"), (6, "f")],
            52,
            70,
        )
        .raw(Event::nemesis(
            18,
            "partition",
            json!({"isolate": 1}),
            Some(Phase::Start),
        ))
        .raw(Event::nemesis(
            33,
            "partition",
            json!({"isolate": 1}),
            Some(Phase::Stop),
        ));
    h
}

fn valid_finals() -> std::collections::BTreeMap<u64, Vec<ringraft_checker::history::FinalRecord>> {
    let full: &[(u64, &str)] = &[(2, "a"), (3, "b"), (4, "c"), (5, "g"), (6, "f")];
    finals(&[(1, full), (2, full), (3, &full[..4])])
}

#[test]
fn a_valid_concurrent_history_passes() {
    let v = verdict(&valid_history(), &valid_finals());
    assert_kinds(&v, &[]);
    let s = &v.summary;
    assert_eq!(s.acked_appends, 3);
    assert_eq!(s.unknown_appends_present, 2); // c (info) and f (pending)
    assert_eq!(s.unknown_appends_absent, 1); // e
    assert_eq!(s.reads_checked, 4);
    assert_eq!(s.total_order_len, 5);
    assert_eq!(s.final_log_len[&3], 4);
    assert_eq!(s.pending_ops, 1);
    assert_eq!(s.events_by_f_type["append"]["invoke"], 7);
    assert_eq!(s.nemesis_events["partition"], 2);
}

fn two_acks() -> History {
    let mut h = History::default();
    h.append_ok(0, "a", 1, 0, 10).append_ok(1, "b", 2, 5, 20);
    h
}

#[test]
fn lost_ack_on_every_node() {
    let v = verdict(&two_acks(), &same_on_three(&[(1, "a")]));
    assert_kinds(&v, &[K::LostAppend]);
    assert_eq!(v.anomalies[0].nodes, vec![1, 2, 3]);
    assert_eq!(v.anomalies[0].indexes, vec![2]);
    assert!(
        v.anomalies[0].message.contains("every node"),
        "{}",
        v.anomalies[0].message
    );
    assert_eq!(v.anomalies[0].ops[0].invoke_time, 5);
}

#[test]
fn lost_ack_on_one_node() {
    let full: &[(u64, &str)] = &[(1, "a"), (2, "b")];
    let v = verdict(
        &two_acks(),
        &finals(&[(1, full), (2, full), (3, &full[..1])]),
    );
    assert_kinds(&v, &[K::LostAppend]);
    assert_eq!(v.anomalies[0].nodes, vec![3]);
}

#[test]
fn unknown_append_may_appear_once_but_not_twice() {
    let mut h = History::default();
    h.append_ok(0, "a", 1, 0, 10)
        .append_ended(1, "c", EventType::Info, 5, 30);
    assert_kinds(&verdict(&h, &same_on_three(&[(1, "a"), (2, "c")])), &[]);
    assert_kinds(&verdict(&h, &same_on_three(&[(1, "a")])), &[]);
    let v = verdict(&h, &same_on_three(&[(1, "a"), (2, "c"), (3, "c")]));
    assert_kinds(&v, &[K::Duplicate]);
    assert_eq!(v.anomalies[0].indexes, vec![2, 3]);
}

#[test]
fn acknowledged_duplicate_is_detected() {
    let v = verdict(&two_acks(), &same_on_three(&[(1, "a"), (2, "b"), (3, "a")]));
    // At its acknowledged index, and once more: a duplicate.
    assert_kinds(&v, &[K::Duplicate]);
    assert_eq!(v.anomalies[0].indexes, vec![1, 3]);
}

#[test]
fn nodes_that_disagree_are_divergent() {
    let mut h = History::default();
    h.append_ok(0, "a", 1, 0, 10)
        .append_ended(1, "c", EventType::Info, 5, 30)
        .append_ended(2, "d", EventType::Info, 6, 30);
    let v = verdict(
        &h,
        &finals(&[
            (1, &[(1, "a"), (2, "c")]),
            (2, &[(1, "a"), (2, "d")]),
            (3, &[(1, "a")]),
        ]),
    );
    assert_kinds(&v, &[K::Divergence]);
    assert_eq!(v.anomalies[0].nodes, vec![1, 2]);
    assert_eq!(v.anomalies[0].indexes, vec![2]);

    // A record on one node where another, whose log goes further, has none.
    let v = verdict(
        &h,
        &finals(&[
            (1, &[(1, "a"), (2, "c"), (3, "d")]),
            (2, &[(1, "a"), (3, "d")]),
        ]),
    );
    assert_kinds(&v, &[K::Divergence]);
    assert_eq!(v.anomalies[0].nodes, vec![1, 2]);
}

#[test]
fn a_value_never_appended_is_a_phantom() {
    let v = verdict(
        &two_acks(),
        &same_on_three(&[(1, "a"), (2, "b"), (3, "zzz")]),
    );
    assert_kinds(&v, &[K::Phantom]);
    assert_eq!(v.anomalies[0].indexes, vec![3]);
}

#[test]
fn an_append_at_another_index_than_acknowledged() {
    let mut h = History::default();
    h.append_ok(0, "a", 1, 0, 10)
        .append_ended(1, "c", EventType::Info, 2, 30);
    let v = verdict(&h, &same_on_three(&[(1, "c"), (2, "a")]));
    assert_kinds(&v, &[K::WrongIndex]);
    assert_eq!(v.anomalies[0].indexes, vec![1, 2]);
}

#[test]
fn a_failed_append_must_not_appear() {
    let mut h = History::default();
    h.append_ended(0, "d", EventType::Fail, 0, 10);
    let v = verdict(&h, &same_on_three(&[(1, "d")]));
    assert_kinds(&v, &[K::FailedAppendPresent]);
}

#[test]
fn linearizable_reads_must_see_earlier_acknowledgements() {
    for (consistency, to) in [
        (C::Linearizable, None),
        (C::Lease, Some(1)),
        (C::Linearizable, Some(5)),
    ] {
        let mut h = History::default();
        h.append_ok(0, "a", 1, 0, 10)
            .read_ok(1, 1, to, consistency, &[], 20, 25);
        let v = verdict(&h, &same_on_three(&[(1, "a")]));
        assert_kinds(&v, &[K::StaleRead]);
        assert_eq!(v.anomalies[0].indexes, vec![1]);
        assert_eq!(v.anomalies[0].ops.len(), 2);
    }
    // Missing an acknowledged record in the middle of what it returned.
    let mut h = two_acks();
    h.append_ok(2, "c", 3, 21, 22).read_ok(
        3,
        1,
        None,
        C::Linearizable,
        &[(1, "a"), (3, "c")],
        30,
        35,
    );
    let v = verdict(&h, &same_on_three(&[(1, "a"), (2, "b"), (3, "c")]));
    assert_kinds(&v, &[K::StaleRead, K::ReadMissingRecord]);
}

#[test]
fn reads_that_may_miss_an_append_are_valid() {
    // Stale consistency may lag; a read concurrent with the append may miss it;
    // a read whose range does not cover the index need not see it.
    let mut h = History::default();
    h.append_ok(0, "a", 1, 0, 10)
        .append_ok(0, "b", 2, 11, 20)
        .read_ok(1, 1, None, C::Stale, &[], 30, 35)
        .read_ok(2, 1, None, C::Linearizable, &[(1, "a")], 15, 40)
        .read_ok(3, 2, Some(2), C::Linearizable, &[(2, "b")], 30, 40)
        .read_ok(4, 3, None, C::Linearizable, &[], 30, 40);
    assert_kinds(&verdict(&h, &same_on_three(&[(1, "a"), (2, "b")])), &[]);
}

#[test]
fn a_read_of_a_value_later_lost() {
    let mut h = History::default();
    h.append_ended(0, "c", EventType::Info, 0, 50).read_ok(
        1,
        1,
        None,
        C::Linearizable,
        &[(1, "c")],
        10,
        20,
    );
    let v = verdict(&h, &same_on_three(&[]));
    assert_kinds(&v, &[K::ReadLostValue]);
    // ... or never appended at all.
    let mut h = History::default();
    h.read_ok(1, 1, None, C::Stale, &[(1, "ghost")], 10, 20);
    let v = verdict(&h, &same_on_three(&[]));
    assert_kinds(&v, &[K::ReadLostValue]);
    assert!(
        v.anomalies[0].message.contains("never appended"),
        "{}",
        v.anomalies[0].message
    );
}

#[test]
fn a_read_that_disagrees_with_the_final_order() {
    let mut h = two_acks();
    h.read_ok(2, 1, None, C::Linearizable, &[(1, "b")], 6, 8);
    let v = verdict(&h, &same_on_three(&[(1, "a"), (2, "b")]));
    assert_kinds(&v, &[K::ReadMismatch]);
    assert_eq!(v.anomalies[0].indexes, vec![1, 2]);
}

#[test]
fn a_read_that_sees_the_future() {
    let mut h = History::default();
    h.read_ok(1, 1, None, C::Linearizable, &[(1, "a")], 0, 5)
        .append_ok(0, "a", 1, 10, 20);
    assert_kinds(
        &verdict(&h, &same_on_three(&[(1, "a")])),
        &[K::ReadFromFuture],
    );
}

#[test]
fn a_read_that_skips_a_record_or_leaves_its_range() {
    let mut h = History::default();
    h.append_ended(0, "a", EventType::Info, 0, 50)
        .append_ended(1, "b", EventType::Info, 0, 50)
        .read_ok(2, 1, None, C::Stale, &[(1, "a")], 60, 70)
        .read_ok(3, 1, None, C::Stale, &[(2, "b")], 60, 70);
    let v = verdict(&h, &same_on_three(&[(1, "a"), (2, "b")]));
    assert_kinds(&v, &[K::ReadMissingRecord]);
    assert_eq!(v.anomalies[0].indexes, vec![1]);

    let mut h = History::default();
    h.append_ended(0, "a", EventType::Info, 0, 50)
        .append_ended(1, "b", EventType::Info, 0, 50)
        .read_ok(2, 2, Some(2), C::Stale, &[(1, "a")], 60, 70)
        .read_ok(3, 1, None, C::Stale, &[(2, "b"), (2, "b")], 60, 70);
    let v = verdict(&h, &same_on_three(&[(1, "a"), (2, "b")]));
    assert_kinds(&v, &[K::ReadMalformed, K::ReadMissingRecord]);
    assert_eq!(
        v.anomalies
            .iter()
            .filter(|a| a.kind == K::ReadMalformed)
            .count(),
        2
    );
}

#[test]
fn acknowledged_appends_keep_real_time_order() {
    // a completes before b is invoked, yet b got the lower index.
    let mut h = History::default();
    h.append_ok(0, "a", 2, 0, 10).append_ok(1, "b", 1, 20, 30);
    let v = verdict(&h, &same_on_three(&[(1, "b"), (2, "a")]));
    assert_kinds(&v, &[K::RealTimeOrder]);
    assert_eq!(v.anomalies[0].indexes, vec![2, 1]);
    assert_eq!(v.anomalies[0].ops[0].complete_time, Some(10));
    assert_eq!(v.anomalies[0].ops[1].invoke_time, 20);

    // Same with an unknown-outcome append found in the final order.
    let mut h = History::default();
    h.append_ok(0, "a", 2, 0, 10)
        .append_ended(1, "c", EventType::Info, 20, 30);
    assert_kinds(
        &verdict(&h, &same_on_three(&[(1, "c"), (2, "a")])),
        &[K::RealTimeOrder],
    );

    // Concurrent appends may land in either order.
    let mut h = History::default();
    h.append_ok(0, "a", 2, 0, 10).append_ok(1, "b", 1, 5, 30);
    assert_kinds(&verdict(&h, &same_on_three(&[(1, "b"), (2, "a")])), &[]);
}

/// Client 5 pipelines two requests (three records from processes 0-2, then
/// two from processes 3-4, the second request sent before the first is
/// answered); client 6 appends in between. `seq` is each client's send order.
fn pipelined_history(order: [u64; 5]) -> History {
    let mut h = History::default();
    let during = (0, 30);
    h.client_append_ok(0, (5, 1), "c5-1", order[0], during)
        .client_append_ok(1, (5, 2), "c5-2", order[1], during)
        .client_append_ok(2, (5, 3), "c5-3", order[2], during)
        .client_append_ok(3, (5, 4), "c5-4", order[3], (5, 40))
        .client_append_ended(4, (5, 5), "c5-5", EventType::Info, (5, 40))
        .client_append_ok(5, (6, 1), "c6-1", 4, (1, 20));
    h
}

fn pipelined_log(
    order: [u64; 5],
) -> std::collections::BTreeMap<u64, Vec<ringraft_checker::history::FinalRecord>> {
    let mut log: Vec<(u64, &str)> = vec![(4, "c6-1")];
    for (k, &index) in order.iter().enumerate() {
        log.push((index, ["c5-1", "c5-2", "c5-3", "c5-4", "c5-5"][k]));
    }
    log.sort();
    let log: Vec<(u64, &str)> = log;
    same_on_three(&log)
}

/// Issue 10, item 3: a client's records must keep their order. Records of
/// one request and requests in flight together are concurrent, so
/// real-time order allows any order among them; the client's send order
/// (`value.client`, `value.seq`) does not.
#[test]
fn a_pipelining_clients_appends_land_in_its_send_order() {
    let in_order = [1, 2, 3, 5, 6];
    let v = verdict(&pipelined_history(in_order), &pipelined_log(in_order));
    assert_kinds(&v, &[]);
    assert_eq!(v.summary.acked_appends, 5);
}

/// Issue 10, item 3: the records of one request landed out of request order
/// (seq 2 and 3 swapped), and an unknown-outcome record (seq 5) landed
/// before an acknowledged one sent earlier (seq 4).
#[test]
fn a_clients_appends_out_of_its_send_order_are_detected() {
    let swapped = [1, 3, 2, 6, 5];
    let v = verdict(&pipelined_history(swapped), &pipelined_log(swapped));
    assert_kinds(&v, &[K::ClientOrder]);
    assert_eq!(v.anomalies.len(), 2, "{:#?}", v.anomalies);
    assert_eq!(v.anomalies[0].indexes, vec![3, 2]);
    assert!(
        v.anomalies[0]
            .message
            .contains("client 5 sent seq 2 before seq 3"),
        "{}",
        v.anomalies[0].message
    );
    assert_eq!(v.anomalies[0].ops[0].process, 1);
    assert_eq!(v.anomalies[1].indexes, vec![6, 5]);
    assert_eq!(
        v.anomalies[1].ops[1].outcome,
        ringraft_checker::Outcome::Info
    );
    // An unknown-outcome append that is not in the log constrains nothing.
    let mut h = pipelined_history([1, 2, 3, 5, 6]);
    h.client_append_ended(9, (5, 6), "c5-6", EventType::Info, (50, 60));
    assert_kinds(&verdict(&h, &pipelined_log([1, 2, 3, 5, 6])), &[]);
}

#[test]
fn a_clients_seq_is_unique_and_its_completion_matches() {
    let mut h = History::default();
    h.client_append_ok(0, (5, 1), "a", 1, (0, 10))
        .client_append_ok(1, (5, 1), "b", 2, (0, 10));
    let problems = structure_error(h.events());
    assert!(
        problems[0].contains("client 5's seq 1 already invoked"),
        "{problems:?}"
    );
    let problems = structure_error(vec![
        Event::append_invoke(0, 0, "a").in_client(5, 1),
        Event::append_completion(1, 0, EventType::Ok, "a", Some(1)).in_client(5, 2),
    ]);
    assert!(problems[0].contains("does not match"), "{problems:?}");
}

#[test]
fn a_final_log_out_of_order() {
    let mut h = History::default();
    h.append_ended(0, "a", EventType::Info, 0, 50)
        .append_ended(1, "b", EventType::Info, 0, 50);
    let v = verdict(&h, &finals(&[(1, &[(2, "b"), (1, "a")])]));
    assert_kinds(&v, &[K::FinalLogOrder]);
}

fn structure_error(events: Vec<Event>) -> Vec<String> {
    match check_history(&events, &same_on_three(&[])) {
        Err(CheckError::Structure { problems }) => problems,
        other => panic!("expected a structure error, got {other:?}"),
    }
}

#[test]
fn structural_problems_are_history_errors() {
    // Each history, and what its first problem says.
    let cases = [
        (
            vec![Event::append_completion(5, 0, EventType::Ok, "a", Some(1))],
            "without an outstanding invocation",
        ),
        (
            vec![
                Event::append_invoke(1, 0, "a"),
                Event::append_invoke(2, 0, "b"),
            ],
            "second outstanding operation",
        ),
        (
            vec![
                Event::append_invoke(1, 0, "a"),
                Event::append_completion(2, 0, EventType::Info, "a", None),
                Event::append_invoke(3, 0, "b"),
            ],
            "after an info completion",
        ),
        (
            vec![
                Event::append_invoke(1, 0, "a"),
                Event::append_completion(2, 0, EventType::Ok, "b", Some(1)),
            ],
            "does not match its invocation",
        ),
        (
            vec![
                Event::append_invoke(1, 0, "a"),
                Event::append_completion(2, 0, EventType::Fail, "a", None),
                Event::append_invoke(3, 1, "a"),
            ],
            "must be unique",
        ),
        (
            vec![
                Event::read_invoke(5, 0, 1, None, C::Stale),
                Event::read_completion(4, 0, EventType::Fail, 1, None, C::Stale, None),
            ],
            "before its invocation",
        ),
    ];
    for (events, expected) in cases {
        let p = structure_error(events);
        assert!(p[0].contains(expected), "expected {expected:?}: {p:?}");
    }

    // Many problems are capped, not unbounded.
    let many: Vec<Event> = (0..100)
        .map(|i| Event::append_completion(i, i, EventType::Fail, "x", None))
        .collect();
    assert_eq!(structure_error(many).len(), 20);
}
