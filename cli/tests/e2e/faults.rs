//! A cluster under faults, through the CLI: appends, reads and `--follow`
//! across kill -9 of the leader, restarts of every node and a SIGSTOPped
//! leader; every acknowledged record once, in order (the Jepsen checker's
//! verdict on the history each test records).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

#[test]
fn append_read_follow() {
    let c = Cluster::start(3, &[]);
    let out = c.cli(&["append", "alpha", "beta"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let idx: Vec<u64> = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(idx.len(), 2);
    assert!(idx[1] > idx[0]);
    let out = cli_with(&c.endpoints(), &["append"], Some("one\ntwo\nthree\n"));
    assert_eq!(lines(&out).len(), 3, "one index per stdin line");
    // Raw format: bytes then a newline.
    let out = c.cli(&["read", "--from", &idx[0].to_string(), "--format", "raw"]);
    assert_eq!(lines(&out), vec!["alpha", "beta", "one", "two", "three"]);
    // Every node answers from its own log (stale reads may lag; the default
    // linearizable read waits until applied).
    for id in c.ids() {
        let data: Vec<String> = c
            .read_all(&c.client(id))
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        assert_eq!(
            data,
            vec!["alpha", "beta", "one", "two", "three"],
            "node {id}"
        );
    }
    // Follow: a streaming reader sees records appended after it started.
    let mut follower = Command::new(BIN)
        .args([
            "read",
            "--follow",
            "--from",
            "1",
            "--endpoints",
            &c.endpoints(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = printed_lines(follower.stdout.take().unwrap());
    let mut seen = Vec::new();
    let next_line = || {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("the follower prints the next record")
    };
    // It streams what exists; "late" is appended only then, so that it
    // arrives while the follower waits (not, on a slow machine, before the
    // follower even started).
    while seen.len() < 5 {
        seen.push(next_line());
    }
    assert!(c.cli(&["append", "late"]).status.success());
    seen.push(next_line());
    follower.kill().unwrap();
    let _ = follower.wait();
    assert_eq!(seen, vec!["alpha", "beta", "one", "two", "three", "late"]);
    // Status JSON carries the keys the interface promises.
    let s = c.status(1).unwrap();
    for key in ["leader_id", "term", "commit_index", "members"] {
        assert!(s.get(key).is_some(), "status lacks {key}: {s}");
    }
}

#[test]
fn kill_the_leader_and_keep_appending_exactly_once() {
    let c = Cluster::start(3, &[]);
    let history = History::default();
    let leader = c.wait_leader(Duration::from_secs(30));
    let expected: Vec<String> = (0..300).map(|k| format!("rec-{k}")).collect();
    // One client session through the failover: the leader is killed once
    // the first 256 records are acknowledged, before the client has read
    // the rest of its input, so that the rest must go through the
    // failover. The leader is the first endpoint: the client's append
    // stream goes to it, and its death breaks the stream.
    let leader_first: Vec<String> = std::iter::once(leader)
        .chain(c.ids().into_iter().filter(|id| *id != leader))
        .map(|id| c.client(id))
        .collect();
    let mut appender = Command::new(BIN)
        .args([
            "append",
            "--timeout-ms",
            "1500",
            "--endpoints",
            &leader_first.join(","),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = appender.stdin.take().unwrap();
    let rx = printed_lines(appender.stdout.take().unwrap());
    let mut ops = history.invoke(&expected[..256], None);
    stdin
        .write_all((expected[..256].join("\n") + "\n").as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    let mut indexes: Vec<u64> = (0..256)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(120))
                .expect("the first 256 records are acknowledged")
                .parse()
                .unwrap()
        })
        .collect();
    history.fault_start("kill", leader);
    c.kill9(leader);
    ops.extend(history.invoke(&expected[256..], None));
    stdin
        .write_all((expected[256..].join("\n") + "\n").as_bytes())
        .unwrap();
    drop(stdin);
    loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => indexes.push(line.parse().unwrap()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = appender.kill();
                panic!("the append through the failover hangs");
            }
        }
    }
    let out = appender.wait_with_output().unwrap();
    history.complete(ops, &indexes, &String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "append through the failover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(indexes.len(), 300, "an index for every record");
    let new = c.wait_leader(Duration::from_secs(60));
    assert_ne!(new, leader);
    let log = history.read_all(&c, &c.endpoints());
    // The killed node comes back and catches up.
    let last = log.iter().map(|(i, _)| *i).max().unwrap();
    c.boot(leader);
    history.fault_stop("kill", leader);
    c.wait_applied(leader, last, Duration::from_secs(120));
    let verdict = history.assert_valid(&c.final_logs(&c.ids()));
    assert_eq!(verdict.summary.acked_appends, 300);
}

#[test]
fn restart_every_node_and_read_everything_back() {
    for durability in ["memory", "fsync"] {
        let c = Cluster::start(3, &["--durability", durability]);
        let history = History::default();
        let expected: Vec<String> = (0..50).map(|k| format!("{durability}-{k}")).collect();
        let (out, _) = history.append_lines(&c.endpoints(), &expected);
        assert_ok(&out);
        for id in 1..=3 {
            c.stop(id);
        }
        for id in 1..=3 {
            c.boot(id);
        }
        c.wait_leader(Duration::from_secs(30));
        let finals = c.final_logs(&c.ids());
        history.assert_valid(&finals);
        for (id, log) in &finals {
            assert_eq!(
                log.len(),
                50,
                "node {id} holds what was appended, nothing else"
            );
        }
    }
}

#[test]
fn a_paused_leader_resumes_without_divergence() {
    let c = Cluster::start(3, &[]);
    let history = History::default();
    let old = c.wait_leader(Duration::from_secs(30));
    let first: Vec<String> = (0..20).map(|k| format!("a-{k}")).collect();
    assert_ok(&history.append_lines(&c.endpoints(), &first).0);
    history.fault_start("pause", old);
    c.pause(old);
    let others: Vec<String> = c
        .ids()
        .into_iter()
        .filter(|id| *id != old)
        .map(|id| c.client(id))
        .collect();
    let second: Vec<String> = (0..20).map(|k| format!("b-{k}")).collect();
    let (out, _) = history.append_lines(&others.join(","), &second);
    assert!(
        out.status.success(),
        "the others commit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.resume(old);
    history.fault_stop("pause", old);
    // All three agree on a leader only once the old one stepped down.
    let leader = c.wait_leader(Duration::from_secs(60));
    assert_ne!(leader, old, "the resumed old leader stepped down");
    let finals = c.final_logs(&c.ids());
    history.assert_valid(&finals);
    let logs: Vec<_> = finals.values().collect();
    assert!(
        logs.windows(2).all(|w| w[0] == w[1]),
        "every node holds the same log"
    );
    for id in 1..=3 {
        c.stop(id);
    }
    for id in c.ids() {
        let out = wal("check", &c.dir(id));
        assert!(
            out.status.success(),
            "wal check on node {id}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("verdict"));
    }
}
