//! Failover in milliseconds (`ringraft::node` failover): a leader the fabric
//! finds gone (its connections ended and its address refuses) is replaced
//! at once, before its lease would have run out; a leader that is only
//! cut off, or whose connections merely dropped, is not.
//!
//! Three nodes on the in-process fabric, one thread, paused time
//! (`deterministic`): the durations asserted are virtual, a function of
//! the seed, the same on a fast machine and a slow one.

use std::time::Duration;

use ringraft::NodeConfig;
use ringraft_testkit::inproc::{Cluster, paused_runtime};
use tokio::time::Instant;

const SEED: u64 = 0xfa11;
/// A safety net against hangs (virtual time); never what a test asserts.
const PATIENCE: Duration = Duration::from_secs(60);

async fn cluster(fast_failover: bool) -> Cluster {
    Cluster::start_deterministic(SEED, |c: &mut NodeConfig| {
        c.fast_failover = fast_failover;
    })
    .await
}

/// The soonest an ordinary election can replace a leader that stopped
/// answering: its followers' lease of it (the largest election timeout),
/// then the smallest election timeout.
fn ordinary_failover(c: &Cluster) -> Duration {
    let (min, max) = c.members[&1].config.election_timeout_ms;
    Duration::from_millis(min + max)
}

fn counters(c: &Cluster, ids: &[u64]) -> (u64, u64) {
    ids.iter().fold((0, 0), |(dead, fast), id| {
        let m = c.node(*id).metrics();
        (dead + m.dead_leaders.get(), fast + m.fast_elections.get())
    })
}

fn term(c: &Cluster, id: u64) -> u64 {
    c.node(id).status().term
}

/// The leader, after one commit, and the other running nodes.
async fn leader_and_others(c: &Cluster) -> (u64, Vec<u64>) {
    let leader = c.leader().await;
    c.propose(b"before".to_vec(), PATIENCE)
        .await
        .expect("a commit");
    let others = c.running().into_iter().filter(|id| *id != leader).collect();
    (leader, others)
}

/// Stops the leader; returns the survivors, the new leader and how long
/// (virtual) the survivors took to agree on it.
async fn stop_leader(c: &mut Cluster) -> (Vec<u64>, u64, Duration) {
    let (leader, survivors) = leader_and_others(c).await;
    let stopped = Instant::now();
    c.stop(leader).await;
    let next = c.leader_among(&survivors, PATIENCE).await;
    (survivors, next, stopped.elapsed())
}

#[test]
fn a_stopped_leader_is_replaced_before_its_lease_would_end() {
    paused_runtime().block_on(async {
        let mut c = cluster(true).await;
        let (survivors, next, took) = stop_leader(&mut c).await;
        // Shown with --nocapture.
        println!("stop -> agreed new leader {next}: {took:?} (virtual)");
        assert!(
            took < ordinary_failover(&c) / 4,
            "a new leader ({next}) {took:?} after the stop: no faster than an ordinary \
             election ({:?})",
            ordinary_failover(&c)
        );
        let (dead, fast) = counters(&c, &survivors);
        assert!(dead >= 1, "the death was confirmed");
        assert_eq!(fast, 1, "one survivor stood (turns), not both");
        c.propose(b"after".to_vec(), PATIENCE)
            .await
            .expect("the new leader commits");
    });
}

#[test]
fn without_fast_failover_the_lease_is_waited_out() {
    paused_runtime().block_on(async {
        let mut c = cluster(false).await;
        let (survivors, _, took) = stop_leader(&mut c).await;
        assert!(
            took >= ordinary_failover(&c),
            "{took:?}: sooner than the lease and an election timeout allow"
        );
        assert_eq!(counters(&c, &survivors), (0, 0));
    });
}

#[test]
fn a_live_leader_whose_connections_drop_keeps_its_term() {
    paused_runtime().block_on(async {
        let c = cluster(true).await;
        let (leader, others) = leader_and_others(&c).await;
        let term_before = term(&c, leader);
        let addr = |id: u64| c.members[&id].config.listen.clone();
        let mut dropped = 0;
        for id in &others {
            dropped += c.fabric.drop_connections(&addr(leader), &addr(*id));
        }
        assert!(dropped > 0, "the leader had connections to drop");
        // The leader reconnects and commits again; the followers probed it
        // meanwhile (their connections ended) and found it listening.
        for k in 0..5 {
            c.propose(format!("after {k}").into_bytes(), PATIENCE)
                .await
                .expect("a commit");
        }
        assert_eq!(c.leader().await, leader);
        assert_eq!(term(&c, leader), term_before, "no election");
        assert_eq!(counters(&c, &others), (0, 0));
    });
}

#[test]
fn a_leader_cut_off_is_replaced_only_by_an_ordinary_election() {
    paused_runtime().block_on(async {
        let c = cluster(true).await;
        let (leader, others) = leader_and_others(&c).await;
        let addr = |id: u64| c.members[&id].config.listen.clone();
        let cut = Instant::now();
        let other_addrs: Vec<String> = others.iter().map(|id| addr(*id)).collect();
        let other_refs: Vec<&str> = other_addrs.iter().map(String::as_str).collect();
        c.fabric.partition(&[&addr(leader)], &other_refs);
        for other in &other_refs {
            c.fabric.drop_connections(&addr(leader), other);
        }
        let next = c.leader_among(&others, PATIENCE).await;
        let took = cut.elapsed();
        assert_ne!(next, leader);
        assert!(
            took >= ordinary_failover(&c),
            "{took:?}: a leader that may still be alive was replaced before its lease ran out"
        );
        assert_eq!(counters(&c, &others), (0, 0), "no probe was refused");
        c.fabric.heal();
        c.propose(b"after".to_vec(), PATIENCE)
            .await
            .expect("a commit");
    });
}

#[test]
fn a_proposal_forwarded_across_the_death_waits_for_the_next_leader() {
    paused_runtime().block_on(async {
        let mut c = cluster(true).await;
        let (leader, others) = leader_and_others(&c).await;
        let follower = others[0];
        let node = c.node(follower).clone();
        let heartbeat = Duration::from_millis(c.members[&follower].config.heartbeat_ms);
        let stopped = Instant::now();
        c.stop(leader).await;
        // Sent at once, to a follower whose leader is gone: it waits for
        // the next leader instead of failing (the old leader refuses
        // connections), and that leader takes it without waiting for a
        // heartbeat interval.
        let answer = node.propose(b"across".to_vec()).await;
        let took = stopped.elapsed();
        println!("stop -> forwarded proposal committed: {took:?} (virtual)");
        let (index, _) = answer.expect("committed through the next leader");
        assert!(index > 0);
        assert!(
            took < heartbeat,
            "{took:?}: the next leader took the proposal only after a heartbeat interval ({heartbeat:?})"
        );
    });
}

/// The first turn's log is behind (the dead leader's last entry reached
/// only the second turn): the first turn cannot win, and the second must
/// not be left to split the vote with it. Before the fix the second stood
/// after its turn at the same term as the first, neither won, and an
/// ordinary election followed (one more election timeout).
#[test]
fn a_first_turn_whose_log_is_behind_is_replaced_without_a_split_vote() {
    paused_runtime().block_on(async {
        let mut c = cluster(true).await;
        let (leader, survivors) = leader_and_others(&c).await;
        let (first, second) = (survivors[0], survivors[1]);
        assert!(first < second, "turns go by id");
        let addr = |id: u64| c.members[&id].config.listen.clone();
        let (leader_addr, first_addr) = (addr(leader), addr(first));
        // What the leader sends the first turn from now on waits.
        c.fabric.hold_sends(&leader_addr, &first_addr);
        c.propose(b"ahead".to_vec(), PATIENCE)
            .await
            .expect("committed by the leader and the second turn");
        let stopped = Instant::now();
        c.stop(leader).await;
        // The held SEND dies with the connection, whose end the first turn
        // sees (the close does not wait behind the SEND).
        assert!(c.fabric.drop_connections(&leader_addr, &first_addr) > 0);
        let next = c.leader_among(&survivors, PATIENCE).await;
        let took = stopped.elapsed();
        println!("stop -> agreed new leader {next}: {took:?} (virtual)");
        assert_eq!(next, second, "only the second turn holds every commit");
        assert!(
            took < ordinary_failover(&c) / 4,
            "a new leader {took:?} after the stop: no faster than an ordinary election ({:?})",
            ordinary_failover(&c)
        );
        c.propose(b"after".to_vec(), PATIENCE)
            .await
            .expect("the new leader commits");
    });
}
