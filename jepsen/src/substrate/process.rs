//! `ringraft serve` as child processes of the harness, optionally each in a
//! network namespace (`ip netns exec`, which execs the daemon in place, so
//! the child's pid is the daemon's). Shared by the `local` and `netns`
//! substrates. Owns the children: [`ProcessCluster::kill_all`] kills every
//! one, and so does dropping it.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{ClusterSpec, Result, SubstrateError, TailDamage, WalCheck, run_cmd, serve_args};

/// How long a node gets to stop on SIGTERM before SIGKILL.
pub const STOP_GRACE_MS: u64 = 10_000;

/// Where one node lives.
#[derive(Debug, Clone)]
pub struct NodePlace {
    /// `--listen`.
    pub listen: String,
    /// `--client`.
    pub client: String,
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

/// The nodes as child processes. See the module docs.
pub struct ProcessCluster {
    spec: ClusterSpec,
    places: BTreeMap<u64, NodePlace>,
    peers: String,
    children: Mutex<BTreeMap<u64, Child>>,
}

impl ProcessCluster {
    /// A cluster of `places` (nothing starts yet).
    pub fn new(spec: ClusterSpec, places: BTreeMap<u64, NodePlace>) -> ProcessCluster {
        let peers = places
            .iter()
            .map(|(id, p)| format!("{id}={}", p.listen))
            .collect::<Vec<_>>()
            .join(",");
        ProcessCluster {
            spec,
            places,
            peers,
            children: Mutex::new(BTreeMap::new()),
        }
    }

    /// The spec.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Where node `id` lives.
    pub fn place(&self, id: u64) -> Result<&NodePlace> {
        self.places.get(&id).ok_or(SubstrateError::Node {
            node: id,
            why: "not a node of this cluster".into(),
        })
    }

    fn children(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Child>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts node `id` unless it runs.
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
        std::fs::create_dir_all(&place.data_dir).map_err(|source| SubstrateError::Io {
            path: place.data_dir.clone(),
            source,
        })?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&place.log)
            .map_err(|source| SubstrateError::Io {
                path: place.log.clone(),
                source,
            })?;
        let args = serve_args(
            &self.spec,
            id,
            &place.data_dir,
            Some(&place.ring_dir),
            &place.listen,
            &place.client,
            &self.peers,
            "tcp",
        );
        let mut cmd = match &place.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.spec.ringraft_bin);
                c
            }
            None => Command::new(&self.spec.ringraft_bin),
        };
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches the
            // harness, which then tears down in order.
            .process_group(0);
        match &self.spec.planted_bug {
            Some(bug) => cmd.env("RINGRAFT_PLANTED_BUG", bug),
            None => cmd.env_remove("RINGRAFT_PLANTED_BUG"),
        };
        let child = cmd.spawn().map_err(|e| SubstrateError::Command {
            what: format!("start node {id} ({})", self.spec.ringraft_bin.display()),
            detail: e.to_string(),
        })?;
        children.insert(id, child);
        Ok(())
    }

    fn signal(&self, id: u64, signal: libc::c_int) -> Result<()> {
        let children = self.children();
        let child = children.get(&id).ok_or(SubstrateError::Node {
            node: id,
            why: "not running".into(),
        })?;
        let pid = libc::pid_t::try_from(child.id()).map_err(|_| SubstrateError::Node {
            node: id,
            why: "pid out of range".into(),
        })?;
        // SAFETY: kill(2) on the pid of our own child, which has not been
        // reaped (we hold it in `children` until we wait for it), so the pid
        // cannot have been reused.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            return Err(SubstrateError::Node {
                node: id,
                why: format!("signal {signal}: {}", std::io::Error::last_os_error()),
            });
        }
        Ok(())
    }

    /// SIGKILL and reap.
    pub fn kill(&self, id: u64) -> Result<()> {
        let child = self.children().remove(&id);
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// SIGTERM, wait, SIGKILL after [`STOP_GRACE_MS`].
    pub fn stop(&self, id: u64) -> Result<()> {
        if !self.is_running(id) {
            self.children().remove(&id);
            return Ok(());
        }
        let _ = self.signal(id, libc::SIGCONT);
        let _ = self.signal(id, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        loop {
            {
                let mut children = self.children();
                match children.get_mut(&id).map(|c| c.try_wait()) {
                    None | Some(Ok(Some(_))) | Some(Err(_)) => {
                        children.remove(&id);
                        return Ok(());
                    }
                    Some(Ok(None)) => {}
                }
            }
            if Instant::now() > deadline {
                return self.kill(id);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the child lives.
    pub fn is_running(&self, id: u64) -> bool {
        let mut children = self.children();
        match children.get_mut(&id) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGSTOP.
    pub fn pause(&self, id: u64) -> Result<()> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT.
    pub fn resume(&self, id: u64) -> Result<()> {
        self.signal(id, libc::SIGCONT)
    }

    /// Damages the ring of stopped node `id`.
    pub fn damage_tail(&self, id: u64, damage: TailDamage, seed: u64) -> Result<String> {
        if self.is_running(id) {
            return Err(SubstrateError::Node {
                node: id,
                why: "still running: only a stopped node's ring may be damaged".into(),
            });
        }
        let dir = &self.place(id)?.data_dir;
        crate::tail::damage_tail(dir, damage, seed).map_err(|e| SubstrateError::Command {
            what: format!("damage the tail of node {id}'s ring"),
            detail: e,
        })
    }

    /// `ringraft wal check` of stopped node `id`.
    pub fn wal_check(&self, id: u64) -> Result<WalCheck> {
        let dir = &self.place(id)?.data_dir;
        let out = Command::new(&self.spec.ringraft_bin)
            .args(["wal", "check", "--data-dir"])
            .arg(dir)
            .output()
            .map_err(|e| SubstrateError::Command {
                what: format!("ringraft wal check {}", dir.display()),
                detail: e.to_string(),
            })?;
        Ok(WalCheck {
            status: out.status.code().unwrap_or(-1),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }

    /// Copies each node's log to `dir/n<id>.log`.
    pub fn collect_logs(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| SubstrateError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for (id, place) in &self.places {
            let to = dir.join(format!("n{id}.log"));
            if place.log.exists() && place.log != to {
                std::fs::copy(&place.log, &to).map_err(|source| SubstrateError::Io {
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

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Runs `ip` with `args`.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run_cmd(
        &format!("ip {}", args.join(" ")),
        Command::new("ip").args(args),
    )
}
