//! The fault "a deposed leader re-grants while the node is a candidate's
//! voter" ([`crate::nemesis::Fault::Regrant`]), scripted so that the
//! interleaving DESIGN.md's fencing guards against happens on purpose. The
//! leader `L` of term `T` keeps replicating to the follower `F` throughout;
//! the third node `B` (the others, in a larger cluster) is cut off from
//! `L`:
//!
//! 1. `B` is handed `L`'s leadership transfer (the message a leader sends
//!    to hand over, delivered to `B` only: `L` is cut off from `B` as soon
//!    as it left), and stands for term `T + 1`. `F` votes for it (a
//!    transfer's election passes the leader lease), so `F`'s term advances
//!    and it revokes remote write access, while its fence word still holds
//!    `L`'s epoch. `F`'s answers to `B` are held, so `B` never wins, never
//!    fences `F` in, and stands again and again;
//! 2. `L`, still leader (it heard no higher term), finds its next WRITE to
//!    `F` refused, fences again: it READs `F`'s fence (its own epoch) and
//!    asks for a grant, which `F` must refuse (the epoch's term is below its
//!    vote's). Unless `L` learns the higher term first (a heartbeat's
//!    answer), which is the race this fault loses some of the time;
//! 3. everything heals and the cluster elects.
//!
//! `L` is never cut off from a majority (`F` and it are one until `F`
//! votes), so this opens no isolated-leader window for the checker: once
//! `F` voted, `L` can commit nothing more, and whatever it acknowledged
//! before had a majority.
//!
//! It owns this script only; the landing check (`crate::landing`) judges
//! what reached the rings.

use std::time::Duration;

use openraft::raft::TransferLeaderRequest;
use tokio::time::Instant;

use crate::nemesis::addr;
use crate::world::World;

/// How often the script looks at the nodes (simulated).
const POLL: Duration = Duration::from_millis(1);

/// The term of the vote node `id` saved, if it runs.
fn vote_term(world: &World, id: u64) -> Option<u64> {
    world
        .nodes
        .get(id)
        .map(|node| node.log_store().vote().map_or(0, |v| v.term))
}

/// Runs the fault against `leader` (the leader and its term, if the
/// cluster agreed on one) and `follower`, holding it `hold`; heals.
pub async fn apply(
    world: &mut World,
    leader: Option<(u64, u64)>,
    follower: u64,
    hold: Duration,
) -> Result<(), String> {
    let ids: Vec<u64> = world.cluster.members.keys().copied().collect();
    let candidate = ids
        .iter()
        .copied()
        .find(|id| Some(*id) != leader.map(|l| l.0) && *id != follower);
    let (Some((old, term)), Some(candidate)) =
        (leader.filter(|(id, _)| *id != follower), candidate)
    else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let (Some(node), true) = (
        world.nodes.get(candidate),
        world.nodes.get(follower).is_some(),
    ) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    let started = Instant::now();
    // Everybody but the old leader and the follower is cut off from the
    // old leader; the follower's answers to them are held.
    let fabric = world.cluster.fabric.clone();
    let (old_addr, follower_addr) = (addr(world, old), addr(world, follower));
    for id in ids.iter().filter(|id| **id != old && **id != follower) {
        let other = addr(world, *id);
        fabric.partition(&[&old_addr], &[&other]);
        fabric.cut_one_way(&follower_addr, &other);
    }
    // The transfer as the old leader would send it (its committed vote),
    // delivered to the candidate alone.
    let vote = openraft::Vote::new_committed(term, old);
    let request = TransferLeaderRequest::new(vote, candidate, None);
    let transferred = node
        .scoped(node.raft().handle_transfer_leader(request))
        .await;
    // And the old leader's connections to the follower break (a reset):
    // it reconnects, READs the fence (its own epoch still) and asks for a
    // grant, while the candidate's vote request is on its way to the
    // follower.
    let dropped = fabric.drop_connections(&old_addr, &follower_addr);
    world.trace.event(|| {
        format!(
            "node {candidate} handed leader {old}'s transfer (term {term}): {transferred:?}; \
             {dropped} connections between {old} and {follower} reset"
        )
    });
    while Instant::now() < started + hold {
        tokio::time::sleep(POLL).await;
        if vote_term(world, follower).is_some_and(|t| t > term) {
            world.trace.event(|| {
                format!(
                    "node {follower} votes in term {:?} (leader {old} of {term} still replicates to it)",
                    vote_term(world, follower)
                )
            });
            break;
        }
    }
    tokio::time::sleep(hold.saturating_sub(started.elapsed())).await;
    fabric.heal();
    Ok(())
}
