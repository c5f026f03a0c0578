//! The initiator side of the network: openraft's `RaftNetworkV2` over the
//! fabric, with AppendEntries split into one-sided WRITEs of ring records
//! and a small two-sided control message.
//!
//! For each target, openraft gets a [`PeerNet`]; the replication client
//! keeps a [`View`] of the follower's ring: the data area's descriptor (its
//! rkey, granted to this leader only), the follower's adopted tail and the
//! chain the next record continues, and its head (flow control). Before its
//! first WRITE in a term it READs the follower's fence and CASes it to its
//! epoch, stepping down if the fence holds a higher term, then asks for the
//! grant.
//!
//! An AppendEntries goes one-sided when its `prev_log_id` is the follower's
//! last log id: the entries are encoded as records after the follower's
//! tip, WRITten into its ring at the tail (never below it: adopted records
//! are never overwritten from outside), and the control message, SENT on the
//! same connection after the WRITEs (RC order), names the range. Otherwise
//! (a conflict, a truncated follower) the entries travel two-sided and the
//! follower writes them itself. The answer carries the follower's tail,
//! which corrects the view.
//!
//! `stream_append` pipelines: batch k+1 is written and sent before the
//! answer to batch k, up to [`PIPELINE_DEPTH`] batches.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::OptionalSend;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use ringraft_transport::{ConnConfig, Connection, Device, Received, RemoteRegion};
use ringraft_wal::{EntryRef, Epoch, FenceWord, HeadWord, RecordEncoder, WordLength, WriteBuffer};

use crate::log_store::encode_payload;
use crate::protocol::{AppendBody, Hello, MAX_PART_BYTES, Reply, Request, Tail, decode, encode};
use crate::server::encode_entries;
use crate::types::{NodeInfo, TypeConfig, Vote, term_of};

/// AppendEntries batches in flight per follower.
pub const PIPELINE_DEPTH: usize = 8;
/// How long a leader waits for room in a follower's ring (re-reading its
/// head) before it reports the follower unreachable for now.
pub const RING_FULL_WAIT: Duration = Duration::from_secs(2);

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
    /// What clients that are gone left for the next client of the same
    /// target (openraft makes a new client for every round of votes).
    pub(crate) spare: std::sync::Mutex<std::collections::HashMap<u64, Spare>>,
}

impl NetCtx {
    /// What the clients of node `node_id` of cluster `cluster_id` need.
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

/// Creates a client per target (openraft's factory).
#[derive(Clone)]
pub struct NetworkFactory {
    ctx: Arc<NetCtx>,
}

impl NetworkFactory {
    /// A factory over `ctx`.
    pub fn new(ctx: Arc<NetCtx>) -> NetworkFactory {
        #[cfg(feature = "planted-bugs")]
        planted::announce(ctx.node_id);
        NetworkFactory { ctx }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNet;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerNet {
        PeerNet::new(self.ctx.clone(), target, node.addr.clone())
    }
}

/// A connection to one peer and what was learnt through it.
struct Link {
    conn: Connection,
    hello: Hello,
}

/// The leader's view of one follower's ring.
#[derive(Clone, Copy, Debug)]
struct View {
    epoch: Epoch,
    data: RemoteRegion,
    tail: Tail,
    capacity: u64,
    /// A two-sided batch is in flight: the follower writes it itself, so
    /// its tail is known again only from the answer (which sets `tail`).
    awaiting_tail: bool,
}

/// The client of one target. See the module docs.
pub struct PeerNet {
    ctx: Arc<NetCtx>,
    target: u64,
    addr: String,
    link: Option<Link>,
    view: Option<View>,
    /// Requests posted on `link` whose replies were not taken yet. Replies
    /// come in order, so a new exchange that finds this non-zero would take
    /// the answer to an abandoned one (a caller dropped mid-call, e.g. a
    /// client's request cancelled while forwarded to the leader): it drops
    /// the connection instead.
    unanswered: usize,
    /// PLANTED BUG (test-only): requests acknowledged but not yet sent.
    #[cfg(feature = "planted-bugs")]
    planted_backlog: VecDeque<(tokio::time::Instant, AppendEntriesRequest<TypeConfig>)>,
}

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Could not reach the peer (connect, handshake).
    Unreachable(String),
    /// The connection broke or the peer answered nonsense.
    Network(String),
    /// The follower's fence holds a higher term: step down.
    HigherVote(Vote),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(s) => write!(f, "unreachable: {s}"),
            Failure::Network(s) => write!(f, "network: {s}"),
            Failure::HigherVote(v) => write!(f, "higher vote {v}"),
        }
    }
}

#[derive(Debug)]
struct Message(String);
impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Message {}

fn rpc_error(f: Failure) -> RPCError<TypeConfig> {
    match f {
        Failure::Unreachable(s) => RPCError::Unreachable(Unreachable::new(&Message(s))),
        other => RPCError::Network(NetworkError::new(&Message(other.to_string()))),
    }
}

fn streaming_error(f: Failure) -> StreamingError<TypeConfig> {
    match f {
        Failure::Unreachable(s) => StreamingError::Unreachable(Unreachable::new(&Message(s))),
        other => StreamingError::Unreachable(Unreachable::new(&Message(other.to_string()))),
    }
}

// What a follower sends (its handshake, its grants, its answers, what its NIC
// returns to READs) is input from the network: checked before any use, a
// bad value is an error of that exchange, never a panic of the leader.

/// Checks what a peer revealed in its handshake.
fn check_hello(hello: &Hello) -> Result<(), String> {
    ringraft_wal::layout::check_capacity(hello.capacity).map_err(|e| format!("its ring's {e}"))?;
    for (name, word) in [("fence", &hello.fence), ("head", &hello.head)] {
        check_region(name, word)?;
        if word.len < 8 || !word.addr.is_multiple_of(8) {
            return Err(format!(
                "its {name} word ({} bytes at {:#x}) is not an aligned 8-byte word",
                word.len, word.addr
            ));
        }
    }
    Ok(())
}

fn check_region(name: &str, region: &RemoteRegion) -> Result<(), String> {
    if region.addr.checked_add(region.len).is_none() {
        return Err(format!(
            "its {name} region ({} bytes at {:#x}) wraps the address space",
            region.len, region.addr
        ));
    }
    Ok(())
}

/// Checks the data area a follower granted.
fn check_data_area(data: &RemoteRegion, capacity: u64) -> Result<(), String> {
    check_region("data", data)?;
    if data.len != capacity {
        return Err(format!(
            "its data area of {} bytes is not its ring's capacity {capacity}",
            data.len
        ));
    }
    Ok(())
}

/// Checks a tail a follower reported (in a grant or an answer).
fn check_tail(tail: &Tail, capacity: u64) -> Result<(), String> {
    let line = ringraft_wal::layout::LINE_BYTES as u64;
    if !tail.next_lsn.is_multiple_of(line) {
        return Err(format!(
            "its tail {} is not aligned to {line}-byte lines",
            tail.next_lsn
        ));
    }
    // The wal's bound on positions leaves room for two capacities above
    // it: arithmetic on offsets a peer sent cannot overflow.
    if tail.next_lsn > ringraft_wal::layout::MAX_LSN {
        return Err(format!(
            "its tail {} is beyond the end of the lsn space {}",
            tail.next_lsn,
            ringraft_wal::layout::MAX_LSN
        ));
    }
    if tail.head_lsn > tail.next_lsn {
        return Err(format!(
            "its head {} is beyond its tail {}",
            tail.head_lsn, tail.next_lsn
        ));
    }
    if tail.next_lsn - tail.head_lsn > capacity {
        return Err(format!(
            "its log from head {} to tail {} is longer than its capacity {capacity}",
            tail.head_lsn, tail.next_lsn
        ));
    }
    Ok(())
}

/// The failure of an 8-byte READ of a control word that returned another
/// length. The transport checks the length of READ results; the wal's word
/// decoders check it again, where the bytes become a word.
fn short_word(target: u64) -> impl Fn(WordLength) -> Failure {
    move |e| {
        Failure::Network(format!(
            "a READ of node {target}'s {} word returned {} bytes, not 8",
            e.word, e.found
        ))
    }
}

/// A request in flight: its reply comes in order on the connection.
struct InFlight {
    prev: Option<crate::types::LogId>,
    last: Option<crate::types::LogId>,
    /// The WRITEs of a one-sided append (their completions tell a fenced-out
    /// leader apart from a broken link).
    writes: Vec<ringraft_transport::Completion<()>>,
    /// When its answer is due.
    deadline: tokio::time::Instant,
    /// Only a prefix of the entries was sent, up to this one (a batch of a
    /// follower catching up from the segments may be larger than its ring
    /// can take at once): a success is only a partial one.
    sent_to: Option<crate::types::LogId>,
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        // A healthy connection with nothing in flight is left to the next
        // client of this target (at most one per target).
        if let Some(link) = self.link.take() {
            if self.unanswered == 0
                && link.conn.error().is_none()
                && let Ok(mut spare) = self.ctx.spare.lock()
                && !spare.contains_key(&self.target)
            {
                spare.insert(self.target, Spare::Idle(link.conn));
                return;
            }
            link.conn.close();
        }
    }
}

impl PeerNet {
    pub(crate) fn new(ctx: Arc<NetCtx>, target: u64, addr: String) -> PeerNet {
        PeerNet {
            ctx,
            target,
            addr,
            link: None,
            view: None,
            unanswered: 0,
            #[cfg(feature = "planted-bugs")]
            planted_backlog: VecDeque::new(),
        }
    }

    fn drop_link(&mut self, why: &str) {
        if let Some(link) = self.link.take() {
            tracing::debug!(target = self.target, why, "dropping the connection");
            link.conn.close();
        }
        self.view = None;
        self.unanswered = 0;
    }

    /// Starts a new exchange: a reply still owed to an abandoned one would
    /// be mistaken for this exchange's answer, so such a connection is
    /// dropped (and made again).
    fn begin_exchange(&mut self) {
        if self.unanswered > 0 {
            self.drop_link("an earlier exchange was abandoned before its reply");
        }
    }

    async fn link(&mut self) -> Result<&Link, Failure> {
        if self.link.as_ref().is_some_and(|l| l.conn.error().is_some()) {
            self.drop_link("in the error state");
        }
        if self.link.is_none() {
            // A connection made in a task of its own, so that an RPC timeout
            // shorter than a slow fabric's connection setup (rdma under TCG)
            // does not cancel every attempt; an attempt or an idle
            // connection left by an earlier client of this target first.
            let spare = self
                .ctx
                .spare
                .lock()
                .ok()
                .and_then(|mut s| s.remove(&self.target));
            let conn = match spare {
                Some(Spare::Idle(conn)) if conn.error().is_none() => conn,
                spare => {
                    let handle = match spare {
                        Some(Spare::Connecting(handle)) => handle,
                        _ => {
                            let (ctx, addr) = (self.ctx.clone(), self.addr.clone());
                            tokio::spawn(async move {
                                let join = crate::protocol::Join::bytes(ctx.cluster_id);
                                let connect =
                                    ctx.device.connect(&addr, ctx.conn_config.clone(), join);
                                match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                                    Ok(r) => r.map_err(|e| e.to_string()),
                                    Err(_) => {
                                        Err(format!("no connection within {CONNECT_TIMEOUT:?}"))
                                    }
                                }
                            })
                        }
                    };
                    let mut pending = Pending {
                        ctx: self.ctx.clone(),
                        target: self.target,
                        handle: Some(handle),
                    };
                    let joined = pending.handle.as_mut().expect("just set").await;
                    pending.handle = None;
                    joined
                        .map_err(|e| format!("connection task: {e}"))
                        .and_then(|r| r)
                        .map_err(|e| {
                            Failure::Unreachable(format!(
                                "node {} at {}: {e}",
                                self.target, self.addr
                            ))
                        })?
                }
            };
            let hello: Hello = decode(&conn.peer().reveal.app_data).map_err(Failure::Network)?;
            if hello.cluster_id != self.ctx.cluster_id || hello.node_id != self.target {
                conn.close();
                return Err(Failure::Unreachable(format!(
                    "{} is node {} of cluster {:#x}, expected node {} of cluster {:#x}",
                    self.addr, hello.node_id, hello.cluster_id, self.target, self.ctx.cluster_id
                )));
            }
            if let Err(e) = check_hello(&hello) {
                conn.close();
                return Err(Failure::Network(format!(
                    "node {} at {} revealed a bad handshake: {e}",
                    self.target, self.addr
                )));
            }
            self.link = Some(Link { conn, hello });
        }
        Ok(self.link.as_ref().expect("just set"))
    }

    /// Sends a request (after whatever was posted before it on this
    /// connection).
    fn post(&mut self, request: &Request) -> Result<(), Failure> {
        let link = self
            .link
            .as_ref()
            .ok_or_else(|| Failure::Network("not connected".into()))?;
        let bytes = encode(request).map_err(Failure::Network)?;
        // The send's own completion is not awaited: the reply implies it.
        link.conn
            .post_send(&bytes)
            .map_err(|e| Failure::Network(e.to_string()))?;
        self.unanswered += 1;
        Ok(())
    }

    /// Takes the next reply.
    async fn reply(&mut self, ttl: Duration) -> Result<Reply, Failure> {
        self.reply_until(tokio::time::Instant::now() + ttl).await
    }

    /// Takes the next reply, waiting until `deadline` at most. Cancel-safe:
    /// dropped before it completes, it consumes nothing.
    async fn reply_until(&mut self, deadline: tokio::time::Instant) -> Result<Reply, Failure> {
        let link = self
            .link
            .as_ref()
            .ok_or_else(|| Failure::Network("not connected".into()))?;
        let received = tokio::time::timeout_at(deadline, link.conn.recv()).await;
        let result = match received {
            Err(_) => Err(Failure::Network(format!(
                "no answer from node {} in time",
                self.target
            ))),
            Ok(Err(e)) => Err(Failure::Network(e.to_string())),
            Ok(Ok(Received::Message(bytes))) => {
                self.unanswered = self.unanswered.saturating_sub(1);
                decode::<Reply>(&bytes).map_err(Failure::Network)
            }
            Ok(Ok(Received::WriteImmediate(_))) => {
                Err(Failure::Network("unexpected immediate".into()))
            }
        };
        match result {
            Ok(Reply::Error(e)) => {
                self.drop_link("the peer answered an error");
                Err(Failure::Network(format!("node {}: {e}", self.target)))
            }
            Ok(reply) => Ok(reply),
            Err(f) => {
                self.drop_link("exchange failed");
                Err(f)
            }
        }
    }

    pub(crate) async fn call(
        &mut self,
        request: &Request,
        ttl: Duration,
    ) -> Result<Reply, Failure> {
        self.begin_exchange();
        self.link().await?;
        self.post(request)?;
        self.reply(ttl).await
    }

    /// Makes sure this leader holds the follower's fence for `vote` and has
    /// write access to its data area.
    async fn ensure_fenced(&mut self, vote: &Vote, ttl: Duration) -> Result<View, Failure> {
        let epoch = Epoch::new(vote.leader_id.term, self.ctx.node_id)
            .ok_or_else(|| Failure::Network("term or node id does not fit an epoch".into()))?;
        if let Some(view) = self.view
            && view.epoch == epoch
        {
            return Ok(view);
        }
        self.view = None;
        let link = self.link().await?;
        let (conn, fence, capacity) = (link.conn.clone(), link.hello.fence, link.hello.capacity);
        let transport = |e: ringraft_transport::TransportError| Failure::Network(e.to_string());
        loop {
            let bytes = conn.read(fence.start(), 8).await.map_err(transport)?;
            let current = FenceWord::from_bytes(&bytes)
                .map_err(short_word(self.target))?
                .epoch();
            if current == epoch {
                break;
            }
            if current > epoch {
                // A leader of a higher term (or this term's real leader)
                // holds the fence: this one must step down.
                let higher = Vote::new(current.term(), current.leader_id());
                return Err(Failure::HigherVote(higher));
            }
            if conn
                .compare_swap(
                    fence.start(),
                    FenceWord::new(current).to_word(),
                    FenceWord::new(epoch).to_word(),
                )
                .await
                .map_err(transport)?
                == FenceWord::new(current).to_word()
            {
                self.ctx.metrics.fence_changes.inc();
                break;
            }
        }
        match self.call(&Request::Grant { epoch }, ttl).await? {
            Reply::Granted { data, tail } => {
                check_data_area(&data, capacity)
                    .and_then(|()| check_tail(&tail, capacity))
                    .map_err(|e| {
                        Failure::Network(format!("node {} granted nonsense: {e}", self.target))
                    })?;
                let view = View {
                    epoch,
                    data,
                    tail,
                    capacity,
                    awaiting_tail: false,
                };
                self.view = Some(view);
                Ok(view)
            }
            Reply::NotFenced { fence } => {
                if fence > epoch {
                    Err(Failure::HigherVote(Vote::new(
                        fence.term(),
                        fence.leader_id(),
                    )))
                } else {
                    Err(Failure::Network(format!("grant refused: fence is {fence}")))
                }
            }
            other => Err(Failure::Network(format!(
                "unexpected answer to a grant: {other:?}"
            ))),
        }
    }

    /// Re-reads the follower's head until `end_lsn` fits in its ring.
    async fn wait_for_room(&mut self, view: &mut View, end_lsn: u64) -> Result<(), Failure> {
        let deadline = tokio::time::Instant::now() + RING_FULL_WAIT;
        let mut backoff = Duration::from_millis(1);
        // The head and the tail were checked (the tail is at most
        // the wal's MAX_LSN): `head + capacity` does not overflow. The follower
        // keeps RAFT_RESERVE_BYTES of its ring for the entries openraft
        // writes itself (were it elected with a ring filled to the brim,
        // it could not append its blank entry: item 2 of issue 10).
        let end_lsn = end_lsn.saturating_add(crate::admission::RAFT_RESERVE_BYTES);
        loop {
            if end_lsn <= view.tail.head_lsn + view.capacity {
                return Ok(());
            }
            let link = self.link().await?;
            let bytes = link
                .conn
                .read(link.hello.head.start(), 8)
                .await
                .map_err(|e| Failure::Network(e.to_string()))?;
            let head_lsn = HeadWord::from_bytes(&bytes)
                .map_err(short_word(self.target))?
                .lsn();
            // A follower's head never passes its adopted tail, which is at
            // most where this leader writes next.
            if head_lsn > view.tail.next_lsn {
                return Err(Failure::Network(format!(
                    "node {}'s head {head_lsn} is beyond its tail {}",
                    self.target, view.tail.next_lsn
                )));
            }
            view.tail.head_lsn = head_lsn;
            if end_lsn <= view.tail.head_lsn + view.capacity {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Failure::Unreachable(format!(
                    "node {}'s ring is full (head {}, need up to {end_lsn} with the reserve)",
                    self.target, view.tail.head_lsn
                )));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Posts one AppendEntries (WRITEs then SEND, or SEND only); its reply
    /// is taken later, in order.
    async fn post_append(
        &mut self,
        req: AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> Result<InFlight, Failure> {
        let prev = req.prev_log_id;
        let last = req.entries.last().map(|e| e.log_id).or(prev);
        self.link().await?;
        // A heartbeat names the epoch of its vote (no fence is needed for
        // one); a term too large for an epoch names the epoch before any
        // leader, which no fence check accepts.
        let epoch_of_vote =
            Epoch::new(req.vote.leader_id.term, self.ctx.node_id).unwrap_or_default();
        if req.entries.is_empty() {
            self.post(&Request::Append {
                vote: req.vote,
                prev_log_id: req.prev_log_id,
                leader_commit: req.leader_commit,
                epoch: epoch_of_vote,
                body: AppendBody::Empty,
            })?;
            return Ok(InFlight {
                prev,
                last,
                writes: Vec::new(),
                deadline: tokio::time::Instant::now() + ttl,
                sent_to: None,
            });
        }
        let mut view = self.ensure_fenced(&req.vote, ttl).await?;
        let mut writes = Vec::new();
        let sent_to;
        if !view.awaiting_tail && view.tail.last_log_id() == req.prev_log_id {
            (writes, sent_to) = self.post_written(&mut view, req).await?;
        } else {
            tracing::debug!(
                target = self.target,
                prev = ?req.prev_log_id,
                follower_last = ?view.tail.last_log_id(),
                awaiting_tail = view.awaiting_tail,
                "entries travel two-sided"
            );
            sent_to = self
                .post_inline(req, view.epoch, view.capacity, ttl)
                .await?;
            // The follower's tail is known again from the answer (the grant
            // and its rkey stay good).
            if let Some(view) = self.view.as_mut() {
                view.awaiting_tail = true;
            }
        }
        Ok(InFlight {
            prev,
            last,
            writes,
            deadline: tokio::time::Instant::now() + ttl,
            sent_to,
        })
    }

    /// Whether `req` can be posted while replies are in flight: a heartbeat,
    /// or a batch that continues the follower's known tail one-sided under
    /// the fence already held. Any other batch needs an exchange of its own
    /// first (a grant, or two-sided parts answered one by one) or the tail
    /// that an answer in flight brings, so it waits until the replies in
    /// flight are taken: replies come in order, and one taken by the wrong
    /// waiter would be mistaken for another's.
    fn posts_without_exchange(&self, req: &AppendEntriesRequest<TypeConfig>) -> bool {
        if req.entries.is_empty() {
            return true;
        }
        let Some(epoch) = Epoch::new(req.vote.leader_id.term, self.ctx.node_id) else {
            return false;
        };
        self.link.is_some()
            && self.view.is_some_and(|view| {
                view.epoch == epoch
                    && !view.awaiting_tail
                    && view.tail.last_log_id() == req.prev_log_id
            })
    }

    /// Posts the WRITEs of `req`'s entries and the control message naming
    /// them. A batch whose records would take more than half the
    /// follower's ring (one read back from the segments for a follower
    /// catching up) is cut to the prefix that fits: returns the last entry
    /// sent then.
    async fn post_written(
        &mut self,
        view: &mut View,
        mut req: AppendEntriesRequest<TypeConfig>,
    ) -> Result<
        (
            Vec<ringraft_transport::Completion<()>>,
            Option<crate::types::LogId>,
        ),
        Failure,
    > {
        let mut payloads = req
            .entries
            .iter()
            .map(|e| encode_payload(&e.payload))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::Network(e.to_string()))?;
        let sent_to = cut_to_fit(&mut req, payloads.iter().map(Vec::len), view.capacity / 2);
        if sent_to.is_some() {
            payloads.truncate(req.entries.len());
            tracing::debug!(
                target = self.target,
                sent = req.entries.len(),
                ?sent_to,
                "batch larger than half the follower's ring: its prefix goes first"
            );
        }
        let bad_grant = |e: ringraft_wal::record::EncodeError| {
            Failure::Network(format!(
                "node {} granted a ring we cannot write: {e}",
                self.target
            ))
        };
        let mut encoder = RecordEncoder::new(
            view.capacity,
            view.tail.next_lsn,
            view.tail.chain_tip(),
            view.epoch,
        )
        .map_err(bad_grant)?;
        let mut buffer = WriteBuffer::new(view.capacity, view.tail.next_lsn).map_err(bad_grant)?;
        for (entry, payload) in req.entries.iter().zip(&payloads) {
            encoder
                .push(
                    &mut buffer,
                    &EntryRef {
                        term: term_of(&entry.log_id),
                        index: entry.log_id.index,
                        payload,
                    },
                )
                .map_err(|e| {
                    Failure::Network(format!(
                        "entries do not continue node {}'s log: {e}",
                        self.target
                    ))
                })?;
        }
        self.wait_for_room(view, buffer.end_lsn()).await?;
        let link = self
            .link
            .as_ref()
            .ok_or_else(|| Failure::Network("not connected".into()))?;
        let mut writes = Vec::with_capacity(buffer.segments().len());
        for segment in buffer.segments() {
            let at = view
                .data
                .at(segment.physical, segment.bytes.len() as u64)
                .ok_or_else(|| Failure::Network("records outside the data area".into()))?;
            // Posted, not awaited: a failed WRITE puts the connection in the
            // error state, which the reply then reports.
            writes.push(
                link.conn
                    .post_write(at, &segment.bytes)
                    .map_err(|e| Failure::Network(e.to_string()))?,
            );
        }
        let last = req.entries.last().expect("non-empty").log_id;
        self.ctx
            .metrics
            .bytes_written
            .inc_by(buffer.byte_len() as u64);
        tracing::trace!(
            target = self.target,
            epoch = %view.epoch,
            from = buffer.start_lsn(),
            to = buffer.end_lsn(),
            entries = req.entries.len(),
            "one-sided batch posted"
        );
        let request = Request::Append {
            vote: req.vote,
            prev_log_id: req.prev_log_id,
            leader_commit: req.leader_commit,
            epoch: view.epoch,
            body: AppendBody::Written {
                from_lsn: buffer.start_lsn(),
                to_lsn: buffer.end_lsn(),
                count: req.entries.len() as u64,
                last,
            },
        };
        self.post(&request)?;
        // Pipelining: the next batch continues from here.
        let tip = encoder.tip();
        view.tail.next_lsn = encoder.next_lsn();
        view.tail.next_index = tip.next_index;
        view.tail.last_term = tip.last_term;
        view.tail.epoch = tip.epoch;
        view.tail.unanchored = tip.unanchored;
        self.view = Some(*view);
        Ok((writes, sent_to))
    }

    /// Posts `req`'s entries two-sided, in parts. Like a one-sided batch, it
    /// is cut to the prefix whose records take at most half the follower's
    /// ring (the follower writes them there itself): returns the last entry
    /// sent then.
    async fn post_inline(
        &mut self,
        mut req: AppendEntriesRequest<TypeConfig>,
        epoch: Epoch,
        capacity: u64,
        ttl: Duration,
    ) -> Result<Option<crate::types::LogId>, Failure> {
        let lens = req
            .entries
            .iter()
            .map(|e| encode_payload(&e.payload).map(|p| p.len()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::Network(e.to_string()))?;
        let sent_to = cut_to_fit(&mut req, lens, capacity / 2);
        let bytes = encode_entries(&req.entries).map_err(Failure::Network)?;
        let parts: Vec<&[u8]> = bytes.chunks(MAX_PART_BYTES).collect();
        let n = parts.len() as u32;
        for (k, part) in parts.iter().enumerate() {
            let request = Request::Append {
                vote: req.vote,
                prev_log_id: req.prev_log_id,
                leader_commit: req.leader_commit,
                epoch,
                body: AppendBody::Inline {
                    part: k as u32,
                    parts: n,
                    bytes: part.to_vec(),
                },
            };
            self.post(&request)?;
            if (k as u32) + 1 < n {
                match self.reply(ttl).await? {
                    Reply::PartStored => {}
                    other => {
                        return Err(Failure::Network(format!(
                            "unexpected answer to a part: {other:?}"
                        )));
                    }
                }
            }
        }
        Ok(sent_to)
    }

    /// Takes the reply of a posted AppendEntries.
    async fn take_append(
        &mut self,
        inflight: InFlight,
    ) -> Result<AppendEntriesResponse<TypeConfig>, Failure> {
        let reply = self.reply_until(inflight.deadline).await;
        self.handle_append_reply(inflight, reply).await
    }

    /// Interprets the reply of a posted AppendEntries.
    async fn handle_append_reply(
        &mut self,
        inflight: InFlight,
        reply: Result<Reply, Failure>,
    ) -> Result<AppendEntriesResponse<TypeConfig>, Failure> {
        let sent_to = inflight.sent_to;
        let reply = match reply {
            Ok(reply) => reply,
            Err(f) => {
                // Was this leader fenced out (its rkey revoked, or its queue
                // pair denied REMOTE_WRITE)? Then a higher term exists.
                for write in inflight.writes {
                    if let Ok(Err(e)) =
                        tokio::time::timeout(Duration::from_millis(100), write).await
                        && e.wc().is_some_and(|w| w.is_access_denied())
                    {
                        self.ctx.metrics.fenced_writes.inc();
                        tracing::info!(
                            target = self.target,
                            "WRITE refused by the follower's NIC: fenced out"
                        );
                        break;
                    }
                }
                return Err(f);
            }
        };
        match reply {
            Reply::Appended { response, tail } => {
                if !response.is_success() {
                    // Conflict or higher vote: the pipeline restarts from the
                    // follower's real tail.
                    self.view = None;
                } else if let Some(view) = self.view.as_mut() {
                    if let Err(e) = check_tail(&tail, view.capacity) {
                        self.view = None;
                        return Err(Failure::Network(format!(
                            "node {} answered nonsense: {e}",
                            self.target
                        )));
                    }
                    if view.awaiting_tail || view.tail.next_lsn < tail.next_lsn {
                        view.tail = tail;
                        view.awaiting_tail = false;
                    }
                }
                Ok(match (response, sent_to) {
                    (AppendEntriesResponse::Success, Some(sent_to)) => {
                        AppendEntriesResponse::PartialSuccess(Some(sent_to))
                    }
                    (response, _) => response,
                })
            }
            Reply::NotFenced { fence } => {
                self.view = None;
                Err(Failure::Network(format!(
                    "node {} is fenced by {fence}",
                    self.target
                )))
            }
            Reply::Rejected { reason, .. } => {
                self.view = None;
                self.ctx.metrics.rejected_records.inc();
                Err(Failure::Network(format!(
                    "node {} refused the written records: {reason}",
                    self.target
                )))
            }
            other => Err(Failure::Network(format!(
                "unexpected answer to an append: {other:?}"
            ))),
        }
    }
}

fn higher_vote_response(v: Vote) -> AppendEntriesResponse<TypeConfig> {
    AppendEntriesResponse::HigherVote(v)
}

/// Cuts `req` to the prefix of entries whose records take at most
/// `limit_bytes` (at least one entry), given each entry's encoded payload
/// length. Returns the last entry kept when it cut anything.
fn cut_to_fit(
    req: &mut AppendEntriesRequest<TypeConfig>,
    payload_lens: impl IntoIterator<Item = usize>,
    limit_bytes: u64,
) -> Option<crate::types::LogId> {
    let mut bytes = 0u64;
    let fits = payload_lens
        .into_iter()
        .take_while(|len| {
            bytes = bytes.saturating_add(ringraft_wal::record::record_len(*len as u64));
            bytes <= limit_bytes
        })
        .count()
        .max(1);
    if fits >= req.entries.len() {
        return None;
    }
    req.entries.truncate(fits);
    req.entries.last().map(|e| e.log_id)
}

impl RaftNetworkV2<TypeConfig> for PeerNet {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        #[cfg(feature = "planted-bugs")]
        if planted::ack_before_replication() {
            return Ok(self.planted_ack_before_replication(rpc, option).await);
        }
        let ttl = option.hard_ttl();
        self.begin_exchange();
        let inflight = match self.post_append(rpc, ttl).await {
            Ok(inflight) => inflight,
            Err(Failure::HigherVote(v)) => return Ok(higher_vote_response(v)),
            Err(f) => {
                self.drop_link("append failed");
                return Err(rpc_error(f));
            }
        };
        self.take_append(inflight).await.map_err(rpc_error)
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        #[cfg(feature = "planted-bugs")]
        if planted::ack_before_replication() {
            // One request at a time, through the planted `append_entries`.
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            self.begin_exchange();
            let state = Pipeline {
                net: self,
                input,
                inflight: VecDeque::new(),
                held: None,
                input_done: false,
                stopped: false,
                ttl: option.hard_ttl(),
            };
            let stream = futures::stream::unfold(state, |mut state| async move {
                let item = state.next().await?;
                Some((item, state))
            });
            Ok(stream.boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&Request::Vote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            Reply::Voted(resp) => Ok(resp),
            other => Err(rpc_error(Failure::Network(format!(
                "unexpected answer to a vote: {other:?}"
            )))),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&Request::PreVote(rpc), option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            Reply::Voted(resp) => Ok(resp),
            other => Err(rpc_error(Failure::Network(format!(
                "unexpected answer to a pre-vote: {other:?}"
            )))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let ttl = option.hard_ttl();
        let total = snapshot.snapshot.len() as u64;
        let send = async {
            let mut offset = 0u64;
            let chunks: Vec<&[u8]> = if snapshot.snapshot.is_empty() {
                vec![&[][..]]
            } else {
                snapshot.snapshot.chunks(MAX_PART_BYTES).collect()
            };
            for chunk in chunks {
                let request = Request::Snapshot {
                    vote,
                    meta: snapshot.meta.clone(),
                    offset,
                    total,
                    data: chunk.to_vec(),
                };
                offset += chunk.len() as u64;
                match self.call(&request, ttl).await? {
                    Reply::PartStored if offset < total => {}
                    Reply::Installed(resp) if offset == total => return Ok(resp),
                    other => {
                        return Err(Failure::Network(format!(
                            "unexpected answer to a snapshot part: {other:?}"
                        )));
                    }
                }
            }
            Err(Failure::Network("snapshot ended without an answer".into()))
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => result.map_err(streaming_error),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self
            .call(&Request::TransferLeader(req), option.hard_ttl())
            .await
            .map_err(rpc_error)?
        {
            Reply::Transferred(resp) => Ok(resp),
            other => Err(rpc_error(Failure::Network(format!(
                "unexpected answer to a transfer: {other:?}"
            )))),
        }
    }
}

/// The state of a pipelined `stream_append`.
struct Pipeline<'s, S> {
    net: &'s mut PeerNet,
    input: S,
    inflight: VecDeque<InFlight>,
    /// A request that cannot be posted while replies are in flight (see
    /// [`PeerNet::posts_without_exchange`]): posted once they are taken.
    held: Option<AppendEntriesRequest<TypeConfig>>,
    input_done: bool,
    stopped: bool,
    ttl: Duration,
}

impl<S> Pipeline<'_, S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    /// Posts `req`; on failure the stream ends with the error.
    async fn post(
        &mut self,
        req: AppendEntriesRequest<TypeConfig>,
    ) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
        match self.net.post_append(req, self.ttl).await {
            Ok(inflight) => {
                self.inflight.push_back(inflight);
                None
            }
            Err(Failure::HigherVote(v)) => {
                self.stopped = true;
                Some(Ok(Err(openraft::raft::StreamAppendError::HigherVote(v))))
            }
            Err(f) => {
                self.stopped = true;
                self.net.drop_link("pipelined append failed");
                Some(Err(rpc_error(f)))
            }
        }
    }

    /// The next result. While answers are pending, new requests are posted
    /// as soon as they come (up to [`PIPELINE_DEPTH`] in flight): batch k+1
    /// is written before the answer to batch k. A batch that needs an
    /// exchange of its own (a grant, a two-sided batch, or the tail a
    /// two-sided batch's answer brings) waits until the answers in flight
    /// are taken, and no later request is taken before it is posted.
    async fn next(
        &mut self,
    ) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
        enum Event {
            Answer(Result<Reply, Failure>),
            Input(Option<AppendEntriesRequest<TypeConfig>>),
        }
        loop {
            if self.stopped {
                return None;
            }
            if self.inflight.is_empty()
                && let Some(req) = self.held.take()
            {
                if let Some(out) = self.post(req).await {
                    return Some(out);
                }
                continue;
            }
            let can_post =
                self.held.is_none() && !self.input_done && self.inflight.len() < PIPELINE_DEPTH;
            let event = match self.inflight.front().map(|f| f.deadline) {
                None if can_post => Event::Input(self.input.next().await),
                None => return None,
                Some(deadline) if can_post => {
                    tokio::select! {
                        biased;
                        answer = self.net.reply_until(deadline) => Event::Answer(answer),
                        input = self.input.next() => Event::Input(input),
                    }
                }
                Some(deadline) => Event::Answer(self.net.reply_until(deadline).await),
            };
            match event {
                Event::Input(None) => self.input_done = true,
                Event::Input(Some(req)) => {
                    if !self.inflight.is_empty() && !self.net.posts_without_exchange(&req) {
                        self.held = Some(req);
                    } else if let Some(out) = self.post(req).await {
                        return Some(out);
                    }
                }
                Event::Answer(answer) => {
                    let inflight = self
                        .inflight
                        .pop_front()
                        .expect("an answer to something in flight");
                    let (prev, last) = (inflight.prev, inflight.last);
                    return match self.net.handle_append_reply(inflight, answer).await {
                        Ok(resp) => {
                            let partial = match &resp {
                                AppendEntriesResponse::PartialSuccess(p) => Some(*p),
                                _ => None,
                            };
                            let result = resp.into_stream_result(prev, last);
                            if result.is_err() || partial.is_some_and(|p| p != last) {
                                self.stopped = true;
                            }
                            Some(Ok(result))
                        }
                        Err(f) => {
                            self.stopped = true;
                            self.net.drop_link("pipelined answer failed");
                            Some(Err(rpc_error(f)))
                        }
                    };
                }
            }
        }
    }
}

// ===========================================================================
// PLANTED BUGS — test-only, compiled only with the `planted-bugs` feature and
// active only when the environment variable `RINGRAFT_PLANTED_BUG` names one.
// They exist so that the Jepsen-style harness (`jepsen/`) can show that its
// checker catches real safety violations. Never enable them elsewhere.
// ===========================================================================
#[cfg(feature = "planted-bugs")]
mod planted {
    use std::sync::OnceLock;
    use std::time::Duration;

    /// The environment variable naming the bug to switch on.
    pub const ENV: &str = "RINGRAFT_PLANTED_BUG";
    /// `ack-before-replication`: the leader's network answers every
    /// AppendEntries as succeeded at once and sends it for real only
    /// [`REPLICATION_DELAY`] later (answers ignored, failures dropped), so the
    /// leader commits and acknowledges entries that only it holds.
    pub const ACK_BEFORE_REPLICATION: &str = "ack-before-replication";
    /// How long the real replication lags the false acknowledgement.
    pub const REPLICATION_DELAY: Duration = Duration::from_millis(2000);
    /// Requests held back per follower at most (older ones are dropped).
    pub const MAX_BACKLOG_REQUESTS: usize = 10_000;

    fn chosen() -> Option<&'static str> {
        static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
        CHOSEN
            .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
            .as_deref()
    }

    /// Whether `ack-before-replication` is on.
    pub fn ack_before_replication() -> bool {
        chosen() == Some(ACK_BEFORE_REPLICATION)
    }

    /// Says loudly, at start, that a planted bug is on (or that the name is
    /// unknown).
    pub fn announce(node_id: u64) {
        match chosen() {
            None => {}
            Some(ACK_BEFORE_REPLICATION) => {
                let msg = format!(
                    "!!! PLANTED BUG {ACK_BEFORE_REPLICATION} IS ON in node {node_id}: \
                     appends are acknowledged before replication; this node is UNSAFE !!!"
                );
                eprintln!("{msg}");
                tracing::error!("{msg}");
            }
            Some(other) => {
                let msg = format!(
                    "!!! {ENV}={other:?} names no planted bug (known: {ACK_BEFORE_REPLICATION}); none is on !!!"
                );
                eprintln!("{msg}");
                tracing::error!("{msg}");
            }
        }
    }
}

#[cfg(feature = "planted-bugs")]
impl PeerNet {
    /// PLANTED BUG `ack-before-replication` (see [`planted`]).
    async fn planted_ack_before_replication(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> AppendEntriesResponse<TypeConfig> {
        let ttl = option.hard_ttl();
        if self.planted_backlog.len() >= planted::MAX_BACKLOG_REQUESTS {
            self.planted_backlog.pop_front();
        }
        self.planted_backlog
            .push_back((tokio::time::Instant::now(), rpc));
        while self
            .planted_backlog
            .front()
            .is_some_and(|(at, _)| at.elapsed() >= planted::REPLICATION_DELAY)
        {
            let (_, req) = self.planted_backlog.pop_front().expect("just checked");
            let answer = match self.post_append(req, ttl).await {
                Ok(inflight) => self.take_append(inflight).await,
                Err(f) => Err(f),
            };
            match answer {
                Ok(AppendEntriesResponse::HigherVote(v)) | Err(Failure::HigherVote(v)) => {
                    self.planted_backlog.clear();
                    return higher_vote_response(v);
                }
                Ok(_) => {}
                Err(_) => self.drop_link("planted bug: late append failed"),
            }
        }
        AppendEntriesResponse::Success
    }
}
