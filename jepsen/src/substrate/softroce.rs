//! `softroce`: one QEMU guest per node in the Soft-RoCE lab
//! (`deploy/softroce-vm/lab.sh start multi <n> lab_idle ...`), the `rdma`
//! fabric on each guest's `rxe0`, links cut from the host (`lab.sh cut`,
//! `heal`). Commands reach a guest through the lab's agent (`lab.sh exec`),
//! which keeps working while a guest is cut off. The host's root is shared
//! read-only into the guests, so the binaries run there at their host paths;
//! a node's data directory lives on the guest's tmpfs. One-way drops are not
//! available (`lab.sh cut` is symmetric). [`Substrate::teardown`] (also run
//! on drop) kills the lab (`lab.sh kill`), which removes the guests, taps,
//! bridge and filter rules.
//!
//! A freeze (the `freeze` nemesis) is armed as a watcher script in the
//! guest ([`freeze_watch_script`]), next to the daemon, which serves
//! `--metrics` on [`METRICS_PORT`] for it.
//!
//! For the lab's stale-leader scenario (`deploy/softroce-vm/run-tests.sh
//! multi3_stale_leader`): [`Substrate::nic_refusals`] counts, in a node's
//! log, the queue pairs its device put in the error state ([`REFUSAL_LOG_LINE`],
//! with the `ringraft_transport::rdma::conn=debug` log of `--node-log`), and
//! `--lab-data-fs ext4` puts the data directories on an ext4 loop mount
//! (the guest kernel is the lab's `LAB_GUEST_KERNEL`, taken from the
//! environment).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use ringraft_testkit::serve::ServeArgs;

use super::{ClusterSpec, DataFs, Result, Substrate, SubstrateError, TailDamage, WalCheck};

/// Control-plane port in every guest.
pub const LISTEN_PORT: u16 = 7000;
/// Client API port in every guest.
pub const CLIENT_PORT: u16 = 8000;
/// Metrics port in every guest (`/metrics`, read by the freeze watcher).
pub const METRICS_PORT: u16 = 9000;
/// Time allowed for one agent command, seconds (TCG guests are slow).
pub const EXEC_TIMEOUT_S: u64 = 60;

/// See the module docs.
pub struct SoftRoce {
    spec: ClusterSpec,
    lab_sh: PathBuf,
    lab_run: String,
    peers: String,
    running: Mutex<BTreeMap<u64, bool>>,
    cuts: Mutex<BTreeSet<(u64, u64)>>,
    torn_down: Mutex<bool>,
}

fn guest_ip(id: u64) -> String {
    format!("10.77.0.{}", 10 + id)
}

fn guest_dir(id: u64) -> String {
    format!("/var/tmp/ringraft-jepsen/n{id}")
}

/// The freeze watcher (see [`Substrate::arm_freeze`]), a bash script: polls
/// `ringraft_proposals_in_flight` at `metrics` (`host:port`, plain HTTP over
/// bash's `/dev/tcp`: no client tool needed in the guest) until it reaches
/// `in_flight`, then sleeps `delay` and SIGSTOPs the process whose id is in
/// `pid_file`; prints `stopped ...` and exits 0, or `gave up ...` and exits
/// 1 after `bound`. It polls at least once, however late it starts (a
/// loaded guest may start it after `bound`).
pub fn freeze_watch_script(
    pid_file: &str,
    metrics: &str,
    in_flight: u64,
    delay: Duration,
    bound: Duration,
) -> String {
    let (host, port) = metrics.rsplit_once(':').unwrap_or((metrics, "80"));
    format!(
        r#"p=$(cat {pid}) || exit 2
m() {{ exec 3<>/dev/tcp/{host}/{port} || return 0
  printf 'GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n' >&3
  awk '$1 == "ringraft_proposals_in_flight" {{ printf "%d", $2 }}' <&3; exec 3<&-; }}
end=$(( $(date +%s%N) / 1000000 + {bound_ms} ))
while :; do
  n=$(m 2>/dev/null)
  if [ "${{n:-0}}" -ge {in_flight} ]; then
    sleep {delay_s}; kill -STOP "$p" || exit 2
    echo "stopped pid $p, $n proposals in flight"; exit 0
  fi
  [ $(( $(date +%s%N) / 1000000 )) -lt $end ] || break
  sleep 0.02
done
echo "gave up after {bound_ms} ms: ${{n:-no}} proposals in flight"; exit 1
"#,
        pid = sh_quote(pid_file),
        bound_ms = bound.as_millis(),
        delay_s = format_args!("{:.3}", delay.as_secs_f64()),
    )
}

/// The heartbeat and election timeout the daemons run with on TCG guests,
/// unless the run's serve arguments name their own: under TCG an rdma
/// connection takes longer to set up than the daemon's default heartbeat
/// (openraft's per-RPC timeout) allows, and every attempt would be
/// cancelled half-way.
fn tcg_timing(extra: &[String]) -> Vec<String> {
    let named = |flag: &str| {
        extra
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let mut args = Vec::new();
    if !named("--heartbeat-ms") {
        args.extend(["--heartbeat-ms", "1000"].map(String::from));
    }
    if !named("--election-timeout-ms") {
        args.extend(["--election-timeout-ms", "3000,6000"].map(String::from));
    }
    args
}

/// The line the rdma backend logs (at debug) when the device has put a
/// queue pair in the error state and flushed its receives: what a responder
/// does after refusing a peer's request.
pub const REFUSAL_LOG_LINE: &str = "the device put the queue pair in the error state";

/// A shell script that prints how many lines of `dir/serve.log` say that
/// the device put a queue pair from `peer_ip` in the error state
/// ([`REFUSAL_LOG_LINE`]; the log names the peer as `peer=<ip>:<port>`).
pub fn refusal_count_script(dir: &str, peer_ip: &str) -> String {
    format!(
        "grep -F {} {dir}/serve.log 2>/dev/null | grep -cF {} || true",
        sh_quote(&format!("peer={peer_ip}:")),
        sh_quote(REFUSAL_LOG_LINE)
    )
}

/// Quotes `s` for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl SoftRoce {
    /// Boots one guest per node (`lab.sh start multi`), bounded by
    /// `lab_timeout_s` (the lab's own `LAB_TIMEOUT`).
    pub fn new(spec: ClusterSpec, lab_sh: PathBuf, lab_timeout_s: u64) -> Result<SoftRoce> {
        let n = spec.nodes.len().to_string();
        let mut cmd = Command::new(&lab_sh);
        cmd.args(["start", "multi", &n])
            .args(spec.nodes.iter().map(|_| "lab_idle"))
            .env("LAB_TIMEOUT", lab_timeout_s.to_string());
        let out = super::run_cmd("lab.sh start multi", &mut cmd)?;
        let lab_run = out
            .lines()
            .find_map(|l| l.strip_prefix("LAB_RUN="))
            .ok_or_else(|| {
                SubstrateError::command(
                    "lab.sh start multi",
                    format!("no LAB_RUN= line in its output: {out}"),
                )
            })?
            .trim()
            .to_string();
        let peers = spec
            .nodes
            .iter()
            .map(|id| format!("{id}={}:{LISTEN_PORT}", guest_ip(*id)))
            .collect::<Vec<_>>()
            .join(",");
        Ok(SoftRoce {
            spec,
            lab_sh,
            lab_run,
            peers,
            running: Mutex::new(BTreeMap::new()),
            cuts: Mutex::new(BTreeSet::new()),
            torn_down: Mutex::new(false),
        })
    }

    fn lab(&self, what: &str, args: &[&str]) -> Result<String> {
        super::run_cmd(
            what,
            Command::new(&self.lab_sh)
                .args(args)
                .env("LAB_RUN", &self.lab_run),
        )
    }

    fn exec(&self, id: u64, script: &str) -> Result<String> {
        self.lab(
            &format!("in guest {id}: {script}"),
            &[
                "exec",
                "-t",
                &EXEC_TIMEOUT_S.to_string(),
                &id.to_string(),
                script,
            ],
        )
    }

    fn metrics_addr(&self, id: u64) -> String {
        format!("{}:{METRICS_PORT}", guest_ip(id))
    }

    fn set_running(&self, id: u64, running: bool) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, running);
    }

    /// Ends node `id`'s daemon: `signals` (a shell command on its pid,
    /// `$p`), then waits until it is gone and forgets its pid. Nothing to
    /// do when it has no pid file.
    fn end_daemon(&self, id: u64, signals: &str) -> Result<()> {
        let dir = guest_dir(id);
        self.exec(
            id,
            &format!(
                "p=$(cat {dir}/pid 2>/dev/null) || exit 0; {signals}; \
                 while kill -0 $p 2>/dev/null; do sleep 0.1; done; rm -f {dir}/pid"
            ),
        )?;
        self.set_running(id, false);
        Ok(())
    }
}

impl Substrate for SoftRoce {
    fn name(&self) -> &'static str {
        "softroce"
    }
    fn nodes(&self) -> Vec<u64> {
        self.spec.nodes.clone()
    }
    fn client_endpoint(&self, id: u64) -> String {
        format!("{}:{CLIENT_PORT}", guest_ip(id))
    }
    fn listen_addr(&self, id: u64) -> String {
        format!("{}:{LISTEN_PORT}", guest_ip(id))
    }
    fn start(&self, id: u64) -> Result<()> {
        let dir = guest_dir(id);
        let mut serve = ServeArgs::new(
            id,
            PathBuf::from(format!("{dir}/data")),
            &self.listen_addr(id),
            &self.client_endpoint(id),
            &self.peers,
            "rdma",
        );
        // No ring dir: the guest's /dev/shm (a tmpfs, which the rdma device
        // can register on every kernel).
        serve.bootstrap = id == self.spec.nodes[0];
        serve.extra = self.spec.extra_serve_args.clone();
        let mut args = serve.to_args();
        args.extend(["--rdma-device".to_string(), "rxe0".to_string()]);
        // For the freeze watcher, in the guest.
        args.extend(["--metrics".to_string(), self.metrics_addr(id)]);
        args.extend(tcg_timing(&self.spec.extra_serve_args));
        let cmdline = std::iter::once(self.spec.ringraft_bin.display().to_string())
            .chain(args)
            .map(|a| sh_quote(&a))
            .collect::<Vec<_>>()
            .join(" ");
        let mut env = String::new();
        if let Some(bug) = &self.spec.planted_bug {
            env += &format!("RINGRAFT_PLANTED_BUG={} ", sh_quote(bug));
        }
        if let Some(filter) = &self.spec.node_log {
            env += &format!("RUST_LOG={} ", sh_quote(filter));
        }
        // An ext4 data directory is mounted once, at the first start; a
        // restart finds it (and what the node wrote there) mounted.
        let mount = match self.spec.data_fs {
            DataFs::Tmpfs => String::new(),
            DataFs::Ext4 => format!(
                "mountpoint -q {dir}/data || lab_ext4_loop {dir}/data >/dev/null || exit 3; "
            ),
        };
        let script = format!(
            "mkdir -p {dir}/data; {mount}\
             if [ -f {dir}/pid ] && kill -0 $(cat {dir}/pid) 2>/dev/null; then exit 0; fi; \
             {env}setsid nohup {cmdline} >>{dir}/serve.log 2>&1 </dev/null & echo $! >{dir}/pid"
        );
        self.exec(id, &script)?;
        self.set_running(id, true);
        Ok(())
    }
    fn kill(&self, id: u64) -> Result<()> {
        self.end_daemon(id, "kill -9 $p 2>/dev/null")
    }
    fn stop(&self, id: u64) -> Result<()> {
        self.end_daemon(
            id,
            "kill -CONT $p; kill -TERM $p; \
             for i in $(seq 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; \
             kill -9 $p 2>/dev/null",
        )
    }
    fn is_running(&self, id: u64) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
            .unwrap_or(false)
    }
    fn pause(&self, id: u64) -> Result<()> {
        self.exec(id, &format!("kill -STOP $(cat {}/pid)", guest_dir(id)))
            .map(drop)
    }
    fn resume(&self, id: u64) -> Result<()> {
        self.exec(id, &format!("kill -CONT $(cat {}/pid)", guest_dir(id)))
            .map(drop)
    }
    fn arm_freeze(&self, id: u64, in_flight: u64, delay: Duration, bound: Duration) -> Result<()> {
        let dir = guest_dir(id);
        let watch = freeze_watch_script(
            &format!("{dir}/pid"),
            &self.metrics_addr(id),
            in_flight,
            delay,
            bound,
        );
        self.exec(
            id,
            &format!(
                "setsid nohup bash -c {} >{dir}/freeze.out 2>&1 </dev/null &",
                sh_quote(&watch)
            ),
        )
        .map(drop)
    }
    fn is_stopped(&self, id: u64) -> Result<bool> {
        let out = self.exec(
            id,
            &format!("grep '^State' /proc/$(cat {}/pid)/status", guest_dir(id)),
        )?;
        Ok(out.contains("T (stopped)"))
    }
    fn nic_refusals(&self, id: u64, from: u64) -> Result<u64> {
        let out = self.exec(id, &refusal_count_script(&guest_dir(id), &guest_ip(from)))?;
        out.lines()
            .rev()
            .find_map(|l| l.trim().parse().ok())
            .ok_or_else(|| {
                SubstrateError::command(
                    format!("count node {id}'s NIC refusals"),
                    format!("no count in {out:?}"),
                )
            })
    }
    fn can_partition(&self) -> bool {
        true
    }
    fn can_drop_one_way(&self) -> bool {
        false
    }
    fn partition(&self, groups: &[Vec<u64>]) -> Result<()> {
        self.heal()?;
        for (g, group) in groups.iter().enumerate() {
            for other in &groups[g + 1..] {
                for &a in group {
                    for &b in other {
                        self.lab(
                            &format!("lab.sh cut {a} {b}"),
                            &["cut", &a.to_string(), &b.to_string()],
                        )?;
                        self.cuts
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert((a, b));
                    }
                }
            }
        }
        Ok(())
    }
    fn drop_one_way(&self, _from: u64, _to: u64) -> Result<()> {
        Err(SubstrateError::Unsupported {
            substrate: "softroce",
            what: "drop packets one way (lab.sh cut is symmetric)",
        })
    }
    fn heal(&self) -> Result<()> {
        let cuts = std::mem::take(&mut *self.cuts.lock().unwrap_or_else(|p| p.into_inner()));
        for (a, b) in cuts {
            self.lab(
                &format!("lab.sh heal {a} {b}"),
                &["heal", &a.to_string(), &b.to_string()],
            )?;
        }
        Ok(())
    }
    fn damage_tail(&self, id: u64, damage: TailDamage, seed: u64) -> Result<String> {
        if self.is_running(id) {
            return Err(SubstrateError::node(
                id,
                "still running: only a stopped node's ring may be damaged",
            ));
        }
        self.exec(
            id,
            &format!(
                "{} damage-tail --data-dir {}/data --mode {} --seed {seed}",
                sh_quote(&self.spec.jepsen_bin.display().to_string()),
                guest_dir(id),
                damage.as_str()
            ),
        )
    }
    fn wal_check(&self, id: u64) -> Result<WalCheck> {
        let script = format!(
            "{} wal check --data-dir {}/data; echo \"wal-check-status=$?\"",
            sh_quote(&self.spec.ringraft_bin.display().to_string()),
            guest_dir(id)
        );
        let output = self.exec(id, &script)?;
        let status = output
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("wal-check-status="))
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1);
        Ok(WalCheck { status, output })
    }
    fn collect_logs(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| SubstrateError::io(dir, source))?;
        for &id in &self.spec.nodes {
            let log = self.exec(id, &format!("cat {}/serve.log", guest_dir(id)))?;
            let to = dir.join(format!("n{id}.log"));
            std::fs::write(&to, log).map_err(|source| SubstrateError::io(to, source))?;
        }
        Ok(())
    }
    fn teardown(&self) -> Result<()> {
        let mut done = self.torn_down.lock().unwrap_or_else(|p| p.into_inner());
        if *done {
            return Ok(());
        }
        *done = true;
        self.lab("lab.sh kill", &["kill"]).map(drop)
    }
}

impl Drop for SoftRoce {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("ringraft-jepsen: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::{REFUSAL_LOG_LINE, freeze_watch_script, refusal_count_script, tcg_timing};

    #[test]
    fn the_tcg_timing_is_a_default_the_serve_arguments_override() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            tcg_timing(&[]),
            strings(&[
                "--heartbeat-ms",
                "1000",
                "--election-timeout-ms",
                "3000,6000"
            ])
        );
        let own = strings(&["--rdma-retry-count", "6", "--heartbeat-ms", "3000"]);
        assert_eq!(
            tcg_timing(&own),
            strings(&["--election-timeout-ms", "3000,6000"])
        );
        let own = strings(&["--heartbeat-ms=3000", "--election-timeout-ms=6000,9000"]);
        assert!(tcg_timing(&own).is_empty());
    }

    #[test]
    fn refusals_are_counted_per_peer_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let count = || {
            let out = Command::new("bash")
                .arg("-c")
                .arg(refusal_count_script(&d, "10.77.0.11"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(count(), "0", "no log yet");
        let line = |peer: &str| {
            format!(
                "DEBUG ringraft_transport::rdma::conn: rdma queue pair enters the error state peer={peer} qpn=17 cause={REFUSAL_LOG_LINE} (receives flushed)\n"
            )
        };
        let log = [
            line("10.77.0.11:40002"),
            line("10.77.0.12:40003"),
            // Another node whose address starts like node 1's.
            line("10.77.0.111:40004"),
            "INFO something else peer=10.77.0.11:40002\n".to_string(),
            line("10.77.0.11:40005"),
        ]
        .concat();
        std::fs::write(dir.path().join("serve.log"), log).unwrap();
        assert_eq!(count(), "2");
    }

    #[test]
    fn the_refusal_line_is_the_one_the_rdma_backend_logs() {
        let source = include_str!("../../../transport/src/rdma/conn/recv.rs");
        assert!(
            source.contains(REFUSAL_LOG_LINE),
            "recv.rs no longer logs {REFUSAL_LOG_LINE:?}"
        );
    }

    /// Serves `/metrics` with `ringraft_proposals_in_flight <value>`, one
    /// answer per connection, as the daemon's endpoint does.
    fn metrics_server(value: Arc<AtomicU64>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let body = format!(
                    "# TYPE ringraft_proposals_in_flight gauge\nringraft_proposals_in_flight {}\n# EOF\n",
                    value.load(Ordering::SeqCst)
                );
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        addr
    }

    fn state(child: &Child) -> String {
        std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap()
            .to_string()
    }

    /// `child`'s state once it is stopped, or its last state after a bound
    /// no machine reaches: a SIGSTOP is sent when `kill` returns, but the
    /// process stops only when it next runs, later on a loaded machine.
    fn state_once_stopped(child: &Child) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let now = state(child);
            if now.contains("T (stopped)") || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A `sleep 60` child and a file in `dir` that holds its pid, as a
    /// guest's pid file holds the daemon's.
    fn sleeper(dir: &Path) -> (Child, PathBuf) {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid_file = dir.join("pid");
        std::fs::write(&pid_file, child.id().to_string()).unwrap();
        (child, pid_file)
    }

    #[test]
    fn the_freeze_watcher_stops_the_process_once_enough_proposals_are_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, pid_file) = sleeper(dir.path());
        let in_flight = Arc::new(AtomicU64::new(3));
        let addr = metrics_server(in_flight.clone());
        let pid_file = pid_file.display().to_string();
        let watch = |bound_ms| {
            let script = freeze_watch_script(
                &pid_file,
                &addr,
                8,
                Duration::from_millis(50),
                Duration::from_millis(bound_ms),
            );
            Command::new("bash").arg("-c").arg(script).output().unwrap()
        };

        // 3 < 8 in flight: the watcher gives up, the process runs on.
        let out = watch(700);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.contains("gave up") && text.contains("3 proposals"),
            "{text}"
        );
        assert!(!state(&child).contains("stopped"), "{}", state(&child));

        // 8 in flight: stopped.
        in_flight.store(8, Ordering::SeqCst);
        let out = watch(10_000);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains("8 proposals in flight"), "{text}");
        let stopped = state_once_stopped(&child);
        assert!(stopped.contains("T (stopped)"), "{stopped}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A watcher started after its bound (a loaded guest) still polls once:
    /// enough proposals in flight then, and it stops the process.
    #[test]
    fn the_freeze_watcher_polls_once_even_when_started_after_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, pid_file) = sleeper(dir.path());
        let addr = metrics_server(Arc::new(AtomicU64::new(8)));
        let script = freeze_watch_script(
            &pid_file.display().to_string(),
            &addr,
            8,
            Duration::ZERO,
            Duration::ZERO,
        );
        let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        let stopped = state_once_stopped(&child);
        assert!(stopped.contains("T (stopped)"), "{stopped}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
