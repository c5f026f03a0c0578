//! The protection domain (`ibv_pd`): the scope in which memory
//! registrations and queue pairs meet. A peer's WRITE arriving on a queue
//! pair can only reach registrations of the same protection domain, so a
//! device has exactly one, shared by its regions and its connections.
//!
//! Holds an `Arc` of its context; deallocated on drop, which cannot happen
//! while a registration or a queue pair (each holding an `Arc` of it) lives.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_alloc_pd, ibv_dealloc_pd, ibv_pd};

use super::context::{Context, errno_of};

/// A protection domain of one opened device.
pub(crate) struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    context: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is owned and
// deallocated once.
unsafe impl Send for ProtectionDomain {}
// SAFETY: every verb taking a protection domain is thread-safe.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `context`.
    pub(crate) fn new(context: Arc<Context>) -> io::Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is open (we hold an `Arc` of it until the
        // protection domain is deallocated).
        let pd = unsafe { ibv_alloc_pd(context.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(io::Error::last_os_error)?;
        Ok(Arc::new(ProtectionDomain { pd, context }))
    }

    /// The raw protection domain, for children created in it.
    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }

    /// The device it belongs to.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.context
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, deallocated once, after every
        // child (each holds an `Arc` of this domain).
        let rc = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.context.name(), error = %errno_of(rc), "ibv_dealloc_pd failed");
        }
    }
}
