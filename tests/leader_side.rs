//! The leader side of replication against followers that the tests play
//! by hand (`scripted`), and the acceptor's side of a leadership transfer:
//! the holes in the fence of issue 10, item 5, that live there.

mod scripted;

use std::time::Duration;

use futures::StreamExt;
use openraft::network::{RPCOption, RaftNetworkV2};
use openraft::raft::{AppendEntriesResponse, TransferLeaderRequest};
use ringraft::protocol::{AppendBody, Hello, Join, Reply, Request, decode, encode};
use ringraft::types::{LogId, log_id};
use ringraft_transport::{Received, RemoteRegion};
use ringraft_wal::Epoch;
use ringraft_wal::record::RecordHeader;
use scripted::{
    CAPACITY, PATIENCE, ScriptedFollower, answer, append, entries, leader_client, next_request,
    tail,
};

const LEADER: u64 = 1;
const FOLLOWER: u64 = 2;
/// The leader's term; the follower's log holds entries of term 1, written
/// under node 3's epoch.
const TERM: u64 = 2;

fn ttl() -> RPCOption {
    RPCOption::new(Duration::from_secs(10))
}

/// The leader's first request is a grant for `epoch`, which raised the
/// follower's fence; the follower grants it at tail `granted`.
async fn grant_the_leader(
    conn: &ringraft_transport::Connection,
    follower: &ScriptedFollower,
    epoch: Epoch,
    granted: ringraft::protocol::Tail,
) {
    match next_request(conn).await.unwrap() {
        Request::Grant { epoch: e } => assert_eq!(e, epoch),
        other => panic!("expected a grant: {other:?}"),
    }
    let fence = follower.fence.word(0).unwrap();
    assert_eq!(fence.load(std::sync::atomic::Ordering::Acquire), epoch.0);
    answer(
        conn,
        &Reply::Granted {
            data: follower.data.remote(),
            tail: granted,
        },
    )
    .await;
}

/// The next request on `conn`, which must be an append of `batch` whose
/// records came one-sided; its (from_lsn, to_lsn, count, last).
async fn next_one_sided(
    conn: &ringraft_transport::Connection,
    batch: &str,
) -> (u64, u64, u64, LogId) {
    match next_request(conn).await {
        Ok(Request::Append {
            body:
                AppendBody::Written {
                    from_lsn,
                    to_lsn,
                    count,
                    last,
                },
            ..
        }) => (from_lsn, to_lsn, count, last),
        other => panic!("{batch} did not come one-sided on the same connection: {other:?}"),
    }
}

/// Batch 2 comes one-sided on the same connection at the tail the answer to
/// batch 1 gave; the end of what it wrote.
async fn batch_2_one_sided(conn: &ringraft_transport::Connection) -> u64 {
    let (from_lsn, to_lsn, count, last) = next_one_sided(conn, "batch 2").await;
    assert_eq!(
        (from_lsn, count, last),
        (1024, 2, log_id(TERM, 7)),
        "batch 2 goes one-sided at the tail the answer gave"
    );
    to_lsn
}

/// Batch 3 is pipelined right behind batch 2 (which ended at `second_end`);
/// the end of what it wrote.
async fn batch_3_pipelined(conn: &ringraft_transport::Connection, second_end: u64) -> u64 {
    let (from_lsn, to_lsn, count, last) = next_one_sided(conn, "batch 3").await;
    assert_eq!(
        (from_lsn, count, last),
        (second_end, 1, log_id(TERM, 8)),
        "batch 3 was not pipelined behind batch 2"
    );
    to_lsn
}

/// The leader's stream ends and answered the three batches in order.
async fn the_stream_acknowledged_5_7_and_8(
    leader: tokio::task::JoinHandle<Result<Vec<String>, String>>,
) {
    let results = tokio::time::timeout(PATIENCE, leader)
        .await
        .expect("the stream ends")
        .unwrap()
        .unwrap();
    let expected: Vec<String> = [5, 7, 8]
        .iter()
        .map(|i| format!("{:?}", Ok::<_, ()>(Ok::<_, ()>(Some(log_id(TERM, *i))))))
        .collect();
    assert_eq!(results, expected);
}

/// Issue 10, item 5, "Pipelining after a two-sided batch": a batch that
/// went two-sided (its `prev_log_id` is not the follower's tail) left the
/// next pipelined batch to ask for a grant with the first one's reply still
/// outstanding, which dropped the connection and paired later replies with
/// the wrong batches. The pipeline must keep working: the batch after the
/// two-sided one waits for its answer (which carries the follower's new
/// tail), goes one-sided at that tail on the same connection without a new
/// grant, and the batch after it is pipelined again.
#[tokio::test(start_paused = true)]
async fn the_pipeline_keeps_working_after_a_batch_falls_back_to_send() {
    let fabric = ringraft_transport::inproc::Fabric::new(1);
    let mut follower = ScriptedFollower::start(&fabric, FOLLOWER, |_| {}).await;
    let epoch = Epoch::new(TERM, LEADER).unwrap();
    // The follower holds 1..=5 of term 1; the leader's log diverges after 3.
    let granted = tail(640, log_id(1, 5), Epoch::new(1, 3).unwrap());
    let requests = vec![
        append(TERM, LEADER, Some(log_id(1, 3)), entries(TERM, 4, 5)),
        append(TERM, LEADER, Some(log_id(TERM, 5)), entries(TERM, 6, 7)),
        append(TERM, LEADER, Some(log_id(TERM, 7)), entries(TERM, 8, 8)),
    ];
    // Tells the script which request the leader has taken from its input.
    let (pulled_tx, mut pulled) = tokio::sync::mpsc::unbounded_channel();
    let mut taken = 0u32;
    let input = futures::stream::iter(requests).inspect(move |_| {
        taken += 1;
        let _ = pulled_tx.send(taken);
    });
    let leader = {
        let fabric = fabric.clone();
        tokio::spawn(async move {
            let mut net = leader_client(&fabric, LEADER, FOLLOWER).await;
            let stream = net
                .stream_append(input, ttl())
                .await
                .map_err(|e| e.to_string())?;
            let results: Vec<String> = stream.map(|r| format!("{r:?}")).collect().await;
            Ok::<_, String>(results)
        })
    };

    let conn = follower.accept().await;
    grant_the_leader(&conn, &follower, epoch, granted).await;
    match next_request(&conn).await.unwrap() {
        Request::Append {
            prev_log_id,
            body: AppendBody::Inline {
                part: 0, parts: 1, ..
            },
            ..
        } => assert_eq!(prev_log_id, Some(log_id(1, 3))),
        other => panic!("expected the first batch two-sided: {other:?}"),
    }
    // The answer is held until the leader has taken the next batch from its
    // input: the old code then asked for a grant with this answer owed.
    while pulled.recv().await.expect("the input is taken") < 2 {}
    let after_inline = tail(1024, log_id(TERM, 5), epoch);
    answer(
        &conn,
        &Reply::Appended {
            response: AppendEntriesResponse::Success,
            tail: after_inline,
        },
    )
    .await;
    let second_end = batch_2_one_sided(&conn).await;
    // It landed where the answer said the tail is, under the leader's epoch.
    let header: [u8; 64] = follower.data.read(1024, 64).unwrap().try_into().unwrap();
    let header = RecordHeader::decode(&header).unwrap();
    assert_eq!((header.lsn, header.index, header.epoch), (1024, 6, epoch));
    // Batch 3 is pipelined: it comes before the answer to batch 2.
    let third_end = batch_3_pipelined(&conn, second_end).await;
    for (end, last) in [(second_end, 7), (third_end, 8)] {
        answer(
            &conn,
            &Reply::Appended {
                response: AppendEntriesResponse::Success,
                tail: tail(end, log_id(TERM, last), epoch),
            },
        )
        .await;
    }
    the_stream_acknowledged_5_7_and_8(leader).await;
    assert!(
        follower.try_accept(Duration::from_secs(1)).await.is_none(),
        "the leader made a second connection"
    );
}

/// What the leader's `append_entries` did against a follower that sent bad
/// values: the error it returned (`Ok`), or what went wrong (`Err`).
async fn leader_meets(
    spoil_hello: impl FnOnce(&mut Hello),
    spoil_fabric: impl FnOnce(&ringraft_transport::inproc::Fabric, &ScriptedFollower),
    grant: impl FnOnce(&ScriptedFollower) -> Reply,
    request: openraft::raft::AppendEntriesRequest<ringraft::TypeConfig>,
) -> Result<String, String> {
    let fabric = ringraft_transport::inproc::Fabric::new(1);
    let mut follower = ScriptedFollower::start(&fabric, FOLLOWER, spoil_hello).await;
    spoil_fabric(&fabric, &follower);
    let granted = grant(&follower);
    let leader = {
        let fabric = fabric.clone();
        tokio::spawn(async move {
            let mut net = leader_client(&fabric, LEADER, FOLLOWER).await;
            net.append_entries(request, ttl()).await
        })
    };
    // Grants with the bad values, accepts whatever comes after.
    let script = tokio::spawn(async move {
        let conn = follower.accept().await;
        let mut granted = Some(granted);
        while let Ok(request) = next_request(&conn).await {
            let reply = match request {
                Request::Grant { .. } => granted.take().expect("one grant"),
                Request::Append { prev_log_id, .. } => Reply::Appended {
                    response: AppendEntriesResponse::Success,
                    tail: tail(
                        64 << 10,
                        prev_log_id.unwrap(),
                        Epoch::new(TERM, LEADER).unwrap(),
                    ),
                },
                other => panic!("unexpected {other:?}"),
            };
            answer(&conn, &reply).await;
        }
        follower
    });
    let outcome = tokio::time::timeout(PATIENCE, leader)
        .await
        .expect("the leader answers");
    script.abort();
    match outcome {
        Ok(Err(e)) => Ok(e.to_string()),
        Ok(Ok(resp)) => Err(format!("the leader took it: {resp:?}")),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("the leader panicked: {msg}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A grant of the follower's real data area with `tail`.
fn grant_with(tail: ringraft::protocol::Tail) -> impl FnOnce(&ScriptedFollower) -> Reply {
    move |f| Reply::Granted {
        data: f.data.remote(),
        tail,
    }
}

/// Bad tails and a bad capacity in the grant: each is an error naming it.
async fn bad_tails_and_capacity(
    check: &mut impl FnMut(&str, Result<String, String>, &str),
    good: ringraft::protocol::Tail,
    next: &impl Fn() -> openraft::raft::AppendEntriesRequest<ringraft::TypeConfig>,
) {
    let unaligned = ringraft::protocol::Tail {
        next_lsn: 100,
        ..good
    };
    check(
        "a tail not on a line",
        leader_meets(|_| {}, |_, _| {}, grant_with(unaligned), next()).await,
        "not aligned",
    );

    check(
        "a capacity that is not a power of two",
        leader_meets(
            |h| h.capacity = 3 << 20,
            |_, _| {},
            |f| Reply::Granted {
                data: RemoteRegion {
                    len: 3 << 20,
                    ..f.data.remote()
                },
                tail: good,
            },
            next(),
        )
        .await,
        "capacity",
    );

    let head_beyond = ringraft::protocol::Tail {
        head_lsn: u64::MAX - 63,
        ..good
    };
    check(
        "a head beyond the tail",
        leader_meets(|_| {}, |_, _| {}, grant_with(head_beyond), next()).await,
        "beyond",
    );

    let end_of_lsn_space = ringraft::protocol::Tail {
        next_lsn: u64::MAX - 63,
        head_lsn: u64::MAX - 63 - 640,
        ..good
    };
    check(
        "a tail at the end of the lsn space",
        leader_meets(|_| {}, |_, _| {}, grant_with(end_of_lsn_space), next()).await,
        "beyond",
    );
}

/// Bad regions, a bad fence word, a short READ and a bad head word: each
/// is an error naming it.
async fn bad_regions_and_words(
    check: &mut impl FnMut(&str, Result<String, String>, &str),
    good: ringraft::protocol::Tail,
    old: Epoch,
    next: &impl Fn() -> openraft::raft::AppendEntriesRequest<ringraft::TypeConfig>,
) {
    check(
        "a data area shorter than the ring",
        leader_meets(
            |_| {},
            |_, _| {},
            |f| Reply::Granted {
                data: RemoteRegion {
                    len: 4096,
                    ..f.data.remote()
                },
                tail: good,
            },
            next(),
        )
        .await,
        "data area",
    );

    check(
        "a fence word shorter than a word",
        leader_meets(|h| h.fence.len = 4, |_, _| {}, grant_with(good), next()).await,
        "8-byte word",
    );

    check(
        "a short READ of the fence word",
        leader_meets(
            |_| {},
            |fabric, f| fabric.shorten_reads(&scripted::addr(f.id), 4),
            grant_with(good),
            next(),
        )
        .await,
        "completed with 4 bytes",
    );

    // A full ring (the batch does not fit before the head advances): the
    // leader READs the head, which says it is far beyond the tail.
    let full = tail(CAPACITY - 64, log_id(1, 5), old);
    check(
        "a head word beyond the tail",
        leader_meets(
            |_| {},
            |_, f| f.head.write(0, &u64::MAX.to_le_bytes()).unwrap(),
            grant_with(full),
            next(),
        )
        .await,
        "beyond its tail",
    );
}

/// Issue 10, item 5, "Input from the peer's NIC is trusted": bad values in
/// a follower's handshake and grant, and a short READ answer from its NIC,
/// panicked the leader (`RecordEncoder::new`'s asserts, `expect("8
/// bytes")`, overflowing arithmetic on the peer's offsets) or were used as
/// they came. Each must be an error of that exchange, with a message that
/// says what was wrong.
#[tokio::test(start_paused = true)]
async fn bad_values_from_a_follower_are_errors_not_panics() {
    let old = Epoch::new(1, 3).unwrap();
    let good = tail(640, log_id(1, 5), old);
    let next = || append(TERM, LEADER, Some(log_id(1, 5)), entries(TERM, 6, 7));
    let mut failures = Vec::new();
    let mut check = |case: &str, outcome: Result<String, String>, expect: &str| match outcome {
        Ok(error) if error.contains(expect) => {}
        Ok(error) => failures.push(format!("{case}: error without {expect:?}: {error}")),
        Err(what) => failures.push(format!("{case}: {what}")),
    };

    bad_tails_and_capacity(&mut check, good, &next).await;
    bad_regions_and_words(&mut check, good, old, &next).await;

    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 10, item 5, "Leadership transfer to a node whose log is damaged":
/// openraft's election by transfer ignores `enable_elect`, so a node whose
/// log is corrupt inside (it must not vote, nor stand, until re-replicated
/// past the break) started an election when told to take the leadership.
/// It must refuse the transfer and keep its vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_is_corrupt_inside_refuses_a_leadership_transfer() {
    use ringraft::Durability;
    use ringraft_testkit::inproc::{Cluster, Kind, SECRET};
    const T: Duration = Duration::from_secs(30);

    let mut c = Cluster::start(Kind::Inproc, 3, Durability::Memory, 7).await;
    let mut last = 0;
    for k in 0..20 {
        last = c
            .propose(format!("entry {k}").into_bytes(), T)
            .await
            .unwrap()
            .0;
    }
    c.wait_applied(last, T).await;
    let leader = c.leader().await;
    let b = c.follower_of(leader);
    // The followers first: a follower that saw its leader stopped would
    // stand for election at once (fast failover) and b's vote would move.
    for id in (1..=3).filter(|id| *id != leader).chain([leader]) {
        c.stop(id).await;
    }
    // b's log breaks inside (well-formed records after the break); b comes
    // back alone, its vote the leader's.
    let cfg = c.members[&b].config.clone();
    ringraft_testkit::inproc::damage::flip_bit(&c, b, last - 10);
    c.boot(b).await.unwrap();
    assert!(c.node(b).log_store().votes_blocked());
    let vote_of_b = || async {
        c.node(b)
            .raft()
            .with_raft_state(|state| *state.vote_ref())
            .await
            .unwrap()
    };
    let vote_before = vote_of_b().await;
    assert_eq!(vote_before.leader_id.voted_for, leader, "{vote_before:?}");

    // The leader of that vote asks b to take over (as openraft's
    // `trigger().transfer_leader(b)` does), from a connection of its own.
    let device = c.fabric.device(
        "transfer-initiator",
        ringraft_transport::DeviceConfig {
            node_id: leader,
            secret: ringraft_transport::Secret::new(SECRET.to_vec()).unwrap(),
            limits: Default::default(),
        },
    );
    let conn = device
        .connect(&cfg.listen, cfg.conn.clone(), Join::bytes(cfg.cluster_id))
        .await
        .unwrap();
    let request = TransferLeaderRequest::new(vote_before, b, None);
    conn.send(&encode(&Request::TransferLeader(request)).unwrap())
        .await
        .unwrap();
    let reply = match tokio::time::timeout(T, conn.recv()).await {
        Ok(Ok(Received::Message(bytes))) => decode::<Reply>(&bytes).unwrap(),
        other => panic!("no answer to the transfer: {other:?}"),
    };
    match &reply {
        Reply::Error(reason) => assert!(reason.contains("corrupt inside"), "{reason}"),
        other => panic!("a node whose log is corrupt inside took the leadership: {other:?}"),
    }
    // Refused before openraft saw it: no election, the vote is unchanged.
    assert_eq!(vote_of_b().await, vote_before);
    assert_ne!(c.node(b).status().state, "Leader");
}
