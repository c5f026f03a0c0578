//! Admission by free ring space: a full ring slows writers down before their
//! proposals reach openraft, and never stops Raft.
//!
//! Why here and not in the log store: openraft's core task awaits
//! `RaftLogStorage::append`, and the purge that frees ring space is a
//! command run by that same task. An append that waited for room would wait
//! for itself, and an append that fails is a fatal storage error (the node
//! stops being a Raft member). So the room a proposal's entries will take is
//! reserved here, in front of `client_write`, on every path that proposes:
//! [`crate::Node`]'s write path and the leader's handling of proposals that
//! followers forward ([`crate::server`]).
//!
//! The rule: a proposal whose records take `need` bytes of ring is admitted
//! when `used + reserved + need <= limit`, where
//! - `used` = `tail_lsn - head_lsn` of this node's ring (written, not yet
//!   purged);
//! - `reserved` = the bytes of admitted proposals that openraft has not
//!   answered yet. An entry already written but not yet answered counts
//!   twice (in `used` too): the error is on the safe side and lasts until its
//!   commit;
//! - `limit` = capacity − [`RAFT_RESERVE_BYTES`] − the largest wrap waste (a
//!   record that would straddle the end of the data area is preceded by a
//!   wrap marker and the rest of the lap is skipped: at most one record
//!   length minus one line; the pending records, fewer bytes than the ring,
//!   cross the end at most once). [`RAFT_RESERVE_BYTES`] is left for the
//!   entries openraft writes itself (a new leader's blank entry, membership
//!   changes), which no proposer admits.
//!
//! Waiters are admitted in arrival order (a large proposal is not starved by
//! small ones). A waiter checks again when a reservation is given back and
//! when the node says that space may have been freed
//! ([`Admission::space_freed`]: a purge, a snapshot install, a truncation).
//! A proposal that found no room within its wait gets
//! [`AdmissionError::Busy`]: nothing was proposed, retrying is safe.
//!
//! Never: wait for room inside openraft's `append`; give a reservation back
//! before openraft answered the proposal (its entry may still be written
//! after the proposer gave up: see [`Admitted::during`]).
//!
//! A proposal made on a follower is admitted against that node's ring too
//! (a node learns whether it leads only from openraft's answer; openraft
//! writes nothing for a proposal it forwards), and the leader admits the
//! forwarded proposal again in its own ring.
//!
//! What does not go through here: entries openraft writes itself (the
//! reserve), proposals made on [`crate::Node::raft`] directly (they bypass
//! backpressure: use [`crate::Node::propose`]), and a follower's ring, which
//! the leader fills under its own flow control (`network.rs`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use ringraft_wal::layout::LINE_BYTES;
use ringraft_wal::record::record_len;
use tokio::sync::Notify;

use crate::log_store::LogStore;
use crate::types::Command;

/// Ring bytes no proposal may take: room for the entries openraft appends
/// on its own (blank entries of new leaders, membership changes: a few
/// hundred bytes each).
pub const RAFT_RESERVE_BYTES: u64 = 64 << 10;

/// What the gate reads of the ring.
pub trait RingSpace: Send + Sync + 'static {
    /// Bytes written and not yet purged (`tail_lsn - head_lsn`).
    fn used_bytes(&self) -> u64;
    /// Why the log takes no proposal now, if it does not (a full disk).
    fn refusal(&self) -> Option<String> {
        None
    }
}

impl RingSpace for LogStore {
    fn used_bytes(&self) -> u64 {
        self.with_wal(|w| {
            let ring = w.ring();
            ring.tail_lsn() - ring.head_lsn()
        })
    }
    fn refusal(&self) -> Option<String> {
        self.disk_full()
    }
}

/// Why a proposal was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The ring had no room within the wait: nothing was proposed; retry
    /// later.
    #[error(
        "busy: the ring had no room for {need} more bytes within {waited_ms} ms \
         ({used} written and not yet purged, {reserved} reserved by proposals in flight, \
         limit {limit}); a follower may be down or slow while the log is purged: retry later"
    )]
    Busy {
        /// Ring bytes the proposal needs.
        need: u64,
        /// Ring bytes in use at the last check.
        used: u64,
        /// Ring bytes reserved by admitted proposals at the last check.
        reserved: u64,
        /// The admission limit.
        limit: u64,
        /// How long it waited.
        waited_ms: u64,
    },
    /// One command's entry is larger than a ring record may be.
    #[error(
        "a command of {payload} bytes (as encoded in its log entry) is above the largest \
         record payload of this ring, {max} bytes (NodeConfig::max_record_bytes)"
    )]
    RecordTooLarge {
        /// The encoded entry payload.
        payload: u64,
        /// The ring's largest record payload.
        max: u64,
    },
    /// The log cannot take more now: its disk is full. Nothing was
    /// proposed; appends are taken again once space is freed.
    #[error("{why}")]
    DiskFull {
        /// What the log said.
        why: String,
    },
    /// The proposal's records together are more than the ring can ever
    /// admit at once.
    #[error(
        "a proposal of {need} ring bytes can never be admitted: the limit is {limit} bytes \
         (ring capacity minus the reserve for openraft's own entries and the largest wrap); \
         propose fewer commands at once"
    )]
    BatchTooLarge {
        /// Ring bytes the proposal needs.
        need: u64,
        /// The admission limit.
        limit: u64,
    },
}

#[derive(Default)]
struct Queue {
    /// Bytes of admitted proposals not yet answered by openraft.
    reserved: u64,
    /// Tickets of waiting proposals, oldest first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

struct Inner {
    ring: Arc<dyn RingSpace>,
    limit_bytes: u64,
    max_payload_bytes: u64,
    max_wait: Duration,
    queue: Mutex<Queue>,
    /// Wakes waiters: a reservation given back, space freed, the head of
    /// the queue changed.
    changed: Notify,
    /// Wakes [`Admission::someone_waits`]: a proposal joined the queue.
    arrived: Notify,
}

/// The admission gate of one node (clones share it).
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("limit_bytes", &self.inner.limit_bytes)
            .field("reserved_bytes", &self.reserved_bytes())
            .field("waiting", &self.waiting())
            .finish()
    }
}

/// The ring bytes `command` takes as a record (header, payload as openraft
/// stores it, padding), or its encoded payload size when that is above
/// `max_payload_bytes`.
fn ring_bytes(command: &Command, max_payload_bytes: u64) -> Result<u64, AdmissionError> {
    let payload = payload_len(command);
    if payload > max_payload_bytes {
        return Err(AdmissionError::RecordTooLarge {
            payload,
            max: max_payload_bytes,
        });
    }
    Ok(record_len(payload))
}

/// The length of `EntryPayload::Normal(command)` as the log store encodes
/// it ([`crate::log_store`]), computed without copying the command: the
/// same bincode encoding of a variant with the same index (openraft's
/// `EntryPayload` is `Blank`, `Normal(D)`, `Membership(..)`).
fn payload_len(command: &Command) -> u64 {
    #[derive(serde::Serialize)]
    enum PayloadRef<'a> {
        #[allow(dead_code)]
        Blank,
        Normal(&'a Command),
    }
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(
        PayloadRef::Normal(command),
        &mut size,
        bincode::config::standard(),
    )
    .expect("a command always encodes (the log store encodes it the same way)");
    size.bytes_written as u64
}

impl Admission {
    /// A gate over a ring of `capacity` bytes whose records carry at most
    /// `max_payload_bytes`; a proposal waits at most `max_wait` for room.
    ///
    /// # Errors
    /// When the largest record, its wrap waste and [`RAFT_RESERVE_BYTES`]
    /// do not fit the ring together: such a record could never be admitted.
    pub fn new(
        ring: Arc<dyn RingSpace>,
        capacity: u64,
        max_payload_bytes: u64,
        max_wait: Duration,
    ) -> Result<Admission, String> {
        let largest = record_len(max_payload_bytes);
        let wrap_waste = largest - LINE_BYTES as u64;
        let limit_bytes = capacity
            .checked_sub(RAFT_RESERVE_BYTES + wrap_waste)
            .filter(|limit| *limit >= largest)
            .ok_or_else(|| {
                format!(
                    "a ring of {capacity} bytes is too small for records of {max_payload_bytes} \
                     bytes: twice the largest record ({largest} bytes, once for itself and once \
                     for the lap a wrap may skip) plus {RAFT_RESERVE_BYTES} bytes kept for \
                     openraft's own entries must fit; lower max_record_bytes or grow the ring"
                )
            })?;
        Ok(Admission {
            inner: Arc::new(Inner {
                ring,
                limit_bytes,
                max_payload_bytes,
                max_wait,
                queue: Mutex::new(Queue::default()),
                changed: Notify::new(),
                arrived: Notify::new(),
            }),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.inner.queue.lock().expect("admission lock")
    }

    /// The most ring bytes admitted proposals may hold with what is written.
    pub fn limit_bytes(&self) -> u64 {
        self.inner.limit_bytes
    }

    /// Bytes reserved by admitted proposals that openraft has not answered.
    pub fn reserved_bytes(&self) -> u64 {
        self.queue().reserved
    }

    /// Proposals waiting for room.
    pub fn waiting(&self) -> usize {
        self.queue().waiting.len()
    }

    /// Resolves when a proposal waits for room (at once if one does).
    pub async fn someone_waits(&self) {
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            // Registered before the check, so an arrival right after it is
            // not missed.
            arrived.as_mut().enable();
            if self.waiting() > 0 {
                return;
            }
            arrived.await;
        }
    }

    /// Ring space may have been freed (a purge, a snapshot installed, a
    /// truncation): waiters check again.
    pub fn space_freed(&self) {
        self.inner.changed.notify_waiters();
    }

    /// [`Admission::space_freed`] as a callback that does not keep the
    /// admission (and the ring it watches) alive: what the flusher holds,
    /// which the store it flushes must be able to outlive.
    pub fn space_freed_callback(&self) -> impl Fn() + Send + Sync + 'static {
        let inner = Arc::downgrade(&self.inner);
        move || {
            if let Some(inner) = inner.upgrade() {
                inner.changed.notify_waiters();
            }
        }
    }

    /// Waits until the ring has room for `commands` (all of them, as one
    /// proposal), in arrival order, at most the configured wait.
    ///
    /// # Errors
    /// [`AdmissionError::Busy`] when no room came within the wait;
    /// [`AdmissionError::RecordTooLarge`] / [`AdmissionError::BatchTooLarge`]
    /// at once when the commands can never be admitted.
    pub async fn admit(&self, commands: &[Command]) -> Result<Admitted, AdmissionError> {
        let mut need = 0u64;
        for command in commands {
            need += ring_bytes(command, self.inner.max_payload_bytes)?;
        }
        // A trim is let through: it is what frees a full disk.
        if commands.iter().any(|c| c.control.is_none())
            && let Some(why) = self.inner.ring.refusal()
        {
            return Err(AdmissionError::DiskFull { why });
        }
        self.admit_bytes(need).await
    }

    /// [`Admission::admit`] for a proposal of `need` ring bytes.
    ///
    /// # Errors
    /// As [`Admission::admit`].
    pub async fn admit_bytes(&self, need: u64) -> Result<Admitted, AdmissionError> {
        let limit = self.inner.limit_bytes;
        if need > limit {
            return Err(AdmissionError::BatchTooLarge { need, limit });
        }
        let started = tokio::time::Instant::now();
        let deadline = started + self.inner.max_wait;
        let mut ticket = {
            let mut queue = self.queue();
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            queue.waiting.push_back(ticket);
            self.inner.arrived.notify_waiters();
            Ticket {
                admission: self,
                ticket,
                waiting: true,
            }
        };
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change right after it is
            // not missed.
            changed.as_mut().enable();
            // The ring's lock is taken before (never inside) the queue's.
            let used = self.inner.ring.used_bytes();
            let reserved = {
                let mut queue = self.queue();
                if queue.waiting.front() == Some(&ticket.ticket)
                    && used + queue.reserved + need <= limit
                {
                    queue.waiting.pop_front();
                    queue.reserved += need;
                    ticket.waiting = false;
                    drop(queue);
                    // The next in line may fit too.
                    self.inner.changed.notify_waiters();
                    return Ok(Admitted {
                        admission: self.clone(),
                        need,
                    });
                }
                queue.reserved
            };
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                tracing::debug!(need, used, reserved, limit, "ring full: proposal refused");
                return Err(AdmissionError::Busy {
                    need,
                    used,
                    reserved,
                    limit,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
        }
    }
}

/// A place in the queue; leaves it when dropped (a waiter that gave up or
/// was cancelled).
struct Ticket<'a> {
    admission: &'a Admission,
    ticket: u64,
    waiting: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let mut queue = self.admission.queue();
            queue.waiting.retain(|t| *t != self.ticket);
            drop(queue);
            self.admission.inner.changed.notify_waiters();
        }
    }
}

/// Room reserved for one admitted proposal; given back when dropped.
#[must_use = "the room is given back when this is dropped"]
pub struct Admitted {
    admission: Admission,
    need: u64,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("need", &self.need)
            .finish()
    }
}

impl Admitted {
    /// The ring bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.need
    }

    /// Runs `write` (the proposal into openraft) with the room held until
    /// it ends. It is polled in the caller's task (proposals reach
    /// openraft's queue in the order their callers ran, as with a bare
    /// `client_write`). A caller that stops waiting once the write started
    /// (a dropped future: a client's deadline, a cancelled request) does
    /// not give the room back while openraft may still write the entries:
    /// the rest of the write runs in a task of its own, which gives the
    /// room back when openraft answers. A write never polled is never
    /// started.
    pub fn during<F>(self, write: F) -> During<F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        During {
            write: Some(Box::pin(write)),
            admitted: Some(self),
            started: false,
        }
    }
}

/// A write holding its admitted room: see [`Admitted::during`].
#[must_use = "a future does nothing unless polled"]
pub struct During<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    write: Option<Pin<Box<F>>>,
    admitted: Option<Admitted>,
    started: bool,
}

impl<F> Future for During<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let write = this
            .write
            .as_mut()
            .expect("During polled after it completed");
        this.started = true;
        let output = std::task::ready!(write.as_mut().poll(cx));
        this.write = None;
        this.admitted = None;
        Poll::Ready(output)
    }
}

impl<F> Drop for During<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let (Some(write), Some(admitted)) = (self.write.take(), self.admitted.take()) else {
            return;
        };
        if !self.started {
            // Nothing reached openraft: the room goes back at once.
            return;
        }
        // The caller gave up while openraft may still write the entries:
        // keep the room until it answers. (Without a runtime nothing runs
        // openraft any more.)
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = write.await;
                drop(admitted);
            });
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut queue = self.admission.queue();
        assert!(
            queue.reserved >= self.need,
            "admission: {} bytes given back, {} reserved",
            self.need,
            queue.reserved
        );
        queue.reserved -= self.need;
        drop(queue);
        self.admission.inner.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::types::Session;

    /// A ring whose usage the test sets.
    #[derive(Default)]
    struct FakeRing(AtomicU64);

    impl RingSpace for FakeRing {
        fn used_bytes(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    const CAPACITY: u64 = 1 << 20;
    const MAX_PAYLOAD: u64 = 64 << 10;
    const WAIT: Duration = Duration::from_secs(1);

    fn gate() -> (Arc<FakeRing>, Admission) {
        let ring = Arc::new(FakeRing::default());
        let admission = Admission::new(ring.clone(), CAPACITY, MAX_PAYLOAD, WAIT).unwrap();
        (ring, admission)
    }

    /// Lets every other task of the current-thread runtime run until it
    /// blocks.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn the_limit_leaves_the_reserve_and_one_wrap() {
        let (_, admission) = gate();
        let largest = record_len(MAX_PAYLOAD);
        assert_eq!(
            admission.limit_bytes(),
            CAPACITY - RAFT_RESERVE_BYTES - (largest - LINE_BYTES as u64)
        );
        // A ring too small for its largest record twice plus the reserve
        // is refused, with a reason.
        let err = Admission::new(
            Arc::new(FakeRing::default()),
            CAPACITY,
            CAPACITY / 2 - 64,
            WAIT,
        )
        .unwrap_err();
        assert!(err.contains("too small"), "{err}");
    }

    #[test]
    fn a_commands_size_is_what_the_log_store_writes() {
        for (session, len) in [
            (None, 0usize),
            (None, 1),
            (
                Some(Session {
                    client_id: 7,
                    seq: 1 << 40,
                }),
                200,
            ),
            (
                Some(Session {
                    client_id: u64::MAX,
                    seq: 3,
                }),
                70_000,
            ),
        ] {
            let command = Command {
                session,
                data: vec![0xab; len],
                control: None,
            };
            let stored = crate::log_store::encode_payload(&openraft::alias::PayloadOf::<
                crate::types::TypeConfig,
            >::Normal(command.clone()))
            .unwrap();
            assert_eq!(payload_len(&command), stored.len() as u64, "{command}");
        }
    }

    /// Issue 10, item 2: the gate makes a proposal wait while the ring is
    /// full, lets it in when room is given back or purged, and refuses it
    /// as busy once its wait is over; it never lets more in than the ring
    /// holds.
    #[tokio::test(start_paused = true)]
    async fn a_full_ring_makes_proposals_wait_then_admits_or_refuses_them_as_busy() {
        let (ring, admission) = gate();
        let limit = admission.limit_bytes();

        // Room for the first: admitted at once.
        let first = admission.admit_bytes(limit - 1000).await.unwrap();
        assert_eq!(admission.reserved_bytes(), limit - 1000);

        // The second does not fit: it waits.
        let second = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(2000).await }
        });
        settle().await;
        assert!(!second.is_finished(), "admitted into a full ring");
        assert_eq!(admission.waiting(), 1);

        // The first is answered: its room comes back, the second gets in.
        drop(first);
        let second = second.await.unwrap().unwrap();
        assert_eq!(admission.reserved_bytes(), 2000);
        assert_eq!(admission.waiting(), 0);
        drop(second);

        // Written, not purged: the ring itself is full.
        ring.0.store(limit - 100, Ordering::SeqCst);
        let third = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(500).await }
        });
        settle().await;
        assert!(!third.is_finished(), "admitted into a full ring");
        // A purge frees the room; the node says so.
        ring.0.store(limit / 2, Ordering::SeqCst);
        admission.space_freed();
        let third = third.await.unwrap().unwrap();
        assert_eq!(third.bytes(), 500);
        drop(third);

        // Nothing frees the room: after its wait the proposal is busy.
        ring.0.store(limit, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let err = admission.admit_bytes(64).await.unwrap_err();
        assert!(
            started.elapsed() >= WAIT,
            "refused before its wait was over"
        );
        assert!(
            matches!(err, AdmissionError::Busy { need: 64, used, .. } if used == limit),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("busy:"), "{err}");
        assert_eq!(admission.waiting(), 0, "a refused waiter left the queue");
        assert_eq!(admission.reserved_bytes(), 0);
    }

    /// Waiters get in in arrival order: a large proposal is not overtaken
    /// by small ones that would fit before it.
    #[tokio::test(start_paused = true)]
    async fn waiters_are_admitted_in_arrival_order() {
        let (_, admission) = gate();
        let limit = admission.limit_bytes();
        let held = admission.admit_bytes(limit - 100).await.unwrap();
        let large = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(limit / 2).await }
        });
        settle().await;
        let small = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(64).await }
        });
        settle().await;
        assert_eq!(admission.waiting(), 2);
        assert!(!small.is_finished(), "the small one overtook the large one");
        drop(held);
        let large = large.await.unwrap().unwrap();
        let small = small.await.unwrap().unwrap();
        assert_eq!(admission.reserved_bytes(), limit / 2 + 64);
        drop((large, small));
        assert_eq!(admission.reserved_bytes(), 0);
    }

    /// A waiter that is cancelled leaves the queue, so the ones behind it
    /// are not stuck.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let (_, admission) = gate();
        let limit = admission.limit_bytes();
        let held = admission.admit_bytes(limit - 100).await.unwrap();
        let first = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(limit).await }
        });
        settle().await;
        let second = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(50).await }
        });
        settle().await;
        assert!(!second.is_finished());
        first.abort();
        let _ = first.await;
        // The second fits beside what is held, now that it leads the queue.
        let second = second.await.unwrap().unwrap();
        assert_eq!(admission.reserved_bytes(), limit - 50);
        drop((held, second));
    }

    /// `someone_waits` (what the node's watcher of openraft's changes
    /// waits for before it watches) resolves only while a proposal waits:
    /// at once when one does, as soon as one joins the queue otherwise.
    #[tokio::test(start_paused = true)]
    async fn someone_waits_resolves_only_while_a_proposal_waits() {
        let (_, admission) = gate();
        let limit = admission.limit_bytes();
        let watcher = tokio::spawn({
            let admission = admission.clone();
            async move { admission.someone_waits().await }
        });
        // An admission that finds room at once does not wait.
        let held = admission.admit_bytes(limit - 100).await.unwrap();
        settle().await;
        assert!(!watcher.is_finished(), "nobody waits yet");
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.admit_bytes(200).await }
        });
        settle().await;
        assert!(watcher.is_finished(), "a proposal waits for room");
        watcher.await.unwrap();
        // While it waits, at once.
        tokio::time::timeout(Duration::ZERO, admission.someone_waits())
            .await
            .expect("at once while a proposal waits");
        drop(held);
        let admitted = waiter.await.unwrap().unwrap();
        drop(admitted);
        assert_eq!(admission.waiting(), 0);
    }

    /// The room stays reserved until openraft answers, even when the
    /// proposer stops waiting: its entry may still be written.
    #[tokio::test(start_paused = true)]
    async fn the_room_is_held_until_the_write_ends_even_when_the_caller_gives_up() {
        let (_, admission) = gate();
        let (answer, answered) = tokio::sync::oneshot::channel::<u64>();
        let admitted = admission.admit_bytes(4096).await.unwrap();
        let caller = tokio::spawn(admitted.during(async move { answered.await.unwrap() }));
        settle().await;
        caller.abort();
        let _ = caller.await;
        settle().await;
        assert_eq!(
            admission.reserved_bytes(),
            4096,
            "given back while the write was still running"
        );
        answer.send(7).unwrap();
        settle().await;
        assert_eq!(admission.reserved_bytes(), 0);

        // And the output reaches a caller that waits.
        let admitted = admission.admit_bytes(64).await.unwrap();
        assert_eq!(admitted.during(async { 42 }).await, 42);
        assert_eq!(admission.reserved_bytes(), 0);

        // A write dropped before it started never starts: nothing was
        // proposed, the room comes back at once.
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let admitted = admission.admit_bytes(64).await.unwrap();
        let during = admitted.during({
            let started = started.clone();
            async move { started.store(true, Ordering::SeqCst) }
        });
        drop(during);
        settle().await;
        assert!(
            !started.load(Ordering::SeqCst),
            "a dropped write was started"
        );
        assert_eq!(admission.reserved_bytes(), 0);
    }

    /// The proposal reaches openraft in the caller's turn (the order of
    /// callers is the order of proposals), before any other task runs.
    #[tokio::test(start_paused = true)]
    async fn the_write_starts_in_the_callers_turn() {
        let (_, admission) = gate();
        let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let admitted = admission.admit_bytes(64).await.unwrap();
        let write = {
            let polled = polled.clone();
            async move {
                polled.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await
            }
        };
        let mut during = Box::pin(admitted.during(write));
        assert!(futures::poll!(during.as_mut()).is_pending());
        assert!(
            polled.load(Ordering::SeqCst),
            "the write was left to another task's turn"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_can_never_fit_is_refused_at_once() {
        let (_, admission) = gate();
        let big = Command {
            session: None,
            data: vec![0; MAX_PAYLOAD as usize],
            control: None,
        };
        assert!(matches!(
            admission.admit(std::slice::from_ref(&big)).await,
            Err(AdmissionError::RecordTooLarge {
                max: MAX_PAYLOAD,
                ..
            })
        ));
        let limit = admission.limit_bytes();
        assert_eq!(
            admission.admit_bytes(limit + 1).await.unwrap_err(),
            AdmissionError::BatchTooLarge {
                need: limit + 1,
                limit
            }
        );
        let fits = Command {
            session: None,
            data: vec![0; 1000],
            control: None,
        };
        let one = record_len(payload_len(&fits));
        let admitted = admission.admit(&[fits.clone(), fits]).await.unwrap();
        assert_eq!(admitted.bytes(), 2 * one);
    }
}
