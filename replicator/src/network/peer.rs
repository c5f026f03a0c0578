//! The leader's glue for one follower: performs the sans-IO [`Link`]'s
//! operations on a connection and feeds it what happens (completions,
//! replies, the time). It makes no decision of its own: which bytes go
//! where, when to fence, how a reply is read are the link's. It never makes
//! a connection itself (that is [`super::pool`]'s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use ringraft_transport::{Chained, Received};
use sync_wrapper::SyncWrapper;

use super::pool::{self, NetCtx, PeerConn};
use crate::log_store::Payloads;
use crate::protocol::{Reply, Request, decode, encode};
use crate::replication::{
    Answer, AppendRequest, Completion, Link, LinkConfig, LinkEvent, Op, OpId, ReplicationError,
    Ticket,
};

/// AppendEntries batches in flight per follower.
pub const PIPELINE_DEPTH: usize = 8;
/// How long a leader waits for room in a follower's ring (re-reading its
/// head) before it reports the follower unreachable for now.
pub const RING_FULL_WAIT: Duration = Duration::from_secs(2);

type Completing = BoxFuture<'static, (OpId, Completion)>;
type Connecting = BoxFuture<'static, Result<PeerConn, ReplicationError>>;

/// The client of one target. See the module docs.
pub struct PeerNet {
    ctx: Arc<NetCtx>,
    pub(super) target: u64,
    addr: String,
    pub(super) link: Link,
    conn: Option<PeerConn>,
    /// A connection being made. (openraft wants its clients `Sync`; the
    /// glue only ever polls these through `&mut self`.)
    connecting: SyncWrapper<Option<Connecting>>,
    /// The completions of the operations posted, as they come.
    completions: SyncWrapper<FuturesUnordered<Completing>>,
    /// PLANTED BUG (test-only): requests acknowledged but not yet sent.
    #[cfg(feature = "planted-bugs")]
    pub(super) planted_backlog: std::collections::VecDeque<(tokio::time::Instant, AppendRequest)>,
}

/// What woke the glue up.
pub(super) enum Woke<T> {
    /// The next item of the input stream (`None`: the stream ended).
    Input(Option<T>),
    /// Something for the link.
    Link,
}

/// The time the link's decisions are made at (tokio's clock, so that
/// paused time in tests and the simulator reaches the link).
pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        // A healthy connection with nothing owed on it is left to the next
        // client of this target.
        if let Some(peer) = self.conn.take() {
            pool::leave(&self.ctx, self.target, peer.conn, self.link.is_quiet());
        }
    }
}

impl PeerNet {
    pub(crate) fn new(ctx: Arc<NetCtx>, target: u64, addr: String) -> PeerNet {
        let link = Link::new(LinkConfig {
            node_id: ctx.node_id,
            target,
            pipeline_depth: PIPELINE_DEPTH,
            ring_full_wait: RING_FULL_WAIT,
            reserve_bytes: crate::admission::RAFT_RESERVE_BYTES,
        });
        PeerNet {
            ctx,
            target,
            addr,
            link,
            conn: None,
            connecting: SyncWrapper::new(None),
            completions: SyncWrapper::new(FuturesUnordered::new()),
            #[cfg(feature = "planted-bugs")]
            planted_backlog: std::collections::VecDeque::new(),
        }
    }

    /// Starts a new call: whatever an earlier caller of this client left
    /// (it went away mid-call) is nobody's any more.
    pub(super) fn begin(&mut self) {
        self.link.abandon();
        self.perform();
    }

    /// One AppendEntries, answered.
    pub(super) async fn append(
        &mut self,
        request: AppendRequest,
        ttl: Duration,
    ) -> Result<crate::replication::link::AppendResponse, ReplicationError> {
        self.begin();
        let payloads = self.payloads(&request);
        let ticket = self.link.append(now(), request, payloads, ttl);
        match self.answer(ticket).await {
            Answer::Append(result) => result,
            Answer::Reply(_) => unreachable!("an append is answered as one"),
        }
    }

    /// The encodings of `request`'s entries that this node's log store
    /// made when it appended them (none where it has none, or no store).
    pub(super) fn payloads(&self, request: &AppendRequest) -> Payloads {
        self.ctx
            .log
            .upgrade()
            .map(|store| store.payloads(&request.entries))
            .unwrap_or_default()
    }

    /// One exchange of `request` and its reply.
    pub(crate) async fn call(
        &mut self,
        request: Request,
        ttl: Duration,
    ) -> Result<Reply, ReplicationError> {
        self.begin();
        let ticket = self.link.call(now(), request, ttl);
        match self.answer(ticket).await {
            Answer::Reply(result) => result,
            Answer::Append(_) => unreachable!("a call is answered as one"),
        }
    }

    /// Drives the link until `ticket` is answered.
    async fn answer(&mut self, ticket: Ticket) -> Answer {
        loop {
            self.perform();
            while let Some((answered, answer)) = self.link.poll_answer() {
                if answered == ticket {
                    return answer;
                }
            }
            self.turn::<futures::stream::Empty<()>, ()>(None).await;
        }
    }

    /// Performs the link's operations, in order, and reports its events.
    /// A batch's WRITEs and the SEND that names them go as one chain (on
    /// `rdma` one `ibv_post_send`, the WRITEs unsignaled and small ones
    /// inline).
    pub(super) fn perform(&mut self) {
        let mut chain = Vec::new();
        while let Some(op) = self.link.poll_op() {
            match op {
                Op::Write { .. } => chain.push(op),
                Op::Send(_) => {
                    chain.push(op);
                    self.perform_chain(std::mem::take(&mut chain));
                }
                other => {
                    self.perform_chain(std::mem::take(&mut chain));
                    self.perform_one(other);
                }
            }
        }
        self.perform_chain(chain);
        while let Some(event) = self.link.poll_event() {
            self.report(event);
        }
    }

    /// Posts WRITEs, and the SEND after them if any, as one chain.
    fn perform_chain(&mut self, ops: Vec<Op>) {
        if ops.len() <= 1 {
            ops.into_iter().for_each(|op| self.perform_one(op));
            return;
        }
        let mut writes = Vec::new();
        let mut message = None;
        for op in ops {
            match op {
                Op::Write { op, at, bytes } => writes.push((op, at, bytes)),
                Op::Send(request) => match encode(&request) {
                    Ok(bytes) => message = Some(bytes),
                    Err(e) => {
                        return self
                            .link
                            .connection_failed(now(), ReplicationError::Codec(e));
                    }
                },
                other => unreachable!("only WRITEs and a SEND are chained: {other:?}"),
            }
        }
        let mut chain: Vec<Chained<'_>> = writes
            .iter()
            .map(|(_, at, bytes)| Chained::Write {
                remote: *at,
                data: bytes,
            })
            .collect();
        if let Some(message) = &message {
            chain.push(Chained::Send { data: message });
        }
        // All or none: a chain refused before it is posted fails the
        // connection, as a refused WRITE or SEND alone does.
        let posted = self.connection().post_chain(&chain);
        drop(chain);
        match posted {
            Ok(completions) => {
                // The SEND's own completion is not awaited: the reply
                // implies it.
                for ((op, _, _), c) in writes.into_iter().zip(completions) {
                    self.completions
                        .get_mut()
                        .push(async move { (op, Completion::Write(c.await)) }.boxed());
                }
            }
            Err(e) => self.link.connection_failed(now(), e.into()),
        }
    }

    fn perform_one(&mut self, op: Op) {
        match op {
            Op::Connect => {
                let connect = pool::connect(self.ctx.clone(), self.target, self.addr.clone());
                *self.connecting.get_mut() = Some(connect.boxed());
            }
            Op::Close { why } => {
                // A connection still being made is left to the pool (the
                // next client of this target picks the attempt up): this
                // link asks again when it needs one.
                *self.connecting.get_mut() = None;
                if let Some(peer) = self.conn.take() {
                    tracing::debug!(target = self.target, why, "dropping the connection");
                    peer.conn.close();
                }
            }
            Op::Send(request) => {
                let posted = encode(&request)
                    .map_err(ReplicationError::Codec)
                    .and_then(|bytes| {
                        // The send's own completion is not awaited: the
                        // reply implies it.
                        Ok(self.connection().post_send(&bytes)?)
                    });
                if let Err(e) = posted {
                    self.link.connection_failed(now(), e);
                }
            }
            Op::Read { op, at } => {
                let completing = match self.connection().post_read(at, 8) {
                    Ok(c) => async move { (op, Completion::Read(c.await)) }.boxed(),
                    Err(e) => futures::future::ready((op, Completion::Read(Err(e)))).boxed(),
                };
                self.completions.get_mut().push(completing);
            }
            Op::Cas {
                op,
                at,
                expect,
                new,
            } => {
                let completing = match self.connection().post_compare_swap(at, expect, new) {
                    Ok(c) => async move { (op, Completion::Cas(c.await)) }.boxed(),
                    Err(e) => futures::future::ready((op, Completion::Cas(Err(e)))).boxed(),
                };
                self.completions.get_mut().push(completing);
            }
            Op::Write { op, at, bytes } => {
                let completing = match self.connection().post_write(at, &bytes) {
                    Ok(c) => async move { (op, Completion::Write(c.await)) }.boxed(),
                    Err(e) => futures::future::ready((op, Completion::Write(Err(e)))).boxed(),
                };
                self.completions.get_mut().push(completing);
            }
        }
    }

    fn connection(&self) -> &ringraft_transport::Connection {
        &self
            .conn
            .as_ref()
            .expect("the link posts only on a connection it was told of")
            .conn
    }

    fn report(&self, event: LinkEvent) {
        let metrics = &self.ctx.metrics;
        match event {
            LinkEvent::FenceTaken(epoch) => {
                metrics.fence_changes.inc();
                tracing::debug!(target = self.target, %epoch, "fence taken");
            }
            LinkEvent::FencedOut => {
                metrics.fenced_writes.inc();
                tracing::info!(
                    target = self.target,
                    "WRITE refused by the follower's NIC: fenced out"
                );
            }
            LinkEvent::Written {
                from_lsn,
                to_lsn,
                bytes,
                entries,
                encoded_here,
            } => {
                metrics.bytes_written.inc_by(bytes);
                metrics
                    .entries_encoded_for_followers
                    .inc_by(encoded_here as u64);
                tracing::trace!(
                    target = self.target,
                    from = from_lsn,
                    to = to_lsn,
                    entries,
                    "one-sided batch posted"
                );
            }
            LinkEvent::TwoSided { entries } => {
                tracing::debug!(target = self.target, entries, "entries travel two-sided");
            }
            LinkEvent::Cut { sent_to } => tracing::debug!(
                target = self.target,
                ?sent_to,
                "batch larger than half the follower's ring: its prefix goes first"
            ),
            LinkEvent::Rejected => metrics.rejected_records.inc(),
            LinkEvent::Closed(why) => {
                tracing::debug!(target = self.target, why, "connection closed")
            }
        }
    }

    /// Waits for one thing to happen (a connection made, a completion, a
    /// reply, the link's timer, or, with `input`, the stream's next item:
    /// the caller passes it only while it takes more) and feeds it to the
    /// link, or returns the item.
    pub(super) async fn turn<S, T>(&mut self, input: Option<&mut S>) -> Woke<T>
    where
        S: Stream<Item = T> + Unpin,
    {
        enum Happened<T> {
            Connected(Result<PeerConn, ReplicationError>),
            Completed(OpId, Completion),
            Received(Result<Received, ringraft_transport::TransportError>),
            Timer,
            Input(Option<T>),
        }
        let conn = self.conn.as_ref().map(|peer| peer.conn.clone());
        let timer = self.link.poll_timeout();
        let takes_input = input.is_some();
        let completing = !self.completions.get_mut().is_empty();
        let is_connecting = self.connecting.get_mut().is_some();
        let happened = {
            let connecting = self.connecting.get_mut().as_mut();
            let completions = self.completions.get_mut();
            tokio::select! {
                biased;
                Some((op, completion)) = completions.next(), if completing => {
                    Happened::Completed(op, completion)
                }
                made = async { connecting.expect("checked").await }, if is_connecting => {
                    Happened::Connected(made)
                }
                received = async { conn.as_ref().expect("checked").recv().await }, if conn.is_some() => {
                    Happened::Received(received)
                }
                () = async {
                    let at = timer.expect("checked");
                    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await
                }, if timer.is_some() => Happened::Timer,
                next = async { input.expect("checked").next().await }, if takes_input => {
                    Happened::Input(next)
                }
            }
        };
        match happened {
            Happened::Connected(made) => {
                *self.connecting.get_mut() = None;
                match made {
                    Ok(peer) => {
                        let hello = peer.hello.clone();
                        self.conn = Some(peer);
                        self.link.connected(now(), hello);
                    }
                    Err(e) => self.link.connect_failed(now(), e),
                }
            }
            Happened::Completed(op, completion) => self.link.completed(now(), op, completion),
            Happened::Received(received) => self.on_received(received),
            Happened::Timer => self.link.handle_timeout(now()),
            Happened::Input(next) => return Woke::Input(next),
        }
        Woke::Link
    }

    fn on_received(&mut self, received: Result<Received, ringraft_transport::TransportError>) {
        let reply = match received {
            Ok(Received::Message(bytes)) => {
                decode::<Reply>(&bytes).map_err(|what| ReplicationError::Protocol {
                    node: self.target,
                    what,
                })
            }
            Ok(Received::WriteImmediate(_)) => Err(ReplicationError::Protocol {
                node: self.target,
                what: "a WRITE with immediate on the control connection".into(),
            }),
            Err(e) => Err(e.into()),
        };
        match reply {
            Ok(reply) => self.link.received(now(), reply),
            Err(e) => self.link.connection_failed(now(), e),
        }
    }
}
