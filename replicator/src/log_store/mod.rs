//! openraft's log storage over the `wal` ring.
//!
//! Entries are ring records: the record header carries the term and index
//! (a log id under standard leader ids), the payload is the bincode of the
//! openraft entry payload. Two ways in:
//! - local append: a leader's own entries, or entries a follower received
//!   two-sided; written into the ring under the writer's epoch;
//! - adoption: entries a leader already WROTE into this node's ring. The
//!   network layer checks them in place ([`LogStore::prepare_adoption`])
//!   and hands their payloads to openraft; when openraft appends exactly
//!   those entries, the store takes the records into the log where they lie,
//!   without copying them.
//!
//! The log is the ring (recent entries, in shared memory) plus the segment
//! log (every entry, on disk): the node's flusher (`crate::flusher`) writes
//! the ring's records to the segments and gives ring bytes back. Reads below
//! the ring's first entry come from the segments. The entries appended last
//! (about 8 MiB) are also kept as openraft gave them (`recent`): openraft's
//! reads of them (a leader's replication, the apply) take those instead of
//! reading, checking and decoding the records again.
//!
//! Durability: `append` puts the entries in the ring and returns. In
//! `fsync` mode openraft hears that they are flushed (and counts them, for
//! the leader's own log as for a follower's answer) only once the flusher's
//! `fdatasync` covers them; in `memory` mode at once (the ring survives a
//! killed process). No lock is held across I/O: the metadata file is written
//! outside the wal lock, the segments by the flusher.
//!
//! Where the blocking work runs is the store's [`IoMode`]: in production
//! ([`IoMode::Threads`]) the flusher has a thread of its own and the
//! metadata file is written on tokio's blocking pool; in a deterministic
//! simulation ([`IoMode::Inline`]) the flusher is a task of the runtime and
//! the metadata file is written inline, so that nothing runs outside the
//! runtime's one thread.
//!
//! The vote lives in the metadata file. Whenever the term advances, the
//! store first calls the [`RingGuard`] to revoke every remote write access
//! to the ring (DESIGN.md, fencing), then saves the vote.
//!
//! This module owns the store (ring, metadata, adoptions, the flusher's
//! queue); `codec` owns the entries' encoding and `storage` openraft's
//! storage traits on top. It must never acknowledge an entry before its
//! durability mode allows, nor save a higher term's vote before revoking.

use std::fmt::Debug;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use ringraft_wal::{AdoptRequest, EntryRef, Epoch, PreparedAdoption, VoteRecord, Wal, WalError};

use crate::flusher::{FlushShared, Flusher, SegmentOp, SegmentSink, Waiter};
use crate::types::{Entry, LogId, TypeConfig, Vote, log_id, term_of};

mod codec;
mod recent;
mod storage;

pub(crate) use codec::Encoded;
pub use codec::Payloads;
pub use codec::decode_entry;
pub(crate) use codec::encode_payload;
use codec::{io_err, pos, to_log_id};

/// When an entry counts as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Durability {
    /// In the shared mapping: survives a killed process, not a machine
    /// crash (Mu-style).
    #[default]
    Memory,
    /// msync'ed before it is acknowledged (group commit per append).
    Fsync,
}

/// Where a store's blocking work runs: its flusher (`crate::flusher`) and
/// the writes of its metadata file (the vote, the purge point).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// The flusher on a thread of its own, the metadata writes on tokio's
    /// blocking pool (`spawn_blocking`): no async worker waits for the
    /// disk. What a real node uses.
    #[default]
    Threads,
    /// Everything on the runtime's tasks: the flusher is a tokio task the
    /// store wakes (it never blocks a thread while it waits; its writes and
    /// flushes block the runtime while they last), and the metadata writes
    /// run inline in the storage call. What a deterministic simulation
    /// needs (one thread, paused time): work done by another thread would
    /// finish at a moment of real time, not of the simulation's, and the
    /// runtime would let virtual time jump while it ran.
    Inline,
}

/// What the store needs from the fabric side of the node.
pub trait RingGuard: Send + Sync + 'static {
    /// The term advanced: revoke every remote write access to the ring now
    /// (rotate the data region's rkey). An error fails the vote.
    fn revoke(&self) -> io::Result<()>;
    /// Raise this node's own fence to `epoch` (upward only): through a
    /// loopback connection unless the device has global atomics.
    fn fence_self(&self, epoch: Epoch) -> BoxFuture<'static, io::Result<()>>;
}

/// A guard for a node without a fabric (tests, the openraft suite): no
/// remote access to revoke, and the fence is set with a CPU CAS.
#[derive(Default)]
pub struct LocalGuard {
    store: Mutex<WeakLogStore>,
}

impl LocalGuard {
    /// Binds the guard to its store (weakly: the store holds the guard).
    pub fn bind(&self, store: &LogStore) {
        *self.store.lock().expect("guard lock") = store.downgrade();
    }
}

impl RingGuard for LocalGuard {
    fn revoke(&self) -> io::Result<()> {
        Ok(())
    }

    fn fence_self(&self, epoch: Epoch) -> BoxFuture<'static, io::Result<()>> {
        let store = self.store.lock().expect("guard lock").upgrade();
        Box::pin(async move {
            if let Some(store) = store {
                store.cas_fence_locally(epoch)?;
            }
            Ok(())
        })
    }
}

pub(crate) struct Inner {
    pub(crate) wal: Mutex<Wal>,
    node_id: u64,
    durability: Durability,
    guard: Arc<dyn RingGuard>,
    /// Adoptions prepared per connection, and the leader requests a grant
    /// must not overlap.
    adoptions: Mutex<Adoptions>,
    /// Bumped whenever `adoptions` frees a waiter (a request ended, a grant
    /// finished).
    adoptions_changed: crate::watch::Sender<u64>,
    /// While the log is corrupt inside (DESIGN.md, recovery): no vote may be
    /// granted until the log reaches this index.
    votes_blocked_until: Mutex<Option<u64>>,
    /// The flusher's queue (`crate::flusher`).
    flush: Arc<FlushShared>,
    /// Where the blocking work runs.
    io: IoMode,
    /// Held while the metadata file is written (outside the wal lock).
    meta_io: Mutex<()>,
    /// The entries appended last, for openraft's reads (`recent`). Locked
    /// after the wal, and changed under the wal lock where the log's ends
    /// move back.
    recent: Mutex<recent::Recent>,
    /// Entries decoded out of the ring or the segments by reads.
    decoded: std::sync::atomic::AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.flush.stop();
    }
}

/// The acceptor's side of adoption, shared by all its connections.
///
/// Each connection has at most one adoption prepared (its requests are
/// served in order); a connection never erases the bytes another one
/// prepared. Leader requests that may extend the log (from their fence
/// check until openraft is done with them) are counted, and a grant waits
/// until none is in flight: the tail a grant reports then stays exact until
/// the grantee writes (DESIGN.md, data plane), because every later request
/// of an older fence holder fails its fence check.
#[derive(Default)]
struct Adoptions {
    /// Per connection: records checked in place, waiting for openraft
    /// (ordered: which of two equal ones is taken must not depend on a
    /// hasher's random keys).
    pending: std::collections::BTreeMap<u64, Pending>,
    /// Leader requests in flight.
    in_flight: usize,
    /// Grants waiting for the requests in flight: new requests wait behind
    /// them.
    granting: usize,
    /// The connection the last grant went to: the only one whose batches
    /// may extend the log (the tail it was told is the last word).
    granted: Option<u64>,
}

/// A prepared adoption of one connection.
struct Pending {
    prepared: PreparedAdoption,
    /// Bytes of its range were erased after it was prepared (never, while
    /// connections respect each other's ranges): its records are not
    /// adopted, the entries are written again.
    clobbered: bool,
}

/// A leader request in flight (see [`LogStore::begin_leader_request`]).
pub struct LeaderRequest {
    store: LogStore,
}

impl Drop for LeaderRequest {
    fn drop(&mut self) {
        let mut adoptions = self.store.adoptions();
        adoptions.in_flight -= 1;
        drop(adoptions);
        self.store.inner.adoptions_changed.send_modify(|v| *v += 1);
    }
}

/// A grant waiting for the requests in flight (cancel-safe count).
struct Granting<'a> {
    store: &'a LogStore,
}

impl Drop for Granting<'_> {
    fn drop(&mut self) {
        self.store.adoptions().granting -= 1;
        self.store.inner.adoptions_changed.send_modify(|v| *v += 1);
    }
}

/// The log store; clones share it (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

/// A reference to a [`LogStore`] that does not keep it alive: what the
/// store's own guard holds (the store holds the guard), so that a stopped
/// node's store, its ring mapping and its files are freed.
#[derive(Clone, Debug, Default)]
pub struct WeakLogStore(std::sync::Weak<Inner>);

impl WeakLogStore {
    /// The store, while something else keeps it alive.
    pub fn upgrade(&self) -> Option<LogStore> {
        self.0.upgrade().map(|inner| LogStore { inner })
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("node_id", &self.inner.node_id)
            .finish_non_exhaustive()
    }
}

impl LogStore {
    /// A reference that does not keep the store alive.
    pub fn downgrade(&self) -> WeakLogStore {
        WeakLogStore(Arc::downgrade(&self.inner))
    }

    /// A store over an open data directory, doing its blocking work on
    /// threads ([`IoMode::Threads`]).
    pub fn new(
        wal: Wal,
        node_id: u64,
        durability: Durability,
        guard: Arc<dyn RingGuard>,
    ) -> LogStore {
        LogStore::with_io(wal, node_id, durability, IoMode::Threads, guard)
    }

    /// A store over an open data directory, doing its blocking work as `io`
    /// says.
    pub fn with_io(
        wal: Wal,
        node_id: u64,
        durability: Durability,
        io: IoMode,
        guard: Arc<dyn RingGuard>,
    ) -> LogStore {
        let recovery = *wal.recovery();
        let flush_from = wal.flush_from();
        let blocked = recovery.corrupt_inside().then(|| match recovery.damage {
            ringraft_wal::Damage::CorruptInside(ringraft_wal::Evidence::BelowWatermark {
                acked,
                ..
            }) => acked,
            ringraft_wal::Damage::CorruptInside(ringraft_wal::Evidence::WellFormedBeyond {
                index,
                ..
            }) => index,
            _ => unreachable!("corrupt_inside"),
        });
        if let Some(until) = blocked {
            tracing::warn!(
                node_id,
                until,
                damage = ?recovery.damage,
                "the log is corrupt inside: this node grants no vote until it is re-replicated past the break"
            );
        }
        LogStore {
            inner: Arc::new(Inner {
                wal: Mutex::new(wal),
                node_id,
                durability,
                guard,
                adoptions: Mutex::new(Adoptions::default()),
                adoptions_changed: crate::watch::channel(0).0,
                votes_blocked_until: Mutex::new(blocked),
                flush: Arc::new(FlushShared::new(flush_from)),
                io,
                meta_io: Mutex::new(()),
                recent: Mutex::new(recent::Recent::default()),
                decoded: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    fn wal(&self) -> MutexGuard<'_, Wal> {
        self.inner.wal.lock().expect("wal lock")
    }

    /// Runs `f` with the wal locked.
    pub fn with_wal<T>(&self, f: impl FnOnce(&mut Wal) -> T) -> T {
        f(&mut self.wal())
    }

    /// The node's flusher over `sink` (its segment log): run it on a thread
    /// of its own ([`Flusher::run`]), as a task ([`Flusher::run_async`]), or
    /// step it. Until it runs, `fsync` appends are not acknowledged and the
    /// ring is not given room back.
    pub fn flusher<S: SegmentSink>(&self, sink: S) -> Flusher<S> {
        Flusher::new(
            Arc::downgrade(&self.inner),
            self.inner.flush.clone(),
            self.inner.durability,
            sink,
        )
    }

    /// Takes the wal's segment log and runs the flusher over it, which
    /// ends when the store is dropped: on a thread of its own (named for
    /// the node) in [`IoMode::Threads`], as a tokio task in
    /// [`IoMode::Inline`] (call it within a runtime then). `on_room` is
    /// called whenever it gives ring bytes back.
    ///
    /// # Errors
    /// When the segment log was taken already or the thread cannot start.
    pub fn start_flusher(&self, on_room: impl Fn() + Send + 'static) -> io::Result<()> {
        self.start_flusher_with(on_room, std::time::Duration::ZERO)
    }

    /// [`LogStore::start_flusher`], with a simulated disk's flush latency
    /// in [`IoMode::Inline`] ([`Flusher::simulate_flush_latency`]; ignored
    /// in [`IoMode::Threads`], where the disk's own latency is real).
    ///
    /// # Errors
    /// When the segment log was taken already or the thread cannot start.
    pub fn start_flusher_with(
        &self,
        on_room: impl Fn() + Send + 'static,
        flush_latency: std::time::Duration,
    ) -> io::Result<()> {
        let segments = self
            .wal()
            .take_segments()
            .ok_or_else(|| io_err("the segment log is taken already: one flusher per store"))?;
        let mut flusher = self.flusher(segments);
        flusher.on_room(on_room);
        if self.inner.io == IoMode::Inline {
            flusher.simulate_flush_latency(flush_latency);
        }
        match self.inner.io {
            IoMode::Threads => std::thread::Builder::new()
                .name(format!("ringraft-flush-{}", self.inner.node_id))
                .spawn(move || flusher.run())
                .map(drop),
            IoMode::Inline => {
                // Ends by itself once the store is gone; nothing to join.
                drop(tokio::spawn(flusher.run_async()));
                Ok(())
            }
        }
    }

    /// Where this store's blocking work runs.
    pub fn io_mode(&self) -> IoMode {
        self.inner.io
    }

    /// Numbers a change just made to the ring and wakes the flusher;
    /// `waiter` (if any) completes once the segments reflect it.
    fn changed(&self, waiter: Option<Waiter>) {
        let ready = {
            let mut q = self.inner.flush.lock();
            let number = q.changed();
            waiter.and_then(|w| q.wait(number, w))
        };
        self.inner.flush.wake();
        if let Some((waiter, result)) = ready {
            waiter.complete(result);
        }
    }

    /// Queues `op` behind every change made so far (call with the wal lock
    /// held, right after the ring took the same change) and returns the
    /// receiver that says when the segments reflect it.
    fn queue_op(&self, op: SegmentOp) -> tokio::sync::oneshot::Receiver<io::Result<()>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ready = {
            let mut q = self.inner.flush.lock();
            let number = q.queue_op(op);
            q.wait(number, Waiter::Done(tx))
        };
        self.inner.flush.wake();
        if let Some((waiter, result)) = ready {
            waiter.complete(result);
        }
        rx
    }

    /// Writes everything the ring holds to the segments and flushes them,
    /// in either durability (a clean stop: the log then survives a reboot).
    ///
    /// # Errors
    /// When the segment log failed or the flusher stopped.
    pub async fn flush_all(&self) -> io::Result<()> {
        self.inner.flush.lock().request_sync();
        self.flushed().await
    }

    /// Waits until the segments reflect every change made so far.
    async fn flushed(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ready = {
            let mut q = self.inner.flush.lock();
            let number = q.submitted();
            q.wait(number, Waiter::Done(tx))
        };
        self.inner.flush.wake();
        if let Some((waiter, result)) = ready {
            waiter.complete(result);
        }
        rx.await.map_err(|_| io_err("the flusher stopped"))?
    }

    /// [`LogStore::store_meta`] where the store's [`IoMode`] says: on
    /// tokio's blocking pool, or inline.
    async fn save_meta(
        &self,
        change: impl FnOnce(&Wal) -> Option<(std::path::PathBuf, ringraft_wal::Meta)> + Send + 'static,
    ) -> io::Result<bool> {
        match self.inner.io {
            IoMode::Threads => {
                let store = self.clone();
                tokio::task::spawn_blocking(move || store.store_meta(change))
                    .await
                    .map_err(io_err)?
            }
            IoMode::Inline => self.store_meta(change),
        }
    }

    /// Stores the metadata `change` makes of the current one (`None`: no
    /// change) durably, then takes it: blocking. The wal lock is not held
    /// across the write (readers and appends go on); `meta_io` keeps two
    /// writers from losing each other's change.
    fn store_meta(
        &self,
        change: impl FnOnce(&Wal) -> Option<(std::path::PathBuf, ringraft_wal::Meta)>,
    ) -> io::Result<bool> {
        let _writer = self.inner.meta_io.lock().expect("meta io lock");
        let Some((path, meta)) = change(&self.wal()) else {
            return Ok(false);
        };
        meta.store(&path).map_err(io_err)?;
        self.wal().set_meta(meta);
        Ok(true)
    }

    /// Entries `start..end` (cut to the log): the entries appended last
    /// as openraft gave them when they hold the whole range (what a
    /// leader's replication and the apply ask for), else from the ring, or
    /// from the segments for those the ring gave back (read without the
    /// wal lock).
    pub fn read_entries(&self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        {
            let wal = self.wal();
            let from = start.max(wal.first_index());
            let to = end.min(wal.ring().next_index());
            if let Some(entries) = self.recent().get(from, to) {
                return Ok(entries);
            }
        }
        self.read_entries_within(start, end, u64::MAX)
    }

    /// Entries decoded out of the ring or the segments by reads so far
    /// (those served from the entries appended last are not).
    pub fn entries_decoded(&self) -> u64 {
        self.inner
            .decoded
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn recent(&self) -> MutexGuard<'_, recent::Recent> {
        self.inner.recent.lock().expect("recent entries lock")
    }

    /// The encodings of `entries`' payloads that this node made when it
    /// appended them and still keeps (issue 14, item 2): what a leader
    /// WRITEs into its followers' rings.
    pub(crate) fn payloads(&self, entries: &[Entry]) -> Payloads {
        self.recent().payloads(entries)
    }

    /// Keeps `entries`, just appended, for the reads that follow, with
    /// their payloads' encodings where this node made them.
    fn remember(&self, entries: Vec<Entry>, encoded: Option<Vec<Encoded>>) {
        let Some(last) = entries.last().map(|e| e.log_id) else {
            return;
        };
        let wal = self.wal();
        let mut recent = self.recent();
        // openraft's appends come in order: they end the log now. Anything
        // else, and the window is not trusted.
        if wal.ring().next_index() == last.index + 1
            && wal.term_of(last.index) == Some(term_of(&last))
        {
            recent.appended(entries, encoded);
        } else {
            debug_assert!(false, "appended entries that do not end the log");
            recent.clear();
        }
    }

    /// When the segment log's disk is full: what it said. Appends are then
    /// refused ([`crate::NodeError::DiskFull`]) while the flusher retries.
    pub fn disk_full(&self) -> Option<String> {
        self.inner.flush.lock().disk_full().map(str::to_string)
    }

    /// A reader of the segment log (read without the wal lock): its
    /// range, sizes, and where retention would start it.
    pub fn segments(&self) -> ringraft_wal::SegmentReader<ringraft_wal::RealDisk> {
        self.wal().segment_reader()
    }

    /// The first index this node's log holds (earlier ones were purged).
    pub fn first_index(&self) -> u64 {
        self.wal().first_index()
    }

    /// As [`LogStore::read_entries`], stopping once the entries read take
    /// `max_bytes` of record payload (at least one entry is read when the
    /// range is not empty).
    pub fn read_entries_within(
        &self,
        start: u64,
        end: u64,
        max_bytes: u64,
    ) -> io::Result<Vec<Entry>> {
        let (start, end, ring_first, reader) = {
            let wal = self.wal();
            let ring = wal.ring();
            (
                start.max(wal.first_index()),
                end.min(ring.next_index()),
                ring.first_index(),
                wal.segment_reader(),
            )
        };
        let mut out = Vec::with_capacity(end.saturating_sub(start).min(4096) as usize);
        let mut bytes = 0u64;
        let segments_end = end.min(ring_first);
        if start < segments_end {
            for record in reader
                .read_range(start, segments_end, max_bytes)
                .map_err(io_err)?
            {
                bytes += record.payload.len() as u64;
                out.push(decode_entry(record.term, record.index, &record.payload)?);
                self.count_decoded();
            }
            // The segments' reader stops at `max_bytes` of whole records
            // (headers too): what it did not reach is the next call's,
            // never skipped for the ring's entries.
            let reached = out.last().map_or(start, |e| e.log_id.index + 1);
            if bytes >= max_bytes || reached < segments_end {
                return Ok(out);
            }
        }
        let from = start.max(ring_first);
        if from < end {
            let wal = self.wal();
            let ring = wal.ring();
            for index in from..end {
                if bytes >= max_bytes {
                    break;
                }
                match ring.read(index) {
                    Ok(record) => {
                        bytes += record.payload.len() as u64;
                        out.push(decode_entry(record.term, index, record.payload)?);
                        self.count_decoded();
                    }
                    // Given back to the segments since the range was taken.
                    Err(WalError::NotInLog { .. }) if index < ring.first_index() => {
                        drop(wal);
                        let mut rest = self.read_entries_within(
                            index,
                            end,
                            max_bytes.saturating_sub(bytes).max(1),
                        )?;
                        out.append(&mut rest);
                        return Ok(out);
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
        }
        Ok(out)
    }

    fn count_decoded(&self) {
        self.inner
            .decoded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// True while the log is corrupt inside and not yet re-replicated past
    /// the break: the node must not grant votes.
    pub fn votes_blocked(&self) -> bool {
        let mut blocked = self.inner.votes_blocked_until.lock().expect("lock");
        if let Some(until) = *blocked {
            let next = self.wal().ring().next_index();
            if next > until {
                tracing::info!(
                    until,
                    "the log was re-replicated past the break: votes allowed again"
                );
                *blocked = None;
            }
        }
        blocked.is_some()
    }

    /// Raises our own fence to `epoch` with a CPU CAS (devices with global
    /// atomics, and software fabrics, whose atomics are CPU atomics); true
    /// if this call changed it.
    pub fn cas_fence_locally(&self, epoch: Epoch) -> io::Result<bool> {
        let wal = self.wal();
        let ring = wal.ring();
        loop {
            let current = ring.fence();
            if current >= epoch {
                return Ok(false);
            }
            let found = ring
                .compare_exchange_fence(current, epoch)
                .map_err(io_err)?;
            if found == current {
                return Ok(true);
            }
        }
    }

    fn adoptions(&self) -> MutexGuard<'_, Adoptions> {
        self.inner.adoptions.lock().expect("adoptions lock")
    }

    /// Starts a leader request (an AppendEntries, whatever its body) on the
    /// acceptor: call it before the request's fence check and keep the
    /// guard until openraft has answered. Waits while a grant is waiting.
    pub async fn begin_leader_request(&self) -> LeaderRequest {
        let mut changed = self.inner.adoptions_changed.subscribe();
        loop {
            {
                let mut adoptions = self.adoptions();
                if adoptions.granting == 0 {
                    adoptions.in_flight += 1;
                    return LeaderRequest {
                        store: self.clone(),
                    };
                }
            }
            if changed.changed().await.is_err() {
                unreachable!("the store holds the sender");
            }
        }
    }

    /// Runs `grant` (a fence check, an rkey rotation, reading the tail)
    /// when no leader request is in flight, so that no older fence
    /// holder's request extends the log after the grantee learnt its tail.
    pub async fn exclusively<T>(&self, grant: impl FnOnce() -> T) -> T {
        let mut changed = self.inner.adoptions_changed.subscribe();
        self.adoptions().granting += 1;
        let _granting = Granting { store: self };
        loop {
            if self.adoptions().in_flight == 0 {
                // Requests wait while `granting > 0`: none starts between
                // this check and the grant's end (which may take the lock).
                return grant();
            }
            if changed.changed().await.is_err() {
                unreachable!("the store holds the sender");
            }
        }
    }

    /// Connection `conn` was granted write access (call it inside
    /// [`LogStore::exclusively`], with the grant): from now on only its
    /// batches may extend the log.
    pub fn granted_to(&self, conn: u64) {
        self.adoptions().granted = Some(conn);
    }

    /// Whether connection `conn` holds the last grant. A batch on another
    /// connection, even of the same leader (one it dropped and replaced),
    /// would move the tail behind the back of the grantee, whose next WRITE
    /// would then land over adopted records.
    pub fn holds_grant(&self, conn: u64) -> bool {
        self.adoptions().granted == Some(conn)
    }

    /// Checks records a leader wrote into this ring, without taking them into
    /// the log, and returns them as entries; they stay pending for
    /// connection `conn` until openraft appends exactly them (or
    /// [`LogStore::drop_pending`]). `Ok(None)` where `conn` does not hold
    /// the last grant ([`LogStore::holds_grant`], checked under the same
    /// lock): nothing was looked at.
    pub fn prepare_adoption(
        &self,
        conn: u64,
        request: AdoptRequest,
    ) -> Result<Option<Vec<Entry>>, WalError> {
        let mut adoptions = self.adoptions();
        if adoptions.granted != Some(conn) {
            return Ok(None);
        }
        let wal = self.wal();
        let prepared = wal.ring().prepare_adoption(request)?;
        let entries = wal
            .ring()
            .prepared_records(&prepared)
            .map(|r| decode_entry(r.term, r.index, r.payload))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| WalError::Conflict(e.to_string()))?;
        let replaced = adoptions.pending.insert(
            conn,
            Pending {
                prepared,
                clobbered: false,
            },
        );
        // A connection prepares its next adoption only once its last one
        // was taken or dropped (one pending adoption per connection).
        assert!(replaced.is_none(), "connection {conn} prepared twice");
        Ok(Some(entries))
    }

    /// Forgets the adoption connection `conn` prepared if openraft did not
    /// take it, and erases its scratch records (those no other connection
    /// prepared) so that neither a later adoption nor recovery finds them.
    /// Returns whether something was pending.
    pub fn drop_pending(&self, conn: u64) -> bool {
        let mut adoptions = self.adoptions();
        let Some(pending) = adoptions.pending.remove(&conn) else {
            return false;
        };
        self.erase_scratch(&mut adoptions, pending.prepared.request().to_lsn);
        drop(adoptions);
        self.inner.adoptions_changed.send_modify(|v| *v += 1);
        true
    }

    /// Forgets the adoption connection `conn` prepared for `request` if
    /// openraft did not take it (as [`LogStore::drop_pending`]), and
    /// nothing if the connection's pending adoption is another request's
    /// (a pipelined one, prepared after this one was taken). Returns whether
    /// it dropped something.
    pub fn drop_pending_of(&self, conn: u64, request: AdoptRequest) -> bool {
        let mut adoptions = self.adoptions();
        if adoptions
            .pending
            .get(&conn)
            .is_none_or(|p| p.prepared.request() != request)
        {
            return false;
        }
        let pending = adoptions.pending.remove(&conn).expect("just seen");
        self.erase_scratch(&mut adoptions, pending.prepared.request().to_lsn);
        drop(adoptions);
        self.inner.adoptions_changed.send_modify(|v| *v += 1);
        true
    }

    /// Whether connection `conn` has an adoption prepared that openraft has
    /// not taken (nor was it dropped) yet.
    pub fn has_pending(&self, conn: u64) -> bool {
        self.adoptions().pending.contains_key(&conn)
    }

    /// Changes whenever a prepared adoption is taken or dropped, a leader
    /// request ends or a grant finishes.
    pub fn watch_adoptions(&self) -> crate::watch::Receiver<u64> {
        self.inner.adoptions_changed.subscribe()
    }

    /// Erases records connection `conn` wrote that were refused at adoption
    /// (nothing was prepared), sparing what other connections prepared.
    pub fn reject_written(&self, conn: u64, to_lsn: u64) {
        let mut adoptions = self.adoptions();
        debug_assert!(!adoptions.pending.contains_key(&conn));
        self.erase_scratch(&mut adoptions, to_lsn);
    }

    /// Erases scratch up to `to_lsn`, beyond the ranges other connections
    /// prepared at the tail.
    fn erase_scratch(&self, adoptions: &mut Adoptions, to_lsn: u64) {
        let mut wal = self.wal();
        let tail = wal.ring().tail_lsn();
        let spared_until = adoptions
            .pending
            .values()
            .filter(|p| p.prepared.request().from_lsn == tail)
            .map(|p| p.prepared.request().to_lsn)
            .max()
            .unwrap_or(tail);
        for pending in adoptions.pending.values_mut() {
            let range = pending.prepared.request();
            if range.from_lsn < to_lsn && range.to_lsn > spared_until {
                // Only a stale one (prepared before the log moved) can
                // overlap what is erased: it will not be adopted in place.
                debug_assert_ne!(range.from_lsn, tail);
                pending.clobbered = true;
            }
        }
        wal.ring_mut().clear_scratch_between(spared_until, to_lsn);
    }

    /// The adopted tail: where a leader writes next and the chain there.
    pub fn tail(&self) -> crate::protocol::Tail {
        let wal = self.wal();
        let ring = wal.ring();
        let tip = ring.tip();
        crate::protocol::Tail {
            next_lsn: ring.tail_lsn(),
            next_index: tip.next_index,
            last_term: tip.last_term,
            epoch: tip.epoch,
            unanchored: tip.unanchored,
            head_lsn: ring.head_lsn(),
        }
    }

    /// The ring's fence.
    pub fn fence(&self) -> Epoch {
        self.wal().ring().fence()
    }

    /// The vote this node saved last.
    pub fn vote(&self) -> Option<VoteRecord> {
        self.wal().meta().vote
    }

    /// The epoch local appends of `max_term` run under: a leader's own (its
    /// fence raised first if needed), else the fence holder's.
    async fn epoch_for(&self, max_term: u64) -> io::Result<Epoch> {
        let (vote, fence) = {
            let wal = self.wal();
            (wal.meta().vote, wal.ring().fence())
        };
        let leading = vote.is_some_and(|v| {
            v.committed && v.voted_for == Some(self.inner.node_id) && v.term >= max_term
        });
        if leading {
            let term = vote.map_or(max_term, |v| v.term);
            let mine = Epoch::new(term, self.inner.node_id).ok_or_else(|| {
                io_err(format!(
                    "term {term} or node {} does not fit an epoch",
                    self.inner.node_id
                ))
            })?;
            if fence < mine {
                self.inner.guard.fence_self(mine).await?;
            }
            let fence = self.wal().ring().fence();
            return Ok(if fence >= mine { mine } else { fence });
        }
        if fence.term() < max_term {
            // Entries of a term above the fence, and not ours: a leader that
            // has not fenced this node (the network refuses that case first),
            // or the very first entries of a fresh cluster.
            let e = Epoch::new(max_term, 0).ok_or_else(|| io_err("term does not fit an epoch"))?;
            self.inner.guard.fence_self(e).await?;
            return Ok(self.wal().ring().fence());
        }
        Ok(fence)
    }

    /// Writes `entries` into the ring itself, and returns their payloads'
    /// encodings (made once here, for the followers' rings too).
    async fn append_local(&self, entries: &[Entry]) -> io::Result<Vec<Encoded>> {
        let max_term = entries
            .iter()
            .map(|e| term_of(&e.log_id))
            .max()
            .unwrap_or(0);
        let epoch = self.epoch_for(max_term).await?;
        let encoded = entries
            .iter()
            .map(Encoded::of)
            .collect::<io::Result<Vec<_>>>()?;
        let refs: Vec<EntryRef<'_>> = entries
            .iter()
            .zip(&encoded)
            .map(|(e, x)| EntryRef {
                term: term_of(&e.log_id),
                index: e.log_id.index,
                payload: &x.bytes,
            })
            .collect();
        // No waiting for room here: openraft's core task awaits this append,
        // and the purge that would free room is a command of that same task.
        // Room is kept before entries reach openraft: by admission for a
        // leader's proposals (`crate::admission`, which also keeps a reserve
        // for openraft's own entries), by the leader's flow control for a
        // follower's ring. A full ring here means one of those broke; it is
        // an error (fatal to openraft) that says so, not a panic, because a
        // follower's two-sided batch comes from a peer that may be faulty.
        let result = self.wal().ring_mut().append(epoch, &refs);
        match result {
            Ok(_) => Ok(encoded),
            Err(e @ WalError::RingFull { .. }) => {
                tracing::error!(error = %e, "ring full on append: admission or flow control broke");
                Err(io_err(format!(
                    "{e}: no room for entries openraft appended; admission (a leader's \
                     proposals) or the leader's flow control (a follower's ring) should have \
                     kept it: a bug"
                )))
            }
            Err(e) => Err(io_err(e)),
        }
    }

    /// The prepared adoption (of any connection) whose records are exactly
    /// `entries`, taken out of the pending set.
    fn take_matching_pending(adoptions: &mut Adoptions, entries: &[Entry]) -> Option<Pending> {
        let first = entries.first().map(|e| e.log_id.index);
        let wanted_last = entries.last().map(|e| pos(&e.log_id));
        let conn = adoptions.pending.iter().find_map(|(conn, p)| {
            let request = p.prepared.request();
            let prepared_first = request.last.map(|l| l.index + 1 - request.entries);
            (request.entries == entries.len() as u64
                && request.last == wanted_last
                && prepared_first == first)
                .then_some(*conn)
        })?;
        adoptions.pending.remove(&conn)
    }

    /// Takes `entries` into the log: in place where a connection prepared
    /// exactly them, else written locally. A prepared adoption that can no
    /// longer be committed as it is (the fence or the log moved since it
    /// was checked, its bytes were erased) is not an error: openraft
    /// decided these entries belong in the log, so they are written
    /// locally instead.
    /// Returns the entries' payloads' encodings where it wrote them itself
    /// (`None`: adopted as they lay).
    async fn append_entries(&self, entries: &[Entry]) -> io::Result<Option<Vec<Encoded>>> {
        // Taken and committed under the adoptions lock: a connection that
        // sees its adoption gone (to prepare its next batch at the new
        // tail), and an erasure of scratch, see it in the log already.
        let committed = {
            let mut adoptions = self.adoptions();
            LogStore::take_matching_pending(&mut adoptions, entries).map(|pending| {
                if pending.clobbered {
                    Err("its bytes were erased since".to_string())
                } else {
                    self.wal()
                        .ring_mut()
                        .commit_adoption(pending.prepared)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })
        };
        if committed.is_some() {
            // A connection waiting to prepare its next batch may go on.
            self.inner.adoptions_changed.send_modify(|v| *v += 1);
        }
        match committed {
            Some(Ok(())) => return Ok(None),
            Some(Err(why)) => tracing::info!(
                why,
                "prepared records not adopted as they lie; writing the entries locally"
            ),
            None => {}
        }
        self.append_local(entries).await.map(Some)
    }
}
