//! The completion channel (`ibv_comp_channel`) and the completion queue
//! (`ibv_cq`) that reports into it.
//!
//! Each completion queue gets a channel of its own, created with it, so an
//! event read from the channel always belongs to that queue. The channel's
//! file descriptor is non-blocking, for tokio's `AsyncFd`. Every event taken
//! is acknowledged at once (`ibv_destroy_cq` waits for unacknowledged
//! events). The queue holds `Arc`s of its channel and context; the channel
//! holds an `Arc` of the context.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq,
    ibv_wc, ibv_wc_flags,
};

use super::context::{Context, errno_of};

/// Largest number of completions taken by one `ibv_poll_cq`.
pub(crate) const POLL_BATCH: usize = 32;

/// A completion event channel.
pub(crate) struct CompletionChannel {
    channel: NonNull<ibv_comp_channel>,
    context: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread; owned pointer destroyed
// once.
unsafe impl Send for CompletionChannel {}
// SAFETY: `ibv_get_cq_event` on one channel is thread-safe.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    fn new(context: Arc<Context>) -> io::Result<Arc<CompletionChannel>> {
        // SAFETY: the context is open (we keep an `Arc` of it).
        let channel = unsafe { ibv_create_comp_channel(context.as_ptr()) };
        let channel = NonNull::new(channel).ok_or_else(io::Error::last_os_error)?;
        let channel = Arc::new(CompletionChannel { channel, context });
        let fd = channel.as_raw_fd();
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL/F_SETFL only
        // change its status flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(channel)
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is set at creation and never
        // changes.
        unsafe { (*self.channel.as_ptr()).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_comp_channel`, destroyed once, after
        // its completion queue (which holds an `Arc` of it).
        let rc = unsafe { ibv_destroy_comp_channel(self.channel.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.context.name(), error = %errno_of(rc), "ibv_destroy_comp_channel failed");
        }
    }
}

/// The channel's descriptor as tokio's `AsyncFd` wants it; keeps the channel
/// alive while registered with the reactor.
pub(crate) struct ChannelFd(Arc<CompletionChannel>);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One work completion, copied out of the device's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkCompletion {
    /// The id the work request was posted with.
    pub wr_id: u64,
    /// `ibv_wc_status`.
    pub status: u32,
    /// `ibv_wc_opcode` (meaningful on success only).
    pub opcode: u32,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// The immediate value, in host byte order, when the completion has one.
    pub imm: Option<u32>,
    /// Vendor error syndrome (failures).
    pub vendor_err: u32,
}

/// A completion queue with its own event channel.
pub(crate) struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    capacity: u32,
    channel: Arc<CompletionChannel>,
    context: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread; owned pointer destroyed
// once.
unsafe impl Send for CompletionQueue {}
// SAFETY: polling, arming and event handling of a CQ are thread-safe verbs.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A completion queue of at least `entries` entries, with a new
    /// non-blocking event channel of its own.
    pub(crate) fn new(context: &Arc<Context>, entries: u32) -> io::Result<Arc<CompletionQueue>> {
        let channel = CompletionChannel::new(context.clone())?;
        let entries_c =
            c_int::try_from(entries).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the context and the channel are alive (we keep `Arc`s of
        // both until the queue is destroyed).
        let cq = unsafe {
            ibv_create_cq(
                context.as_ptr(),
                entries_c,
                ptr::null_mut(),
                channel.channel.as_ptr(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(io::Error::last_os_error)?;
        Ok(Arc::new(CompletionQueue {
            cq,
            capacity: entries,
            channel,
            context: context.clone(),
        }))
    }

    /// The raw queue, for the queue pairs that report into it.
    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// Entries asked for at creation.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The event channel's descriptor, for the reactor.
    pub(crate) fn event_fd(&self) -> ChannelFd {
        ChannelFd(self.channel.clone())
    }

    /// Moves up to `max` (at most [`POLL_BATCH`]) completions into `out`;
    /// returns how many.
    pub(crate) fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> io::Result<usize> {
        let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let max = max.clamp(1, POLL_BATCH);
        // SAFETY: the queue is alive; `wcs` has room for `max` entries, which
        // the provider fills in (only the first `n` are read below).
        let n = unsafe {
            ibv_poll_cq(
                self.cq.as_ptr(),
                max as c_int,
                wcs.as_mut_ptr().cast::<ibv_wc>(),
            )
        };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq returned {n}")));
        }
        let n = (n as usize).min(max);
        for wc in &wcs[..n] {
            // SAFETY: the provider initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            let imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
                // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate
                // (network byte order); any bit pattern is a valid u32.
                .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data }));
            out.push(WorkCompletion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                imm,
                vendor_err: wc.vendor_err,
            });
        }
        Ok(n)
    }

    /// Arms the queue: the next completion produces one channel event.
    pub(crate) fn request_notify(&self) -> io::Result<()> {
        // SAFETY: the queue is alive.
        let rc = unsafe { ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        Ok(())
    }

    /// Takes one event from the channel and acknowledges it; `WouldBlock`
    /// when there is none.
    pub(crate) fn take_event(&self) -> io::Result<()> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_context: *mut std::ffi::c_void = ptr::null_mut();
        // SAFETY: the channel is alive and non-blocking; the out-pointers are
        // valid.
        let rc =
            unsafe { ibv_get_cq_event(self.channel.channel.as_ptr(), &mut cq, &mut cq_context) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if cq != self.cq.as_ptr() {
            // Impossible: the channel was created for this queue alone. Ack
            // what was reported anyway (it is a live CQ of this context).
            tracing::error!(device = %self.context.name(), "completion event for a foreign queue");
        }
        // SAFETY: `cq` was just reported by `ibv_get_cq_event`; each event is
        // acknowledged exactly once.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed once, after the queue
        // pairs reporting into it (each holds an `Arc` of it); every event
        // was acknowledged in `take_event`, so this does not block.
        let rc = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.context.name(), error = %errno_of(rc), "ibv_destroy_cq failed");
        }
    }
}
