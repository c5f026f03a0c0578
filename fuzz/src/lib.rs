//! What the fuzz targets share: the runtime they drive async code on, the
//! decoders reached by compiling their source files here, and the
//! harnesses that more than one target or the seed generator uses.
//!
//! One decoder lives where no library exposes it: the rdma endpoint
//! description (`transport/src/rdma/endpoint.rs`, a pure function in a
//! private module behind the `rdma` feature). Its file is compiled here
//! unchanged (`#[path]`), so that the decoder is fuzzed as it is, without
//! the RDMA libraries.

use std::io;
use std::sync::OnceLock;

use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;
use ringraft::types::{Command, Entry, LogId, SnapshotMeta, StoredMembership};
use ringraft::{Applied, SmStore, StateMachine};

/// The names `rdma/endpoint.rs` uses from its crate.
mod error {
    pub use ringraft_transport::error::{Result, TransportError};
}

/// `transport/src/rdma/endpoint.rs`, compiled as it is.
#[path = "../../transport/src/rdma/endpoint.rs"]
#[allow(dead_code)]
mod qp_endpoint;

/// Length of an rdma endpoint description.
pub const QP_ENDPOINT_BYTES: usize = qp_endpoint::ENDPOINT_BYTES;

/// `QpEndpoint::decode` over `bytes`, as a device does with what a peer
/// revealed; yields the accepted endpoint encoded again.
///
/// # Errors
///
/// What the device refuses the peer with.
pub fn decode_qp_endpoint(bytes: &[u8]) -> Result<Vec<u8>, String> {
    qp_endpoint::QpEndpoint::decode(bytes, "fuzz")
        .map(|endpoint| endpoint.encode())
        .map_err(|e| e.to_string())
}

/// The fields of an accepted rdma endpoint description, as decoded.
pub fn qp_endpoint_fields(bytes: &[u8]) -> Option<(u32, u32, u8, u32, u8)> {
    let e = qp_endpoint::QpEndpoint::decode(bytes, "fuzz").ok()?;
    Some((
        e.qpn,
        e.psn,
        e.mtu,
        e.recv_buffer_bytes,
        e.max_dest_rd_atomic,
    ))
}

/// An rdma endpoint description as a device of Soft-RoCE reveals it.
pub fn qp_endpoint_example(qpn: u32, psn: u32) -> Vec<u8> {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 77, 0, 11]);
    qp_endpoint::QpEndpoint {
        qpn,
        psn,
        gid,
        lid: 0,
        mtu: 3,
        recv_buffer_bytes: 64 << 10,
        max_dest_rd_atomic: 16,
    }
    .encode()
}

/// A single-threaded tokio runtime with paused time, built once per
/// process: the handshake's and the state machine's async code runs on it
/// deterministically, and no timeout fires while work is left.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime")
    })
}

/// A state machine whose state is the bytes of its last snapshot.
#[derive(Default)]
pub struct Bytes(pub Vec<u8>);

impl StateMachine for Bytes {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        batch
            .iter()
            .map(|a| a.index.to_le_bytes().to_vec())
            .collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.0 = snapshot.to_vec();
        Ok(())
    }
}

/// The snapshot metadata the snapshot harness installs with.
pub fn snapshot_meta(last: LogId) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::default(),
    }
}

/// What [`install_and_rebuild`] saw.
#[derive(Debug)]
pub struct Installed {
    /// The body the state machine built right after installing.
    pub rebuilt: Vec<u8>,
    /// The last applied index after the commands.
    pub applied_index: u64,
}

/// Installs `body` as a snapshot received from a leader (openraft's
/// `install_snapshot` on a fresh [`SmStore`]), applies `commands` after
/// it, and builds a snapshot of the result; `Ok(None)` when the body is
/// refused.
///
/// # Errors
///
/// A failure after the body was accepted.
pub async fn install_and_rebuild(
    body: &[u8],
    last: LogId,
    commands: &[Command],
) -> io::Result<Option<Installed>> {
    let mut store = SmStore::open(Box::new(Bytes::default()), None)?;
    let meta = snapshot_meta(last);
    if store.install_snapshot(&meta, body.to_vec()).await.is_err() {
        return Ok(None);
    }
    let mut entries = Vec::new();
    for (k, command) in commands.iter().enumerate() {
        let log_id = ringraft::types::log_id(last.leader_id.term, last.index + 1 + k as u64);
        entries.push(Ok((
            Entry {
                log_id,
                payload: openraft::EntryPayload::Normal(command.clone()),
            },
            None,
        )));
    }
    store.apply(futures::stream::iter(entries)).await?;
    let applied_index = *store.watch_applied().borrow();
    let built = store.build_snapshot().await?;
    Ok(Some(Installed {
        rebuilt: built.snapshot,
        applied_index,
    }))
}

/// Everything in `bytes` from `at` on (empty past the end).
pub fn tail(bytes: &[u8], at: usize) -> &[u8] {
    bytes.get(at..).unwrap_or(&[])
}

/// A little-endian u64 from `bytes` at `at` (zero-padded past the end).
pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    for (k, b) in word.iter_mut().enumerate() {
        *b = bytes.get(at + k).copied().unwrap_or(0);
    }
    u64::from_le_bytes(word)
}
