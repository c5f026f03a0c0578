//! The peer pool: making connections to peers (in tasks of their own, so
//! that an RPC timeout shorter than a slow fabric's setup does not cancel
//! every attempt), checking who answered, and keeping one healthy idle
//! connection per target for the next client (openraft makes a new client
//! for every round of votes). It owns no protocol state: what a leader
//! knows about a follower's ring lives in [`super::peer`].

use std::sync::Arc;
use std::time::Duration;

use ringraft_transport::{ConnConfig, Connection, Device};

use crate::protocol::{Hello, decode};
use crate::replication::ReplicationError;
use crate::replication::checks::check_hello;

/// What every client needs.
pub struct NetCtx {
    /// The fabric device.
    pub device: Device,
    /// This node.
    pub node_id: u64,
    /// The cluster.
    pub cluster_id: u64,
    /// Connection parameters.
    pub conn_config: ConnConfig,
    /// Metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// This node's log store, whose encodings of the entries it appended
    /// last the links WRITE as they are (none: every entry is encoded for
    /// each follower).
    pub log: crate::log_store::WeakLogStore,
    /// What clients that are gone left for the next client of the same
    /// target (openraft makes a new client for every round of votes).
    pub(crate) spare: std::sync::Mutex<std::collections::HashMap<u64, Spare>>,
}

impl NetCtx {
    /// What the clients of node `node_id` of cluster `cluster_id` need
    /// (without a log store: see [`NetCtx::log`]).
    pub fn new(
        device: Device,
        node_id: u64,
        cluster_id: u64,
        conn_config: ConnConfig,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> NetCtx {
        NetCtx {
            device,
            node_id,
            cluster_id,
            conn_config,
            metrics,
            log: Default::default(),
            spare: Default::default(),
        }
    }
}

/// A connection a client left behind.
pub(crate) enum Spare {
    /// Still being made (its client gave up waiting).
    Connecting(tokio::task::JoinHandle<Result<Connection, String>>),
    /// Made, healthy, with no request in flight.
    Idle(Connection),
}

/// Awaits a connection being made; dropped before it is made, it leaves
/// the attempt to the next client of the same target.
struct Pending {
    ctx: Arc<NetCtx>,
    target: u64,
    handle: Option<tokio::task::JoinHandle<Result<Connection, String>>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take()
            && let Ok(mut spare) = self.ctx.spare.lock()
        {
            spare
                .entry(self.target)
                .or_insert(Spare::Connecting(handle));
        }
    }
}

/// How long one attempt to connect to a peer may take (it runs on even
/// when the RPC that started it gives up).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to one peer and what was learnt through it.
pub(super) struct PeerConn {
    pub(super) conn: Connection,
    pub(super) hello: Hello,
}

/// A connection to `target` at `addr`, checked to be that node of this
/// cluster: an idle one or an attempt left by an earlier client of the
/// target first, else a new attempt.
pub(super) async fn connect(
    ctx: Arc<NetCtx>,
    target: u64,
    addr: String,
) -> Result<PeerConn, ReplicationError> {
    let (ctx, addr) = (&ctx, addr.as_str());
    // A connection made in a task of its own, so that an RPC timeout
    // shorter than a slow fabric's connection setup (rdma under TCG)
    // does not cancel every attempt; an attempt or an idle
    // connection left by an earlier client of this target first.
    let spare = ctx.spare.lock().ok().and_then(|mut s| s.remove(&target));
    let conn = match spare {
        Some(Spare::Idle(conn)) if conn.error().is_none() => conn,
        spare => {
            let handle = match spare {
                Some(Spare::Connecting(handle)) => handle,
                _ => {
                    let (ctx, addr) = (ctx.clone(), addr.to_string());
                    tokio::spawn(async move {
                        let join = crate::protocol::Join::bytes(ctx.cluster_id);
                        let connect = ctx.device.connect(&addr, ctx.conn_config.clone(), join);
                        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                            Ok(r) => r.map_err(|e| e.to_string()),
                            Err(_) => Err(format!("no connection within {CONNECT_TIMEOUT:?}")),
                        }
                    })
                }
            };
            let mut pending = Pending {
                ctx: ctx.clone(),
                target,
                handle: Some(handle),
            };
            let joined = pending.handle.as_mut().expect("just set").await;
            pending.handle = None;
            joined
                .map_err(|e| format!("connection task: {e}"))
                .and_then(|r| r)
                .map_err(|e| ReplicationError::Unreachable {
                    node: target,
                    why: format!("at {addr}: {e}"),
                })?
        }
    };
    let hello: Hello = match decode(&conn.peer().reveal.app_data) {
        Ok(hello) => hello,
        Err(e) => {
            conn.close();
            return Err(ReplicationError::Protocol {
                node: target,
                what: format!("a bad handshake at {addr}: {e}"),
            });
        }
    };
    if hello.cluster_id != ctx.cluster_id || hello.node_id != target {
        conn.close();
        return Err(ReplicationError::Unreachable {
            node: target,
            why: format!(
                "{addr} is node {} of cluster {:#x}, not of cluster {:#x}",
                hello.node_id, hello.cluster_id, ctx.cluster_id
            ),
        });
    }
    if let Err(e) = check_hello(&hello) {
        conn.close();
        return Err(ReplicationError::Protocol {
            node: target,
            what: format!("a bad handshake at {addr}: {e}"),
        });
    }
    Ok(PeerConn { conn, hello })
}

/// Leaves `conn` to the next client of `target` when it is healthy and
/// nothing is owed on it (`quiet`; at most one per target); closes it
/// otherwise.
pub(super) fn leave(ctx: &NetCtx, target: u64, conn: Connection, quiet: bool) {
    if quiet
        && conn.error().is_none()
        && let Ok(mut spare) = ctx.spare.lock()
        && !spare.contains_key(&target)
    {
        spare.insert(target, Spare::Idle(conn));
        return;
    }
    conn.close();
}
