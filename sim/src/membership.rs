//! The membership fault: a follower removed from the cluster and, after the
//! hold, added back as a learner and made a voter again; and the heal that
//! makes every node a voter again before the next fault (a later fault
//! that cuts the leader off expects the others to be able to elect).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::nemesis::{addr, ids};
use crate::world::World;

/// How long the cluster may take to make every node a voter again once the
/// faults are healed (simulated).
const RESTORE_PATIENCE: Duration = Duration::from_secs(20);

/// The running node that leads the highest term, if any.
fn leader(world: &World) -> Option<(u64, ringraft::Node)> {
    world
        .nodes
        .running()
        .into_iter()
        .filter(|(_, node)| node.status().state == "Leader")
        .max_by_key(|(_, node)| node.status().term)
}

/// Asks the leader to remove `node` (refused or overtaken by events: the
/// restore that follows makes it a voter again either way).
pub async fn remove(world: &mut World, node: u64) {
    let Some((id, leader)) = leader(world) else {
        return;
    };
    let result = leader.remove(BTreeSet::from([node])).await;
    world
        .trace
        .event(|| format!("node {id} removes node {node}: {result:?}"));
}

/// Makes every node a voter again, through whichever node leads; fails the
/// run when the cluster cannot within `RESTORE_PATIENCE`.
pub async fn restore(world: &mut World) -> Result<(), String> {
    let all: BTreeSet<u64> = ids(world).into_iter().collect();
    let deadline = Instant::now() + RESTORE_PATIENCE;
    let mut last = String::from("no leader");
    loop {
        if let Some((id, leader)) = leader(world) {
            let voters = leader.status().voters;
            let missing: Vec<u64> = all.difference(&voters).copied().collect();
            if missing.is_empty() {
                return Ok(());
            }
            for node in missing {
                let learner = leader.add_learner(node, addr(world, node)).await;
                let promoted = match learner {
                    Ok(()) => leader.promote(BTreeSet::from([node])).await,
                    Err(e) => Err(e),
                };
                world
                    .trace
                    .event(|| format!("node {id} adds node {node} back: {promoted:?}"));
                if let Err(e) = promoted {
                    last = e.to_string();
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the nodes are not all voters again within {RESTORE_PATIENCE:?} of the heal ({last})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
