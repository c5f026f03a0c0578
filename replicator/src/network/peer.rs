//! The leader's side of one follower: the connection's exchanges (requests
//! posted in order, replies taken in order, an abandoned exchange dropping
//! the connection), the fence (READ, CAS, grant), the view of the
//! follower's ring, and how a batch travels (one-sided WRITEs then a SEND,
//! or two-sided parts). It never makes a connection itself (that is
//! [`super::pool`]'s) and never decides for openraft: every answer goes
//! back as openraft's response or an error.

use std::sync::Arc;
use std::time::Duration;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use ringraft_transport::{Received, RemoteRegion};
use ringraft_wal::{EntryRef, Epoch, FenceWord, HeadWord, RecordEncoder, WriteBuffer};

use super::RING_FULL_WAIT;
use super::checks::{check_data_area, check_tail, cut_to_fit};
use super::error::Failure;
use super::pool::{self, Link, NetCtx};
use crate::log_store::encode_payload;
use crate::protocol::{AppendBody, MAX_PART_BYTES, Reply, Request, Tail, decode, encode};
use crate::server::encode_entries;
use crate::types::{TypeConfig, Vote, term_of};

#[derive(Clone, Copy, Debug)]
pub(super) struct View {
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
    pub(super) target: u64,
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
    pub(super) planted_backlog:
        std::collections::VecDeque<(tokio::time::Instant, AppendEntriesRequest<TypeConfig>)>,
}

/// A request in flight: its reply comes in order on the connection.
pub(super) struct InFlight {
    pub(super) prev: Option<crate::types::LogId>,
    pub(super) last: Option<crate::types::LogId>,
    /// The WRITEs of a one-sided append (their completions tell a fenced-out
    /// leader apart from a broken link).
    writes: Vec<ringraft_transport::Completion<()>>,
    /// When its answer is due.
    pub(super) deadline: tokio::time::Instant,
    /// Only a prefix of the entries was sent, up to this one (a batch of a
    /// follower catching up from the segments may be larger than its ring
    /// can take at once): a success is only a partial one.
    sent_to: Option<crate::types::LogId>,
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        // A healthy connection with nothing in flight is left to the next
        // client of this target.
        if let Some(link) = self.link.take() {
            pool::leave(&self.ctx, self.target, link.conn, self.unanswered);
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
            planted_backlog: std::collections::VecDeque::new(),
        }
    }

    pub(super) fn drop_link(&mut self, why: &str) {
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
    pub(super) fn begin_exchange(&mut self) {
        if self.unanswered > 0 {
            self.drop_link("an earlier exchange was abandoned before its reply");
        }
    }

    async fn link(&mut self) -> Result<&Link, Failure> {
        if self.link.as_ref().is_some_and(|l| l.conn.error().is_some()) {
            self.drop_link("in the error state");
        }
        if self.link.is_none() {
            self.link = Some(pool::connect(&self.ctx, self.target, &self.addr).await?);
        }
        Ok(self.link.as_ref().expect("just set"))
    }

    /// Sends a request (after whatever was posted before it on this
    /// connection).
    fn post(&mut self, request: &Request) -> Result<(), Failure> {
        let link = self.link.as_ref().ok_or(Failure::NotConnected)?;
        let bytes = encode(request).map_err(Failure::Codec)?;
        // The send's own completion is not awaited: the reply implies it.
        link.conn.post_send(&bytes)?;
        self.unanswered += 1;
        Ok(())
    }

    /// Takes the next reply.
    async fn reply(&mut self, ttl: Duration) -> Result<Reply, Failure> {
        self.reply_until(tokio::time::Instant::now() + ttl).await
    }

    /// Takes the next reply, waiting until `deadline` at most. Cancel-safe:
    /// dropped before it completes, it consumes nothing.
    pub(super) async fn reply_until(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Reply, Failure> {
        let link = self.link.as_ref().ok_or(Failure::NotConnected)?;
        let received = tokio::time::timeout_at(deadline, link.conn.recv()).await;
        let result = match received {
            Err(_) => Err(Failure::Timeout { node: self.target }),
            Ok(Err(e)) => Err(Failure::from(e)),
            Ok(Ok(Received::Message(bytes))) => {
                self.unanswered = self.unanswered.saturating_sub(1);
                decode::<Reply>(&bytes).map_err(|what| Failure::Protocol {
                    node: self.target,
                    what,
                })
            }
            Ok(Ok(Received::WriteImmediate(_))) => Err(Failure::Protocol {
                node: self.target,
                what: "a WRITE with immediate on the control connection".into(),
            }),
        };
        match result {
            Ok(Reply::Error(e)) => {
                self.drop_link("the peer answered an error");
                Err(Failure::Remote {
                    node: self.target,
                    message: e,
                })
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
        let epoch = Epoch::new(vote.leader_id.term, self.ctx.node_id).ok_or(Failure::NoEpoch {
            term: vote.leader_id.term,
            node: self.ctx.node_id,
        })?;
        if let Some(view) = self.view
            && view.epoch == epoch
        {
            return Ok(view);
        }
        self.view = None;
        let link = self.link().await?;
        let (conn, fence, capacity) = (link.conn.clone(), link.hello.fence, link.hello.capacity);
        loop {
            let bytes = conn.read(fence.start(), 8).await?;
            let current = FenceWord::from_bytes(&bytes)?.epoch();
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
                .await?
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
                    .map_err(|e| Failure::Protocol {
                        node: self.target,
                        what: format!("a bad grant: {e}"),
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
                    Err(Failure::Fenced {
                        node: self.target,
                        by: fence,
                    })
                }
            }
            other => Err(Failure::Protocol {
                node: self.target,
                what: format!("an answer to a grant: {other:?}"),
            }),
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
            let bytes = link.conn.read(link.hello.head.start(), 8).await?;
            let head_lsn = HeadWord::from_bytes(&bytes)?.lsn();
            // A follower's head never passes its adopted tail, which is at
            // most where this leader writes next.
            if head_lsn > view.tail.next_lsn {
                return Err(Failure::Protocol {
                    node: self.target,
                    what: format!(
                        "its head {head_lsn} is beyond its tail {}",
                        view.tail.next_lsn
                    ),
                });
            }
            view.tail.head_lsn = head_lsn;
            if end_lsn <= view.tail.head_lsn + view.capacity {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Failure::RingFull {
                    node: self.target,
                    head_lsn: view.tail.head_lsn,
                    need_lsn: end_lsn,
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Posts one AppendEntries (WRITEs then SEND, or SEND only); its reply
    /// is taken later, in order.
    pub(super) async fn post_append(
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
    pub(super) fn posts_without_exchange(&self, req: &AppendEntriesRequest<TypeConfig>) -> bool {
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
        let (sent_to, encoder, buffer) = self.encode_written(view, &mut req)?;
        self.wait_for_room(view, buffer.end_lsn()).await?;
        let link = self.link.as_ref().ok_or(Failure::NotConnected)?;
        let mut writes = Vec::with_capacity(buffer.segments().len());
        for segment in buffer.segments() {
            let at = view
                .data
                .at(segment.physical, segment.bytes.len() as u64)
                .ok_or_else(|| Failure::Protocol {
                    node: self.target,
                    what: "records outside the data area it granted".into(),
                })?;
            // Posted, not awaited: a failed WRITE puts the connection in the
            // error state, which the reply then reports.
            writes.push(link.conn.post_write(at, &segment.bytes)?);
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

    /// Encodes `req`'s entries as records after the follower's tip in
    /// `view`, cut to the prefix whose records take at most half its ring
    /// (the last entry kept when it cut anything): the encoder (the chain
    /// the next batch continues) and the bytes to WRITE.
    fn encode_written(
        &self,
        view: &View,
        req: &mut AppendEntriesRequest<TypeConfig>,
    ) -> Result<(Option<crate::types::LogId>, RecordEncoder, WriteBuffer), Failure> {
        let mut payloads = req
            .entries
            .iter()
            .map(|e| encode_payload(&e.payload))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::Codec(format!("an entry's payload: {e}")))?;
        let sent_to = cut_to_fit(req, payloads.iter().map(Vec::len), view.capacity / 2);
        if sent_to.is_some() {
            payloads.truncate(req.entries.len());
            tracing::debug!(
                target = self.target,
                sent = req.entries.len(),
                ?sent_to,
                "batch larger than half the follower's ring: its prefix goes first"
            );
        }
        let bad_grant = |e: ringraft_wal::record::EncodeError| Failure::Protocol {
            node: self.target,
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
        for (entry, payload) in req.entries.iter().zip(&payloads) {
            encoder.push(
                &mut buffer,
                &EntryRef {
                    term: term_of(&entry.log_id),
                    index: entry.log_id.index,
                    payload,
                },
            )?;
        }
        Ok((sent_to, encoder, buffer))
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
            .map_err(|e| Failure::Codec(format!("an entry's payload: {e}")))?;
        let sent_to = cut_to_fit(&mut req, lens, capacity / 2);
        let bytes = encode_entries(&req.entries).map_err(Failure::Codec)?;
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
                        return Err(Failure::Protocol {
                            node: self.target,
                            what: format!("an answer to a part: {other:?}"),
                        });
                    }
                }
            }
        }
        Ok(sent_to)
    }

    /// Takes the reply of a posted AppendEntries.
    pub(super) async fn take_append(
        &mut self,
        inflight: InFlight,
    ) -> Result<AppendEntriesResponse<TypeConfig>, Failure> {
        let reply = self.reply_until(inflight.deadline).await;
        self.handle_append_reply(inflight, reply).await
    }

    /// Interprets the reply of a posted AppendEntries.
    pub(super) async fn handle_append_reply(
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
                        return Err(Failure::Protocol {
                            node: self.target,
                            what: format!("a bad tail: {e}"),
                        });
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
                Err(Failure::Fenced {
                    node: self.target,
                    by: fence,
                })
            }
            Reply::Rejected { reason, .. } => {
                self.view = None;
                self.ctx.metrics.rejected_records.inc();
                Err(Failure::Rejected {
                    node: self.target,
                    reason,
                })
            }
            other => Err(Failure::Protocol {
                node: self.target,
                what: format!("an answer to an append: {other:?}"),
            }),
        }
    }
}
