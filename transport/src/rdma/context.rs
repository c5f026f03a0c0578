//! The verbs device list and an opened device (`ibv_context`): device, port
//! and GID queries.
//!
//! Owns the context and closes it on drop. Children (protection domain,
//! completion channel, completion queue) hold an `Arc<Context>`, so the
//! context can never be closed under them. This module never reads the
//! GID table through sysfs (one file per entry takes minutes under TCG):
//! GIDs come from `ibv_query_gid`.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::os::raw::c_int;
use std::ptr::NonNull;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid, ibv_open_device,
    ibv_port_attr, ibv_query_device, ibv_query_gid,
};

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in `verbs.h` that the
/// bindings do not carry): RoCE, where every address handle needs a GRH.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// The array `ibv_get_device_list` returns, freed on drop. Device pointers
/// are only valid while it lives; contexts opened from it stay valid after.
pub(crate) struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the RDMA devices of this host. `Ok` with no device on a host
    /// whose kernel has verbs but no device; an error (often `ENOSYS`) on a
    /// kernel without RDMA support.
    pub(crate) fn new() -> io::Result<DeviceList> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer. The array returned (if any)
        // is owned by the `DeviceList` built below and freed in its `Drop`.
        let list = unsafe { ibv_get_device_list(&mut count) };
        let list = NonNull::new(list).ok_or_else(io::Error::last_os_error)?;
        Ok(DeviceList {
            list,
            len: usize::try_from(count).unwrap_or(0),
        })
    }

    /// Number of devices.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn device(&self, index: usize) -> Option<NonNull<ibv_device>> {
        if index >= self.len {
            return None;
        }
        // SAFETY: the array holds `len` device pointers (then a NULL) and
        // lives as long as `self`; `index < len`.
        NonNull::new(unsafe { *self.list.as_ptr().add(index) })
    }

    /// The kernel name of device `index` (`rxe0`, `mlx5_0`).
    pub(crate) fn name(&self, index: usize) -> Option<String> {
        let device = self.device(index)?;
        // SAFETY: `device` is an entry of the live list; the name belongs to
        // libibverbs and lives as long as the list.
        let name = unsafe { ibv_get_device_name(device.as_ptr()) };
        if name.is_null() {
            return None;
        }
        // SAFETY: a non-null, NUL-terminated string owned by the live list;
        // copied before the list can be freed.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Opens device `index`.
    pub(crate) fn open(&self, index: usize) -> io::Result<Context> {
        let device = self
            .device(index)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
        let name = self
            .name(index)
            .unwrap_or_else(|| format!("device #{index}"));
        // SAFETY: `device` is an entry of the live list. The context returned
        // stays valid after the list is freed (libibverbs documents this) and
        // is closed by `Context::drop`.
        let context = unsafe { ibv_open_device(device.as_ptr()) };
        let context = NonNull::new(context).ok_or_else(io::Error::last_os_error)?;
        Ok(Context { context, name })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from `ibv_get_device_list` and is freed once.
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// What `ibv_query_device` tells us that we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceAttributes {
    /// `ibv_atomic_cap` value.
    pub atomic_cap: u32,
    /// Largest work queue.
    pub max_qp_wr: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Outstanding READs/atomics a queue pair may serve as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READs/atomics a queue pair may issue as requester.
    pub max_qp_init_rd_atom: u32,
    /// Largest registration, in bytes.
    pub max_mr_size: u64,
    /// Number of ports (numbered from 1).
    pub phys_port_cnt: u8,
}

/// What `ibv_query_port` tells us that we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PortAttributes {
    /// `ibv_port_state` value.
    pub state: u32,
    /// `ibv_mtu` code of the active MTU (1 = 256 B ... 5 = 4096 B).
    pub active_mtu: u32,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
}

/// A global identifier (16 bytes, network byte order as the device reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), which is
    /// how RoCE devices name the IPv4 addresses of their netdev.
    pub(crate) fn ipv4_mapped(&self) -> Option<Ipv4Addr> {
        let b = &self.0;
        (b[..10].iter().all(|x| *x == 0) && b[10] == 0xff && b[11] == 0xff)
            .then(|| Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    }

    /// The unused (all-zero) GID.
    pub(crate) fn is_zero(&self) -> bool {
        self.0.iter().all(|x| *x == 0)
    }
}

/// An opened RDMA device. Verbs calls on it are thread-safe (libibverbs
/// guarantees it), hence `Send` and `Sync`.
pub(crate) struct Context {
    context: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs objects may be used from any thread, concurrently; the
// pointer is owned (closed once, in `Drop`).
unsafe impl Send for Context {}
// SAFETY: as above: every verb on a context is thread-safe.
unsafe impl Sync for Context {}

impl Context {
    /// The raw context, for children that are created from it.
    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.context.as_ptr()
    }

    /// The device's kernel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Device attributes.
    pub(crate) fn query_device(&self) -> io::Result<DeviceAttributes> {
        let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: the context is open; `attr` is a writable ibv_device_attr.
        let rc = unsafe { ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        // SAFETY: zero-initialised (a valid value for this plain C struct)
        // and then filled in by a successful query.
        let attr = unsafe { attr.assume_init() };
        let count = |v: c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttributes {
            atomic_cap: attr.atomic_cap,
            max_qp_wr: count(attr.max_qp_wr),
            max_cqe: count(attr.max_cqe),
            max_qp_rd_atom: count(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: count(attr.max_qp_init_rd_atom),
            max_mr_size: attr.max_mr_size,
            phys_port_cnt: attr.phys_port_cnt,
        })
    }

    /// Attributes of port `port` (numbered from 1).
    pub(crate) fn query_port(&self, port: u8) -> io::Result<PortAttributes> {
        let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
        // SAFETY: the context is open; `attr` is a writable, zeroed
        // ibv_port_attr of the size the provider is told.
        let rc = unsafe { ___ibv_query_port(self.as_ptr(), port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        // SAFETY: zero-initialised plain C struct, filled in by the query.
        let attr = unsafe { attr.assume_init() };
        Ok(PortAttributes {
            state: attr.state,
            active_mtu: attr.active_mtu,
            gid_tbl_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            lid: attr.lid,
            link_layer: attr.link_layer,
            max_msg_sz: attr.max_msg_sz,
        })
    }

    /// GID `index` of `port` (all zero for an unused entry).
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> io::Result<Gid> {
        let index =
            c_int::try_from(index).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open; `gid` is a writable ibv_gid.
        let rc = unsafe { ibv_query_gid(self.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(errno_of(rc));
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`.
        Ok(Gid(unsafe { gid.raw }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once; no child is alive
        // (each holds an `Arc<Context>`).
        let rc = unsafe { ibv_close_device(self.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, error = %errno_of(rc), "ibv_close_device failed");
        }
    }
}

/// The error of a verb that returns 0 or an errno value (some providers
/// return -1 and set `errno` instead).
pub(crate) fn errno_of(rc: c_int) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gids_are_recognised() {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[10, 77, 0, 11]);
        assert_eq!(Gid(raw).ipv4_mapped(), Some(Ipv4Addr::new(10, 77, 0, 11)));
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[15] = 1;
        assert_eq!(Gid(link_local).ipv4_mapped(), None);
        assert!(Gid([0; 16]).is_zero());
        assert_eq!(Gid([0; 16]).ipv4_mapped(), None);
    }
}
