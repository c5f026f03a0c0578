//! The leader's link to one follower, as a state machine without I/O: no
//! runtime, no transport, no clock. What it owns:
//! - the exchanges on the connection: requests posted in order, replies
//!   matched to them in order (a reply to an exchange nobody waits for any
//!   more is taken and dropped, never handed to the next one);
//! - the fence: READ the follower's fence word, CAS it to this leader's
//!   epoch (again while it moves below it), step down when it holds a
//!   higher term, then ask for the grant;
//! - the view of the follower's ring (its data area, granted to this
//!   leader only, its adopted tail and the chain the next record continues,
//!   its head) and how a batch travels: one-sided (records encoded after
//!   the follower's tip, WRITten at its tail, then a SEND naming them) when
//!   it continues the follower's log, else two-sided parts;
//! - flow control: a batch waits, re-reading the follower's head, until it
//!   fits below `head + capacity` (with the follower's reserve);
//! - pipelining: up to [`LinkConfig::pipeline_depth`] batches in flight.
//!
//! It must never perform I/O or read the time: events come in with `now`
//! ([`Link::append`], [`Link::received`], [`Link::completed`],
//! [`Link::handle_timeout`]), and what to do goes out ([`Link::poll_op`]),
//! with the answers for openraft ([`Link::poll_answer`]), what happened for
//! the metrics ([`Link::poll_event`]) and the next timer
//! ([`Link::poll_timeout`]). The glue in `network/` performs the
//! operations on a connection.

mod batch;
mod fence;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use openraft::raft::AppendEntriesResponse;
use ringraft_transport::{RemoteAddr, RemoteRegion, TransportError};
use ringraft_wal::{Epoch, RecordEncoder, WriteBuffer};

use super::{AppendRequest, ReplicationError};
use crate::log_store::Payloads;
use crate::protocol::{Hello, Reply, Request, Tail};
use crate::types::{LogId, TypeConfig, Vote};

/// The answer openraft gets to an AppendEntries.
pub type AppendResponse = AppendEntriesResponse<TypeConfig>;

/// The link's limits and identity.
#[derive(Clone, Copy, Debug)]
pub struct LinkConfig {
    /// This node (the leader).
    pub node_id: u64,
    /// The follower.
    pub target: u64,
    /// AppendEntries batches in flight at most.
    pub pipeline_depth: usize,
    /// How long a batch waits for room in the follower's ring (re-reading
    /// its head) before the follower is reported unreachable for now.
    pub ring_full_wait: Duration,
    /// Bytes the follower keeps free for the entries openraft writes itself
    /// (see `admission::RAFT_RESERVE_BYTES`).
    pub reserve_bytes: u64,
}

/// First wait before re-reading a full follower's head.
const ROOM_BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Longest wait between two reads of a full follower's head.
const ROOM_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// Names one request of openraft's to the link, so its answer finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    seq: u64,
    /// A plain exchange ([`Link::call`]), not an AppendEntries.
    call: bool,
}

/// Names an operation posted on one connection: its completion finds it,
/// and a completion of an earlier connection's is told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId {
    connection: u64,
    seq: u64,
}

/// What the glue must do, in order.
#[derive(Debug)]
pub enum Op {
    /// Make a connection to the follower (then [`Link::connected`] or
    /// [`Link::connect_failed`]).
    Connect,
    /// READ the 8-byte word at `at` (then [`Completion::Read`]).
    Read {
        /// The operation.
        op: OpId,
        /// The word.
        at: RemoteAddr,
    },
    /// Compare-and-swap the word at `at` (then [`Completion::Cas`]).
    Cas {
        /// The operation.
        op: OpId,
        /// The word.
        at: RemoteAddr,
        /// The value expected.
        expect: u64,
        /// The value to swap in.
        new: u64,
    },
    /// WRITE `bytes` at `at` (then [`Completion::Write`]).
    Write {
        /// The operation.
        op: OpId,
        /// Where in the follower's data area.
        at: RemoteAddr,
        /// The records.
        bytes: Vec<u8>,
    },
    /// SEND a control message, after every operation posted before it
    /// (RC order: the records before the message that names them).
    Send(Request),
    /// Close the connection (and forget what was posted on it).
    Close {
        /// Why.
        why: String,
    },
}

/// How an operation the glue posted ended.
#[derive(Debug)]
pub enum Completion {
    /// A READ: the bytes read.
    Read(Result<Vec<u8>, TransportError>),
    /// A CAS: the value found.
    Cas(Result<u64, TransportError>),
    /// A WRITE.
    Write(Result<(), TransportError>),
}

/// The answer to one of openraft's requests.
#[derive(Debug)]
pub enum Answer {
    /// To an AppendEntries ([`Link::append`]). A higher vote found (in the
    /// fence or the follower's answer) is `Ok(HigherVote)`: this leader
    /// steps down.
    Append(Result<AppendResponse, ReplicationError>),
    /// To a plain exchange ([`Link::call`]).
    Reply(Result<Reply, ReplicationError>),
}

/// What happened, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// This leader's CAS changed the follower's fence.
    FenceTaken(Epoch),
    /// The follower's NIC refused a WRITE (remote access error): this
    /// leader was fenced out.
    FencedOut,
    /// A one-sided batch was posted: its bytes and records.
    Written {
        /// First byte.
        from_lsn: u64,
        /// One past the last byte.
        to_lsn: u64,
        /// Bytes WRITten (the records, without the gap a wrap leaves).
        bytes: u64,
        /// Entries.
        entries: usize,
        /// Of them, those whose payloads were encoded here: the log
        /// store's encoding was not at hand (a new leader's first batches,
        /// entries older than its window of recent ones).
        encoded_here: usize,
    },
    /// A batch travels two-sided (it does not continue the follower's
    /// known log).
    TwoSided {
        /// Its entries.
        entries: usize,
    },
    /// A batch was cut to the prefix that fits half the follower's ring.
    Cut {
        /// The last entry sent.
        sent_to: LogId,
    },
    /// The follower refused records written into its ring.
    Rejected,
    /// The connection was closed.
    Closed(String),
}

/// What this leader knows about the follower's ring.
#[derive(Clone, Copy, Debug)]
struct View {
    epoch: Epoch,
    data: RemoteRegion,
    tail: Tail,
    capacity: u64,
    /// A two-sided batch is in flight: the follower writes it itself, so
    /// its tail is known again only from the answer.
    awaiting_tail: bool,
}

#[derive(Debug)]
enum Conn {
    Down,
    Connecting,
    Up { hello: Hello },
}

/// Taking the follower's fence.
#[derive(Clone, Copy, Debug)]
enum Fencing {
    Idle,
    Reading {
        epoch: Epoch,
        op: OpId,
    },
    Swapping {
        epoch: Epoch,
        expect: Epoch,
        op: OpId,
    },
    /// The grant exchange is in flight.
    Granting {
        epoch: Epoch,
    },
}

#[derive(Debug)]
enum Work {
    Append(AppendRequest, Payloads),
    Call(Request),
}

/// A request of openraft's not posted yet.
#[derive(Debug)]
struct Queued {
    ticket: Ticket,
    work: Work,
    ttl: Duration,
    deadline: Instant,
}

/// What the reply to an exchange must be.
#[derive(Debug)]
enum Expect {
    Grant {
        epoch: Epoch,
    },
    /// A part of a two-sided batch: `PartStored`.
    Part,
    Append {
        sent_to: Option<LogId>,
    },
    Call,
}

/// A request posted whose reply has not come.
#[derive(Debug)]
struct Exchange {
    /// Who waits for the answer (`None`: the link itself, or nobody any
    /// more).
    ticket: Option<Ticket>,
    expect: Expect,
    deadline: Instant,
}

/// A one-sided batch encoded, waiting for room in the follower's ring.
#[derive(Debug)]
struct Staged {
    ticket: Ticket,
    /// The batch (cut to `sent_to` where it was cut).
    request: AppendRequest,
    sent_to: Option<LogId>,
    ttl: Duration,
    /// The epoch it was encoded under.
    epoch: Epoch,
    buffer: WriteBuffer,
    encoder: RecordEncoder,
    /// Of its entries, those encoded here (not by the log store).
    encoded_here: usize,
    /// When the wait for room gives up.
    room_deadline: Instant,
    /// When to READ the head again.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// A READ of the head is in flight.
    reading: Option<OpId>,
}

/// The remaining parts of a two-sided batch.
#[derive(Debug)]
struct Parts {
    ticket: Ticket,
    sent_to: Option<LogId>,
    ttl: Duration,
    parts: VecDeque<Request>,
}

/// The leader's link to one follower. See the module docs.
#[derive(Debug)]
pub struct Link {
    config: LinkConfig,
    conn: Conn,
    /// Numbers connections, so that completions of a closed one are told
    /// apart.
    connection: u64,
    next_op: u64,
    next_ticket: u64,
    view: Option<View>,
    fencing: Fencing,
    queue: VecDeque<Queued>,
    exchanges: VecDeque<Exchange>,
    staged: Option<Staged>,
    parts: Option<Parts>,
    ops: VecDeque<Op>,
    answers: VecDeque<(Ticket, Answer)>,
    events: VecDeque<LinkEvent>,
}

impl Link {
    /// A link with no connection yet.
    pub fn new(config: LinkConfig) -> Link {
        assert!(config.pipeline_depth >= 1, "a pipeline holds a batch");
        Link {
            config,
            conn: Conn::Down,
            connection: 0,
            next_op: 0,
            next_ticket: 0,
            view: None,
            fencing: Fencing::Idle,
            queue: VecDeque::new(),
            exchanges: VecDeque::new(),
            staged: None,
            parts: None,
            ops: VecDeque::new(),
            answers: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The follower.
    pub fn target(&self) -> u64 {
        self.config.target
    }

    /// Takes one of openraft's AppendEntries, to be answered by
    /// [`Answer::Append`] with the returned ticket within `ttl`.
    /// `payloads`: its entries' encodings as the log store made them, which
    /// a one-sided batch WRITEs as they are (an entry without one is
    /// encoded here).
    pub fn append(
        &mut self,
        now: Instant,
        request: AppendRequest,
        payloads: Payloads,
        ttl: Duration,
    ) -> Ticket {
        self.enqueue(now, Work::Append(request, payloads), ttl)
    }

    /// Takes a request answered by one reply (a vote, a pre-vote, a leader
    /// transfer, a snapshot part), to be answered by [`Answer::Reply`].
    pub fn call(&mut self, now: Instant, request: Request, ttl: Duration) -> Ticket {
        self.enqueue(now, Work::Call(request), ttl)
    }

    fn enqueue(&mut self, now: Instant, work: Work, ttl: Duration) -> Ticket {
        let ticket = Ticket {
            seq: self.next_ticket,
            call: matches!(work, Work::Call(_)),
        };
        self.next_ticket += 1;
        self.queue.push_back(Queued {
            ticket,
            work,
            ttl,
            deadline: now + ttl,
        });
        self.advance(now);
        ticket
    }

    /// Whether another AppendEntries can be taken now without waiting
    /// behind one that needs an exchange of its own: nothing is queued or
    /// being prepared, and fewer than the pipeline's depth are in flight.
    pub fn ready_for_append(&self) -> bool {
        self.queue.is_empty()
            && self.staged.is_none()
            && self.parts.is_none()
            && self.appends_in_flight() < self.config.pipeline_depth
    }

    pub(super) fn appends_in_flight(&self) -> usize {
        self.exchanges
            .iter()
            .filter(|e| matches!(e.expect, Expect::Append { .. }))
            .count()
    }

    /// Nobody waits for the answers to the requests taken so far (the
    /// caller went away: a stream dropped, a call cancelled). Those not
    /// posted yet are forgotten; the replies to those in flight are taken
    /// and dropped when they come.
    pub fn abandon(&mut self) {
        self.queue.clear();
        self.staged = None;
        if self.parts.take().is_some() {
            // The follower holds the parts sent so far: the next request
            // must not be read as their continuation.
            self.fail_connection("a two-sided batch was abandoned half sent");
        }
        for exchange in &mut self.exchanges {
            exchange.ticket = None;
        }
        self.answers.clear();
    }

    /// Whether nothing is owed on the connection (no reply in flight), so
    /// that it can serve another client of this follower.
    pub fn is_quiet(&self) -> bool {
        self.exchanges.is_empty() && matches!(self.conn, Conn::Up { .. })
    }

    /// The connection the glue made, checked to be the follower's.
    pub fn connected(&mut self, now: Instant, hello: Hello) {
        assert!(
            matches!(self.conn, Conn::Connecting),
            "a connection that was not asked for"
        );
        self.connection += 1;
        self.conn = Conn::Up { hello };
        self.advance(now);
    }

    /// No connection could be made: every request waiting fails.
    pub fn connect_failed(&mut self, now: Instant, error: ReplicationError) {
        assert!(
            matches!(self.conn, Conn::Connecting),
            "a connection that was not asked for"
        );
        self.conn = Conn::Down;
        self.fail(error);
        self.advance(now);
    }

    /// The connection failed or delivered something that is not a reply
    /// (the glue's decode error is a `Protocol` error).
    pub fn connection_failed(&mut self, now: Instant, error: ReplicationError) {
        self.fail(error);
        self.advance(now);
    }

    /// A reply came on the connection.
    pub fn received(&mut self, now: Instant, reply: Reply) {
        let Some(exchange) = self.exchanges.pop_front() else {
            self.fail(self.protocol("an answer to nothing it was asked"));
            return;
        };
        if let Reply::Error(message) = reply {
            self.fail_front(
                exchange.ticket,
                ReplicationError::Remote {
                    node: self.config.target,
                    message,
                },
            );
            self.advance(now);
            return;
        }
        match exchange.expect {
            Expect::Grant { epoch } => self.on_grant(epoch, reply),
            Expect::Part => self.on_part(now, exchange.ticket, reply),
            Expect::Append { sent_to } => self.on_append_reply(exchange.ticket, sent_to, reply),
            Expect::Call => {
                if let Some(ticket) = exchange.ticket {
                    self.answers.push_back((ticket, Answer::Reply(Ok(reply))));
                }
            }
        }
        self.advance(now);
    }

    /// An operation the glue posted completed.
    pub fn completed(&mut self, now: Instant, op: OpId, completion: Completion) {
        if let Completion::Write(Err(e)) = &completion
            && e.wc().is_some_and(|w| w.is_access_denied())
        {
            self.events.push_back(LinkEvent::FencedOut);
        }
        if op.connection != self.connection || !matches!(self.conn, Conn::Up { .. }) {
            // Of a connection already closed.
            return;
        }
        match completion {
            Completion::Write(Ok(())) => {}
            Completion::Write(Err(e)) => self.fail(e.into()),
            Completion::Read(result) => self.on_read(now, op, result),
            Completion::Cas(result) => self.on_cas(op, result),
        }
        self.advance(now);
    }

    /// Time passed: an exchange whose reply is overdue fails the
    /// connection; a full follower's head is read again.
    pub fn handle_timeout(&mut self, now: Instant) {
        let overdue = self.exchanges.iter().any(|e| e.deadline <= now)
            || self.queue.front().is_some_and(|q| q.deadline <= now);
        if overdue {
            self.fail(ReplicationError::Timeout {
                node: self.config.target,
            });
        } else if let Some(staged) = self.staged.as_mut()
            && staged.retry_at.is_some_and(|at| at <= now)
        {
            staged.retry_at = None;
        }
        self.advance(now);
    }

    /// When [`Link::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let exchanges = self.exchanges.iter().map(|e| e.deadline);
        let queued = self.queue.front().map(|q| q.deadline);
        let retry = self.staged.as_ref().and_then(|s| s.retry_at);
        exchanges.chain(queued).chain(retry).min()
    }

    /// The next operation to perform.
    pub fn poll_op(&mut self) -> Option<Op> {
        self.ops.pop_front()
    }

    /// The next answer for openraft.
    pub fn poll_answer(&mut self) -> Option<(Ticket, Answer)> {
        self.answers.pop_front()
    }

    /// The next event for metrics and logs.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }

    fn protocol(&self, what: impl Into<String>) -> ReplicationError {
        ReplicationError::Protocol {
            node: self.config.target,
            what: what.into(),
        }
    }

    fn new_op(&mut self) -> OpId {
        let op = OpId {
            connection: self.connection,
            seq: self.next_op,
        };
        self.next_op += 1;
        op
    }

    fn hello(&self) -> Option<&Hello> {
        match &self.conn {
            Conn::Up { hello } => Some(hello),
            _ => None,
        }
    }

    fn epoch_of(&self, vote: &Vote) -> Result<Epoch, ReplicationError> {
        Epoch::new(vote.leader_id.term, self.config.node_id).ok_or(ReplicationError::NoEpoch {
            term: vote.leader_id.term,
            node: self.config.node_id,
        })
    }

    /// Posts `request` as an exchange whose reply `expect`s.
    fn post(
        &mut self,
        ticket: Option<Ticket>,
        request: Request,
        expect: Expect,
        deadline: Instant,
    ) {
        self.ops.push_back(Op::Send(request));
        self.exchanges.push_back(Exchange {
            ticket,
            expect,
            deadline,
        });
    }

    /// Fails the connection because of `error`: the first request still
    /// waited for gets it, every other one learns that the connection is
    /// gone; the view is forgotten.
    fn fail(&mut self, error: ReplicationError) {
        self.fail_front(None, error);
    }

    /// Fails the connection, giving `error` to `ticket` (where nobody waits
    /// for that exchange any more: to the first request still waited for).
    fn fail_front(&mut self, ticket: Option<Ticket>, error: ReplicationError) {
        let ticket = ticket.or_else(|| {
            self.exchanges
                .iter()
                .find_map(|e| e.ticket)
                .or(self.staged.as_ref().map(|s| s.ticket))
                .or(self.parts.as_ref().map(|p| p.ticket))
                .or(self.queue.front().map(|q| q.ticket))
        });
        let why = error.to_string();
        if let Some(ticket) = ticket {
            let answer = Link::answer_of(ticket, error);
            self.answers.push_back((ticket, answer));
        }
        self.fail_connection(&why);
    }

    /// The answer of `ticket`'s kind carrying `error`.
    fn answer_of(ticket: Ticket, error: ReplicationError) -> Answer {
        if ticket.call {
            Answer::Reply(Err(error))
        } else {
            Answer::Append(Err(error))
        }
    }

    /// Closes the connection: everything still waited for fails.
    fn fail_connection(&mut self, why: &str) {
        let waiting: Vec<Ticket> = self
            .exchanges
            .iter()
            .filter_map(|e| e.ticket)
            .chain(self.staged.as_ref().map(|s| s.ticket))
            .chain(self.parts.as_ref().map(|p| p.ticket))
            .chain(self.queue.iter().map(|q| q.ticket))
            .filter(|t| self.answers.iter().all(|(answered, _)| answered != t))
            .collect();
        for ticket in waiting {
            let answer = Link::answer_of(ticket, ReplicationError::NotConnected);
            self.answers.push_back((ticket, answer));
        }
        self.queue.clear();
        self.exchanges.clear();
        self.staged = None;
        self.parts = None;
        self.view = None;
        self.fencing = Fencing::Idle;
        if !matches!(self.conn, Conn::Down) {
            self.conn = Conn::Down;
            self.ops.push_back(Op::Close { why: why.into() });
            self.events.push_back(LinkEvent::Closed(why.into()));
        }
    }

    /// Moves the front of the queue as far as it can go now.
    fn advance(&mut self, now: Instant) {
        loop {
            if self.staged.is_some() {
                self.try_post_staged(now);
                if self.staged.is_some() {
                    return;
                }
            }
            if self.parts.is_some() {
                return;
            }
            let Some(front) = self.queue.front() else {
                return;
            };
            match self.conn {
                Conn::Down => {
                    self.conn = Conn::Connecting;
                    self.ops.push_back(Op::Connect);
                    return;
                }
                Conn::Connecting => return,
                Conn::Up { .. } => {}
            }
            let progressed = match &front.work {
                Work::Call(_) => {
                    let queued = self.queue.pop_front().expect("a front");
                    let Work::Call(request) = queued.work else {
                        unreachable!("matched a call")
                    };
                    self.post(Some(queued.ticket), request, Expect::Call, now + queued.ttl);
                    true
                }
                Work::Append(request, _) if request.entries.is_empty() => {
                    self.post_heartbeat(now);
                    true
                }
                Work::Append(..) => self.advance_batch(now),
            };
            if !progressed {
                return;
            }
        }
    }
}
