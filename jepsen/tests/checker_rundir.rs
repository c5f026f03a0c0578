//! `check_and_report` over run directories: outputs written, exit statuses,
//! and clear errors (never a panic) on missing or garbled files.

use std::path::Path;

use ringraft_jepsen::checker::{CheckError, check};
use ringraft_jepsen::history::{
    Consistency, Event, EventType, FinalRecord, Phase, write_final_log, write_history,
};
use ringraft_jepsen::report::{check_and_report, exit_code};
use serde_json::json;

fn write_run(dir: &Path, final_data: &[(u64, &[(u64, &str)])]) {
    std::fs::write(
        dir.join("run.json"),
        json!({"seed": 7, "substrate": "netns", "nodes": [1, 2, 3], "nemeses": ["partition"], "duration_s": 2,
               "clients": 2, "planted_bug": null, "started_at": "2025-01-01T00:00:00Z"})
        .to_string(),
    )
    .unwrap();
    let events = vec![
        Event::append_invoke(0, 0, "a\"quoted\"").with_node(1),
        Event::nemesis(
            5_000_000,
            "partition",
            json!({"isolate": 3}),
            Some(Phase::Start),
        ),
        Event::append_completion(10_000_000, 0, EventType::Ok, "a\"quoted\"", Some(1)).with_node(1),
        Event::read_invoke(20_000_000, 1, 1, None, Consistency::Linearizable),
        Event::read_completion(
            30_000_000,
            1,
            EventType::Ok,
            1,
            None,
            Consistency::Linearizable,
            Some(vec![ringraft_jepsen::history::ReadRecord {
                index: 1,
                data: "a\"quoted\"".into(),
            }]),
        ),
        Event::append_invoke(40_000_000, 0, "b"),
        Event::append_completion(1_500_000_000, 0, EventType::Info, "b", None)
            .with_error("timeout"),
        Event::nemesis(
            1_600_000_000,
            "partition",
            json!({"isolate": 3}),
            Some(Phase::Stop),
        ),
    ];
    write_history(&dir.join("history.jsonl"), &events).unwrap();
    std::fs::create_dir_all(dir.join("final")).unwrap();
    for &(node, recs) in final_data {
        let recs: Vec<FinalRecord> = recs
            .iter()
            .map(|&(index, data)| FinalRecord {
                index,
                term: 2,
                data: data.into(),
            })
            .collect();
        write_final_log(&dir.join(format!("final/{node}.jsonl")), &recs).unwrap();
    }
}

#[test]
fn a_valid_run_writes_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let log: &[(u64, &str)] = &[(1, "a\"quoted\"")];
    write_run(dir.path(), &[(1, log), (2, log)]);
    std::fs::write(
        dir.path().join("final/missing.json"),
        r#"[{"node": 3, "reason": "connection refused"}]"#,
    )
    .unwrap();
    let result = check_and_report(dir.path());
    assert_eq!(exit_code(&result), 0, "{result:?}");
    let text = std::fs::read_to_string(dir.path().join("report.txt")).unwrap();
    assert!(text.contains("Verdict: VALID"), "{text}");
    assert!(
        text.contains("node 3: NOT CHECKED (connection refused)"),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["valid"], json!(true));
    assert_eq!(report["summary"]["acked_appends"], json!(1));
    let edn = std::fs::read_to_string(dir.path().join("history.edn")).unwrap();
    assert_eq!(edn.lines().count(), 8);
    assert!(
        edn.contains(r#":value {:data "a\"quoted\"", :index 1}"#),
        "{edn}"
    );
    assert!(edn.contains(":process :nemesis"), "{edn}");
    let svg = std::fs::read_to_string(dir.path().join("plot.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("partition"));
}

#[test]
fn a_violation_exits_one_with_the_evidence() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &[
            (1, &[(1, "a\"quoted\"")]),
            (2, &[]),
            (3, &[(1, "a\"quoted\""), (2, "b"), (3, "b")]),
        ],
    );
    let result = check_and_report(dir.path());
    assert_eq!(exit_code(&result), 1, "{result:?}");
    let text = std::fs::read_to_string(dir.path().join("report.txt")).unwrap();
    assert!(text.contains("Verdict: INVALID"), "{text}");
    assert!(text.contains("[lost-append] x1"), "{text}");
    assert!(text.contains("[duplicate] x1"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["valid"], json!(false));
    assert_eq!(report["anomaly_counts"]["lost-append"], json!(1));
    assert_eq!(report["anomalies"][0]["nodes"], json!([2]));
}

#[test]
fn unusable_input_is_a_clear_error() {
    let log: &[(u64, &str)] = &[(1, "a\"quoted\"")];

    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[(1, log)]);
    let mut text = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    text = text.replacen("\"type\":\"ok\"", "\"type\":\"okay\"", 1);
    std::fs::write(dir.path().join("history.jsonl"), text).unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(err.to_string().contains("history.jsonl:3"), "{err}");
    assert_eq!(exit_code(&check_and_report(dir.path())), 2);

    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[(1, log)]);
    std::fs::write(
        dir.path().join("final/2.jsonl"),
        "{\"index\": 1, \"term\": 1}\n",
    )
    .unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("2.jsonl:1") && err.to_string().contains("data"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[]);
    assert!(matches!(
        check(dir.path()),
        Err(CheckError::NoFinalLogs { .. })
    ));

    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[(1, log)]);
    std::fs::remove_file(dir.path().join("run.json")).unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(err.to_string().contains("run.json"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[(1, log)]);
    std::fs::write(dir.path().join("history.jsonl"), [0xff, 0xfe, b'\n']).unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("history.jsonl:1") && err.to_string().contains("UTF-8"),
        "{err}"
    );

    // A structurally broken history: completion without invocation.
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &[(1, log)]);
    write_history(
        &dir.path().join("history.jsonl"),
        &[Event::append_completion(1, 0, EventType::Ok, "a", Some(1))],
    )
    .unwrap();
    let result = check_and_report(dir.path());
    assert!(
        matches!(result, Err(CheckError::Structure { .. })),
        "{result:?}"
    );
    assert_eq!(exit_code(&result), 2);
}
