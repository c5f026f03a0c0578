//! `stream_append`'s pipeline: batch k+1 is written and sent before the
//! answer to batch k, up to [`PIPELINE_DEPTH`] batches in flight; a batch
//! that needs an exchange of its own waits until the answers in flight are
//! taken. It owns the order of posts and answers only; what a post does is
//! [`PeerNet`]'s.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::error::RPCError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};

use super::PIPELINE_DEPTH;
use super::error::{Failure, rpc_error};
use super::peer::{InFlight, PeerNet};
use crate::protocol::Reply;
use crate::types::TypeConfig;

/// The state of a pipelined `stream_append`.
pub(super) struct Pipeline<'s, S> {
    pub(super) net: &'s mut PeerNet,
    pub(super) input: S,
    pub(super) inflight: VecDeque<InFlight>,
    /// A request that cannot be posted while replies are in flight (see
    /// [`PeerNet::posts_without_exchange`]): posted once they are taken.
    pub(super) held: Option<AppendEntriesRequest<TypeConfig>>,
    pub(super) input_done: bool,
    pub(super) stopped: bool,
    pub(super) ttl: Duration,
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
    pub(super) async fn next(
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
