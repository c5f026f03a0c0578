//! The log is the data (issue 11, items 4 and 5): reads come from the log
//! itself, a trim is a replicated log entry applied at the same index on
//! every node, reads below the first index kept fail naming it, the storage
//! below is given back, restarts and lagging followers keep all of that,
//! and retention by size trims the oldest records on its own.
//!
//! Every wait is bounded and waits for a state (a watch, a metric), never
//! for time to pass.

use std::time::Duration;

use ringraft::{Durability, LogRecord, Node, NodeError, Session};
use ringraft_testkit::inproc::{Cluster, Kind};

/// Bound of every wait: generous, since giving storage back takes a snapshot
/// and its fsync, which a machine busy writing can hold up for long.
const T: Duration = Duration::from_secs(120);

/// The daemon's setting: openraft purges only below a trim.
fn log_is_data(cfg: &mut ringraft::NodeConfig) {
    cfg.keep_after_snapshot = u64::MAX;
    cfg.snapshot_every_entries = 1_000_000;
}

async fn all_records(node: &Node, from: u64) -> Result<Vec<LogRecord>, NodeError> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let piece = node.read_log(next, u64::MAX, 4096).await?;
        out.extend(piece.records);
        if piece.next > piece.applied {
            return Ok(out);
        }
        next = piece.next;
    }
}

fn datas(records: &[LogRecord]) -> Vec<Vec<u8>> {
    records.iter().map(|r| r.data.clone()).collect()
}

/// Waits (bounded) until node `node`'s first index kept is at least `first`.
async fn wait_first(node: &Node, first: u64) {
    let mut watch = node.watch_first_index();
    tokio::time::timeout(T, watch.wait_for(|f| *f >= first))
        .await
        .unwrap_or_else(|_| panic!("node {} never trimmed to {first}", node.id()))
        .unwrap();
}

/// Waits (bounded) until node `node`'s openraft log was purged through
/// `upto`: the storage below the trim is given back.
async fn wait_purged(node: &Node, upto: u64) {
    node.raft()
        .wait(Some(T))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index >= upto),
            "the storage below the trim is given back",
        )
        .await
        .unwrap_or_else(|e| panic!("node {} never purged through {upto}: {e}", node.id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_is_replicated_and_reads_below_it_fail_naming_the_first_index() {
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 11, log_is_data).await;
    let mut acked = Vec::new();
    let mut indexes = Vec::new();
    for k in 0..40u32 {
        let data = format!("record {k}").into_bytes();
        let (index, _) = c.propose(data.clone(), T).await.unwrap();
        acked.push(data);
        indexes.push(index);
    }
    // A session's duplicate is in the log but not a record a read returns.
    let leader = c.leader().await;
    let session = Session {
        client_id: 77,
        seq: 1,
    };
    let once = b"exactly once".to_vec();
    let first_answer = c
        .node(leader)
        .propose_in_session(session, once.clone())
        .await
        .unwrap();
    let again = c
        .node(leader)
        .propose_in_session(session, once.clone())
        .await
        .unwrap();
    assert!(again.duplicate);
    acked.push(once);
    let last = c.node(leader).status().last_log_index.unwrap();
    assert!(last > first_answer.index, "the duplicate took an entry");
    c.wait_applied(last, T).await;
    for id in 1..=3 {
        let records = all_records(c.node(id), 1).await.unwrap();
        assert_eq!(datas(&records), acked, "node {id} reads the log back");
        assert_eq!(
            records.iter().map(|r| r.index).take(40).collect::<Vec<_>>(),
            indexes
        );
    }

    // A trim through a follower (forwarded), and one that would go back.
    let follower = c.follower_of(leader);
    let keep = indexes[20];
    assert_eq!(c.node(follower).trim(keep).await.unwrap(), keep);
    assert_eq!(c.node(leader).trim(keep - 5).await.unwrap(), keep);
    for id in 1..=3 {
        let node = c.node(id);
        wait_first(node, keep).await;
        match node.read_log(keep - 1, u64::MAX, 4096).await {
            Err(NodeError::Trimmed { index, first }) => {
                assert_eq!((index, first), (keep - 1, keep), "node {id}");
                let message = NodeError::Trimmed { index, first }.to_string();
                assert!(message.contains(&keep.to_string()), "{message}");
            }
            other => panic!("node {id}: a read below the trim gave {other:?}"),
        }
        let records = all_records(node, keep).await.unwrap();
        assert_eq!(datas(&records), acked[20..].to_vec(), "node {id}");
        // The storage below the trim goes (a snapshot, then the purge).
        wait_purged(node, keep - 1).await;
        assert!(node.log_store().first_index() >= keep, "node {id}");
    }

    // A restarted node remembers the trim.
    c.stop(follower).await;
    c.boot(follower).await.unwrap();
    c.wait_applied(last, T).await;
    let node = c.node(follower);
    assert_eq!(*node.watch_first_index().borrow(), keep);
    assert!(matches!(
        node.read_log(1, u64::MAX, 4096).await,
        Err(NodeError::Trimmed { first, .. }) if first == keep
    ));
    assert_eq!(
        datas(&all_records(node, keep).await.unwrap()),
        acked[20..].to_vec()
    );
}

/// A follower that was down while the log was trimmed past its end
/// catches up by a snapshot (which carries the trim, not the records) and
/// serves the records it holds from then on; a read below them names the
/// first index it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_a_trim_catches_up_by_snapshot_and_knows_where_its_log_starts() {
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 12, log_is_data).await;
    let leader = c.leader().await;
    let down = c.follower_of(leader);
    for k in 0..10u32 {
        c.propose(format!("early {k}").into_bytes(), T)
            .await
            .unwrap();
    }
    c.stop(down).await;
    let mut later = Vec::new();
    let mut last = 0;
    for k in 0..30u32 {
        let data = format!("later {k}").into_bytes();
        last = c.propose(data.clone(), T).await.unwrap().0;
        later.push(data);
    }
    let keep = last - 5;
    assert_eq!(c.node(leader).trim(keep).await.unwrap(), keep);
    wait_purged(c.node(leader), keep - 1).await;
    c.boot(down).await.unwrap();
    let after = c.propose(b"after".to_vec(), T).await.unwrap().0;
    c.wait_applied(after, T).await;
    let node = c.node(down);
    assert!(
        c.data_dir(down).join("snapshot").exists(),
        "the follower installed a snapshot"
    );
    assert_eq!(
        *node.watch_first_index().borrow(),
        keep,
        "the trim came with it"
    );
    let held = node.log_store().first_index();
    assert!(held >= keep, "held from {held}");
    match node.read_log(keep, u64::MAX, 4096).await {
        Err(NodeError::Trimmed { first, .. }) if held > keep => assert_eq!(first, held),
        Ok(_) if held == keep => {}
        other => panic!("a read at the trim point gave {other:?} (held from {held})"),
    }
    let records = all_records(node, held).await.unwrap();
    assert_eq!(records.last().unwrap().data, b"after");
    for r in &records {
        assert!(r.index >= held);
    }
}

/// A follower that was down while the log was trimmed past its end, by
/// less than the log kept: the leader keeps the entries it needs (its data
/// directory stays within twice the retained log), so it catches up from
/// the segments and holds the whole retained log, like every other node.
/// Before, the leader purged at once and the follower got a snapshot,
/// holding the log only from the snapshot on ("the follower does not hold
/// the retained log: index 13 is below the first index this node holds
/// (34)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_briefly_behind_a_trim_catches_up_from_the_segments_and_holds_the_retained_log()
{
    let mut c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 14, log_is_data).await;
    let leader = c.leader().await;
    let down = c.follower_of(leader);
    let mut last = c.propose(b"before".to_vec(), T).await.unwrap().0;
    c.wait_applied(last, T).await;
    c.stop(down).await;
    let mut acked = Vec::new();
    let mut indexes = Vec::new();
    for k in 0..30u32 {
        let data = format!("while down {k}").into_bytes();
        last = c.propose(data.clone(), T).await.unwrap().0;
        acked.push(data);
        indexes.push(last);
    }
    // Keep the last 20 records: the follower misses 10 below them.
    let keep = indexes[10];
    assert_eq!(c.node(leader).trim(keep).await.unwrap(), keep);
    c.boot(down).await.unwrap();
    let after = c.propose(b"after".to_vec(), T).await.unwrap().0;
    acked.push(b"after".to_vec());
    c.wait_applied(after, T).await;
    let node = c.node(down);
    wait_first(node, keep).await;
    let records = all_records(node, keep)
        .await
        .unwrap_or_else(|e| panic!("the follower does not hold the retained log: {e}"));
    assert_eq!(datas(&records), acked[10..].to_vec());
    // Once it caught up, the leader gives the storage below the trim back.
    wait_purged(c.node(leader), keep - 1).await;
}

/// Retention by size: the leader trims the oldest records so that the
/// records kept take at most `retain_bytes` of segments, exact to the
/// record, on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_size_trims_the_oldest_records_on_every_node() {
    const RETAIN: u64 = 64 << 10;
    let c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 13, |cfg| {
        log_is_data(cfg);
        cfg.retain_bytes = Some(RETAIN);
    })
    .await;
    let mut acked = Vec::new();
    let record = vec![b'r'; 1000];
    let mut last = 0;
    // 200 KB of records through a 64 KiB retention.
    for k in 0..200u32 {
        let mut data = record.clone();
        data.extend_from_slice(format!("-{k}").as_bytes());
        last = c.propose(data.clone(), T).await.unwrap().0;
        acked.push(data);
    }
    c.wait_applied(last, T).await;
    let leader = c.leader().await;
    // Where retention must bring the log once every record is in the
    // leader's segments: the leader trims there when its retention next
    // looks at the log (each second, and after each trim). Earlier trims,
    // made while records were still coming, stop short of it. Wait for
    // that state, bounded.
    let store = c.node(leader).log_store();
    store.flush_all().await.unwrap();
    let expected = store.segments().retention_point(Some(RETAIN), None);
    assert!(
        expected > 100,
        "retention keeps fewer than 100 records ({expected})"
    );
    let mut watch = c.node(leader).watch_first_index();
    let first = *tokio::time::timeout(T, watch.wait_for(|f| *f >= expected))
        .await
        .expect("retention trimmed the log")
        .unwrap();
    for id in 1..=3 {
        let node = c.node(id);
        wait_first(node, first).await;
        // Copied out first: the borrow blocks the channel's sender (the
        // state machine, which the read below may need) while it is held.
        let first_now = *node.watch_first_index().borrow();
        let records = all_records(node, first_now).await.unwrap();
        let bytes: usize = records.iter().map(|r| r.data.len()).sum();
        assert!(
            bytes as u64 <= RETAIN,
            "node {id} keeps {bytes} bytes of records"
        );
        assert!(
            records.len() >= 40,
            "node {id} keeps the newest records ({})",
            records.len()
        );
        let n = records.len();
        assert_eq!(
            datas(&records),
            acked[acked.len() - n..].to_vec(),
            "node {id}"
        );
    }
}

/// Found by the first `jepsen/run.sh --long` (2026-12-04): a read of a log
/// longer than the ring returned the segments' first piece and then jumped
/// to the ring's first entry. The segments' reader stops at `max_bytes` of
/// whole records (header and payload) while the log store counted payload
/// bytes only, took the short piece for the whole range and went on from
/// the ring: every entry in between was left out, silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_the_segments_and_the_ring_leaves_no_gap() {
    let small_ring = |cfg: &mut ringraft::NodeConfig| {
        log_is_data(cfg);
        cfg.ring_capacity = 1 << 20;
    };
    let c = Cluster::start_with(Kind::Inproc, 3, Durability::Memory, 12, small_ring).await;
    // 2 MiB of records through a 1 MiB ring: the oldest are only in the
    // segments by the end.
    let mut acked = Vec::new();
    for k in 0..2048u32 {
        let mut data = format!("record {k} ").into_bytes();
        data.resize(1000, b'.');
        c.propose(data.clone(), T).await.unwrap();
        acked.push(data);
    }
    let leader = c.leader().await;
    let node = c.node(leader);
    let records = all_records(node, 1).await.unwrap();
    let indexes: Vec<u64> = records.iter().map(|r| r.index).collect();
    assert!(
        indexes.windows(2).all(|w| w[0] < w[1]),
        "out of order: {indexes:?}"
    );
    let got = datas(&records);
    let first_gap = got.iter().zip(&acked).position(|(g, a)| g != a);
    assert!(
        got.len() == acked.len() && first_gap.is_none(),
        "a read of the whole log returned {} of {} records; the first wrong one at {first_gap:?} (index {:?})",
        got.len(),
        acked.len(),
        first_gap.and_then(|i| indexes.get(i))
    );
}
