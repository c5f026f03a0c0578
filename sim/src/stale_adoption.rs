//! The stale-adoption fault: a deposed leader's batch, whose WRITEs landed
//! in a follower's ring before the fence moved, is named to that follower
//! only after a new leader fenced it in and was granted write access at
//! the tail as it was then. The follower's adoption must refuse the batch
//! (its records carry the old epoch, not the fence's); taking it would move
//! the tail behind the new leader's back, and the new leader's next WRITE
//! would land over adopted records (the landing check's tail rule).
//!
//! Scripted on the in-process fabric, with five nodes or more (the others
//! must elect without the follower's vote, so that its vote stays in the
//! old term and openraft still takes the old leader's message):
//! 1. the leader `L` is cut off from all but the follower `F`; the SENDs
//!    from `L` to `F` are held from the next one on (the WRITEs before it
//!    land), and so are `F`'s SENDs to the others (its answers, the grant
//!    among them);
//! 2. an append on `L` puts a batch in flight to `F`: its WRITEs land, the
//!    message naming them waits;
//! 3. the others elect a leader `L2`, which fences `F` (CAS) and asks for a
//!    grant: `F` rotates its rkey and grants (its answer waits);
//! 4. `L`'s message goes on (`F` must refuse the batch), then `F`'s answers:
//!    `L2` learns the tail of the grant and writes there.
//!
//! `L` is cut off from a majority: an isolated-leader window from the cut
//! until another node leads a later term.

use std::time::Duration;

use tokio::time::Instant;

use crate::nemesis::{addr, append_on, fence_term, until};
use crate::world::World;

/// How long the others may take to elect a leader and fence the follower
/// in (simulated).
const PATIENCE: Duration = Duration::from_secs(15);

/// Runs the fault with `leader` (id, term) and follower `bridge`, held for
/// `hold` at least.
pub async fn apply(
    world: &mut World,
    leader: Option<(u64, u64)>,
    bridge: u64,
    hold: Duration,
) -> Result<(), String> {
    let ids: Vec<u64> = world.cluster.members.keys().copied().collect();
    let Some((old, term)) = leader.filter(|(id, _)| *id != bridge) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let rest: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| *id != old && *id != bridge)
        .collect();
    let (Some(old_node), true) = (world.nodes.get(old), rest.len() * 2 > ids.len()) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let started = Instant::now();
    let fabric = world.cluster.fabric.clone();
    let (old_addr, bridge_addr) = (addr(world, old), addr(world, bridge));
    let rest_addrs: Vec<String> = rest.iter().map(|id| addr(world, *id)).collect();
    for other in &rest_addrs {
        fabric.partition(&[&old_addr], &[other]);
        fabric.hold_sends(&bridge_addr, other);
    }
    fabric.hold_sends(&old_addr, &bridge_addr);
    world.history.leader_isolated(old, term);
    // A batch in flight from the old leader to the follower.
    let data = format!("stale-adoption-{}-{}", world.seed, world.faults);
    let proposal = append_on(world, old, old_node, data, PATIENCE);
    // The others elect, and their leader fences the follower in.
    let fenced = until(world, PATIENCE, |w| {
        fence_term(w, bridge).is_some_and(|t| t > term)
    })
    .await;
    world.trace.event(|| {
        format!(
            "node {bridge}'s fence moved past leader {old}'s term {term}: {fenced} \
             (fence term {:?})",
            fence_term(world, bridge)
        )
    });
    // Its grant (a SEND right after the CAS) processed; then the old
    // leader's message, then the follower's answers.
    tokio::time::sleep(Duration::from_millis(20)).await;
    fabric.release_sends(&old_addr, &bridge_addr);
    tokio::time::sleep(Duration::from_millis(20)).await;
    for other in &rest_addrs {
        fabric.release_sends(&bridge_addr, other);
    }
    // The window closes once another node leads a later term.
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let new = rest
            .iter()
            .filter_map(|id| world.nodes.get(*id))
            .map(|n| n.status())
            .find(|s| s.state == "Leader" && s.term > term);
        if let Some(new) = new {
            world
                .trace
                .event(|| format!("node {} leads term {} after {old}", new.id, new.term));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    world.history.leader_healed(old, term);
    tokio::time::sleep(hold.saturating_sub(started.elapsed())).await;
    fabric.heal();
    let _ = proposal.await;
    Ok(())
}
