//! The leader's [`Link`] and the follower's [`Acceptor`] stepped against
//! each other without sockets, runtime or clock (after quinn-proto's paired
//! tests): a [`Pair`] performs the link's operations on a follower that
//! holds a real wal ring (its NIC applies one-sided operations to the
//! ring's memory and checks the rkey; its SENDs go to the acceptor, whose
//! steps it performs with a small stand-in for openraft's AppendEntries),
//! and the test decides what reaches whom, when.

mod pairs;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use openraft::raft::AppendEntriesResponse;
use ringraft_transport::{RemoteAddr, RemoteRegion, TransportError, WcError};
use ringraft_wal::{Epoch, FenceWord, HeadWord, LogPos, Ring, RingConfig, VoteRecord};

use super::acceptor::{AcceptorLimits, AppendMeta, NodeView, Step, refuse_grant};
use super::{Acceptor, Answer, AppendRequest, Completion, Link, LinkConfig, LinkEvent, Op, Ticket};
use crate::log_store::{Payloads, encode_payload};
use crate::protocol::{Hello, Reply, Request, Tail};
use crate::types::{Command, Entry, LogId, Vote, log_id, term_of};

pub(super) const LEADER: u64 = 1;
pub(super) const FOLLOWER: u64 = 2;
pub(super) const CAPACITY: u64 = 1 << 20;
pub(super) const TTL: Duration = Duration::from_secs(5);
pub(super) const RING_FULL_WAIT: Duration = Duration::from_secs(2);
/// Keys of the fence and head words (never rotated).
const FENCE_KEY: u32 = 0xFE;
const HEAD_KEY: u32 = 0x4E;

/// `count` entries of `term` from index `first`, each carrying `bytes`
/// bytes of payload.
pub(super) fn entries(term: u64, first: u64, count: u64, bytes: usize) -> Vec<Entry> {
    (first..first + count)
        .map(|index| Entry {
            log_id: log_id(term, index),
            payload: openraft::EntryPayload::Normal(Command::new(None, vec![index as u8; bytes])),
        })
        .collect()
}

/// An AppendEntries of the leader in `term` carrying `entries` after `prev`.
pub(super) fn append(term: u64, prev: Option<LogId>, entries: Vec<Entry>) -> AppendRequest {
    AppendRequest {
        vote: Vote::new_committed(term, LEADER),
        prev_log_id: prev,
        entries,
        leader_commit: None,
    }
}

/// A remote access error, as the follower's NIC answers a bad rkey.
fn access_denied() -> TransportError {
    TransportError::Completion {
        op: "WRITE",
        peer: "follower".into(),
        error: WcError::RemoteAccess,
    }
}

/// The follower: its ring (in a temporary directory), its vote, the rkey
/// its data area is registered with, and the acceptor of the leader's
/// connection.
pub(super) struct Follower {
    _dir: tempfile::TempDir,
    capacity: u64,
    pub(super) ring: Ring,
    pub(super) vote: Option<VoteRecord>,
    pub(super) data_key: u32,
    pub(super) acceptor: Acceptor,
    /// A WRITE lands torn: only this many of its bytes.
    pub(super) tear_next_write: Option<usize>,
}

impl Follower {
    fn new(capacity: u64) -> Follower {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = RingConfig {
            capacity,
            max_record_bytes: 64 << 10,
            cluster_id: 7,
            node_id: FOLLOWER,
            lock_memory: false,
        };
        let path = dir.path().join("ring");
        Ring::create(&path, &config, 1).expect("a ring");
        let (ring, _) = Ring::open(&path, &config).expect("the ring opens");
        Follower {
            _dir: dir,
            capacity,
            ring,
            vote: None,
            data_key: 1,
            acceptor: Acceptor::new(LEADER, AcceptorLimits::default()),
            tear_next_write: None,
        }
    }

    fn hello(&self) -> Hello {
        let regions = self.ring.regions();
        Hello {
            cluster_id: 7,
            node_id: FOLLOWER,
            fence: RemoteRegion {
                addr: regions.fence.addr as u64,
                len: 8,
                rkey: FENCE_KEY,
            },
            head: RemoteRegion {
                addr: regions.head.addr as u64,
                len: 8,
                rkey: HEAD_KEY,
            },
            capacity: self.capacity,
            incarnation: 1,
        }
    }

    fn data(&self) -> RemoteRegion {
        let regions = self.ring.regions();
        RemoteRegion {
            addr: regions.data.addr as u64,
            len: regions.data.len as u64,
            rkey: self.data_key,
        }
    }

    pub(super) fn tail(&self) -> Tail {
        let tip = self.ring.tip();
        Tail {
            next_lsn: self.ring.tail_lsn(),
            next_index: tip.next_index,
            last_term: tip.last_term,
            epoch: tip.epoch,
            unanchored: tip.unanchored,
            head_lsn: self.ring.head_lsn(),
        }
    }

    /// Revokes every remote write access (what a node does when its term
    /// advances).
    pub(super) fn revoke(&mut self) {
        self.data_key += 1;
    }

    /// Another leader takes the fence (through its own CAS) and the rkey
    /// rotates with its grant.
    pub(super) fn fenced_by(&mut self, epoch: Epoch) {
        let current = self.ring.fence();
        self.ring
            .compare_exchange_fence(current, epoch)
            .expect("the fence moves up");
        self.vote = Some(VoteRecord {
            term: epoch.term(),
            voted_for: Some(epoch.leader_id()),
            committed: true,
        });
        self.revoke();
    }

    /// The follower's NIC: a one-sided operation, without the follower's
    /// code.
    fn nic(&mut self, op: &Op) -> Completion {
        let regions = self.ring.regions();
        match *op {
            Op::Read { at, .. } => {
                let word = if at == self.hello().fence.start() {
                    FenceWord::new(self.ring.fence()).to_bytes()
                } else if at == self.hello().head.start() {
                    HeadWord::new(self.ring.head_lsn()).to_bytes()
                } else {
                    return Completion::Read(Err(access_denied()));
                };
                Completion::Read(Ok(word.to_vec()))
            }
            Op::Cas {
                at, expect, new, ..
            } => {
                if at != self.hello().fence.start() {
                    return Completion::Cas(Err(access_denied()));
                }
                let found = self
                    .ring
                    .compare_exchange_fence(Epoch(expect), Epoch(new))
                    .expect("a CAS");
                Completion::Cas(Ok(found.0))
            }
            Op::Write { at, ref bytes, .. } => {
                let data = regions.data.addr as u64;
                let inside = at.addr >= data
                    && at.addr + bytes.len() as u64 <= data + regions.data.len as u64;
                if at.rkey != self.data_key || !inside {
                    return Completion::Write(Err(access_denied()));
                }
                let len = self.tear_next_write.take().unwrap_or(bytes.len());
                // SAFETY: the range lies inside the ring's data area (checked
                // above), which the mapping keeps alive; the ring never holds
                // a reference over bytes beyond its adopted tail, where a
                // leader writes (the wal's raw-access contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.addr as *mut u8, len);
                }
                Completion::Write(Ok(()))
            }
            _ => unreachable!("not a one-sided operation"),
        }
    }

    fn node_view(&self) -> NodeView {
        NodeView {
            node_id: FOLLOWER,
            fence: self.ring.fence(),
            vote: self.vote,
            votes_blocked: false,
        }
    }

    /// The follower's code: the acceptor decides, this performs (the ring,
    /// and a stand-in for openraft's AppendEntries).
    fn serve(&mut self, request: Request) -> Reply {
        let view = self.node_view();
        match self.acceptor.on_request(request, &view) {
            Step::Reply(reply) => reply,
            Step::Grant { epoch } => match refuse_grant(view.fence, view.vote, epoch) {
                Err(fence) => Reply::NotFenced { fence },
                Ok(()) => {
                    self.revoke();
                    Reply::Granted {
                        data: self.data(),
                        tail: self.tail(),
                    }
                }
            },
            Step::Adopt { meta, request } => {
                let to_lsn = request.to_lsn;
                if !self.log_matches(meta.prev_log_id) {
                    self.ring.clear_scratch(to_lsn);
                    return self.appended(AppendEntriesResponse::Conflict);
                }
                match self.ring.adopt(request) {
                    Ok(_) => self.appended(AppendEntriesResponse::Success),
                    Err(e) => {
                        self.ring.clear_scratch(to_lsn);
                        Reply::Rejected {
                            reason: e.to_string(),
                            tail: self.tail(),
                        }
                    }
                }
            }
            Step::Append { meta, entries } => self.append_two_sided(meta, entries),
            Step::ReadIndex { .. } => Reply::ReadIndex(self.ring.next_index()),
            other => Reply::Error(format!("not played by the pair tests: {other:?}")),
        }
    }

    /// Raft's log matching: the follower holds `prev`.
    fn log_matches(&self, prev: Option<LogId>) -> bool {
        match prev {
            None => true,
            Some(prev) => {
                let pos = LogPos {
                    term: term_of(&prev),
                    index: prev.index,
                };
                self.ring.term_of(prev.index) == Some(pos.term)
                    || self.ring.last_purged() == Some(pos)
            }
        }
    }

    /// openraft's AppendEntries with entries that came two-sided: the
    /// follower truncates what conflicts and writes them itself.
    fn append_two_sided(&mut self, meta: AppendMeta, entries: Vec<Entry>) -> Reply {
        if !self.log_matches(meta.prev_log_id) {
            return self.appended(AppendEntriesResponse::Conflict);
        }
        if let Some(first) = entries.first() {
            let keep = first.log_id.index.checked_sub(1);
            self.ring.truncate_after(keep).expect("a truncation");
            let payloads: Vec<Vec<u8>> = entries
                .iter()
                .map(|e| encode_payload(&e.payload).expect("a payload encodes"))
                .collect();
            let refs: Vec<ringraft_wal::EntryRef<'_>> = entries
                .iter()
                .zip(&payloads)
                .map(|(e, payload)| ringraft_wal::EntryRef {
                    term: term_of(&e.log_id),
                    index: e.log_id.index,
                    payload,
                })
                .collect();
            let fence = self.ring.fence();
            self.ring
                .append(fence, &refs)
                .expect("the follower appends");
        }
        self.appended(AppendEntriesResponse::Success)
    }

    fn appended(&self, response: AppendEntriesResponse<crate::types::TypeConfig>) -> Reply {
        Reply::Appended {
            response,
            tail: self.tail(),
        }
    }

    /// The log as (index, term) pairs.
    pub(super) fn log(&self) -> Vec<(u64, u64)> {
        (self.ring.first_index()..self.ring.next_index())
            .map(|index| (index, self.ring.term_of(index).expect("in the log")))
            .collect()
    }

    /// Frees the ring up to `index` (what the flusher and a purge do).
    pub(super) fn purge_through(&mut self, term: u64, index: u64) {
        let point = self
            .ring
            .purge_point(LogPos { term, index })
            .expect("a purge point")
            .expect("something to purge");
        self.ring.apply_purge(point);
    }
}

/// A leader's link and a follower, stepped by the test.
pub(super) struct Pair {
    pub(super) link: Link,
    pub(super) follower: Follower,
    pub(super) now: Instant,
    /// One-sided operations and SENDs the link posted, not yet delivered
    /// (in order: RC).
    pub(super) wire: VecDeque<Op>,
    /// Replies on their way back.
    pub(super) replies: VecDeque<Reply>,
    pub(super) answers: Vec<(Ticket, Answer)>,
    pub(super) events: Vec<LinkEvent>,
    /// Connections the link asked for.
    pub(super) connects: usize,
    /// Connections the link closed.
    pub(super) closes: Vec<String>,
}

impl Pair {
    pub(super) fn new() -> Pair {
        Pair::with_capacity(CAPACITY)
    }

    /// A pair whose follower's ring holds `capacity` bytes.
    pub(super) fn with_capacity(capacity: u64) -> Pair {
        Pair {
            link: Link::new(LinkConfig {
                node_id: LEADER,
                target: FOLLOWER,
                pipeline_depth: 4,
                ring_full_wait: RING_FULL_WAIT,
                reserve_bytes: 64 << 10,
            }),
            follower: Follower::new(capacity),
            now: Instant::now(),
            wire: VecDeque::new(),
            replies: VecDeque::new(),
            answers: Vec::new(),
            events: Vec::new(),
            connects: 0,
            closes: Vec::new(),
        }
    }

    /// Takes what the link put out: connections are made at once, the rest
    /// goes on the wire.
    pub(super) fn collect(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.link.poll_op() {
                progressed = true;
                match op {
                    Op::Connect => {
                        self.connects += 1;
                        self.wire.clear();
                        self.replies.clear();
                        self.follower.acceptor = Acceptor::new(LEADER, AcceptorLimits::default());
                        let hello = self.follower.hello();
                        self.link.connected(self.now, hello);
                    }
                    Op::Close { why } => {
                        self.wire.clear();
                        self.replies.clear();
                        self.closes.push(why);
                    }
                    op => self.wire.push_back(op),
                }
            }
            while let Some(answer) = self.link.poll_answer() {
                self.answers.push(answer);
            }
            while let Some(event) = self.link.poll_event() {
                self.events.push(event);
            }
            if !progressed {
                return;
            }
        }
    }

    /// Delivers the next operation on the wire; a one-sided one completes
    /// at once (its completion goes back to the link), a SEND is served
    /// and its reply queued.
    pub(super) fn deliver_one(&mut self) -> bool {
        self.collect();
        let Some(op) = self.wire.pop_front() else {
            return false;
        };
        match op {
            Op::Send(request) => {
                let reply = self.follower.serve(request);
                self.replies.push_back(reply);
            }
            op => {
                let id = match &op {
                    Op::Read { op, .. } | Op::Cas { op, .. } | Op::Write { op, .. } => *op,
                    _ => unreachable!("kept off the wire"),
                };
                let completion = self.follower.nic(&op);
                self.link.completed(self.now, id, completion);
            }
        }
        self.collect();
        true
    }

    /// Delivers everything on the wire, not the replies.
    pub(super) fn deliver_all(&mut self) {
        while self.deliver_one() {}
    }

    /// Hands the next reply to the link.
    pub(super) fn reply_one(&mut self) -> bool {
        self.collect();
        let Some(reply) = self.replies.pop_front() else {
            return false;
        };
        self.link.received(self.now, reply);
        self.collect();
        true
    }

    /// Runs until nothing moves: every operation delivered, every reply
    /// taken.
    pub(super) fn settle(&mut self) {
        loop {
            self.deliver_all();
            if !self.reply_one() {
                return;
            }
        }
    }

    /// Lets `by` pass and tells the link.
    pub(super) fn advance_time(&mut self, by: Duration) {
        self.now += by;
        self.link.handle_timeout(self.now);
        self.collect();
    }

    /// Submits an AppendEntries (no entry's encoding at hand: the link
    /// encodes each).
    pub(super) fn append(&mut self, request: AppendRequest) -> Ticket {
        self.append_with(request, Payloads::default())
    }

    /// Submits an AppendEntries with encodings of its entries, as the
    /// leader's log store made them.
    pub(super) fn append_with(&mut self, request: AppendRequest, payloads: Payloads) -> Ticket {
        let ticket = self.link.append(self.now, request, payloads, TTL);
        self.collect();
        ticket
    }

    /// The answer to `ticket`, if it came.
    pub(super) fn answer(&self, ticket: Ticket) -> Option<&Answer> {
        self.answers
            .iter()
            .find(|(t, _)| *t == ticket)
            .map(|(_, a)| a)
    }

    /// The AppendEntries answer to `ticket`, which must have come.
    pub(super) fn append_answer(
        &self,
        ticket: Ticket,
    ) -> &Result<AppendEntriesResponse<crate::types::TypeConfig>, super::ReplicationError> {
        match self.answer(ticket) {
            Some(Answer::Append(result)) => result,
            other => panic!("no append answer for {ticket:?}: {other:?}"),
        }
    }

    /// How many WRITEs are on the wire.
    pub(super) fn writes_on_wire(&self) -> usize {
        self.wire
            .iter()
            .filter(|op| matches!(op, Op::Write { .. }))
            .count()
    }

    /// The address a leader would write at with a revoked key, for tests of
    /// the NIC.
    #[allow(dead_code)]
    pub(super) fn stale_data_addr(&self) -> RemoteAddr {
        let mut data = self.follower.data();
        data.rkey = data.rkey.wrapping_sub(1);
        data.start()
    }
}
