//! The operator's tools as processes: `ringraft bench` reports what it
//! appended and read back; `ringraft demo` passes, and leaves nothing running when it
//! ends or is interrupted.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn bench_reports_what_it_appended() {
    let c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "before the bench"]).status.success());
    // Appends may take long on a loaded machine: only a lost one is an
    // error here, not a slow one (the default deadline is 10 s).
    let out = c.cli(&[
        "bench",
        "--clients",
        "4",
        "--size",
        "100",
        "--duration",
        "2",
        "--append-deadline-ms",
        "300000",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    assert!(
        stderr.contains("acknowledged") && stderr.contains("records/s"),
        "a progress line on stderr: {stderr}"
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "only the summary on stdout");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    check_json_summary(&summary);
    bench_records_are_in_the_log_once(&c, &summary);
    text_summary(&c);
    // Bad parameters are refused before anything is sent.
    let out = c.cli(&["bench", "--clients", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clients"));
    let out = c.cli(&["bench", "--size", "70000", "--duration", "1"]);
    assert!(!out.status.success(), "a record above --max-record");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max-record"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_reads_back_what_it_appended() {
    let c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "before the bench"]).status.success());
    let bench = |workload: &str, consistency: &str| {
        let out = c.cli(&[
            "bench",
            "--clients",
            "2",
            "--size",
            "100",
            "--duration",
            "1",
            "--workload",
            workload,
            "--consistency",
            consistency,
            "--append-deadline-ms",
            "300000",
            "--json",
            "--quiet",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "bench failed: {stderr}");
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["errors"], 0, "{s}");
        assert_eq!(s["workload"], workload);
        assert_eq!(s["consistency"], consistency);
        let reads = s["reads"].as_u64().unwrap();
        assert!(reads > 0, "{s}");
        let r = &s["read_latency_ms"];
        assert_eq!(r["samples"].as_u64().unwrap(), reads);
        assert!(0.0 < r["p50"].as_f64().unwrap(), "{s}");
        // Every record appended, measured or not, is in the log once.
        bench_records_are_in_the_log_once(&c, &s);
        s
    };
    // mixed: each read follows an append of its own.
    let s = bench("mixed", "linearizable");
    let (acked, reads) = (
        s["acknowledged"].as_u64().unwrap(),
        s["reads"].as_u64().unwrap(),
    );
    assert!(reads <= acked && acked <= reads + 2, "{s}");
    assert_eq!(
        s["latency_ms"]["samples"].as_u64().unwrap(),
        acked,
        "every append measured"
    );
    // read: one append per client, unmeasured, then only reads.
    for consistency in ["lease", "stale"] {
        let s = bench("read", consistency);
        assert_eq!(s["acknowledged"], 2, "{s}");
        assert_eq!(s["latency_ms"]["samples"], 0, "{s}");
    }
    let out = c.cli(&["bench", "--workload", "scan", "--duration", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workload scan"));
}

/// The JSON summary of a 4-client, 100-byte, 2-second bench: its counts,
/// latencies and rates agree with each other.
fn check_json_summary(s: &serde_json::Value) {
    let acknowledged = s["acknowledged"].as_u64().unwrap();
    assert!(acknowledged > 0, "{s}");
    assert_eq!(s["errors"], 0, "{s}");
    assert_eq!(s["clients"], 4);
    assert_eq!(s["size_bytes"], 100);
    assert!(s["retries"].is_u64());
    let latency = &s["latency_ms"];
    let (p50, p99, p999) = (
        latency["p50"].as_f64().unwrap(),
        latency["p99"].as_f64().unwrap(),
        latency["p999"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{latency}");
    let elapsed = s["elapsed_s"].as_f64().unwrap();
    assert!(elapsed >= 2.0, "{s}");
    let rate = s["records_per_s"].as_f64().unwrap();
    assert!((rate - acknowledged as f64 / elapsed).abs() < 1e-6 * rate.max(1.0));
    assert!((s["mb_per_s"].as_f64().unwrap() - rate * 100.0 / 1e6).abs() < 1e-9);
}

/// Every record the bench of `s` acknowledged is in the log, once, and
/// nothing else of its run is.
fn bench_records_are_in_the_log_once(c: &Cluster, s: &serde_json::Value) {
    let acknowledged = s["acknowledged"].as_u64().unwrap();
    let tag = format!("bench-{}-", s["run"].as_str().unwrap());
    let log = c.read_all(&c.endpoints());
    let ours: Vec<&(u64, String)> = log.iter().filter(|(_, d)| d.starts_with(&tag)).collect();
    assert_eq!(ours.len() as u64, acknowledged);
    assert!(ours.iter().all(|(_, d)| d.len() == 100));
    let mut distinct: Vec<&String> = ours.iter().map(|(_, d)| d).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ours.len(), "no record twice");
    assert_eq!(s["first_index"].as_u64().unwrap(), ours.first().unwrap().0);
    assert_eq!(s["last_index"].as_u64().unwrap(), ours.last().unwrap().0);
    assert_eq!(log[0].1, "before the bench");
}

/// The text summary names every figure; `--quiet` prints no progress.
fn text_summary(c: &Cluster) {
    let out = c.cli(&[
        "bench",
        "--clients",
        "1",
        "--duration",
        "1",
        "--append-deadline-ms",
        "300000",
        "--quiet",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "records/s",
        "MB/s",
        "p50",
        "p99",
        "p999",
        "errors",
        "retries",
    ] {
        assert!(text.contains(word), "summary lacks {word}: {text}");
    }
    assert!(out.stderr.is_empty(), "--quiet: no progress line");
}

#[test]
fn demo_exits_0_and_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let demo_dir = dir.path().join("demo");
    let demo_dir_str = demo_dir.to_str().unwrap();
    // Steps get a deadline a loaded machine cannot break (the default is
    // 30 s); the bound is a safety net against a hang.
    let out = run_bounded(
        &["demo", "--dir", demo_dir_str, "--step-timeout", "300"],
        Duration::from_secs(1800),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "leads in term",
        "failover",
        "caught up",
        "checker: valid",
        "0 anomalies",
        "PASS",
        "node3.log",
        "history.jsonl",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    for id in 1..=3 {
        assert!(demo_dir.join(format!("node{id}")).is_dir());
        assert!(demo_dir.join(format!("node{id}.log")).is_file());
        assert!(demo_dir.join(format!("final/{id}.jsonl")).is_file());
    }
    // The run files the demo left are a run the checker passes again.
    let verdict = ringraft_checker::check(&demo_dir).unwrap();
    assert!(verdict.valid, "{verdict}");
    assert_eq!(verdict.summary.acked_appends, 20, "--records 10, twice");
    let left = processes_mentioning(demo_dir_str);
    assert!(left.is_empty(), "left running: {left:?}");
    // A directory that is in use is refused.
    let out = run_bounded(&["demo", "--dir", demo_dir_str], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
}

#[test]
fn an_interrupted_demo_stops_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let demo_dir = dir.path().join("demo");
    let demo_dir_str = demo_dir.to_str().unwrap().to_string();
    let mut child = Command::new(BIN)
        .args(["demo", "--dir", &demo_dir_str])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Interrupt it once the nodes run.
    let rx = printed_lines(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("node 3: pid") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the demo did not start its nodes: {e}");
            }
        }
    }
    let running = processes_mentioning(&demo_dir_str);
    assert!(running.len() >= 4, "the demo and its 3 nodes: {running:?}");
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let mut rest = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        rest.push(line);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not exit after SIGINT: {rest:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("Interrupted")), "{rest:?}");
    let left = processes_mentioning(&demo_dir_str);
    assert!(left.is_empty(), "left running: {left:?}");
}
