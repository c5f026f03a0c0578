//! A watch channel (the latest value and a change notification) whose
//! waiting receivers are woken in the order they began to wait.
//!
//! `tokio::sync::watch` spreads a channel's waiters over eight `Notify`s,
//! each waiter's picked with the runtime's random generator, and wakes the
//! eight in turn: after a change, the tasks waiting on one channel run in a
//! random order. That generator is seeded from the OS unless the runtime
//! was built with `tokio::runtime::Builder::rng_seed`, an unstable API
//! (`--cfg tokio_unstable`). With several waiters on one channel (the
//! leader's replication and heartbeat tasks on openraft's channels, two
//! leaders' connections on the log store's, the trace of a test on a
//! node's metrics) a run would then not be a function of its seed, even on
//! one thread with paused time. This channel has one [`Notify`], whose
//! waiters wake in the order they waited.
//!
//! It has the shape of tokio's (the part of it this crate and its users
//! need) and is openraft's watch channel too ([`crate::rt`]).
//!
//! Owns the channel; it must never wake waiters in an order that depends
//! on anything but the order in which they began to wait.

use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::{OptionalSend, OptionalSync};
use tokio::sync::Notify;

pub use openraft::rt::watch::{RecvError, SendError};

/// A borrowed value; no change is made while it is held (do not hold it
/// across an `.await`, nor while sending on the same channel).
pub struct Ref<'a, T>(RwLockReadGuard<'a, T>);

impl<T> std::ops::Deref for Ref<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Ref<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

struct Shared<T> {
    value: RwLock<T>,
    /// The number of changes made; changed only under `value`'s write lock.
    version: AtomicU64,
    senders: AtomicUsize,
    receivers: AtomicUsize,
    /// Notified (all waiters, in order) at every change and when the last
    /// sender goes.
    changed: Notify,
}

impl<T> Shared<T> {
    fn read(&self) -> Ref<'_, T> {
        // A panic while a sender modified the value leaves it as the
        // sender left it, as tokio's channel does.
        Ref(self.value.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.value.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed(&self) -> bool {
        self.senders.load(Ordering::Acquire) == 0
    }
}

/// A channel holding `init`.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        version: AtomicU64::new(0),
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
        changed: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared, seen: 0 },
    )
}

/// The sending half; clones share the channel, which closes when the last
/// one is dropped.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Replaces the value and notifies the receivers; fails (and keeps the
    /// old value) when there is none, like tokio's.
    ///
    /// # Errors
    /// When no receiver exists: `value` is given back.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        if self.shared.receivers.load(Ordering::Acquire) == 0 {
            return Err(SendError(value));
        }
        self.send_replace(value);
        Ok(())
    }

    /// Replaces the value whether or not a receiver exists, notifies, and
    /// returns the old value.
    pub fn send_replace(&self, value: T) -> T {
        let mut old = Some(value);
        self.send_modify(|current| {
            old = Some(std::mem::replace(current, old.take().expect("set")))
        });
        old.expect("replaced")
    }

    /// Modifies the value in place and notifies the receivers.
    pub fn send_modify(&self, modify: impl FnOnce(&mut T)) {
        self.send_if_modified(|value| {
            modify(value);
            true
        });
    }

    /// Modifies the value in place; notifies the receivers only when
    /// `modify` says it changed it. Returns what `modify` said.
    pub fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        {
            let mut value = self.shared.write();
            if !modify(&mut value) {
                return false;
            }
            self.shared.version.fetch_add(1, Ordering::AcqRel);
        }
        self.shared.changed.notify_waiters();
        true
    }

    /// The current value.
    pub fn borrow(&self) -> Ref<'_, T> {
        self.shared.read()
    }

    /// A new receiver, which has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        let value = self.shared.read();
        let seen = self.shared.version.load(Ordering::Acquire);
        drop(value);
        Receiver {
            shared: self.shared.clone(),
            seen,
        }
    }

    /// How many receivers exist.
    pub fn receiver_count(&self) -> usize {
        self.shared.receivers.load(Ordering::Acquire)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Closed: the waiters learn it.
            self.shared.changed.notify_waiters();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("watch::Sender").finish_non_exhaustive()
    }
}

/// The receiving half: the latest value, and whether it changed since this
/// receiver last looked.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// The version this receiver has seen.
    seen: u64,
}

impl<T> Receiver<T> {
    /// The current value, without marking it seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        self.shared.read()
    }

    /// The current value, marked seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let value = self.shared.read();
        // The version changes only under the write lock: it matches `value`.
        self.seen = self.shared.version.load(Ordering::Acquire);
        value
    }

    /// Whether the value changed since this receiver last saw it.
    ///
    /// # Errors
    /// When the channel is closed.
    pub fn has_changed(&self) -> Result<bool, RecvError> {
        if self.shared.closed() {
            return Err(RecvError(()));
        }
        Ok(self.shared.version.load(Ordering::Acquire) != self.seen)
    }

    /// Waits until the value changes from the one this receiver last saw
    /// (at once if it has already), and marks it seen.
    ///
    /// # Errors
    /// When the channel closed with no unseen change.
    pub async fn changed(&mut self) -> Result<(), RecvError> {
        loop {
            // Registered before the check: a change between the check and
            // the wait is not missed.
            let mut notified = pin!(self.shared.changed.notified());
            notified.as_mut().enable();
            let version = self.shared.version.load(Ordering::Acquire);
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.closed() {
                return Err(RecvError(()));
            }
            notified.await;
        }
    }

    /// Waits until the value satisfies `condition` (checked at once, then
    /// at every change) and returns it, marked seen.
    ///
    /// # Errors
    /// When the channel closed before the value satisfied `condition`.
    pub async fn wait_for(
        &mut self,
        mut condition: impl FnMut(&T) -> bool,
    ) -> Result<Ref<'_, T>, RecvError> {
        loop {
            let mut notified = pin!(self.shared.changed.notified());
            notified.as_mut().enable();
            {
                let value = self.shared.read();
                self.seen = self.shared.version.load(Ordering::Acquire);
                if condition(&value) {
                    return Ok(value);
                }
            }
            if self.shared.closed() {
                return Err(RecvError(()));
            }
            notified.await;
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        Receiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("watch::Receiver")
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

/// This channel as openraft's watch ([`crate::rt::Tokio`]).
#[derive(Debug)]
pub struct OrderedWatch;

impl openraft::rt::Watch for OrderedWatch {
    type Sender<T: OptionalSend + OptionalSync> = Sender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = Receiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = Ref<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Sender<T>, Receiver<T>) {
        channel(init)
    }
}

impl<T: OptionalSend + OptionalSync> openraft::rt::WatchSender<OrderedWatch, T> for Sender<T> {
    fn send(&self, value: T) -> Result<(), SendError<T>> {
        Sender::send(self, value)
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        Sender::send_if_modified(self, modify)
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.borrow()
    }

    fn subscribe(&self) -> Receiver<T> {
        Sender::subscribe(self)
    }
}

impl<T: OptionalSend + OptionalSync> openraft::rt::WatchReceiver<OrderedWatch, T> for Receiver<T> {
    async fn changed(&mut self) -> Result<(), RecvError> {
        Receiver::changed(self).await
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.borrow()
    }

    fn borrow_and_update(&mut self) -> Ref<'_, T> {
        Receiver::borrow_and_update(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_wakes_the_waiters_in_the_order_they_waited() {
        let (tx, rx) = channel(0u64);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for k in 0..16u64 {
            let mut rx = rx.clone();
            let woken = woken.clone();
            tasks.push(tokio::spawn(async move {
                rx.changed().await.unwrap();
                woken.lock().unwrap().push(k);
            }));
            // Each waits before the next is spawned.
            tokio::task::yield_now().await;
        }
        tx.send(1).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*woken.lock().unwrap(), (0..16).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_sees_each_change_once_and_learns_of_the_close() {
        let (tx, mut rx) = channel(1u64);
        assert!(!rx.has_changed().unwrap());
        assert!(!tx.send_if_modified(|_| false), "no change, no notice");
        tx.send_modify(|v| *v += 1);
        assert!(rx.has_changed().unwrap());
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), 2);
        assert!(!rx.has_changed().unwrap());
        let late = tx.subscribe();
        assert!(!late.has_changed().unwrap(), "a new receiver has seen it");
        let waiter = tokio::spawn(async move { rx.wait_for(|v| *v >= 4).await.map(|v| *v) });
        tx.send(3).unwrap();
        tx.send(4).unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(4));
        drop(late);
        assert!(tx.send(5).is_err(), "no receiver: refused, like tokio's");
        assert_eq!(*tx.borrow(), 4);
        let mut rx = tx.subscribe();
        drop(tx);
        assert_eq!(rx.changed().await, Err(RecvError(())));
    }
}
