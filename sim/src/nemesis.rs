//! The faults: the seed picks one after another (with a pause between
//! them), each held for a while and then healed: a partition (a minority
//! cut off both ways), a one-way cut, a crash and restart, a pause (the
//! node's traffic frozen while it runs on), a freeze (the node's
//! application stopped while its NIC serves one-sided requests), message
//! delays, a leadership transfer, damage to a stopped follower's log, a
//! follower removed and added back (`membership.rs`), a bridge (a node cut
//! off from all but one), a deposed leader asking for a grant
//! ([`crate::regrant`]), a deposed leader's batch named late
//! ([`crate::stale_adoption`]), a deposed leader's WRITE landing late
//! ([`crate::late_landing`]), and in `fsync` runs a power loss of one machine or
//! of all ([`crate::power`]). A fault that cuts the
//! leader off records the checker's isolated-leader window, closed only
//! after the majority elected a leader of a later term.
//!
//! It owns what a fault does to the world; it never judges the run (the
//! checks do) except when the cluster does not recover from a healed
//! fault within its patience, which is a failure of the run.

use std::time::Duration;

use rand::RngExt;
use ringraft_testkit::inproc::damage;
use serde_json::json;

use crate::membership;
use crate::power;
use crate::world::World;

/// How long the majority may take to elect a leader once the old one is
/// cut off (simulated).
const ELECTION_PATIENCE: Duration = Duration::from_secs(15);

/// One fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `minority` is cut off from the rest, both ways.
    Partition {
        /// The nodes cut off.
        minority: Vec<u64>,
    },
    /// Frames from `from` to `to` are held.
    OneWay {
        /// The sender.
        from: u64,
        /// The receiver.
        to: u64,
    },
    /// `node` stops and starts again over its data.
    Crash {
        /// The node.
        node: u64,
    },
    /// Nothing leaves or reaches `node`, which runs on.
    Pause {
        /// The node.
        node: u64,
    },
    /// Every frame is delayed by up to `max_ms`.
    Delay {
        /// The longest delay.
        max_ms: u64,
    },
    /// The leader hands leadership to `to`.
    Transfer {
        /// The new leader.
        to: u64,
    },
    /// A follower stops, a bit of its last entry flips on disk and in its
    /// ring, and it starts again (recovery must find it).
    Damage {
        /// The follower.
        node: u64,
    },
    /// `node`'s application stops while its NIC goes on serving (a
    /// SIGSTOPped process): its peers' one-sided WRITEs, READs and CASes
    /// execute against its memory, what it posts and the SENDs to it wait.
    Freeze {
        /// The node.
        node: u64,
    },
    /// A follower is removed from the cluster and, after the hold, added
    /// back as a learner and made a voter again.
    Membership {
        /// The follower.
        node: u64,
    },
    /// `cut` is cut off from every node but `bridge`, both ways (Jepsen's
    /// bridge): with five nodes the others elect a leader that fences
    /// `bridge` while `cut`, still leading its term, writes to it.
    Bridge {
        /// The node cut off from all but one.
        cut: u64,
        /// The one node still reaching it.
        bridge: u64,
    },
    /// Another node is handed the leader's transfer while cut off from it,
    /// `follower` votes for it, and the leader, reconnecting to `follower`,
    /// asks it for a grant: [`crate::regrant`].
    Regrant {
        /// The follower.
        follower: u64,
    },
    /// `node`'s machine loses power and boots again: its unsynced writes
    /// and its ring (shared memory) are lost (`fsync` runs only:
    /// [`crate::power`]).
    PowerLoss {
        /// The node.
        node: u64,
    },
    /// Every machine loses power at once and boots again.
    PowerLossAll,
    /// A deposed leader's batch named to `bridge` after a new leader
    /// fenced it in (five nodes or more): [`crate::stale_adoption`].
    StaleAdoption {
        /// The follower.
        bridge: u64,
    },
    /// The leader's WRITE that `follower`'s NIC admitted lands only after
    /// a new leader fenced `follower` and wrote the same place:
    /// [`crate::late_landing`].
    LateLanding {
        /// The follower.
        follower: u64,
    },
}

pub(crate) fn addr(world: &World, id: u64) -> String {
    world.cluster.members[&id].config.listen.clone()
}

/// Between looks at the world while a scripted fault waits ([`until`]).
const POLL: Duration = Duration::from_millis(1);

/// Waits (simulated time, at most `patience`) until `ready`, looking every
/// [`POLL`]; whether it came.
pub(crate) async fn until(
    world: &World,
    patience: Duration,
    ready: impl Fn(&World) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if ready(world) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Node `id`'s fence term, if it runs.
pub(crate) fn fence_term(world: &World, id: u64) -> Option<u64> {
    world.nodes.get(id).map(|n| n.log_store().fence().term())
}

/// Appends `data` on node `id` (a client of its own, in the history),
/// answered within `patience` or recorded as of unknown outcome.
pub(crate) fn append_on(
    world: &World,
    id: u64,
    node: ringraft::Node,
    data: String,
    patience: Duration,
) -> tokio::task::JoinHandle<()> {
    let history = world.history.clone();
    let op = history.invoke_append_via(history.fresh_process(), id, data.clone());
    tokio::spawn(async move {
        match tokio::time::timeout(patience, node.propose(data.into_bytes())).await {
            Ok(Ok((index, _))) => history.ok(op, index),
            Ok(Err(e)) => history.info(op, e.to_string()),
            Err(_) => history.info(op, "no answer"),
        }
    })
}

pub(crate) fn ids(world: &World) -> Vec<u64> {
    world.cluster.members.keys().copied().collect()
}

/// Picks the next fault.
fn choose(world: &mut World, leader: Option<u64>) -> Fault {
    let ids = ids(world);
    let n = ids.len();
    let any = |world: &mut World| ids[world.rng.random_range(0..n)];
    let other = |world: &mut World, not: u64| {
        let others: Vec<u64> = ids.iter().copied().filter(|id| *id != not).collect();
        others[world.rng.random_range(0..others.len())]
    };
    let leader_or_any = |world: &mut World| match leader {
        Some(l) if world.rng.random_bool(0.6) => l,
        _ => any(world),
    };
    match world.rng.random_range(0..12) {
        0 => {
            let first = leader_or_any(world);
            let mut minority = vec![first];
            // In a cluster of five, sometimes two.
            if n >= 5 && world.rng.random_bool(0.5) {
                minority.push(other(world, first));
            }
            minority.sort_unstable();
            minority.dedup();
            Fault::Partition { minority }
        }
        1 => {
            let from = leader_or_any(world);
            Fault::OneWay {
                from,
                to: other(world, from),
            }
        }
        2 => Fault::Crash {
            node: leader_or_any(world),
        },
        3 => Fault::Pause {
            node: leader_or_any(world),
        },
        4 => Fault::Delay {
            max_ms: world.rng.random_range(1..40),
        },
        5 => match leader {
            Some(l) => Fault::Transfer {
                to: other(world, l),
            },
            None => Fault::Delay { max_ms: 5 },
        },
        6 => match leader {
            Some(l) => Fault::Damage {
                node: other(world, l),
            },
            None => Fault::Crash { node: any(world) },
        },
        7 => Fault::Freeze {
            node: leader_or_any(world),
        },
        8 => match leader {
            Some(l) => Fault::Membership {
                node: other(world, l),
            },
            None => Fault::Delay { max_ms: 5 },
        },
        9 => {
            let cut = leader_or_any(world);
            Fault::Bridge {
                cut,
                bridge: other(world, cut),
            }
        }
        10 => match leader {
            Some(l) if n >= 5 && world.rng.random_bool(0.5) => Fault::StaleAdoption {
                bridge: other(world, l),
            },
            Some(l) => Fault::LateLanding {
                follower: other(world, l),
            },
            None => Fault::Delay { max_ms: 5 },
        },
        _ => match leader {
            Some(l) => Fault::Regrant {
                follower: other(world, l),
            },
            None => Fault::Delay { max_ms: 5 },
        },
    }
}

/// Waits a while, injects the next fault, holds it, heals it.
pub async fn step(world: &mut World) -> Result<(), String> {
    let gap = Duration::from_millis(world.rng.random_range(100..800));
    tokio::time::sleep(gap).await;
    let leader = world.leader(Duration::from_millis(500)).await;
    let fault = match power::choose(world) {
        Some(fault) => fault,
        None => choose(world, leader.map(|(id, _)| id)),
    };
    let hold = Duration::from_millis(world.rng.random_range(300..3000));
    world
        .trace
        .event(|| format!("fault {fault:?} for {hold:?}"));
    world
        .history
        .nemesis_start(fault_name(&fault), json!(format!("{fault:?}")));
    apply(world, &fault, leader, hold).await?;
    world
        .history
        .nemesis_stop(fault_name(&fault), json!(format!("{fault:?}")));
    world.trace.event(|| format!("healed {fault:?}"));
    Ok(())
}

fn fault_name(fault: &Fault) -> &'static str {
    match fault {
        Fault::Partition { .. } => "partition",
        Fault::OneWay { .. } => "one-way",
        Fault::Crash { .. } => "crash",
        Fault::Pause { .. } => "pause",
        Fault::Delay { .. } => "delay",
        Fault::Transfer { .. } => "transfer",
        Fault::Damage { .. } => "damage",
        Fault::Freeze { .. } => "freeze",
        Fault::Membership { .. } => "membership",
        Fault::Bridge { .. } => "bridge",
        Fault::Regrant { .. } => "regrant",
        Fault::PowerLoss { .. } => "power-loss",
        Fault::PowerLossAll => "power-loss-all",
        Fault::StaleAdoption { .. } => "stale-adoption",
        Fault::LateLanding { .. } => "late-landing",
    }
}

async fn apply(
    world: &mut World,
    fault: &Fault,
    leader: Option<(u64, u64)>,
    hold: Duration,
) -> Result<(), String> {
    match fault {
        Fault::Partition { minority } => {
            let rest: Vec<u64> = ids(world)
                .into_iter()
                .filter(|id| !minority.contains(id))
                .collect();
            let (a, b): (Vec<String>, Vec<String>) = (
                minority.iter().map(|id| addr(world, *id)).collect(),
                rest.iter().map(|id| addr(world, *id)).collect(),
            );
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let b: Vec<&str> = b.iter().map(String::as_str).collect();
            world.cluster.fabric.partition(&a, &b);
            isolated(world, leader, minority, &rest, hold).await?;
            world.cluster.fabric.heal();
        }
        Fault::OneWay { from, to } => {
            world
                .cluster
                .fabric
                .cut_one_way(&addr(world, *from), &addr(world, *to));
            tokio::time::sleep(hold).await;
            world.cluster.fabric.heal();
        }
        Fault::Crash { node } => {
            world.stop(*node).await;
            tokio::time::sleep(hold).await;
            world.boot(*node).await?;
        }
        Fault::Pause { node } => {
            world.cluster.fabric.pause(&addr(world, *node));
            let rest: Vec<u64> = ids(world).into_iter().filter(|id| id != node).collect();
            isolated(world, leader, &[*node], &rest, hold).await?;
            world.cluster.fabric.resume(&addr(world, *node));
        }
        Fault::Freeze { node } => {
            world.cluster.fabric.freeze(&addr(world, *node));
            let rest: Vec<u64> = ids(world).into_iter().filter(|id| id != node).collect();
            isolated(world, leader, &[*node], &rest, hold).await?;
            world.cluster.fabric.thaw(&addr(world, *node));
        }
        Fault::Bridge { cut, bridge } => {
            let rest: Vec<String> = ids(world)
                .into_iter()
                .filter(|id| id != cut && id != bridge)
                .map(|id| addr(world, id))
                .collect();
            let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
            world.cluster.fabric.partition(&[&addr(world, *cut)], &rest);
            // No isolated-leader window: through the bridge, the leader
            // may still commit (with three nodes it keeps a majority).
            tokio::time::sleep(hold).await;
            world.cluster.fabric.heal();
        }
        Fault::Membership { node } => {
            membership::remove(world, *node).await;
            tokio::time::sleep(hold).await;
            membership::restore(world).await?;
        }
        Fault::Delay { max_ms } => {
            world
                .cluster
                .fabric
                .set_delay(Duration::ZERO, Duration::from_millis(*max_ms));
            tokio::time::sleep(hold).await;
            world
                .cluster
                .fabric
                .set_delay(Duration::ZERO, Duration::ZERO);
        }
        Fault::Transfer { to } => {
            if let Some((leader, _)) = leader
                && let Some((_, node)) = world
                    .nodes
                    .running()
                    .into_iter()
                    .find(|(id, _)| *id == leader)
            {
                // Refused or overtaken by events: either is fine.
                let _ = tokio::time::timeout(hold, node.transfer_leader(*to)).await;
            }
            tokio::time::sleep(hold).await;
        }
        Fault::Damage { node } => {
            let last = world.cluster.applied(*node).entries.last().map(|(i, _)| *i);
            world.stop(*node).await;
            if let Some(index) = last {
                damage::flip_bit(&world.cluster, *node, index);
                world
                    .trace
                    .event(|| format!("flipped a bit of entry {index} of node {node}"));
            }
            tokio::time::sleep(hold).await;
            world.boot(*node).await?;
        }
        Fault::Regrant { follower } => {
            crate::regrant::apply(world, leader, *follower, hold).await?;
        }
        Fault::StaleAdoption { bridge } => {
            crate::stale_adoption::apply(world, leader, *bridge, hold).await?;
        }
        Fault::LateLanding { follower } => {
            crate::late_landing::apply(world, leader, *follower, hold).await?;
        }
        Fault::PowerLoss { node } => power::apply(world, &[*node], hold).await?,
        Fault::PowerLossAll => power::apply(world, &ids(world), hold).await?,
    }
    Ok(())
}

/// Holds a fault that cut `cut` off from `rest`. If it cut the leader off
/// and `rest` can elect, that is an isolated-leader window for the checker,
/// closed once `rest` elected a leader of a later term (which must happen
/// within [`ELECTION_PATIENCE`]).
async fn isolated(
    world: &mut World,
    leader: Option<(u64, u64)>,
    cut: &[u64],
    rest: &[u64],
    hold: Duration,
) -> Result<(), String> {
    let Some((old, term)) = leader.filter(|(id, _)| cut.contains(id)) else {
        tokio::time::sleep(hold).await;
        return Ok(());
    };
    // The checker's window closes only once another node leads a later
    // term. A node whose log is corrupt inside grants no vote until it is
    // re-replicated (DESIGN.md, recovery): if the others cannot elect, the
    // cluster waits for the heal, and this is no isolated-leader window.
    let running = world.nodes.running();
    let can_elect = rest.iter().all(|id| {
        running
            .iter()
            .any(|(n, node)| n == id && !node.log_store().votes_blocked())
    });
    if !can_elect {
        world.trace.event(|| {
            format!("leader {old} cut off while {rest:?} cannot elect (votes blocked or down)")
        });
        tokio::time::sleep(hold).await;
        return Ok(());
    }
    world.history.leader_isolated(old, term);
    tokio::time::sleep(hold).await;
    let deadline = tokio::time::Instant::now() + ELECTION_PATIENCE;
    loop {
        let new = rest
            .iter()
            .filter_map(|id| world.nodes.running().into_iter().find(|(n, _)| n == id))
            .map(|(_, node)| node.status())
            .find(|s| s.state == "Leader" && s.term > term);
        if let Some(new) = new {
            world.trace.event(|| {
                format!(
                    "node {} leads term {} after {old} was cut off",
                    new.id, new.term
                )
            });
            world.history.leader_healed(old, term);
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let views: Vec<String> = world
                .nodes
                .running()
                .into_iter()
                .filter(|(id, _)| rest.contains(id))
                .map(|(id, node)| {
                    let s = node.status();
                    format!(
                        "node {id}: {} of term {}, leader {:?}, last log {:?}, votes blocked: {}",
                        s.state,
                        s.term,
                        s.leader_id,
                        s.last_log_index,
                        node.log_store().votes_blocked()
                    )
                })
                .collect();
            return Err(format!(
                "no leader of a term after {term} among {rest:?} within {ELECTION_PATIENCE:?} \
                 of cutting off the leader {old} ({})",
                views.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Undoes every fault: cuts, pauses, delays healed, stopped nodes started.
pub async fn heal_all(world: &mut World) -> Result<(), String> {
    world.cluster.fabric.heal();
    world
        .cluster
        .fabric
        .set_delay(Duration::ZERO, Duration::ZERO);
    for id in ids(world) {
        world.cluster.fabric.resume(&addr(world, id));
        world.cluster.fabric.thaw(&addr(world, id));
        if !world.cluster.running().contains(&id) {
            world.boot(id).await?;
        }
    }
    membership::restore(world).await
}
