//! A reliable-connected queue pair of the software RNIC, over any ordered
//! frame channel (a TCP stream, or an in-process link).
//!
//! - Requester: work requests get a sequence number and go out in posting
//!   order; the peer answers them in the same order, so completions arrive
//!   in order. A request not answered within the transport's retry window
//!   completes with `RetryExceeded`.
//! - Responder ([`responder`]): the peer's requests execute one by one, in
//!   order (RC ordering: a WRITE lands before the SEND posted after it is
//!   delivered), in the backend's reader when they need not wait, else in a
//!   task of the queue pair's own. A SEND that finds no posted receive waits
//!   as a real requester would retry after a receiver-not-ready NAK, for the
//!   peer's `rnr_retry` × `rnr_delay`, then fails with `RnrRetryExceeded`.
//! - Error state: the first failed request, a lost wire, a protocol
//!   violation or a local close moves the queue pair to the error state:
//!   every outstanding request completes with `Flushed`, new posts fail, and
//!   the peer is told. A connection in error is never reused.

mod responder;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::nic::SoftNic;
use crate::error::{Result, TransportError, WcError};
use crate::types::{Access, ConnConfig, Received};
use crate::work::{Done, Request};
pub(crate) use responder::Inbound;

/// What crosses the wire after the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Frame {
    Req {
        seq: u64,
        req: Request,
    },
    Resp {
        seq: u64,
        result: Result<Done, WcError>,
    },
    /// A cumulative acknowledgement: every request up to `upto` (in order,
    /// after those answered before) completed without a result to carry:
    /// WRITEs and SENDs (`Done::Ok`). One frame for a burst of them
    /// instead of one answer each.
    Ack {
        upto: u64,
    },
    Close {
        reason: String,
    },
}

impl Frame {
    /// An answer to requests (a response or a cumulative acknowledgement).
    pub(crate) fn is_answer(&self) -> bool {
        matches!(self, Frame::Resp { .. } | Frame::Ack { .. })
    }
}

/// Largest frame any connection takes (its decoder's limit): the largest
/// `max_transfer_bytes` allowed plus headers. Each connection takes no
/// more than its own [`ConnConfig::max_frame_bytes`].
pub(crate) const MAX_FRAME_BYTES: usize = (1 << 30) + 4096;
/// Responses queued for the wire before the responder waits.
const RESPONSE_QUEUE: usize = 1024;
/// Requests from the peer queued for the responder task: beyond this the
/// peer is flooding and the connection fails.
const REQUEST_BACKLOG: usize = 16 * 1024;

/// The endpoint description a software queue pair reveals in the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SoftEndpoint {
    pub rnr_retry: u8,
    pub rnr_delay_us: u64,
}

impl SoftEndpoint {
    pub(crate) fn of(config: &ConnConfig) -> SoftEndpoint {
        SoftEndpoint {
            rnr_retry: config.rnr_retry,
            rnr_delay_us: config.rnr_delay.as_micros() as u64,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard()).expect("encodes")
    }

    pub(crate) fn decode(bytes: &[u8], peer: &str) -> Result<SoftEndpoint> {
        let (endpoint, _): (SoftEndpoint, _) =
            bincode::serde::decode_from_slice(bytes, bincode::config::standard()).map_err(|e| {
                TransportError::Protocol {
                    peer: peer.to_string(),
                    reason: format!("bad endpoint description: {e}"),
                }
            })?;
        if endpoint.rnr_retry > ConnConfig::MAX_RETRY || endpoint.rnr_delay_us > 10_000_000 {
            return Err(TransportError::Protocol {
                peer: peer.to_string(),
                reason: format!("endpoint parameters out of bounds: {endpoint:?}"),
            });
        }
        Ok(endpoint)
    }
}

/// The two directions a backend provides: frames to send (requests on an
/// unbounded channel, since posts are limited by `max_outstanding`;
/// responses on a bounded one) and frames received.
pub(crate) struct Wire {
    pub requests: mpsc::UnboundedSender<Frame>,
    pub responses: mpsc::Sender<Frame>,
    pub incoming: Incoming,
    /// Asked at each WRITE that arrives (the inproc fabric's late
    /// landings; `None` elsewhere).
    pub gate: Option<WriteGate>,
}

/// Asked at each WRITE that arrives: `None` to execute it now; or a future
/// after which the WRITE, admitted now (its rkey checked), is copied
/// (`true`) or fails at the NIC (`false`).
pub(crate) type WriteGate =
    Arc<dyn Fn() -> Option<std::pin::Pin<Box<dyn Future<Output = bool> + Send>>> + Send + Sync>;

/// How received frames reach the queue pair.
pub(crate) enum Incoming {
    /// On a channel the backend fills (inproc); a task of the queue pair
    /// reads it.
    Channel(mpsc::UnboundedReceiver<Frame>),
    /// The backend's reader (tcp), started with the queue pair's
    /// [`Inbound`], hands it each frame itself.
    Reader(Box<dyn FnOnce(Inbound) + Send>),
}

/// The channels a backend drains to the peer.
pub(crate) struct WireOut {
    pub requests: mpsc::UnboundedReceiver<Frame>,
    pub responses: mpsc::Receiver<Frame>,
}

/// Builds the channel pairs of a wire whose received frames the backend
/// puts on the returned sender.
pub(crate) fn wire() -> (Wire, WireOut, mpsc::UnboundedSender<Frame>) {
    let (in_tx, in_rx) = mpsc::unbounded_channel();
    let (wire, out) = wire_read_by(Incoming::Channel(in_rx));
    (wire, out, in_tx)
}

/// Builds the outgoing channels of a wire; frames come in by `incoming`.
pub(crate) fn wire_read_by(incoming: Incoming) -> (Wire, WireOut) {
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (resp_tx, resp_rx) = mpsc::channel(RESPONSE_QUEUE);
    (
        Wire {
            requests: req_tx,
            responses: resp_tx,
            incoming,
            gate: None,
        },
        WireOut {
            requests: req_rx,
            responses: resp_rx,
        },
    )
}

struct Pending {
    seq: u64,
    deadline: Instant,
    /// A WRITE or a SEND: a cumulative acknowledgement may complete it.
    acked: bool,
    done: oneshot::Sender<Result<Done, WcError>>,
}

struct Requester {
    next_seq: u64,
    queue: VecDeque<Pending>,
}

struct RecvState {
    posted: u32,
    queue: VecDeque<Received>,
}

struct Shared {
    nic: Arc<SoftNic>,
    gate: Option<WriteGate>,
    peer: String,
    config: ConnConfig,
    peer_endpoint: SoftEndpoint,
    requests: mpsc::UnboundedSender<Frame>,
    /// `None` while ready; the cause once in the error state.
    error: Mutex<Option<String>>,
    requester: Mutex<Requester>,
    qp_access: AtomicU32,
    /// What the reader handed to the responder task and the task has not
    /// answered yet: while above zero, every request goes there, in order.
    slow: AtomicUsize,
    /// The data bytes of the requests handed to the responder task and not
    /// executed yet (at most `config.max_backlog_bytes`).
    slow_bytes: AtomicUsize,
    recv: Mutex<RecvState>,
    recv_ready: Notify,
    recv_posted: Notify,
}

/// A software queue pair. Cloning shares it.
#[derive(Clone)]
pub(crate) struct SoftConn {
    shared: Arc<Shared>,
}

impl SoftConn {
    /// Starts the queue pair's tasks over `wire`.
    pub(crate) fn start(
        nic: Arc<SoftNic>,
        peer: String,
        config: ConnConfig,
        peer_endpoint: SoftEndpoint,
        wire: Wire,
    ) -> SoftConn {
        let Wire {
            requests,
            responses,
            incoming,
            gate,
        } = wire;
        let shared = Arc::new(Shared {
            nic,
            gate,
            peer,
            peer_endpoint,
            requests,
            error: Mutex::new(None),
            requester: Mutex::new(Requester {
                next_seq: 0,
                queue: VecDeque::new(),
            }),
            qp_access: AtomicU32::new((Access::ALL_REMOTE | Access::LOCAL_WRITE).bits()),
            slow: AtomicUsize::new(0),
            slow_bytes: AtomicUsize::new(0),
            recv: Mutex::new(RecvState {
                posted: config.recv_depth,
                queue: VecDeque::new(),
            }),
            recv_ready: Notify::new(),
            recv_posted: Notify::new(),
            config,
        });
        let inbound = Inbound::start(shared.clone(), responses);
        match incoming {
            Incoming::Channel(incoming) => {
                tokio::spawn(inbound.drain(incoming));
            }
            Incoming::Reader(start) => start(inbound),
        }
        tokio::spawn(watchdog(Arc::downgrade(&shared)));
        SoftConn { shared }
    }

    pub(crate) fn config(&self) -> &ConnConfig {
        &self.shared.config
    }

    /// Posts a request; the receiver completes when the peer answers.
    pub(crate) fn post(&self, req: Request) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        let mut posted = self.post_chain(vec![req])?;
        Ok(posted.pop().expect("one receiver per request"))
    }

    /// Posts `requests` in order, all or none: their frames reach the
    /// writer together, so they leave in one `write(2)` when they fit.
    pub(crate) fn post_chain(
        &self,
        requests: Vec<Request>,
    ) -> Result<Vec<oneshot::Receiver<Result<Done, WcError>>>> {
        let s = &self.shared;
        s.check_ready()?;
        let mut requester = s.requester.lock().expect("requester lock");
        if requester.queue.len() + requests.len() > s.config.max_outstanding as usize {
            return Err(TransportError::Limit {
                what: "outstanding work requests",
                limit: s.config.max_outstanding as u64,
            });
        }
        let mut receivers = Vec::with_capacity(requests.len());
        let deadline = Instant::now() + s.config.op_deadline();
        for req in requests {
            let (done, rx) = oneshot::channel();
            let seq = requester.next_seq;
            requester.next_seq += 1;
            requester.queue.push_back(Pending {
                seq,
                deadline,
                acked: matches!(req, Request::Write { .. } | Request::Send { .. }),
                done,
            });
            // Under the lock: frames leave in sequence order.
            if s.requests.send(Frame::Req { seq, req }).is_err() {
                drop(requester);
                s.fail("the wire is closed".into(), None);
                return Err(s.broken());
            }
            receivers.push(rx);
        }
        drop(requester);
        Ok(receivers)
    }

    pub(crate) fn post_recv(&self, count: u32) -> Result<()> {
        let s = &self.shared;
        s.check_ready()?;
        let mut recv = s.recv.lock().expect("recv lock");
        let total = recv.posted as u64 + count as u64;
        if total > 16 * 1024 {
            return Err(TransportError::Limit {
                what: "posted receives",
                limit: 16 * 1024,
            });
        }
        recv.posted = total as u32;
        drop(recv);
        s.recv_posted.notify_waiters();
        Ok(())
    }

    pub(crate) async fn recv(&self) -> Result<Received> {
        let s = &self.shared;
        loop {
            let notified = s.recv_ready.notified();
            {
                let mut recv = s.recv.lock().expect("recv lock");
                if let Some(message) = recv.queue.pop_front() {
                    if s.config.auto_repost {
                        recv.posted += 1;
                        drop(recv);
                        s.recv_posted.notify_waiters();
                    }
                    return Ok(message);
                }
            }
            s.check_ready()?;
            notified.await;
        }
    }

    pub(crate) fn set_remote_access(&self, access: Access) -> Result<()> {
        self.shared.check_ready()?;
        self.shared
            .qp_access
            .store(access.bits(), Ordering::Release);
        Ok(())
    }

    pub(crate) fn broken(&self) -> Option<String> {
        self.shared.error.lock().expect("state lock").clone()
    }

    /// Moves the queue pair to the error state.
    pub(crate) fn close(&self, reason: &str) {
        self.shared.fail(reason.to_string(), None);
    }
}

impl Shared {
    fn check_ready(&self) -> Result<()> {
        let cause = self.error.lock().expect("state lock").clone();
        match cause {
            None => Ok(()),
            Some(cause) => Err(TransportError::Broken {
                peer: self.peer.clone(),
                cause,
            }),
        }
    }

    fn broken(&self) -> TransportError {
        self.check_ready()
            .err()
            .unwrap_or_else(|| TransportError::Broken {
                peer: self.peer.clone(),
                cause: "unknown".into(),
            })
    }

    /// Enters the error state (once): completes the first outstanding request
    /// with `first` when given, every other with `Flushed`, wakes receivers
    /// and tells the peer.
    /// The peer broke the protocol or a limit: logged, then the error
    /// state (the peer is told why).
    fn violated(&self, cause: String) {
        if self.error.lock().expect("state lock").is_none() {
            tracing::warn!(peer = %self.peer, %cause, "closing the connection");
        }
        self.fail(format!("protocol: {cause}"), None);
    }

    fn fail(&self, cause: String, first: Option<WcError>) {
        {
            let mut error = self.error.lock().expect("state lock");
            if error.is_some() {
                return;
            }
            tracing::debug!(peer = %self.peer, %cause, "queue pair enters the error state");
            *error = Some(cause.clone());
        }
        let drained: Vec<Pending> = {
            let mut requester = self.requester.lock().expect("requester lock");
            requester.queue.drain(..).collect()
        };
        for (i, pending) in drained.into_iter().enumerate() {
            let error = match (i, first) {
                (0, Some(e)) => e,
                _ => WcError::Flushed,
            };
            let _ = pending.done.send(Err(error));
        }
        self.recv_ready.notify_waiters();
        self.recv_posted.notify_waiters();
        let _ = self.requests.send(Frame::Close { reason: cause });
    }

    fn complete(&self, seq: u64, result: Result<Done, WcError>) {
        let pending = {
            let mut requester = self.requester.lock().expect("requester lock");
            match requester.queue.front() {
                Some(p) if p.seq == seq => requester.queue.pop_front(),
                _ => None,
            }
        };
        let Some(pending) = pending else {
            self.violated(format!("answer {seq} out of order"));
            return;
        };
        match result {
            Ok(done) => {
                let _ = pending.done.send(Ok(done));
            }
            Err(error) => {
                // Verbs: a failed request moves the requester's queue pair to
                // the error state and flushes the rest, before its completion
                // is seen.
                self.fail(format!("{error}"), None);
                let _ = pending.done.send(Err(error));
            }
        }
    }

    /// Completes the outstanding requests up to `upto` with `Done::Ok` (a
    /// cumulative acknowledgement). It must cover at least the oldest, and
    /// only WRITEs and SENDs: anything else is a protocol error.
    fn complete_upto(&self, upto: u64) {
        let mut completed = Vec::new();
        let violation = {
            let mut requester = self.requester.lock().expect("requester lock");
            loop {
                match requester.queue.front() {
                    Some(p) if p.seq <= upto && p.acked => {
                        completed.push(requester.queue.pop_front().expect("front"));
                    }
                    Some(p) if p.seq <= upto => {
                        break Some(format!(
                            "an acknowledgement up to {upto} covers request {} that returns a result",
                            p.seq
                        ));
                    }
                    _ => break None,
                }
            }
        };
        let violation = violation.or_else(|| {
            (completed.last().map(|p| p.seq) != Some(upto))
                .then(|| format!("an acknowledgement up to {upto} out of order"))
        });
        for pending in completed {
            let _ = pending.done.send(Ok(Done::Ok));
        }
        if let Some(violation) = violation {
            self.violated(violation);
        }
    }

    /// Whether a receive is posted.
    fn receive_posted(&self) -> bool {
        self.recv.lock().expect("recv lock").posted > 0
    }

    /// Consumes a posted receive, if there is one.
    fn take_receive_now(&self) -> bool {
        let mut recv = self.recv.lock().expect("recv lock");
        let posted = recv.posted > 0;
        if posted {
            recv.posted -= 1;
        }
        posted
    }

    /// Waits until a receive is posted, as long as the peer's
    /// receiver-not-ready retries allow. True when one was consumed.
    async fn take_receive(&self) -> bool {
        let tries = self.peer_endpoint.rnr_retry as u32 + 1;
        let delay = Duration::from_micros(self.peer_endpoint.rnr_delay_us.max(1));
        let deadline = Instant::now() + delay * tries;
        loop {
            let posted = self.recv_posted.notified();
            if self.take_receive_now() {
                return true;
            }
            if self.error.lock().expect("state lock").is_some() {
                return false;
            }
            if tokio::time::timeout_at(deadline, posted).await.is_err() {
                return false;
            }
        }
    }

    fn deliver(&self, message: Received) {
        self.recv
            .lock()
            .expect("recv lock")
            .queue
            .push_back(message);
        self.recv_ready.notify_waiters();
    }
}

/// Fails the oldest request once its deadline passes (and with it the queue
/// pair): our own timeout above the transport's retries.
///
/// Posts do not wake it (that would be a wake-up per round trip of a
/// lightly loaded connection): while nothing is outstanding it looks again
/// every quarter of the deadline, so a request posted meanwhile fails
/// between one and one and a quarter deadlines after its post.
async fn watchdog(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        if s.error.lock().expect("state lock").is_some() {
            return;
        }
        let oldest = s
            .requester
            .lock()
            .expect("requester lock")
            .queue
            .front()
            .map(|p| (p.seq, p.deadline));
        match oldest {
            None => {
                let idle_look = s.config.op_deadline() / 4;
                drop(s);
                tokio::time::sleep(idle_look).await;
            }
            Some((seq, deadline)) if deadline <= Instant::now() => {
                let still = s
                    .requester
                    .lock()
                    .expect("requester lock")
                    .queue
                    .front()
                    .is_some_and(|p| p.seq == seq);
                if still {
                    s.fail(
                        format!(
                            "no answer to request {seq} within {:?}",
                            s.config.op_deadline()
                        ),
                        Some(WcError::RetryExceeded),
                    );
                    return;
                }
            }
            Some((_, deadline)) => {
                drop(s);
                tokio::time::sleep_until(deadline).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entropy::Entropy;
    use crate::types::DeviceLimits;

    /// A queue pair over bare channels, the test playing its peer: the
    /// queue pair, what it sends to the peer, and the peer's frames to it.
    fn qp(mem: &mut [u64]) -> (SoftConn, WireOut, mpsc::UnboundedSender<Frame>, u64, u32) {
        qp_with(mem, ConnConfig::default())
    }

    fn qp_with(
        mem: &mut [u64],
        config: ConnConfig,
    ) -> (SoftConn, WireOut, mpsc::UnboundedSender<Frame>, u64, u32) {
        let nic = Arc::new(SoftNic::new(
            DeviceLimits::default(),
            Arc::new(Entropy::os()),
        ));
        let addr = mem.as_mut_ptr() as u64;
        let rkey = nic
            .register(
                addr,
                size_of_val(mem) as u64,
                Access::ALL_REMOTE | Access::LOCAL_WRITE,
            )
            .unwrap();
        let (wire, out, to_qp) = wire();
        let endpoint = SoftEndpoint::of(&config);
        let conn = SoftConn::start(nic, "peer".into(), config, endpoint, wire);
        (conn, out, to_qp, addr, rkey)
    }

    fn write(seq: u64, addr: u64, rkey: u32) -> Frame {
        Frame::Req {
            seq,
            req: Request::Write {
                addr,
                rkey,
                data: vec![seq as u8; 8],
                imm: None,
            },
        }
    }

    fn read(seq: u64, addr: u64, rkey: u32) -> Frame {
        Frame::Req {
            seq,
            req: Request::Read { addr, rkey, len: 8 },
        }
    }

    /// The answer to [`read`] number `seq` of 8 bytes of `byte`.
    fn read_answer(seq: u64, byte: u8) -> Frame {
        Frame::Resp {
            seq,
            result: Ok(Done::Data(vec![byte; 8])),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_writes_and_its_send_are_answered_with_one_acknowledgement() {
        let mut mem = vec![0u64; 4];
        let (conn, mut out, to_qp, addr, rkey) = qp(&mut mem);
        // Queued together, as they arrive in one read of the wire.
        for seq in 0..3 {
            to_qp.send(write(seq, addr + 8 * seq, rkey)).unwrap();
        }
        to_qp
            .send(Frame::Req {
                seq: 3,
                req: Request::Send {
                    data: b"meta".to_vec(),
                },
            })
            .unwrap();
        assert_eq!(out.responses.recv().await, Some(Frame::Ack { upto: 3 }));
        assert_eq!(
            conn.recv().await.unwrap(),
            Received::Message(b"meta".to_vec())
        );
        assert!(out.responses.try_recv().is_err(), "no answer per request");
        assert_eq!(mem[..3], [0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202]);
    }

    /// The wire's writer ended (the connection is closing) while the
    /// peer's request was on its way: the request is not answered, and the
    /// queue pair fails. Before, the reader panicked (found by the
    /// simulator, seed 0 of `sim/tests/seeds.rs`).
    #[tokio::test(start_paused = true)]
    async fn a_request_that_arrives_after_the_writer_ended_fails_the_queue_pair() {
        let mut mem = vec![0u64; 4];
        let (conn, out, to_qp, addr, rkey) = qp(&mut mem);
        drop(out);
        to_qp.send(read(0, addr, rkey)).unwrap();
        let failed = tokio::time::timeout(Duration::from_secs(1), conn.recv()).await;
        assert!(
            matches!(failed, Ok(Err(_))),
            "the queue pair fails at once: {failed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn acknowledged_writes_go_before_a_result_and_an_error() {
        let mut mem = vec![0u64; 4];
        let (_conn, mut out, to_qp, addr, rkey) = qp(&mut mem);
        to_qp.send(write(0, addr, rkey)).unwrap();
        to_qp.send(read(1, addr, rkey)).unwrap();
        to_qp.send(write(2, addr, rkey.wrapping_add(1))).unwrap();
        assert_eq!(out.responses.recv().await, Some(Frame::Ack { upto: 0 }));
        assert_eq!(out.responses.recv().await, Some(read_answer(1, 0)));
        assert_eq!(
            out.responses.recv().await,
            Some(Frame::Resp {
                seq: 2,
                result: Err(WcError::RemoteAccess)
            }),
            "a refused WRITE reports its own error"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledgement_completes_writes_and_sends_in_order_and_nothing_else() {
        let mut mem = vec![0u64; 4];
        let (conn, _out, to_qp, addr, rkey) = qp(&mut mem);
        let remote = |off: u64| (addr + off, rkey);
        let w0 = conn
            .post(Request::Write {
                addr: remote(0).0,
                rkey,
                data: vec![1],
                imm: None,
            })
            .unwrap();
        let s1 = conn.post(Request::Send { data: vec![2] }).unwrap();
        let r2 = conn
            .post(Request::Read {
                addr: remote(8).0,
                rkey,
                len: 8,
            })
            .unwrap();
        to_qp.send(Frame::Ack { upto: 1 }).unwrap();
        assert_eq!(w0.await.unwrap(), Ok(Done::Ok));
        assert_eq!(s1.await.unwrap(), Ok(Done::Ok));
        // An acknowledgement cannot answer a READ: the peer broke the
        // protocol, and the queue pair fails.
        to_qp.send(Frame::Ack { upto: 2 }).unwrap();
        assert_eq!(r2.await.unwrap(), Err(WcError::Flushed));
        assert!(
            conn.broken()
                .is_some_and(|cause| cause.contains("returns a result")),
            "{:?}",
            conn.broken()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_behind_a_send_that_waits_for_a_receive_wait_behind_it() {
        let mut mem = vec![0u64; 4];
        let config = ConnConfig {
            recv_depth: 0,
            ..ConnConfig::default()
        };
        let (conn, mut out, to_qp, addr, rkey) = qp_with(&mut mem, config);
        to_qp
            .send(Frame::Req {
                seq: 0,
                req: Request::Send {
                    data: b"first".to_vec(),
                },
            })
            .unwrap();
        to_qp.send(write(1, addr, rkey)).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(mem[0], 0, "the WRITE waits behind the SEND (RC order)");
        assert!(out.responses.try_recv().is_err(), "nothing is answered yet");
        conn.post_recv(1).unwrap();
        assert_eq!(out.responses.recv().await, Some(Frame::Ack { upto: 0 }));
        assert_eq!(out.responses.recv().await, Some(Frame::Ack { upto: 1 }));
        assert_eq!(mem[0], 0x0101_0101_0101_0101);
        assert_eq!(
            conn.recv().await.unwrap(),
            Received::Message(b"first".to_vec())
        );
        // Caught up: the requests after run as before.
        to_qp.send(write(2, addr + 8, rkey)).unwrap();
        to_qp.send(read(3, addr + 8, rkey)).unwrap();
        assert_eq!(out.responses.recv().await, Some(Frame::Ack { upto: 2 }));
        assert_eq!(out.responses.recv().await, Some(read_answer(3, 2)));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_to_our_requests_get_through_while_the_peer_reads_none_of_its_own() {
        let mut mem = vec![0u64; 4];
        let (conn, mut out, to_qp, addr, rkey) = qp(&mut mem);
        let ours = conn.post(Request::Read { addr, rkey, len: 8 }).unwrap();
        // More answers than the answer queue holds, which nobody drains
        // yet, then the answer to our READ.
        let theirs = RESPONSE_QUEUE as u64 + 100;
        for seq in 0..theirs {
            to_qp.send(read(seq, addr, rkey)).unwrap();
        }
        to_qp
            .send(Frame::Resp {
                seq: 0,
                result: Ok(Done::Data(vec![7; 8])),
            })
            .unwrap();
        assert_eq!(ours.await.unwrap(), Ok(Done::Data(vec![7; 8])));
        for seq in 0..theirs {
            assert_eq!(
                out.responses.recv().await,
                Some(read_answer(seq, 0)),
                "answers in order"
            );
        }
    }
}
