//! Pipelined appends (`Node::submit_batch`, the node side of the client
//! API's `AppendStream`): batches submitted one after the other land in
//! the log in that order without waiting for each other's commits, on a
//! leader and through a follower, and a session keeps every record exactly
//! once and in order through a leadership transfer in the middle (the
//! batches submitted after it find that their node no longer leads, and are
//! forwarded when their answers are asked for, in order).
//!
//! Three nodes on the in-process fabric, one thread, paused time: the
//! durations compared are virtual, a function of the seed.

use std::time::Duration;

use ringraft::{InFlight, Node, NodeError, Session};
use ringraft_testkit::inproc::{Cluster, paused_runtime};
use tokio::time::Instant;

const SEED: u64 = 0x9193;
const BATCHES: u64 = 32;
const PER_BATCH: u64 = 8;
/// A safety net against hangs (virtual time); never what a test asserts.
const PATIENCE: Duration = Duration::from_secs(60);

async fn cluster() -> Cluster {
    let c = Cluster::start_deterministic(SEED, |_| {}).await;
    c.propose(b"warm-up".to_vec(), PATIENCE)
        .await
        .expect("a commit");
    c
}

/// Batch `b`'s records: `client:seq` for seqs `b * PER_BATCH + 1 ..`.
fn batch(client_id: u64, b: u64) -> (Session, Vec<Vec<u8>>) {
    let first = b * PER_BATCH + 1;
    let records = (first..first + PER_BATCH)
        .map(|seq| format!("{client_id}:{seq}").into_bytes())
        .collect();
    (
        Session {
            client_id,
            seq: first,
        },
        records,
    )
}

/// Submits every batch before asking for any answer; returns each
/// record's index, in submission order.
async fn pipelined(node: &Node, client_id: u64, batches: u64) -> Vec<u64> {
    let in_flight = submitted(node, client_id, 0..batches).await;
    answered(node, client_id, in_flight).await
}

/// Submits batches `range`, one after the other.
async fn submitted(
    node: &Node,
    client_id: u64,
    range: std::ops::Range<u64>,
) -> Vec<(u64, InFlight)> {
    let mut in_flight = Vec::new();
    for b in range {
        let (session, records) = batch(client_id, b);
        let submitted = node.submit_batch(Some(session), records).await;
        in_flight.push((b, submitted.expect("submitted")));
    }
    in_flight
}

/// The answers to `in_flight`, in order: each record's index. A batch that
/// fails is proposed again with the same session (as a client retries it).
async fn answered(node: &Node, client_id: u64, in_flight: Vec<(u64, InFlight)>) -> Vec<u64> {
    let mut indexes = Vec::new();
    for (b, batch_in_flight) in in_flight {
        let answers = match batch_in_flight.answers().await {
            Ok(answers) => answers,
            Err(e) => retried(node, client_id, b, e).await,
        };
        indexes.extend(answers.iter().map(|a| a.index));
    }
    indexes
}

/// Batch `b` proposed again after `error`, as a client retries it.
async fn retried(node: &Node, client_id: u64, b: u64, error: NodeError) -> Vec<ringraft::Response> {
    assert!(
        matches!(
            error,
            NodeError::OutOfOrder { .. } | NodeError::Unknown(_) | NodeError::NotLeader { .. }
        ),
        "batch {b}: {error}"
    );
    let (session, records) = batch(client_id, b);
    for _ in 0..20 {
        match node.propose_batch(Some(session), records.clone()).await {
            Ok(answers) => return answers,
            Err(NodeError::OutOfOrder { .. } | NodeError::Unknown(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("batch {b} retried: {e}"),
        }
    }
    panic!("batch {b} was refused 20 times")
}

/// The records' data at `indexes`, read from `node`'s log.
async fn data_at(node: &Node, indexes: &[u64]) -> Vec<Vec<u8>> {
    let (first, last) = (indexes[0], *indexes.last().expect("records"));
    let read = node
        .read_log(first, last, u64::MAX)
        .await
        .expect("the log reads");
    indexes
        .iter()
        .map(|i| {
            read.records
                .iter()
                .find(|r| r.index == *i)
                .unwrap_or_else(|| panic!("index {i} carries a record"))
                .data
                .clone()
        })
        .collect()
}

fn expected(client_id: u64, batches: u64) -> Vec<Vec<u8>> {
    (1..=batches * PER_BATCH)
        .map(|seq| format!("{client_id}:{seq}").into_bytes())
        .collect()
}

#[test]
fn pipelined_batches_land_in_order_and_do_not_wait_for_each_other() {
    paused_runtime().block_on(async {
        let c = cluster().await;
        let leader = c.node(c.leader().await).clone();

        let started = Instant::now();
        let indexes = tokio::time::timeout(PATIENCE, pipelined(&leader, 7, BATCHES))
            .await
            .expect("answered");
        let pipelined_took = started.elapsed();
        assert!(
            indexes.windows(2).all(|w| w[0] + 1 == w[1]),
            "consecutive indexes in submission order: {indexes:?}"
        );
        c.wait_applied(*indexes.last().expect("records"), PATIENCE)
            .await;
        assert_eq!(data_at(&leader, &indexes).await, expected(7, BATCHES));

        // The same batches one after the other, each answered before the
        // next goes: one commit round each.
        let started = Instant::now();
        for b in 0..BATCHES {
            let (session, records) = batch(8, b);
            leader
                .propose_batch(Some(session), records)
                .await
                .expect("committed");
        }
        let sequential_took = started.elapsed();
        // Shown with --nocapture.
        println!(
            "{BATCHES} batches: pipelined {pipelined_took:?}, one after the other {sequential_took:?} (virtual time)"
        );
        assert!(
            pipelined_took * 4 < sequential_took,
            "pipelined {pipelined_took:?} against {sequential_took:?} one after the other: the batches waited for each other"
        );
    });
}

#[test]
fn pipelined_batches_through_a_follower_land_in_order() {
    paused_runtime().block_on(async {
        let c = cluster().await;
        let follower = c.node(c.follower_of(c.leader().await)).clone();
        let indexes = tokio::time::timeout(PATIENCE, pipelined(&follower, 9, BATCHES))
            .await
            .expect("answered");
        assert!(
            indexes.windows(2).all(|w| w[0] < w[1]),
            "increasing indexes in submission order: {indexes:?}"
        );
        c.wait_applied(*indexes.last().expect("records"), PATIENCE)
            .await;
        assert_eq!(data_at(&follower, &indexes).await, expected(9, BATCHES));
    });
}

#[test]
fn a_leadership_transfer_inside_the_pipeline_loses_and_reorders_nothing() {
    paused_runtime().block_on(async {
        let c = cluster().await;
        let old = c.leader().await;
        let next = c.follower_of(old);
        let node = c.node(old).clone();
        let client_id = 11;
        let mut in_flight = submitted(&node, client_id, 0..BATCHES / 2).await;
        node.transfer_leader(next).await.expect("asked");
        in_flight.extend(submitted(&node, client_id, BATCHES / 2..BATCHES).await);
        let indexes = answered(&node, client_id, in_flight).await;
        assert_eq!(
            c.leader_among(&c.running(), PATIENCE).await,
            next,
            "the transfer happened inside the pipeline"
        );
        assert!(
            indexes.windows(2).all(|w| w[0] < w[1]),
            "increasing indexes in seq order: {indexes:?}"
        );
        c.wait_applied(*indexes.last().expect("records"), PATIENCE)
            .await;
        assert_eq!(data_at(&node, &indexes).await, expected(client_id, BATCHES));
        // Exactly once: the session's records appear once each in the log.
        let read = node
            .read_log(1, *indexes.last().expect("records"), u64::MAX)
            .await
            .expect("the log reads");
        let ours: Vec<Vec<u8>> = read
            .records
            .into_iter()
            .map(|r| r.data)
            .filter(|d| d.starts_with(format!("{client_id}:").as_bytes()))
            .collect();
        assert_eq!(ours, expected(client_id, BATCHES));
    });
}

/// A leader replicates (and applies) the entries it just appended from
/// memory, as openraft gave them to its log store: with its followers
/// keeping up, it decodes none of them back out of its ring, and it
/// encodes each entry's payload once, when appending it, for its own ring
/// and its followers' (issue 14, item 2). Before, openraft's reads for
/// each follower's replication and for the apply read every entry out of
/// the ring, checked and decoded it, and each follower's link encoded it
/// again.
#[test]
fn a_leader_replicates_what_it_appended_without_decoding_its_ring_or_encoding_again() {
    paused_runtime().block_on(async {
        let c = cluster().await;
        let leader = c.leader().await;
        let store = c.node(leader).log_store().clone();
        let metrics = c.node(leader).metrics();
        let before = store.entries_decoded();
        let (written, encoded) = (
            metrics.bytes_written.get(),
            metrics.entries_encoded_for_followers.get(),
        );
        let mut last = 0;
        for b in 0..BATCHES {
            let (session, records) = batch(7, b);
            let answers = c
                .node(leader)
                .propose_batch(Some(session), records)
                .await
                .expect("committed");
            last = answers.last().expect("answers").index;
        }
        c.wait_applied(last, PATIENCE).await;
        let decoded = store.entries_decoded() - before;
        println!(
            "{} records committed on 3 nodes: {decoded} entries decoded out of the leader's log",
            BATCHES * PER_BATCH
        );
        assert_eq!(decoded, 0, "entries read back out of the leader's ring");
        assert!(
            metrics.bytes_written.get() > written,
            "the entries went one-sided"
        );
        assert_eq!(
            metrics.entries_encoded_for_followers.get() - encoded,
            0,
            "entries encoded again for a follower's ring"
        );
    });
}
