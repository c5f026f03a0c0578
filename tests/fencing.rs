//! The fencing argument (DESIGN.md) against scripted leaders: a test plays
//! one or more leaders over raw connections of the in-process fabric (fence
//! READ/CAS, grants, one-sided WRITEs of ring records, AppendEntries
//! control messages) against a real node, and holds that node at named
//! points ([`ringraft::hooks`]) so that each interleaving happens on
//! purpose, never by luck of timing.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::entry::RaftEntry;
use openraft::raft::VoteRequest;
use ringraft::hooks::{HookPoint, Hooks};
use ringraft::protocol::{AppendBody, Hello, Join, Reply, Request, Tail, decode, encode};
use ringraft::types::{Entry, Vote, log_id};
use ringraft::{Command, Durability, Fabric, LogStore, Node, NodeBuilder, NodeConfig};
use ringraft_testkit::inproc::{Recorder, SECRET};
use ringraft_transport::{
    ConnConfig, Connection, Device, DeviceConfig, Received, RemoteRegion, Secret, inproc,
};
use ringraft_wal::{ChainTip, EntryRef, Epoch, RecordEncoder, WriteBuffer};

/// How long any single step may take before the test counts as hung.
const T: Duration = Duration::from_secs(20);
const CLUSTER_ID: u64 = 0x5249_4e47;

/// Node 2 alone, on `fabric`, with `hooks`; its peers are named but never
/// started (the test plays them).
async fn start_node(fabric: &inproc::Fabric, dir: &std::path::Path, hooks: Hooks) -> Node {
    ringraft_testkit::inproc::init_tracing();
    let mut config = NodeConfig::new(2, dir.join("data"), "node2");
    // The ring in the test's directory, not in /dev/shm.
    config.ring_dir = dir.join("shm");
    config.peers = [
        (1, "node1".to_string()),
        (2, "node2".to_string()),
        (3, "node3".to_string()),
    ]
    .into();
    config.durability = Durability::Memory;
    config.ring_capacity = 1 << 20;
    config.max_record_bytes = 64 << 10;
    config.lock_memory = false;
    // Its own elections never get in the way: the test drives its term.
    config.election_timeout_ms = (60_000, 90_000);
    assert_eq!(config.cluster_id, CLUSTER_ID);
    NodeBuilder::new(config)
        .fabric(Fabric::Inproc(fabric.clone()))
        .secret(SECRET.to_vec())
        .state_machine(Recorder::default())
        .hooks(hooks)
        .start()
        .await
        .expect("node 2 starts")
}

/// A leader played by the test: node `id` on the fabric, with its
/// connections to node 2.
struct Scripted {
    id: u64,
    device: Device,
}

/// One connection of a scripted leader, and what node 2 revealed on it.
struct Link {
    conn: Connection,
    hello: Hello,
}

impl Scripted {
    fn new(fabric: &inproc::Fabric, id: u64) -> Scripted {
        let config = DeviceConfig {
            node_id: id,
            secret: Secret::new(SECRET.to_vec()).unwrap(),
            limits: Default::default(),
        };
        Scripted {
            id,
            device: fabric.device(&format!("node{id}"), config),
        }
    }

    async fn connect(&self) -> Link {
        let conn = tokio::time::timeout(
            T,
            self.device
                .connect("node2", ConnConfig::default(), Join::bytes(CLUSTER_ID)),
        )
        .await
        .expect("connect in time")
        .expect("connects");
        let hello: Hello = decode(&conn.peer().reveal.app_data).unwrap();
        Link { conn, hello }
    }

    fn epoch(&self, term: u64) -> Epoch {
        Epoch::new(term, self.id).unwrap()
    }

    fn vote(&self, term: u64) -> Vote {
        Vote::new_committed(term, self.id)
    }
}

impl Link {
    /// CASes node 2's fence from `from` to `to`; true if it held `from`.
    async fn cas_fence(&self, from: Epoch, to: Epoch) -> bool {
        self.conn
            .compare_swap(self.hello.fence.start(), from.0, to.0)
            .await
            .expect("fence CAS completes")
            == from.0
    }

    fn post(&self, request: &Request) {
        self.conn.post_send(&encode(request).unwrap()).unwrap();
    }

    async fn reply(&self) -> Reply {
        match tokio::time::timeout(T, self.conn.recv())
            .await
            .expect("an answer in time")
            .expect("the connection works")
        {
            Received::Message(bytes) => decode(&bytes).unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn call(&self, request: &Request) -> Reply {
        self.post(request);
        self.reply().await
    }

    async fn grant(&self, epoch: Epoch) -> Reply {
        self.call(&Request::Grant { epoch }).await
    }

    /// Leads `epoch` on a node 2 no one fenced yet: CASes its fence from
    /// zero to `epoch` (it must have been zero) and asks for the grant;
    /// the data area and the tail granted.
    async fn fence_and_grant(&self, epoch: Epoch) -> (RemoteRegion, Tail) {
        assert!(self.cas_fence(Epoch(0), epoch).await);
        granted(self.grant(epoch).await)
    }

    /// WRITEs `entries` as records at `tail` and posts the AppendEntries
    /// that names them (its answer is taken later).
    async fn append_written(
        &self,
        data: RemoteRegion,
        tail: Tail,
        vote: Vote,
        epoch: Epoch,
        entries: &[Entry],
    ) -> Tail {
        let (message, next) = self.write_records(data, tail, vote, epoch, entries).await;
        self.post(&message);
        next
    }

    /// WRITEs `entries` as records at `tail`; the AppendEntries that names
    /// them (not sent) and the tail after them.
    async fn write_records(
        &self,
        data: RemoteRegion,
        tail: Tail,
        vote: Vote,
        epoch: Epoch,
        entries: &[Entry],
    ) -> (Request, Tail) {
        let (buffer, next) = encode_records(self.hello.capacity, tail, epoch, entries);
        for segment in buffer.segments() {
            let at = data
                .at(segment.physical, segment.bytes.len() as u64)
                .unwrap();
            self.conn
                .write(at, &segment.bytes)
                .await
                .expect("WRITE lands");
        }
        let last = entries.last().unwrap().log_id;
        let message = Request::Append {
            vote,
            prev_log_id: tail.last_log_id(),
            leader_commit: None,
            epoch,
            body: AppendBody::Written {
                from_lsn: buffer.start_lsn(),
                to_lsn: buffer.end_lsn(),
                count: entries.len() as u64,
                last,
            },
        };
        (message, next)
    }
}

fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>, tag: &str) -> Vec<Entry> {
    indexes
        .map(|index| {
            Entry::new_normal(
                log_id(term, index),
                Command {
                    session: None,
                    data: format!("{tag}-{index}").into_bytes(),
                    control: None,
                },
            )
        })
        .collect()
}

/// The records of `entries` written at `tail`, and the tail after them.
fn encode_records(
    capacity: u64,
    tail: Tail,
    epoch: Epoch,
    entries: &[Entry],
) -> (WriteBuffer, Tail) {
    let mut encoder = RecordEncoder::new(capacity, tail.next_lsn, tail.chain_tip(), epoch).unwrap();
    let mut buffer = WriteBuffer::new(capacity, tail.next_lsn).unwrap();
    for entry in entries {
        let payload =
            bincode::serde::encode_to_vec(&entry.payload, bincode::config::standard()).unwrap();
        encoder
            .push(
                &mut buffer,
                &EntryRef {
                    term: entry.log_id.leader_id.term,
                    index: entry.log_id.index,
                    payload: &payload,
                },
            )
            .unwrap();
    }
    let tip: ChainTip = encoder.tip();
    let next = Tail {
        next_lsn: encoder.next_lsn(),
        next_index: tip.next_index,
        last_term: tip.last_term,
        epoch: tip.epoch,
        unanchored: tip.unanchored,
        head_lsn: tail.head_lsn,
    };
    (buffer, next)
}

fn granted(reply: Reply) -> (RemoteRegion, Tail) {
    match reply {
        Reply::Granted { data, tail } => (data, tail),
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn appended(reply: Reply) {
    match reply {
        Reply::Appended { response, .. } if response.is_success() => {}
        other => panic!("expected a successful append, got {other:?}"),
    }
}

/// The entries node 2's log holds in `indexes`, as (index, bytes).
fn log_of(store: &LogStore, indexes: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
    store.with_wal(|wal| {
        indexes
            .map(|index| {
                let record = wal
                    .ring()
                    .read(index)
                    .unwrap_or_else(|e| panic!("entry {index} unreadable: {e}"));
                let entry =
                    ringraft::log_store::decode_entry(record.term, index, record.payload).unwrap();
                let data = match entry.payload {
                    openraft::EntryPayload::Normal(c) => c.data,
                    other => panic!("entry {index}: {other:?}"),
                };
                (index, data)
            })
            .collect()
    })
}

fn expected(tag: &str, indexes: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
    indexes
        .map(|i| (i, format!("{tag}-{i}").into_bytes()))
        .collect()
}

/// Issue 10, item 5, "re-grant after a term change": once node 2's term
/// advanced past a leader's (here: it voted for node 3 in term 2), that
/// deposed leader must not get write access again, although the fence word
/// still holds its epoch (no leader of term 2 has fenced in yet). The old
/// code checked only `fence == epoch` and handed it a fresh rkey.
#[tokio::test(flavor = "current_thread")]
async fn a_deposed_leader_is_not_granted_again_after_the_term_advanced() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(1);
    let node = start_node(&fabric, dir.path(), Hooks::new()).await;
    let old = Scripted::new(&fabric, 1);
    let link = old.connect().await;
    // Node 1 leads term 1: it fences node 2 and is granted write access.
    let (data, tail) = link.fence_and_grant(old.epoch(1)).await;

    // Node 2 votes for node 3 in term 2 (its term advances: the rkey is
    // rotated); the fence still holds node 1's epoch.
    let candidate = Scripted::new(&fabric, 3).connect().await;
    let vote = candidate
        .call(&Request::Vote(VoteRequest::new(Vote::new(2, 3), None)))
        .await;
    assert!(
        matches!(&vote, Reply::Voted(v) if v.vote_granted),
        "node 2 votes for node 3: {vote:?}"
    );
    assert_eq!(node.log_store().fence(), old.epoch(1));

    // The deposed leader reconnects and asks again.
    let again = old.connect().await;
    match again.grant(old.epoch(1)).await {
        Reply::NotFenced { fence } => assert!(
            fence.term() >= 2,
            "the refusal names the newer term: {}",
            fence
        ),
        other => panic!("a deposed leader was granted write access again: {other:?}"),
    }
    // Nor does a WRITE with what it held before land (rotated at the vote).
    let stale = encode_records(
        link.hello.capacity,
        tail,
        old.epoch(1),
        &entries(1, 0..=0, "stale"),
    )
    .0;
    let segment = &stale.segments()[0];
    let at = data
        .at(segment.physical, segment.bytes.len() as u64)
        .unwrap();
    assert!(again.conn.write(at, &segment.bytes).await.is_err());
    node.shutdown().await;
}

/// Node 2's ring in `dir`, registered on `device` and fenced by its own
/// guard, with the store that owns it flushing: the ring, the guard, the
/// store and the ring's capacity.
fn node2_fenced_store(
    dir: &std::path::Path,
    device: &Device,
) -> (
    Arc<ringraft::fencing::FencedRing>,
    ringraft::fencing::NodeGuard,
    LogStore,
    u64,
) {
    use ringraft::fencing::{FencedRing, NodeGuard};
    use ringraft_wal::{RingConfig, Wal};

    let wal = Wal::open(
        &dir.join("data"),
        &dir.join("shm"),
        &RingConfig {
            capacity: 1 << 20,
            max_record_bytes: 64 << 10,
            cluster_id: CLUSTER_ID,
            node_id: 2,
            lock_memory: false,
        },
    )
    .unwrap();
    let regions = wal.ring().regions();
    let capacity = wal.ring().geometry().capacity;
    // SAFETY: the ring stays open in the store, which `keep_alive` hands
    // to the registrations.
    let ring = Arc::new(unsafe { FencedRing::register(device, regions) }.unwrap());
    let guard = NodeGuard::new(
        ring.clone(),
        device.clone(),
        2,
        CLUSTER_ID,
        "node2".into(),
        None,
    );
    let store = LogStore::new(wal, 2, Durability::Memory, Arc::new(guard.clone()));
    guard.bind(&store);
    store.start_flusher(|| {}).expect("flusher");
    ring.keep_alive(store.clone());
    (ring, guard, store, capacity)
}

/// Issue 10, item 5, "a node that fences itself must rotate like any other
/// fence change": a writer granted under the old fence loses write access
/// when the node raises its own fence. The old code moved the fence with a
/// CAS only, and the old holder's WRITEs went on landing in the ring.
#[tokio::test(flavor = "current_thread")]
async fn raising_its_own_fence_revokes_the_old_holders_write_access() {
    use ringraft::RingGuard;

    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(2);
    let config = DeviceConfig {
        node_id: 2,
        secret: Secret::new(SECRET.to_vec()).unwrap(),
        limits: Default::default(),
    };
    let device = fabric.device("node2", config);
    let (ring, guard, store, capacity) = node2_fenced_store(dir.path(), &device);
    let hello = Hello {
        cluster_id: CLUSTER_ID,
        node_id: 2,
        fence: ring.fence(),
        head: ring.head(),
        capacity,
        incarnation: 1,
    };
    let _listener = device
        .listen(
            "node2",
            ConnConfig::default(),
            ringraft_transport::reveal_to_all(encode(&hello).unwrap()),
        )
        .await
        .unwrap();

    let old = Scripted::new(&fabric, 1);
    let link = old.connect().await;
    assert!(link.cas_fence(Epoch(0), old.epoch(1)).await);
    let data = ring.grant(&store, old.epoch(1)).expect("granted");
    let line = data.at(0, 64).unwrap();
    link.conn
        .write(line, &[0xAB; 64])
        .await
        .expect("the holder writes");

    // Node 2 leads term 2 and raises its own fence.
    let rotations = ring.rotations();
    guard
        .fence_self(Epoch::new(2, 2).unwrap())
        .await
        .expect("self-fence");
    assert_eq!(store.fence(), Epoch::new(2, 2).unwrap());
    assert!(
        ring.rotations() > rotations,
        "the self-fence rotated the rkey"
    );
    let err = link
        .conn
        .write(line, &[0xCD; 64])
        .await
        .expect_err("the old holder's WRITE is refused by the NIC");
    assert!(
        err.wc().is_some_and(|w| w.is_access_denied()),
        "refused as a remote access error: {err}"
    );
}

/// Issue 10, item 5, "zeroing another connection's batch": while one
/// connection of the fence holder has a batch prepared (checked in place,
/// waiting for openraft), a stale request on another of its connections is
/// refused. The old code erased `[tail, to_lsn)` for that refusal, that is
/// the prepared batch's records, then adopted the erased bytes without
/// checking them again: node 2 acknowledged entries it did not hold.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_request_never_erases_a_batch_another_connection_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(3);
    let hooks = Hooks::new();
    let node = start_node(&fabric, dir.path(), hooks.clone()).await;
    let leader = Scripted::new(&fabric, 1);
    let a = leader.connect().await;
    let (data, tail) = a.fence_and_grant(leader.epoch(1)).await;

    // Connection A's batch is checked in place; node 2 is held there.
    let held = hooks.arm(HookPoint::AdoptionPrepared);
    let batch = entries(1, 0..=2, "a");
    let after = a
        .append_written(data, tail, leader.vote(1), leader.epoch(1), &batch)
        .await;
    held.reached().await;

    // Connection B (same leader, same epoch) sends a request that does not
    // match what lies in the ring: it is refused.
    let b = leader.connect().await;
    let refused = b
        .call(&Request::Append {
            vote: leader.vote(1),
            prev_log_id: None,
            leader_commit: None,
            epoch: leader.epoch(1),
            body: AppendBody::Written {
                from_lsn: tail.next_lsn,
                to_lsn: after.next_lsn,
                count: 7,
                last: log_id(1, 7),
            },
        })
        .await;
    assert!(
        matches!(refused, Reply::Rejected { .. }),
        "the mismatched request is refused: {refused:?}"
    );

    held.release();
    appended(a.reply().await);
    assert_eq!(
        log_of(node.log_store(), 0..=2),
        expected("a", 0..=2),
        "node 2 holds the entries it acknowledged"
    );
    node.shutdown().await;
}

/// Issue 10, item 5, "a leader change between prepare and commit of an
/// adoption": node 3 fences node 2 (a one-sided CAS, which no application
/// code sees) while node 1's batch is prepared and on its way into
/// openraft, and asks for its grant. The old code failed openraft's append
/// (`NotFenceHolder`), which stops Raft on node 2. Now the batch openraft
/// accepted is taken into the log, and the grant waits for it, so that the
/// tail node 3 learns is exact.
#[tokio::test(flavor = "current_thread")]
async fn a_fence_change_between_prepare_and_commit_is_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(4);
    let hooks = Hooks::new();
    let node = start_node(&fabric, dir.path(), hooks.clone()).await;
    let one = Scripted::new(&fabric, 1);
    let a = one.connect().await;
    let (data, tail) = a.fence_and_grant(one.epoch(1)).await;

    let held = hooks.arm(HookPoint::AdoptionPrepared);
    a.append_written(
        data,
        tail,
        one.vote(1),
        one.epoch(1),
        &entries(1, 0..=2, "one"),
    )
    .await;
    held.reached().await;

    // Node 3, leader of term 2, fences node 2 and asks for write access.
    let three = Scripted::new(&fabric, 3);
    let c = three.connect().await;
    assert!(c.cas_fence(one.epoch(1), three.epoch(2)).await);
    c.post(&Request::Grant {
        epoch: three.epoch(2),
    });

    held.release();
    appended(a.reply().await);
    let (_, tail3) = granted(c.reply().await);
    assert_eq!(
        tail3.next_index, 3,
        "node 3 learns the tail after the batch openraft took"
    );
    assert_eq!(log_of(node.log_store(), 0..=2), expected("one", 0..=2));
    let metrics = node.raft().metrics().borrow_watched().clone();
    assert!(
        metrics.running_state.is_ok(),
        "Raft still runs on node 2: {:?}",
        metrics.running_state
    );
    node.shutdown().await;
}

/// Found by the simulator (a freeze, 2026-12-05): a leader's batch landed
/// on one connection, the leader dropped it and was granted again on a new
/// one, then the old connection's message arrived and its batch was
/// adopted: the tail the new grant named was no longer the last word, and
/// the leader's next WRITE landed over adopted records. Now only the
/// connection holding the last grant extends the log.
#[tokio::test(flavor = "current_thread")]
async fn a_batch_on_a_connection_whose_grant_was_superseded_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(5);
    let node = start_node(&fabric, dir.path(), Hooks::new()).await;
    let leader = Scripted::new(&fabric, 1);
    let a = leader.connect().await;
    let (data, tail) = a.fence_and_grant(leader.epoch(1)).await;
    let (late, _) = a
        .write_records(
            data,
            tail,
            leader.vote(1),
            leader.epoch(1),
            &entries(1, 0..=2, "a"),
        )
        .await;

    // Granted again on connection B: the tail is where A's records start.
    let b = leader.connect().await;
    let (data, tail_b) = granted(b.grant(leader.epoch(1)).await);
    assert_eq!(tail_b, tail);
    // A's message comes now: refused, the tail stays where B was told.
    let refused = a.call(&late).await;
    assert!(
        matches!(refused, Reply::Rejected { .. }),
        "a batch on a superseded connection: {refused:?}"
    );
    assert_eq!(node.log_store().tail(), tail_b);

    b.append_written(
        data,
        tail_b,
        leader.vote(1),
        leader.epoch(1),
        &entries(1, 0..=2, "b"),
    )
    .await;
    appended(b.reply().await);
    assert_eq!(log_of(node.log_store(), 0..=2), expected("b", 0..=2));
    node.shutdown().await;
}

/// Issue 15, item 2: a member past a limit, or claiming another node's
/// vote, is answered with the reason and its connection closed; node 2
/// stays up and takes the next connection.
#[tokio::test(flavor = "current_thread")]
async fn a_peer_past_a_limit_or_claiming_another_vote_is_closed_and_the_node_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(1);
    let node = start_node(&fabric, dir.path(), Hooks::new()).await;
    let peer = Scripted::new(&fabric, 1);
    let snapshot = |vote: Vote, total: u64| Request::Snapshot {
        vote,
        meta: ringraft::types::SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
        },
        offset: 0,
        total,
        data: vec![0; 16],
    };
    let above = ringraft::state_machine::MAX_SNAPSHOT_BYTES + 1;
    let cases = [
        (snapshot(peer.vote(1), above), "above the limit"),
        (
            snapshot(Vote::new_committed(1, 3), 64),
            "sent a vote for node 3",
        ),
        (
            Request::Vote(VoteRequest::new(Vote::new(1, 3), None)),
            "sent a vote for node 3",
        ),
    ];
    for (request, why) in cases {
        let link = peer.connect().await;
        match link.call(&request).await {
            Reply::Error(reason) => assert!(reason.contains(why), "{reason}"),
            other => panic!("taken ({why}): {other:?}"),
        }
        // Closed by node 2: the next receive fails.
        let next = tokio::time::timeout(T, link.conn.recv())
            .await
            .expect("closed in time");
        assert!(next.is_err(), "the connection stays open: {next:?}");
    }
    // Node 2 is up and takes the peer's own vote on a new connection.
    let link = peer.connect().await;
    let vote = link
        .call(&Request::Vote(VoteRequest::new(Vote::new(1, 1), None)))
        .await;
    assert!(matches!(vote, Reply::Voted(_)), "{vote:?}");
    node.shutdown().await;
}

/// Issue 15, item 2: the fence holder's two-sided batch is buffered up to
/// 256 entries of `max_record_bytes` (64 KiB here: about 16.8 MiB); the
/// part that would pass it is answered with the reason and the connection
/// closed, and node 2 takes the next connection.
#[tokio::test(flavor = "current_thread")]
async fn a_two_sided_batch_past_its_limit_closes_the_connection_and_the_node_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = inproc::Fabric::new(1);
    let node = start_node(&fabric, dir.path(), Hooks::new()).await;
    let leader = Scripted::new(&fabric, 1);
    let link = leader.connect().await;
    link.fence_and_grant(leader.epoch(1)).await;
    // Parts that fit the scripted connection's messages (64 KiB).
    const PART_BYTES: usize = 60 << 10;
    const PARTS: u32 = 400;
    let part = |part: u32| Request::Append {
        vote: leader.vote(1),
        prev_log_id: None,
        leader_commit: None,
        epoch: leader.epoch(1),
        body: AppendBody::Inline {
            part,
            parts: PARTS,
            bytes: vec![0; PART_BYTES],
        },
    };
    let limit = node_limit();
    let mut stored = 0u64;
    let reason = loop {
        match link.call(&part(stored as u32)).await {
            Reply::PartStored => stored += 1,
            Reply::Error(reason) => break reason,
            other => panic!("part {stored}: {other:?}"),
        }
        assert!(stored < u64::from(PARTS), "{PARTS} parts were all stored");
    };
    assert!(
        reason.contains(&format!("above the limit of {limit}")),
        "{reason}"
    );
    assert_eq!(stored, limit / PART_BYTES as u64);
    let next = tokio::time::timeout(T, link.conn.recv())
        .await
        .expect("closed in time");
    assert!(next.is_err(), "the connection stays open: {next:?}");
    let again = leader.connect().await;
    let vote = again
        .call(&Request::Vote(VoteRequest::new(Vote::new(2, 1), None)))
        .await;
    assert!(matches!(vote, Reply::Voted(_)), "{vote:?}");
    node.shutdown().await;
}

/// The two-sided batch limit of `start_node`'s node 2.
fn node_limit() -> u64 {
    let mut config = NodeConfig::new(2, "unused", "node2");
    config.max_record_bytes = 64 << 10;
    config.inline_batch_limit()
}
