//! Reads cost what they promise: concurrent linearizable reads on a leader
//! share leadership-confirmation rounds (openraft's ReadIndex queues the
//! reads that arrive while a round is in flight behind the next one)
//! instead of one round each; a follower's concurrent reads share their
//! calls to the leader the same way; and a follower keeps many forwarded
//! calls in flight on its links to the leader.
//!
//! Three nodes on the in-process fabric, one thread, paused time: the
//! counts are a function of the seed.

use std::time::Duration;

use ringraft::ReadConsistency;
use ringraft_testkit::inproc::{Cluster, paused_runtime};

const SEED: u64 = 0x7ead;
const READS: u64 = 64;
/// A safety net against hangs (virtual time); never what a test asserts.
const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn concurrent_linearizable_reads_share_confirmation_rounds() {
    paused_runtime().block_on(async {
        let c = Cluster::start_deterministic(SEED, |_| {}).await;
        let leader = c.leader().await;
        c.propose(b"x".to_vec(), PATIENCE).await.expect("a commit");
        let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();
        let served = || -> u64 {
            followers
                .iter()
                .map(|id| c.node(*id).metrics().requests_served.get())
                .sum()
        };
        let node = c.node(leader).clone();
        let before = served();
        let reads = (0..READS).map(|_| {
            let node = node.clone();
            async move { node.read(ReadConsistency::Linearizable, |_| ()).await }
        });
        let answers = tokio::time::timeout(PATIENCE, futures::future::join_all(reads))
            .await
            .expect("the reads finish");
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        let requests = served() - before;
        // Shown with --nocapture.
        println!("{READS} concurrent reads: {requests} requests at the followers");
        // One round asks each follower once; a few rounds (and a heartbeat
        // that falls in the window) are fine, one per read is not.
        assert!(
            requests <= 4 * followers.len() as u64,
            "{READS} reads took {requests} requests at {} followers: a round per read",
            followers.len()
        );
    });
}

/// Concurrent calls on a follower, forwarded to the leader.
const FORWARDED: u64 = 32;

/// A follower's concurrent reads share their calls to the leader: with
/// the leader's answers held, the first linearizable and the first lease
/// read each reach the leader, the others wait for the next call of their
/// kind; once the cut heals, one more call of each kind answers them all.
/// Before, each read was its own forwarded call (32 here).
#[test]
fn a_followers_concurrent_reads_share_their_calls_to_the_leader() {
    paused_runtime().block_on(async {
        let c = Cluster::start_deterministic(SEED, |_| {}).await;
        let leader = c.leader().await;
        c.propose(b"x".to_vec(), PATIENCE).await.expect("a commit");
        let follower = c.follower_of(leader);
        c.node(follower)
            .read(ReadConsistency::Linearizable, |_| ())
            .await
            .expect("a forwarded read");
        let addr = |id: u64| c.members[&id].config.listen.clone();
        let served = || c.node(leader).metrics().requests_served.get();
        let before = served();
        c.fabric.cut_one_way(&addr(leader), &addr(follower));
        let node = c.node(follower).clone();
        let reads: Vec<_> = (0..FORWARDED)
            .map(|k| {
                let node = node.clone();
                let consistency = if k % 2 == 0 {
                    ReadConsistency::Linearizable
                } else {
                    ReadConsistency::Lease
                };
                tokio::spawn(async move { node.read(consistency, |_| ()).await })
            })
            .collect();
        // Polled in virtual time: the first call of each kind arrives
        // within milliseconds.
        tokio::time::timeout(PATIENCE, async {
            while served() - before < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the first read of each kind reaches the leader");
        // However long the answers are held (virtual time), no more come.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let held = served() - before;
        assert!(reads.iter().all(|r| !r.is_finished()), "answers were held");
        c.fabric.heal();
        for read in reads {
            tokio::time::timeout(PATIENCE, read)
                .await
                .expect("the read finishes")
                .expect("the task")
                .expect("the read");
        }
        let calls = served() - before;
        println!(
            "{FORWARDED} concurrent reads on a follower: {held} calls while held, {calls} in all"
        );
        assert_eq!(
            held, 2,
            "the reads that came later waited for the next call of their kind"
        );
        assert_eq!(
            calls, 4,
            "one more call of each kind answered all {FORWARDED} reads"
        );
    });
}

/// A follower forwards concurrent calls to its leader over a few links,
/// many in flight on each: with everything from the leader to the follower
/// held back (its answers too), every call still reaches the leader, and
/// all are answered once the cut heals. Before, a link carried one
/// exchange at a time (a follower kept up to 8 links, one on `rdma`): as
/// many calls reached the leader as links were open, and the rest waited.
#[test]
fn a_follower_keeps_many_forwarded_calls_in_flight() {
    paused_runtime().block_on(async {
        let c = Cluster::start_deterministic(SEED, |_| {}).await;
        let leader = c.leader().await;
        c.propose(b"x".to_vec(), PATIENCE).await.expect("a commit");
        let follower = c.follower_of(leader);
        // As many concurrent forwarded proposals first: the follower opens
        // its links to the leader as the open ones get busy.
        let warm = (0..FORWARDED).map(|k| c.node(follower).propose(vec![k as u8]));
        for proposal in futures::future::join_all(warm).await {
            proposal.expect("a forwarded proposal");
        }
        let addr = |id: u64| c.members[&id].config.listen.clone();
        let served = || c.node(leader).metrics().requests_served.get();
        let before = served();
        // Everything from the leader to the follower waits (its answers too).
        c.fabric.cut_one_way(&addr(leader), &addr(follower));
        let node = c.node(follower).clone();
        let calls: Vec<_> = (0..FORWARDED)
            .map(|k| {
                let node = node.clone();
                tokio::spawn(async move { node.propose(vec![k as u8]).await.map(|(i, _)| i) })
            })
            .collect();
        // Polled in virtual time: the calls arrive within milliseconds, or
        // never.
        let arrived = tokio::time::timeout(PATIENCE, async {
            while served() - before < FORWARDED {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let reached = served() - before;
        println!("{FORWARDED} forwarded calls, answers held: {reached} reached the leader");
        assert!(
            arrived.is_ok(),
            "{reached} of {FORWARDED} forwarded calls reached the leader while none was answered"
        );
        let answered = calls.iter().filter(|r| r.is_finished()).count();
        assert_eq!(
            answered, 0,
            "calls answered while the leader's answers were held"
        );
        c.fabric.heal();
        let mut indexes = Vec::new();
        for call in calls {
            let answer = tokio::time::timeout(PATIENCE, call)
                .await
                .expect("the call finishes")
                .expect("the task");
            indexes.push(answer.expect("answered"));
        }
        indexes.sort_unstable();
        indexes.dedup();
        assert_eq!(indexes.len() as u64, FORWARDED, "one entry per proposal");
    });
}
