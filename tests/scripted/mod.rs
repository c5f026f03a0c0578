//! A scripted follower: a bare device of the in-process fabric that plays a
//! follower's side of the protocol by hand (its ring's registrations, the
//! `Hello` it reveals, a `Reply` for each `Request`), so that a test drives
//! the real leader side (`ringraft::network`) through an exact sequence of
//! answers, good or bad, and sees every request the leader sends.

// Each test binary that includes the kit uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use ringraft::network::{NetCtx, NetworkFactory, PeerNet};
use ringraft::protocol::{Hello, MAX_MESSAGE_BYTES, Reply, Request, Tail, decode, encode};
use ringraft::types::{Entry, LogId, NodeInfo, Vote, log_id};
use ringraft::{Command, TypeConfig};
use ringraft_transport::inproc::Fabric;
use ringraft_transport::{
    Access, Buffer, ConnConfig, Connection, Device, DeviceConfig, Listener, Received, Secret,
    reveal_to_all,
};
use ringraft_wal::Epoch;

/// The cluster of the scripted runs.
pub const CLUSTER_ID: u64 = 0x5343_5249;
/// Its secret.
pub const SECRET: &[u8] = b"scripted follower secret";
/// The smallest ring a follower may have (what these tests give it).
pub const CAPACITY: u64 = ringraft_wal::layout::MIN_CAPACITY_BYTES;
/// A safety net against hangs; never what a test asserts.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The fabric address of node `id`.
pub fn addr(id: u64) -> String {
    format!("node{id}")
}

/// Connection parameters (messages as large as the protocol's).
pub fn conn_config() -> ConnConfig {
    ConnConfig {
        max_message_bytes: MAX_MESSAGE_BYTES,
        ..ConnConfig::default()
    }
}

/// The device of node `id` on `fabric`.
pub fn device(fabric: &Fabric, id: u64) -> Device {
    fabric.device(
        &addr(id),
        DeviceConfig {
            node_id: id,
            secret: Secret::new(SECRET.to_vec()).expect("a valid secret"),
            limits: Default::default(),
        },
    )
}

/// The real leader side of node `leader` towards node `target`: what
/// openraft gets from ringraft's network factory.
pub async fn leader_client(fabric: &Fabric, leader: u64, target: u64) -> PeerNet {
    let ctx = NetCtx::new(
        device(fabric, leader),
        leader,
        CLUSTER_ID,
        conn_config(),
        Arc::new(ringraft::metrics::Metrics::default()),
    );
    NetworkFactory::new(Arc::new(ctx))
        .new_client(target, &NodeInfo { addr: addr(target) })
        .await
}

/// The vote of leader `node` in `term`.
pub fn leader_vote(term: u64, node: u64) -> Vote {
    Vote::new_committed(term, node)
}

/// Entries `first..=last` of `term`.
pub fn entries(term: u64, first: u64, last: u64) -> Vec<Entry> {
    (first..=last)
        .map(|index| Entry {
            log_id: log_id(term, index),
            payload: openraft::EntryPayload::Normal(Command {
                session: None,
                data: format!("entry {index}").into_bytes(),
                control: None,
            }),
        })
        .collect()
}

/// An AppendEntries of `leader` in `term` carrying `entries` after `prev`.
pub fn append(
    term: u64,
    leader: u64,
    prev: Option<LogId>,
    entries: Vec<Entry>,
) -> openraft::raft::AppendEntriesRequest<TypeConfig> {
    openraft::raft::AppendEntriesRequest {
        vote: leader_vote(term, leader),
        prev_log_id: prev,
        entries,
        leader_commit: None,
    }
}

/// A follower's tail: the next record at `next_lsn`, after entry
/// `last` (written under `epoch`), head at 0.
pub fn tail(next_lsn: u64, last: LogId, epoch: Epoch) -> Tail {
    Tail {
        next_lsn,
        next_index: last.index + 1,
        last_term: last.leader_id.term,
        epoch,
        unanchored: false,
        head_lsn: 0,
    }
}

/// A follower played by the test.
pub struct ScriptedFollower {
    /// Its node id.
    pub id: u64,
    /// Its device (the listener lasts as long as it does).
    _device: Device,
    /// Its fence word (remote READ and ATOMIC).
    pub fence: Buffer,
    /// Its head word (remote READ).
    pub head: Buffer,
    /// Its data area (remote WRITE).
    pub data: Buffer,
    listener: Listener,
}

impl ScriptedFollower {
    /// Node `id` listening on `fabric` with a ring of [`CAPACITY`] bytes;
    /// `spoil` may change the `Hello` it reveals.
    pub async fn start(fabric: &Fabric, id: u64, spoil: impl FnOnce(&mut Hello)) -> Self {
        let device = device(fabric, id);
        let word = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let fence = device.register_buffer(8, word).unwrap();
        let head = device.register_buffer(8, Access::REMOTE_READ).unwrap();
        let data = device
            .register_buffer(
                CAPACITY as usize,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
        let mut hello = Hello {
            cluster_id: CLUSTER_ID,
            node_id: id,
            fence: fence.remote(),
            head: head.remote(),
            capacity: CAPACITY,
            incarnation: 1,
        };
        spoil(&mut hello);
        let listener = device
            .listen(
                &addr(id),
                conn_config(),
                reveal_to_all(encode(&hello).unwrap()),
            )
            .await
            .unwrap();
        ScriptedFollower {
            id,
            _device: device,
            fence,
            head,
            data,
            listener,
        }
    }

    /// The next connection a leader makes.
    pub async fn accept(&mut self) -> Connection {
        tokio::time::timeout(PATIENCE, self.listener.accept())
            .await
            .expect("a leader connects")
            .expect("the listener is up")
    }

    /// The next connection, if one comes within `wait`.
    pub async fn try_accept(&mut self, wait: Duration) -> Option<Connection> {
        tokio::time::timeout(wait, self.listener.accept())
            .await
            .ok()
            .flatten()
    }
}

/// The next request on `conn`, or why none came.
pub async fn next_request(conn: &Connection) -> Result<Request, String> {
    match tokio::time::timeout(PATIENCE, conn.recv()).await {
        Err(_) => Err("no request in time".into()),
        Ok(Err(e)) => Err(format!("the connection broke: {e}")),
        Ok(Ok(Received::Message(bytes))) => decode(&bytes),
        Ok(Ok(other)) => Err(format!("not a message: {other:?}")),
    }
}

/// Answers on `conn`.
pub async fn answer(conn: &Connection, reply: &Reply) {
    conn.send(&encode(reply).unwrap())
        .await
        .expect("the follower answers on the connection the leader keeps");
}
