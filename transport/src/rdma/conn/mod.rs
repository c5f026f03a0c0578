//! An RC connection over a real queue pair: posting, the completion driver,
//! receives, our own deadline, and the error state.
//!
//! - Posting: `post` copies the caller's bytes into registered staging
//!   memory the connection owns and posts the work request *now*, under the
//!   send lock, so posting order is wire order. Staging comes from a ring
//!   (pieces released in completion order, which for one send queue is
//!   posting order); a request that does not fit gets a registration of its
//!   own, released at its completion. READ results and atomic results land
//!   in staging and are copied out. A WRITE or SEND of at most the queue
//!   pair's inline size (256 bytes where the provider allows it) is posted
//!   inline instead: the provider copies it at the post, no staging.
//!   `post_chain` posts several requests with one `ibv_post_send`; a WRITE
//!   or SEND with another request of its chain after it is unsignaled (the
//!   device reports it only if it fails), and the next completion
//!   completes it: a send queue completes in posting order, and a failed
//!   request always reports itself, so a WRITE refused by a fenced
//!   follower still fails with its own remote access error.
//! - Completions: one completion queue per connection (sends and receives),
//!   with its own completion channel whose descriptor is registered with
//!   tokio (`AsyncFd`). A driver task drains the queue with `ibv_poll_cq`,
//!   arms it (`ibv_req_notify_cq`), polls once more, then waits for the
//!   channel (`ibv_get_cq_event` + `ibv_ack_cq_events`). With
//!   `ConnConfig::busy_poll` it spins (`yield_now` between polls) while a
//!   request is outstanding or a receiver waits, and waits on the channel
//!   otherwise. `post` and `recv` also poll once themselves (unless
//!   another thread is polling): a completion already there (rxe runs a
//!   loopback WRITE and its ACK inside `ibv_post_send`) is handed over
//!   without waking anyone. One thread polls at a time, so completions are
//!   handled in the device's order.
//! - Receives: `max(recv_depth, 16)` receive buffers of `max_message_bytes`
//!   each; `recv_depth` of them are posted before the connection is ready;
//!   a message is copied out when its completion is polled, which frees the
//!   buffer; `auto_repost` posts one again each time `recv` takes a message.
//! - Errors: a failed work completion (mapped by [`wc_error`]) completes
//!   its request with that error and puts the queue pair in ERR. A request
//!   not completed within `ConnConfig::op_deadline()` (our limit above the
//!   verbs' retries) completes with `RetryExceeded` and the queue pair goes
//!   to ERR. So does `close`, a failed post, or the peer's end. Entering the
//!   error state completes at once, with `Flushed`, every request whose
//!   result the caller has not been given: its outcome is unknown (on rxe
//!   a loopback WRITE executes inside `ibv_post_send`, so a WRITE reported
//!   `Flushed` may have landed). The device's own flush completions then
//!   only release staging. A connection in error is never reused.
//! - The bootstrap TCP stream stays open for the life of the connection. It
//!   carries nothing after the handshake but a close notice (the cause, at
//!   most 256 bytes of UTF-8, then FIN); its end, or a notice, puts the
//!   queue pair in ERR. So a peer that closes, drops the connection or
//!   dies is noticed at once instead of after a transport retry.
//!
//! Layout (`conn/`): `sizing` (queue and buffer sizes), `setup` (the queue
//! pair and its buffers until RTS), `recv` (receive slots), `stage` (send
//! staging), `post` (posting), `completions` (polling, deadlines, the
//! driver), `close` (the bootstrap stream as close channel, the handle);
//! this module holds the shared state, the error state and the public
//! [`RdmaConnection`].
//!
//! Never: hand the device memory it may still use (the queue pair is
//! destroyed before staging and receive buffers, see [`Shared`]'s field
//! order), panic on what the device or the peer reports, or block the
//! runtime.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rdma_sys::{ibv_wc_opcode, ibv_wc_status};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::buffer::DeviceBuffer;
use super::context::{Gid, LINK_LAYER_ETHERNET, PortAttributes};
use super::cq::{ChannelFd, CompletionQueue, POLL_BATCH, WorkCompletion};
use super::device::RdmaDevice;
use super::endpoint::{MAX_24_BIT, QpEndpoint};
use super::mr::AccessFlags;
use super::pd::ProtectionDomain;
use super::qp::{
    LocalSlice, QueuePair, QueuePairCaps, ReadyToReceive, ReadyToSend, SendOp, SendWr,
    rnr_timer_code,
};
use super::staging::{Piece, StagingRing};
use crate::error::{Result, TransportError, WcError};
use crate::handshake::PeerInfo;
use crate::limits::ConnSlot;
use crate::types::{Access, ConnConfig, Received};
use crate::work::{Done, Request};

mod close;
mod completions;
mod post;
mod recv;
mod setup;
mod sizing;
mod stage;

use close::{ConnHandle, watch_bootstrap};
use completions::drive;
pub(crate) use completions::wc_error;
use post::{OpKind, Posted, SendState};
use recv::{RECV_WR_TAG, RecvState, RecvWaiter, post_receives};
pub(crate) use setup::QpResources;
pub(crate) use sizing::Sizing;
use stage::Staging;

/// Everything the connection's handles and tasks share.
struct Shared {
    // Field order is drop order: the queue pair is destroyed first, so the
    // device no longer touches the staging and receive memory below (nor
    // the overflow registrations held in `send`).
    pub(super) qp: QueuePair,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) send_staging: DeviceBuffer,
    pub(super) recv_buffers: DeviceBuffer,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) send: Mutex<SendState>,
    pub(super) recv: Mutex<RecvState>,
    /// The cause, once in the error state.
    pub(super) failure: Mutex<Option<String>>,
    pub(super) failed: AtomicBool,
    pub(super) driver_wake: Notify,
    pub(super) driver_parked: AtomicBool,
    pub(super) recv_ready: Notify,
    pub(super) recv_waiters: AtomicU32,
    pub(super) close_notice: Mutex<Option<oneshot::Sender<String>>>,
    /// The peer's close notice (or the end of the bootstrap stream), for the
    /// driver to act on once it has delivered what the device already
    /// reported (a peer that refused our request closes at once, and its
    /// notice must not hide the device's own error completion).
    pub(super) peer_closed: Mutex<Option<String>>,
    /// The poll lock, with its batch buffer: one thread polls at a time, so
    /// completions are handled in the device's order (receives stay in
    /// order).
    pub(super) poller: Mutex<Vec<WorkCompletion>>,
    pub(super) sizing: Sizing,
    pub(super) config: ConnConfig,
    pub(super) peer_addr: String,
    pub(super) _slot: ConnSlot,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug of ours; the state
    // stays consistent enough to fail the connection, so go on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn broken(&self) -> TransportError {
        TransportError::Broken {
            peer: self.peer_addr.clone(),
            cause: lock(&self.failure).clone().unwrap_or_default(),
        }
    }

    fn check_ready(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.broken());
        }
        Ok(())
    }

    /// Enters the error state (once): the queue pair goes to ERR (the device
    /// flushes what is posted), every request whose caller still waits
    /// completes with `Flushed`, receivers wake up, the peer is told.
    fn fail(&self, cause: String) {
        {
            let mut failure = lock(&self.failure);
            if failure.is_some() {
                return;
            }
            tracing::debug!(peer = %self.peer_addr, qpn = self.qp.qpn(), %cause, "rdma queue pair enters the error state");
            *failure = Some(cause.clone());
            // Set before the send lock is taken below: `post` checks it under
            // that lock, so no request is added after the flush.
            self.failed.store(true, Ordering::SeqCst);
        }
        if let Err(error) = self.qp.to_error() {
            tracing::warn!(peer = %self.peer_addr, %error, "ibv_modify_qp to ERR failed");
        }
        let waiting: Vec<_> = lock(&self.send)
            .pending
            .iter_mut()
            .filter_map(|p| p.done.take())
            .collect();
        for done in waiting {
            let _ = done.send(Err(WcError::Flushed));
        }
        self.recv_ready.notify_waiters();
        self.driver_wake.notify_one();
        if let Some(notice) = lock(&self.close_notice).take() {
            let _ = notice.send(cause);
        }
    }
}

/// An RC connection over a real queue pair. Cloning shares it; dropping the
/// last clone puts it in the error state, tells the peer, and destroys the
/// queue pair.
#[derive(Clone)]
pub struct RdmaConnection {
    inner: Arc<ConnHandle>,
}

impl std::fmt::Debug for RdmaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("peer", &self.inner.shared.peer_addr)
            .field("qpn", &self.inner.shared.qp.qpn())
            .finish()
    }
}

impl RdmaConnection {
    /// Starts a connection whose queue pair is in RTS: its completion
    /// driver, and the watch on the bootstrap stream.
    pub(crate) fn start(
        resources: QpResources,
        config: ConnConfig,
        peer_addr: String,
        peer: PeerInfo,
        stream: TcpStream,
    ) -> Result<RdmaConnection> {
        let QpResources {
            qp,
            cq,
            send_staging,
            recv_buffers,
            pd,
            recv,
            sizing,
            slot,
            ..
        } = resources;
        // SAFETY: the descriptor is the completion channel's, which the
        // `ChannelFd` keeps open (it holds an `Arc` of the channel) for as
        // long as the `AsyncFd` lives, and always returns the same one.
        let events = unsafe { AsyncFd::register_with_interest(cq.event_fd(), Interest::READABLE) }
            .map_err(|e| TransportError::Io {
                op: "registering the completion channel with tokio".to_string(),
                source: e.into_parts().1,
            })?;
        let (notice_tx, notice_rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            qp,
            cq,
            send_staging,
            recv_buffers,
            pd,
            send: Mutex::new(SendState {
                next_seq: 0,
                pending: VecDeque::new(),
                ring: StagingRing::new(sizing.ring_bytes),
                overflow_bytes: 0,
            }),
            recv: Mutex::new(recv),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            driver_wake: Notify::new(),
            driver_parked: AtomicBool::new(false),
            recv_ready: Notify::new(),
            recv_waiters: AtomicU32::new(0),
            close_notice: Mutex::new(Some(notice_tx)),
            poller: Mutex::new(Vec::with_capacity(POLL_BATCH)),
            peer_closed: Mutex::new(None),
            sizing,
            config,
            peer_addr,
            _slot: slot,
        });
        let driver = tokio::spawn(drive(shared.clone(), events)).abort_handle();
        tokio::spawn(watch_bootstrap(stream, Arc::downgrade(&shared), notice_rx));
        Ok(RdmaConnection {
            inner: Arc::new(ConnHandle {
                shared,
                peer,
                driver,
            }),
        })
    }

    /// What the peer revealed in the handshake.
    pub fn peer_info(&self) -> &PeerInfo {
        &self.inner.peer
    }

    /// The peer's bootstrap address.
    pub fn peer_addr(&self) -> &str {
        &self.inner.shared.peer_addr
    }

    /// The connection's parameters.
    pub fn config(&self) -> &ConnConfig {
        &self.inner.shared.config
    }

    /// The largest WRITE or SEND posted inline.
    pub fn max_inline_bytes(&self) -> u32 {
        self.inner.shared.qp.max_inline()
    }

    /// The local queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.shared.qp.qpn()
    }

    /// Posts a work request now; the receiver resolves with its completion.
    pub(crate) fn post(&self, request: Request) -> Result<Posted> {
        let mut posted = self.inner.shared.post_chain(vec![request])?;
        Ok(posted.pop().expect("one receiver per request"))
    }

    /// Posts `requests` as one chain (one `ibv_post_send`): all or none.
    pub(crate) fn post_chain(&self, requests: Vec<Request>) -> Result<Vec<Posted>> {
        self.inner.shared.post_chain(requests)
    }

    /// Posts `count` more receive buffers (at most the free ones of the
    /// connection's `max(recv_depth, 16)`).
    pub fn post_recv(&self, count: u32) -> Result<()> {
        let s = &self.inner.shared;
        s.check_ready()?;
        let mut recv = lock(&s.recv);
        post_receives(
            &s.qp,
            &s.recv_buffers,
            s.sizing.recv_slot_bytes,
            &mut recv,
            count,
        )
    }

    /// The next message from the receive queue (messages that arrived
    /// before an error are still returned).
    pub async fn recv(&self) -> Result<Received> {
        let s = &*self.inner.shared;
        loop {
            let notified = s.recv_ready.notified();
            {
                let mut recv = lock(&s.recv);
                if let Some(message) = recv.queue.pop_front() {
                    if s.config.auto_repost
                        && !s.failed.load(Ordering::Acquire)
                        && let Err(error) = post_receives(
                            &s.qp,
                            &s.recv_buffers,
                            s.sizing.recv_slot_bytes,
                            &mut recv,
                            1,
                        )
                    {
                        tracing::warn!(peer = %s.peer_addr, %error, "re-posting a receive failed");
                    }
                    return Ok(message);
                }
            }
            if s.try_drain() > 0 {
                continue;
            }
            s.check_ready()?;
            let _waiting = RecvWaiter::enter(s);
            notified.await;
        }
    }

    /// Changes what the peer may do through this queue pair
    /// (`ibv_modify_qp` RTS -> RTS of the access flags).
    pub fn set_remote_access(&self, access: Access) -> Result<()> {
        let s = &self.inner.shared;
        s.check_ready()?;
        s.qp.set_remote_access(AccessFlags::from_access(access))
            .map_err(TransportError::io(format!(
                "ibv_modify_qp access flags (connection to {})",
                s.peer_addr
            )))
    }

    /// The cause, once the queue pair is in the error state.
    pub fn error(&self) -> Option<String> {
        lock(&self.inner.shared.failure).clone()
    }

    /// Moves the queue pair to ERR (everything posted is flushed) and tells
    /// the peer.
    pub fn close(&self, reason: &str) {
        self.inner.shared.fail(reason.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::close::truncate_utf8;
    use super::sizing::MIN_RECV_SLOTS;
    use super::*;

    #[test]
    fn completion_statuses_map_to_verbs_errors() {
        use ibv_wc_status::*;
        assert_eq!(wc_error(IBV_WC_REM_ACCESS_ERR), WcError::RemoteAccess);
        assert_eq!(
            wc_error(IBV_WC_REM_INV_REQ_ERR),
            WcError::RemoteInvalidRequest
        );
        assert_eq!(
            wc_error(IBV_WC_RNR_RETRY_EXC_ERR),
            WcError::RnrRetryExceeded
        );
        assert_eq!(wc_error(IBV_WC_RETRY_EXC_ERR), WcError::RetryExceeded);
        assert_eq!(wc_error(IBV_WC_WR_FLUSH_ERR), WcError::Flushed);
        for local in [
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_LOC_PROT_ERR,
            IBV_WC_LOC_ACCESS_ERR,
        ] {
            assert_eq!(wc_error(local), WcError::LocalError);
        }
        assert_eq!(wc_error(IBV_WC_REM_OP_ERR), WcError::RemoteInvalidRequest);
        assert_eq!(wc_error(IBV_WC_FATAL_ERR), WcError::Other(19));
    }

    #[test]
    fn sizing_follows_config_and_device() {
        let config = ConnConfig::default();
        // rxe: 16384 WRs, 32767 CQEs, 128 rd atoms, 8 MiB messages.
        let s = Sizing::of(&config, 16384, 32767, 128, 128, 8 << 20).unwrap();
        assert_eq!(s.recv_slots, 64);
        assert_eq!(s.recv_slot_bytes, 64 << 10);
        assert_eq!(s.ring_bytes, 2 << 20);
        assert_eq!(s.cq_entries, 256 + 64);
        assert_eq!((s.initiator_depth, s.responder_depth), (16, 16));
        assert_eq!(s.max_transfer_bytes, 8 << 20, "capped by the port");
        let none = ConnConfig {
            recv_depth: 0,
            max_outstanding: 4,
            ..ConnConfig::default()
        };
        let s = Sizing::of(&none, 16384, 32767, 0, 0, 0).unwrap();
        assert_eq!(s.recv_slots, MIN_RECV_SLOTS);
        assert_eq!(s.ring_bytes, 64 << 10);
        assert_eq!((s.initiator_depth, s.responder_depth), (1, 1));
        assert_eq!(s.max_transfer_bytes, 16 << 20);
        assert!(matches!(
            Sizing::of(&config, 128, 32767, 1, 1, 0),
            Err(TransportError::Config(_))
        ));
        assert!(matches!(
            Sizing::of(&config, 16384, 256, 1, 1, 0),
            Err(TransportError::Config(_))
        ));
        let huge = ConnConfig {
            recv_depth: 16384,
            max_message_bytes: 16 << 20,
            ..ConnConfig::default()
        };
        assert!(matches!(
            Sizing::of(&huge, 16384, 1 << 20, 1, 1, 0),
            Err(TransportError::Config(_))
        ));
    }

    #[test]
    fn notices_are_cut_on_character_boundaries() {
        assert_eq!(truncate_utf8("abc", 2), b"ab");
        assert_eq!(truncate_utf8("é", 1), b"");
        assert_eq!(truncate_utf8("ok", 256), b"ok");
    }
}
