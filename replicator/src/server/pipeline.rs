//! The follower's pipeline on one connection: AppendEntries whose entries
//! were written one-sided (or that carry none) go to openraft's
//! `stream_append` as they come, without waiting for the answers to the
//! ones before; their answers go back in order. A batch is adopted in
//! place only once the connection's previous adoption was taken by
//! openraft (or dropped): one pending adoption per connection, each checked
//! against the tail the one before it left.
//!
//! It owns the order of the answers and the stream to openraft; what a
//! request may do is the [`Acceptor`]'s. While it waits (for a leader
//! request slot, for the previous adoption) it keeps taking openraft's
//! answers: those are what free the slot or the adoption.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use openraft::error::Fatal;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use ringraft_wal::AdoptRequest;
use tokio::sync::mpsc;

use super::{ServerCtx, adopt, node_view};
use crate::log_store::LeaderRequest;
use crate::protocol::{Reply, Request};
use crate::replication::Acceptor;
use crate::replication::acceptor::{AppendMeta, Step};
use crate::types::TypeConfig;

/// Requests a connection has with openraft at once (above the leader's
/// pipeline depth, so that a leader's batches never wait for room here).
pub const FOLLOWER_PIPELINE_DEPTH: usize = 16;
const _: () = assert!(FOLLOWER_PIPELINE_DEPTH >= crate::network::PIPELINE_DEPTH);

type Answers =
    Pin<Box<dyn Stream<Item = Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>> + Send>>;

/// A request taken, in the order of the answers.
enum Slot {
    /// Answered already.
    Ready(Reply),
    /// With openraft, on stream `stream`.
    Raft {
        stream: u64,
        /// The adoption it prepared.
        adopt: Option<AdoptRequest>,
        /// Until openraft answered: no grant overlaps it.
        _guard: LeaderRequest,
    },
}

/// One connection's pipeline to openraft. See the module docs.
pub(super) struct Pipeline {
    ctx: Arc<ServerCtx>,
    conn_id: u64,
    /// Numbers the streams: one ends with its first conflict or higher
    /// vote, and the requests after go to a new one.
    stream: u64,
    input: Option<mpsc::Sender<AppendEntriesRequest<TypeConfig>>>,
    answers: Option<Answers>,
    slots: VecDeque<Slot>,
    /// Why the connection is to be closed once what was taken is answered
    /// (the acceptor's [`Step::Close`]).
    closing: Option<String>,
}

impl Pipeline {
    pub(super) fn new(ctx: Arc<ServerCtx>, conn_id: u64) -> Pipeline {
        Pipeline {
            ctx,
            conn_id,
            stream: 0,
            input: None,
            answers: None,
            slots: VecDeque::new(),
            closing: None,
        }
    }

    /// Why the connection is to be closed, once the pipeline's replies
    /// (the last of which tells the peer why) are sent.
    pub(super) fn closing(&self) -> Option<&str> {
        self.closing.as_deref()
    }

    /// Requests taken and not answered on the connection yet.
    pub(super) fn busy(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Whether another request can be taken.
    pub(super) fn has_room(&self) -> bool {
        self.slots.len() < FOLLOWER_PIPELINE_DEPTH
    }

    fn with_raft(&self) -> bool {
        self.slots.iter().any(|s| matches!(s, Slot::Raft { .. }))
    }

    /// The answer to the oldest request taken (cancel-safe: nothing is
    /// taken before the answer is there).
    pub(super) async fn next_reply(&mut self) -> Reply {
        loop {
            if let Some(Slot::Ready(_)) = self.slots.front() {
                let Some(Slot::Ready(reply)) = self.slots.pop_front() else {
                    unreachable!("just seen")
                };
                return reply;
            }
            assert!(
                self.with_raft(),
                "a reply is awaited only for a request taken"
            );
            let answer = self.next_answer().await;
            self.complete(answer);
        }
    }

    async fn next_answer(
        &mut self,
    ) -> Option<Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>> {
        match self.answers.as_mut() {
            Some(answers) => answers.next().await,
            None => None,
        }
    }

    /// Completes the oldest request with openraft, with `answer` (`None`:
    /// its stream ended before answering it).
    fn complete(
        &mut self,
        answer: Option<Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>>,
    ) {
        let at = self
            .slots
            .iter()
            .position(|s| matches!(s, Slot::Raft { .. }))
            .expect("a request with openraft");
        let Slot::Raft { stream, adopt, .. } = &self.slots[at] else {
            unreachable!("just found")
        };
        let (stream, adopt) = (*stream, *adopt);
        let reply = match answer {
            Some(Ok(result)) => {
                let ended = result.is_err();
                let response = AppendEntriesResponse::from(result);
                if ended {
                    self.end_stream(stream, &response);
                }
                Reply::Appended {
                    response,
                    tail: self.ctx.store.tail(),
                }
            }
            Some(Err(fatal)) => {
                self.end_stream(stream, &AppendEntriesResponse::Conflict);
                Reply::Error(fatal.to_string())
            }
            None => {
                // openraft's side went away (its core stopped): nothing
                // more will come on this stream.
                self.input = None;
                self.answers = None;
                Reply::Error("openraft's append stream ended".into())
            }
        };
        // Records openraft did not take stay out of the log, and are
        // erased (only this request's: a later one may have prepared).
        if let Some(adopt) = adopt {
            self.ctx.store.drop_pending_of(self.conn_id, adopt);
        }
        self.slots[at] = Slot::Ready(reply);
    }

    /// The stream `stream` ended (its first conflict or higher vote): the
    /// requests sent on it after that one get no answer from openraft, so
    /// they get the same (openraft took them or not; the leader stops at
    /// the first such answer and drops the rest), and the next request goes
    /// on a new stream.
    fn end_stream(&mut self, stream: u64, response: &AppendEntriesResponse<TypeConfig>) {
        if stream != self.stream || self.input.is_none() {
            return;
        }
        self.input = None;
        self.answers = None;
        let first = self
            .slots
            .iter()
            .position(|s| matches!(s, Slot::Raft { .. }))
            .expect("the request that ended it");
        for at in first + 1..self.slots.len() {
            if let Slot::Raft { adopt, .. } = &self.slots[at] {
                if let Some(adopt) = *adopt {
                    self.ctx.store.drop_pending_of(self.conn_id, adopt);
                }
                self.slots[at] = Slot::Ready(Reply::Appended {
                    response: response.clone(),
                    tail: self.ctx.store.tail(),
                });
            }
        }
    }

    /// Waits for `wait` while taking openraft's answers (which may be what
    /// `wait` waits for).
    async fn driving<T>(&mut self, wait: impl std::future::Future<Output = T>) -> T {
        let mut wait = std::pin::pin!(wait);
        loop {
            let with_raft = self.with_raft() && self.answers.is_some();
            tokio::select! {
                biased;
                done = &mut wait => return done,
                answer = self.next_answer(), if with_raft => self.complete(answer),
            }
        }
    }

    /// Takes a request that may go with others in flight
    /// ([`Acceptor::pipelines`]).
    pub(super) async fn submit(&mut self, acceptor: &mut Acceptor, request: Request) {
        let store = self.ctx.store.clone();
        // From before the fence check until openraft is done with it: no
        // grant overlaps a request that may extend the log.
        let guard = self.driving(store.begin_leader_request()).await;
        let step = acceptor.on_request(request, &node_view(&store));
        let (meta, entries, adopt) = match step {
            Step::Reply(reply) => return self.slots.push_back(Slot::Ready(reply)),
            Step::Close(reason) => {
                self.slots
                    .push_back(Slot::Ready(Reply::Error(reason.clone())));
                self.closing = Some(reason);
                return;
            }
            Step::Append { meta, entries } => {
                debug_assert!(entries.is_empty(), "two-sided entries are not pipelined");
                (meta, entries, None)
            }
            Step::Adopt { meta, request } => {
                self.driving(settled(&store, self.conn_id)).await;
                match adopt(&self.ctx, acceptor.peer(), self.conn_id, request).await {
                    Ok(entries) => (meta, entries, Some(request)),
                    Err(reply) => return self.slots.push_back(Slot::Ready(reply)),
                }
            }
            other => unreachable!("not a pipelined step: {other:?}"),
        };
        self.send(meta, entries).await;
        self.slots.push_back(Slot::Raft {
            stream: self.stream,
            adopt,
            _guard: guard,
        });
    }

    async fn send(&mut self, meta: AppendMeta, entries: Vec<crate::types::Entry>) {
        if self.input.is_none() {
            self.stream += 1;
            let (input, rx) = mpsc::channel(FOLLOWER_PIPELINE_DEPTH);
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            // Fused: polled after its end (a request sent after openraft's
            // core stopped), it stays ended.
            self.answers = Some(Box::pin(self.ctx.raft.stream_append(stream).fuse()));
            self.input = Some(input);
        }
        let request = AppendEntriesRequest {
            vote: meta.vote,
            prev_log_id: meta.prev_log_id,
            entries,
            leader_commit: meta.leader_commit,
        };
        let input = self.input.as_ref().expect("just made");
        // The channel holds as many as the pipeline: a send never waits.
        if input.send(request).await.is_err() {
            // openraft's side went away (stopped): the answer says so.
            self.input = None;
        }
    }
}

/// Until connection `conn` has no adoption pending (the previous one was
/// taken by openraft, or dropped).
async fn settled(store: &crate::log_store::LogStore, conn: u64) {
    let mut changed = store.watch_adoptions();
    while store.has_pending(conn) {
        if changed.changed().await.is_err() {
            unreachable!("the store holds the sender");
        }
    }
}
