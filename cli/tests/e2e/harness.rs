//! The harness of the end-to-end tests: a cluster of `ringraft serve`
//! processes on loopback (the test kit's `ProcessCluster`, with its own data
//! and ring directories, killed and cleaned up when dropped), the
//! `ringraft` client run bounded in time, and the history a test records of
//! what the client was told ([`History`]), judged by the Jepsen checker
//! against the nodes' final logs. Owns the temporary directories and the
//! processes it starts; never leaves one running after its test, and never
//! judges a history itself (the checker does).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use ringraft_checker::history::{Consistency, FinalRecord, ReadRecord};
use ringraft_checker::{FinalLogs, OpHandle, Recorder, Verdict};
use ringraft_testkit::leader::{NodeView, Observe, Wanted, wait_for_leader};
use ringraft_testkit::process::{
    NodePlace, ProcessCluster, ProcessOptions, Stopped, ringraft_binary,
};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ringraft");

/// How long a node gets to exit on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(20);

pub(crate) fn free_port() -> u16 {
    ringraft_testkit::ports::free_port().unwrap()
}

/// The test's cluster: `ringraft serve` processes (node 1 bootstraps) with
/// their files in a temporary directory.
pub(crate) struct Cluster {
    /// Declared first: dropped (every node killed) before `base` is removed.
    procs: ProcessCluster,
    pub(crate) base: tempfile::TempDir,
}

impl Cluster {
    /// The nodes' ring dir: in the test's temporary directory.
    pub(crate) fn ring_dir(&self) -> PathBuf {
        self.base.path().join("shm")
    }

    /// `n` nodes with `extra` serve flags, all started, a leader agreed.
    pub(crate) fn start(n: u64, extra: &[&str]) -> Cluster {
        let c = Cluster::new(n, extra);
        for id in 1..=n {
            c.boot(id);
        }
        c.wait_leader(Duration::from_secs(30));
        c
    }

    /// The cluster's nodes, none started yet.
    pub(crate) fn new(n: u64, extra: &[&str]) -> Cluster {
        Cluster::new_placed(n, extra, |_, _| {})
    }

    /// Like [`Cluster::new`], with each node's place changed by `adjust`
    /// (e.g. a data directory on another file system).
    pub(crate) fn new_placed(
        n: u64,
        extra: &[&str],
        adjust: impl Fn(u64, &mut NodePlace),
    ) -> Cluster {
        let base = tempfile::tempdir().unwrap();
        let addr = || format!("127.0.0.1:{}", free_port());
        let places = (1..=n)
            .map(|id| {
                let mut place = NodePlace {
                    listen: addr(),
                    client: addr(),
                    metrics: Some(addr()),
                    data_dir: base.path().join(format!("n{id}")),
                    // Rings in the test's own directory, not in /dev/shm.
                    ring_dir: base.path().join("shm"),
                    log: base.path().join(format!("n{id}.log")),
                    netns: None,
                };
                adjust(id, &mut place);
                (id, place)
            })
            .collect();
        let mut options = ProcessOptions::new(ringraft_binary(Some(BIN.into())).unwrap(), "tcp", 1);
        options.extra_serve_args = extra.iter().map(|s| s.to_string()).collect();
        // A test binary killed half-way leaves no node behind.
        options.die_with_parent = true;
        Cluster {
            procs: ProcessCluster::new(options, places),
            base,
        }
    }

    fn place(&self, id: u64) -> &NodePlace {
        self.procs.place(id).unwrap()
    }

    /// The node ids.
    pub(crate) fn ids(&self) -> Vec<u64> {
        self.procs.nodes()
    }

    /// Node `id`'s client API address.
    pub(crate) fn client(&self, id: u64) -> String {
        self.place(id).client.clone()
    }

    /// Node `id`'s raft (control plane) address.
    pub(crate) fn listen(&self, id: u64) -> String {
        self.place(id).listen.clone()
    }

    /// Node `id`'s metrics address.
    pub(crate) fn metrics(&self, id: u64) -> String {
        self.place(id).metrics.clone().unwrap_or_default()
    }

    /// Node `id`'s data directory.
    pub(crate) fn dir(&self, id: u64) -> PathBuf {
        self.place(id).data_dir.clone()
    }

    /// Node `id`'s log (its stderr, across restarts).
    pub(crate) fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.place(id).log).unwrap_or_default()
    }

    /// `--peers` of the cluster.
    pub(crate) fn peers(&self) -> String {
        let listens: Vec<(u64, String)> = self
            .ids()
            .iter()
            .map(|id| (*id, self.listen(*id)))
            .collect();
        ringraft_testkit::serve::peers_arg(listens.iter().map(|(id, l)| (*id, l.as_str())))
    }

    /// Node `id`'s `ringraft serve` arguments.
    pub(crate) fn serve_args(&self, id: u64) -> Vec<String> {
        self.procs.serve_args(id).unwrap()
    }

    /// Starts node `id`.
    pub(crate) fn boot(&self, id: u64) {
        self.procs.start(id).unwrap();
    }

    /// SIGKILL node `id` (which must run).
    pub(crate) fn kill9(&self, id: u64) {
        assert!(self.procs.is_running(id), "node {id} is not running");
        self.procs.kill(id).unwrap();
    }

    /// SIGSTOP node `id`.
    pub(crate) fn pause(&self, id: u64) {
        self.procs.pause(id).unwrap();
    }

    /// SIGCONT node `id`.
    pub(crate) fn resume(&self, id: u64) {
        self.procs.resume(id).unwrap();
    }

    /// SIGTERM node `id`; it must exit 0 within the grace.
    pub(crate) fn stop(&self, id: u64) {
        match self.procs.stop(id, STOP_GRACE).unwrap() {
            Stopped::Exited(status) => assert!(
                status.success(),
                "node {id} exited with {status} on SIGTERM"
            ),
            other => panic!("node {id} did not stop on SIGTERM: {other:?}"),
        }
    }

    pub(crate) fn endpoints(&self) -> String {
        self.ids()
            .iter()
            .map(|id| self.client(*id))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        cli_with(&self.endpoints(), args, None)
    }

    pub(crate) fn status(&self, id: u64) -> Option<serde_json::Value> {
        self.try_status(id).ok()
    }

    /// Node `id`'s status, or why `ringraft status` gave none.
    fn try_status(&self, id: u64) -> Result<serde_json::Value, String> {
        let out = cli_with(
            &self.client(id),
            &["status", "--json", "--timeout-ms", "1000"],
            None,
        );
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// The leader agreed by every running node (the test kit's rule: each
    /// names it, and it is in the Leader state); a node that exited fails
    /// the wait at once.
    pub(crate) fn wait_leader(&self, timeout: Duration) -> u64 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wanted = Wanted::any(Duration::from_millis(100));
        match runtime.block_on(wait_for_leader(self, &wanted, timeout)) {
            Ok(leader) => leader.id,
            Err(e) => panic!("no agreed leader: {e}"),
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
            let status = self.try_status(id);
            let now = status
                .as_ref()
                .ok()
                .and_then(|s| s[key].as_u64())
                .unwrap_or(0);
            if now >= value {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "node {id}: {key} {now}, waiting for {value}; its last status: {status:?}; \
                 the end of its log:\n{}",
                log_tail(&self.log(id), 60)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A counter of node `id`'s fabric device, from its metrics endpoint.
    pub(crate) fn nic_counter(&self, id: u64, counter: &str) -> Option<u64> {
        let mut s = std::net::TcpStream::connect(self.metrics(id)).ok()?;
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

    /// The whole log through `endpoints` (a linearizable read), as
    /// (index, data).
    pub(crate) fn read_all(&self, endpoints: &str) -> Vec<(u64, String)> {
        self.read_final(endpoints)
            .into_iter()
            .map(|r| (r.index, r.data))
            .collect()
    }

    /// The whole log through `endpoints` (a linearizable read), as the
    /// checker's final log.
    pub(crate) fn read_final(&self, endpoints: &str) -> Vec<FinalRecord> {
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
                FinalRecord::new(
                    v["index"].as_u64().unwrap(),
                    v["term"].as_u64().unwrap(),
                    v["data"].as_str().unwrap(),
                )
            })
            .collect()
    }

    /// Each of `ids`' whole log, read from that node alone.
    pub(crate) fn final_logs(&self, ids: &[u64]) -> FinalLogs {
        ids.iter()
            .map(|id| (*id, self.read_final(&self.client(*id))))
            .collect()
    }
}

impl Observe for Cluster {
    fn running(&self) -> Vec<u64> {
        self.procs.running()
    }

    async fn view(&self, id: u64) -> Option<NodeView> {
        let s = self.status(id)?;
        Some(NodeView {
            id,
            term: s["term"].as_u64()?,
            leader: s["leader_id"].as_u64(),
            is_leader: s["state"].as_str() == Some("Leader"),
        })
    }

    fn failed(&self) -> Option<String> {
        self.ids().into_iter().find_map(|id| {
            let status = self.procs.exited(id)?;
            Some(format!("node {id} exited ({status}): {}", self.log(id)))
        })
    }
}

/// What a test's clients were told, recorded for the Jepsen checker: each
/// record appended through the CLI is an operation, acknowledged at the
/// index the CLI printed for it, or of unknown outcome (`info`) when the
/// call failed before printing it; faults are nemesis events.
#[derive(Clone, Default)]
pub(crate) struct History(pub(crate) Recorder);

impl History {
    /// Invokes an append of each of `records` (through `via`, when the test
    /// knows the node that takes them).
    pub(crate) fn invoke(&self, records: &[String], via: Option<u64>) -> Vec<OpHandle> {
        records
            .iter()
            .map(|data| {
                let process = self.0.fresh_process();
                match via {
                    Some(node) => self.0.invoke_append_via(process, node, data.as_str()),
                    None => self.0.invoke_append(process, data.as_str()),
                }
            })
            .collect()
    }

    /// Completes `ops` with the printed `indexes`, in order; the rest are
    /// unknown (`why`).
    pub(crate) fn complete(&self, ops: Vec<OpHandle>, indexes: &[u64], why: &str) {
        for (k, op) in ops.into_iter().enumerate() {
            match indexes.get(k) {
                Some(index) => self.0.ok(op, *index),
                None => self.0.info(op, why),
            }
        }
    }

    /// `ringraft append` of `records` (one per stdin line) through
    /// `endpoints`, recorded; the command's output and the indexes it
    /// printed.
    pub(crate) fn append_lines(&self, endpoints: &str, records: &[String]) -> (Output, Vec<u64>) {
        let ops = self.invoke(records, None);
        let (out, indexes) = append_lines(endpoints, records);
        let why = String::from_utf8_lossy(&out.stderr).into_owned();
        self.complete(ops, &indexes, &why);
        (out, indexes)
    }

    /// A linearizable read of everything through `endpoints`, recorded.
    pub(crate) fn read_all(&self, c: &Cluster, endpoints: &str) -> Vec<(u64, String)> {
        let process = self.0.fresh_process();
        let op = self
            .0
            .invoke_read(process, 1, None, Consistency::Linearizable);
        let log = c.read_all(endpoints);
        let seen = log
            .iter()
            .map(|(index, data)| ReadRecord {
                index: *index,
                data: data.clone(),
            })
            .collect();
        self.0.read_ok(op, seen);
        log
    }

    /// A fault on node `node` begins (`fault`: kill, pause, ...).
    pub(crate) fn fault_start(&self, fault: &str, node: u64) {
        self.0
            .nemesis_start(fault, serde_json::json!({"node": node}));
    }

    /// The fault on node `node` ends.
    pub(crate) fn fault_stop(&self, fault: &str, node: u64) {
        self.0
            .nemesis_stop(fault, serde_json::json!({"node": node}));
    }

    /// The checker's verdict on the history against `finals`; fails the
    /// test with the verdict's report unless it is valid.
    pub(crate) fn assert_valid(&self, finals: &FinalLogs) -> Verdict {
        let verdict = self.0.check(finals);
        assert!(verdict.valid, "the checker rejects the history: {verdict}");
        verdict
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

/// The lines a child prints on `stdout`, sent on as they arrive (by a
/// thread that ends with the stream or when the receiver is dropped).
pub(crate) fn printed_lines(stdout: ChildStdout) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Runs `ringraft wal <command> --data-dir <data_dir>` to completion.
pub(crate) fn wal(command: &str, data_dir: &Path) -> Output {
    Command::new(BIN)
        .args(["wal", command, "--data-dir", data_dir.to_str().unwrap()])
        .output()
        .unwrap()
}

/// The last `lines` lines of `log`.
fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
