//! The substrates whose nodes are child processes of the harness (`local`,
//! `netns`): one [`OnProcesses`] substrate over the test kit's
//! [`ProcessCluster`], with the network faults left to a [`Network`] (none
//! on loopback, iptables in namespaces). Owns the cluster and the network:
//! dropping it kills every node, then tears the network down. Never decides
//! which fault to inject.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ringraft_testkit::process::{NodePlace, ProcessCluster, ProcessOptions, STOP_GRACE_MS};

use super::{ClusterSpec, Result, Substrate, SubstrateError, TailDamage, WalCheck, run_cmd};

/// The network faults of a process substrate.
pub trait Network: Send + Sync {
    /// The substrate's name.
    fn name(&self) -> &'static str;
    /// Whether [`Network::partition`] works.
    fn can_partition(&self) -> bool;
    /// Whether [`Network::drop_one_way`] works.
    fn can_drop_one_way(&self) -> bool;
    /// See [`Substrate::partition`].
    fn partition(&self, groups: &[Vec<u64>]) -> Result<()>;
    /// See [`Substrate::drop_one_way`].
    fn drop_one_way(&self, from: u64, to: u64) -> Result<()>;
    /// See [`Substrate::heal`].
    fn heal(&self) -> Result<()>;
    /// Removes what the network created (after the nodes are killed).
    /// Idempotent.
    fn teardown(&self) -> Result<()>;
}

/// A substrate of child processes. See the module docs.
pub struct OnProcesses<N: Network> {
    spec: ClusterSpec,
    cluster: ProcessCluster,
    network: N,
}

impl<N: Network> OnProcesses<N> {
    /// The nodes of `spec` at `places` (the `tcp` fabric) with `network`;
    /// starts nothing.
    pub(crate) fn with(
        spec: ClusterSpec,
        places: BTreeMap<u64, NodePlace>,
        network: N,
    ) -> OnProcesses<N> {
        let mut env = vec![("RINGRAFT_PLANTED_BUG".to_string(), spec.planted_bug.clone())];
        if let Some(filter) = &spec.node_log {
            env.push(("RUST_LOG".to_string(), Some(filter.clone())));
        }
        let options = ProcessOptions {
            binary: spec.ringraft_bin.clone(),
            fabric: "tcp".into(),
            bootstrap: spec.nodes[0],
            extra_serve_args: spec.extra_serve_args.clone(),
            env,
            die_with_parent: false,
            stdout_to_log: false,
        };
        OnProcesses {
            cluster: ProcessCluster::new(options, places),
            spec,
            network,
        }
    }

    /// The network.
    pub(crate) fn network(&self) -> &N {
        &self.network
    }
}

impl<N: Network> Substrate for OnProcesses<N> {
    fn name(&self) -> &'static str {
        self.network.name()
    }
    fn nodes(&self) -> Vec<u64> {
        self.spec.nodes.clone()
    }
    fn client_endpoint(&self, id: u64) -> String {
        self.cluster
            .place(id)
            .map(|p| p.client.clone())
            .unwrap_or_default()
    }
    fn listen_addr(&self, id: u64) -> String {
        self.cluster
            .place(id)
            .map(|p| p.listen.clone())
            .unwrap_or_default()
    }
    fn start(&self, id: u64) -> Result<()> {
        Ok(self.cluster.start(id)?)
    }
    fn kill(&self, id: u64) -> Result<()> {
        Ok(self.cluster.kill(id)?)
    }
    fn stop(&self, id: u64) -> Result<()> {
        self.cluster
            .stop(id, Duration::from_millis(STOP_GRACE_MS))
            .map(drop)?;
        Ok(())
    }
    fn is_running(&self, id: u64) -> bool {
        self.cluster.is_running(id)
    }
    fn pause(&self, id: u64) -> Result<()> {
        Ok(self.cluster.pause(id)?)
    }
    fn resume(&self, id: u64) -> Result<()> {
        Ok(self.cluster.resume(id)?)
    }
    fn can_partition(&self) -> bool {
        self.network.can_partition()
    }
    fn can_drop_one_way(&self) -> bool {
        self.network.can_drop_one_way()
    }
    fn partition(&self, groups: &[Vec<u64>]) -> Result<()> {
        self.network.partition(groups)
    }
    fn drop_one_way(&self, from: u64, to: u64) -> Result<()> {
        self.network.drop_one_way(from, to)
    }
    fn heal(&self) -> Result<()> {
        self.network.heal()
    }
    fn damage_tail(&self, id: u64, damage: TailDamage, seed: u64) -> Result<String> {
        if self.cluster.is_running(id) {
            return Err(SubstrateError::node(
                id,
                "still running: only a stopped node's ring may be damaged",
            ));
        }
        let dir = &self.cluster.place(id)?.data_dir;
        crate::tail::damage_tail(dir, damage, seed)
            .map_err(|e| SubstrateError::command(format!("damage the tail of node {id}'s ring"), e))
    }
    fn wal_check(&self, id: u64) -> Result<WalCheck> {
        let (status, output) = self.cluster.wal_check(id)?;
        Ok(WalCheck { status, output })
    }
    fn collect_logs(&self, dir: &Path) -> Result<()> {
        Ok(self.cluster.collect_logs(dir)?)
    }
    fn teardown(&self) -> Result<()> {
        self.cluster.kill_all();
        self.network.teardown()
    }
}

impl<N: Network> Drop for OnProcesses<N> {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("ringraft-jepsen: {e}");
        }
    }
}

/// Runs `ip` with `args`.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run_cmd(
        &format!("ip {}", args.join(" ")),
        Command::new("ip").args(args),
    )
}
