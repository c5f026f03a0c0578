//! `local`: the nodes as processes on 127.0.0.1, no network faults (no root
//! needed: lets a plain `cargo test` run the harness). Kill, pause and ring
//! damage work; partitions do not. Owns only the choice of ports and
//! directories; the processes belong to [`OnProcesses`].

use std::collections::BTreeMap;

use ringraft_testkit::process::NodePlace;

use super::process::{Network, OnProcesses};
use super::{ClusterSpec, Result, SubstrateError};

/// See the module docs.
pub type Local = OnProcesses<Loopback>;

/// No network faults: everything on loopback.
pub struct Loopback;

/// A free TCP port on 127.0.0.1 (bound and released: another process could
/// take it in between, which a test then reports as a failed start).
fn loopback_addr() -> Result<String> {
    ringraft_testkit::ports::loopback_addr()
        .map_err(|e| SubstrateError::command("find a free port on 127.0.0.1", e.to_string()))
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
                    listen: loopback_addr()?,
                    client: loopback_addr()?,
                    metrics: None,
                    data_dir: dir.join("data"),
                    ring_dir: spec.run_dir.join("nodes").join("shm"),
                    log: dir.join("serve.log"),
                    netns: None,
                },
            );
        }
        Ok(OnProcesses::with(spec, places, Loopback))
    }
}

impl Network for Loopback {
    fn name(&self) -> &'static str {
        "local"
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
    fn teardown(&self) -> Result<()> {
        Ok(())
    }
}
