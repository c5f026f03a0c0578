//! The acceptor's glue: serves the connections of leaders and candidates,
//! one task per connection, taking requests in order and answering each on
//! the same connection, in order. What a request may do is the sans-IO
//! [`Acceptor`]'s decision; this module only reads the node's state for
//! it and performs the [`Step`] it returns (on the ring, the log store and
//! openraft). AppendEntries written one-sided (and heartbeats) are
//! pipelined to openraft (`pipeline`); calls a follower forwarded
//! (proposals, read indexes) are in flight together too, each proposal
//! handed to the Raft core in the order they came; any other request waits
//! until those in flight are answered. A malformed message closes that
//! connection and nothing else.

mod pipeline;

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use openraft::error::ClientWriteError;
use openraft::raft::{AppendEntriesRequest, VoteResponse};
use ringraft_transport::{Connection, Listener, Received};
use ringraft_wal::AdoptRequest;

use crate::NodeError;
use crate::fencing::FencedRing;
use crate::log_store::LogStore;
use crate::network::FORWARD_DEPTH;
use crate::protocol::{Reply, Request, decode, encode};
use crate::replication::Acceptor;
use crate::replication::acceptor::{AcceptorLimits, AppendMeta, NodeView, Step};
use crate::types::{Entry, Raft, TypeConfig};
pub use pipeline::FOLLOWER_PIPELINE_DEPTH;
use pipeline::Pipeline;

/// Largest two-sided entry batch accepted, in bytes.
pub use crate::protocol::MAX_INLINE_BATCH_BYTES;

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
    /// The seeds of the node's scopes: each connection's task gets one
    /// ([`crate::rt`]).
    pub seeds: Arc<crate::rt::Seeds>,
    /// Names accepted connections (a prepared adoption belongs to one):
    /// per node, so that the names do not depend on what else ran in the
    /// process.
    pub next_connection: std::sync::atomic::AtomicU64,
    /// Told of each peer whose connection ended without this side closing
    /// it, and of candidates refused for their log (the node's fast
    /// failover, `node::failover`).
    pub(crate) failover: crate::node::FailoverNews,
    /// The node's metrics (requests served).
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// What one connection's acceptor buffers, at most.
    pub limits: AcceptorLimits,
}

/// Serves `listener` until it closes, then waits for its connections.
/// The connections' tasks belong to this one: aborting it (the node's
/// shutdown) ends them too, so that none keeps the node's store alive.
pub fn spawn(mut listener: Listener, ctx: Arc<ServerCtx>) -> tokio::task::JoinHandle<()> {
    let seeds = ctx.seeds.clone();
    crate::rt::spawn(&seeds, async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                biased;
                // Finished connections are reaped as they end.
                Some(_) = connections.join_next() => {}
                conn = listener.accept() => match conn {
                    Some(conn) => {
                        let serve = serve_connection(conn, ctx.clone());
                        connections.spawn(crate::rt::scoped(ctx.seeds.next(), serve));
                    }
                    None => break,
                },
            }
        }
        while connections.join_next().await.is_some() {}
    })
}

/// Forwarded calls of one connection being answered, in the order they
/// came.
type ForwardedReplies = FuturesOrdered<BoxFuture<'static, Reply>>;

async fn serve_connection(conn: Connection, ctx: Arc<ServerCtx>) {
    let peer = conn.peer().node_id;
    let conn_id = ctx
        .next_connection
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut acceptor = Acceptor::new(peer, ctx.limits);
    let mut pipeline = Pipeline::new(ctx.clone(), conn_id);
    let mut forwarded = ForwardedReplies::new();
    loop {
        let received = tokio::select! {
            biased;
            reply = pipeline.next_reply(), if pipeline.busy() => {
                if !send_reply(&conn, &reply).await {
                    ctx.failover.lost(peer);
                    return;
                }
                continue;
            }
            Some(reply) = forwarded.next(), if !forwarded.is_empty() => {
                if !send_reply(&conn, &reply).await {
                    ctx.failover.lost(peer);
                    return;
                }
                continue;
            }
            received = conn.recv(), if pipeline.has_room() && forwarded.len() < FORWARD_DEPTH => received,
        };
        let bytes = match received {
            Ok(Received::Message(bytes)) => bytes,
            Ok(Received::WriteImmediate(_)) => continue,
            Err(_) => {
                ctx.failover.lost(peer);
                return;
            }
        };
        ctx.metrics.requests_served.inc();
        let request = match decode::<Request>(&bytes) {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(peer, error = %e, "malformed request; closing the connection");
                let _ = conn
                    .send(&encode(&Reply::Error(e)).unwrap_or_default())
                    .await;
                conn.close();
                return;
            }
        };
        // One kind in flight at a time: answers go back in the order the
        // requests came.
        if !Acceptor::forwarded(&request) && !answer_all(&conn, &mut forwarded).await {
            ctx.failover.lost(peer);
            return;
        }
        if Acceptor::pipelines(&request) {
            pipeline.submit(&mut acceptor, request).await;
            if let Some(reason) = pipeline.closing().map(str::to_string) {
                // What was taken before is answered, then the reason.
                while pipeline.busy() {
                    let reply = pipeline.next_reply().await;
                    if !send_reply(&conn, &reply).await {
                        break;
                    }
                }
                close_for(&conn, peer, &reason);
                return;
            }
            continue;
        }
        // Anything else is answered after what is in flight.
        while pipeline.busy() {
            let reply = pipeline.next_reply().await;
            if !send_reply(&conn, &reply).await {
                ctx.failover.lost(peer);
                return;
            }
        }
        if Acceptor::forwarded(&request) {
            let step = acceptor.on_request(request, &node_view(&ctx.store));
            forwarded.push_back(start_forwarded(&ctx, step).await);
            continue;
        }
        let reply = match handle(&mut acceptor, request, conn_id, &ctx).await {
            Ok(reply) => reply,
            Err(reason) => {
                let _ = send_reply(&conn, &Reply::Error(reason.clone())).await;
                close_for(&conn, peer, &reason);
                return;
            }
        };
        if !send_reply(&conn, &reply).await {
            ctx.failover.lost(peer);
            return;
        }
    }
}

/// Closes `conn` because its peer went past a limit or broke a rule
/// (the acceptor's [`Step::Close`]), saying why in the node's log.
fn close_for(conn: &Connection, peer: u64, reason: &str) {
    tracing::warn!(peer, %reason, "closing the connection");
    conn.close();
}

/// Sends the answers of every forwarded call taken, in order; false when
/// the connection is gone.
async fn answer_all(conn: &Connection, forwarded: &mut ForwardedReplies) -> bool {
    while let Some(reply) = forwarded.next().await {
        if !send_reply(conn, &reply).await {
            return false;
        }
    }
    true
}

/// Sends `reply`; false when the connection is gone.
async fn send_reply(conn: &Connection, reply: &Reply) -> bool {
    let encoded = match encode(reply) {
        Ok(b) => b,
        Err(e) => encode(&Reply::Error(format!("reply does not encode: {e}")))
            .expect("a short error encodes"),
    };
    conn.send(&encoded).await.is_ok()
}

/// The node's state as the acceptor needs it, read now.
pub(super) fn node_view(store: &LogStore) -> NodeView {
    NodeView {
        node_id: store.node_id(),
        fence: store.fence(),
        vote: store.vote(),
        votes_blocked: store.votes_blocked(),
    }
}

/// Answers one request: the acceptor decides, this performs. `Err` with
/// the reason when the connection is to be closed instead.
async fn handle(
    acceptor: &mut Acceptor,
    request: Request,
    conn_id: u64,
    ctx: &Arc<ServerCtx>,
) -> Result<Reply, String> {
    // From before the fence check until openraft is done with it: no grant
    // overlaps a request that may extend the log.
    let _in_flight = match request {
        Request::Append { .. } => Some(ctx.store.begin_leader_request().await),
        _ => None,
    };
    let peer = acceptor.peer();
    Ok(match acceptor.on_request(request, &node_view(&ctx.store)) {
        Step::Reply(reply) => reply,
        Step::Close(reason) => return Err(reason),
        Step::Grant { epoch } => grant(ctx, conn_id, epoch).await,
        Step::Append { ref entries, .. }
            if !entries.is_empty() && !ctx.store.holds_grant(conn_id) =>
        {
            superseded(ctx, peer, conn_id)
        }
        Step::Adopt { meta, request } => match adopt(ctx, peer, conn_id, request).await {
            Ok(entries) => append(ctx, conn_id, meta, entries, false).await,
            Err(reply) => reply,
        },
        Step::Append { meta, entries } => append(ctx, conn_id, meta, entries, true).await,
        Step::Vote { request, pre } => {
            let answer = if pre {
                ctx.raft.pre_vote(request).await
            } else {
                let answer = ctx.raft.vote(request.clone()).await;
                if let Ok(answer) = &answer {
                    ctx.failover.answered(
                        &request,
                        answer.vote_granted,
                        answer.last_log_id.as_ref(),
                    );
                }
                answer
            };
            match answer {
                Ok(resp) => Reply::Voted(resp),
                Err(e) => Reply::Error(e.to_string()),
            }
        }
        Step::RefuseVote(request) => refuse_vote(ctx, peer, request).await,
        Step::Install { vote, snapshot } => {
            match ctx.raft.install_full_snapshot(vote, snapshot).await {
                Ok(resp) => Reply::Installed(resp),
                Err(e) => Reply::Error(e.to_string()),
            }
        }
        Step::Transfer(request) => match ctx.raft.handle_transfer_leader(request).await {
            Ok(resp) => Reply::Transferred(resp),
            Err(e) => Reply::Error(e.to_string()),
        },
        step @ (Step::Propose(_) | Step::ReadIndex { .. }) => {
            start_forwarded(ctx, step).await.await
        }
    })
}

/// Starts a forwarded call; its answer comes from the future returned. A
/// proposal is handed to the Raft core before this returns, so that the
/// proposals of a connection enter the log in the order they came, while
/// their commits, like read indexes, overlap.
async fn start_forwarded(ctx: &Arc<ServerCtx>, step: Step) -> BoxFuture<'static, Reply> {
    match step {
        Step::Propose(commands) => {
            let count = commands.len();
            match crate::node::submit_here(&ctx.raft, &ctx.admission, commands).await {
                Ok(submitted) => async move { proposed(count, submitted.wait().await) }.boxed(),
                Err(refused) => futures::future::ready(proposed(count, Err(refused))).boxed(),
            }
        }
        Step::ReadIndex { lease } => {
            let ctx = ctx.clone();
            async move { read_index(&ctx, lease).await }.boxed()
        }
        Step::Reply(reply) => futures::future::ready(reply).boxed(),
        other => unreachable!("not a forwarded call: {other:?}"),
    }
}

/// Grants write access to the holder of `epoch` (see
/// [`FencedRing::grant`]) on connection `conn_id`.
async fn grant(ctx: &ServerCtx, conn_id: u64, epoch: ringraft_wal::Epoch) -> Reply {
    // With no leader request in flight: the tail told to the grantee
    // stays exact until it writes, and no other connection's batch moves
    // it after.
    ctx.store
        .exclusively(|| match ctx.ring.grant(&ctx.store, epoch) {
            Ok(data) => {
                ctx.store.granted_to(conn_id);
                Reply::Granted {
                    data,
                    tail: ctx.store.tail(),
                }
            }
            Err(fence) => Reply::NotFenced { fence },
        })
        .await
}

/// Refuses a batch on a connection that does not hold the last grant. Its
/// records are not erased: they may lie where the grantee writes.
fn superseded(ctx: &ServerCtx, peer: u64, conn_id: u64) -> Reply {
    tracing::info!(
        peer,
        conn = conn_id,
        "batch refused: another connection holds the last grant"
    );
    Reply::Rejected {
        reason: format!("connection {conn_id} does not hold the last grant"),
        tail: ctx.store.tail(),
    }
}

/// The records written one-sided into the ring, checked in place
/// (adoption rules) and held pending for this connection. `Err` is the
/// reply instead (a refusal).
pub(super) async fn adopt(
    ctx: &ServerCtx,
    peer: u64,
    conn_id: u64,
    request: AdoptRequest,
) -> Result<Vec<Entry>, Reply> {
    let to_lsn = request.to_lsn;
    match ctx.store.prepare_adoption(conn_id, request) {
        Ok(None) => Err(superseded(ctx, peer, conn_id)),
        Ok(Some(entries)) => {
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

/// openraft's AppendEntries with `entries`; those this node writes itself
/// (`needs_room`: two-sided) wait for room in the ring first.
async fn append(
    ctx: &ServerCtx,
    conn_id: u64,
    meta: AppendMeta,
    entries: Vec<Entry>,
    needs_room: bool,
) -> Reply {
    let room = if needs_room && !entries.is_empty() {
        match room_for(ctx, &entries).await {
            Ok(room) => Some(room),
            Err(reply) => return reply,
        }
    } else {
        None
    };
    let request = AppendEntriesRequest {
        vote: meta.vote,
        prev_log_id: meta.prev_log_id,
        entries,
        leader_commit: meta.leader_commit,
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

/// The reply to `count` commands a follower forwarded, proposed as one
/// batch in their order (`node::submit_here`): each one's answer, in order.
fn proposed(
    count: usize,
    result: Result<Vec<Result<crate::types::Response, ClientWriteError<TypeConfig>>>, NodeError>,
) -> Reply {
    match result {
        Err(stopped @ NodeError::Stopped(_)) => Reply::Error(stopped.to_string()),
        // Busy or too large (admission): nothing was proposed.
        Err(refused) => Reply::Proposed(vec![Err(refused.to_string()); count]),
        Ok(results) => match results.first() {
            Some(Err(ClientWriteError::ForwardToLeader(f))) => Reply::NotLeader(f.leader_id),
            _ => Reply::Proposed(
                results
                    .into_iter()
                    .map(|r| r.map_err(|e| e.to_string()))
                    .collect(),
            ),
        },
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
