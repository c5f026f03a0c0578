//! Reads cost what they promise: concurrent linearizable reads on a leader
//! share leadership-confirmation rounds (openraft's ReadIndex queues the
//! reads that arrive while a round is in flight behind the next one)
//! instead of one round each.
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
