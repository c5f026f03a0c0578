//! Receive slots: the connection's receive buffers, which are posted,
//! which are free, the messages taken from completions, and the count of
//! receivers waiting (busy-polling spins for them).
//!
//! Owns [`RecvState`] and the receive side of completions. Never: let the
//! CPU read a slot the device may still write (a slot is read only after its
//! completion was polled), or post a slot that is not free.

use super::*;

/// Bit of a work request id that marks a receive (sends count from 0).
pub(super) const RECV_WR_TAG: u64 = 1 << 63;

/// The receive buffers' bookkeeping.
pub(super) struct RecvState {
    /// Buffers neither posted nor holding anything.
    pub(super) free: Vec<u32>,
    /// Which buffers are posted.
    pub(super) posted: Vec<bool>,
    /// Messages taken from completions, oldest first.
    pub(super) queue: VecDeque<Received>,
}

/// Posts `count` receive buffers from `recv.free`.
pub(super) fn post_receives(
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

impl Shared {
    pub(super) fn complete_recv(&self, wc: &WorkCompletion) {
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
}

/// Counts a receiver waiting in `recv` (busy-polling spins for it).
pub(super) struct RecvWaiter<'a>(&'a Shared);

impl<'a> RecvWaiter<'a> {
    pub(super) fn enter(shared: &'a Shared) -> RecvWaiter<'a> {
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
