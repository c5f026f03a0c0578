//! How a batch travels: a heartbeat; one-sided (records encoded after the
//! follower's tip, waiting for room below its head, WRITten at its tail,
//! then a SEND naming them); or two-sided parts answered one by one; and
//! what the answer to a batch means for the view.

use std::time::{Duration, Instant};

use openraft::raft::AppendEntriesResponse;
use ringraft_wal::{EntryRef, HeadWord, RecordEncoder, WriteBuffer};

use super::{
    Answer, Expect, Fencing, Link, LinkEvent, Op, Parts, Queued, ROOM_BACKOFF_FIRST,
    ROOM_BACKOFF_MAX, Staged, Ticket, View, Work,
};
use crate::log_store::{Encoded, Payloads};
use crate::protocol::{AppendBody, MAX_PART_BYTES, Reply, Request, encode_entries};
use crate::replication::checks::{check_tail, cut_to_fit};
use crate::replication::{AppendRequest, ReplicationError};
use crate::types::{LogId, term_of};

impl Link {
    pub(super) fn post_heartbeat(&mut self, now: Instant) {
        let queued = self.queue.pop_front().expect("a front");
        let Work::Append(request, _) = queued.work else {
            unreachable!("matched an append")
        };
        // A heartbeat names the epoch of its vote (no fence is needed for
        // one); a term too large for an epoch names the epoch before any
        // leader, which no fence check accepts.
        let epoch = self.epoch_of(&request.vote).unwrap_or_default();
        self.post(
            Some(queued.ticket),
            Request::Append {
                vote: request.vote,
                prev_log_id: request.prev_log_id,
                leader_commit: request.leader_commit,
                epoch,
                body: AppendBody::Empty,
            },
            Expect::Append { sent_to: None },
            now + queued.ttl,
        );
    }

    /// Moves the batch at the front of the queue: fences first, then posts
    /// it one-sided or two-sided. Returns whether it left the queue.
    pub(super) fn advance_batch(&mut self, now: Instant) -> bool {
        let Some(Queued {
            work: Work::Append(request, _),
            ..
        }) = self.queue.front()
        else {
            unreachable!("a batch at the front")
        };
        let epoch = match self.epoch_of(&request.vote) {
            Ok(epoch) => epoch,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        // One-sided from the follower's tail: how many of the batch's first
        // entries it holds already (`None`: two-sided).
        let skip = match self.view {
            Some(view) if view.epoch == epoch => {
                let tail = view.tail.last_log_id();
                if view.awaiting_tail {
                    None
                } else if tail == request.prev_log_id {
                    Some(0)
                } else {
                    held_prefix(request, tail)
                }
            }
            _ => {
                // The fence of this term is taken first, once nothing else
                // is in flight (the grant's tail must be the last word).
                if self.exchanges.is_empty() && matches!(self.fencing, Fencing::Idle) {
                    self.view = None;
                    self.read_fence(epoch);
                }
                return false;
            }
        };
        let continues = skip.is_some();
        if continues && self.appends_in_flight() >= self.config.pipeline_depth {
            return false;
        }
        if !continues && !self.exchanges.is_empty() {
            // A two-sided batch is answered part by part, and the tail it
            // must continue comes with the answers in flight.
            return false;
        }
        let queued = self.queue.pop_front().expect("a front");
        let Work::Append(mut request, payloads) = queued.work else {
            unreachable!("matched an append")
        };
        if let Some(held) = skip.filter(|&held| held > 0) {
            request.entries.drain(..held);
            request.prev_log_id = self.view.expect("a view").tail.last_log_id();
        }
        let result = if continues {
            self.stage_written(now, queued.ticket, queued.ttl, request, &payloads)
        } else {
            self.send_parts(now, queued.ticket, queued.ttl, request, &payloads)
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                self.fail_front(Some(queued.ticket), e);
                false
            }
        }
    }

    /// The payloads of `request`'s entries, encoded (as `payloads` holds
    /// them, else here), how many of them were encoded here, and `request`
    /// cut to the prefix whose records take at most half of a ring of
    /// `capacity` (the last entry kept, where it cut anything).
    fn encode_and_cut(
        &mut self,
        request: &mut AppendRequest,
        payloads: &Payloads,
        capacity: u64,
    ) -> Result<(Option<LogId>, Vec<Encoded>, usize), ReplicationError> {
        let mut encoded_here = 0;
        let mut encoded = request
            .entries
            .iter()
            .map(|e| match payloads.get(&e.log_id) {
                Some(held) => Ok(held.clone()),
                None => {
                    encoded_here += 1;
                    Encoded::of(e)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ReplicationError::Codec(format!("an entry's payload: {e}")))?;
        let sent_to = cut_to_fit(request, encoded.iter().map(|x| x.bytes.len()), capacity / 2);
        if let Some(sent_to) = sent_to {
            encoded.truncate(request.entries.len());
            self.events.push_back(LinkEvent::Cut { sent_to });
        }
        Ok((sent_to, encoded, encoded_here))
    }

    /// Encodes `request`'s entries as records after the follower's tip, cut
    /// to the prefix whose records take at most half its ring, and stages
    /// them until they fit.
    pub(super) fn stage_written(
        &mut self,
        now: Instant,
        ticket: Ticket,
        ttl: Duration,
        mut request: AppendRequest,
        payloads: &Payloads,
    ) -> Result<(), ReplicationError> {
        let view = self.view.expect("a view for a one-sided batch");
        let (sent_to, encoded, encoded_here) =
            self.encode_and_cut(&mut request, payloads, view.capacity)?;
        let bad_grant = |e: ringraft_wal::record::EncodeError| ReplicationError::Protocol {
            node: self.config.target,
            what: format!("it granted a ring this leader cannot write: {e}"),
        };
        let mut encoder = RecordEncoder::new(
            view.capacity,
            view.tail.next_lsn,
            view.tail.chain_tip(),
            view.epoch,
        )
        .map_err(bad_grant)?;
        let mut buffer = WriteBuffer::new(view.capacity, view.tail.next_lsn).map_err(bad_grant)?;
        for (entry, payload) in request.entries.iter().zip(&encoded) {
            encoder.push(
                &mut buffer,
                &EntryRef {
                    term: term_of(&entry.log_id),
                    index: entry.log_id.index,
                    payload: &payload.bytes,
                },
            )?;
        }
        self.staged = Some(Staged {
            ticket,
            request,
            sent_to,
            ttl,
            epoch: view.epoch,
            buffer,
            encoder,
            encoded_here,
            room_deadline: now + self.config.ring_full_wait,
            retry_at: None,
            backoff: ROOM_BACKOFF_FIRST,
            reading: None,
        });
        Ok(())
    }

    /// Posts the staged batch if it fits below the follower's head plus
    /// its capacity, else READs the head (again, after a backoff).
    pub(super) fn try_post_staged(&mut self, now: Instant) {
        let staged = self.staged.as_mut().expect("a staged batch");
        let view = self
            .view
            .expect("a view while a batch is staged (reset_view fails it)");
        assert_eq!(
            view.epoch, staged.epoch,
            "a batch staged under another epoch"
        );
        if staged.reading.is_some() || staged.retry_at.is_some() {
            return;
        }
        // The head and the tail were checked (the tail is at most the
        // wal's MAX_LSN): `head + capacity` does not overflow.
        let need = staged
            .buffer
            .end_lsn()
            .saturating_add(self.config.reserve_bytes);
        if need > view.tail.head_lsn + view.capacity {
            let at = self.hello().expect("connected").head.start();
            let op = self.new_op();
            self.ops.push_back(Op::Read { op, at });
            self.staged.as_mut().expect("staged").reading = Some(op);
            return;
        }
        let staged = self.staged.take().expect("staged");
        self.post_staged(now, view, staged);
    }

    pub(super) fn on_head(&mut self, now: Instant, bytes: &[u8]) {
        let head_lsn = match HeadWord::from_bytes(bytes) {
            Ok(word) => word.lsn(),
            Err(e) => return self.fail(e.into()),
        };
        let mut view = self.view.expect("a view while a batch is staged");
        // A follower's head never passes its adopted tail, which is at
        // most where this leader writes next.
        if head_lsn > view.tail.next_lsn {
            return self.fail(self.protocol(format!(
                "its head {head_lsn} is beyond its tail {}",
                view.tail.next_lsn
            )));
        }
        view.tail.head_lsn = head_lsn;
        self.view = Some(view);
        let reserve = self.config.reserve_bytes;
        let staged = self.staged.as_mut().expect("staged");
        staged.reading = None;
        let need = staged.buffer.end_lsn().saturating_add(reserve);
        if need <= head_lsn + view.capacity {
            return self.try_post_staged(now);
        }
        if now > staged.room_deadline {
            let error = ReplicationError::RingFull {
                node: self.config.target,
                head_lsn,
                need_lsn: need,
            };
            return self.fail(error);
        }
        staged.retry_at = Some(now + staged.backoff);
        staged.backoff = (staged.backoff * 2).min(ROOM_BACKOFF_MAX);
    }

    /// WRITEs the staged records, then SENDs the message naming them, and
    /// moves the view's tail past them (the next batch continues there).
    pub(super) fn post_staged(&mut self, now: Instant, mut view: View, staged: Staged) {
        let request = &staged.request;
        let entries = request.entries.len();
        let last = request.entries.last().expect("a batch").log_id;
        let control = Request::Append {
            vote: request.vote,
            prev_log_id: request.prev_log_id,
            leader_commit: request.leader_commit,
            epoch: view.epoch,
            body: AppendBody::Written {
                from_lsn: staged.buffer.start_lsn(),
                to_lsn: staged.buffer.end_lsn(),
                count: entries as u64,
                last,
            },
        };
        let written = LinkEvent::Written {
            from_lsn: staged.buffer.start_lsn(),
            to_lsn: staged.buffer.end_lsn(),
            bytes: staged.buffer.byte_len() as u64,
            entries,
            encoded_here: staged.encoded_here,
        };
        // Every run inside the granted area before any is posted.
        let Some(places) = staged
            .buffer
            .segments()
            .iter()
            .map(|s| view.data.at(s.physical, s.bytes.len() as u64))
            .collect::<Option<Vec<_>>>()
        else {
            let error = self.protocol("records outside the data area it granted");
            return self.fail_front(Some(staged.ticket), error);
        };
        // The encoded bytes move to the operations: no copy on this path.
        for (at, segment) in places.into_iter().zip(staged.buffer.into_segments()) {
            let op = self.new_op();
            self.ops.push_back(Op::Write {
                op,
                at,
                bytes: segment.bytes,
            });
        }
        self.events.push_back(written);
        self.post(
            Some(staged.ticket),
            control,
            Expect::Append {
                sent_to: staged.sent_to,
            },
            now + staged.ttl,
        );
        let tip = staged.encoder.tip();
        view.tail.next_lsn = staged.encoder.next_lsn();
        view.tail.next_index = tip.next_index;
        view.tail.last_term = tip.last_term;
        view.tail.epoch = tip.epoch;
        view.tail.unanchored = tip.unanchored;
        self.view = Some(view);
    }

    /// Sends `request`'s entries two-sided, in parts, cut like a one-sided
    /// batch to the prefix whose records take at most half the follower's
    /// ring (it writes them there itself).
    pub(super) fn send_parts(
        &mut self,
        now: Instant,
        ticket: Ticket,
        ttl: Duration,
        mut request: AppendRequest,
        payloads: &Payloads,
    ) -> Result<(), ReplicationError> {
        let view = self.view.expect("a view for a batch");
        let (sent_to, ..) = self.encode_and_cut(&mut request, payloads, view.capacity)?;
        self.events.push_back(LinkEvent::TwoSided {
            entries: request.entries.len(),
        });
        let bytes = encode_entries(&request.entries).map_err(ReplicationError::Codec)?;
        let chunks: Vec<&[u8]> = bytes.chunks(MAX_PART_BYTES).collect();
        let count = chunks.len() as u32;
        let parts = chunks
            .iter()
            .enumerate()
            .map(|(k, chunk)| Request::Append {
                vote: request.vote,
                prev_log_id: request.prev_log_id,
                leader_commit: request.leader_commit,
                epoch: view.epoch,
                body: AppendBody::Inline {
                    part: k as u32,
                    parts: count,
                    bytes: chunk.to_vec(),
                },
            })
            .collect();
        // The follower's tail is known again from the answer (the grant
        // and its rkey stay good).
        self.view.as_mut().expect("a view").awaiting_tail = true;
        self.parts = Some(Parts {
            ticket,
            sent_to,
            ttl,
            parts,
        });
        self.post_next_part(now);
        Ok(())
    }

    /// Posts the next part: a middle part is answered `PartStored`, the
    /// last one like any batch.
    pub(super) fn post_next_part(&mut self, now: Instant) {
        let parts = self.parts.as_mut().expect("parts to send");
        let part = parts.parts.pop_front().expect("a part left");
        let deadline = now + parts.ttl;
        if parts.parts.is_empty() {
            let parts = self.parts.take().expect("parts");
            let expect = Expect::Append {
                sent_to: parts.sent_to,
            };
            self.post(Some(parts.ticket), part, expect, deadline);
        } else {
            self.post(None, part, Expect::Part, deadline);
        }
    }

    pub(super) fn on_part(&mut self, now: Instant, ticket: Option<Ticket>, reply: Reply) {
        debug_assert!(ticket.is_none(), "a middle part is the link's own");
        match reply {
            Reply::PartStored if self.parts.is_some() => self.post_next_part(now),
            other => self.fail(self.protocol(format!("an answer to a part: {other:?}"))),
        }
    }

    /// Forgets the view: a batch staged under it is not sent (its answer
    /// says why) and the next one fences again.
    pub(super) fn reset_view(&mut self) {
        self.view = None;
        if let Some(staged) = self.staged.take() {
            let error = ReplicationError::Overtaken {
                node: self.config.target,
            };
            self.answers
                .push_back((staged.ticket, Answer::Append(Err(error))));
        }
    }

    pub(super) fn on_append_reply(
        &mut self,
        ticket: Option<Ticket>,
        sent_to: Option<LogId>,
        reply: Reply,
    ) {
        match reply {
            Reply::Appended { response, tail } => {
                let success = response.is_success();
                if success && let Some(view) = self.view.as_mut() {
                    if let Err(e) = check_tail(&tail, view.capacity) {
                        let error = self.protocol(format!("a bad tail: {e}"));
                        return self.fail_front(ticket, error);
                    }
                    if view.awaiting_tail || view.tail.next_lsn < tail.next_lsn {
                        view.tail = tail;
                        view.awaiting_tail = false;
                    }
                }
                let response = match (response, sent_to) {
                    (AppendEntriesResponse::Success, Some(sent_to)) => {
                        AppendEntriesResponse::PartialSuccess(Some(sent_to))
                    }
                    (response, _) => response,
                };
                if let Some(ticket) = ticket {
                    self.answers
                        .push_back((ticket, Answer::Append(Ok(response))));
                }
                if !success {
                    // A conflict or a higher vote: the next batch starts
                    // from the follower's real tail (a new grant).
                    self.reset_view();
                }
            }
            Reply::NotFenced { fence } => {
                let error = ReplicationError::Fenced {
                    node: self.config.target,
                    by: fence,
                };
                self.fail_front(ticket, error);
            }
            Reply::Rejected { reason, .. } => {
                self.events.push_back(LinkEvent::Rejected);
                let error = ReplicationError::Rejected {
                    node: self.config.target,
                    reason,
                };
                self.fail_front(ticket, error);
            }
            other => {
                let error = self.protocol(format!("an answer to an append: {other:?}"));
                self.fail_front(ticket, error);
            }
        }
    }
}

/// How many of `request`'s first entries the follower holds already, where
/// the batch starts behind the follower's adopted tail `tail` (a new
/// leader's probe) but holds the tail's own entry: by log matching the
/// follower's log equals the leader's up to it, so the batch may go on
/// from the tail, one-sided. `None` where it does not hold that entry, or
/// where nothing would be left to send.
pub(super) fn held_prefix(request: &AppendRequest, tail: Option<LogId>) -> Option<usize> {
    let tail = tail?;
    let at = request.entries.iter().position(|e| e.log_id == tail)?;
    (at + 1 < request.entries.len()).then_some(at + 1)
}
