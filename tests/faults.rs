//! Faults: leader crash and failover, full restarts, damaged rings, the
//! corrupt-inside voting rule, membership changes under load, snapshots to
//! followers that fell behind their ring, and the stale leader.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ringraft::{Durability, Node, NodeError, Session};
use ringraft_checker::Recorder as History;
use ringraft_testkit::inproc::damage;
use ringraft_testkit::inproc::{Cluster, Kind};
use ringraft_wal::Damage;

const T: Duration = Duration::from_secs(30);

fn commands(c: &Cluster, id: u64) -> Vec<Vec<u8>> {
    c.applied(id).entries.into_iter().map(|(_, d)| d).collect()
}

/// Asserts that all running nodes applied the same sequence and that the
/// checker finds `history` valid against it: every acknowledged append
/// applied exactly once, at its acknowledged index, nothing applied that
/// was not proposed, one order on every node (ringraft-checker's rules).
fn assert_nothing_lost(c: &Cluster, history: &History) {
    let running = c.running();
    let reference = commands(c, running[0]);
    for id in &running {
        assert_eq!(
            commands(c, *id),
            reference,
            "node {id} applied a different sequence"
        );
    }
    let verdict = c.check(history);
    assert!(verdict.valid, "{verdict}");
}

/// Appends `n` records `{prefix}-{k}` through the leader, recorded in
/// `history`; returns the last one's index.
async fn write_n(c: &Cluster, prefix: &str, n: u32, history: &History) -> u64 {
    let mut last = 0;
    for k in 0..n {
        let (index, _) = c
            .propose_recorded(history, &format!("{prefix}-{k}"), T)
            .await
            .unwrap();
        last = index;
    }
    last
}

/// [`write_n`], then waits until every running node applied the last one;
/// returns its index.
async fn write_n_applied(c: &Cluster, prefix: &str, n: u32, history: &History) -> u64 {
    let last = write_n(c, prefix, n, history).await;
    c.wait_applied(last, T).await;
    last
}

async fn leader_crash_fails_over(kind: Kind) {
    let mut c = Cluster::start(kind, 3, Durability::Memory, 2).await;
    let history = History::new();
    write_n(&c, "before", 30, &history).await;
    let old = c.leader().await;
    c.stop(old).await;
    let new = c.leader().await;
    assert_ne!(new, old);
    let last = write_n(&c, "after", 30, &history).await;
    c.boot(old).await.unwrap();
    c.wait_applied(last, T).await;
    assert_nothing_lost(&c, &history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_crash_yields_a_new_leader_and_loses_nothing_inproc() {
    leader_crash_fails_over(Kind::Inproc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_crash_yields_a_new_leader_and_loses_nothing_tcp() {
    leader_crash_fails_over(Kind::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_restarted_recovers_from_ring_and_snapshot() {
    for durability in [Durability::Memory, Durability::Fsync] {
        let mut c = Cluster::start_with(Kind::Inproc, 3, durability, 3, |cfg| {
            cfg.snapshot_every_entries = 40;
            cfg.keep_after_snapshot = 5;
        })
        .await;
        let history = History::new();
        write_n_applied(&c, "x", 150, &history).await;
        for id in c.running() {
            c.stop(id).await;
        }
        for id in 1..=3 {
            let dir = c.data_dir(id);
            assert!(dir.join("snapshot").exists(), "node {id} has a snapshot");
            let report = ringraft_wal::check(&dir).unwrap();
            assert!(
                report.first_index > 1,
                "node {id}'s log was purged after its snapshot"
            );
            assert!(!report.corrupt_in_acknowledged_range());
        }
        for id in 1..=3 {
            c.boot(id).await.unwrap();
        }
        c.leader().await;
        write_n_applied(&c, "y", 10, &history).await;
        assert_nothing_lost(&c, &history);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_damaged_ring_recovers_and_never_applies_a_corrupt_entry() {
    let mut c = Cluster::start(Kind::Inproc, 3, Durability::Memory, 4).await;
    let history = History::new();
    let last = write_n_applied(&c, "a", 40, &history).await;
    let leader = c.leader().await;
    let follower = c.follower_of(leader);
    c.stop(follower).await;

    // Truncate: lose the log's tail (zeroes).
    damage::zero_from(&c, follower, last - 5);
    c.boot(follower).await.unwrap();
    let last = write_n_applied(&c, "b", 10, &history).await;
    assert_nothing_lost(&c, &history);

    // Flip one bit of an entry's payload.
    c.stop(follower).await;
    damage::flip_bit(&c, follower, last - 3);
    let report = ringraft_wal::check(&c.data_dir(follower)).unwrap();
    assert!(report.stop.is_some(), "the checker sees the break");
    c.boot(follower).await.unwrap();
    write_n_applied(&c, "c", 10, &history).await;
    // The recorder asserts order on every apply; the logs are identical, so
    // the flipped entry was never applied (its bytes differ).
    assert_nothing_lost(&c, &history);
}

/// Issue 11, item 1: a follower whose ring a reboot cleared (shared memory
/// is gone, its data directory is not) comes back: the ring is recreated,
/// empty after the segments' last entry, its fence rebuilt from the durable
/// vote (never below the vote's term); the follower catches up and
/// nothing acknowledged is lost. The old code refused to start
/// (`WalError::Incomplete`: meta exists but ring does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_ring_a_reboot_cleared_catches_up() {
    for durability in [Durability::Memory, Durability::Fsync] {
        let mut c = Cluster::start(Kind::Inproc, 3, durability, 11).await;
        let history = History::new();
        let last = write_n_applied(&c, "a", 40, &history).await;
        let leader = c.leader().await;
        let follower = c.follower_of(leader);
        c.stop(follower).await;
        let vote = ringraft_wal::Meta::read(&c.data_dir(follower).join("meta"))
            .unwrap()
            .vote
            .expect("the follower voted");
        // The reboot: the follower's ring (and its owner record) is gone.
        let ring = c.ring_path(follower);
        std::fs::remove_file(&ring).unwrap();
        std::fs::remove_file(ring.with_extension("owner")).unwrap();
        c.boot(follower).await.unwrap();
        let recovery = c.node(follower).log_store().with_wal(|w| *w.recovery());
        assert!(recovery.ring_recreated, "{recovery:?}");
        // The log itself is recovered from the segments (a clean stop
        // flushed them in either durability).
        assert_eq!(recovery.last.map(|l| l.index), Some(last), "{recovery:?}");
        assert!(recovery.fence.term() >= vote.term, "{recovery:?} {vote:?}");
        let last = write_n_applied(&c, "b", 10, &history).await;
        assert_nothing_lost(&c, &history);
        assert_eq!(
            c.node(follower)
                .log_store()
                .with_wal(|w| w.ring().next_index()),
            last + 1,
            "the follower holds the whole log again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_corrupt_inside_grants_no_vote_and_the_lossy_election_does_not_happen() {
    let mut c = Cluster::start(Kind::Inproc, 3, Durability::Memory, 5).await;
    let history = History::new();
    let early = write_n(&c, "early", 10, &history).await;
    // Stop the lagging node only once it holds those: stopped while the
    // leader still WRITEs into its ring, it may come back "corrupt inside"
    // itself (a zeroed batch below a pipelined one), and then it would not
    // stand for election either.
    c.wait_applied(early, T).await;
    let a = c.leader().await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != a).collect();
    let (b, lagging) = (others[0], others[1]);
    // The lagging node misses the next committed entries.
    c.stop(lagging).await;
    let last = write_n(&c, "committed", 30, &history).await;
    c.node(b).wait_applied(last, T).await.unwrap();
    c.stop(a).await;
    c.stop(b).await;
    // b forgets committed entries: one inside what it acknowledged breaks.
    damage::flip_bit(&c, b, last - 10);
    let report = ringraft_wal::check(&c.data_dir(b)).unwrap();
    assert!(report.corrupt_in_acknowledged_range(), "{report}");

    c.boot(b).await.unwrap();
    c.boot(lagging).await.unwrap();
    assert!(matches!(
        c.node(b).log_store().with_wal(|w| w.recovery().damage),
        Damage::CorruptInside(_)
    ));
    // Without the rule b (longer log) would win the lagging node's vote and
    // lead without the entries it forgot. It must not: the lagging node
    // stands for election again and again (a new term each time) and never
    // wins, and b never leads. (Counted in elections, not in seconds: a
    // slow machine holds fewer of them per second.)
    let first_term = c.node(lagging).status().term;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        for id in [b, lagging] {
            let s = c.node(id).status();
            assert!(
                s.state != "Leader",
                "node {id} became leader while b is corrupt: {s:?}"
            );
        }
        if c.node(lagging).status().term >= first_term + 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lagging node did not stand for election three times: {:?} (votes blocked: {})",
            c.node(lagging).status(),
            c.node(lagging).log_store().votes_blocked(),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The node with the full log returns: it leads, re-replicates past b's
    // break, and nothing acknowledged is lost.
    c.boot(a).await.unwrap();
    let leader = c.leader().await;
    assert_ne!(leader, b, "the corrupt node must not lead");
    write_n_applied(&c, "late", 5, &history).await;
    assert_nothing_lost(&c, &history);
    assert!(
        !c.node(b).log_store().votes_blocked(),
        "b was re-replicated past its break"
    );
}

/// Runs the membership change `change` through the leader agreed among
/// `among`, retrying through leader changes (on a loaded machine leadership
/// may move right after the first election). It waits first until the
/// leader's latest membership is committed: openraft refuses a change while
/// the previous one is not ("in progress"), which a slow machine shows
/// right after the election (the initial membership) and after a leader
/// change.
async fn change_membership<F, Fut>(c: &Cluster, among: &[u64], what: &str, change: F)
where
    F: Fn(ringraft::Node) -> Fut,
    Fut: std::future::Future<Output = Result<(), NodeError>>,
{
    let deadline = tokio::time::Instant::now() + T;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not done within {T:?}"
        );
        let leader = c.leader_among(among, T).await;
        let node = c.node(leader).clone();
        let settled = {
            use openraft::async_runtime::WatchReceiver;
            let m = node.watch().borrow_watched().clone();
            m.membership_config.log_id() == m.committed_membership_config.log_id()
        };
        if !settled {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        match change(node).await {
            Ok(()) => return,
            Err(e @ (NodeError::NotLeader { .. } | NodeError::Unknown(_))) => {
                tracing::debug!(error = %e, "{what}: retried");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// The load of membership_changes_under_load: one write at a time through
/// whichever of `nodes` accepts it, until `stop`; counts the acknowledged.
async fn write_until_stopped(
    nodes: Vec<(u64, Node)>,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    history: History,
) {
    // Every try is an operation of its own with data of its own: a
    // try whose outcome is unknown may have been applied, so its
    // data is never proposed again.
    let mut k = 0u32;
    while !stop.load(Ordering::Relaxed) {
        for (id, n) in &nodes {
            let data = format!("load-{k}");
            k += 1;
            let op = history.invoke_append_via(history.fresh_process(), *id, &data);
            match n.propose(data.into_bytes()).await {
                Ok((index, _)) => {
                    history.ok(op, index);
                    acked.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e @ NodeError::NotLeader { .. }) => {
                    history.fail(op, e.to_string());
                    continue;
                }
                Err(e) => {
                    history.info(op, e.to_string());
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
            }
        }
    }
}

/// Waits (at most `T`) until `acked` counts at least `n` writes.
async fn wait_acked_at_least(acked: Arc<AtomicUsize>, n: usize) {
    let deadline = tokio::time::Instant::now() + T;
    while acked.load(Ordering::Relaxed) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the load stalled below {n} writes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_under_load() {
    let mut c = Cluster::start(Kind::Inproc, 5, Durability::Memory, 6).await;
    // Start with 3 voters: remove 4 and 5, then add them back as learners
    // and promote them, while clients write.
    change_membership(&c, &[1, 2, 3, 4, 5], "removing 4 and 5", |n| async move {
        n.remove([4, 5].into()).await
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let history = History::new();
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (stop, acked, history) = (stop.clone(), acked.clone(), history.clone());
        let nodes: Vec<_> = (1..=3).map(|id| (id, c.node(id).clone())).collect();
        tokio::spawn(write_until_stopped(nodes, stop, acked, history))
    };
    // The membership changes happen under load: wait until the load runs
    // (a count of writes, not a time: a slow machine writes less per second).
    let acked_at_least = |n: usize| wait_acked_at_least(acked.clone(), n);
    acked_at_least(10).await;
    for id in [4u64, 5] {
        c.stop(id).await;
        let dir = c.data_dir(id);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        c.boot(id).await.unwrap();
        let addr = c.members[&id].config.listen.clone();
        change_membership(&c, &[1, 2, 3], "adding a learner", |n| {
            let addr = addr.clone();
            async move { n.add_learner(id, addr).await }
        })
        .await;
    }
    change_membership(&c, &[1, 2, 3], "promoting 4 and 5", |n| async move {
        n.promote(BTreeSet::from([4, 5])).await
    })
    .await;
    // And it goes on with five voters.
    let during = acked.load(Ordering::Relaxed);
    acked_at_least(during + 10).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let leader = c.leader().await;
    let status = c.node(leader).status();
    assert_eq!(status.voters, BTreeSet::from([1, 2, 3, 4, 5]));
    let last = c.propose_recorded(&history, "final", T).await.unwrap().0;
    c.wait_applied(last, T).await;
    assert_nothing_lost(&c, &history);
}

/// Issue 10, item 1 (red CI on an idle machine) and item 2 (a full ring
/// must be backpressure): the proposer outran purging, the leader's ring
/// filled and `append`, waiting for room inside openraft's core (which also
/// runs the purge), failed after 30 s: "RaftCore::main error: when Write
/// Logs: ring full: need 3200 bytes, 1024 free until head advances" stopped
/// Raft. Now proposals wait for room before they reach openraft, the purge
/// does not wait for the stopped follower, and that follower gets a
/// snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_lagged_past_its_ring_gets_a_snapshot() {
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 7, |cfg| {
        cfg.ring_capacity = 1 << 20;
        cfg.snapshot_every_entries = 200;
        cfg.keep_after_snapshot = 10;
    })
    .await;
    let history = History::new();
    write_n(&c, "warm", 5, &history).await;
    let leader = c.leader().await;
    let lagging = c.follower_of(leader);
    c.stop(lagging).await;
    // Far more than one ring's worth: 1500 entries of 2 KiB (3 MiB of
    // records through a 1 MiB ring), so the leader purged past it.
    let big = "z".repeat(2048);
    let mut last = 0;
    for k in 0..1500u32 {
        let (index, _) = c
            .propose_recorded(&history, &format!("{big}-{k}"), T)
            .await
            .unwrap();
        last = index;
    }
    let purged = c.node(leader).log_store().with_wal(|w| w.first_index());
    assert!(
        purged > 10,
        "the leader purged its log (first index {purged})"
    );
    c.boot(lagging).await.unwrap();
    c.wait_applied(last, T).await;
    assert_nothing_lost(&c, &history);
    assert!(
        c.data_dir(lagging).join("snapshot").exists(),
        "the lagging node installed a snapshot"
    );
}

// Of writers_at_full_speed_through_a_small_ring_with_a_follower_down_never_stop_raft:
// writers, bytes per entry, the ring's size, and how many rings' worth pass.
const WRITERS: u64 = 4;
const ENTRY_BYTES: usize = 16 << 10;
const RING_BYTES: u64 = 1 << 20;
const RINGS: u64 = 10;

/// Writer `w`: `per_writer` entries of `ENTRY_BYTES` through `node` (which
/// leads as `leader`), in a session of its own; the highest index answered.
async fn write_at_full_speed(
    node: Node,
    history: History,
    w: u64,
    leader: u64,
    per_writer: u64,
) -> u64 {
    let process = history.fresh_process();
    let mut last = 0;
    for seq in 1..=per_writer {
        let fill = char::from(b'a' + w as u8).to_string().repeat(ENTRY_BYTES);
        let text = format!("{fill}-{w}-{seq}");
        let data = text.clone().into_bytes();
        let op = history.invoke_append_via(process, leader, text);
        // A session: a retry after an unknown outcome is applied
        // once.
        let session = Session {
            client_id: 100 + w,
            seq,
        };
        let deadline = tokio::time::Instant::now() + T;
        let index = loop {
            match node.propose_in_session(session, data.clone()).await {
                Ok(r) => break r.index,
                // Backpressure: nothing was proposed. (The
                // deadline is only a safety net against a hang.)
                Err(NodeError::Busy(_)) if tokio::time::Instant::now() < deadline + 3 * T => {}
                Err(e @ (NodeError::NotLeader { .. } | NodeError::Unknown(_)))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(error = %e, "proposal retried");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("writer {w}, proposal {seq}: {e}"),
            }
        };
        history.ok(op, index);
        last = last.max(index);
    }
    last
}

/// Issue 10, item 2: a full ring is backpressure, never a fatal storage
/// error. Several writers at full speed push ten rings' worth of entries
/// through a 1 MiB ring while a follower is down (a leader's purge waits for
/// the replication streams that use the entries) and while the entries kept
/// behind a snapshot (`keep_after_snapshot`, 100 of 16 KiB) would not fit
/// the ring. On the old code the leader's ring filled and Raft stopped
/// ("ring full" from `append` after 30 s); now writers wait for room (or are
/// told "busy" and retry), the node keeps committing, the stopped follower
/// catches up by snapshot, and nothing acknowledged is lost. Bounded by
/// counts, not by time: the ring must wrap whatever the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_at_full_speed_through_a_small_ring_with_a_follower_down_never_stop_raft() {
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 17, |cfg| {
        cfg.ring_capacity = RING_BYTES;
        cfg.keep_after_snapshot = 100;
        cfg.snapshot_every_entries = 10_000;
        // Leadership stays put on a loaded machine (not required: writers
        // follow the leader), so that one ring sees every entry.
        cfg.election_timeout_ms = (1500, 3000);
    })
    .await;
    let history = History::new();
    write_n(&c, "warm", 5, &history).await;
    let leader = c.leader().await;
    let down = c.follower_of(leader);
    c.stop(down).await;
    let tail_before = c.node(leader).log_store().with_wal(|w| w.ring().tail_lsn());

    let per_writer = RINGS * RING_BYTES / ENTRY_BYTES as u64 / WRITERS + 1;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let node: Node = c.node(leader).clone();
        let history = history.clone();
        writers.push(tokio::spawn(write_at_full_speed(
            node, history, w, leader, per_writer,
        )));
    }
    let mut last = 0;
    for writer in writers {
        last = last.max(writer.await.unwrap());
    }

    // The node that led under load is still a member that commits.
    let op = history.invoke_append_via(history.fresh_process(), leader, "after the load");
    let (index, _) = c
        .node(leader)
        .propose(b"after the load".to_vec())
        .await
        .expect("the node that led under load still commits");
    history.ok(op, index);
    last = last.max(index);
    c.node(leader).wait_applied(last, T).await.unwrap();
    let (head, tail, first_index) = c.node(leader).log_store().with_wal(|w| {
        let r = w.ring();
        (r.head_lsn(), r.tail_lsn(), r.first_index())
    });
    assert!(
        tail - tail_before >= RINGS * RING_BYTES,
        "the ring wrapped {} times ({} bytes written)",
        (tail - tail_before) / RING_BYTES,
        tail - tail_before
    );
    assert!(tail - head <= RING_BYTES);
    assert!(
        first_index > 6,
        "the log was purged past the stopped follower (first index {first_index})"
    );

    // The stopped follower catches up from the leader's segments (its ring
    // gave those entries back long ago), in batches cut to fit the
    // follower's ring, without a snapshot (none was taken: 10,000 entries
    // between snapshots).
    c.boot(down).await.unwrap();
    c.wait_applied(last, T).await;
    assert_nothing_lost(&c, &history);
    assert!(
        !c.data_dir(down).join("snapshot").exists(),
        "the stopped follower caught up from the segments, not by a snapshot"
    );
}

/// Four proposals to the frozen old leader, each recorded with its outcome
/// (an answer within 60 s or none).
async fn propose_to_the_stale_leader(old_node: Node, stale_history: History, old: u64) {
    let mut writers = Vec::new();
    for w in 0..4u32 {
        let node = old_node.clone();
        let history = stale_history.clone();
        writers.push(tokio::spawn(async move {
            let data = format!("stale-{w}");
            let op = history.invoke_append_via(history.fresh_process(), old, &data);
            let r = tokio::time::timeout(Duration::from_secs(60), node.propose(data.into_bytes()))
                .await;
            match r {
                Ok(Ok((index, _))) => history.ok(op, index),
                Ok(Err(e)) => history.info(op, e.to_string()),
                Err(_) => history.info(op, "no answer in 60 s"),
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
}

/// Thirty writes through whichever of `followers` leads; the last index.
async fn write_through_the_new_leader(c: &Cluster, followers: &[u64], history: &History) -> u64 {
    let mut last = 0;
    for k in 0..30u32 {
        let data = format!("new-{k}");
        // NotLeader proposed nothing: the same operation is tried again.
        let mut op = Some(history.invoke_append(history.fresh_process(), &data));
        loop {
            let leader = c.leader_among(followers, T).await;
            match c.node(leader).propose(data.clone().into_bytes()).await {
                Ok((index, _)) => {
                    history.ok(op.take().expect("completed once"), index);
                    last = index;
                    break;
                }
                Err(NodeError::NotLeader { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    last
}

/// One-sided requests the NICs of `followers` refused, summed.
fn refused_by_nics(c: &Cluster, followers: &[u64]) -> u64 {
    followers
        .iter()
        .map(|id| {
            c.node(*id)
                .device()
                .counters()
                .iter()
                .find(|(k, _)| k == "refused_requests")
                .map_or(0, |(_, v)| *v)
        })
        .sum()
}

/// The logs of nodes 1 to 3 agree entry by entry over their common suffix.
fn assert_the_logs_agree(c: &Cluster) {
    let logs: Vec<Vec<(u64, u64)>> = (1..=3)
        .map(|id| {
            c.node(id).log_store().with_wal(|w| {
                let r = w.ring();
                (r.first_index()..r.next_index())
                    .map(|i| (i, r.term_of(i).unwrap()))
                    .collect()
            })
        })
        .collect();
    let common = logs.iter().map(Vec::len).min().unwrap();
    for l in &logs {
        let (a, b) = (l.len() - common, logs[0].len() - common);
        assert_eq!(&l[a..], &logs[0][b..], "logs diverge");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_leader_writes_nothing_valid_and_steps_down() {
    // Queue pairs wait far longer (≈17 s) than the freeze lasts, so that the
    // followers' connections to the frozen leader are still up when it
    // resumes: its held WRITEs then meet the followers' NICs. (Had a
    // follower given up on the connection first, they would be dropped with
    // it: safe too, but not what this test wants to show. With a window of
    // ≈2 s, a loaded machine did give up first.)
    let c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 8, |cfg| {
        cfg.conn.ack_timeout_exp = 20;
    })
    .await;
    let history = History::new();
    let last_before = write_n(&c, "before", 20, &history).await;
    // Every follower holds those: what the frozen leader WRITEs from now on
    // is the stale proposals'.
    c.wait_applied(last_before, T).await;
    let old = c.leader().await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    // Freeze the old leader's fabric first, then propose to it: it still
    // leads in its own eyes and posts the records' WRITEs, which the frozen
    // fabric holds (in flight) until the unfreeze. Waiting for the posts,
    // not for a time, makes sure they exist on any machine.
    c.fabric.pause(&format!("node{old}"));
    let old_term = c.node(old).status().term;
    // The checker's stale-leader rules hold from here to the heal: nothing
    // sent to the old leader is acknowledged meanwhile, and none of it ends
    // up in a log under its term.
    history.leader_isolated(old, old_term);
    let written_before = c.node(old).metrics().bytes_written.get();
    let old_node = c.node(old).clone();
    let stale_history = history.clone();
    let stale_writer = tokio::spawn(propose_to_the_stale_leader(old_node, stale_history, old));
    let deadline = tokio::time::Instant::now() + T;
    while c.node(old).metrics().bytes_written.get() == written_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the frozen leader posted no WRITE of the stale proposals"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.leader_among(&followers, T).await;
    let last = write_through_the_new_leader(&c, &followers, &history).await;
    let new = c.leader_among(&followers, T).await;
    // The new leader took every follower's fence (held while it leads).
    for id in &followers {
        let fence = c.node(*id).log_store().fence();
        assert_eq!(fence.leader_id(), new, "node {id}'s fence");
    }
    let refused = |c: &Cluster| refused_by_nics(c, &followers);
    let refused_before = refused(&c);
    // Unfreeze: the old leader's held WRITEs and messages arrive now.
    history.leader_healed(old, old_term);
    c.fabric.resume(&format!("node{old}"));
    stale_writer.await.unwrap();
    // The old leader steps down and follows.
    let leader = c.leader().await;
    assert_ne!(leader, old);
    c.wait_applied(last, T).await;
    assert_nothing_lost(&c, &history);
    // No follower's log holds an entry of the old leader's term written
    // after the new leader's first entry, and the logs agree entry by entry.
    assert_the_logs_agree(&c);
    let refused_after = refused(&c);
    tracing::info!(
        refused_before,
        refused_after,
        "one-sided requests refused by the followers' NICs"
    );
    assert!(
        refused_after > refused_before,
        "the stale leader's held WRITEs reached the followers after the unfreeze and were refused by their NICs"
    );
}

/// A leader that lost the tail of its ring while it was down (torn or
/// damaged: records its followers hold and the cluster committed) must not
/// come back as leader of its old term: with the same term, its new entries
/// would take log ids that the followers already hold with other data, and
/// they would keep theirs (found by the Jepsen harness: divergence and
/// lost acknowledged appends after kill -9 + tail damage of the leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_that_lost_its_tail_does_not_reuse_its_term() {
    // Long election timeouts: the followers stay quiet while the leader is
    // down, so it comes back before anyone else stands for election.
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 16, |cfg| {
        cfg.election_timeout_ms = (2500, 3000);
    })
    .await;
    let history = History::new();
    let last = write_n_applied(&c, "before", 20, &history).await;
    let leader = c.leader().await;
    let term = c.node(leader).status().term;
    c.stop(leader).await;
    // Lose the leader's last three entries (zeroes from there on).
    damage::zero_from(&c, leader, last - 2);
    c.boot(leader).await.unwrap();
    write_n_applied(&c, "after", 10, &history).await;
    assert_nothing_lost(&c, &history);
    assert!(
        c.node(c.leader().await).status().term > term,
        "leadership went through a new election"
    );
}

/// The leader removes itself. openraft alpha.37 keeps such a leader leading
/// until it steps down, and a membership change proposed on it meanwhile
/// tripped the core's assertion "Only leader is allowed to call
/// update_effective_membership()": the core panicked and stopped, and the
/// node went on serving with a dead core. `Node::remove` ran two changes
/// (remove the voters, then the nodes), so removing the leader always
/// proposed the second on the removed leader: the old code answered
/// `Stopped("panicked")` here. The Jepsen membership nemesis did this
/// whenever leadership moved between its choice of a node and the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_removes_itself_and_the_others_go_on() {
    let mut c = Cluster::start(Kind::Inproc, 3, Durability::Memory, 7).await;
    let history = History::new();
    write_n_applied(&c, "before", 3, &history).await;
    let leader = c.leader().await;
    let removed = c.node(leader);
    removed
        .remove([leader].into())
        .await
        .expect("the leader removes itself");
    // A retry (a client that timed out) reaches the removed leader: it is
    // refused, clearly, and the core goes on.
    match removed.remove([leader].into()).await {
        Err(NodeError::NotMember(id)) => assert_eq!(id, leader),
        Err(NodeError::NotLeader { .. }) => {} // it stepped down already
        other => panic!("a change on the removed leader: {other:?}"),
    }
    removed
        .raft()
        .with_raft_state(|_| ())
        .await
        .expect("the removed leader's core still runs");
    // The others elect a leader among themselves and commit.
    let rest: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
    let next = c.leader_among(&rest, T).await;
    let status = c.node(next).status();
    assert_eq!(status.voters, rest.iter().copied().collect::<BTreeSet<_>>());
    assert!(!status.members.contains_key(&leader), "{status:?}");
    // The removed node is out of the cluster: stopped, the others write.
    c.stop(leader).await;
    write_n_applied(&c, "after", 3, &history).await;
    assert_nothing_lost(&c, &history);
}

/// A membership change whose caller gives up (a client's deadline) still
/// holds the node's one-at-a-time lock until openraft answers it: the next
/// change waits for it. Were the lock the caller's, it would be released
/// with the caller while openraft still held the first change uncommitted,
/// and the next would meet it in the core (openraft refuses a change while
/// another is uncommitted: `InProgress`; a change on a leader that removed
/// itself meanwhile panicked the core, see above).
#[test]
fn a_membership_change_given_up_still_holds_the_next_one_back() {
    ringraft_testkit::inproc::paused_runtime().block_on(async {
        let c = Cluster::start_deterministic(0x3e3b, |_| {}).await;
        let leader = c.leader().await;
        c.propose(b"x".to_vec(), T).await.expect("a commit");
        let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
        let addr = |id: u64| c.members[&id].config.listen.clone();
        // Nothing from the leader reaches the followers: no change commits.
        for f in &followers {
            c.fabric.cut_one_way(&addr(leader), &addr(*f));
        }
        let node = c.node(leader).clone();
        let first = tokio::time::timeout(
            Duration::from_millis(20),
            node.remove([followers[0]].into()),
        )
        .await;
        assert!(
            first.is_err(),
            "a change committed through the cut: {first:?}"
        );
        let next = tokio::spawn({
            let node = node.clone();
            let other = followers[1];
            async move { node.remove([other].into()).await }
        });
        // Well within the followers' lease of the leader (virtual time).
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !next.is_finished(),
            "the next change did not wait for the one given up: {:?}",
            next.await
        );
        c.fabric.heal();
        tokio::time::timeout(T, next)
            .await
            .expect("the next change finishes")
            .expect("the task")
            .expect("the next change, after the first");
        let status = c.node(leader).status();
        assert_eq!(status.voters, BTreeSet::from([leader]), "{status:?}");
    });
}

/// A core that stops on its own is reported: [`Node::core_stopped`]
/// resolves with why (`ringraft serve` then exits instead of serving with a
/// dead core, answering a stale "leader" forever as it did in the Jepsen
/// runs). The panic is openraft's own: the change that `Node::remove` no
/// longer proposes (a membership change on a leader that removed itself),
/// sent to openraft directly. It is a `debug_assert!` in openraft, hence
/// debug builds only.
#[cfg(debug_assertions)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_that_panics_is_reported() {
    use openraft::ChangeMembers;
    let c = Cluster::start(Kind::Inproc, 3, Durability::Memory, 8).await;
    let leader = c.leader().await;
    let node = c.node(leader).clone();
    let stopped = tokio::spawn({
        let node = node.clone();
        async move { node.core_stopped().await }
    });
    let raft = node.raft();
    raft.change_membership(ChangeMembers::RemoveVoters([leader].into()), false)
        .await
        .expect("the leader removes itself");
    assert!(!stopped.is_finished(), "the core runs on after the removal");
    let refused = raft
        .change_membership(ChangeMembers::RemoveNodes([leader].into()), false)
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let why = tokio::time::timeout(T, stopped)
        .await
        .expect("core_stopped resolves")
        .unwrap();
    assert!(why.contains("panicked"), "{why}");
}
