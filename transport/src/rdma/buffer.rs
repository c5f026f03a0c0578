//! Memory a connection owns and registers for its own work requests:
//! staging for outgoing data, READ results and atomics, and receive
//! buffers.
//!
//! The memory is page-aligned, zeroed, and allocated by this module (never
//! a Rust reference while the device may write it): the CPU only copies in
//! and out through raw pointers, in bounds checked here. The registration
//! is dropped before the memory is freed (field order).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use super::mr::{AccessFlags, MemoryRegistration};
use super::pd::ProtectionDomain;
use super::qp::LocalSlice;

/// Alignment of the allocation.
const PAGE_BYTES: usize = 4096;

struct PageMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl PageMemory {
    fn zeroed(len: usize) -> io::Result<PageMemory> {
        let layout = Layout::from_size_align(len.max(1), PAGE_BYTES)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(PageMemory { ptr, layout })
    }
}

impl Drop for PageMemory {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout by `alloc_zeroed`, freed once,
        // after the registration naming it (declared first in DeviceBuffer).
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Owned, registered memory.
pub(crate) struct DeviceBuffer {
    // Field order is drop order: deregister, then free.
    registration: MemoryRegistration,
    memory: PageMemory,
    len: usize,
}

// SAFETY: the memory is reached only through raw-pointer copies, by code that
// holds the connection lock covering the bytes in question (or owns the work
// request using them); the registration is Send.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; `&DeviceBuffer` hands out no references to the bytes.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates and registers `len` zeroed bytes (local access only: the
    /// connection's own work requests use them, peers never see the rkey).
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize) -> io::Result<DeviceBuffer> {
        let memory = PageMemory::zeroed(len)?;
        // SAFETY: the memory lives in the returned value and is freed only
        // after the registration is dropped (field order); it is only
        // accessed by raw-pointer copies (`write`, `read`, `read_u64`).
        let registration = unsafe {
            MemoryRegistration::new(
                pd,
                memory.ptr.as_ptr(),
                len.max(1),
                AccessFlags::LOCAL_WRITE,
            )?
        };
        Ok(DeviceBuffer {
            registration,
            memory,
            len,
        })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, offset: usize, len: usize) -> Option<()> {
        (offset.checked_add(len)? <= self.len).then_some(())
    }

    /// The bytes `[offset, offset + len)` as a work request names them.
    pub(crate) fn slice(&self, offset: usize, len: usize) -> Option<LocalSlice> {
        self.check(offset, len)?;
        Some(LocalSlice {
            addr: self.registration.addr() + offset as u64,
            len: u32::try_from(len).ok()?,
            lkey: self.registration.lkey(),
        })
    }

    /// Copies `data` in at `offset`. The caller must own those bytes (no
    /// posted work request names them).
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Option<()> {
        self.check(offset, data.len())?;
        // SAFETY: in bounds (checked); a copy into memory the caller owns.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.memory.ptr.as_ptr().add(offset),
                data.len(),
            )
        };
        Some(())
    }

    /// Copies `len` bytes out from `offset`. The caller must own those bytes
    /// (their work request has completed).
    pub(crate) fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        self.check(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: in bounds (checked); a copy out of memory the device no
        // longer writes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.memory.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                len,
            )
        };
        Some(out)
    }

    /// The native-endian 8-byte word at `offset` (8-aligned), as an atomic
    /// operation left it. The caller must own those bytes.
    pub(crate) fn read_u64(&self, offset: usize) -> Option<u64> {
        if !offset.is_multiple_of(8) {
            return None;
        }
        self.check(offset, 8)?;
        // SAFETY: in bounds and 8-aligned (page-aligned base); the device no
        // longer writes it.
        Some(unsafe { std::ptr::read_volatile(self.memory.ptr.as_ptr().add(offset).cast::<u64>()) })
    }
}
