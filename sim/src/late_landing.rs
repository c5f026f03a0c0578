//! The late-landing fault: a leader's WRITE that a follower's NIC admitted
//! under the rkey of the time lands only after the follower's term advanced
//! and a new leader wrote the same place. DESIGN.md's fencing argument
//! allows it ("old in-flight WRITEs ... land as records the follower
//! rejects"): the record carries the old epoch, so adoption must refuse it
//! even where the new leader's batch names exactly that range, with the
//! same entries (the old leader replicated them to the new one first). The
//! landing check remembers such a record and fails the run if the follower
//! ever adopts it (`landing.rs`).
//!
//! Scripted on the in-process fabric:
//! 1. `F`'s NIC parks what the leader `L` WRITEs to it (admitted now,
//!    copied at the release; `L`'s later requests on that queue pair wait
//!    behind it), and the others' SENDs to `F` are held from the first one
//!    after a WRITE on;
//! 2. an append on `L`: its WRITE to `F` is parked, the others take the
//!    entry and `L` commits it;
//! 3. `L` is cut off from everyone; the others elect a leader `R` (it
//!    holds the entry) which fences `F` (CAS), is granted write access and
//!    WRITEs its batch at `F`'s tail, where `L`'s parked WRITE points too;
//!    the message naming the batch waits;
//! 4. `L`'s parked WRITE lands over `R`'s records; then `R`'s message goes
//!    on: `F` must refuse `L`'s records (epoch below the fence).
//!
//! The model's bound: a WRITE admitted before the rotation lands before
//! the node adopts anything after it, or not at all. Where `F`'s tail
//! moved since `L`'s WRITE was parked (`R`'s first batch went two-sided,
//! say), landing it would overwrite adopted records, which no NIC's
//! in-flight DMA outlives: it is dropped instead (it fails at the NIC).
//!
//! `L` is cut off from a majority: an isolated-leader window from the cut
//! until another node leads a later term.

use std::time::Duration;

use tokio::time::Instant;

use crate::nemesis::{addr, append_on, fence_term, until};
use crate::world::World;

/// How long each stage may take (simulated).
const PATIENCE: Duration = Duration::from_secs(15);

/// Runs the fault with `leader` (id, term) and follower `follower`, held
/// for `hold` at least.
pub async fn apply(
    world: &mut World,
    leader: Option<(u64, u64)>,
    follower: u64,
    hold: Duration,
) -> Result<(), String> {
    let Some((old, term)) = leader.filter(|(id, _)| *id != follower) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let Some(old_node) = world.nodes.get(old) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let started = Instant::now();
    let fabric = world.cluster.fabric.clone();
    let (old_addr, f_addr) = (addr(world, old), addr(world, follower));
    let tail = |w: &World| w.nodes.get(follower).map(|n| n.log_store().tail().next_lsn);
    let parked_at = tail(world);
    let rest: Vec<u64> = world
        .cluster
        .members
        .keys()
        .copied()
        .filter(|id| *id != old && *id != follower)
        .collect();
    let rest_addrs: Vec<String> = rest.iter().map(|id| addr(world, *id)).collect();
    fabric.park_writes(&old_addr, &f_addr);
    for other in &rest_addrs {
        fabric.hold_sends(other, &f_addr);
    }
    // An entry the others take and the follower's NIC parks.
    let data = format!("late-landing-{}-{}", world.seed, world.faults);
    let proposal = append_on(world, old, old_node, data, PATIENCE);
    let parked = until(world, PATIENCE, |_| {
        fabric.parked(&old_addr, &f_addr) > 0 && proposal.is_finished()
    })
    .await;
    world.trace.event(|| {
        format!(
            "leader {old}'s WRITEs parked at node {follower}: {} (appended: {})",
            fabric.parked(&old_addr, &f_addr),
            proposal.is_finished()
        )
    });
    // Deposed: the others elect, and their leader writes at the follower.
    let mut everyone = rest_addrs.clone();
    everyone.push(f_addr.clone());
    let everyone: Vec<&str> = everyone.iter().map(String::as_str).collect();
    fabric.partition(&[&old_addr], &everyone);
    world.history.leader_isolated(old, term);
    let overwritten = parked
        && until(world, PATIENCE, |w| {
            fence_term(w, follower).is_some_and(|t| t > term)
                && w.landings
                    .latest_epoch(follower)
                    .is_some_and(|e| e.term() > term)
        })
        .await;
    world.trace.event(|| {
        format!(
            "node {follower} fenced past term {term} and written by its new leader: \
             {overwritten} (fence term {:?})",
            fence_term(world, follower)
        )
    });
    // The old WRITEs land (or, past the bound, fail), then the new
    // leader's message goes on.
    let lands = overwritten && tail(world) == parked_at;
    if lands {
        fabric.land_parked(&old_addr, &f_addr);
    } else {
        fabric.discard_parked(&old_addr, &f_addr);
    }
    let done = until(world, PATIENCE, |_| fabric.parked(&old_addr, &f_addr) == 0).await;
    world.trace.event(|| {
        format!(
            "leader {old}'s parked WRITEs {} (tail {parked_at:?} then {:?}): {done}",
            if lands { "landed" } else { "dropped" },
            tail(world)
        )
    });
    for other in &rest_addrs {
        fabric.release_sends(other, &f_addr);
    }
    // The window closes once another node leads a later term.
    let new_leader = until(world, PATIENCE, |w| {
        rest.iter()
            .chain([&follower])
            .filter_map(|id| w.nodes.get(*id))
            .any(|n| {
                let s = n.status();
                s.state == "Leader" && s.term > term
            })
    })
    .await;
    world
        .trace
        .event(|| format!("a node leads a term after {term}: {new_leader}"));
    world.history.leader_healed(old, term);
    tokio::time::sleep(hold.saturating_sub(started.elapsed())).await;
    fabric.heal();
    let _ = proposal.await;
    Ok(())
}
