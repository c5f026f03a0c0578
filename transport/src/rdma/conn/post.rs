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
    /// The device reported it, or a later request (its staging may go
    /// once older ones did).
    pub(super) completed: bool,
    /// The device reports it when it succeeds. An unsignaled request
    /// (a WRITE or SEND with another request of its chain after it)
    /// succeeded when a later one completes.
    pub(super) signaled: bool,
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
    /// Posts `requests` as one chain, in order: all of them or, on an
    /// error found before the post, none. A WRITE or SEND followed by
    /// another request of the chain is posted unsignaled (the device
    /// reports it only if it fails; the next completion covers it), and
    /// one of at most the queue pair's inline size is posted inline (no
    /// staging: the provider copies it at the post).
    pub(super) fn post_chain(&self, requests: Vec<Request>) -> Result<Vec<Posted>> {
        self.check_ready()?;
        // The port may allow less than the configuration asked for.
        for request in &requests {
            crate::limits::check_request(
                request,
                self.sizing.max_transfer_bytes,
                self.sizing.max_message_bytes,
            )?;
        }
        let Some(last) = requests.len().checked_sub(1) else {
            return Ok(Vec::new());
        };
        let max_inline = self.qp.max_inline() as usize;
        let ops: Vec<_> = requests.into_iter().map(send_op_of).collect();
        let mut send = lock(&self.send);
        // Under the send lock: `fail` flushes what it finds under this lock,
        // after setting `failed`.
        self.check_ready()?;
        if send.pending.len() + ops.len() > self.config.max_outstanding as usize {
            return Err(TransportError::Limit {
                what: "outstanding work requests",
                limit: u64::from(self.config.max_outstanding),
            });
        }
        let mut entries: Vec<(OpKind, Staging, SendWr)> = Vec::with_capacity(ops.len());
        for (i, (kind, op, data, local_len)) in ops.iter().enumerate() {
            let carries = matches!(kind, OpKind::Write | OpKind::WriteImm | OpKind::Send);
            let inline = carries && !data.is_empty() && data.len() <= max_inline;
            let staged = if inline {
                Ok((Staging::None, Some(inline_slice(data))))
            } else {
                self.stage_bytes(&mut send, data, *local_len)
            };
            let (staging, local) = match staged {
                Ok(staged) => staged,
                Err(e) => {
                    // The newest piece first: each is then the newest.
                    for (_, staging, _) in entries.into_iter().rev() {
                        self.unstage(&mut send, staging);
                    }
                    return Err(e);
                }
            };
            let wr = SendWr {
                wr_id: send.next_seq + i as u64,
                op: *op,
                local,
                signaled: i == last || !carries,
                inline,
            };
            entries.push((*kind, staging, wr));
        }
        let wrs: Vec<SendWr> = entries.iter().map(|(_, _, wr)| *wr).collect();
        // SAFETY: each request that is not inline names staging it owns from
        // now on: a ring piece (released only once this request's completion,
        // or a later one's, has been polled and every older one's too) or a
        // registration of its own (kept in the pending entry). Both live
        // until after the queue pair is destroyed (`Shared` field order). The
        // CPU writes the staging only before posting and reads it only after
        // the completion. An inline request names `ops`' bytes, alive until
        // after the call.
        let posted = unsafe { self.qp.post_sends(&wrs) };
        drop(ops);
        let deadline = Instant::now() + self.config.op_deadline();
        let mut receivers = Vec::with_capacity(entries.len());
        for (kind, staging, wr) in entries {
            let (done, rx) = oneshot::channel();
            // Even on an error below: the device may own what was posted,
            // so its staging stays with the queue pair.
            send.pending.push_back(PendingWr {
                seq: wr.wr_id,
                kind,
                staging,
                deadline,
                done: Some(done),
                completed: false,
                signaled: wr.signaled,
            });
            receivers.push(rx);
        }
        send.next_seq += receivers.len() as u64;
        drop(send);
        if let Err((count, e)) = posted {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.broken());
            }
            let error = TransportError::Io {
                op: format!(
                    "ibv_post_send of a chain of {} to {} (refused from the {}th)",
                    receivers.len(),
                    self.peer_addr,
                    count + 1
                ),
                source: e,
            };
            // Flushes every request of the chain, posted or not.
            self.fail(error.to_string());
            return Err(error);
        }
        self.try_drain();
        if self.config.busy_poll && self.driver_parked.load(Ordering::SeqCst) {
            self.driver_wake.notify_one();
        }
        Ok(receivers)
    }

    /// Stages `data` (`local_len` bytes of room) and names it for the
    /// device.
    fn stage_bytes(
        &self,
        send: &mut SendState,
        data: &[u8],
        local_len: usize,
    ) -> Result<(Staging, Option<LocalSlice>)> {
        let staging = self.stage(send, local_len)?;
        let local = self.slice(&staging, local_len);
        if self.write_staging(&staging, data).is_none() || (local_len > 0 && local.is_none()) {
            self.unstage(send, staging);
            return Err(TransportError::Invalid(format!(
                "{local_len} bytes do not fit the staging given to them"
            )));
        }
        Ok((staging, local))
    }
}

/// What a posted request's caller waits on.
pub(super) type Posted = oneshot::Receiver<Result<Done, WcError>>;

/// `data` named for an inline post (the provider ignores the lkey).
fn inline_slice(data: &[u8]) -> LocalSlice {
    LocalSlice {
        addr: data.as_ptr() as u64,
        len: data.len() as u32,
        lkey: 0,
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
