//! Memory registrations (`ibv_mr`) and their typed access flags.
//!
//! A registration pins memory for the device and names it with an lkey
//! (local work requests) and an rkey (peers). It holds an `Arc` of its
//! protection domain and is deregistered on drop: from then on the rkey is
//! refused by the device (remote access error). It never owns the memory:
//! whoever registers it promises that the memory outlives the registration.

use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use super::context::errno_of;
use super::pd::ProtectionDomain;
use crate::types::Access;

bitflags::bitflags! {
    /// `ibv_access_flags`, the bits we use, with the values of `verbs.h`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        const LOCAL_WRITE = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
}

impl AccessFlags {
    /// Each API [`Access`] bit and the verbs bit it maps to.
    const OF_ACCESS: [(Access, AccessFlags); 4] = [
        (Access::LOCAL_WRITE, AccessFlags::LOCAL_WRITE),
        (Access::REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
        (Access::REMOTE_READ, AccessFlags::REMOTE_READ),
        (Access::REMOTE_ATOMIC, AccessFlags::REMOTE_ATOMIC),
    ];

    /// The flags of an API [`Access`], bit by bit.
    pub(crate) fn from_access(access: Access) -> AccessFlags {
        let mut flags = AccessFlags::empty();
        for (api, verbs) in AccessFlags::OF_ACCESS {
            flags.set(verbs, access.contains(api));
        }
        flags
    }

    /// The flags to register memory with for `access`: verbs refuses
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (`EINVAL`), and the
    /// API's contract already lets the device write such memory, so
    /// LOCAL_WRITE is added for them.
    pub(crate) fn for_registration(access: Access) -> AccessFlags {
        let mut flags = AccessFlags::from_access(access);
        if flags.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            flags |= AccessFlags::LOCAL_WRITE;
        }
        flags
    }

    /// The remote part only: what a queue pair's access flags may hold.
    pub(crate) fn remote_only(self) -> AccessFlags {
        self & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
    }
}

/// A registration of `len` bytes at `addr` in a protection domain.
pub(crate) struct MemoryRegistration {
    mr: NonNull<ibv_mr>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is owned and
// deregistered once. The registered memory itself is not accessed through
// this type.
unsafe impl Send for MemoryRegistration {}
// SAFETY: the type only exposes copies of immutable fields.
unsafe impl Sync for MemoryRegistration {}

impl MemoryRegistration {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory `[addr, addr + len)` must stay allocated (mapped, not
    /// freed or reused) until the registration is dropped. Given the flags,
    /// the device may write it at any moment (remote WRITEs and atomics from
    /// any peer holding the rkey; local READ results and receives): the
    /// caller must not hold Rust references to those bytes across such
    /// writes and must only copy in and out through raw pointers.
    pub(crate) unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> io::Result<MemoryRegistration> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: the protection domain is alive (we hold its `Arc`); the
        // caller guarantees the memory outlives the registration, which is
        // deregistered in `Drop`.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access.bits() as c_int) };
        let mr = NonNull::new(mr).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: `mr` was just returned by a successful `ibv_reg_mr`; its
        // keys never change during its life.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(MemoryRegistration {
            mr,
            lkey,
            rkey,
            addr: addr as u64,
            len,
            pd: pd.clone(),
        })
    }

    /// The key local work requests name the memory with.
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The key peers name the memory with.
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// First registered byte.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Registered bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The protection domain it was registered in.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryRegistration {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr`, deregistered once. Queue pairs
        // that may still name it hold their own `Arc` of the protection
        // domain, not of this registration: the device then refuses its keys,
        // which is the point of deregistering.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.context().name(), rkey = self.rkey, error = %errno_of(rc), "ibv_dereg_mr failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_match_verbs() {
        // The API's bits are the verbs' bits; the mapping is explicit anyway.
        assert_eq!(AccessFlags::from_access(Access::LOCAL_WRITE).bits(), 1);
        assert_eq!(AccessFlags::from_access(Access::REMOTE_WRITE).bits(), 2);
        assert_eq!(AccessFlags::from_access(Access::REMOTE_READ).bits(), 4);
        assert_eq!(AccessFlags::from_access(Access::REMOTE_ATOMIC).bits(), 8);
        assert_eq!(
            AccessFlags::for_registration(Access::REMOTE_WRITE),
            AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE
        );
        assert_eq!(
            AccessFlags::for_registration(Access::REMOTE_READ),
            AccessFlags::REMOTE_READ
        );
        assert_eq!(
            AccessFlags::from_access(Access::ALL_REMOTE | Access::LOCAL_WRITE).remote_only(),
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
        );
    }
}
