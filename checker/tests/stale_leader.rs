//! The stale-leader and term rules, through the [`Recorder`] a cluster test
//! uses: for each rule one history that breaks it (and only it, where the
//! rules allow) and one that keeps it.
//!
//! Every history has the same shape, the one of `tests/faults.rs
//! a_stale_leader_writes_nothing_valid_and_steps_down`: node 1 leads term 1
//! and acknowledges three appends; it is isolated; appends are sent to it
//! while it is cut off; node 2 is elected (term 2) and acknowledges more;
//! the isolation heals.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringraft_checker::history::{Event, FinalRecord};
use ringraft_checker::{
    AnomalyKind as K, CheckError, FinalLogs, OpHandle, Recorder, Verdict, check_history,
};

/// A recorder whose clock advances by 10 ns at every event.
fn recorder() -> Recorder {
    let now = Arc::new(AtomicU64::new(0));
    Recorder::with_clock(move || now.fetch_add(10, Ordering::Relaxed))
}

fn assert_kinds(v: &Verdict, want: &[K]) {
    let got: BTreeSet<K> = v.anomalies.iter().map(|a| a.kind).collect();
    let want: BTreeSet<K> = want.iter().copied().collect();
    assert_eq!(got, want, "{v}");
    assert_eq!(v.valid, want.is_empty(), "{v}");
}

/// The same records, `(index, term, data)`, on nodes 1, 2 and 3.
fn on_three(records: &[(u64, u64, &str)]) -> FinalLogs {
    let log: Vec<FinalRecord> = records
        .iter()
        .map(|&(index, term, data)| FinalRecord::new(index, term, data))
        .collect();
    (1..=3).map(|node| (node, log.clone())).collect()
}

/// What a stale-leader scenario does up to the isolation: three appends
/// acknowledged by node 1 in term 1, then node 1 is cut off.
fn before_isolation(rec: &Recorder) {
    for (k, data) in ["before-0", "before-1", "before-2"].into_iter().enumerate() {
        let op = rec.invoke_append_via(rec.fresh_process(), 1, data);
        rec.ok(op, k as u64 + 1);
    }
    rec.leader_isolated(1, 1);
}

/// Node 2, leader of term 2, acknowledges `new-0` and `new-1` at 5 and 6.
fn new_leader_writes(rec: &Recorder) {
    for (k, data) in ["new-0", "new-1"].into_iter().enumerate() {
        let op = rec.invoke_append_via(rec.fresh_process(), 2, data);
        rec.ok(op, k as u64 + 5);
    }
}

/// The final logs of a cluster that kept the stale leader's write out:
/// `stale` sits at index 4 under term 2 (a client retried it at the new
/// leader).
fn finals_with_stale_in(term: u64) -> FinalLogs {
    on_three(&[
        (1, 1, "before-0"),
        (2, 1, "before-1"),
        (3, 1, "before-2"),
        (4, term, "stale"),
        (5, 2, "new-0"),
        (6, 2, "new-1"),
    ])
}

/// The whole scenario with one append, `stale`, sent to node 1 while it is
/// isolated; `complete` ends it, before the heal or after it.
fn with_stale_append(complete: impl FnOnce(&Recorder, OpHandle), after_heal: bool) -> Recorder {
    let rec = recorder();
    before_isolation(&rec);
    let stale = rec.invoke_append_via(rec.fresh_process(), 1, "stale");
    new_leader_writes(&rec);
    if after_heal {
        rec.leader_healed(1, 1);
        complete(&rec, stale);
    } else {
        complete(&rec, stale);
        rec.leader_healed(1, 1);
    }
    rec
}

#[test]
fn an_isolated_leader_whose_writes_never_become_valid_passes() {
    let rec = with_stale_append(|rec, stale| rec.info(stale, "timeout"), false);
    let v = rec.check(&finals_with_stale_in(2));
    assert!(v.valid, "{v}");
    assert_eq!(v.summary.acked_appends, 5);
}

#[test]
fn an_isolated_leader_that_acknowledges_is_a_stale_leader_ack() {
    // Before the heal: no quorum could have confirmed it.
    let rec = with_stale_append(|rec, stale| rec.ok(stale, 4), false);
    let v = rec.check(&finals_with_stale_in(2));
    assert_kinds(&v, &[K::StaleLeaderAck]);
    assert_eq!(v.anomalies[0].nodes, vec![1]);
}

#[test]
fn an_acknowledgement_after_the_heal_is_not_a_stale_leader_ack() {
    // The client's retry reached the new leader.
    let rec = with_stale_append(|rec, stale| rec.ok(stale, 4), true);
    let v = rec.check(&finals_with_stale_in(2));
    assert!(v.valid, "{v}");
}

#[test]
fn a_stale_leaders_write_under_its_own_term_is_a_stale_leader_write() {
    let rec = with_stale_append(|rec, stale| rec.info(stale, "timeout"), false);
    let v = rec.check(&finals_with_stale_in(1));
    assert_kinds(&v, &[K::StaleLeaderWrite]);
    assert_eq!(v.anomalies[0].indexes, vec![4]);
    assert_eq!(v.anomalies[0].nodes, vec![1, 2, 3]);
}

#[test]
fn an_entry_of_the_deposed_term_after_a_later_term_is_caught() {
    let rec = recorder();
    before_isolation(&rec);
    new_leader_writes(&rec);
    // Sent to node 3 (not the stale leader): only the log's terms break.
    let late = rec.invoke_append_via(rec.fresh_process(), 3, "late");
    rec.info(late, "timeout");
    rec.leader_healed(1, 1);
    let finals = on_three(&[
        (1, 1, "before-0"),
        (2, 1, "before-1"),
        (3, 1, "before-2"),
        (5, 2, "new-0"),
        (6, 2, "new-1"),
        (7, 1, "late"),
    ]);
    let v = rec.check(&finals);
    // Also a term regression: the deposed-term rule names the term that
    // was deposed; the regression rule holds for any term.
    assert_kinds(&v, &[K::DeposedTermEntry, K::TermRegression]);
    let deposed: Vec<&ringraft_checker::Anomaly> = v
        .anomalies
        .iter()
        .filter(|a| a.kind == K::DeposedTermEntry)
        .collect();
    assert_eq!(deposed.len(), 3, "one per node: {v}");
    assert_eq!(deposed[0].indexes, vec![7]);
}

#[test]
fn terms_that_go_back_are_a_term_regression() {
    let rec = recorder();
    let a = rec.invoke_append(0, "a");
    rec.ok(a, 1);
    let b = rec.invoke_append(1, "b");
    rec.ok(b, 2);
    let v = rec.check(&on_three(&[(1, 2, "a"), (2, 1, "b")]));
    assert_kinds(&v, &[K::TermRegression]);
    assert_eq!(v.anomalies.len(), 3, "one per node: {v}");
    let v = rec.check(&on_three(&[(1, 1, "a"), (2, 2, "b")]));
    assert!(v.valid, "{v}");
}

#[test]
fn the_same_record_under_two_terms_is_a_term_divergence() {
    let rec = recorder();
    let a = rec.invoke_append(0, "a");
    rec.ok(a, 1);
    let mut finals = on_three(&[(1, 1, "a")]);
    finals.get_mut(&3).unwrap()[0].term = 2;
    let v = rec.check(&finals);
    assert_kinds(&v, &[K::TermDivergence]);
    assert_eq!(v.anomalies[0].nodes, vec![1, 2, 3]);
    let v = rec.check(&on_three(&[(1, 1, "a")]));
    assert!(v.valid, "{v}");
}

#[test]
fn a_malformed_isolation_window_is_a_structural_error() {
    let healed_only = vec![Event::leader_healed(5, 1, 1)];
    let err = check_history(&healed_only, &on_three(&[])).unwrap_err();
    assert!(
        matches!(&err, CheckError::Structure { problems } if problems[0].contains("never isolated")),
        "{err}"
    );
    let no_term = vec![Event::nemesis(
        5,
        ringraft_checker::history::ISOLATED_LEADER,
        serde_json::json!({"node": 1}),
        Some(ringraft_checker::history::Phase::Start),
    )];
    assert!(check_history(&no_term, &on_three(&[])).is_err());
    // Through the recorder, the same mistake is an invalid verdict.
    let rec = recorder();
    rec.leader_healed(1, 1);
    let v = rec.check(&on_three(&[]));
    assert_kinds(&v, &[K::MalformedHistory]);
}
