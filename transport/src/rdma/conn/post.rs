//! Posting: turns a [`Request`] into a verbs work request, stages its bytes
//! and posts it *now*, under the send lock, so posting order is wire order;
//! the pending list of posted requests.
//!
//! Owns [`SendState`]'s pending list and sequence numbers. Never: post on a
//! queue pair in error (checked under the send lock, which `fail` takes),
//! or hand the device staging another request owns.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    Write,
    WriteImm,
    Read { len: u32 },
    CompareSwap,
    FetchAdd,
    Send,
}

impl OpKind {
    pub(super) fn name(self) -> &'static str {
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

pub(super) struct PendingWr {
    pub(super) seq: u64,
    pub(super) kind: OpKind,
    pub(super) staging: Staging,
    pub(super) deadline: Instant,
    /// `None` once the caller has its result (or was given up on).
    pub(super) done: Option<oneshot::Sender<Result<Done, WcError>>>,
    /// The device reported it (its staging may go once older ones did).
    pub(super) completed: bool,
}

pub(super) struct SendState {
    pub(super) next_seq: u64,
    /// Posted requests whose completion has not been polled, or whose
    /// staging waits for an older one: posting order.
    pub(super) pending: VecDeque<PendingWr>,
    pub(super) ring: StagingRing,
    pub(super) overflow_bytes: u64,
}

impl Shared {
    pub(super) fn post(
        &self,
        request: Request,
    ) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        self.check_ready()?;
        // The port may allow less than the configuration asked for.
        crate::limits::check_request(
            &request,
            self.sizing.max_transfer_bytes,
            self.sizing.max_message_bytes,
        )?;
        let (kind, op, data, local_len) = send_op_of(request);
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
}

/// The verbs operation of `request`, with its kind, the bytes to stage
/// (empty for READ and atomics) and the staging length it needs.
fn send_op_of(request: Request) -> (OpKind, SendOp, Vec<u8>, usize) {
    match request {
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
    }
}
