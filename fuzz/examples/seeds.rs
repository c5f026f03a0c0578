//! Writes the seed corpus of every target, made of real traffic and the
//! real encoders: a handshake between the real client and server, recorded
//! by a relay; a `tcp` connection between two real devices on loopback
//! (WRITEs, READs, atomics, SENDs and their answers), recorded by a TCP
//! relay; the control plane's messages, entry batches and ring payloads of
//! a realistic replication (AppendEntries inline and one-sided, votes,
//! snapshot parts, forwarded proposals, memberships, trims); a snapshot
//! body built by the real state machine after sessions, duplicates and
//! trims; the client API's requests as the client sends them.
//!
//! `cargo run --example seeds -- CORPUS_DIR` (from fuzz/; seed.sh runs it)
//! writes CORPUS_DIR/TARGET/NAME.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use openraft::raft::{
    AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, VoteRequest, VoteResponse,
};
use openraft::{EntryPayload, Membership};
use prost::Message;
use ringraft::protocol::{
    AppendBody, Hello, Join, MAX_PART_BYTES, Reply, Request, Tail, encode, encode_entries,
};
use ringraft::types::{Command, Control, Entry, NodeInfo, Response, Session, Vote, log_id};
use ringraft_client::proto;
use ringraft_fuzz::{install_and_rebuild, qp_endpoint_example};
use ringraft_transport::RemoteRegion;
use ringraft_transport::fuzzing::{
    HANDSHAKE_CLIENT, HANDSHAKE_FRAMES, HANDSHAKE_PROVEN, WireFrame, example_frames,
    record_handshake, record_tcp_traffic, soft_endpoint, split_after_frames,
};
use ringraft_transport::handshake::Reveal;
use ringraft_wal::Epoch;

struct Corpus(PathBuf);

impl Corpus {
    fn put(&self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.0.join(target);
        std::fs::create_dir_all(&dir).expect("a corpus directory");
        std::fs::write(dir.join(name), bytes).expect("a seed file");
    }
}

fn with_kind(kind: u8, bytes: &[u8]) -> Vec<u8> {
    [&[kind][..], bytes].concat()
}

/// The length-prefixed frames of `stream`.
fn frames_of(stream: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut rest = stream;
    while let Some((frame, after)) = split_after_frames(rest, 1) {
        frames.push(frame);
        rest = after;
    }
    frames
}

async fn handshake_seeds(corpus: &Corpus) {
    for (name, endpoint) in [
        ("soft", soft_endpoint(&Default::default())),
        ("rdma", qp_endpoint_example(0x11, 0xabcdef)),
    ] {
        let described = endpoint.clone();
        let recorded = record_handshake(
            Reveal {
                endpoint: endpoint.clone(),
                app_data: ringraft::protocol::Join::bytes(0x5249_4e47),
            },
            Reveal {
                endpoint,
                app_data: b"server application data".to_vec(),
            },
        )
        .await;
        let client = frames_of(&recorded.from_client);
        let server = frames_of(&recorded.from_server);
        assert_eq!((client.len(), server.len()), HANDSHAKE_FRAMES);
        corpus.put(
            "handshake",
            &format!("server-{name}-whole"),
            &with_kind(0, &recorded.from_client),
        );
        corpus.put(
            "handshake",
            &format!("server-{name}-hello"),
            &with_kind(0, client[0]),
        );
        corpus.put(
            "handshake",
            &format!("server-{name}-proven-endpoint"),
            &with_kind(HANDSHAKE_PROVEN, client[2]),
        );
        corpus.put(
            "handshake",
            &format!("client-{name}-whole"),
            &with_kind(HANDSHAKE_CLIENT, &recorded.from_server),
        );
        corpus.put(
            "handshake",
            &format!("client-{name}-proven-answer"),
            &with_kind(HANDSHAKE_CLIENT | HANDSHAKE_PROVEN, server[1]),
        );
        corpus.put("endpoints", name, &described);
    }
}

async fn frame_seeds(corpus: &Corpus) {
    let recorded = record_tcp_traffic(Duration::from_secs(10))
        .await
        .expect("real tcp traffic");
    let (_, from_client) = split_after_frames(&recorded.from_client, HANDSHAKE_FRAMES.0)
        .expect("the client's handshake");
    let (_, from_server) = split_after_frames(&recorded.from_server, HANDSHAKE_FRAMES.1)
        .expect("the server's handshake");
    assert!(!from_client.is_empty() && !from_server.is_empty());
    corpus.put("frames", "tcp-from-client", from_client);
    corpus.put("frames", "tcp-from-server", from_server);
    for (k, frame) in example_frames(0x7f00_0000_1000, 0x1a2b_3c4d, 640, b"a record")
        .iter()
        .enumerate()
    {
        let mut framed = Vec::new();
        frame.encode_framed(&mut framed);
        corpus.put("frames", &format!("example-{k}"), &framed);
        assert_eq!(WireFrame::decode(&frame.encode()).as_ref(), Ok(frame));
    }
}

fn command(client_id: u64, seq: u64, data: &[u8]) -> Command {
    Command::new(Some(Session { client_id, seq }), data.to_vec())
}

fn membership() -> Membership<u64, NodeInfo> {
    let nodes: BTreeMap<u64, NodeInfo> = (1..=3)
        .map(|id| (id, NodeInfo::new(format!("10.0.0.{id}:7001"))))
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).expect("a membership")
}

/// A batch as a leader replicates it: application records of two
/// sessions and one without, a blank entry of a new term, a membership
/// change and a trim.
fn batch(first: u64) -> Vec<Entry> {
    let payloads = [
        EntryPayload::Blank,
        EntryPayload::Normal(command(0xc0ffee, 1, b"first record")),
        EntryPayload::Normal(command(0xc0ffee, 2, &[0xab; 200])),
        EntryPayload::Normal(Command::new(None, b"no session".to_vec())),
        EntryPayload::Membership(membership()),
        EntryPayload::Normal(Command {
            session: None,
            data: Vec::new(),
            control: Some(Control::Trim { before: first + 2 }),
        }),
        EntryPayload::Normal(command(7, 41, b"")),
    ];
    payloads
        .into_iter()
        .enumerate()
        .map(|(k, payload)| Entry {
            log_id: log_id(3, first + k as u64),
            payload,
        })
        .collect()
}

fn tail() -> Tail {
    Tail {
        next_lsn: 64 << 10,
        next_index: 108,
        last_term: 3,
        epoch: Epoch::new(3, 1).expect("an epoch"),
        unanchored: false,
        head_lsn: 4096,
    }
}

fn region(addr: u64, len: u64, rkey: u32) -> RemoteRegion {
    RemoteRegion { addr, len, rkey }
}

fn message_seeds(corpus: &Corpus) {
    let vote = Vote::new(3, 1);
    let epoch = Epoch::new(3, 1).expect("an epoch");
    let entries = batch(101);
    let inline = encode_entries(&entries).expect("entries encode");
    let requests = [
        ("grant", Request::Grant { epoch }),
        (
            "append-heartbeat",
            Request::Append {
                vote,
                prev_log_id: Some(log_id(3, 100)),
                leader_commit: Some(log_id(3, 99)),
                epoch,
                body: AppendBody::Empty,
            },
        ),
        (
            "append-written",
            Request::Append {
                vote,
                prev_log_id: Some(log_id(3, 100)),
                leader_commit: Some(log_id(3, 100)),
                epoch,
                body: AppendBody::Written {
                    from_lsn: 60 << 10,
                    to_lsn: 64 << 10,
                    count: 7,
                    last: log_id(3, 107),
                },
            },
        ),
        (
            "append-inline",
            Request::Append {
                vote,
                prev_log_id: Some(log_id(3, 100)),
                leader_commit: None,
                epoch,
                body: AppendBody::Inline {
                    part: 0,
                    parts: 1,
                    bytes: inline.clone(),
                },
            },
        ),
        (
            "vote",
            Request::Vote(VoteRequest::new(Vote::new(4, 2), Some(log_id(3, 107)))),
        ),
        (
            "pre-vote",
            Request::PreVote(VoteRequest::new(Vote::new(4, 2), None)),
        ),
        (
            "snapshot-part",
            Request::Snapshot {
                vote,
                meta: ringraft_fuzz::snapshot_meta(log_id(3, 100)),
                offset: 0,
                total: 300,
                data: vec![0x5a; 300.min(MAX_PART_BYTES)],
            },
        ),
        (
            "transfer",
            Request::TransferLeader(TransferLeaderRequest::new(vote, 2, Some(log_id(3, 107)))),
        ),
        (
            "propose",
            Request::Propose(vec![command(9, 1, b"forwarded"), command(9, 2, b"too")]),
        ),
        ("read-index", Request::ReadIndex { lease: true }),
    ];
    for (name, request) in &requests {
        let bytes = encode(request).expect("a request encodes");
        corpus.put(
            "messages",
            &format!("request-{name}"),
            &with_kind(0, &bytes),
        );
    }
    let data = region(0x7f00_0000_0000, 64 << 20, 0x1a2b);
    let replies = [
        ("granted", Reply::Granted { data, tail: tail() }),
        ("not-fenced", Reply::NotFenced { fence: epoch }),
        ("part-stored", Reply::PartStored),
        (
            "appended",
            Reply::Appended {
                response: AppendEntriesResponse::Success,
                tail: tail(),
            },
        ),
        (
            "rejected",
            Reply::Rejected {
                reason: "record 3: bad CRC".into(),
                tail: tail(),
            },
        ),
        (
            "voted",
            Reply::Voted(VoteResponse::new(
                Vote::new(4, 2),
                Some(log_id(3, 107)),
                true,
            )),
        ),
        ("installed", Reply::Installed(SnapshotResponse::new(vote))),
        ("transferred", Reply::Transferred(Ok(()))),
        (
            "proposed",
            Reply::Proposed(vec![
                Ok(Response {
                    index: 108,
                    data: b"answer".to_vec(),
                    duplicate: false,
                    out_of_order: None,
                }),
                Err("not the leader".into()),
            ]),
        ),
        ("read-index", Reply::ReadIndex(107)),
        ("not-leader", Reply::NotLeader(Some(2))),
        ("error", Reply::Error("storage: disk full".into())),
    ];
    for (name, reply) in &replies {
        let bytes = encode(reply).expect("a reply encodes");
        corpus.put("messages", &format!("reply-{name}"), &with_kind(1, &bytes));
    }
    let hello = Hello {
        cluster_id: 0x5249_4e47,
        node_id: 2,
        fence: region(0x7f00_0000_0000, 8, 0x77),
        head: region(0x7f00_0000_0040, 8, 0x77),
        capacity: 64 << 20,
        incarnation: 5,
    };
    corpus.put(
        "messages",
        "hello",
        &with_kind(2, &encode(&hello).expect("encodes")),
    );
    corpus.put(
        "messages",
        "join",
        &with_kind(
            3,
            &encode(&Join {
                cluster_id: 0x5249_4e47,
            })
            .expect("encodes"),
        ),
    );

    corpus.put("entries", "batch", &inline);
    corpus.put(
        "entries",
        "one",
        &encode_entries(&entries[1..2]).expect("encodes"),
    );
    corpus.put("entries", "empty", &encode_entries(&[]).expect("encodes"));
    for entry in &entries {
        let payload = bincode::serde::encode_to_vec(&entry.payload, bincode::config::standard())
            .expect("a payload encodes");
        let mut seed = Vec::new();
        seed.extend_from_slice(&entry.log_id.leader_id.term.to_le_bytes());
        seed.extend_from_slice(&entry.log_id.index.to_le_bytes());
        seed.extend_from_slice(&payload);
        corpus.put("entry", &format!("index-{}", entry.log_id.index), &seed);
    }
}

async fn snapshot_seeds(corpus: &Corpus) {
    // A state machine that applied sessions in and out of order,
    // duplicates and trims, snapshotted.
    let commands = [
        command(0xc0ffee, 1, b"one"),
        command(0xc0ffee, 3, b"early"),
        command(0xc0ffee, 2, b"two"),
        command(0xc0ffee, 2, b"retry"),
        command(42, 1, b"another client"),
        Command {
            session: None,
            data: Vec::new(),
            control: Some(Control::Trim { before: 12 }),
        },
        Command::new(None, b"plain".to_vec()),
    ];
    let empty = install_and_rebuild_from_nothing().await;
    let built = install_and_rebuild(&empty, log_id(3, 10), &commands)
        .await
        .expect("the commands apply")
        .expect("a built snapshot is accepted");
    for (name, session) in [("next", (0xc0ffee_u64, 3u64)), ("new-client", (77, 1))] {
        let mut seed = Vec::new();
        seed.extend_from_slice(&session.0.to_le_bytes());
        seed.extend_from_slice(&session.1.to_le_bytes());
        seed.extend_from_slice(&built.rebuilt);
        corpus.put("snapshot", name, &seed);
    }
    let mut seed = vec![0u8; 16];
    seed.extend_from_slice(&empty);
    corpus.put("snapshot", "empty", &seed);
}

/// The snapshot of a state machine that applied nothing.
async fn install_and_rebuild_from_nothing() -> Vec<u8> {
    use openraft::RaftSnapshotBuilder;
    let mut store = ringraft::SmStore::open(Box::new(ringraft_fuzz::Bytes::default()), None)
        .expect("a state machine");
    store.build_snapshot().await.expect("builds").snapshot
}

fn client_seeds(corpus: &Corpus) {
    let requests: Vec<(&str, u8, Vec<u8>)> = vec![
        (
            "append",
            0,
            proto::AppendRequest {
                client_id: 0x1234_5678_9abc,
                first_seq: 17,
                records: vec![b"record one".to_vec(), vec![0xee; 100], Vec::new()],
            }
            .encode_to_vec(),
        ),
        (
            "read",
            1,
            proto::ReadRequest {
                from: 5,
                to: 900,
                consistency: proto::Consistency::Lease as i32,
            }
            .encode_to_vec(),
        ),
        (
            "follow",
            2,
            proto::FollowRequest { from: 77 }.encode_to_vec(),
        ),
        ("status", 3, proto::StatusRequest {}.encode_to_vec()),
        ("members", 4, proto::MembersRequest {}.encode_to_vec()),
        (
            "add-learner",
            5,
            proto::AddLearnerRequest {
                id: 4,
                addr: "10.0.0.4:7001".into(),
            }
            .encode_to_vec(),
        ),
        (
            "promote",
            6,
            proto::PromoteRequest { ids: vec![4, 5] }.encode_to_vec(),
        ),
        (
            "remove",
            7,
            proto::RemoveRequest { ids: vec![3] }.encode_to_vec(),
        ),
        (
            "transfer",
            8,
            proto::TransferLeaderRequest { to: 2 }.encode_to_vec(),
        ),
        (
            "trim",
            9,
            proto::TrimRequest { before: 1000 }.encode_to_vec(),
        ),
    ];
    for (name, kind, bytes) in requests {
        corpus.put("client_requests", name, &with_kind(kind, &bytes));
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: seeds CORPUS_DIR");
    let corpus = Corpus(Path::new(&dir).to_path_buf());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        handshake_seeds(&corpus).await;
        frame_seeds(&corpus).await;
        snapshot_seeds(&corpus).await;
    });
    message_seeds(&corpus);
    client_seeds(&corpus);
}
