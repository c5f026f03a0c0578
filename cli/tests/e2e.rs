//! End-to-end tests: real `ringraft serve` processes on loopback (tcp
//! fabric), driven through the `ringraft` command-line client, with kill -9,
//! SIGSTOP/SIGCONT, restarts and hostile input.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ringraft");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Node {
    id: u64,
    listen: String,
    client: String,
    metrics: String,
    dir: PathBuf,
    child: Option<Child>,
}

struct Cluster {
    nodes: BTreeMap<u64, Node>,
    peers: String,
    base: tempfile::TempDir,
    extra: Vec<String>,
}

impl Cluster {
    /// The nodes' ring dir: in the test's temporary directory.
    fn ring_dir(&self) -> PathBuf {
        self.base.path().join("shm")
    }

    fn start(n: u64, extra: &[&str]) -> Cluster {
        let mut c = Cluster::new(n, extra);
        for id in 1..=n {
            c.boot(id);
        }
        c.wait_leader(Duration::from_secs(30));
        c
    }

    /// The cluster's nodes, none started yet.
    fn new(n: u64, extra: &[&str]) -> Cluster {
        let base = tempfile::tempdir().unwrap();
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            nodes.insert(
                id,
                Node {
                    id,
                    listen: format!("127.0.0.1:{}", free_port()),
                    client: format!("127.0.0.1:{}", free_port()),
                    metrics: format!("127.0.0.1:{}", free_port()),
                    dir: base.path().join(format!("n{id}")),
                    child: None,
                },
            );
        }
        let peers = nodes
            .values()
            .map(|n| format!("{}={}", n.id, n.listen))
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            nodes,
            peers,
            base,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn serve_args(&self, id: u64) -> Vec<String> {
        let n = &self.nodes[&id];
        let ring_dir = self.ring_dir();
        let mut args: Vec<String> = [
            "serve",
            "--id",
            &id.to_string(),
            "--data-dir",
            n.dir.to_str().unwrap(),
            // Rings in the test's own directory, not in /dev/shm.
            "--ring-dir",
            ring_dir.to_str().unwrap(),
            "--listen",
            &n.listen,
            "--client",
            &n.client,
            "--peers",
            &self.peers,
            "--fabric",
            "tcp",
            "--metrics",
            &n.metrics,
            "--ring-capacity",
            "8388608",
            "--max-record",
            "65536",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // An option given in `extra` replaces its default above (every
        // option above takes a value).
        for flag in self.extra.iter().filter(|a| a.starts_with("--")) {
            if let Some(k) = args.iter().position(|a| a == flag) {
                args.drain(k..=k + 1);
            }
        }
        if id == 1 {
            args.push("--bootstrap".into());
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    fn boot(&mut self, id: u64) {
        let args = self.serve_args(id);
        let log = std::fs::File::create(self.base.path().join(format!("n{id}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes.get_mut(&id).unwrap().child = Some(child);
    }

    fn kill9(&mut self, id: u64) {
        let mut child = self.nodes.get_mut(&id).unwrap().child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn signal(&self, id: u64, sig: &str) {
        let pid = self.nodes[&id].child.as_ref().unwrap().id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    fn stop(&mut self, id: u64) {
        self.signal(id, "-TERM");
        let mut child = self.nodes.get_mut(&id).unwrap().child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "node {id} exited with {status} on SIGTERM"
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn endpoints(&self) -> String {
        self.nodes
            .values()
            .map(|n| n.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn cli(&self, args: &[&str]) -> Output {
        cli_with(&self.endpoints(), args, None)
    }

    fn status(&self, id: u64) -> Option<serde_json::Value> {
        let out = cli_with(
            &self.nodes[&id].client,
            &["status", "--json", "--timeout-ms", "1000"],
            None,
        );
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The leader agreed by every running node.
    fn wait_leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<Option<u64>> = self
                .nodes
                .values()
                .filter(|n| n.child.is_some())
                .map(|n| self.status(n.id).and_then(|s| s["leader_id"].as_u64()))
                .collect();
            if let Some(Some(l)) = leaders.first()
                && leaders.iter().all(|x| *x == Some(*l))
                && self.nodes[l].child.is_some()
            {
                return *l;
            }
            assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until node `id` answers and applied at least `index`.
    fn wait_applied(&self, id: u64, index: u64, timeout: Duration) {
        self.wait_status(id, "applied_index", index, timeout);
    }

    /// Waits until node `id`'s status reports `key` at least `value`;
    /// returns what it reports.
    fn wait_status(&self, id: u64, key: &str, value: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.status(id).and_then(|s| s[key].as_u64()).unwrap_or(0);
            if now >= value {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "node {id}: {key} {now}, waiting for {value}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A counter of node `id`'s fabric device, from its metrics endpoint.
    fn nic_counter(&self, id: u64, counter: &str) -> Option<u64> {
        let mut s = std::net::TcpStream::connect(&self.nodes[&id].metrics).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: ringraft\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let prefix = format!("ringraft_nic_counter{{counter=\"{counter}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }

    /// Waits until every node's device `counter` is above `above[id]`.
    fn wait_counters_above(&self, counter: &str, above: &BTreeMap<u64, u64>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let now: BTreeMap<u64, u64> = above
                .keys()
                .map(|id| (*id, self.nic_counter(*id, counter).unwrap_or(0)))
                .collect();
            if now.iter().all(|(id, v)| *v > above[id]) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{counter}: {now:?}, waiting for more than {above:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn read_all(&self, endpoints: &str) -> Vec<(u64, String)> {
        // Patient: a node that is catching up answers a linearizable read
        // only once it applied that far, which a loaded machine takes long
        // to do.
        let out = cli_with(
            endpoints,
            &[
                "read",
                "--from",
                "1",
                "--format",
                "json",
                "--deadline-ms",
                "120000",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "read failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["index"].as_u64().unwrap(),
                    v["data"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.values_mut() {
            if let Some(mut c) = n.child.take() {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn cli_with(endpoints: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--endpoints").arg(endpoints);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

fn assert_exactly_once(log: &[(u64, String)], expected: &[String]) {
    for e in expected {
        let n = log.iter().filter(|(_, d)| d == e).count();
        assert_eq!(n, 1, "{e} appears {n} times");
    }
    let mut indexes: Vec<u64> = log.iter().map(|(i, _)| *i).collect();
    let sorted = {
        let mut s = indexes.clone();
        s.sort();
        s
    };
    assert_eq!(indexes, sorted, "records in index order");
    indexes.dedup();
    assert_eq!(indexes.len(), log.len(), "no index twice");
}

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

fn raw_garbage(addr: &str, bytes: &[u8]) {
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = s.write_all(bytes);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
}

#[test]
fn bad_input_gets_clear_errors_and_the_cluster_keeps_serving() {
    let c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "before"]).status.success());
    // Garbage on every port of every node.
    for n in c.nodes.values() {
        for addr in [&n.client, &n.listen, &n.metrics] {
            raw_garbage(addr, b"\x16\x03\x01\x02\x00garbage\xff\xff\xff\xff");
            raw_garbage(addr, &[0u8; 70_000]);
            raw_garbage(addr, b"GET /../../etc/passwd HTTP/1.1\r\n\r\n");
        }
    }
    // A record above --max-record.
    let big = "x".repeat(70_000);
    let out = c.cli(&["append", &big]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max-record"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A bad range.
    let out = c.cli(&["read", "--from", "10", "--to", "2"]);
    assert!(!out.status.success());
    // Bad client arguments are refused before anything is sent.
    let out = c.cli(&["read", "--format", "xml"]);
    assert!(!out.status.success());
    // Every garbage connection to a node's fabric port was refused (and
    // counted: waiting for the count, not for a time).
    let garbage: BTreeMap<u64, u64> = c.nodes.keys().map(|id| (*id, 2)).collect();
    c.wait_counters_above("rejected_handshakes", &garbage, Duration::from_secs(60));
    // A node that does not hold the secret cannot join, nor one with the
    // right secret but another cluster id. Each runs until every node of the
    // cluster refused it once.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("secret"),
        "another cluster's secret, 16+ bytes",
    )
    .unwrap();
    let secret_file = dir.path().join("secret").to_str().unwrap().to_string();
    for (id, extra) in [
        ("9", ["--secret-file", secret_file.as_str()]),
        ("8", ["--cluster-id", "12345"]),
    ] {
        let listen = format!("127.0.0.1:{}", free_port());
        let refused_before: BTreeMap<u64, u64> = c
            .nodes
            .keys()
            .map(|n| (*n, c.nic_counter(*n, "rejected_handshakes").unwrap()))
            .collect();
        let mut outsider = Command::new(BIN)
            .args([
                "serve",
                "--id",
                id,
                "--data-dir",
                dir.path().join(id).to_str().unwrap(),
                "--ring-dir",
                dir.path().join("shm").to_str().unwrap(),
                "--listen",
                &listen,
                "--client",
                &format!("127.0.0.1:{}", free_port()),
                "--peers",
                &format!("{id}={listen},{}", c.peers),
                "--fabric",
                "tcp",
                "--bootstrap",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        c.wait_counters_above(
            "rejected_handshakes",
            &refused_before,
            Duration::from_secs(120),
        );
        let _ = outsider.kill();
        let _ = outsider.wait();
    }
    // Every node still serves, the log is intact, nobody was disturbed.
    assert!(c.cli(&["append", "after"]).status.success());
    let data: Vec<String> = c
        .read_all(&c.endpoints())
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(data, vec!["before", "after"]);
    for n in c.nodes.values() {
        assert!(c.status(n.id).is_some(), "node {} still answers", n.id);
    }
    let members = c.cli(&["members", "list"]);
    assert_eq!(lines(&members).len(), 3, "nobody joined");
}

#[test]
fn a_data_dir_of_another_node_or_cluster_is_refused() {
    let mut c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "x"]).status.success());
    c.stop(2);
    // Node 3's data dir for node 2.
    let dir3 = c.nodes[&3].dir.clone();
    let mut args = c.serve_args(2);
    let k = args.iter().position(|a| a == "--data-dir").unwrap();
    args[k + 1] = dir3.to_str().unwrap().to_string();
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(!out.status.success(), "node 2 started on node 3's data");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("node id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Node 2's own dir under another cluster id.
    let mut args = c.serve_args(2);
    args.extend(["--cluster-id".to_string(), "99".to_string()]);
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cluster id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The right directory still works.
    c.boot(2);
    c.wait_leader(Duration::from_secs(30));
    assert_eq!(c.read_all(&c.nodes[&2].client).len(), 1);
}

#[test]
fn bad_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("n.toml");
    std::fs::write(&conf, "id = 1\nbogus_key = true\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config", conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field"));
    let err = refused_serve(&["--ring-capacity", "1000"]);
    assert!(err.contains("ring-capacity"), "{err}");
    // Retention flags.
    for (flag, value, says) in [
        ("--retain-bytes", "lots", "not a byte count"),
        ("--retain-bytes", "1KiB", "at least"),
        ("--retain-age", "0s", "above zero"),
        ("--retain-age", "soon", "not a duration"),
    ] {
        let err = refused_serve(&[flag, value]);
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}

/// Runs `ringraft serve` with a minimal configuration plus `extra`, which
/// must make it refuse to start; returns what it said.
fn refused_serve(extra: &[&str]) -> String {
    let out = Command::new(BIN)
        .args([
            "serve",
            "--id",
            "1",
            "--data-dir",
            "/nonexistent/x",
            "--listen",
            "a:1",
            "--client",
            "a:2",
            "--peers",
            "1=a:1",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve {extra:?} was accepted");
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Runs `ringraft` with `args` to completion, or kills it after `limit`
/// (SIGTERM first, so that it can stop what it started) and fails the test.
fn run_bounded(args: &[&str], limit: Duration) -> Output {
    run_bounded_with(args, None, limit)
}

/// Like [`run_bounded`], with `input` on its stdin (a client that refuses
/// and exits before it read everything is fine: the broken pipe is
/// ignored).
fn run_bounded_with(args: &[&str], input: Option<Vec<u8>>, limit: Duration) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writer = input.map(|input| {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        })
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(10));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ringraft {args:?} did not finish within {limit:?} (it hangs); its output:\n{}\n{}",
                String::from_utf8_lossy(&out_reader.join().unwrap()),
                String::from_utf8_lossy(&err_reader.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some(writer) = writer {
        writer.join().unwrap();
    }
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

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
    let s: serde_json::Value = serde_json::from_str(&stdout).unwrap();
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
    // Every acknowledged record is in the log, once, and nothing else of
    // this run is.
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
    // The text summary.
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
        "PASS",
        "node3.log",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    for id in 1..=3 {
        assert!(demo_dir.join(format!("node{id}")).is_dir());
        assert!(demo_dir.join(format!("node{id}.log")).is_file());
    }
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
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
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

/// Issue 10, item 3: a client's records keep their order. `seq 1 500 |
/// ringraft append` (two Append requests of 256 and 244 records) printed
/// indexes that went backwards, and `read` returned the records in another
/// order, because the server proposed each record of a request as its own
/// future. Through every endpoint (the leader answers or forwards) and
/// through a follower alone (the forwarded path): the printed indexes
/// strictly increase, and the log holds the lines in the order sent.
#[test]
fn streamed_lines_keep_their_order_in_the_log() {
    let c = Cluster::start(3, &[]);
    let leader = c.wait_leader(Duration::from_secs(30));
    let follower = c.nodes.keys().copied().find(|id| *id != leader).unwrap();
    let routes = [
        ("every endpoint", c.endpoints()),
        ("a follower", c.nodes[&follower].client.clone()),
    ];
    for (round, (route, endpoints)) in routes.iter().enumerate() {
        let sent: Vec<String> = (1..=500).map(|k| format!("r{round}-{k}")).collect();
        let out = cli_with(endpoints, &["append"], Some(&(sent.join("\n") + "\n")));
        assert!(
            out.status.success(),
            "append through {route}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let indexes: Vec<u64> = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
        assert_eq!(indexes.len(), sent.len(), "one index per line ({route})");
        let inversions: Vec<(u64, u64)> = indexes
            .windows(2)
            .filter(|w| w[1] <= w[0])
            .map(|w| (w[0], w[1]))
            .collect();
        assert!(
            inversions.is_empty(),
            "printed indexes go backwards {} times through {route}; first: {:?} then {:?}",
            inversions.len(),
            inversions[0].0,
            inversions[0].1
        );
        let log: Vec<(u64, String)> = c
            .read_all(&c.endpoints())
            .into_iter()
            .filter(|(_, d)| d.starts_with(&format!("r{round}-")))
            .collect();
        let data: Vec<&String> = log.iter().map(|(_, d)| d).collect();
        assert_eq!(
            data,
            sent.iter().collect::<Vec<_>>(),
            "read returns the lines in the order sent through {route}"
        );
        let at: Vec<u64> = log.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, indexes, "each line sits at the index printed for it");
    }
}

/// Runs the client command `args` against `endpoints` on `input`, or kills
/// it after `limit` and fails the test: a client still running then hangs.
fn cli_bounded(endpoints: &str, args: &[&str], input: Vec<u8>, limit: Duration) -> Output {
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--endpoints", endpoints])
        .collect();
    run_bounded_with(&args, Some(input), limit)
}

/// Issue 10, item 4: the CLI must not hang on input no node can accept. A
/// 64 MiB stdin line, and a line one byte above the largest record that
/// fits in one message, fail at once with an error that names the client
/// API's message limit (the old client sent them, tonic refused to encode
/// them, and the failure looked like a transport error that it retried
/// until its deadline); a record above `--max-record` fails at once naming
/// that. Lines that fit one by one but not together are sent in several
/// requests (the old client put up to 256 lines in one request, and hung
/// the same way when they added up to more than the limit).
///
/// The client gets a 10-minute deadline: a client that retries runs into
/// the test's own bound, which is the failure. Nothing here is timed.
#[test]
fn input_no_node_accepts_fails_at_once_naming_the_limit() {
    const MESSAGE_LIMIT: usize = 64 << 20;
    // ringraft_client::client::MAX_RECORD_BYTES: the message limit less the
    // request's other fields (22 bytes) and the record's tag and length
    // (5 bytes).
    const LARGEST_RECORD: usize = MESSAGE_LIMIT - 27;
    const MAX_RECORD: usize = 16 << 20;
    let c = Cluster::start(
        1,
        &[
            "--ring-capacity",
            "134217728",
            "--max-record",
            &MAX_RECORD.to_string(),
        ],
    );
    let endpoints = c.endpoints();
    // A slow machine may take long over one big request: never retry it
    // for want of patience.
    let append = [
        "append",
        "--deadline-ms",
        "600000",
        "--timeout-ms",
        "300000",
    ];
    let bound = Duration::from_secs(300);
    let line = |len: usize, byte: u8| {
        let mut l = vec![byte; len];
        l.push(b'\n');
        l
    };
    for (what, input) in [
        ("a 64 MiB line", line(64 << 20, b'z')),
        (
            "a line one byte above the largest",
            line(LARGEST_RECORD + 1, b'y'),
        ),
        (
            "a short line, then one above the largest",
            [line(10, b'a'), line(LARGEST_RECORD + 1, b'b')].concat(),
        ),
    ] {
        let out = cli_bounded(&endpoints, &append, input, bound);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} was accepted");
        assert!(
            stderr.contains(&MESSAGE_LIMIT.to_string()) && stderr.contains("limit"),
            "{what}: the error names the message limit: {stderr}"
        );
    }
    let out = cli_bounded(&endpoints, &append, line(MAX_RECORD + 1, b'x'), bound);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a record above --max-record");
    assert!(stderr.contains("--max-record"), "{stderr}");
    // Five records of 14 MiB: each fits, together they do not.
    let big: Vec<u8> = (0..5u8).flat_map(|k| line(14 << 20, b'0' + k)).collect();
    let out = cli_bounded(&endpoints, &append, big, bound);
    assert!(
        out.status.success(),
        "records that fit one by one: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let indexes: Vec<u64> = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(indexes.len(), 5, "an index per record");
    // The node still serves, and holds exactly what was acknowledged: the
    // first short line ("aaaaaaaaaa") was appended before the refusal.
    let out = cli_bounded(&endpoints, &append, b"after\n".to_vec(), bound);
    assert!(out.status.success());
    let out = cli_with(
        &endpoints,
        &["read", "--format", "raw", "--deadline-ms", "600000"],
        None,
    );
    assert!(out.status.success());
    let records: Vec<&[u8]> = out.stdout.split(|b| *b == b'\n').collect();
    let mut expected: Vec<Vec<u8>> = vec![vec![b'a'; 10]];
    expected.extend((0..5u8).map(|k| vec![b'0' + k; 14 << 20]));
    expected.push(b"after".to_vec());
    expected.push(Vec::new()); // after the last newline
    assert_eq!(records.len(), expected.len(), "records read back");
    for (k, (got, want)) in records.iter().zip(&expected).enumerate() {
        assert!(*got == want.as_slice(), "record {k} differs");
    }
}

/// Issue 10, item 4, the other commands: requests no node will ever accept
/// fail at once instead of being retried until the deadline (old code:
/// `members promote` of a non-member and `members remove` of every voter
/// came back as internal errors, which the client retries; `read --follow`
/// of an empty range waited forever). Nothing here is timed: the commands
/// get a 10-minute deadline, and the test's bound is the failure.
#[test]
fn other_commands_with_input_no_node_accepts_fail_at_once() {
    let c = Cluster::start(1, &[]);
    let endpoints = c.endpoints();
    let bound = Duration::from_secs(300);
    for (args, expected) in [
        (
            &["read", "--follow", "--from", "5", "--to", "2"][..],
            "empty",
        ),
        (&["members", "promote", "7"][..], "not a member"),
        (&["members", "remove", "1"][..], "without a voter"),
    ] {
        let args: Vec<&str> = args
            .iter()
            .copied()
            .chain(["--deadline-ms", "600000"])
            .collect();
        let out = cli_bounded(&endpoints, &args, Vec::new(), bound);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // The node is still whole.
    let members = c.cli(&["members", "list"]);
    assert_eq!(
        lines(&members),
        vec![format!("1 {} voter", c.nodes[&1].listen)]
    );
}

/// The ring files in `dir`, by name.
fn rings_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ring"))
        .collect();
    names.sort();
    names
}

/// Issue 11, item 1: the daemon's rings live in its ring dir (`--ring-dir`),
/// not in the data directory; `ringraft wal check` finds a node's ring from
/// its data directory; `ringraft wal remove` deletes a data directory with
/// its ring, and a data directory removed with `rm -r` loses its ring at the
/// next start of a node on the same ring dir, while a live one keeps its.
#[test]
fn rings_live_in_the_ring_dir_and_go_with_their_data_dir() {
    let mut c = Cluster::start(3, &[]);
    assert!(c.cli(&["append", "x"]).status.success());
    for id in 1..=3 {
        c.stop(id);
    }
    let ring_dir = c.ring_dir();
    assert_eq!(rings_in(&ring_dir).len(), 3, "one ring per node");
    for n in c.nodes.values() {
        assert!(rings_in(&n.dir).is_empty() && !n.dir.join("ring").exists());
        let out = Command::new(BIN)
            .args(["wal", "check", "--data-dir", n.dir.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "wal check on node {}: {stdout}", n.id);
        assert!(
            stdout.contains(&format!("ring file     {}", ring_dir.display())),
            "{stdout}"
        );
    }
    let ring_of = |id: u64| ringraft_wal::ring_path(&c.nodes[&id].dir).unwrap();
    let (ring1, ring2, ring3) = (ring_of(1), ring_of(2), ring_of(3));

    let out = Command::new(BIN)
        .args([
            "wal",
            "remove",
            "--data-dir",
            c.nodes[&1].dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!c.nodes[&1].dir.exists() && !ring1.exists());

    std::fs::remove_dir_all(&c.nodes[&2].dir).unwrap();
    assert!(ring2.exists(), "nothing swept yet");
    c.boot(3);
    // The node answers once its data directory is open (and the sweep ran).
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.status(3).is_none() {
        assert!(
            Instant::now() < deadline,
            "node 3 does not answer: {}",
            std::fs::read_to_string(c.base.path().join("n3.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!ring2.exists(), "the ring of a removed data dir is swept");
    assert!(ring3.exists());
    assert_eq!(
        rings_in(&ring_dir),
        [ring3.file_name().unwrap().to_string_lossy()]
    );
}

/// Fails the test with the command's stderr unless it succeeded.
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Appends `records` (one per stdin line) through `endpoints`; the command's
/// output and the indexes it printed.
fn append_lines(endpoints: &str, records: &[String]) -> (Output, Vec<u64>) {
    let out = cli_with(endpoints, &["append"], Some(&(records.join("\n") + "\n")));
    let indexes = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
    (out, indexes)
}

/// Issue 11, items 4 and 5: the daemon serves reads from the log and trims
/// it on request (`ringraft trim`) or by retention (`--retain-bytes`); a
/// read below the first index kept fails at once naming it, on every node
/// and after a restart. Bad retention flags: see
/// `bad_configuration_is_refused_at_start`.
#[test]
fn trim_and_retention_from_the_command_line() {
    let mut c = Cluster::start(3, &[]);
    let expected: Vec<String> = (0..30).map(|k| format!("r{k}")).collect();
    let (out, indexes) = append_lines(&c.endpoints(), &expected);
    assert_ok(&out);
    let keep = indexes[10];
    let out = c.cli(&["trim", "--before", &keep.to_string()]);
    assert_ok(&out);
    assert_eq!(lines(&out), vec![format!("first index {keep}")]);
    for id in 1..=3 {
        assert_eq!(
            c.wait_status(id, "first_index", keep, Duration::from_secs(120)),
            keep
        );
        let client = c.nodes[&id].client.clone();
        let out = run_bounded(
            &["read", "--from", "1", "--endpoints", &client],
            Duration::from_secs(120),
        );
        assert!(
            !out.status.success(),
            "node {id}: a read below the trim succeeded"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("first index this node holds ({keep})")),
            "node {id}: {err}"
        );
        let out = cli_with(
            &client,
            &["read", "--from", &keep.to_string(), "--format", "raw"],
            None,
        );
        assert_ok(&out);
        assert_eq!(lines(&out), expected[10..].to_vec(), "node {id}");
    }
    // A restarted node keeps the trim.
    c.stop(2);
    c.boot(2);
    c.wait_leader(Duration::from_secs(60));
    assert_eq!(
        c.wait_status(2, "first_index", keep, Duration::from_secs(120)),
        keep
    );
    drop(c);

    // Retention by size: 2 MB of records through a 1 MiB retention.
    let c = Cluster::start(3, &["--retain-bytes", "1MiB"]);
    let record = "x".repeat(50_000);
    let big: Vec<String> = (0..40).map(|k| format!("{k:02}{record}")).collect();
    let (out, indexes) = append_lines(&c.endpoints(), &big);
    assert_ok(&out);
    let leader = c.wait_leader(Duration::from_secs(60));
    let first = c.wait_status(leader, "first_index", indexes[1], Duration::from_secs(120));
    let out = cli_with(
        &c.nodes[&leader].client,
        &["read", "--from", &first.to_string(), "--format", "raw"],
        None,
    );
    let kept = lines(&out);
    assert!(
        kept.len() <= 20 && kept.len() >= 10,
        "1 MiB keeps 10..=20 records of 50 kB, kept {}",
        kept.len()
    );
    assert_eq!(
        kept.last().unwrap()[..2].to_string(),
        "39",
        "the newest stay"
    );
    drop(c);
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs of {size}");
        Tmpfs(dir)
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.0.path())
            .status()
            .unwrap();
        assert!(status.success(), "resize the tmpfs to {size}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Issue 11, item 5, on a real file system: the leader's data directory is
/// on a small tmpfs that its first segment (64 MiB, allocated up front)
/// nearly fills. Once the log needs a second segment, appends through the
/// leader fail at once naming the full disk (not retried, not "busy"),
/// reads go on, and once the file system grows, appends are taken again
/// and every acknowledged record is in the log once, in order. Needs root
/// (mount); CI runs as root.
#[test]
fn a_full_disk_refuses_appends_reads_go_on_and_appends_resume_once_space_is_freed() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs this test as root)");
        return;
    }
    let disk = Tmpfs::mount("66m");
    let mut c = Cluster::new(3, &[]);
    c.nodes.get_mut(&1).unwrap().dir = disk.0.path().join("n1");
    for id in 1..=3 {
        c.boot(id);
    }
    c.wait_leader(Duration::from_secs(60));
    let out = c.cli(&["transfer", "1"]);
    assert_ok(&out);
    let leader = c.nodes[&1].client.clone();
    // 60 kB records, 100 per append, until the leader refuses (about 64 MiB
    // of records), bounded by count.
    let record = "d".repeat(60_000);
    let mut acked: Vec<String> = Vec::new();
    let mut refusal = None;
    for batch in 0..30 {
        let batch_lines: Vec<String> = (0..100)
            .map(|k| format!("{batch:02}-{k:03}-{record}"))
            .collect();
        let (out, indexes) = append_lines(&leader, &batch_lines);
        acked.extend(batch_lines.into_iter().take(indexes.len()));
        if !out.status.success() {
            refusal = Some(String::from_utf8_lossy(&out.stderr).to_string());
            break;
        }
    }
    let refusal = refusal.expect("the leader refused appends once its disk was full");
    assert!(
        refusal.contains("disk full") && refusal.contains("space is freed"),
        "{refusal}"
    );
    assert!(
        acked.len() >= 1000,
        "{} records acknowledged first",
        acked.len()
    );
    // Reads go on.
    let out = cli_with(&leader, &["read", "--from", "1", "--to", "5"], None);
    assert_ok(&out);
    // Space freed: appends are taken again (the leader retries its log
    // every second; wait for that state, bounded by count).
    disk.resize("300m");
    let mut resumed = false;
    for k in 0..600 {
        let line = format!("after-{k}");
        let out = cli_with(&leader, &["append", &line], None);
        if out.status.success() {
            acked.push(line);
            resumed = true;
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("disk full"), "{err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(resumed, "appends resumed once space was freed");
    for id in [1, 2] {
        let log = c.read_all(&c.nodes[&id].client);
        assert_exactly_once(&log, &acked);
        assert_eq!(log.len(), acked.len(), "node {id}");
    }
    drop(c);
}
