//! What must hold: after every fault, no record landed in a node's ring by
//! remote WRITE with an epoch below the node's vote, none below its adopted
//! tail, and none that landed below its fence was adopted
//! ([`crate::landing`]); and
//! no two running nodes have applied different entries at one index (data
//! or term); at the end, both again,
//! and the checker's verdict on the history against every node's final log
//! (nothing acknowledged lost, nothing applied twice, one order, each
//! client's order, no stale leader's acknowledgement or write).
//!
//! Pure reads of the world: it never changes it.

use std::collections::BTreeMap;

use crate::world::World;

/// The landing check and agreement, after a fault.
pub fn after_step(world: &World) -> Result<(), String> {
    landings(world)?;
    agreement(world)
}

/// The landing check, agreement and the checker's verdict, at the end.
pub fn at_end(world: &World) -> Result<(), String> {
    landings(world)?;
    agreement(world)?;
    let verdict = world.cluster.check(&world.history);
    if verdict.valid {
        return Ok(());
    }
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    for anomaly in &verdict.anomalies {
        *kinds.entry(anomaly.kind.name()).or_default() += 1;
    }
    let first = verdict
        .anomalies
        .first()
        .map(|a| a.message.clone())
        .unwrap_or_default();
    Err(format!("checker: {kinds:?}; first: {first}"))
}

/// No record landed by remote WRITE in a node's ring with an epoch below
/// that node's vote or below its adopted tail, and none that landed below
/// its fence is in its log (`crate::landing`).
fn landings(world: &World) -> Result<(), String> {
    world.landings.violation().map_or(Ok(()), Err)?;
    world
        .landings
        .adopted_stale(&world.nodes)
        .map_or(Ok(()), Err)
}

/// No two running nodes applied different entries at one index.
fn agreement(world: &World) -> Result<(), String> {
    let mut seen: BTreeMap<u64, (u64, u64, Vec<u8>)> = BTreeMap::new();
    for id in world.cluster.running() {
        let applied = world.cluster.applied(id);
        for ((index, data), term) in applied.entries.iter().zip(&applied.terms) {
            match seen.get(index) {
                None => {
                    seen.insert(*index, (id, *term, data.clone()));
                }
                Some((other, other_term, other_data))
                    if other_term != term || other_data != data =>
                {
                    return Err(format!(
                        "nodes {other} and {id} applied different entries at index {index}: \
                         {:?} (term {other_term}) and {:?} (term {term})",
                        String::from_utf8_lossy(other_data),
                        String::from_utf8_lossy(data)
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}
