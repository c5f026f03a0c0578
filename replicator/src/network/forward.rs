//! A follower's link to its leader for forwarded calls (proposals and read
//! indexes): one task drives one [`PeerNet`] and keeps many calls in flight
//! on its connection, each answered in turn (the link matches replies to
//! calls in order, and the leader answers a connection's forwarded calls in
//! the order they came: `server`).
//!
//! Owns the hand-off between callers and the task. Never: retry a call,
//! open a connection itself (the link asks the pool), or keep the task
//! alive once no handle is left.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::peer::{PeerNet, Woke, now};
use super::pool::NetCtx;
use super::{ReplicationError, Reply, Request};
use crate::replication::{Answer, Ticket};

/// Forwarded calls in flight on one link, at most; more wait for room.
pub const FORWARD_DEPTH: usize = 64;

struct Call {
    request: Request,
    ttl: Duration,
    reply: oneshot::Sender<Result<Reply, ReplicationError>>,
}

/// A handle to a forwarding link. Cloning shares the link; the task ends
/// when the last handle is dropped.
#[derive(Clone)]
pub struct Forwarder {
    calls: mpsc::Sender<Call>,
    /// Held for its drop: the last handle gone, the task is aborted.
    _task: Arc<AbortOnDrop>,
    /// Calls whose callers wait for an answer.
    waiting: Arc<AtomicUsize>,
}

/// One caller waiting on a link (counted while it waits, however it ends).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Forwarder {
    /// A link to `target` at `addr`, driven by a task of its own spawned in
    /// a scope seeded from `seeds`.
    pub fn spawn(
        ctx: Arc<NetCtx>,
        target: u64,
        addr: String,
        seeds: &crate::rt::Seeds,
    ) -> Forwarder {
        // No more in flight than the leader has receives posted for (with
        // the same connection settings): a SEND beyond them would wait for
        // receiver-not-ready retries.
        let depth = FORWARD_DEPTH.min(ctx.conn_config.recv_depth.max(1) as usize);
        let (calls, rx) = mpsc::channel(depth);
        let net = PeerNet::new(ctx, target, addr);
        let task = crate::rt::spawn(seeds, drive(net, rx, depth));
        Forwarder {
            calls,
            _task: Arc::new(AbortOnDrop(task)),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// One exchange of `request` and its reply, in flight beside the
    /// other callers' (at most [`FORWARD_DEPTH`] together, fewer when the
    /// connections post fewer receives).
    ///
    /// # Errors
    /// As `PeerNet::call`; [`ReplicationError::NotConnected`] when the
    /// link's task is gone (its outcome is then unknown).
    pub async fn call(&self, request: Request, ttl: Duration) -> Result<Reply, ReplicationError> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        let (reply, answer) = oneshot::channel();
        let call = Call {
            request,
            ttl,
            reply,
        };
        if self.calls.send(call).await.is_err() {
            return Err(ReplicationError::NotConnected);
        }
        answer.await.unwrap_or(Err(ReplicationError::NotConnected))
    }

    /// Callers waiting for an answer on this link now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// The link's task: takes calls while fewer than `depth` wait,
/// drives the link, and hands each answer to its caller.
async fn drive(mut net: PeerNet, rx: mpsc::Receiver<Call>, depth: usize) {
    let mut calls = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut waiting: VecDeque<(Ticket, oneshot::Sender<Result<Reply, ReplicationError>>)> =
        VecDeque::new();
    let mut closed = false;
    loop {
        net.perform();
        while let Some((ticket, answer)) = net.link.poll_answer() {
            let Answer::Reply(result) = answer else {
                unreachable!("a forwarding link takes calls only")
            };
            // A caller that went away left its sender here: the answer is
            // dropped.
            if let Some(at) = waiting.iter().position(|(t, _)| *t == ticket) {
                let (_, reply) = waiting.remove(at).expect("found");
                let _ = reply.send(result);
            }
        }
        if closed && waiting.is_empty() {
            return;
        }
        let input = (!closed && waiting.len() < depth).then_some(&mut calls);
        match net.turn(input).await {
            Woke::Input(None) => closed = true,
            Woke::Input(Some(call)) => {
                if call.reply.is_closed() {
                    continue;
                }
                let ticket = net.link.call(now(), call.request, call.ttl);
                waiting.push_back((ticket, call.reply));
            }
            Woke::Link => {}
        }
    }
}
