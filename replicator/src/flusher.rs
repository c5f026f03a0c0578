//! Group commit beside the Raft core: the flusher.
//!
//! openraft's core task appends entries into the ring (or adopts records a
//! leader wrote there) and returns at once. One flusher per node copies
//! every record appended since its last round into the segment log (the
//! node's durable log, `ringraft_wal::segment`) with one write, makes it
//! durable with one flush in `fsync` durability, and only then completes
//! the appends' callbacks (`IOFlushed`), in the order they came. In
//! `memory` durability a callback completes as soon as the entries are in
//! the ring (shared memory survives a killed process); the flusher still
//! writes them to the segments, unflushed, for the page cache to write back.
//!
//! Once records are in the segments, the ring may forget them: the flusher
//! gives their bytes back (advances `head`) once they take more than a
//! quarter of the ring ([`KEEP_IN_RING_DIVISOR`]), so the ring keeps the
//! recent entries a leader replicates and never waits on a snapshot for
//! room.
//!
//! Every change to the log (an append, an adoption, a truncation, a purge)
//! is numbered under the wal lock. A round copies the ring's records and
//! takes the queued segment operations (truncate, remove) at one number,
//! applies the operations, writes the copy, flushes, and then declares that
//! number done: every callback registered at or below it completes. So the
//! segments go through the same states as the ring, in the same order, and
//! openraft sees its writes complete in the order it made them.
//!
//! Where it runs is the store's `IoMode`: on a thread of its own
//! ([`Flusher::run`], production: the I/O never occupies an async worker),
//! or as a task of the runtime ([`Flusher::run_async`], a deterministic
//! simulation: no thread outside the runtime; its rounds' writes and
//! flushes block the runtime while they last), or stepped by a test
//! ([`Flusher::step`]).
//!
//! Never: hold the wal lock (or the queue's) across I/O or an `.await`;
//! complete an `fsync` callback before the flush that covers it returned;
//! reorder callbacks; wait for work by blocking a thread the runtime
//! needs (the task waits on a [`tokio::sync::Notify`], the thread on a
//! condvar).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use openraft::storage::IOFlushed;
use ringraft_wal::WalError;

use crate::log_store::Durability;
use crate::types::TypeConfig;

/// Largest copy one round takes from the ring, in bytes (a round that
/// finds more goes on at once with the rest).
pub const MAX_FLUSH_BYTES: usize = 8 << 20;

/// The ring keeps at most `capacity / KEEP_IN_RING_DIVISOR` bytes of
/// entries the segments hold: the rest is room for writers. A leader sends
/// a follower at most half its ring in one batch (`crate::network`), so a
/// quarter kept, half in flight and the reserve for openraft's own entries
/// (`crate::admission::RAFT_RESERVE_BYTES`) fit a ring of 1 MiB or more.
pub const KEEP_IN_RING_DIVISOR: u64 = 4;
/// How long the flusher waits before it tries a round again on a full disk.
pub const DISK_FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the flusher writes to: the node's segment log. A trait so that a
/// test or a simulated disk can stand in for the files.
pub trait SegmentSink: Send + 'static {
    /// Appends whole ring records (in the ring's format, no wrap markers),
    /// continuing the log's tail. Not durable until [`SegmentSink::sync`].
    fn append(&mut self, records: &[u8]) -> Result<(), WalError>;
    /// Makes everything appended durable.
    fn sync(&mut self) -> Result<(), WalError>;
    /// Removes every entry after `last_kept` (all when `None`), durably.
    fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<(), WalError>;
    /// Removes whole segments whose entries all lie below `first_kept`;
    /// when the log holds nothing at or after it, the log restarts empty
    /// so that the next record may be any index after `first_kept - 1`.
    fn remove_before(&mut self, first_kept: u64) -> Result<(), WalError>;
}

impl<D: ringraft_wal::disk::Disk> SegmentSink for ringraft_wal::SegmentLog<D> {
    fn append(&mut self, records: &[u8]) -> Result<(), WalError> {
        ringraft_wal::SegmentLog::append(self, &[records])
    }

    fn sync(&mut self) -> Result<(), WalError> {
        ringraft_wal::SegmentLog::sync(self).map(|_| ())
    }

    fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<(), WalError> {
        ringraft_wal::SegmentLog::truncate_after(self, last_kept)
    }

    fn remove_before(&mut self, first_kept: u64) -> Result<(), WalError> {
        if first_kept > self.next_index() {
            // Purged beyond the log (a snapshot installed): nothing here is
            // kept, and the log restarts at whatever index comes next.
            ringraft_wal::SegmentLog::truncate_after(self, None)
        } else {
            ringraft_wal::SegmentLog::remove_before(self, first_kept).map(|_| ())
        }
    }
}

/// An operation on the segments, queued behind the appends before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentOp {
    /// Raft truncation: the entries after this one go.
    TruncateAfter(Option<u64>),
    /// A purge (openraft's, after a snapshot) or retention: whole
    /// segments below this index go.
    RemoveBefore(u64),
}

/// Someone waiting for the segments to reflect a change.
pub(crate) enum Waiter {
    /// openraft's append callback.
    Io(IOFlushed<TypeConfig>),
    /// A store operation awaiting its own change (truncate, purge).
    Done(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    pub(crate) fn complete(self, result: Result<(), String>) {
        let result = result.map_err(io::Error::other);
        match self {
            Waiter::Io(callback) => callback.io_completed(result),
            Waiter::Done(tx) => {
                // The awaiting operation may have been dropped: nothing to tell.
                let _ = tx.send(result);
            }
        }
    }
}

/// The flusher's queue, shared with the log store (lock order: the wal
/// lock, then this one).
#[derive(Default)]
pub(crate) struct FlushQueue {
    /// Changes made to the log so far.
    submitted: u64,
    /// Changes the segments reflect (written; flushed in `fsync`).
    done: u64,
    /// The next index to copy from the ring.
    cursor: u64,
    /// Segment operations not taken by a round yet, in order.
    ops: VecDeque<SegmentOp>,
    /// Waiters by the change number they wait for, in order.
    waiters: VecDeque<(u64, Waiter)>,
    /// The first I/O failure: every later waiter fails with it.
    failed: Option<String>,
    /// The disk is full: the last round wrote nothing and is retried
    /// (waiters keep waiting; proposals are refused meanwhile).
    disk_full: Option<String>,
    /// The store is gone: the flusher ends.
    stopped: bool,
    /// The next round flushes whatever the durability (a clean stop).
    sync_requested: bool,
}

/// The queue and the flusher's wake-up, shared by the store and the
/// flusher (which must not keep the store alive).
#[derive(Default)]
pub(crate) struct FlushShared {
    queue: Mutex<FlushQueue>,
    /// Wakes a flusher on a thread ([`Flusher::run`]).
    wake: Condvar,
    /// Wakes a flusher task ([`Flusher::run_async`]); a wake while it
    /// works is kept as a permit.
    wake_task: tokio::sync::Notify,
}

impl FlushShared {
    pub(crate) fn new(cursor: u64) -> FlushShared {
        FlushShared {
            queue: Mutex::new(FlushQueue {
                cursor,
                ..FlushQueue::default()
            }),
            wake: Condvar::new(),
            wake_task: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, FlushQueue> {
        self.queue.lock().expect("flush queue lock")
    }

    /// Wakes the flusher: there is work.
    pub(crate) fn wake(&self) {
        self.wake.notify_all();
        self.wake_task.notify_one();
    }

    /// Ends the flusher (the store is dropped).
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_all();
        self.wake_task.notify_one();
    }
}

impl FlushQueue {
    /// Numbers a change to the ring (call with the wal lock held, right
    /// after the change). Returns its number.
    pub(crate) fn changed(&mut self) -> u64 {
        self.submitted += 1;
        self.submitted
    }

    /// Numbers a segment operation, queued behind the changes before it,
    /// and moves the copy cursor back when a truncation cut below it.
    pub(crate) fn queue_op(&mut self, op: SegmentOp) -> u64 {
        match op {
            SegmentOp::TruncateAfter(last_kept) => {
                let keep_next = last_kept.map_or(0, |i| i.saturating_add(1));
                self.cursor = self.cursor.min(keep_next);
            }
            SegmentOp::RemoveBefore(first_kept) => {
                // Entries below it need not reach the segments any more.
                self.cursor = self.cursor.max(first_kept);
            }
        }
        self.ops.push_back(op);
        self.changed()
    }

    /// Registers `waiter` for change `number`; completes it at once when
    /// the segments reflect it already (or a failure stopped them).
    /// Returns the waiter back when it must be completed by the caller,
    /// outside the lock.
    pub(crate) fn wait(
        &mut self,
        number: u64,
        waiter: Waiter,
    ) -> Option<(Waiter, Result<(), String>)> {
        if let Some(failed) = &self.failed {
            return Some((waiter, Err(failed.clone())));
        }
        if number <= self.done {
            return Some((waiter, Ok(())));
        }
        self.waiters.push_back((number, waiter));
        None
    }

    /// The next round flushes, in either durability, and counts as a
    /// change so that a waiter at its number waits for that flush.
    pub(crate) fn request_sync(&mut self) {
        self.sync_requested = true;
        self.changed();
    }

    /// The number of the last change made.
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted
    }

    /// What the segment log said when it found the disk full, until a
    /// round succeeds again.
    pub(crate) fn disk_full(&self) -> Option<&str> {
        self.disk_full.as_deref()
    }
}

/// What one round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    /// Entries written to the segments.
    pub entries: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Segment operations applied.
    pub ops: usize,
    /// The round flushed (`fsync` durability).
    pub synced: bool,
}

impl Round {
    /// A round with nothing to do.
    const IDLE: Round = Round {
        entries: 0,
        bytes: 0,
        ops: 0,
        synced: false,
    };
}

/// The node's flusher: run it on a thread of its own ([`Flusher::run`]),
/// as a task ([`Flusher::run_async`]), or step it ([`Flusher::step`]) from
/// a test.
pub struct Flusher<S: SegmentSink> {
    store: Weak<crate::log_store::Inner>,
    shared: Arc<FlushShared>,
    durability: Durability,
    sink: S,
    buf: Vec<u8>,
    on_room: Option<Box<dyn Fn() + Send>>,
    /// See [`Flusher::simulate_flush_latency`].
    flush_latency: std::time::Duration,
}

impl<S: SegmentSink> Flusher<S> {
    pub(crate) fn new(
        store: Weak<crate::log_store::Inner>,
        shared: Arc<FlushShared>,
        durability: Durability,
        sink: S,
    ) -> Flusher<S> {
        Flusher {
            store,
            shared,
            durability,
            sink,
            buf: Vec::new(),
            on_room: None,
            flush_latency: std::time::Duration::ZERO,
        }
    }

    /// A simulated disk's latency, for [`Flusher::run_async`] only: each
    /// round that flushes waits `latency` of the runtime's time between
    /// its write and its flush, as a real disk's flush takes time. A
    /// deterministic simulation (paused time) needs it to cut the power
    /// while a flush is in flight; without it a flush takes no time at all
    /// there. Zero (the default): no wait.
    pub fn simulate_flush_latency(&mut self, latency: std::time::Duration) {
        self.flush_latency = latency;
    }

    /// Called after a round gave ring bytes back (admission waits on it).
    pub fn on_room(&mut self, notify: impl Fn() + Send + 'static) {
        self.on_room = Some(Box::new(notify));
    }

    /// True when a round would do something.
    pub fn has_work(&self) -> bool {
        let q = self.shared.lock();
        q.failed.is_none() && (q.done < q.submitted || !q.ops.is_empty())
    }

    /// Runs rounds until the store is dropped. Blocks: call it on a thread
    /// of its own. While the disk is full, a round is retried every
    /// [`DISK_FULL_RETRY`].
    pub fn run(mut self) {
        loop {
            {
                let mut q = self.shared.lock();
                while !q.stopped
                    && (q.failed.is_some() || (q.done == q.submitted && q.ops.is_empty()))
                {
                    q = self.shared.wake.wait(q).expect("flush queue lock");
                }
                if q.disk_full.is_some() {
                    let retry_at = std::time::Instant::now() + DISK_FULL_RETRY;
                    while !q.stopped {
                        let now = std::time::Instant::now();
                        if now >= retry_at {
                            break;
                        }
                        q = self
                            .shared
                            .wake
                            .wait_timeout(q, retry_at - now)
                            .expect("flush queue lock")
                            .0;
                    }
                }
                if q.stopped {
                    return;
                }
            }
            if self.step().is_none() {
                return;
            }
        }
    }

    /// Runs rounds until the store is dropped, as a task of the runtime:
    /// waits for work on the store's notification, never by blocking the
    /// thread, and yields between rounds. While the disk is full, a round
    /// is retried every [`DISK_FULL_RETRY`] of the runtime's time.
    pub async fn run_async(mut self) {
        loop {
            let (idle, disk_full) = {
                let q = self.shared.lock();
                if q.stopped {
                    return;
                }
                let idle = q.failed.is_some() || (q.done == q.submitted && q.ops.is_empty());
                (idle, q.disk_full.is_some())
            };
            if idle {
                // A wake since the check left a permit: no work is missed.
                self.shared.wake_task.notified().await;
                continue;
            }
            if disk_full {
                let retry_at = tokio::time::Instant::now() + DISK_FULL_RETRY;
                while !self.shared.lock().stopped && tokio::time::Instant::now() < retry_at {
                    let _ =
                        tokio::time::timeout_at(retry_at, self.shared.wake_task.notified()).await;
                }
                if self.shared.lock().stopped {
                    return;
                }
            }
            if self.step_async().await.is_none() {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// One round: takes the queued operations and copies the ring's new
    /// records at one change number, applies and writes them, flushes in
    /// `fsync` durability, gives ring room back, and completes the waiters
    /// of that number. `None` when the store is gone.
    pub fn step(&mut self) -> Option<Round> {
        let store = self.store.upgrade()?;
        let Some(taken) = self.take(&store) else {
            return Some(Round::IDLE);
        };
        let mut written = self.write(&taken);
        if matches!(written.result, Ok(true)) {
            self.flush(&mut written);
        }
        Some(self.finish(&store, &taken, &written))
    }

    /// [`Flusher::step`] on the runtime, where a flush first waits the
    /// [`Flusher::simulate_flush_latency`] (the store is not held while
    /// it waits).
    async fn step_async(&mut self) -> Option<Round> {
        if self.flush_latency.is_zero() {
            return self.step();
        }
        let taken = {
            let store = self.store.upgrade()?;
            self.take(&store)
        };
        let Some(taken) = taken else {
            return Some(Round::IDLE);
        };
        let mut written = self.write(&taken);
        if matches!(written.result, Ok(true)) {
            tokio::time::sleep(self.flush_latency).await;
            self.flush(&mut written);
        }
        let store = self.store.upgrade()?;
        Some(self.finish(&store, &taken, &written))
    }

    /// The end of a round: settles it, completes its waiters, tells of the
    /// room it freed.
    fn finish(
        &mut self,
        store: &crate::log_store::Inner,
        taken: &Taken,
        written: &Written,
    ) -> Round {
        let entries = taken.copied_to.map_or(0, |(first, last)| last + 1 - first);
        let bytes = self.buf.len() as u64;
        let synced = *written.result.as_ref().unwrap_or(&false);
        let (ready, room) = self.settle(store, taken, written);
        for (waiter, result) in ready {
            waiter.complete(result);
        }
        if room && let Some(notify) = &self.on_room {
            notify();
        }
        Round {
            entries,
            bytes,
            ops: taken.ops.len(),
            synced,
        }
    }

    /// Under the locks: takes the queued operations and copies the ring's
    /// new records into the buffer. `None` once the segment log failed.
    fn take(&mut self, store: &crate::log_store::Inner) -> Option<Taken> {
        let wal = store.wal.lock().expect("wal lock");
        let mut q = self.shared.lock();
        if q.failed.is_some() {
            return None;
        }
        let ops: Vec<SegmentOp> = q.ops.drain(..).collect();
        self.buf.clear();
        let ring = wal.ring();
        let last = ring.copy_records(q.cursor, MAX_FLUSH_BYTES, &mut self.buf);
        let first = q.cursor;
        if let Some(last) = last {
            q.cursor = last + 1;
        }
        // The round covers every change so far only if it copied up to
        // the ring's end; else the next round goes on from the cursor.
        let complete = q.cursor >= ring.next_index();
        let number = if complete { q.submitted } else { q.done };
        let sync_requested = complete && std::mem::take(&mut q.sync_requested);
        Some(Taken {
            ops,
            number,
            copied_to: last.map(|l| (first, l)),
            sync_requested,
        })
    }

    /// Outside the locks: applies the operations and appends the buffer.
    /// `Ok(true)` when the round must flush next ([`Flusher::flush`]): when
    /// asked, or in `fsync` durability.
    fn write(&mut self, taken: &Taken) -> Written {
        let mut ops_done = 0;
        let mut appended = false;
        let result = (|| {
            for op in &taken.ops {
                match *op {
                    SegmentOp::TruncateAfter(last_kept) => self.sink.truncate_after(last_kept)?,
                    SegmentOp::RemoveBefore(first_kept) => self.sink.remove_before(first_kept)?,
                }
                ops_done += 1;
            }
            if !self.buf.is_empty() {
                self.sink.append(&self.buf)?;
            }
            appended = true;
            let sync = taken.sync_requested
                || (self.durability == Durability::Fsync
                    && (!self.buf.is_empty() || !taken.ops.is_empty()));
            Ok::<bool, WalError>(sync)
        })();
        Written {
            result,
            ops_done,
            appended,
        }
    }

    /// Outside the locks: flushes what [`Flusher::write`] wrote; a failure
    /// becomes the round's result.
    fn flush(&mut self, written: &mut Written) {
        if let Err(e) = self.sink.sync() {
            written.result = Err(e);
        }
    }

    /// Under the locks again: records the outcome, gives ring room back,
    /// and returns the waiters to complete (outside the locks) and whether
    /// room was freed.
    fn settle(
        &self,
        store: &crate::log_store::Inner,
        taken: &Taken,
        written: &Written,
    ) -> (Ready, bool) {
        let mut ready = Vec::new();
        let mut room = false;
        let mut wal = store.wal.lock().expect("wal lock");
        let mut q = self.shared.lock();
        match &written.result {
            Ok(_) => {
                if let Some((_, last)) = taken.copied_to {
                    // Only what the segments hold in its current form: a
                    // truncation since the copy moved the cursor back.
                    let durable = last.min(q.cursor.saturating_sub(1));
                    let ring = wal.ring_mut();
                    if self.durability == Durability::Fsync
                        && durable < ring.next_index()
                        && durable >= ring.first_index()
                    {
                        ring.mark_acked(durable);
                    }
                    let keep = ring.geometry().capacity / KEEP_IN_RING_DIVISOR;
                    if ring.used_bytes() > keep {
                        room = ring.release_to_fit(keep, durable);
                    }
                }
                q.done = q.done.max(taken.number);
                while q.waiters.front().is_some_and(|(n, _)| *n <= q.done) {
                    let (_, waiter) = q.waiters.pop_front().expect("front exists");
                    ready.push((waiter, Ok(())));
                }
                if let Some(was) = q.disk_full.take() {
                    tracing::info!(was = %was, "the segment log has room again: appends are taken");
                }
            }
            // Nothing of the batch stays written (the segment log
            // undoes it): the round is retried as it was, and its
            // waiters keep waiting.
            Err(e @ WalError::DiskFull { .. }) if !written.appended => {
                if q.disk_full.is_none() {
                    tracing::warn!(error = %e, "disk full: appends are refused until space is freed");
                }
                q.disk_full = Some(e.to_string());
                for op in taken.ops[written.ops_done..].iter().rev() {
                    q.ops.push_front(*op);
                }
                if let Some((first, _)) = taken.copied_to {
                    q.cursor = q.cursor.min(first);
                }
                q.sync_requested |= taken.sync_requested;
            }
            Err(e) => {
                let failed = format!("the segment log failed: {e}");
                tracing::error!(error = %e, "segment log I/O failed: appends stop being acknowledged");
                q.failed = Some(failed.clone());
                for (_, waiter) in q.waiters.drain(..) {
                    ready.push((waiter, Err(failed.clone())));
                }
            }
        }
        (ready, room)
    }
}

/// Waiters to complete after a round, with their outcome.
type Ready = Vec<(Waiter, Result<(), String>)>;

/// What a round took from the queue and the ring ([`Flusher::step`]).
struct Taken {
    ops: Vec<SegmentOp>,
    /// The change number the round completes.
    number: u64,
    /// The first and last index copied into the buffer.
    copied_to: Option<(u64, u64)>,
    sync_requested: bool,
}

/// What a round's write did: `Ok(synced)` or the error, how many operations
/// were applied and whether the append was reached.
struct Written {
    result: Result<bool, WalError>,
    ops_done: usize,
    appended: bool,
}
