//! The responder side of a software queue pair: what the NIC does with the
//! frames that arrive.
//!
//! The backend's reader hands every frame to the queue pair's [`Inbound`]
//! itself, one by one, in wire order:
//! - answers complete the requester's outstanding requests there and then;
//! - a request that can execute without waiting (a READ, a CAS, a WRITE, a
//!   SEND that finds a posted receive) executes there too, in the reader,
//!   and its answer is queued for the writer: no hand-off to another task on
//!   the common path;
//! - a request that has to wait (a SEND or a WRITE with immediate that finds
//!   no posted receive, a WRITE the inproc fabric parks, an answer queue
//!   that is full) goes to the queue pair's responder task, and so does
//!   every request behind it until that task has caught up: requests still
//!   execute one at a time, in order (RC ordering), and the reader never
//!   waits, so answers to our own requests keep flowing.
//!
//! Successful WRITEs and SENDs are acknowledged together: the answer of a
//! burst of them is one cumulative [`Frame::Ack`], sent before any other
//! answer, before a SEND's message is delivered (so that an application
//! reacting to it cannot overtake its acknowledgement), and once nothing
//! more is at hand to execute ([`Inbound::idle`]).
//!
//! Never: execute two requests at once, reorder answers, or block the
//! reader on the answer queue.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::{Frame, REQUEST_BACKLOG, Shared};
use crate::error::WcError;
use crate::limits;
use crate::types::{Access, Received};
use crate::work::{Done, Request};

/// A WRITE the inproc fabric holds: it resolves to whether the copy
/// happens (see [`super::WriteGate`]).
type Released = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The result of a request and the message it delivers.
struct Outcome {
    result: Result<Done, WcError>,
    deliver: Option<Received>,
}

/// What the responder task takes, in wire order.
enum Queued {
    Request {
        seq: u64,
        req: Request,
        /// The gate's answer, when the reader already asked it.
        released: Option<Released>,
    },
    /// An acknowledgement the reader could not queue (the answer queue was
    /// full).
    Ack(u64),
    /// The peer closed: requests it sent before still execute first.
    Close(String),
}

/// Turns outcomes into answers, holding back acknowledgements of WRITEs and
/// SENDs until something else has to be said or nothing more is at hand.
struct Answers {
    responses: mpsc::Sender<Frame>,
    /// The last request acknowledged but not yet told.
    unacked: Option<u64>,
}

impl Answers {
    /// The frames that answer request `seq` (at most two: what was held
    /// back, then its own answer), updating what is held back.
    fn of(
        &mut self,
        seq: u64,
        req: &Request,
        result: Result<Done, WcError>,
        delivers: bool,
    ) -> [Option<Frame>; 2] {
        let own = match result {
            Ok(Done::Ok) if matches!(req, Request::Write { .. } | Request::Send { .. }) => {
                self.unacked = Some(seq);
                // Told now only when a message is delivered with it.
                delivers.then_some(Frame::Ack { upto: seq })
            }
            result => Some(Frame::Resp { seq, result }),
        };
        match own {
            // What was acknowledged before goes first (in order).
            Some(own) => [
                self.unacked
                    .take()
                    .filter(|&upto| upto < seq)
                    .map(|upto| Frame::Ack { upto }),
                Some(own),
            ],
            None => [None, None],
        }
    }

    /// Queues `frames`, waiting for room. False once the writer is gone.
    async fn send(&self, frames: impl IntoIterator<Item = Frame>) -> bool {
        for frame in frames {
            if self.responses.send(frame).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Tells what was held back, waiting for room.
    async fn flush(&mut self) -> bool {
        match self.unacked.take() {
            Some(upto) => self.send([Frame::Ack { upto }]).await,
            None => true,
        }
    }
}

/// The entry of frames into a queue pair, driven by the backend's reader.
pub(crate) struct Inbound {
    shared: Arc<Shared>,
    answers: Answers,
    to_responder: mpsc::UnboundedSender<Queued>,
}

impl Inbound {
    /// The entry of `shared`'s frames; starts its responder task.
    pub(super) fn start(shared: Arc<Shared>, responses: mpsc::Sender<Frame>) -> Inbound {
        let (to_responder, queue) = mpsc::unbounded_channel();
        tokio::spawn(respond(shared.clone(), queue, responses.clone()));
        Inbound {
            shared,
            answers: Answers {
                responses,
                unacked: None,
            },
            to_responder,
        }
    }

    /// Reads frames off a channel until it ends (the inproc backend's wire).
    pub(super) async fn drain(mut self, mut incoming: mpsc::UnboundedReceiver<Frame>) {
        loop {
            let frame = match incoming.try_recv() {
                Ok(frame) => frame,
                Err(_) => {
                    self.idle();
                    match incoming.recv().await {
                        Some(frame) => frame,
                        None => break,
                    }
                }
            };
            if !self.frame(frame) {
                return;
            }
        }
        self.shared.fail("the wire is closed".into(), None);
    }

    /// Takes the next frame off the wire. False when the queue pair wants
    /// no more (the peer closed, or the queue pair is in the error state).
    pub(crate) fn frame(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Resp { seq, result } => self.shared.complete(seq, result),
            Frame::Ack { upto } => self.shared.complete_upto(upto),
            Frame::Req { seq, req } => {
                if let Some(violation) = self.shared.oversized(&req) {
                    // As a NIC answers a request above its limits: remote
                    // invalid request; and this side closes too.
                    self.idle();
                    let _ = self.answers.responses.try_send(Frame::Resp {
                        seq,
                        result: Err(WcError::RemoteInvalidRequest),
                    });
                    self.shared.violated(violation);
                    return false;
                }
                return self.request(seq, req);
            }
            Frame::Close { reason } => {
                if self.responder_busy() {
                    self.hand_over(Queued::Close(reason));
                } else {
                    self.idle();
                    self.shared
                        .fail(format!("closed by the peer: {reason}"), None);
                }
                return false;
            }
        }
        true
    }

    /// Nothing more is at hand (the backend is about to wait for the
    /// wire): tells the acknowledgements held back.
    pub(crate) fn idle(&mut self) {
        if let Some(upto) = self.answers.unacked.take() {
            // Only the reader answers while the responder is idle, so room
            // seen here is room kept.
            if self.responder_busy()
                || self
                    .answers
                    .responses
                    .try_send(Frame::Ack { upto })
                    .is_err()
            {
                self.hand_over(Queued::Ack(upto));
            }
        }
    }

    /// The wire ended without a Close (a backend's read error): what came
    /// before still executes, then the queue pair fails with `reason`.
    pub(crate) fn ended(mut self, reason: String) {
        self.frame(Frame::Close { reason });
    }

    fn responder_busy(&self) -> bool {
        self.shared.slow.load(Ordering::Acquire) > 0
    }

    fn request(&mut self, seq: u64, req: Request) -> bool {
        if self.responder_busy() {
            return self.hand_over(Queued::Request {
                seq,
                req,
                released: None,
            });
        }
        if self.shared.error.lock().expect("state lock").is_some() {
            // A queue pair in the error state executes nothing more: what
            // arrives on it is dropped, as a NIC drops it (what it executed
            // before is still acknowledged).
            self.idle();
            return false;
        }
        // The writer is gone (the wire is closing): nothing executed now
        // could be answered. A NIC whose link is down executes nothing.
        if self.answers.responses.is_closed() {
            self.shared.fail("the wire is closed".into(), None);
            return false;
        }
        // Room for what was held back and this answer: only the reader
        // answers now, so the sends below cannot find the queue full.
        if self.answers.responses.capacity() < 2 {
            self.idle();
            return self.hand_over(Queued::Request {
                seq,
                req,
                released: None,
            });
        }
        match self.shared.execute_now(&req) {
            Ok(Outcome { result, deliver }) => {
                for frame in self
                    .answers
                    .of(seq, &req, result, deliver.is_some())
                    .into_iter()
                    .flatten()
                {
                    match self.answers.responses.try_send(frame) {
                        Ok(()) => {}
                        // The writer ended since the check above: the
                        // answer cannot reach the peer, which sees its
                        // request flushed (a WRITE may have landed).
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            self.shared.fail("the wire is closed".into(), None);
                            return false;
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            unreachable!("room was checked and only the reader answers")
                        }
                    }
                }
                if let Some(message) = deliver {
                    self.shared.deliver(message);
                }
                true
            }
            Err(released) => {
                self.idle();
                self.hand_over(Queued::Request { seq, req, released })
            }
        }
    }

    /// Gives `queued` to the responder task, behind what it already has.
    fn hand_over(&mut self, queued: Queued) -> bool {
        debug_assert!(
            self.answers.unacked.is_none() || matches!(queued, Queued::Ack(_)),
            "acknowledgements held back go first"
        );
        if self.shared.slow.fetch_add(1, Ordering::AcqRel) >= REQUEST_BACKLOG {
            self.shared.violated(format!(
                "the peer floods requests: {REQUEST_BACKLOG} wait for the responder"
            ));
            return false;
        }
        if let Queued::Request { req, .. } = &queued {
            let bytes = request_bytes(req);
            let waiting = self.shared.slow_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
            if waiting as u64 > self.shared.config.max_backlog_bytes {
                self.shared.violated(format!(
                    "the peer floods requests: {waiting} bytes wait for the responder \
                     (max_backlog_bytes {})",
                    self.shared.config.max_backlog_bytes
                ));
                return false;
            }
        }
        if self.to_responder.send(queued).is_err() {
            self.shared.fail("the responder stopped".into(), None);
            return false;
        }
        true
    }
}

/// The data bytes a request holds while it waits (what the backlog
/// limit counts).
fn request_bytes(req: &Request) -> usize {
    match req {
        Request::Write { data, .. } | Request::Send { data } => data.len(),
        _ => 0,
    }
}

impl Shared {
    /// Why `req` from the peer is above this connection's limits, if it
    /// is: a WRITE or READ above `max_transfer_bytes`. (A SEND above
    /// `max_message_bytes` fails alone, as a message too long for the
    /// posted receive does.)
    fn oversized(&self, req: &Request) -> Option<String> {
        let len = match req {
            Request::Write { data, .. } => data.len() as u64,
            Request::Read { len, .. } => u64::from(*len),
            _ => return None,
        };
        (len > u64::from(self.config.max_transfer_bytes)).then(|| {
            format!(
                "a {} of {len} bytes is above max_transfer_bytes {}",
                if matches!(req, Request::Write { .. }) {
                    "WRITE"
                } else {
                    "READ"
                },
                self.config.max_transfer_bytes
            )
        })
    }

    /// Executes `req` if it can complete without waiting. Otherwise
    /// returns, untouched, the request's gate answer when the gate was
    /// asked (a WRITE the inproc fabric parks), for [`Shared::execute`].
    fn execute_now(&self, req: &Request) -> Result<Outcome, Option<Released>> {
        let access = self.access();
        match req {
            Request::Send { data } => {
                if !limits::message_fits(data.len(), self.config.max_message_bytes) {
                    return Ok(Outcome::failed(WcError::RemoteInvalidRequest));
                }
                if !self.take_receive_now() {
                    return Err(None);
                }
                Ok(Outcome::delivering(Received::Message(data.clone())))
            }
            Request::Write { imm, .. } => {
                if imm.is_some() && !self.receive_posted() {
                    return Err(None);
                }
                if let Some(released) = self.gate.as_ref().and_then(|gate| gate()) {
                    return Err(Some(released));
                }
                let result = self.nic.execute(req, access);
                Ok(self.with_immediate(result, imm))
            }
            _ => Ok(Outcome::of(self.nic.execute(req, access))),
        }
    }

    /// Executes `req`, waiting where it has to: for a posted receive (as
    /// long as the peer's receiver-not-ready retries allow) and for the
    /// gate of a WRITE the inproc fabric parks. `released`: the gate's
    /// answer, when the reader asked it.
    async fn execute(&self, req: &Request, released: Option<Released>) -> Outcome {
        // What need not wait runs as in the reader (the gate is asked at
        // most once).
        let released = match released {
            Some(released) => Some(released),
            None => match self.execute_now(req) {
                Ok(outcome) => return outcome,
                Err(released) => released,
            },
        };
        let landed = match req {
            Request::Send { data } => {
                return if self.take_receive().await {
                    Outcome::delivering(Received::Message(data.clone()))
                } else {
                    Outcome::failed(WcError::RnrRetryExceeded)
                };
            }
            // Not asked yet when what held it was a missing receive.
            Request::Write { data, .. } => {
                match released.or_else(|| self.gate.as_ref().and_then(|gate| gate())) {
                    None => self.nic.execute(req, self.access()),
                    // Admitted now, copied once the gate opens: nothing
                    // else of this queue pair runs in between (RC order).
                    Some(released) => match self.nic.admit(req, self.access()) {
                        Ok(admitted) if released.await => self.nic.land(admitted, data),
                        // Dropped before its copy: it fails at the NIC.
                        Ok(_) => Err(WcError::RemoteAccess),
                        Err(e) => Err(e),
                    },
                }
            }
            _ => unreachable!("only a SEND or a WRITE waits"),
        };
        match (landed, req) {
            (Ok(done), Request::Write { imm: Some(imm), .. }) => {
                if self.take_receive().await {
                    Outcome {
                        result: Ok(done),
                        deliver: Some(Received::WriteImmediate(*imm)),
                    }
                } else {
                    Outcome::failed(WcError::RnrRetryExceeded)
                }
            }
            (result, _) => Outcome::of(result),
        }
    }

    fn access(&self) -> Access {
        Access::from_bits_truncate(self.qp_access.load(Ordering::Acquire))
    }

    /// A landed WRITE's outcome; with an immediate it consumes the receive
    /// seen posted before (nothing else consumes receives meanwhile).
    fn with_immediate(&self, landed: Result<Done, WcError>, imm: &Option<u32>) -> Outcome {
        match (landed, imm) {
            (Ok(done), Some(imm)) => {
                assert!(self.take_receive_now(), "a receive was seen posted");
                Outcome {
                    result: Ok(done),
                    deliver: Some(Received::WriteImmediate(*imm)),
                }
            }
            (result, _) => Outcome::of(result),
        }
    }
}

impl Outcome {
    fn of(result: Result<Done, WcError>) -> Outcome {
        Outcome {
            result,
            deliver: None,
        }
    }

    fn failed(error: WcError) -> Outcome {
        Outcome::of(Err(error))
    }

    fn delivering(message: Received) -> Outcome {
        Outcome {
            result: Ok(Done::Ok),
            deliver: Some(message),
        }
    }
}

/// Executes, in order, the requests the reader handed over, and answers
/// them. It tells the reader it has caught up (`slow` back to zero) only
/// after its last answer is queued, so answers never overtake each other.
async fn respond(
    shared: Arc<Shared>,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    responses: mpsc::Sender<Frame>,
) {
    let mut answers = Answers {
        responses,
        unacked: None,
    };
    // Taken off the queue since the reader was last told.
    let mut taken = 0;
    loop {
        let queued = match queue.try_recv() {
            Ok(queued) => queued,
            Err(_) => {
                if !answers.flush().await {
                    break;
                }
                shared.slow.fetch_sub(taken, Ordering::AcqRel);
                taken = 0;
                match queue.recv().await {
                    Some(queued) => queued,
                    None => break,
                }
            }
        };
        taken += 1;
        let (seq, req, released) = match queued {
            Queued::Request { seq, req, released } => (seq, req, released),
            Queued::Ack(upto) => {
                if !answers.flush().await || !answers.send([Frame::Ack { upto }]).await {
                    break;
                }
                continue;
            }
            Queued::Close(reason) => {
                answers.flush().await;
                shared.fail(format!("closed by the peer: {reason}"), None);
                break;
            }
        };
        if shared.error.lock().expect("state lock").is_some() {
            // As in the reader: nothing more executes.
            answers.flush().await;
            break;
        }
        let Outcome { result, deliver } = shared.execute(&req, released).await;
        shared
            .slow_bytes
            .fetch_sub(request_bytes(&req), Ordering::AcqRel);
        let frames = answers.of(seq, &req, result, deliver.is_some());
        if !answers.send(frames.into_iter().flatten()).await {
            break;
        }
        if let Some(message) = deliver {
            shared.deliver(message);
        }
    }
}
