//! The [`Recorder`] as a cluster test uses it: shared by concurrent
//! writers, times stamped in order, checked against final logs, and a
//! verdict that reads well in an assertion message.

use ringraft_checker::history::{Consistency, EventType, FinalRecord, Op, ReadRecord};
use ringraft_checker::{AnomalyKind, FinalLogs, Recorder};

fn same_on(nodes: &[u64], records: &[(u64, &str)]) -> FinalLogs {
    nodes
        .iter()
        .map(|&node| {
            let log = records
                .iter()
                .map(|&(index, data)| FinalRecord::new(index, 1, data))
                .collect();
            (node, log)
        })
        .collect()
}

#[test]
fn concurrent_writers_record_one_checkable_history() {
    let rec = Recorder::new();
    // The "log": the next index, taken with the acknowledgement, so that
    // the indexes follow real time as a linearizable log's do.
    let log = std::sync::Mutex::new(Vec::<(u64, String)>::new());
    std::thread::scope(|scope| {
        for w in 0..4u64 {
            let (rec, log) = (rec.clone(), &log);
            scope.spawn(move || {
                for k in 0..25u64 {
                    let data = format!("w{w}-{k}");
                    let op = rec.invoke_append(rec.fresh_process(), data.clone());
                    let mut log = log.lock().unwrap();
                    let index = log.len() as u64 + 1;
                    log.push((index, data));
                    rec.ok(op, index);
                }
            });
        }
    });
    let events = rec.events();
    assert_eq!(events.len(), 200);
    assert!(events.windows(2).all(|p| p[0].time <= p[1].time));
    let log = log.into_inner().unwrap();
    let records: Vec<(u64, &str)> = log.iter().map(|(i, d)| (*i, d.as_str())).collect();
    let v = rec.check(&same_on(&[1, 2, 3], &records));
    assert!(v.valid, "{v}");
    assert_eq!(v.summary.acked_appends, 100);
}

#[test]
fn reads_fails_and_unknowns_are_recorded() {
    let rec = Recorder::new();
    let a = rec.invoke_append(0, "a");
    rec.ok(a, 1);
    let lost = rec.invoke_append(1, "lost");
    rec.fail(lost, "refused");
    let unknown = rec.invoke_append(2, "unknown");
    rec.info(unknown, "timeout");
    let read = rec.invoke_read(3, 1, None, Consistency::Linearizable);
    rec.read_ok(
        read,
        vec![ReadRecord {
            index: 1,
            data: "a".into(),
        }],
    );
    let failed_read = rec.invoke_read(4, 1, Some(5), Consistency::Stale);
    rec.fail(failed_read, "no leader");
    rec.nemesis_start("partition", serde_json::json!({"isolate": 3}));
    rec.nemesis_stop("partition", serde_json::json!({"isolate": 3}));
    let kinds: Vec<(EventType, &str)> = rec
        .events()
        .iter()
        .map(|e| {
            (
                e.kind,
                if matches!(e.op, Op::Read(_)) {
                    "read"
                } else {
                    "other"
                },
            )
        })
        .collect();
    assert_eq!(kinds.len(), 12);
    let v = rec.check(&same_on(&[1, 2, 3], &[(1, "a")]));
    assert!(v.valid, "{v}");
    assert_eq!(v.summary.reads_checked, 1);
    assert_eq!(v.summary.unknown_appends_absent, 1);
    assert_eq!(v.summary.nemesis_events["partition"], 2);
}

#[test]
fn an_invalid_verdict_says_what_and_where() {
    let rec = Recorder::new();
    let a = rec.invoke_append(0, "a");
    rec.ok(a, 1);
    let v = rec.check(&same_on(&[1, 2], &[]));
    assert!(!v.valid);
    let text = v.to_string();
    assert!(text.starts_with("INVALID: 1 anomalies"), "{text}");
    assert!(text.contains("[lost-append]"), "{text}");
    assert!(text.contains("\"a\""), "{text}");
    assert!(text.contains("op: process 0 append"), "{text}");
    assert_eq!(v.anomalies[0].kind, AnomalyKind::LostAppend);
    // The same process invoking twice is the test's own bug.
    let rec = Recorder::new();
    let _first = rec.invoke_append(0, "x");
    let _second = rec.invoke_append(0, "y");
    let v = rec.check(&same_on(&[1], &[]));
    assert!(v.to_string().contains("malformed-history"), "{v}");
}
