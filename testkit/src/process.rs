//! `ringraft serve` as child processes of the harness, optionally each in a
//! network namespace (`ip netns exec`, which execs the daemon in place, so
//! the child's pid is the daemon's). Owns the children: it starts, stops,
//! kills, pauses and resumes them, [`ProcessCluster::stop_all`] stops every
//! one at once, and [`ProcessCluster::kill_all`] kills every one, as
//! dropping the cluster does. On request ([`ProcessOptions::die_with_parent`])
//! a child also dies with the thread that started it, so that not even a
//! harness killed with SIGKILL leaves a node behind. Never creates
//! namespaces or network faults (the harness does) and never judges what a
//! node did.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::serve::{ServeArgs, peers_arg};

/// How long a node gets to stop on SIGTERM before SIGKILL (the Jepsen
/// runner's bound).
pub const STOP_GRACE_MS: u64 = 10_000;

/// Why a process operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A command failed.
    #[error("{what}: {detail}")]
    Command {
        /// What was being done.
        what: String,
        /// Its output or status.
        detail: String,
    },
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A node id that is not part of the cluster, or in the wrong state.
    #[error("node {node}: {why}")]
    Node {
        /// The node.
        node: u64,
        /// What is wrong.
        why: String,
    },
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, ProcessError>;

/// The `ringraft` binary: `explicit` if given, else `ringraft` beside the
/// running executable; made absolute.
///
/// # Errors
/// [`ProcessError::Io`] when the running executable cannot be found or no
/// file is at the chosen path.
pub fn ringraft_binary(explicit: Option<PathBuf>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|source| ProcessError::Io {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })?
            .with_file_name("ringraft"),
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    if !path.is_file() {
        return Err(ProcessError::Io {
            path,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    Ok(path)
}

/// Where one node lives.
#[derive(Debug, Clone)]
pub struct NodePlace {
    /// `--listen`.
    pub listen: String,
    /// `--client`.
    pub client: String,
    /// `--metrics`, if any.
    pub metrics: Option<String>,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--ring-dir`: kept with the run, like the data directory (the tcp
    /// fabric needs no tmpfs), so that nothing is left in /dev/shm.
    pub ring_dir: PathBuf,
    /// The daemon's stderr (appended across restarts).
    pub log: PathBuf,
    /// The network namespace to run in, if any.
    pub netns: Option<String>,
}

/// How every node of a cluster is started.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The `ringraft` binary (see [`ringraft_binary`]).
    pub binary: PathBuf,
    /// `--fabric`.
    pub fabric: String,
    /// The node started with `--bootstrap`.
    pub bootstrap: u64,
    /// Extra `ringraft serve` flags.
    pub extra_serve_args: Vec<String>,
    /// Environment of the children: `Some` sets a variable, `None` removes it.
    pub env: Vec<(String, Option<String>)>,
    /// Each child gets SIGKILL from the kernel when the thread that started
    /// it exits (`PR_SET_PDEATHSIG`), and does not start at all if the
    /// harness died before that was set. Start the nodes from a thread that
    /// lives as long as the cluster (a program's main thread). Off: a child
    /// outlives a harness that dies without dropping the cluster.
    pub die_with_parent: bool,
    /// The child's stdout goes to its log too (interleaved with stderr).
    /// Off: stdout goes to /dev/null.
    pub stdout_to_log: bool,
}

impl ProcessOptions {
    /// Options for `binary` on `fabric`, node `bootstrap` bootstrapping; no
    /// extra flags, the environment inherited, neither
    /// [`ProcessOptions::die_with_parent`] nor
    /// [`ProcessOptions::stdout_to_log`].
    pub fn new(binary: PathBuf, fabric: &str, bootstrap: u64) -> ProcessOptions {
        ProcessOptions {
            binary,
            fabric: fabric.into(),
            bootstrap,
            extra_serve_args: Vec::new(),
            env: Vec::new(),
            die_with_parent: false,
            stdout_to_log: false,
        }
    }
}

/// How [`ProcessCluster::stop`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The node was not running.
    NotRunning,
    /// It exited within the grace, with this status.
    Exited(std::process::ExitStatus),
    /// It outlived the grace and was killed.
    Killed,
}

/// The nodes as child processes. See the module docs.
pub struct ProcessCluster {
    options: ProcessOptions,
    places: BTreeMap<u64, NodePlace>,
    peers: String,
    children: Mutex<BTreeMap<u64, Child>>,
}

impl ProcessCluster {
    /// A cluster of `places` (nothing starts yet).
    pub fn new(options: ProcessOptions, places: BTreeMap<u64, NodePlace>) -> ProcessCluster {
        let peers = peers_arg(places.iter().map(|(id, p)| (*id, p.listen.as_str())));
        ProcessCluster {
            options,
            places,
            peers,
            children: Mutex::new(BTreeMap::new()),
        }
    }

    /// The options.
    pub fn options(&self) -> &ProcessOptions {
        &self.options
    }

    /// The node ids.
    pub fn nodes(&self) -> Vec<u64> {
        self.places.keys().copied().collect()
    }

    /// Where node `id` lives.
    ///
    /// # Errors
    /// [`ProcessError::Node`] for an id that is not in the cluster.
    pub fn place(&self, id: u64) -> Result<&NodePlace> {
        self.places.get(&id).ok_or(ProcessError::Node {
            node: id,
            why: "not a node of this cluster".into(),
        })
    }

    fn children(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Child>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `ringraft serve` arguments of node `id`.
    ///
    /// # Errors
    /// As [`ProcessCluster::place`].
    pub fn serve_args(&self, id: u64) -> Result<Vec<String>> {
        let place = self.place(id)?;
        let mut args = ServeArgs::new(
            id,
            place.data_dir.clone(),
            &place.listen,
            &place.client,
            &self.peers,
            &self.options.fabric,
        );
        args.ring_dir = Some(place.ring_dir.clone());
        args.metrics = place.metrics.clone();
        args.bootstrap = id == self.options.bootstrap;
        args.extra = self.options.extra_serve_args.clone();
        Ok(args.to_args())
    }

    /// Starts node `id` unless it runs; its stderr goes to its log.
    ///
    /// # Errors
    /// When its data directory or log cannot be created or the binary
    /// cannot be started.
    pub fn start(&self, id: u64) -> Result<()> {
        let place = self.place(id)?.clone();
        let mut children = self.children();
        if let Some(child) = children.get_mut(&id) {
            match child.try_wait() {
                Ok(None) => return Ok(()),
                _ => {
                    children.remove(&id);
                }
            }
        }
        std::fs::create_dir_all(&place.data_dir).map_err(|source| ProcessError::Io {
            path: place.data_dir.clone(),
            source,
        })?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&place.log)
            .map_err(|source| ProcessError::Io {
                path: place.log.clone(),
                source,
            })?;
        let stdout = if self.options.stdout_to_log {
            Stdio::from(log.try_clone().map_err(|source| ProcessError::Io {
                path: place.log.clone(),
                source,
            })?)
        } else {
            Stdio::null()
        };
        let binary = &self.options.binary;
        let mut cmd = match &place.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        cmd.args(self.serve_args(id)?)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches the
            // harness, which then tears down in order.
            .process_group(0);
        for (key, value) in &self.options.env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        if self.options.die_with_parent {
            die_with_parent(&mut cmd);
        }
        let child = cmd.spawn().map_err(|e| ProcessError::Command {
            what: format!("start node {id} ({})", binary.display()),
            detail: e.to_string(),
        })?;
        children.insert(id, child);
        Ok(())
    }

    fn signal(&self, id: u64, signal: libc::c_int) -> Result<()> {
        let children = self.children();
        let child = children.get(&id).ok_or(ProcessError::Node {
            node: id,
            why: "not running".into(),
        })?;
        let pid = libc::pid_t::try_from(child.id()).map_err(|_| ProcessError::Node {
            node: id,
            why: "pid out of range".into(),
        })?;
        // SAFETY: kill(2) on the pid of our own child, which has not been
        // reaped (we hold it in `children` until we wait for it), so the pid
        // cannot have been reused.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            return Err(ProcessError::Node {
                node: id,
                why: format!("signal {signal}: {}", std::io::Error::last_os_error()),
            });
        }
        Ok(())
    }

    /// The pid of node `id`, if it was started and not reaped.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.children().get(&id).map(Child::id)
    }

    /// SIGKILL and reap.
    ///
    /// # Errors
    /// Never today (a node that does not run is not an error).
    pub fn kill(&self, id: u64) -> Result<()> {
        let child = self.children().remove(&id);
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// SIGCONT and SIGTERM, wait up to `grace`, then SIGKILL.
    ///
    /// # Errors
    /// Never today.
    pub fn stop(&self, id: u64, grace: Duration) -> Result<Stopped> {
        Ok(self.stop_nodes(&[id], grace)[&id])
    }

    /// Stops every started node at once: SIGCONT and SIGTERM to each, wait
    /// up to `grace` for all of them, then SIGKILL what still runs. Returns
    /// how each node that had been started ended.
    pub fn stop_all(&self, grace: Duration) -> BTreeMap<u64, Stopped> {
        let ids: Vec<u64> = self.children().keys().copied().collect();
        self.stop_nodes(&ids, grace)
    }

    /// [`ProcessCluster::stop`] of all of `ids` at once: a node that does
    /// not run is `NotRunning`; the others get SIGCONT and SIGTERM, then
    /// SIGKILL once `grace` is over.
    fn stop_nodes(&self, ids: &[u64], grace: Duration) -> BTreeMap<u64, Stopped> {
        let mut ended = BTreeMap::new();
        for &id in ids {
            if self.is_running(id) {
                let _ = self.signal(id, libc::SIGCONT);
                let _ = self.signal(id, libc::SIGTERM);
            } else {
                self.children().remove(&id);
                ended.insert(id, Stopped::NotRunning);
            }
        }
        let deadline = Instant::now() + grace;
        loop {
            {
                let mut children = self.children();
                for &id in ids {
                    if ended.contains_key(&id) {
                        continue;
                    }
                    match children.get_mut(&id).map(|c| c.try_wait()) {
                        None | Some(Err(_)) => {
                            children.remove(&id);
                            ended.insert(id, Stopped::NotRunning);
                        }
                        Some(Ok(Some(status))) => {
                            children.remove(&id);
                            ended.insert(id, Stopped::Exited(status));
                        }
                        Some(Ok(None)) => {}
                    }
                }
            }
            if ids.iter().all(|id| ended.contains_key(id)) {
                return ended;
            }
            if Instant::now() > deadline {
                for &id in ids {
                    ended.entry(id).or_insert_with(|| {
                        let _ = self.kill(id);
                        Stopped::Killed
                    });
                }
                return ended;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How node `id` ended, if it was started (and neither stopped nor
    /// killed through the cluster since) and its process has exited: a
    /// node that died on its own.
    pub fn exited(&self, id: u64) -> Option<std::process::ExitStatus> {
        let mut children = self.children();
        children.get_mut(&id)?.try_wait().ok().flatten()
    }

    /// Whether the child lives (paused counts as living).
    pub fn is_running(&self, id: u64) -> bool {
        let mut children = self.children();
        match children.get_mut(&id) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The nodes whose child lives.
    pub fn running(&self) -> Vec<u64> {
        self.nodes()
            .into_iter()
            .filter(|id| self.is_running(*id))
            .collect()
    }

    /// SIGSTOP.
    ///
    /// # Errors
    /// [`ProcessError::Node`] when it does not run or the signal fails.
    pub fn pause(&self, id: u64) -> Result<()> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT.
    ///
    /// # Errors
    /// As [`ProcessCluster::pause`].
    pub fn resume(&self, id: u64) -> Result<()> {
        self.signal(id, libc::SIGCONT)
    }

    /// The last `lines` lines of node `id`'s log ("" when it has none).
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let Ok(place) = self.place(id) else {
            return String::new();
        };
        let text = std::fs::read(&place.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `ringraft wal check` of (stopped) node `id`: its exit status (-1
    /// when killed) and what it printed.
    ///
    /// # Errors
    /// When the binary cannot be run.
    pub fn wal_check(&self, id: u64) -> Result<(i32, String)> {
        let dir = &self.place(id)?.data_dir;
        let out = Command::new(&self.options.binary)
            .args(["wal", "check", "--data-dir"])
            .arg(dir)
            .output()
            .map_err(|e| ProcessError::Command {
                what: format!("ringraft wal check {}", dir.display()),
                detail: e.to_string(),
            })?;
        Ok((
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// Copies each node's log to `dir/n<id>.log`.
    ///
    /// # Errors
    /// When `dir` cannot be created or a log cannot be copied.
    pub fn collect_logs(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| ProcessError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for (id, place) in &self.places {
            let to = dir.join(format!("n{id}.log"));
            if place.log.exists() && place.log != to {
                std::fs::copy(&place.log, &to).map_err(|source| ProcessError::Io {
                    path: to.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Kills every node (resumed first, so that SIGKILL is not held up).
    pub fn kill_all(&self) {
        let mut children = std::mem::take(&mut *self.children());
        for child in children.values_mut() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: our own unreaped child (see `signal`).
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Makes the child of `cmd` die (SIGKILL) when the thread that spawns it
/// exits, and refuse to start when its parent already died.
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: it calls prctl(2) and getppid(2)
    // and reads `parent`, a copy made before the fork; it allocates nothing
    // (its errors are raw OS errors) and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died between fork and prctl: the death signal will
            // never come, so do not start (ESRCH: no such process).
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `ringraft`: ignores SIGTERM when it is node 2 and `STUBBORN`
    /// is set, then says hello on stdout, logs its arguments to stderr (so
    /// that once they are in the log, so is the hello if stdout goes there)
    /// and sleeps (no daemon needed).
    const FAKE_RINGRAFT: &str = "#!/bin/sh\n\
        case \"$*\" in *\"--id 2 \"*) [ -n \"$STUBBORN\" ] && trap '' TERM;; esac\n\
        echo \"stdout of node $3\"\n\
        echo \"$@\" >&2\n\
        exec sleep 600\n";

    /// A cluster of two nodes of [`FAKE_RINGRAFT`], with `options` changed
    /// by `adjust`.
    fn fake_cluster(dir: &Path, adjust: impl FnOnce(&mut ProcessOptions)) -> ProcessCluster {
        let bin = dir.join("ringraft");
        std::fs::write(&bin, FAKE_RINGRAFT).unwrap();
        let mut perms = std::fs::metadata(&bin).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&bin, perms).unwrap();
        let places = (1..=2)
            .map(|id| {
                let place = NodePlace {
                    listen: crate::ports::loopback_addr().unwrap(),
                    client: crate::ports::loopback_addr().unwrap(),
                    metrics: None,
                    data_dir: dir.join(format!("n{id}")),
                    ring_dir: dir.join("shm"),
                    log: dir.join(format!("n{id}.log")),
                    netns: None,
                };
                (id, place)
            })
            .collect();
        let mut options = ProcessOptions::new(ringraft_binary(Some(bin)).unwrap(), "tcp", 1);
        options.env = vec![("RINGRAFT_PLANTED_BUG".into(), None)];
        adjust(&mut options);
        ProcessCluster::new(options, places)
    }

    /// Waits (bounded) until node `id`'s log holds `text`; returns the log.
    fn wait_for_log(cluster: &ProcessCluster, id: u64, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = cluster.log_tail(id, 100);
            if log.contains(text) || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether process `pid` exists.
    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only checks whether the pid exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    #[test]
    fn start_pause_resume_stop_kill_and_drop() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = fake_cluster(dir.path(), |_| {});
        cluster.start(1).unwrap();
        cluster.start(2).unwrap();
        assert_eq!(cluster.running(), vec![1, 2]);
        cluster.pause(2).unwrap();
        assert!(cluster.is_running(2), "paused counts as running");
        cluster.resume(2).unwrap();
        let stopped = cluster.stop(2, Duration::from_secs(5)).unwrap();
        assert!(matches!(stopped, Stopped::Exited(_)), "{stopped:?}");
        assert!(!cluster.is_running(2));
        assert_eq!(
            cluster.stop(2, Duration::from_secs(5)).unwrap(),
            Stopped::NotRunning
        );
        cluster.kill(1).unwrap();
        assert!(cluster.running().is_empty());
        cluster.start(1).unwrap();
        let pid = cluster.pid(1).unwrap();
        assert!(wait_for_log(&cluster, 1, "--bootstrap").contains("--bootstrap"));
        assert!(
            !wait_for_log(&cluster, 1, "--bootstrap").contains("stdout of"),
            "stdout goes to /dev/null by default"
        );
        let logs = dir.path().join("logs");
        cluster.collect_logs(&logs).unwrap();
        assert!(logs.join("n1.log").exists());
        drop(cluster);
        assert!(!alive(pid), "dropping the cluster kills its nodes");
    }

    #[test]
    fn stdout_to_log_writes_stdout_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = fake_cluster(dir.path(), |o| o.stdout_to_log = true);
        cluster.start(1).unwrap();
        let log = wait_for_log(&cluster, 1, "stdout of node 1");
        assert!(log.contains("stdout of node 1"), "{log}");
        assert!(log.contains("--bootstrap"), "stderr too: {log}");
    }

    #[test]
    fn stop_all_stops_every_node_and_kills_the_stubborn() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = fake_cluster(dir.path(), |o| {
            o.env.push(("STUBBORN".into(), Some("1".into())));
        });
        cluster.start(1).unwrap();
        cluster.start(2).unwrap();
        // Node 2 ignores SIGTERM once it logged its arguments.
        wait_for_log(&cluster, 2, "--id 2");
        let pids = [cluster.pid(1).unwrap(), cluster.pid(2).unwrap()];
        cluster.pause(1).unwrap();
        let ended = cluster.stop_all(Duration::from_secs(1));
        assert!(
            matches!(ended[&1], Stopped::Exited(_)),
            "node 1, paused, stops on SIGTERM: {ended:?}"
        );
        assert_eq!(ended[&2], Stopped::Killed, "node 2 ignores SIGTERM");
        assert!(cluster.running().is_empty());
        assert!(pids.iter().all(|pid| !alive(*pid)), "nothing left running");
        assert!(cluster.stop_all(Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn die_with_parent_kills_a_node_whose_starting_thread_ends() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = fake_cluster(dir.path(), |o| o.die_with_parent = true);
        cluster.start(1).unwrap();
        std::thread::scope(|s| s.spawn(|| cluster.start(2).unwrap()).join().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.exited(2).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = cluster.exited(2).expect("node 2 died with its thread");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(cluster.is_running(1), "node 1's thread lives on");
        assert_eq!(cluster.exited(1), None);
    }
}
