//! Paired tests of the leader's link and the follower's acceptor: stale
//! leaders, torn writes, a full ring, the fall back to two-sided batches and
//! back, pipelining, and replies to dropped exchanges.

use std::time::Duration;

use openraft::raft::AppendEntriesResponse;
use ringraft_wal::{EntryRef, Epoch, VoteRecord};

use super::{FOLLOWER, LEADER, Pair, RING_FULL_WAIT, TTL, append, entries};
use crate::log_store::{Encoded, Payloads};
use crate::protocol::{AppendBody, Request};
use crate::replication::{Answer, LinkEvent, Op, ReplicationError};
use crate::types::{Vote, log_id};

const TERM: u64 = 2;

fn epoch(term: u64, leader: u64) -> Epoch {
    Epoch::new(term, leader).expect("an epoch")
}

fn is_success(pair: &Pair, ticket: crate::replication::Ticket) -> bool {
    matches!(
        pair.append_answer(ticket),
        Ok(AppendEntriesResponse::Success)
    )
}

/// What kind of operation each one on the wire is.
fn wire_kinds(pair: &Pair) -> Vec<&'static str> {
    pair.wire
        .iter()
        .map(|op| match op {
            Op::Read { .. } => "read",
            Op::Cas { .. } => "cas",
            Op::Write { .. } => "write",
            Op::Send(Request::Grant { .. }) => "grant",
            Op::Send(Request::Append {
                body: AppendBody::Written { .. },
                ..
            }) => "written",
            Op::Send(Request::Append {
                body: AppendBody::Inline { .. },
                ..
            }) => "inline",
            Op::Send(Request::Append { .. }) => "heartbeat",
            Op::Send(_) => "send",
            Op::Connect | Op::Close { .. } => unreachable!("kept off the wire"),
        })
        .collect()
}

/// A pair whose leader holds the follower's fence in `TERM` and wrote
/// entries 0..=2.
fn fenced_pair() -> Pair {
    let mut pair = Pair::new();
    let first = pair.append(append(TERM, None, entries(TERM, 0, 3, 100)));
    pair.settle();
    assert!(is_success(&pair, first));
    pair
}

#[test]
fn a_first_batch_fences_then_travels_one_sided_and_the_next_needs_no_exchange() {
    let mut pair = Pair::new();
    let first = pair.append(append(TERM, None, entries(TERM, 0, 3, 100)));
    // The fence first: READ it, CAS it from what was read, ask the grant.
    assert_eq!(wire_kinds(&pair), ["read"]);
    pair.deliver_one();
    assert_eq!(wire_kinds(&pair), ["cas"]);
    pair.deliver_one();
    assert_eq!(wire_kinds(&pair), ["grant"]);
    assert_eq!(pair.follower.ring.fence(), epoch(TERM, LEADER));
    pair.settle();
    assert!(is_success(&pair, first));
    assert!(
        pair.events
            .contains(&LinkEvent::FenceTaken(epoch(TERM, LEADER)))
    );
    assert_eq!(pair.follower.log(), [(0, TERM), (1, TERM), (2, TERM)]);

    // The next batch continues the known tail: WRITE then SEND, nothing
    // else, and it is adopted.
    let second = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    assert_eq!(wire_kinds(&pair), ["write", "written"]);
    pair.settle();
    assert!(is_success(&pair, second));
    assert_eq!(pair.follower.log().len(), 5);
    assert_eq!(pair.connects, 1);
    assert!(pair.closes.is_empty());
}

/// The bytes of the WRITEs on the wire.
fn written_bytes(pair: &Pair) -> Vec<Vec<u8>> {
    pair.wire
        .iter()
        .filter_map(|op| match op {
            Op::Write { bytes, .. } => Some(bytes.clone()),
            _ => None,
        })
        .collect()
}

/// Issue 14, item 2: a batch WRITEs its entries' payloads as the leader's
/// log store encoded them, encoding only those it has no encoding of. An encoding of another entry at the same index (another
/// term's) is not one of them: the records are the bytes the batch would
/// be without any encoding at hand, and the follower adopts them.
#[test]
fn a_batch_writes_the_stores_encodings_and_encodes_only_what_they_lack() {
    let batch = entries(TERM, 3, 4, 100);
    let request = || append(TERM, Some(log_id(TERM, 2)), batch.clone());
    let mut plain = fenced_pair();
    plain.append(request());
    let expected = written_bytes(&plain);
    assert!(!expected.is_empty(), "a one-sided batch");

    // The store's encodings of entries 3 and 4; at 5 and 6, those of
    // another term's entries, with other payloads.
    let mut held: Vec<Encoded> = batch[..2]
        .iter()
        .map(|e| Encoded::of(e).expect("encodes"))
        .collect();
    held.extend(
        entries(TERM - 1, 5, 2, 30)
            .iter()
            .map(|e| Encoded::of(e).expect("encodes")),
    );
    let mut pair = fenced_pair();
    pair.events.clear();
    let ticket = pair.append_with(request(), Payloads::new(held));
    assert_eq!(written_bytes(&pair), expected, "the same records");
    pair.settle();
    assert!(is_success(&pair, ticket));
    assert_eq!(pair.follower.log().len(), 7);
    let encoded_here: Vec<usize> = pair
        .events
        .iter()
        .filter_map(|e| match e {
            LinkEvent::Written { encoded_here, .. } => Some(*encoded_here),
            _ => None,
        })
        .collect();
    // Only the two it had no encoding of.
    assert_eq!(encoded_here, [2]);
}

#[test]
fn batches_pipeline_up_to_the_depth_and_are_answered_in_order() {
    let mut pair = fenced_pair();
    let mut tickets = Vec::new();
    for k in 0..4u64 {
        assert!(pair.link.ready_for_append());
        let first = 3 + 2 * k;
        tickets.push(pair.append(append(
            TERM,
            Some(log_id(TERM, first - 1)),
            entries(TERM, first, 2, 50),
        )));
    }
    // Four batches posted before any answer; the depth is reached.
    assert_eq!(pair.writes_on_wire(), 4);
    assert!(!pair.link.ready_for_append());
    // A fifth waits for room in the pipeline.
    tickets.push(pair.append(append(
        TERM,
        Some(log_id(TERM, 10)),
        entries(TERM, 11, 2, 50),
    )));
    assert_eq!(pair.writes_on_wire(), 4);
    pair.deliver_all();
    assert!(pair.reply_one());
    assert_eq!(
        pair.writes_on_wire(),
        1,
        "the fifth is posted after an answer"
    );
    pair.settle();
    let answered: Vec<_> = pair.answers.iter().map(|(t, _)| *t).collect();
    assert_eq!(&answered[1..], &tickets[..], "answers in the order taken");
    assert!(tickets.iter().all(|t| is_success(&pair, *t)));
    assert_eq!(pair.follower.log().len(), 13);
}

#[test]
fn a_stale_leader_is_refused_by_the_nic_and_then_steps_down() {
    let mut pair = fenced_pair();
    // A leader of term 3 (node 3) takes the follower's fence: its grant
    // rotates the rkey.
    pair.follower.fenced_by(epoch(3, 3));
    let stale = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    assert_eq!(wire_kinds(&pair), ["write", "written"]);
    pair.deliver_one();
    // The follower's NIC refused the WRITE: the leader knows it was fenced
    // out, and nothing of the batch entered the follower's log.
    assert!(pair.events.contains(&LinkEvent::FencedOut));
    assert!(matches!(
        pair.append_answer(stale),
        Err(ReplicationError::Transport(_))
    ));
    assert_eq!(pair.follower.log().len(), 3);
    assert_eq!(pair.follower.ring.tail_lsn(), pair.follower.tail().next_lsn);

    // Its next batch finds the higher term in the fence: it steps down,
    // without touching the fence.
    let next = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    pair.settle();
    assert!(matches!(
        pair.append_answer(next),
        Ok(AppendEntriesResponse::HigherVote(v)) if *v == Vote::new(3, 3)
    ));
    assert_eq!(pair.follower.ring.fence(), epoch(3, 3));
    assert_eq!(pair.follower.log().len(), 3);
}

#[test]
fn a_stale_leaders_message_naming_its_records_is_refused_by_the_fence_check() {
    let mut pair = fenced_pair();
    let batch = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    // The WRITE lands before the fence moves (it was in flight); the
    // message naming it arrives after.
    pair.deliver_one();
    let current = pair.follower.ring.fence();
    pair.follower
        .ring
        .compare_exchange_fence(current, epoch(3, 3))
        .expect("the fence moves up");
    pair.settle();
    assert!(matches!(
        pair.append_answer(batch),
        Err(ReplicationError::Fenced { by, .. }) if *by == epoch(3, 3)
    ));
    assert_eq!(pair.follower.log().len(), 3, "nothing adopted");
}

#[test]
fn a_deposed_leader_is_not_granted_again_after_the_follower_voted_in_a_higher_term() {
    let mut pair = fenced_pair();
    // The follower voted for a candidate of term 3 (its rkey rotated), but
    // no leader of term 3 fenced in yet: its fence still holds the old
    // leader's epoch.
    pair.follower.vote = Some(VoteRecord {
        term: 3,
        voted_for: Some(3),
        committed: false,
    });
    pair.follower.revoke();
    let key = pair.follower.data_key;
    // The old leader's WRITE fails, it reconnects, finds its own epoch in
    // the fence and asks for the grant again: refused with the vote's
    // term, so it steps down.
    let stale = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    pair.settle();
    assert!(pair.append_answer(stale).is_err());
    let again = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 100),
    ));
    pair.settle();
    assert!(matches!(
        pair.append_answer(again),
        Ok(AppendEntriesResponse::HigherVote(v)) if v.leader_id.term == 3
    ));
    assert_eq!(pair.follower.data_key, key, "no new rkey was handed out");
    assert_eq!(pair.follower.log().len(), 3);
}

#[test]
fn a_torn_write_is_rejected_and_the_next_batch_rewrites_it() {
    let mut pair = fenced_pair();
    pair.follower.tear_next_write = Some(100);
    let torn = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 500),
    ));
    pair.settle();
    assert!(matches!(
        pair.append_answer(torn),
        Err(ReplicationError::Rejected { node: FOLLOWER, .. })
    ));
    assert!(pair.events.contains(&LinkEvent::Rejected));
    assert_eq!(
        pair.follower.log().len(),
        3,
        "a torn record is never adopted"
    );
    // The retry reconnects, gets a grant (the tail again) and writes the
    // batch whole.
    let retry = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 2, 500),
    ));
    pair.settle();
    assert!(is_success(&pair, retry));
    assert_eq!(pair.follower.log().len(), 5);
    assert_eq!(pair.connects, 2);
}

/// Fills the follower's ring to `(term, last)`: batches of 16 KiB entries.
fn fill(pair: &mut Pair, batches: u64) -> u64 {
    let mut last = 2;
    for _ in 0..batches {
        let ticket = pair.append(append(
            TERM,
            Some(log_id(TERM, last)),
            entries(TERM, last + 1, 28, 16 << 10),
        ));
        pair.settle();
        assert!(is_success(pair, ticket));
        last += 28;
    }
    last
}

#[test]
fn a_full_ring_makes_a_batch_wait_for_the_head_then_fail_as_unreachable() {
    let mut pair = fenced_pair();
    let last = fill(&mut pair, 2);
    let start = pair.now;
    let waiting = pair.append(append(
        TERM,
        Some(log_id(TERM, last)),
        entries(TERM, last + 1, 28, 16 << 10),
    ));
    // No room below the head: the leader READs the head, not the data.
    assert_eq!(wire_kinds(&pair), ["read"]);
    pair.deliver_all();
    assert_eq!(pair.writes_on_wire(), 0);
    // It keeps re-reading (with a backoff) until the wait runs out.
    let mut reads = 1;
    while pair.answer(waiting).is_none() {
        let next = pair.link.poll_timeout().expect("a timer while waiting");
        pair.advance_time(next - pair.now);
        reads += wire_kinds(&pair).iter().filter(|k| **k == "read").count();
        pair.deliver_all();
    }
    assert!(reads >= 3, "re-read the head {reads} times");
    assert!(matches!(
        pair.append_answer(waiting),
        Err(ReplicationError::RingFull { .. })
    ));
    assert!(
        pair.now - start >= RING_FULL_WAIT,
        "it waited the whole wait"
    );
    assert!(
        pair.append_answer(waiting)
            .as_ref()
            .err()
            .is_some_and(|e| e.is_unreachable())
    );
}

#[test]
fn a_full_ring_batch_goes_once_the_follower_frees_room() {
    let mut pair = fenced_pair();
    let last = fill(&mut pair, 2);
    let waiting = pair.append(append(
        TERM,
        Some(log_id(TERM, last)),
        entries(TERM, last + 1, 28, 16 << 10),
    ));
    pair.deliver_all();
    assert_eq!(pair.writes_on_wire(), 0);
    // The follower's flusher frees what it wrote to its segments.
    pair.follower.purge_through(TERM, last);
    let next = pair.link.poll_timeout().expect("a timer while waiting");
    pair.advance_time(next - pair.now);
    pair.settle();
    assert!(is_success(&pair, waiting), "{:?}", pair.answer(waiting));
    assert_eq!(pair.follower.ring.next_index(), last + 29);
}

/// A follower (with a ring of `capacity` bytes) that holds entries 0..=4
/// of term 1, written under node 3's epoch.
fn diverged_pair(capacity: u64) -> Pair {
    let mut pair = Pair::with_capacity(capacity);
    let old = epoch(1, 3);
    pair.follower
        .ring
        .compare_exchange_fence(Epoch::ZERO, old)
        .expect("the old leader's fence");
    let payload = [7u8; 10];
    let old_entries: Vec<_> = (0..5)
        .map(|index| EntryRef {
            term: 1,
            index,
            payload: &payload,
        })
        .collect();
    pair.follower
        .ring
        .append(old, &old_entries)
        .expect("the old leader's entries");
    pair
}

#[test]
fn a_conflicting_suffix_travels_two_sided_and_the_next_batch_one_sided_again() {
    let mut pair = diverged_pair(super::CAPACITY);
    // The leader's log: 0..=2 of term 1, then its own from 3.
    let fix = pair.append(append(TERM, Some(log_id(1, 2)), entries(TERM, 3, 3, 100)));
    pair.deliver_all(); // READ, CAS, grant
    assert_eq!(wire_kinds(&pair), Vec::<&str>::new());
    assert!(pair.reply_one()); // the grant: the follower's last is (1, 4)
    assert_eq!(
        wire_kinds(&pair),
        ["inline"],
        "no WRITE over adopted records"
    );
    pair.settle();
    assert!(is_success(&pair, fix));
    assert_eq!(
        pair.follower.log(),
        [(0, 1), (1, 1), (2, 1), (3, TERM), (4, TERM), (5, TERM)]
    );
    let next = pair.append(append(
        TERM,
        Some(log_id(TERM, 5)),
        entries(TERM, 6, 2, 100),
    ));
    assert_eq!(wire_kinds(&pair), ["write", "written"]);
    pair.settle();
    assert!(is_success(&pair, next));
    assert_eq!(pair.follower.log().len(), 8);
}

#[test]
fn a_new_leaders_probe_behind_the_tail_goes_on_one_sided_from_the_tail() {
    let mut pair = diverged_pair(super::CAPACITY);
    // openraft's probe starts behind the follower's tail (1, 4) and holds
    // it: the entries up to it are the follower's (log matching), so only
    // those after it travel, WRITten at the tail.
    let mut batch = entries(1, 2, 3, 10);
    batch.extend(entries(TERM, 5, 2, 100));
    let probe = pair.append(append(TERM, Some(log_id(1, 1)), batch));
    pair.deliver_all(); // READ, CAS, grant
    assert!(pair.reply_one()); // the grant: the follower's last is (1, 4)
    assert_eq!(wire_kinds(&pair), ["write", "written"]);
    pair.settle();
    assert!(is_success(&pair, probe));
    assert_eq!(
        pair.follower.log(),
        [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, TERM), (6, TERM)]
    );
    // A probe holding no entry after the tail still travels two-sided.
    let mut pair = diverged_pair(super::CAPACITY);
    let probe = pair.append(append(TERM, Some(log_id(1, 1)), entries(1, 2, 3, 10)));
    pair.deliver_all();
    assert!(pair.reply_one());
    assert_eq!(wire_kinds(&pair), ["inline"]);
    pair.settle();
    assert!(is_success(&pair, probe));
    assert_eq!(pair.follower.log().len(), 5);
}

#[test]
fn a_conflict_answer_makes_the_next_batch_fence_again_from_the_real_tail() {
    let mut pair = diverged_pair(super::CAPACITY);
    // The leader believes the follower holds (TERM, 4): it does not.
    let probe = pair.append(append(
        TERM,
        Some(log_id(TERM, 4)),
        entries(TERM, 5, 1, 100),
    ));
    pair.settle();
    assert!(matches!(
        pair.append_answer(probe),
        Ok(AppendEntriesResponse::Conflict)
    ));
    let back = pair.append(append(TERM, Some(log_id(1, 2)), entries(TERM, 3, 1, 100)));
    assert_eq!(wire_kinds(&pair), ["read"], "the view was dropped");
    pair.settle();
    assert!(is_success(&pair, back));
    assert_eq!(pair.follower.log(), [(0, 1), (1, 1), (2, 1), (3, TERM)]);
    assert!(pair.closes.is_empty(), "a conflict keeps the connection");
}

#[test]
fn the_reply_to_an_abandoned_exchange_is_not_taken_for_the_next_ones() {
    let mut pair = fenced_pair();
    // A batch the follower takes; its caller goes away before the reply.
    let dropped = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 1, 100),
    ));
    pair.deliver_all();
    assert_eq!(pair.replies.len(), 1);
    pair.link.abandon();
    // The next caller's heartbeat names a log id the follower lacks: its
    // answer is a conflict, and it must not get the dropped batch's
    // success.
    let heartbeat = pair.append(append(TERM, Some(log_id(TERM, 9)), Vec::new()));
    pair.settle();
    assert!(pair.answer(dropped).is_none());
    assert!(matches!(
        pair.append_answer(heartbeat),
        Ok(AppendEntriesResponse::Conflict)
    ));
    assert!(pair.closes.is_empty(), "the connection stays");
    assert_eq!(pair.follower.log().len(), 4);
}

#[test]
fn abandoning_a_two_sided_batch_half_sent_closes_the_connection() {
    // A ring whose half holds more than one part.
    let mut pair = diverged_pair(4 << 20);
    let big = pair.append(append(
        TERM,
        Some(log_id(1, 2)),
        entries(TERM, 3, 40, 40 << 10),
    ));
    pair.deliver_all();
    assert!(pair.reply_one()); // the grant
    assert_eq!(wire_kinds(&pair), ["inline"]);
    pair.link.abandon();
    pair.collect();
    assert_eq!(pair.closes.len(), 1);
    assert!(pair.answer(big).is_none());
}

#[test]
fn an_overdue_reply_fails_the_exchange_and_the_connection() {
    let mut pair = fenced_pair();
    let late = pair.append(append(
        TERM,
        Some(log_id(TERM, 2)),
        entries(TERM, 3, 1, 100),
    ));
    pair.deliver_all();
    pair.advance_time(TTL - Duration::from_millis(1));
    assert!(pair.answer(late).is_none());
    pair.advance_time(Duration::from_millis(1));
    assert!(matches!(
        pair.append_answer(late),
        Err(ReplicationError::Timeout { node: FOLLOWER })
    ));
    assert_eq!(pair.closes.len(), 1);
}

#[test]
fn a_call_is_answered_with_its_own_reply() {
    let mut pair = fenced_pair();
    let ticket = pair
        .link
        .call(pair.now, Request::ReadIndex { lease: false }, TTL);
    pair.settle();
    assert!(matches!(pair.answer(ticket), Some(Answer::Reply(Ok(_)))));
}
