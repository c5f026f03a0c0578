//! `local`: the nodes as processes on 127.0.0.1, no network faults (no root
//! needed: lets a plain `cargo test` run the harness). Kill, pause and ring
//! damage work; partitions do not.

use std::collections::BTreeMap;
use std::path::Path;

use super::process::{NodePlace, ProcessCluster};
use super::{ClusterSpec, Result, Substrate, SubstrateError, TailDamage, WalCheck};

/// See the module docs.
pub struct Local {
    cluster: ProcessCluster,
}

/// A free TCP port on 127.0.0.1 (bound and released: another process could
/// take it in between, which a test then reports as a failed start).
fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| SubstrateError::Command {
            what: "find a free port on 127.0.0.1".into(),
            detail: e.to_string(),
        })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| SubstrateError::Command {
            what: "find a free port on 127.0.0.1".into(),
            detail: e.to_string(),
        })
}

impl Local {
    /// Picks ports and directories (below `spec.run_dir/nodes`); starts
    /// nothing.
    pub fn new(spec: ClusterSpec) -> Result<Local> {
        let mut places = BTreeMap::new();
        for &id in &spec.nodes {
            let dir = spec.run_dir.join("nodes").join(format!("n{id}"));
            places.insert(
                id,
                NodePlace {
                    listen: format!("127.0.0.1:{}", free_port()?),
                    client: format!("127.0.0.1:{}", free_port()?),
                    data_dir: dir.join("data"),
                    ring_dir: spec.run_dir.join("nodes").join("shm"),
                    log: dir.join("serve.log"),
                    netns: None,
                },
            );
        }
        Ok(Local {
            cluster: ProcessCluster::new(spec, places),
        })
    }
}

impl Substrate for Local {
    fn name(&self) -> &'static str {
        "local"
    }
    fn nodes(&self) -> Vec<u64> {
        self.cluster.spec().nodes.clone()
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
        self.cluster.start(id)
    }
    fn kill(&self, id: u64) -> Result<()> {
        self.cluster.kill(id)
    }
    fn stop(&self, id: u64) -> Result<()> {
        self.cluster.stop(id)
    }
    fn is_running(&self, id: u64) -> bool {
        self.cluster.is_running(id)
    }
    fn pause(&self, id: u64) -> Result<()> {
        self.cluster.pause(id)
    }
    fn resume(&self, id: u64) -> Result<()> {
        self.cluster.resume(id)
    }
    fn can_partition(&self) -> bool {
        false
    }
    fn can_drop_one_way(&self) -> bool {
        false
    }
    fn partition(&self, _groups: &[Vec<u64>]) -> Result<()> {
        Err(SubstrateError::Unsupported {
            substrate: "local",
            what: "partition the network",
        })
    }
    fn drop_one_way(&self, _from: u64, _to: u64) -> Result<()> {
        Err(SubstrateError::Unsupported {
            substrate: "local",
            what: "drop packets one way",
        })
    }
    fn heal(&self) -> Result<()> {
        Ok(())
    }
    fn damage_tail(&self, id: u64, damage: TailDamage, seed: u64) -> Result<String> {
        self.cluster.damage_tail(id, damage, seed)
    }
    fn wal_check(&self, id: u64) -> Result<WalCheck> {
        self.cluster.wal_check(id)
    }
    fn collect_logs(&self, dir: &Path) -> Result<()> {
        self.cluster.collect_logs(dir)
    }
    fn teardown(&self) -> Result<()> {
        self.cluster.kill_all();
        Ok(())
    }
}
