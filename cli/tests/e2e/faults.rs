//! A cluster under faults, through the CLI: appends, reads and `--follow`
//! across kill -9 of the leader, restarts of every node and a SIGSTOPped
//! leader; every acknowledged record once, in order.

use std::io::{BufRead, BufReader, Write};
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
    for n in c.nodes.values() {
        let data: Vec<String> = c.read_all(&n.client).into_iter().map(|(_, d)| d).collect();
        assert_eq!(
            data,
            vec!["alpha", "beta", "one", "two", "three"],
            "node {}",
            n.id
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
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
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
    let mut c = Cluster::start(3, &[]);
    let leader = c.wait_leader(Duration::from_secs(30));
    let expected: Vec<String> = (0..300).map(|k| format!("rec-{k}")).collect();
    // One client session through the failover: the leader is killed once
    // the first 256 records are acknowledged, before the client has read
    // the rest of its input (the client sends at most 256 lines per
    // request), so that the rest must go through the failover.
    let mut appender = Command::new(BIN)
        .args([
            "append",
            "--timeout-ms",
            "1500",
            "--endpoints",
            &c.endpoints(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = appender.stdin.take().unwrap();
    let stdout = appender.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    stdin
        .write_all((expected[..256].join("\n") + "\n").as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    let mut indexes: Vec<String> = (0..256)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(120))
                .expect("the first 256 records are acknowledged")
        })
        .collect();
    c.kill9(leader);
    stdin
        .write_all((expected[256..].join("\n") + "\n").as_bytes())
        .unwrap();
    drop(stdin);
    loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => indexes.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = appender.kill();
                panic!("the append through the failover hangs");
            }
        }
    }
    let out = appender.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "append through the failover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(indexes.len(), 300, "an index for every record");
    let new = c.wait_leader(Duration::from_secs(60));
    assert_ne!(new, leader);
    let log = c.read_all(&c.endpoints());
    assert_exactly_once(&log, &expected);
    // The killed node comes back and catches up.
    let last = log.iter().map(|(i, _)| *i).max().unwrap();
    c.boot(leader);
    c.wait_applied(leader, last, Duration::from_secs(120));
    let log = c.read_all(&c.nodes[&leader].client);
    assert_exactly_once(&log, &expected);
}

#[test]
fn restart_every_node_and_read_everything_back() {
    for durability in ["memory", "fsync"] {
        let mut c = Cluster::start(3, &["--durability", durability]);
        let expected: Vec<String> = (0..50).map(|k| format!("{durability}-{k}")).collect();
        let out = cli_with(
            &c.endpoints(),
            &["append"],
            Some(&(expected.join("\n") + "\n")),
        );
        assert!(out.status.success());
        for id in 1..=3 {
            c.stop(id);
        }
        for id in 1..=3 {
            c.boot(id);
        }
        c.wait_leader(Duration::from_secs(30));
        let log = c.read_all(&c.endpoints());
        assert_exactly_once(&log, &expected);
        assert_eq!(log.len(), 50);
    }
}

#[test]
fn a_paused_leader_resumes_without_divergence() {
    let mut c = Cluster::start(3, &[]);
    let old = c.wait_leader(Duration::from_secs(30));
    let first: Vec<String> = (0..20).map(|k| format!("a-{k}")).collect();
    assert!(
        cli_with(
            &c.endpoints(),
            &["append"],
            Some(&(first.join("\n") + "\n"))
        )
        .status
        .success()
    );
    c.signal(old, "-STOP");
    let others: Vec<String> = c
        .nodes
        .values()
        .filter(|n| n.id != old)
        .map(|n| n.client.clone())
        .collect();
    let second: Vec<String> = (0..20).map(|k| format!("b-{k}")).collect();
    let out = cli_with(
        &others.join(","),
        &["append"],
        Some(&(second.join("\n") + "\n")),
    );
    assert!(
        out.status.success(),
        "the others commit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.signal(old, "-CONT");
    // All three agree on a leader only once the old one stepped down.
    let leader = c.wait_leader(Duration::from_secs(60));
    assert_ne!(leader, old, "the resumed old leader stepped down");
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let mut logs = Vec::new();
    for n in c.nodes.values() {
        let log = c.read_all(&n.client);
        assert_exactly_once(&log, &all);
        logs.push(log);
    }
    assert!(
        logs.windows(2).all(|w| w[0] == w[1]),
        "every node holds the same log"
    );
    for id in 1..=3 {
        c.stop(id);
    }
    for n in c.nodes.values() {
        let out = Command::new(BIN)
            .args(["wal", "check", "--data-dir", n.dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "wal check on node {}: {}",
            n.id,
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("verdict"));
    }
}
