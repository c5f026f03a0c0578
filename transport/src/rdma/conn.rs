//! An RC connection over a real queue pair: posting, the completion driver,
//! receives, our own deadline, and the error state.
//!
//! - Posting: `post` copies the caller's bytes into registered staging
//!   memory the connection owns and posts the work request *now*, under the
//!   send lock, so posting order is wire order. Staging comes from a ring
//!   (pieces released in completion order, which for one send queue is
//!   posting order); a request that does not fit gets a registration of its
//!   own, released at its completion. READ results and atomic results land
//!   in staging and are copied out. Every send is signaled.
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
use super::device::{ConnSlot, RdmaDevice};
use super::endpoint::{MAX_24_BIT, QpEndpoint};
use super::mr::AccessFlags;
use super::pd::ProtectionDomain;
use super::qp::{QueuePair, QueuePairCaps, ReadyToReceive, ReadyToSend, SendOp, rnr_timer_code};
use super::staging::{Piece, StagingRing};
use crate::error::{Result, TransportError, WcError};
use crate::handshake::PeerInfo;
use crate::types::{Access, ConnConfig, Received};
use crate::work::{Done, Request};

/// Receive buffers a connection has room for, at least.
pub(crate) const MIN_RECV_SLOTS: u32 = 16;
/// Receive buffer memory per connection, at most.
const MAX_RECV_MEMORY_BYTES: u64 = 256 << 20;
/// Send staging ring bytes per allowed outstanding request...
const STAGING_BYTES_PER_OUTSTANDING: u64 = 8 << 10;
/// ...but at least this...
const MIN_STAGING_RING_BYTES: u64 = 64 << 10;
/// ...and at most this.
const MAX_STAGING_RING_BYTES: u64 = 2 << 20;
/// Bytes of requests that did not fit the ring (each registered for
/// itself) in flight per connection, at most.
const MAX_OVERFLOW_BYTES_IN_FLIGHT: u64 = 256 << 20;
/// READs/atomics in flight per queue pair and direction, at most.
const MAX_RD_ATOMIC: u32 = 16;
/// Completions handled per driver turn before it yields.
const MAX_COMPLETIONS_PER_TURN: usize = 256;
/// Polling period when the completion channel itself failed.
const FALLBACK_POLL_PERIOD: Duration = Duration::from_millis(10);
/// Largest close notice.
pub(crate) const MAX_NOTICE_BYTES: usize = 256;
/// Time allowed to write a close notice.
const NOTICE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bit of a work request id that marks a receive (sends count from 0).
const RECV_WR_TAG: u64 = 1 << 63;

/// The verbs work completion status as the API names it.
pub(crate) fn wc_error(status: u32) -> WcError {
    use ibv_wc_status::*;
    match status {
        IBV_WC_REM_ACCESS_ERR => WcError::RemoteAccess,
        // A remote operation error (e.g. a SEND longer than the receive
        // buffer) is, for the requester, the peer refusing the request.
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_OP_ERR => WcError::RemoteInvalidRequest,
        IBV_WC_RNR_RETRY_EXC_ERR => WcError::RnrRetryExceeded,
        IBV_WC_RETRY_EXC_ERR => WcError::RetryExceeded,
        IBV_WC_WR_FLUSH_ERR => WcError::Flushed,
        IBV_WC_LOC_LEN_ERR
        | IBV_WC_LOC_QP_OP_ERR
        | IBV_WC_LOC_EEC_OP_ERR
        | IBV_WC_LOC_PROT_ERR
        | IBV_WC_LOC_ACCESS_ERR
        | IBV_WC_LOC_RDD_VIOL_ERR => WcError::LocalError,
        other => WcError::Other(other),
    }
}

/// Sizes of a connection's queues and buffers, from its configuration and
/// the device's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizing {
    pub recv_slots: u32,
    pub recv_slot_bytes: u32,
    pub ring_bytes: usize,
    pub cq_entries: u32,
    pub initiator_depth: u8,
    pub responder_depth: u8,
    /// Largest WRITE/READ: `max_transfer_bytes`, capped by the port.
    pub max_transfer_bytes: u32,
    /// Largest SEND: `max_message_bytes`, capped by the port.
    pub max_message_bytes: u32,
}

impl Sizing {
    pub(crate) fn of(
        config: &ConnConfig,
        max_qp_wr: u32,
        max_cqe: u32,
        max_qp_init_rd_atom: u32,
        max_qp_rd_atom: u32,
        max_msg_sz: u32,
    ) -> Result<Sizing> {
        let recv_slots = config.recv_depth.max(MIN_RECV_SLOTS);
        let recv_memory = u64::from(recv_slots) * u64::from(config.max_message_bytes);
        if recv_memory > MAX_RECV_MEMORY_BYTES {
            return Err(TransportError::Config(format!(
                "max(recv_depth {}, {MIN_RECV_SLOTS}) receive buffers of max_message_bytes {} is {recv_memory} bytes \
                 per connection, above {MAX_RECV_MEMORY_BYTES}",
                config.recv_depth, config.max_message_bytes
            )));
        }
        if config.max_outstanding > max_qp_wr || recv_slots > max_qp_wr {
            return Err(TransportError::Config(format!(
                "max_outstanding {} / {recv_slots} receive buffers: the device queues at most {max_qp_wr} work requests",
                config.max_outstanding
            )));
        }
        let cq_entries = config.max_outstanding.saturating_add(recv_slots);
        if cq_entries > max_cqe {
            return Err(TransportError::Config(format!(
                "{cq_entries} completion queue entries needed, the device allows {max_cqe}"
            )));
        }
        let port_cap = if max_msg_sz == 0 {
            u32::MAX
        } else {
            max_msg_sz
        };
        let depth = |v: u32| v.clamp(1, MAX_RD_ATOMIC) as u8;
        Ok(Sizing {
            recv_slots,
            recv_slot_bytes: config.max_message_bytes,
            ring_bytes: (u64::from(config.max_outstanding) * STAGING_BYTES_PER_OUTSTANDING)
                .clamp(MIN_STAGING_RING_BYTES, MAX_STAGING_RING_BYTES)
                as usize,
            cq_entries,
            initiator_depth: depth(max_qp_init_rd_atom),
            responder_depth: depth(max_qp_rd_atom),
            max_transfer_bytes: config.max_transfer_bytes.min(port_cap),
            max_message_bytes: config.max_message_bytes.min(port_cap),
        })
    }
}

/// The receive buffers' bookkeeping.
struct RecvState {
    /// Buffers neither posted nor holding anything.
    free: Vec<u32>,
    /// Which buffers are posted.
    posted: Vec<bool>,
    /// Messages taken from completions, oldest first.
    queue: VecDeque<Received>,
}

/// Posts `count` receive buffers from `recv.free`.
fn post_receives(
    qp: &QueuePair,
    buffers: &DeviceBuffer,
    slot_bytes: u32,
    recv: &mut RecvState,
    count: u32,
) -> Result<()> {
    if count as usize > recv.free.len() {
        return Err(TransportError::Limit {
            what: "posted receives (a connection holds max(recv_depth, 16) receive buffers)",
            limit: recv.posted.len() as u64,
        });
    }
    for _ in 0..count {
        let Some(slot) = recv.free.pop() else { break };
        let Some(local) = buffers.slice(slot as usize * slot_bytes as usize, slot_bytes as usize)
        else {
            recv.free.push(slot);
            return Err(TransportError::Invalid(format!(
                "receive buffer {slot} out of range"
            )));
        };
        // SAFETY: the slot came from the free list, so no posted request and
        // no reader uses it; it lies in the connection's registered receive
        // memory, which lives until after the queue pair is destroyed (field
        // order of `QpResources` and `Shared`); it is marked posted and read
        // only once its completion has been polled.
        match unsafe { qp.post_recv(RECV_WR_TAG | u64::from(slot), local) } {
            Ok(()) => {
                if let Some(posted) = recv.posted.get_mut(slot as usize) {
                    *posted = true;
                }
            }
            Err(e) => {
                recv.free.push(slot);
                return Err(TransportError::Io {
                    op: "ibv_post_recv".to_string(),
                    source: e,
                });
            }
        }
    }
    Ok(())
}

/// A queue pair and its buffers, before it is connected.
pub(crate) struct QpResources {
    // Field order is drop order: the queue pair first, then what it names.
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    send_staging: DeviceBuffer,
    recv_buffers: DeviceBuffer,
    pd: Arc<ProtectionDomain>,
    recv: RecvState,
    sizing: Sizing,
    psn: u32,
    port: u8,
    port_attributes: PortAttributes,
    gid_index: u8,
    gid: Gid,
    slot: ConnSlot,
}

impl QpResources {
    /// Creates the completion queue, the queue pair (in INIT, every remote
    /// access allowed) and the buffers, and posts `recv_depth` receives.
    /// `local_ip` is the bootstrap socket's address (picks the GID).
    pub(crate) fn create(
        device: &RdmaDevice,
        config: &ConnConfig,
        local_ip: Option<std::net::IpAddr>,
        slot: ConnSlot,
    ) -> Result<QpResources> {
        let name = device.name();
        let io = |what: &str| TransportError::io(format!("{what} on {name}"));
        let port_attributes = device.port_attributes()?;
        let a = &device.attributes;
        let sizing = Sizing::of(
            config,
            a.max_qp_wr,
            a.max_cqe,
            a.max_qp_init_rd_atom,
            a.max_qp_rd_atom,
            port_attributes.max_msg_sz,
        )?;
        let (gid_index, gid) = device.local_gid(local_ip)?;
        let cq = CompletionQueue::new(&device.context, sizing.cq_entries)
            .map_err(io("ibv_create_cq"))?;
        let qp = QueuePair::new(
            &device.pd,
            &cq,
            QueuePairCaps {
                max_send_wr: config.max_outstanding,
                max_recv_wr: sizing.recv_slots,
            },
        )
        .map_err(io("ibv_create_qp"))?;
        qp.to_init(device.port, AccessFlags::from_access(Access::ALL_REMOTE))
            .map_err(io("ibv_modify_qp RESET->INIT"))?;
        let send_staging =
            DeviceBuffer::new(&device.pd, sizing.ring_bytes).map_err(io("staging registration"))?;
        let recv_bytes = sizing.recv_slots as usize * sizing.recv_slot_bytes as usize;
        let recv_buffers =
            DeviceBuffer::new(&device.pd, recv_bytes).map_err(io("receive buffer registration"))?;
        let mut recv = RecvState {
            free: (0..sizing.recv_slots).rev().collect(),
            posted: vec![false; sizing.recv_slots as usize],
            queue: VecDeque::new(),
        };
        post_receives(
            &qp,
            &recv_buffers,
            sizing.recv_slot_bytes,
            &mut recv,
            config.recv_depth,
        )?;
        Ok(QpResources {
            qp,
            cq,
            send_staging,
            recv_buffers,
            pd: device.pd.clone(),
            recv,
            sizing,
            psn: rand::random::<u32>() & MAX_24_BIT,
            port: device.port,
            port_attributes,
            gid_index,
            gid,
            slot,
        })
    }

    /// What the peer needs to know of this queue pair.
    pub(crate) fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: self.gid.0,
            lid: self.port_attributes.lid,
            mtu: u8::try_from(self.port_attributes.active_mtu)
                .unwrap_or(1)
                .clamp(1, 5),
            recv_buffer_bytes: self.sizing.recv_slot_bytes,
            max_dest_rd_atomic: self.sizing.responder_depth,
        }
    }

    /// INIT -> RTR -> RTS towards `peer`.
    pub(crate) fn bring_up(&self, peer: &QpEndpoint, config: &ConnConfig) -> Result<()> {
        let io = |what: &str| {
            TransportError::io(format!("ibv_modify_qp {what} (peer qpn {:#x})", peer.qpn))
        };
        let our_mtu = u8::try_from(self.port_attributes.active_mtu)
            .unwrap_or(1)
            .clamp(1, 5);
        self.qp
            .to_rtr(&ReadyToReceive {
                port: self.port,
                path_mtu: u32::from(our_mtu.min(peer.mtu)),
                dest_qpn: peer.qpn,
                rq_psn: peer.psn,
                max_dest_rd_atomic: self.sizing.responder_depth,
                min_rnr_timer: rnr_timer_code(config.rnr_delay),
                global: self.port_attributes.link_layer == LINK_LAYER_ETHERNET,
                dgid: Gid(peer.gid),
                sgid_index: self.gid_index,
                dlid: peer.lid,
            })
            .map_err(io("INIT->RTR"))?;
        self.qp
            .to_rts(&ReadyToSend {
                sq_psn: self.psn,
                timeout: config.ack_timeout_exp.clamp(1, 31),
                retry_cnt: config.retry_count.min(ConnConfig::MAX_RETRY),
                rnr_retry: config.rnr_retry.min(ConnConfig::MAX_RETRY),
                max_rd_atomic: self.sizing.initiator_depth.min(peer.max_dest_rd_atomic),
            })
            .map_err(io("RTR->RTS"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Write,
    WriteImm,
    Read { len: u32 },
    CompareSwap,
    FetchAdd,
    Send,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::Write => "WRITE",
            OpKind::WriteImm => "WRITE_WITH_IMM",
            OpKind::Read { .. } => "READ",
            OpKind::CompareSwap => "CMP_AND_SWP",
            OpKind::FetchAdd => "FETCH_AND_ADD",
            OpKind::Send => "SEND",
        }
    }
}

/// Where a request's local bytes are.
enum Staging {
    None,
    Ring(Piece),
    Own(DeviceBuffer),
}

struct PendingWr {
    seq: u64,
    kind: OpKind,
    staging: Staging,
    deadline: Instant,
    /// `None` once the caller has its result (or was given up on).
    done: Option<oneshot::Sender<Result<Done, WcError>>>,
    /// The device reported it (its staging may go once older ones did).
    completed: bool,
}

struct SendState {
    next_seq: u64,
    /// Posted requests whose completion has not been polled, or whose
    /// staging waits for an older one: posting order.
    pending: VecDeque<PendingWr>,
    ring: StagingRing,
    overflow_bytes: u64,
}

/// Everything the connection's handles and tasks share.
struct Shared {
    // Field order is drop order: the queue pair is destroyed first, so the
    // device no longer touches the staging and receive memory below (nor
    // the overflow registrations held in `send`).
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    send_staging: DeviceBuffer,
    recv_buffers: DeviceBuffer,
    pd: Arc<ProtectionDomain>,
    send: Mutex<SendState>,
    recv: Mutex<RecvState>,
    /// The cause, once in the error state.
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    driver_wake: Notify,
    driver_parked: AtomicBool,
    recv_ready: Notify,
    recv_waiters: AtomicU32,
    close_notice: Mutex<Option<oneshot::Sender<String>>>,
    /// The peer's close notice (or the end of the bootstrap stream), for the
    /// driver to act on once it has delivered what the device already
    /// reported (a peer that refused our request closes at once, and its
    /// notice must not hide the device's own error completion).
    peer_closed: Mutex<Option<String>>,
    /// The poll lock, with its batch buffer: one thread polls at a time, so
    /// completions are handled in the device's order (receives stay in
    /// order).
    poller: Mutex<Vec<WorkCompletion>>,
    sizing: Sizing,
    config: ConnConfig,
    peer_addr: String,
    _slot: ConnSlot,
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

    /// Staging for `len` local bytes.
    fn stage(&self, send: &mut SendState, len: usize) -> Result<Staging> {
        if len == 0 {
            return Ok(Staging::None);
        }
        if let Some(piece) = send.ring.allocate(len) {
            return Ok(Staging::Ring(piece));
        }
        if send.overflow_bytes.saturating_add(len as u64) > MAX_OVERFLOW_BYTES_IN_FLIGHT {
            return Err(TransportError::Limit {
                what: "staged bytes in flight beyond the connection's staging ring",
                limit: MAX_OVERFLOW_BYTES_IN_FLIGHT,
            });
        }
        let buffer = DeviceBuffer::new(&self.pd, len).map_err(TransportError::io(format!(
            "staging registration of {len} bytes"
        )))?;
        send.overflow_bytes += len as u64;
        Ok(Staging::Own(buffer))
    }

    /// Gives back the staging of a request that was never posted.
    fn unstage(&self, send: &mut SendState, staging: Staging) {
        match staging {
            Staging::None => {}
            Staging::Ring(piece) => {
                let ok = send.ring.unallocate(piece);
                debug_assert!(ok, "the newest piece is taken back under the send lock");
            }
            Staging::Own(buffer) => {
                send.overflow_bytes = send.overflow_bytes.saturating_sub(buffer.len() as u64)
            }
        }
    }

    /// Gives back the staging of a request the device is done with.
    fn release(&self, send: &mut SendState, staging: Staging) {
        match staging {
            Staging::None => {}
            Staging::Ring(piece) => {
                if !send.ring.release(piece) {
                    debug_assert!(false, "staging released out of order");
                    tracing::error!(peer = %self.peer_addr, "staging released out of order");
                }
            }
            Staging::Own(buffer) => {
                send.overflow_bytes = send.overflow_bytes.saturating_sub(buffer.len() as u64)
            }
        }
    }

    fn slice(&self, staging: &Staging, len: usize) -> Option<super::qp::LocalSlice> {
        match staging {
            Staging::None => None,
            Staging::Ring(piece) => self.send_staging.slice(piece.offset, len),
            Staging::Own(buffer) => buffer.slice(0, len),
        }
    }

    fn write_staging(&self, staging: &Staging, data: &[u8]) -> Option<()> {
        match staging {
            Staging::None => data.is_empty().then_some(()),
            Staging::Ring(piece) => self.send_staging.write(piece.offset, data),
            Staging::Own(buffer) => buffer.write(0, data),
        }
    }

    /// What a successfully completed request returns.
    fn result_of(&self, kind: OpKind, staging: &Staging) -> Option<Done> {
        let (buffer, offset) = match staging {
            Staging::None => (None, 0),
            Staging::Ring(piece) => (Some(&self.send_staging), piece.offset),
            Staging::Own(buffer) => (Some(buffer), 0),
        };
        Some(match kind {
            OpKind::Read { len } => match buffer {
                Some(b) => Done::Data(b.read(offset, len as usize)?),
                None => Done::Data(Vec::new()),
            },
            // The original value, in host byte order as rxe leaves it.
            OpKind::CompareSwap | OpKind::FetchAdd => Done::Word(buffer?.read_u64(offset)?),
            OpKind::Write | OpKind::WriteImm | OpKind::Send => Done::Ok,
        })
    }

    fn post(&self, request: Request) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        self.check_ready()?;
        // The port may allow less than the configuration asked for.
        crate::limits::check_request(
            &request,
            self.sizing.max_transfer_bytes,
            self.sizing.max_message_bytes,
        )?;
        let (kind, op, data, local_len) = match request {
            Request::Write {
                addr,
                rkey,
                data,
                imm,
            } => {
                let kind = if imm.is_some() {
                    OpKind::WriteImm
                } else {
                    OpKind::Write
                };
                let len = data.len();
                (
                    kind,
                    SendOp::Write {
                        remote_addr: addr,
                        rkey,
                        imm,
                    },
                    data,
                    len,
                )
            }
            Request::Read { addr, rkey, len } => (
                OpKind::Read { len },
                SendOp::Read {
                    remote_addr: addr,
                    rkey,
                },
                Vec::new(),
                len as usize,
            ),
            Request::CompareSwap {
                addr,
                rkey,
                expected,
                new,
            } => (
                OpKind::CompareSwap,
                SendOp::CompareSwap {
                    remote_addr: addr,
                    rkey,
                    expected,
                    new,
                },
                Vec::new(),
                8,
            ),
            Request::FetchAdd { addr, rkey, add } => (
                OpKind::FetchAdd,
                SendOp::FetchAdd {
                    remote_addr: addr,
                    rkey,
                    add,
                },
                Vec::new(),
                8,
            ),
            Request::Send { data } => {
                let len = data.len();
                (OpKind::Send, SendOp::Send, data, len)
            }
        };
        let mut send = lock(&self.send);
        // Under the send lock: `fail` flushes what it finds under this lock,
        // after setting `failed`.
        self.check_ready()?;
        if send.pending.len() >= self.config.max_outstanding as usize {
            return Err(TransportError::Limit {
                what: "outstanding work requests",
                limit: u64::from(self.config.max_outstanding),
            });
        }
        let staging = self.stage(&mut send, local_len)?;
        let local = self.slice(&staging, local_len);
        if self.write_staging(&staging, &data).is_none() || (local_len > 0 && local.is_none()) {
            self.unstage(&mut send, staging);
            return Err(TransportError::Invalid(format!(
                "{local_len} bytes do not fit the staging given to them"
            )));
        }
        let seq = send.next_seq;
        // SAFETY: `local` names staging this request owns from now on: a ring
        // piece (released only once this request's completion has been polled
        // and every older one's too) or a registration of its own (kept in the
        // pending entry). Both live until after the queue pair is destroyed
        // (`Shared` field order). The CPU writes the staging only before
        // posting and reads it only after the completion.
        if let Err(e) = unsafe { self.qp.post_send(seq, op, local) } {
            self.unstage(&mut send, staging);
            drop(send);
            if self.failed.load(Ordering::Acquire) {
                return Err(self.broken());
            }
            let error = TransportError::Io {
                op: format!("ibv_post_send of {} to {}", kind.name(), self.peer_addr),
                source: e,
            };
            self.fail(error.to_string());
            return Err(error);
        }
        send.next_seq += 1;
        let (done, rx) = oneshot::channel();
        send.pending.push_back(PendingWr {
            seq,
            kind,
            staging,
            deadline: Instant::now() + self.config.op_deadline(),
            done: Some(done),
            completed: false,
        });
        drop(send);
        self.try_drain();
        if self.config.busy_poll && self.driver_parked.load(Ordering::SeqCst) {
            self.driver_wake.notify_one();
        }
        Ok(rx)
    }

    fn complete_send(&self, wc: &WorkCompletion) {
        let mut send = lock(&self.send);
        let front_seq = send.pending.front().map(|p| p.seq);
        let index = front_seq
            .and_then(|front| wc.wr_id.checked_sub(front))
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < send.pending.len());
        let Some(index) = index else {
            tracing::warn!(peer = %self.peer_addr, wr_id = wc.wr_id, "completion of no posted request");
            return;
        };
        let entry = &mut send.pending[index];
        if entry.completed {
            tracing::warn!(peer = %self.peer_addr, wr_id = wc.wr_id, "second completion of one request");
            return;
        }
        entry.completed = true;
        let (kind, seq) = (entry.kind, entry.seq);
        let done = entry.done.take();
        let result = if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            Err(wc_error(wc.status))
        } else if done.is_some() {
            self.result_of(kind, &entry.staging)
                .ok_or(WcError::LocalError)
        } else {
            Ok(Done::Ok)
        };
        while send.pending.front().is_some_and(|p| p.completed) {
            if let Some(finished) = send.pending.pop_front() {
                self.release(&mut send, finished.staging);
            }
        }
        drop(send);
        // The error state first: a caller that sees the error finds the
        // connection broken.
        if let Err(error) = &result {
            self.fail(format!(
                "{} #{seq} failed: {error} (status {}, vendor error {:#x})",
                kind.name(),
                wc.status,
                wc.vendor_err
            ));
        }
        if let Some(done) = done {
            let _ = done.send(result);
        }
    }

    fn complete_recv(&self, wc: &WorkCompletion) {
        let slot = wc.wr_id & !RECV_WR_TAG;
        let mut recv = lock(&self.recv);
        let Some(slot) = usize::try_from(slot)
            .ok()
            .filter(|s| recv.posted.get(*s) == Some(&true))
        else {
            tracing::warn!(peer = %self.peer_addr, wr_id = wc.wr_id, "completion of no posted receive");
            return;
        };
        recv.posted[slot] = false;
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            recv.free.push(slot as u32);
            drop(recv);
            let cause = if wc.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                "the device put the queue pair in the error state (receives flushed): \
                 after a peer's invalid or unauthorized request, or a device error"
                    .to_string()
            } else {
                format!(
                    "receive failed: {} (status {}, vendor error {:#x})",
                    wc_error(wc.status),
                    wc.status,
                    wc.vendor_err
                )
            };
            self.fail(cause);
            return;
        }
        let slot_bytes = self.sizing.recv_slot_bytes as usize;
        let message = match wc.opcode {
            ibv_wc_opcode::IBV_WC_RECV => {
                let len = (wc.byte_len as usize).min(slot_bytes);
                self.recv_buffers
                    .read(slot * slot_bytes, len)
                    .map(Received::Message)
            }
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => wc.imm.map(Received::WriteImmediate),
            _ => None,
        };
        recv.free.push(slot as u32);
        let Some(message) = message else {
            drop(recv);
            self.fail(format!(
                "unexpected receive completion (opcode {}, imm {:?})",
                wc.opcode, wc.imm
            ));
            return;
        };
        recv.queue.push_back(message);
        drop(recv);
        self.recv_ready.notify_waiters();
    }

    /// Polls the completion queue dry (bounded per turn); returns how many
    /// completions were handled.
    fn drain(&self) -> usize {
        let mut batch = lock(&self.poller);
        self.drain_locked(&mut batch, MAX_COMPLETIONS_PER_TURN)
    }

    /// One poll, unless another thread is polling: used where a completion
    /// is likely already there (on rxe a loopback WRITE executes, and is
    /// acknowledged, inside `ibv_post_send`), to hand it over without
    /// waking the driver.
    fn try_drain(&self) -> usize {
        match self.poller.try_lock() {
            Ok(mut batch) => self.drain_locked(&mut batch, POLL_BATCH),
            Err(_) => 0,
        }
    }

    fn drain_locked(&self, batch: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut handled = 0;
        while handled < max {
            batch.clear();
            match self.cq.poll(batch, POLL_BATCH) {
                Ok(0) => break,
                Ok(n) => {
                    handled += n;
                    for wc in batch.iter() {
                        if wc.wr_id & RECV_WR_TAG != 0 {
                            self.complete_recv(wc);
                        } else {
                            self.complete_send(wc);
                        }
                    }
                }
                Err(e) => {
                    self.fail(format!("ibv_poll_cq: {e}"));
                    break;
                }
            }
        }
        handled
    }

    /// Our own deadline above the verbs' retries. Returns when to look
    /// again.
    fn enforce_deadlines(&self) -> Option<Instant> {
        if self.failed.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let mut send = lock(&self.send);
        let oldest = send.pending.iter_mut().find(|p| p.done.is_some())?;
        if oldest.deadline > now {
            return Some(oldest.deadline);
        }
        let (seq, kind, done) = (oldest.seq, oldest.kind, oldest.done.take());
        drop(send);
        self.fail(format!(
            "{} #{seq} not completed within {:?} (our deadline above the verbs retries): the peer is unreachable or stalled",
            kind.name(),
            self.config.op_deadline()
        ));
        if let Some(done) = done {
            let _ = done.send(Err(WcError::RetryExceeded));
        }
        None
    }

    /// In error: no caller waits for a request any more (`fail` completed
    /// them all), so the driver can stop. Staging still named by posted
    /// requests stays allocated until the queue pair is destroyed.
    fn finished(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Whether busy-polling has something to wait for.
    fn busy(&self) -> bool {
        self.recv_waiters.load(Ordering::SeqCst) > 0 || !lock(&self.send).pending.is_empty()
    }
}

/// The completion driver: one task per connection.
async fn drive(shared: Arc<Shared>, events: AsyncFd<ChannelFd>) {
    let mut armed = false;
    let mut events_ok = true;
    loop {
        let handled = shared.drain();
        if let Some(cause) = lock(&shared.peer_closed).take() {
            shared.fail(cause);
        }
        let next = shared.enforce_deadlines();
        if shared.finished() {
            return;
        }
        if handled >= MAX_COMPLETIONS_PER_TURN || (shared.config.busy_poll && shared.busy()) {
            tokio::task::yield_now().await;
            continue;
        }
        if events_ok && !armed {
            match shared.cq.request_notify() {
                Ok(()) => armed = true,
                Err(e) => {
                    events_ok = false;
                    shared.fail(format!("ibv_req_notify_cq: {e}"));
                }
            }
            // Poll once more: a completion may have come before arming.
            continue;
        }
        shared.driver_parked.store(true, Ordering::SeqCst);
        if shared.config.busy_poll && shared.busy() {
            shared.driver_parked.store(false, Ordering::SeqCst);
            continue;
        }
        let mut wake_at = next.unwrap_or_else(|| Instant::now() + shared.config.op_deadline());
        if !events_ok {
            wake_at = wake_at.min(Instant::now() + FALLBACK_POLL_PERIOD);
        }
        tokio::select! {
            ready = events.readable(), if events_ok => match ready {
                Ok(mut guard) => match shared.cq.take_event() {
                    Ok(()) => {
                        // One event per arming, and the queue is armed again
                        // only after it is drained: nothing else can be in the
                        // channel now, so skip the read that would say so.
                        guard.clear_ready();
                        armed = false;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                    Err(e) => {
                        events_ok = false;
                        shared.fail(format!("ibv_get_cq_event: {e}"));
                    }
                },
                Err(e) => {
                    events_ok = false;
                    shared.fail(format!("completion channel: {e}"));
                }
            },
            () = tokio::time::sleep_until(wake_at) => {}
            () = shared.driver_wake.notified() => {}
        }
        shared.driver_parked.store(false, Ordering::SeqCst);
    }
}

/// Watches the bootstrap stream: sends our close notice, or fails the
/// connection when the peer's notice or end arrives.
async fn watch_bootstrap(
    stream: TcpStream,
    shared: Weak<Shared>,
    notice: oneshot::Receiver<String>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = [0u8; MAX_NOTICE_BYTES];
    tokio::select! {
        reason = notice => {
            if let Ok(reason) = reason {
                let _ = tokio::time::timeout(NOTICE_WRITE_TIMEOUT, writer.write_all(truncate_utf8(&reason, MAX_NOTICE_BYTES))).await;
            }
            let _ = tokio::time::timeout(NOTICE_WRITE_TIMEOUT, writer.shutdown()).await;
        }
        read = reader.read(&mut buf) => {
            let cause = match read {
                Ok(0) => "the peer closed the connection (bootstrap stream ended)".to_string(),
                Ok(n) => format!("closed by the peer: {}", String::from_utf8_lossy(&buf[..n])),
                Err(e) => format!("bootstrap stream to the peer failed: {e}"),
            };
            if let Some(shared) = shared.upgrade() {
                *lock(&shared.peer_closed) = Some(cause);
                shared.driver_wake.notify_one();
            }
        }
    }
}

fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

struct ConnHandle {
    shared: Arc<Shared>,
    peer: PeerInfo,
    driver: tokio::task::AbortHandle,
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.shared.fail("connection dropped".to_string());
        // The driver holds the last strong reference but one: once it is
        // gone, the queue pair is destroyed, then its memory freed.
        self.driver.abort();
    }
}

/// Counts a receiver waiting in `recv` (busy-polling spins for it).
struct RecvWaiter<'a>(&'a Shared);

impl<'a> RecvWaiter<'a> {
    fn enter(shared: &'a Shared) -> RecvWaiter<'a> {
        shared.recv_waiters.fetch_add(1, Ordering::SeqCst);
        if shared.config.busy_poll && shared.driver_parked.load(Ordering::SeqCst) {
            shared.driver_wake.notify_one();
        }
        RecvWaiter(shared)
    }
}

impl Drop for RecvWaiter<'_> {
    fn drop(&mut self) {
        self.0.recv_waiters.fetch_sub(1, Ordering::SeqCst);
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

    /// The local queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.shared.qp.qpn()
    }

    /// Posts a work request now; the receiver resolves with its completion.
    pub(crate) fn post(
        &self,
        request: Request,
    ) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        self.inner.shared.post(request)
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
