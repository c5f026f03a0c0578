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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_hca_atomics_a_leader_fences_itself_through_loopback() {
    let cluster = Cluster::start(Kind::InprocHca, 3, Durability::Memory, 11).await;
    let leader = cluster.leader().await;
    let (index, _) = cluster.propose(b"x".to_vec(), T).await.unwrap();
    cluster.wait_applied(index, T).await;
    let (cpu, loopback) = cluster.node(leader).self_fences();
    assert_eq!(cpu, 0, "never a CPU CAS on an HCA device");
    assert!(
        loopback > 0,
        "the leader raised its own fence through the loopback connection"
    );
    let fence = cluster.node(leader).log_store().fence();
    assert_eq!(fence.leader_id(), leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_by_consistency() {
    use ringraft::{NodeError, ReadConsistency};
    let cluster = Cluster::start(Kind::Inproc, 3, Durability::Memory, 12).await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let (index, _) = cluster.propose(b"visible".to_vec(), T).await.unwrap();
    // The recorder's snapshot is its applied log: decode and look.
    let has = |bytes: Vec<u8>| {
        let (log, _): (ringraft_tests::AppliedLog, _) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        log.entries
            .iter()
            .any(|(i, d)| *i == index && d == b"visible")
    };
    for consistency in [ReadConsistency::Linearizable, ReadConsistency::Lease] {
        let snapshot = cluster
            .node(leader)
            .read(consistency, |sm| sm.snapshot())
            .await
            .unwrap();
        assert!(
            has(snapshot),
            "{consistency:?} read on the leader sees the committed write"
        );
    }
    // A follower's linearizable read: the leader confirms and gives its read
    // index, the follower waits until it applied that far and reads locally.
    for consistency in [ReadConsistency::Linearizable, ReadConsistency::Lease] {
        let snapshot = cluster
            .node(follower)
            .read(consistency, |sm| sm.snapshot())
            .await
            .unwrap();
        assert!(
            has(snapshot),
            "{consistency:?} read on a follower sees the committed write"
        );
    }
    // A proposal made on a follower is forwarded to the leader.
    let (forwarded, _) = cluster
        .node(follower)
        .propose(b"via follower".to_vec())
        .await
        .unwrap();
    assert!(forwarded > index);
    // With no leader reachable, a linearizable read fails rather than lie.
    for id in [1, 2, 3] {
        if id != follower {
            cluster
                .fabric
                .partition(&[&format!("node{follower}")], &[&format!("node{id}")]);
        }
    }
    let cut = tokio::time::timeout(
        Duration::from_secs(15),
        cluster
            .node(follower)
            .read(ReadConsistency::Linearizable, |sm| sm.snapshot()),
    )
    .await;
    assert!(
        !matches!(cut, Ok(Ok(_))),
        "a partitioned follower served a linearizable read"
    );
    cluster.fabric.heal();
    if let Ok(Err(e)) = &cut {
        assert!(
            matches!(
                e,
                NodeError::NotLeader { .. } | NodeError::Unknown(_) | NodeError::Timeout(_)
            ),
            "{e}"
        );
    }
    cluster.node(follower).wait_applied(index, T).await.unwrap();
    let snapshot = cluster
        .node(follower)
        .read(ReadConsistency::Stale, |sm| sm.snapshot())
        .await
        .unwrap();
    assert!(
        has(snapshot),
        "a stale read after the follower applied sees it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_transfers_to_the_chosen_node() {
    let cluster = Cluster::start(Kind::Inproc, 3, Durability::Memory, 13).await;
    let leader = cluster.leader().await;
    let target = (1..=3).find(|id| *id != leader).unwrap();
    cluster.propose(b"before".to_vec(), T).await.unwrap();
    cluster.node(leader).transfer_leader(target).await.unwrap();
    let deadline = tokio::time::Instant::now() + T;
    while cluster.leader_among(&[1, 2, 3], T).await != target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "leadership did not move to {target}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (index, _) = cluster.propose(b"after".to_vec(), T).await.unwrap();
    cluster.wait_applied(index, T).await;
    for id in 1..=3 {
        let cmds: Vec<Vec<u8>> = user_commands(&cluster.applied(id));
        assert_eq!(
            cmds,
            vec![b"before".to_vec(), b"after".to_vec()],
            "node {id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_across_retries_with_sessions() {
    use ringraft::Session;
    let cluster = Cluster::start(Kind::Inproc, 3, Durability::Memory, 14).await;
    let leader = cluster.leader().await;
    let s = Session {
        client_id: 42,
        seq: 1,
    };
    let first = cluster
        .node(leader)
        .propose_in_session(s, b"once".to_vec())
        .await
        .unwrap();
    assert!(!first.duplicate);
    // A retry (lost answer, leader change...) is answered, not applied.
    let retry = cluster
        .node(leader)
        .propose_in_session(s, b"once".to_vec())
        .await
        .unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.index, first.index);
    assert_eq!(retry.data, first.data);
    let next = cluster
        .node(leader)
        .propose_in_session(
            Session {
                client_id: 42,
                seq: 2,
            },
            b"twice".to_vec(),
        )
        .await
        .unwrap();
    cluster.wait_applied(next.index, T).await;
    for id in 1..=3 {
        assert_eq!(
            user_commands(&cluster.applied(id)),
            vec![b"once".to_vec(), b"twice".to_vec()],
            "node {id} applied the retried command once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_refused() {
    use ringraft::{Fabric, NodeBuilder, NodeConfig};
    // Election timeouts well above any scheduling hiccup of a loaded
    // machine: the term may change only if the intruder disturbed it.
    let cluster = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 15, |cfg| {
        cfg.election_timeout_ms = (3000, 4000);
    })
    .await;
    let leader = cluster.leader().await;
    let term = cluster.node(leader).status().term;
    let rejected = |id: u64| {
        cluster
            .node(id)
            .device()
            .counters()
            .iter()
            .find(|(k, _)| k == "rejected_handshakes")
            .map_or(0, |(_, v)| *v)
    };
    let rejected_before = [rejected(1), rejected(2)];
    // Same secret, same fabric, another cluster id: it campaigns at our
    // nodes, which refuse it at the handshake.
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(9, dir.path(), "intruder");
    config.cluster_id = 0xBAD;
    config.lock_memory = false;
    config.ring_capacity = 4 << 20;
    config.peers = [
        (9, "intruder".to_string()),
        (1, "node1".into()),
        (2, "node2".into()),
    ]
    .into();
    let intruder = NodeBuilder::new(config)
        .fabric(Fabric::Inproc(cluster.fabric.clone()))
        .secret(ringraft_tests::SECRET.to_vec())
        .state_machine(ringraft_tests::Recorder::default())
        .start()
        .await
        .unwrap();
    intruder.initialize().await.unwrap();
    // Until both nodes it knows refused it (an event, not a time).
    let deadline = tokio::time::Instant::now() + T;
    while rejected(1) == rejected_before[0] || rejected(2) == rejected_before[1] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the intruder was not refused by nodes 1 and 2: {:?}",
            [rejected(1), rejected(2)]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(
        intruder.status().state,
        "Leader",
        "it cannot win votes it cannot even ask for"
    );
    assert_eq!(
        cluster.node(cluster.leader().await).status().term,
        term,
        "our term was not disturbed"
    );
    let (index, _) = cluster.propose(b"still fine".to_vec(), T).await.unwrap();
    cluster.wait_applied(index, T).await;
    intruder.shutdown().await;
}

/// A proposal forwarded by a follower whose caller gives up mid-way (a
/// client's request cancelled) must not leave its answer behind for the
/// next forwarded proposal: every answer names the index of its own entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_forwarded_proposal_never_answers_the_next_one() {
    let cluster = Cluster::start(Kind::Inproc, 3, Durability::Memory, 15).await;
    let leader = cluster.leader().await;
    let follower = if leader == 1 { 2 } else { 1 };
    let mut abandoned = 0;
    for k in 0..60u64 {
        // Give up after 0..3 ms: sometimes before forwarding, sometimes
        // with the request at the leader and its answer still to come.
        let patience = Duration::from_micros((k * 397) % 3000);
        let cancelled = tokio::time::timeout(
            patience,
            cluster
                .node(follower)
                .propose(format!("abandoned-{k}").into_bytes()),
        )
        .await;
        abandoned += u32::from(cancelled.is_err());
        let data = format!("checked-{k}").into_bytes();
        let (index, _) = cluster.node(follower).propose(data.clone()).await.unwrap();
        cluster.wait_applied(index, T).await;
        let applied = cluster.applied(follower);
        let at = applied.entries.iter().find(|(i, _)| *i == index);
        assert_eq!(
            at.map(|(_, d)| d),
            Some(&data),
            "the answer to proposal {k} names index {index}, which holds another entry"
        );
    }
    assert!(abandoned > 10, "the test abandoned proposals ({abandoned})");
}
