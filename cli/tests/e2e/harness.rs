//! The harness of the end-to-end tests: a cluster of `ringraft serve`
//! processes on loopback (its own data and ring directories, killed and
//! cleaned up when dropped), the `ringraft` client run bounded in time, and
//! the checks the tests share (exactly once, in order). Owns the processes
//! it starts; never leaves one running after its test.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ringraft");

pub(crate) fn free_port() -> u16 {
    ringraft_testkit::ports::free_port().unwrap()
}

pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) listen: String,
    pub(crate) client: String,
    pub(crate) metrics: String,
    pub(crate) dir: PathBuf,
    pub(crate) child: Option<Child>,
}

pub(crate) struct Cluster {
    pub(crate) nodes: BTreeMap<u64, Node>,
    pub(crate) peers: String,
    pub(crate) base: tempfile::TempDir,
    pub(crate) extra: Vec<String>,
}

impl Cluster {
    /// The nodes' ring dir: in the test's temporary directory.
    pub(crate) fn ring_dir(&self) -> PathBuf {
        self.base.path().join("shm")
    }

    pub(crate) fn start(n: u64, extra: &[&str]) -> Cluster {
        let mut c = Cluster::new(n, extra);
        for id in 1..=n {
            c.boot(id);
        }
        c.wait_leader(Duration::from_secs(30));
        c
    }

    /// The cluster's nodes, none started yet.
    pub(crate) fn new(n: u64, extra: &[&str]) -> Cluster {
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

    pub(crate) fn serve_args(&self, id: u64) -> Vec<String> {
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

    pub(crate) fn boot(&mut self, id: u64) {
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

    pub(crate) fn kill9(&mut self, id: u64) {
        let mut child = self.nodes.get_mut(&id).unwrap().child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub(crate) fn signal(&self, id: u64, sig: &str) {
        let pid = self.nodes[&id].child.as_ref().unwrap().id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    pub(crate) fn stop(&mut self, id: u64) {
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

    pub(crate) fn endpoints(&self) -> String {
        self.nodes
            .values()
            .map(|n| n.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        cli_with(&self.endpoints(), args, None)
    }

    pub(crate) fn status(&self, id: u64) -> Option<serde_json::Value> {
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
    pub(crate) fn wait_leader(&self, timeout: Duration) -> u64 {
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
    pub(crate) fn wait_applied(&self, id: u64, index: u64, timeout: Duration) {
        self.wait_status(id, "applied_index", index, timeout);
    }

    /// Waits until node `id`'s status reports `key` at least `value`;
    /// returns what it reports.
    pub(crate) fn wait_status(&self, id: u64, key: &str, value: u64, timeout: Duration) -> u64 {
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
    pub(crate) fn nic_counter(&self, id: u64, counter: &str) -> Option<u64> {
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
    pub(crate) fn wait_counters_above(
        &self,
        counter: &str,
        above: &BTreeMap<u64, u64>,
        timeout: Duration,
    ) {
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

    pub(crate) fn read_all(&self, endpoints: &str) -> Vec<(u64, String)> {
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

pub(crate) fn cli_with(endpoints: &str, args: &[&str], stdin: Option<&str>) -> Output {
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

pub(crate) fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

pub(crate) fn assert_exactly_once(log: &[(u64, String)], expected: &[String]) {
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

pub(crate) fn raw_garbage(addr: &str, bytes: &[u8]) {
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = s.write_all(bytes);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
}

/// Runs `ringraft serve` with a minimal configuration plus `extra`, which
/// must make it refuse to start; returns what it said.
pub(crate) fn refused_serve(extra: &[&str]) -> String {
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
pub(crate) fn run_bounded(args: &[&str], limit: Duration) -> Output {
    run_bounded_with(args, None, limit)
}

/// Like [`run_bounded`], with `input` on its stdin (a client that refuses
/// and exits before it read everything is fine: the broken pipe is
/// ignored).
pub(crate) fn run_bounded_with(args: &[&str], input: Option<Vec<u8>>, limit: Duration) -> Output {
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
pub(crate) fn processes_mentioning(needle: &str) -> Vec<String> {
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

/// Runs the client command `args` against `endpoints` on `input`, or kills
/// it after `limit` and fails the test: a client still running then hangs.
pub(crate) fn cli_bounded(
    endpoints: &str,
    args: &[&str],
    input: Vec<u8>,
    limit: Duration,
) -> Output {
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--endpoints", endpoints])
        .collect();
    run_bounded_with(&args, Some(input), limit)
}

/// The ring files in `dir`, by name.
pub(crate) fn rings_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ring"))
        .collect();
    names.sort();
    names
}

/// Fails the test with the command's stderr unless it succeeded.
pub(crate) fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Appends `records` (one per stdin line) through `endpoints`; the command's
/// output and the indexes it printed.
pub(crate) fn append_lines(endpoints: &str, records: &[String]) -> (Output, Vec<u64>) {
    let out = cli_with(endpoints, &["append"], Some(&(records.join("\n") + "\n")));
    let indexes = lines(&out).iter().map(|l| l.parse().unwrap()).collect();
    (out, indexes)
}

/// A tmpfs mounted for a test, unmounted when dropped.
pub(crate) struct Tmpfs(pub(crate) tempfile::TempDir);

impl Tmpfs {
    pub(crate) fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs of {size}");
        Tmpfs(dir)
    }

    pub(crate) fn resize(&self, size: &str) {
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
