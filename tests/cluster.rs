//! Clusters elect, commit and apply in order; leaders fail over; restarted
//! nodes recover from ring and snapshot. On the inproc fabric, and the
//! basic cases on tcp over loopback too.

use std::time::Duration;

use ringraft::Durability;
use ringraft_tests::{Cluster, Kind};

const T: Duration = Duration::from_secs(30);

fn user_commands(log: &ringraft_tests::AppliedLog) -> Vec<Vec<u8>> {
    log.entries.iter().map(|(_, d)| d.clone()).collect()
}

async fn elect_commit_apply(kind: Kind, n: u64, durability: Durability) {
    let cluster = Cluster::start(kind, n, durability, 1).await;
    let leader = cluster.leader().await;
    let mut last = 0;
    for k in 0..50u32 {
        let (index, answer) = cluster
            .propose(format!("cmd-{k}").into_bytes(), T)
            .await
            .unwrap();
        assert!(index > last, "indexes grow");
        last = index;
        assert_eq!(
            u64::from_le_bytes(answer.try_into().unwrap()),
            k as u64 + 1,
            "answer = applied count"
        );
    }
    cluster.wait_applied(last, T).await;
    let expected: Vec<Vec<u8>> = (0..50u32)
        .map(|k| format!("cmd-{k}").into_bytes())
        .collect();
    for id in cluster.running() {
        assert_eq!(
            user_commands(&cluster.applied(id)),
            expected,
            "node {id} applied everything in order"
        );
    }
    // The followers' entries arrived one-sided: their leader WROTE records.
    assert!(
        cluster.node(leader).metrics().bytes_written.get() > 0,
        "one-sided WRITEs happened"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_inproc_memory() {
    elect_commit_apply(Kind::Inproc, 3, Durability::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_inproc_fsync() {
    elect_commit_apply(Kind::Inproc, 5, Durability::Fsync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_tcp_memory() {
    elect_commit_apply(Kind::Tcp, 3, Durability::Memory).await;
}
