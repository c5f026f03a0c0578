//! The acceptor side of the control plane: what a node does with the
//! requests of leaders and candidates.
//!
//! Each accepted connection is served by a task that takes requests in
//! order and answers each on the same connection. The interesting one is
//! AppendEntries whose entries were WRITTEN into this node's ring: the
//! records are checked in place (adoption rules: epoch equal to the fence),
//! their payloads handed to openraft, and taken into the log where they lie
//! when openraft appends them. A malformed message closes that connection
//! and nothing else.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, VoteResponse};
use ringraft_transport::{Connection, Listener, Received};
use ringraft_wal::{AdoptRequest, Epoch, LogPos};

use crate::fencing::FencedRing;
use crate::log_store::LogStore;
use crate::protocol::{AppendBody, Reply, Request, decode, encode};
use crate::state_machine::MAX_SNAPSHOT_BYTES;
use crate::types::{Entry, Raft, SnapshotMeta, Vote, term_of};

/// Largest two-sided entry batch accepted, in bytes.
pub const MAX_INLINE_BATCH_BYTES: u64 = 256 << 20;

/// What the request handlers need.
pub struct ServerCtx {
    /// The raft handle.
    pub raft: Raft,
    /// This node's log store.
    pub store: LogStore,
    /// This node's ring registrations.
    pub ring: Arc<FencedRing>,
    /// Test hooks, if the node was built with them.
    pub hooks: Option<crate::hooks::Hooks>,
    /// Admission by free ring space, in front of forwarded proposals.
    pub admission: crate::admission::Admission,
}

/// Names accepted connections (a prepared adoption belongs to one).
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Serves `listener` until it closes.
pub fn spawn(mut listener: Listener, ctx: Arc<ServerCtx>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(conn) = listener.accept().await {
            tokio::spawn(serve_connection(conn, ctx.clone()));
        }
    })
}

#[derive(Default)]
struct Partial {
    inline: Vec<u8>,
    inline_parts: u32,
    snapshot: Vec<u8>,
    snapshot_meta: Option<SnapshotMeta>,
}

async fn serve_connection(conn: Connection, ctx: Arc<ServerCtx>) {
    let peer = conn.peer().node_id;
    let conn_id = NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut partial = Partial::default();
    loop {
        let bytes = match conn.recv().await {
            Ok(Received::Message(bytes)) => bytes,
            Ok(Received::WriteImmediate(_)) => continue,
            Err(_) => return,
        };
        let reply = match decode::<Request>(&bytes) {
            Ok(request) => handle(request, peer, conn_id, &ctx, &mut partial).await,
            Err(e) => {
                tracing::warn!(peer, error = %e, "malformed request; closing the connection");
                let _ = conn
                    .send(&encode(&Reply::Error(e)).unwrap_or_default())
                    .await;
                conn.close();
                return;
            }
        };
        let encoded = match encode(&reply) {
            Ok(b) => b,
            Err(e) => encode(&Reply::Error(format!("reply does not encode: {e}")))
                .expect("a short error encodes"),
        };
        if conn.send(&encoded).await.is_err() {
            return;
        }
    }
}

fn not_fenced(store: &LogStore) -> Reply {
    Reply::NotFenced {
        fence: store.fence(),
    }
}

/// True when `epoch` is the ring's fence and belongs to `peer`.
fn fenced_by(store: &LogStore, epoch: Epoch, peer: u64) -> bool {
    epoch.leader_id() == peer && store.fence() == epoch
}

async fn handle(
    request: Request,
    peer: u64,
    conn_id: u64,
    ctx: &ServerCtx,
    partial: &mut Partial,
) -> Reply {
    match request {
        Request::Grant { epoch } => grant(ctx, peer, epoch).await,
        Request::Append {
            vote,
            prev_log_id,
            leader_commit,
            epoch,
            body,
        } => {
            if vote.leader_id.voted_for != peer {
                return Reply::Error(format!(
                    "node {peer} sent a vote for node {}",
                    vote.leader_id.voted_for
                ));
            }
            append(
                ctx,
                peer,
                conn_id,
                vote,
                prev_log_id,
                leader_commit,
                epoch,
                body,
                partial,
            )
            .await
        }
        Request::Vote(req) | Request::PreVote(req) if ctx.store.votes_blocked() => {
            refuse_vote(ctx, peer, req).await
        }
        Request::Vote(req) => match ctx.raft.vote(req).await {
            Ok(resp) => Reply::Voted(resp),
            Err(e) => Reply::Error(e.to_string()),
        },
        Request::PreVote(req) => match ctx.raft.pre_vote(req).await {
            Ok(resp) => Reply::Voted(resp),
            Err(e) => Reply::Error(e.to_string()),
        },
        Request::Snapshot {
            vote,
            meta,
            offset,
            total,
            data,
        } => snapshot_part(ctx, partial, vote, meta, offset, total, data).await,
        // openraft's election by leadership transfer ignores `enable_elect`:
        // the no-vote rule of a log corrupt inside is enforced here.
        Request::TransferLeader(req)
            if *req.to_node_id() == ctx.store.node_id() && ctx.store.votes_blocked() =>
        {
            tracing::info!(
                peer,
                "leadership transfer refused: this node's log is corrupt inside until re-replicated"
            );
            Reply::Error(format!(
                "node {} refuses the leadership: its log is corrupt inside until a leader \
                 re-replicates past the break",
                ctx.store.node_id()
            ))
        }
        Request::TransferLeader(req) => match ctx.raft.handle_transfer_leader(req).await {
            Ok(resp) => Reply::Transferred(resp),
            Err(e) => Reply::Error(e.to_string()),
        },
        Request::Propose(commands) => propose(ctx, commands).await,
        Request::ReadIndex { lease } => read_index(ctx, lease).await,
    }
}

/// Grants write access to `peer`, the holder of `epoch` (see
/// [`FencedRing::grant`]).
async fn grant(ctx: &ServerCtx, peer: u64, epoch: Epoch) -> Reply {
    if epoch.leader_id() != peer {
        return Reply::Error(format!("epoch {epoch} is not node {peer}'s"));
    }
    // With no leader request in flight: the tail told to the grantee
    // stays exact until it writes.
    ctx.store
        .exclusively(|| match ctx.ring.grant(&ctx.store, epoch) {
            Ok(data) => Reply::Granted {
                data,
                tail: ctx.store.tail(),
            },
            Err(fence) => Reply::NotFenced { fence },
        })
        .await
}

/// The answer to a (pre-)vote while this node's log is corrupt inside: no.
async fn refuse_vote(
    ctx: &ServerCtx,
    peer: u64,
    req: openraft::raft::VoteRequest<crate::types::TypeConfig>,
) -> Reply {
    let mut reader = ctx.store.clone();
    let current = openraft::storage::RaftLogReader::read_vote(&mut reader)
        .await
        .ok()
        .flatten()
        .unwrap_or(req.vote);
    let last = ctx.store.tail().last_log_id();
    tracing::info!(
        peer,
        "vote refused: this node's log is corrupt inside until re-replicated"
    );
    Reply::Voted(VoteResponse::new(current, last, false))
}

/// The read index of this node as the leader (under its lease with
/// `lease`), or who the leader is.
async fn read_index(ctx: &ServerCtx, lease: bool) -> Reply {
    let policy = if lease {
        openraft::ReadPolicy::LeaseRead
    } else {
        openraft::ReadPolicy::ReadIndex
    };
    match ctx.raft.ensure_linearizable(policy).await {
        Ok(read) => Reply::ReadIndex(read.index()),
        Err(openraft::error::RaftError::APIError(
            openraft::error::LinearizableReadError::ForwardToLeader(f),
        )) => Reply::NotLeader(f.leader_id),
        Err(e) => Reply::Error(e.to_string()),
    }
}

/// Proposes commands a follower forwarded, as one batch in their order
/// (`node::propose_here`); answers each in order.
async fn propose(ctx: &ServerCtx, commands: Vec<crate::types::Command>) -> Reply {
    if commands.len() > crate::protocol::MAX_FORWARDED_COMMANDS {
        return Reply::Error(format!("{} commands in one forward", commands.len()));
    }
    let count = commands.len();
    match crate::node::propose_here(&ctx.raft, &ctx.admission, commands).await {
        Err(stopped @ crate::NodeError::Stopped(_)) => Reply::Error(stopped.to_string()),
        // Busy or too large (admission): nothing was proposed.
        Err(refused) => Reply::Proposed(vec![Err(refused.to_string()); count]),
        Ok(results) => match results.first() {
            Some(Err(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
                Reply::NotLeader(f.leader_id)
            }
            _ => Reply::Proposed(
                results
                    .into_iter()
                    .map(|r| r.map_err(|e| e.to_string()))
                    .collect(),
            ),
        },
    }
}

#[allow(clippy::too_many_arguments)]
async fn append(
    ctx: &ServerCtx,
    peer: u64,
    conn_id: u64,
    vote: Vote,
    prev_log_id: Option<crate::types::LogId>,
    leader_commit: Option<crate::types::LogId>,
    epoch: Epoch,
    body: AppendBody,
    partial: &mut Partial,
) -> Reply {
    // From before the fence check until openraft is done with it: no grant
    // overlaps a request that may extend the log.
    let _in_flight = ctx.store.begin_leader_request().await;
    let inline = matches!(body, AppendBody::Inline { .. });
    let entries = match entries_of(ctx, peer, conn_id, epoch, body, partial).await {
        Ok(entries) => entries,
        Err(reply) => return reply,
    };
    // Entries already in the ring (adopted in place) need no room.
    let room = if inline && !entries.is_empty() {
        match room_for(ctx, &entries).await {
            Ok(room) => Some(room),
            Err(reply) => return reply,
        }
    } else {
        None
    };
    let request = AppendEntriesRequest {
        vote,
        prev_log_id,
        entries,
        leader_commit,
    };
    let result = ctx.raft.append_entries(request).await;
    drop(room);
    // Records openraft did not take stay out of the log, and are erased.
    ctx.store.drop_pending(conn_id);
    match result {
        Ok(response) => Reply::Appended {
            response,
            tail: ctx.store.tail(),
        },
        Err(e) => Reply::Error(e.to_string()),
    }
}

/// The entries of an AppendEntries' `body`: adopted in place (one-sided,
/// after the fence check and the adoption rules) or decoded from its
/// two-sided parts. `Err` is the reply instead (a part stored, a refusal).
async fn entries_of(
    ctx: &ServerCtx,
    peer: u64,
    conn_id: u64,
    epoch: Epoch,
    body: AppendBody,
    partial: &mut Partial,
) -> Result<Vec<Entry>, Reply> {
    match body {
        AppendBody::Empty => Ok(Vec::new()),
        AppendBody::Written {
            from_lsn,
            to_lsn,
            count,
            last,
        } => {
            if !fenced_by(&ctx.store, epoch, peer) {
                return Err(not_fenced(&ctx.store));
            }
            let request = AdoptRequest {
                from_lsn,
                to_lsn,
                entries: count,
                last: Some(LogPos {
                    term: term_of(&last),
                    index: last.index,
                }),
            };
            match ctx.store.prepare_adoption(conn_id, request) {
                Ok(entries) => {
                    crate::hooks::pass(
                        ctx.hooks.as_ref(),
                        crate::hooks::HookPoint::AdoptionPrepared,
                    )
                    .await;
                    Ok(entries)
                }
                Err(e) => {
                    tracing::warn!(peer, error = %e, "written records refused");
                    ctx.store.reject_written(conn_id, to_lsn);
                    Err(Reply::Rejected {
                        reason: e.to_string(),
                        tail: ctx.store.tail(),
                    })
                }
            }
        }
        AppendBody::Inline { part, parts, bytes } => {
            if part == 0 {
                partial.inline.clear();
                partial.inline_parts = 0;
            }
            if part != partial.inline_parts || parts == 0 || part >= parts {
                partial.inline.clear();
                return Err(Reply::Error(format!(
                    "inline part {part} of {parts} out of order"
                )));
            }
            if partial.inline.len() as u64 + bytes.len() as u64 > MAX_INLINE_BATCH_BYTES {
                partial.inline.clear();
                return Err(Reply::Error("inline entry batch too large".into()));
            }
            partial.inline.extend_from_slice(&bytes);
            partial.inline_parts += 1;
            if partial.inline_parts < parts {
                return Err(Reply::PartStored);
            }
            let bytes = std::mem::take(&mut partial.inline);
            let entries: Vec<Entry> = match decode_entries(&bytes) {
                Ok(e) => e,
                Err(e) => return Err(Reply::Error(e)),
            };
            if !entries.is_empty() && !fenced_by(&ctx.store, epoch, peer) {
                return Err(not_fenced(&ctx.store));
            }
            Ok(entries)
        }
    }
}

/// Room in the ring for entries this node writes itself (two-sided), as a
/// leader's proposals wait for it: the flusher gives room back as it
/// writes the ring's records to the segments. `Err` is the reply instead.
async fn room_for(ctx: &ServerCtx, entries: &[Entry]) -> Result<crate::admission::Admitted, Reply> {
    let mut need = 0u64;
    for entry in entries {
        match crate::log_store::encode_payload(&entry.payload) {
            Ok(p) => need += ringraft_wal::record::record_len(p.len() as u64),
            Err(e) => return Err(Reply::Error(format!("entry {}: {e}", entry.log_id.index))),
        }
    }
    ctx.admission
        .admit_bytes(need)
        .await
        .map_err(|e| Reply::Error(format!("no room in the ring for the entries: {e}")))
}

fn decode_entries(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let config = bincode::config::standard().with_limit::<{ MAX_INLINE_BATCH_BYTES as usize }>();
    let (entries, used): (Vec<Entry>, usize) = bincode::serde::decode_from_slice(bytes, config)
        .map_err(|e| format!("malformed entries: {e}"))?;
    if used != bytes.len() {
        return Err("trailing bytes after the entries".into());
    }
    Ok(entries)
}

/// Encodes entries for a two-sided AppendEntries.
pub fn encode_entries(entries: &[Entry]) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(entries, bincode::config::standard()).map_err(|e| e.to_string())
}

async fn snapshot_part(
    ctx: &ServerCtx,
    partial: &mut Partial,
    vote: Vote,
    meta: SnapshotMeta,
    offset: u64,
    total: u64,
    data: Vec<u8>,
) -> Reply {
    if total > MAX_SNAPSHOT_BYTES {
        return Reply::Error(format!("snapshot of {total} bytes is above the limit"));
    }
    if offset == 0 {
        partial.snapshot.clear();
        partial.snapshot_meta = Some(meta.clone());
    }
    if offset != partial.snapshot.len() as u64 || partial.snapshot_meta.as_ref() != Some(&meta) {
        partial.snapshot.clear();
        partial.snapshot_meta = None;
        return Reply::Error(format!("snapshot part at {offset} out of order"));
    }
    if offset + data.len() as u64 > total {
        partial.snapshot.clear();
        return Reply::Error("snapshot part beyond its total".into());
    }
    partial.snapshot.extend_from_slice(&data);
    if (partial.snapshot.len() as u64) < total {
        return Reply::PartStored;
    }
    let snapshot = openraft::Snapshot {
        meta,
        snapshot: std::mem::take(&mut partial.snapshot),
    };
    partial.snapshot_meta = None;
    match ctx.raft.install_full_snapshot(vote, snapshot).await {
        Ok(resp) => Reply::Installed(resp),
        Err(e) => Reply::Error(e.to_string()),
    }
}
