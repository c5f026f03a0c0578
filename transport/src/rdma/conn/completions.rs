//! Completions: mapping work completion statuses to the API's errors,
//! draining the completion queue (one poller at a time, so completions are
//! handled in the device's order), our own deadline above the verbs'
//! retries, and the driver task that waits on the completion channel.
//!
//! Owns the send side of completions and the driver. Never: block the
//! runtime, panic on what the device reports, or complete a request twice.

use super::*;

/// Completions handled per driver turn before it yields.
pub(super) const MAX_COMPLETIONS_PER_TURN: usize = 256;
/// Polling period when the completion channel itself failed.
pub(super) const FALLBACK_POLL_PERIOD: Duration = Duration::from_millis(10);

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

impl Shared {
    pub(super) fn complete_send(&self, wc: &WorkCompletion) {
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
        if send.pending[index].completed {
            tracing::warn!(peer = %self.peer_addr, wr_id = wc.wr_id, "second completion of one request");
            return;
        }
        // The device completes a send queue in posting order and reports
        // every failed request: the unsignaled requests before this one
        // succeeded.
        let mut covered = Vec::new();
        for earlier in send.pending.iter_mut().take(index) {
            if earlier.completed {
                continue;
            }
            if earlier.signaled {
                tracing::warn!(peer = %self.peer_addr, wr_id = wc.wr_id, earlier = earlier.seq, "completion before that of an older signaled request");
                continue;
            }
            earlier.completed = true;
            covered.extend(earlier.done.take());
        }
        let entry = &mut send.pending[index];
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
        for done in covered {
            let _ = done.send(Ok(Done::Ok));
        }
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

    /// Polls the completion queue dry (bounded per turn); returns how many
    /// completions were handled.
    pub(super) fn drain(&self) -> usize {
        let mut batch = lock(&self.poller);
        self.drain_locked(&mut batch, MAX_COMPLETIONS_PER_TURN)
    }

    /// One poll, unless another thread is polling: used where a completion
    /// is likely already there (on rxe a loopback WRITE executes, and is
    /// acknowledged, inside `ibv_post_send`), to hand it over without
    /// waking the driver.
    pub(super) fn try_drain(&self) -> usize {
        match self.poller.try_lock() {
            Ok(mut batch) => self.drain_locked(&mut batch, POLL_BATCH),
            Err(_) => 0,
        }
    }

    pub(super) fn drain_locked(&self, batch: &mut Vec<WorkCompletion>, max: usize) -> usize {
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
    pub(super) fn enforce_deadlines(&self) -> Option<Instant> {
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
    pub(super) fn finished(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Whether busy-polling has something to wait for.
    pub(super) fn busy(&self) -> bool {
        self.recv_waiters.load(Ordering::SeqCst) > 0 || !lock(&self.send).pending.is_empty()
    }
}

/// The completion driver: one task per connection.
pub(super) async fn drive(shared: Arc<Shared>, events: AsyncFd<ChannelFd>) {
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
