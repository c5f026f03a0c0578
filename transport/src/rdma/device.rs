//! [`RdmaDevice`] (an opened device, its active port and protection domain)
//! and [`RdmaRegion`] (an application memory registration).
//!
//! Owns the limits on registrations and connections of the device. Never
//! scans the GID table through sysfs: GIDs come from `ibv_query_gid`, and
//! sysfs is only read for a candidate's GID type and for the port counters.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_atomic_cap, ibv_port_state};

use super::context::{Context, DeviceAttributes, DeviceList, Gid, PortAttributes};
use super::mr::{AccessFlags, MemoryRegistration};
use super::pd::ProtectionDomain;
use crate::api::{AcceptPolicy, DeviceConfig};
use crate::error::{Result, TransportError};
use crate::limits::ConnSlot;
use crate::types::{Access, AtomicCapability, ConnConfig};

/// GID table entries looked at, at most.
const MAX_GID_SCAN: u32 = 256;
/// The scan stops after this many unused entries in a row (tables fill from
/// the lowest free index).
const MAX_EMPTY_GID_RUN: u32 = 16;
/// Counter files read, at most, per directory.
const MAX_COUNTER_FILES: usize = 512;
/// Bytes read from one counter file, at most.
const MAX_COUNTER_FILE_BYTES: u64 = 64;

/// An open RDMA device: its first active port (or the one named device's),
/// one protection domain for every registration and queue pair, and the
/// node's identity for handshakes.
pub struct RdmaDevice {
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) context: Arc<Context>,
    pub(crate) port: u8,
    pub(crate) attributes: DeviceAttributes,
    pub(crate) config: DeviceConfig,
    budget: Arc<Mutex<RegistrationBudget>>,
    live_connections: Arc<AtomicU32>,
    /// Failed connection attempts on any listener of this device (as the
    /// tcp backend counts them).
    pub(crate) rejected: Arc<AtomicU64>,
    /// Its listeners' caps on unproven connections, and its member sources.
    pub(crate) gate: Arc<crate::gate::Gate>,
}

impl std::fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaDevice")
            .field("name", &self.context.name())
            .field("port", &self.port)
            .finish()
    }
}

impl RdmaDevice {
    /// Opens device `name` (e.g. `rxe0`), or, with `None`, the first device
    /// that has an ACTIVE port.
    pub fn open(name: Option<&str>, config: DeviceConfig) -> Result<RdmaDevice> {
        let list = DeviceList::new().map_err(|e| {
            let cause = if e.raw_os_error() == Some(libc::ENOSYS) {
                "this kernel has no RDMA support".to_string()
            } else {
                format!("ibv_get_device_list failed: {e}")
            };
            TransportError::Device(format!(
                "no RDMA device: {cause} (use the tcp backend, or Soft-RoCE: `rdma link add rxe0 type rxe netdev <if>`)"
            ))
        })?;
        if list.len() == 0 {
            return Err(TransportError::Device(
                "no RDMA device: ibv_get_device_list returned 0 devices (no RNIC and no Soft-RoCE link; \
                 `rdma link add rxe0 type rxe netdev <if>` makes one, or use the tcp backend)"
                    .to_string(),
            ));
        }
        let names: Vec<(usize, String)> = (0..list.len())
            .filter_map(|i| list.name(i).map(|n| (i, n)))
            .collect();
        let mut reasons = Vec::new();
        for (index, device_name) in &names {
            if name.is_some_and(|wanted| wanted != device_name) {
                continue;
            }
            match RdmaDevice::open_index(&list, *index, &config) {
                Ok(device) => return Ok(device),
                Err(e) => reasons.push(format!("{device_name}: {e}")),
            }
        }
        let found: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
        Err(TransportError::Device(match name {
            Some(wanted) if reasons.is_empty() => format!(
                "no RDMA device named {wanted} (found: {})",
                found.join(", ")
            ),
            _ => format!(
                "no usable RDMA device with an ACTIVE port: {}",
                reasons.join("; ")
            ),
        }))
    }

    fn open_index(list: &DeviceList, index: usize, config: &DeviceConfig) -> Result<RdmaDevice> {
        let context = Arc::new(
            list.open(index)
                .map_err(TransportError::io("ibv_open_device"))?,
        );
        let attributes = context.query_device().map_err(TransportError::io(format!(
            "ibv_query_device on {}",
            context.name()
        )))?;
        let mut port = None;
        for candidate in 1..=attributes.phys_port_cnt {
            let attr = context
                .query_port(candidate)
                .map_err(TransportError::io(format!(
                    "ibv_query_port {candidate} on {}",
                    context.name()
                )))?;
            if attr.state == ibv_port_state::IBV_PORT_ACTIVE {
                port = Some(candidate);
                break;
            }
        }
        let port = port.ok_or_else(|| TransportError::Device("no ACTIVE port".to_string()))?;
        let pd = ProtectionDomain::new(context.clone()).map_err(TransportError::io(format!(
            "ibv_alloc_pd on {}",
            context.name()
        )))?;
        tracing::debug!(device = %context.name(), port, ?attributes, "rdma device open");
        Ok(RdmaDevice {
            pd,
            context,
            port,
            attributes,
            config: config.clone(),
            budget: Arc::new(Mutex::new(RegistrationBudget::default())),
            live_connections: Arc::new(AtomicU32::new(0)),
            rejected: Arc::new(AtomicU64::new(0)),
            gate: crate::gate::Gate::new(&config.limits),
        })
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        self.context.name()
    }

    /// How remote atomics relate to CPU atomics (`atomic_cap`).
    pub fn atomic_capability(&self) -> AtomicCapability {
        atomic_capability_of(self.attributes.atomic_cap)
    }

    /// The port's counters: every readable number in
    /// `/sys/class/infiniband/<dev>/ports/<port>/hw_counters/` (named
    /// `hw_counters/<file>`) and `.../counters/` (named `counters/<file>`),
    /// sorted by name; empty where sysfs has none.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let port_dir = format!(
            "/sys/class/infiniband/{}/ports/{}",
            self.context.name(),
            self.port
        );
        let mut out = Vec::new();
        for dir in ["hw_counters", "counters"] {
            let Ok(entries) = std::fs::read_dir(format!("{port_dir}/{dir}")) else {
                continue;
            };
            for entry in entries.flatten().take(MAX_COUNTER_FILES) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(value) = read_counter(&entry.path()) {
                    out.push((format!("{dir}/{name}"), value));
                }
            }
        }
        out.sort();
        out
    }

    /// Registers application memory.
    ///
    /// # Safety
    /// As [`crate::Device::register`]: `[addr, addr + len)` stays valid
    /// until the region is dropped, and the device may write it at any
    /// moment `access` allows.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<RdmaRegion> {
        if len == 0 {
            return Err(TransportError::Invalid("cannot register 0 bytes".into()));
        }
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(TransportError::Invalid(
                "region wraps the address space".into(),
            ));
        }
        if len as u64 > self.attributes.max_mr_size {
            return Err(TransportError::Limit {
                what: "bytes per registration (device max_mr_size)",
                limit: self.attributes.max_mr_size,
            });
        }
        let charge = RegistrationBudget::charge(&self.budget, &self.config.limits, len as u64)?;
        let flags = AccessFlags::for_registration(access);
        // SAFETY: forwarded contract: the caller keeps the memory valid until
        // the region (which owns the registration) is dropped.
        let registration = unsafe { MemoryRegistration::new(&self.pd, addr, len, flags) }
            .map_err(|e| registration_error(self.name(), len, e))?;
        Ok(RdmaRegion {
            registration,
            addr,
            flags,
            _charge: charge,
        })
    }

    /// Listens for bootstrap connections on `addr` (`host:port`).
    pub async fn listen(
        self: Arc<Self>,
        addr: &str,
        config: ConnConfig,
        policy: AcceptPolicy,
    ) -> Result<super::RdmaListener> {
        crate::bootstrap::listen(self, addr, config, policy).await
    }

    /// Connects to the listener at `addr`, revealing `app_data` once the
    /// peer has proven the cluster secret.
    pub async fn connect(
        self: Arc<Self>,
        addr: &str,
        config: ConnConfig,
        app_data: Vec<u8>,
    ) -> Result<super::RdmaConnection> {
        super::bootstrap::connect(self, addr, config, app_data).await
    }

    /// The port's current attributes.
    pub(crate) fn port_attributes(&self) -> Result<PortAttributes> {
        self.context
            .query_port(self.port)
            .map_err(TransportError::io(format!(
                "ibv_query_port {} on {}",
                self.port,
                self.name()
            )))
    }

    /// The GID (and its index) this node's traffic should come from: the
    /// IPv4-mapped GID of `local_ip` (the bootstrap socket's address) when
    /// the device has one, else the first IPv4-mapped RoCEv2 GID.
    pub(crate) fn local_gid(&self, local_ip: Option<IpAddr>) -> Result<(u8, Gid)> {
        let port = self.port_attributes()?;
        let mut candidates = Vec::new();
        let mut empty_run = 0;
        for index in 0..port.gid_tbl_len.min(MAX_GID_SCAN) {
            let gid = match self.context.query_gid(self.port, index) {
                Ok(gid) => gid,
                Err(_) => Gid([0; 16]),
            };
            if gid.is_zero() {
                empty_run += 1;
                if empty_run >= MAX_EMPTY_GID_RUN {
                    break;
                }
                continue;
            }
            empty_run = 0;
            if let Some(ip) = gid.ipv4_mapped() {
                candidates.push(GidCandidate {
                    index,
                    gid,
                    ip,
                    roce_v2: self.gid_is_roce_v2(index),
                });
            }
        }
        let prefer = match local_ip {
            Some(IpAddr::V4(ip)) => Some(ip),
            Some(IpAddr::V6(ip)) => ip.to_ipv4_mapped(),
            None => None,
        };
        let chosen = pick_gid(&candidates, prefer).ok_or_else(|| {
            TransportError::Device(format!(
                "{} port {} has no IPv4-mapped GID (is its netdev up with an IPv4 address?)",
                self.name(),
                self.port
            ))
        })?;
        let index = u8::try_from(chosen.index).map_err(|_| {
            TransportError::Device(format!(
                "GID index {} does not fit the address handle",
                chosen.index
            ))
        })?;
        Ok((index, chosen.gid))
    }

    /// Whether GID `index` is RoCE v2 (one sysfs file for one candidate;
    /// `None` when the type is not published).
    fn gid_is_roce_v2(&self, index: u32) -> Option<bool> {
        let path = format!(
            "/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{index}",
            self.name(),
            self.port
        );
        let text = std::fs::read_to_string(path).ok()?;
        Some(text.trim().eq_ignore_ascii_case("RoCE v2"))
    }

    /// Reserves a connection slot, or fails at the device's limit.
    pub(crate) fn reserve_connection(&self) -> Result<ConnSlot> {
        ConnSlot::reserve(&self.live_connections, self.config.limits.max_connections)
    }
}

fn registration_error(device: &str, len: usize, e: std::io::Error) -> TransportError {
    let hint = if e.raw_os_error() == Some(libc::ENOMEM) || e.raw_os_error() == Some(libc::EPERM) {
        " (is RLIMIT_MEMLOCK high enough? `ulimit -l`)"
    } else if e.raw_os_error() == Some(libc::EFAULT) {
        // Linux >= 6.5 refuses long-term writable pins of page-cache file
        // mappings (measured on 6.12 with ext4).
        " (is it a mapping of a file on a disk? Linux >= 6.5 cannot pin those for remote \
         writes: keep the ring dir on a tmpfs such as /dev/shm)"
    } else {
        ""
    };
    TransportError::Io {
        op: format!("ibv_reg_mr of {len} bytes on {device}{hint}"),
        source: e,
    }
}

fn read_counter(path: &std::path::Path) -> Option<u64> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_COUNTER_FILE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

/// `ibv_device_attr.atomic_cap` as the API names it.
pub(crate) fn atomic_capability_of(atomic_cap: u32) -> AtomicCapability {
    match atomic_cap {
        ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCapability::Hca,
        ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCapability::Global,
        _ => AtomicCapability::None,
    }
}

/// An IPv4-mapped GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidCandidate {
    pub index: u32,
    pub gid: Gid,
    pub ip: Ipv4Addr,
    /// `None` when the GID type is unknown.
    pub roce_v2: Option<bool>,
}

/// The entry to use: the one of `prefer` if any, RoCE v2 (or of unknown
/// type) before RoCE v1, lowest index first.
pub(crate) fn pick_gid(
    candidates: &[GidCandidate],
    prefer: Option<Ipv4Addr>,
) -> Option<GidCandidate> {
    candidates
        .iter()
        .min_by_key(|c| (Some(c.ip) != prefer, c.roce_v2 == Some(false), c.index))
        .copied()
}

/// Registrations and bytes registered by the application on one device.
#[derive(Default)]
struct RegistrationBudget {
    regions: u32,
    bytes: u64,
}

impl RegistrationBudget {
    fn charge(
        budget: &Arc<Mutex<RegistrationBudget>>,
        limits: &crate::types::DeviceLimits,
        bytes: u64,
    ) -> Result<Charge> {
        let mut b = budget.lock().unwrap_or_else(|p| p.into_inner());
        if b.regions >= limits.max_regions {
            return Err(TransportError::Limit {
                what: "registrations per device",
                limit: limits.max_regions as u64,
            });
        }
        if b.bytes.saturating_add(bytes) > limits.max_registered_bytes {
            return Err(TransportError::Limit {
                what: "registered bytes per device",
                limit: limits.max_registered_bytes,
            });
        }
        b.regions += 1;
        b.bytes += bytes;
        Ok(Charge {
            budget: budget.clone(),
            bytes,
        })
    }
}

/// One registration's share of the budget, given back on drop.
struct Charge {
    budget: Arc<Mutex<RegistrationBudget>>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut b = self.budget.lock().unwrap_or_else(|p| p.into_inner());
        b.regions = b.regions.saturating_sub(1);
        b.bytes = b.bytes.saturating_sub(self.bytes);
    }
}

/// An application memory registration. Dropping it deregisters the memory:
/// its rkey stops working.
pub struct RdmaRegion {
    // Field order: the registration goes before its budget share.
    registration: MemoryRegistration,
    addr: *mut u8,
    flags: AccessFlags,
    _charge: Charge,
}

// SAFETY: `addr` is only used to register the same memory again (`rotate`),
// which is allowed from any thread; the registration is Send.
unsafe impl Send for RdmaRegion {}
// SAFETY: `&RdmaRegion` only exposes the rkey.
unsafe impl Sync for RdmaRegion {}

impl std::fmt::Debug for RdmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaRegion")
            .field("addr", &self.registration.addr())
            .field("len", &self.registration.len())
            .field("rkey", &self.registration.rkey())
            .finish()
    }
}

impl RdmaRegion {
    /// The current rkey.
    pub fn rkey(&self) -> u32 {
        self.registration.rkey()
    }

    /// Registers the same memory anew, then deregisters the old
    /// registration: the new rkey differs (both exist for a moment) and the
    /// old one is refused once this returns.
    pub fn rotate(&mut self) -> Result<()> {
        let pd = self.registration_pd();
        let len = self.registration.len();
        // SAFETY: the same memory, under the contract the region was created
        // with (valid until the region is dropped); the new registration
        // replaces the old one inside the region.
        let fresh = unsafe { MemoryRegistration::new(&pd, self.addr, len, self.flags) }
            .map_err(|e| registration_error(pd.context().name(), len, e))?;
        if fresh.rkey() == self.registration.rkey() {
            // Impossible while the old registration exists; refuse rather than
            // pretend the old key was revoked.
            return Err(TransportError::Device(format!(
                "re-registration returned the live rkey {:#x}",
                fresh.rkey()
            )));
        }
        // Dropping the old registration deregisters it.
        self.registration = fresh;
        Ok(())
    }

    fn registration_pd(&self) -> Arc<ProtectionDomain> {
        self.registration.pd().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(index: u32, last: u8, roce_v2: Option<bool>) -> GidCandidate {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[10, 0, 0, last]);
        GidCandidate {
            index,
            gid: Gid(raw),
            ip: Ipv4Addr::new(10, 0, 0, last),
            roce_v2,
        }
    }

    #[test]
    fn gid_choice() {
        let v1 = candidate(2, 5, Some(false));
        let v2 = candidate(3, 5, Some(true));
        let other = candidate(5, 6, Some(true));
        assert_eq!(pick_gid(&[v1, v2, other], None), Some(v2), "RoCE v2 first");
        assert_eq!(
            pick_gid(&[v1, v2, other], Some(Ipv4Addr::new(10, 0, 0, 6))),
            Some(other),
            "the bootstrap address"
        );
        assert_eq!(
            pick_gid(&[v1, v2, other], Some(Ipv4Addr::LOCALHOST)),
            Some(v2),
            "loopback: any"
        );
        let unknown = candidate(1, 5, None);
        assert_eq!(
            pick_gid(&[unknown, v2], None),
            Some(unknown),
            "rxe: index 1, type unpublished"
        );
        assert_eq!(pick_gid(&[], None), None);
    }

    #[test]
    fn atomic_capabilities() {
        assert_eq!(
            atomic_capability_of(ibv_atomic_cap::IBV_ATOMIC_HCA),
            AtomicCapability::Hca
        );
        assert_eq!(
            atomic_capability_of(ibv_atomic_cap::IBV_ATOMIC_GLOB),
            AtomicCapability::Global
        );
        assert_eq!(
            atomic_capability_of(ibv_atomic_cap::IBV_ATOMIC_NONE),
            AtomicCapability::None
        );
        assert_eq!(atomic_capability_of(77), AtomicCapability::None);
    }

    #[test]
    fn open_without_a_device_is_a_clear_error() {
        // On a host without RDMA (no /sys/class/infiniband_verbs entries),
        // opening fails with a device error that says so; where a device
        // exists (the Soft-RoCE lab) opening it must work.
        let has_devices = std::fs::read_dir("/sys/class/infiniband_verbs")
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("uverbs"))
            })
            .unwrap_or(false);
        let config = DeviceConfig {
            node_id: 1,
            secret: crate::Secret::new(b"0123456789abcdef".to_vec()).expect("16 bytes"),
            limits: Default::default(),
        };
        match RdmaDevice::open(None, config.clone()) {
            Err(TransportError::Device(message)) if !has_devices => {
                assert!(message.contains("RDMA"), "{message}");
            }
            Err(e) => assert!(!has_devices, "a device exists but open failed: {e}"),
            Ok(device) => assert!(has_devices, "opened {device:?} without a device"),
        }
        match RdmaDevice::open(Some("no-such-device0"), config) {
            Err(TransportError::Device(message)) => assert!(
                message.contains("RDMA") || message.contains("no-such-device0"),
                "{message}"
            ),
            other => panic!("expected a device error, got {other:?}"),
        }
    }
}
