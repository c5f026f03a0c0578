//! `stream_append`'s pipeline: feeds the stream's requests to the link as
//! long as it takes them (up to the pipeline's depth, none behind a batch
//! that needs an exchange of its own) and yields the answers in order. It
//! owns the mapping of answers to openraft's stream results only; what a
//! batch does is the link's.

use std::collections::VecDeque;
use std::time::Duration;

use futures::Stream;
use openraft::error::RPCError;
use openraft::raft::{AppendEntriesResponse, StreamAppendResult};

use super::error::rpc_error;
use super::peer::{PeerNet, Woke, now};
use crate::replication::{Answer, AppendRequest, Ticket};
use crate::types::{LogId, TypeConfig};

/// The state of a pipelined `stream_append`.
pub(super) struct Pipeline<'s, S> {
    pub(super) net: &'s mut PeerNet,
    pub(super) input: S,
    /// The requests taken, in order: their tickets and the log ids the
    /// stream result names.
    pub(super) pending: VecDeque<(Ticket, Option<LogId>, Option<LogId>)>,
    pub(super) input_done: bool,
    pub(super) stopped: bool,
    pub(super) ttl: Duration,
}

impl<S> Pipeline<'_, S>
where
    S: Stream<Item = AppendRequest> + Unpin,
{
    /// The next result; after an error, a conflict, a higher vote or a
    /// partial success, the stream ends.
    pub(super) async fn next(
        &mut self,
    ) -> Option<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
        loop {
            if self.stopped {
                return None;
            }
            self.net.perform();
            if let Some((ticket, answer)) = self.net.link.poll_answer() {
                let (expected, prev, last) = self
                    .pending
                    .pop_front()
                    .expect("an answer to a request taken");
                assert_eq!(ticket, expected, "answers come in the order taken");
                return Some(self.result(answer, prev, last));
            }
            if self.input_done && self.pending.is_empty() {
                return None;
            }
            // Only while the link takes another batch without waiting.
            let takes = !self.input_done && self.net.link.ready_for_append();
            let input = takes.then_some(&mut self.input);
            match self.net.turn(input).await {
                Woke::Input(None) => self.input_done = true,
                Woke::Input(Some(request)) => {
                    let prev = request.prev_log_id;
                    let last = request.entries.last().map(|e| e.log_id).or(prev);
                    let payloads = self.net.payloads(&request);
                    let ticket = self.net.link.append(now(), request, payloads, self.ttl);
                    self.pending.push_back((ticket, prev, last));
                }
                Woke::Link => {}
            }
        }
    }

    fn result(
        &mut self,
        answer: Answer,
        prev: Option<LogId>,
        last: Option<LogId>,
    ) -> Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>> {
        let Answer::Append(answer) = answer else {
            unreachable!("a stream takes appends only")
        };
        match answer {
            Ok(response) => {
                let partial = match &response {
                    AppendEntriesResponse::PartialSuccess(p) => Some(*p),
                    _ => None,
                };
                let result = response.into_stream_result(prev, last);
                if result.is_err() || partial.is_some_and(|p| p != last) {
                    self.stop();
                }
                Ok(result)
            }
            Err(e) => {
                self.stop();
                Err(rpc_error(e))
            }
        }
    }

    /// Nothing after this result is wanted: requests taken but not
    /// answered are abandoned (the link drops their replies).
    fn stop(&mut self) {
        self.stopped = true;
        self.net.link.abandon();
        self.net.perform();
    }
}
