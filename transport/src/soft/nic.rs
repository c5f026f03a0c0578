//! The responder half of the software RNIC: the registration table and the
//! execution of one-sided operations against registered memory.
//!
//! This is what a real RNIC does in hardware, and like one it runs none of
//! the application's code: it checks the queue pair's access flags, the
//! rkey, the bounds and the registration's access flags, in that order (as
//! rxe does), then touches the memory. Atomics are CPU atomics on 8-byte
//! aligned words, so they are atomic against the application's own atomics
//! too (what verbs calls `IBV_ATOMIC_GLOB`).
//!
//! rkeys are random (a guessed rkey is write access to a region): drawn
//! from the device's [`Entropy`], the OS's for every real device, a seeded
//! generator only for a device seeded explicitly (the in-process fabric's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::entropy::Entropy;
use crate::error::{Result, TransportError, WcError};
use crate::inproc::{LandingSink, Moment};
use crate::limits;
use crate::types::{Access, DeviceLimits};
use crate::work::{Done, Request};

#[derive(Clone, Copy, Debug)]
struct Registration {
    addr: u64,
    len: u64,
    access: Access,
}

#[derive(Default)]
struct Table {
    by_rkey: HashMap<u32, Registration>,
    registered_bytes: u64,
}

/// A WRITE admitted by [`SoftNic::admit`], not copied yet.
#[derive(Debug)]
pub(crate) struct Admitted {
    addr: u64,
}

/// The registration table and executor of one software device.
pub(crate) struct SoftNic {
    table: RwLock<Table>,
    limits: DeviceLimits,
    /// Where new rkeys come from.
    entropy: Arc<Entropy>,
    /// One-sided requests refused (access or invalid request), like a NIC's
    /// error counters.
    pub(crate) refused: std::sync::atomic::AtomicU64,
    /// Shown the WRITEs that land (the inproc fabric's devices only).
    landings: Option<LandingSink>,
}

impl SoftNic {
    pub(crate) fn new(limits: DeviceLimits, entropy: Arc<Entropy>) -> SoftNic {
        SoftNic {
            table: RwLock::new(Table::default()),
            limits,
            entropy,
            refused: std::sync::atomic::AtomicU64::new(0),
            landings: None,
        }
    }

    /// Shows `sink` every WRITE that lands from now on.
    pub(crate) fn observe(&mut self, sink: LandingSink) {
        self.landings = Some(sink);
    }

    /// Registers `len` bytes at `addr` and returns the new rkey.
    ///
    /// The caller (`Device::register`, an unsafe fn) guarantees the memory
    /// stays valid until [`SoftNic::deregister`].
    pub(crate) fn register(&self, addr: u64, len: u64, access: Access) -> Result<u32> {
        if len == 0 {
            return Err(TransportError::Invalid("cannot register 0 bytes".into()));
        }
        if addr.checked_add(len).is_none() {
            return Err(TransportError::Invalid(
                "region wraps the address space".into(),
            ));
        }
        let mut table = self.table.write().expect("registration table lock");
        if table.by_rkey.len() as u32 >= self.limits.max_regions {
            return Err(TransportError::Limit {
                what: "registrations per device",
                limit: self.limits.max_regions as u64,
            });
        }
        if table.registered_bytes + len > self.limits.max_registered_bytes {
            return Err(TransportError::Limit {
                what: "registered bytes per device",
                limit: self.limits.max_registered_bytes,
            });
        }
        let rkey = fresh_key(&table.by_rkey, &self.entropy);
        table
            .by_rkey
            .insert(rkey, Registration { addr, len, access });
        table.registered_bytes += len;
        Ok(rkey)
    }

    /// Removes a registration. Waits for operations executing on it (they
    /// hold the table's read lock).
    pub(crate) fn deregister(&self, rkey: u32) {
        let mut table = self.table.write().expect("registration table lock");
        if let Some(r) = table.by_rkey.remove(&rkey) {
            table.registered_bytes -= r.len;
        }
    }

    /// Gives a registration a new rkey; the old one stops working at once.
    pub(crate) fn rotate(&self, rkey: u32) -> Result<u32> {
        let mut table = self.table.write().expect("registration table lock");
        let registration = table
            .by_rkey
            .remove(&rkey)
            .ok_or_else(|| TransportError::Invalid(format!("rkey {rkey:#x} is not registered")))?;
        let new = fresh_key(&table.by_rkey, &self.entropy);
        debug_assert_ne!(new, rkey);
        table.by_rkey.insert(new, registration);
        Ok(new)
    }

    /// Executes a one-sided request arriving on a queue pair whose remote
    /// access flags are `qp_access`. SEND is not one-sided: the connection
    /// handles it.
    pub(crate) fn execute(&self, request: &Request, qp_access: Access) -> Result<Done, WcError> {
        let result = self.execute_checked(request, qp_access);
        match (&result, request, &self.landings) {
            (Err(_), _, _) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            // After the copy and outside the table's lock: the observer may
            // look at the node (which may be rotating an rkey) freely.
            (Ok(_), Request::Write { addr, data, .. }, Some(sink)) => {
                sink.landed(*addr, data, Moment::Landed)
            }
            (Ok(_), _, _) => {}
        }
        result
    }

    /// Admits a WRITE (every check [`SoftNic::execute`] makes) without
    /// copying it: [`SoftNic::land`] copies it later. What a NIC does with
    /// a WRITE it accepted while its DMA into host memory is still under
    /// way: an rkey rotated in between does not stop it.
    pub(crate) fn admit(&self, request: &Request, qp_access: Access) -> Result<Admitted, WcError> {
        let Request::Write { addr, data, .. } = request else {
            unreachable!("only a WRITE is admitted for a later copy");
        };
        let table = self.table.read().expect("registration table lock");
        let admitted = self.target(&table, request, qp_access);
        drop(table);
        match admitted {
            Ok(_) => {
                if let Some(sink) = &self.landings {
                    sink.landed(*addr, data, Moment::Admitted);
                }
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        admitted.map(|_| Admitted { addr: *addr })
    }

    /// Copies an admitted WRITE's `data`, if its memory is still registered
    /// (under any rkey: a rotation keeps the registration, a
    /// deregistration ends it, and then nothing is copied).
    pub(crate) fn land(&self, admitted: Admitted, data: &[u8]) -> Result<Done, WcError> {
        let addr = admitted.addr;
        let end = addr + data.len() as u64;
        let table = self.table.read().expect("registration table lock");
        let live = table.by_rkey.values().any(|r| {
            r.access.contains(Access::REMOTE_WRITE) && addr >= r.addr && end <= r.addr + r.len
        });
        if !live {
            return Err(WcError::RemoteAccess);
        }
        // SAFETY: [addr, end) lies inside a live registration (checked just
        // now, under the read lock that deregister waits for), whose owner
        // promised the memory stays valid and may be written by the device.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len())
        };
        drop(table);
        if let Some(sink) = &self.landings {
            sink.landed(addr, data, Moment::LandedLate);
        }
        Ok(Done::Ok)
    }

    /// The checks of a one-sided request, in rxe's order, against `table`:
    /// the target address and length.
    fn target(
        &self,
        table: &Table,
        request: &Request,
        qp_access: Access,
    ) -> Result<(u64, u64), WcError> {
        let (addr, rkey, len, need) = match request {
            Request::Write {
                addr, rkey, data, ..
            } => (*addr, *rkey, data.len() as u64, Access::REMOTE_WRITE),
            Request::Read { addr, rkey, len } => (*addr, *rkey, *len as u64, Access::REMOTE_READ),
            Request::CompareSwap { addr, rkey, .. } | Request::FetchAdd { addr, rkey, .. } => {
                (*addr, *rkey, 8, Access::REMOTE_ATOMIC)
            }
            Request::Send { .. } => unreachable!("SEND goes to the receive queue"),
        };
        if !qp_access.contains(need) {
            return Err(WcError::RemoteInvalidRequest);
        }
        if need == Access::REMOTE_ATOMIC && !limits::atomic_aligned(addr) {
            return Err(WcError::RemoteInvalidRequest);
        }
        let region = table.by_rkey.get(&rkey).ok_or(WcError::RemoteAccess)?;
        let end = addr.checked_add(len).ok_or(WcError::RemoteAccess)?;
        if addr < region.addr || end > region.addr + region.len {
            return Err(WcError::RemoteAccess);
        }
        if !region.access.contains(need) {
            return Err(WcError::RemoteAccess);
        }
        Ok((addr, len))
    }

    fn execute_checked(&self, request: &Request, qp_access: Access) -> Result<Done, WcError> {
        let table = self.table.read().expect("registration table lock");
        let (addr, _) = self.target(&table, request, qp_access)?;
        let ptr = addr as usize as *mut u8;
        // SAFETY (all arms): [addr, addr + len) lies inside a live
        // registration (checked above, under the read lock that deregister
        // waits for), whose owner promised at registration that the memory
        // stays valid and may be written by the device. Atomics are 8-byte
        // aligned (checked above).
        Ok(match request {
            Request::Write { data, .. } => {
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
                Done::Ok
            }
            Request::Read { len, .. } => {
                let mut out = vec![0u8; *len as usize];
                unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
                Done::Data(out)
            }
            Request::CompareSwap { expected, new, .. } => {
                let word = unsafe { AtomicU64::from_ptr(ptr as *mut u64) };
                Done::Word(
                    match word.compare_exchange(
                        *expected,
                        *new,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(v) | Err(v) => v,
                    },
                )
            }
            Request::FetchAdd { add, .. } => {
                let word = unsafe { AtomicU64::from_ptr(ptr as *mut u64) };
                Done::Word(word.fetch_add(*add, Ordering::AcqRel))
            }
            Request::Send { .. } => unreachable!(),
        })
    }
}

/// An rkey not in use (and never 0), drawn from `entropy`.
fn fresh_key(taken: &HashMap<u32, Registration>, entropy: &Entropy) -> u32 {
    loop {
        let key = entropy.word();
        if key != 0 && !taken.contains_key(&key) {
            return key;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NIC with the default limits and all of `mem` registered with
    /// `access`: the NIC, the memory's address and its rkey.
    fn nic_over(mem: &mut [u64], access: Access) -> (SoftNic, u64, u32) {
        let nic = SoftNic::new(DeviceLimits::default(), Arc::new(Entropy::os()));
        let addr = mem.as_mut_ptr() as u64;
        let rkey = nic.register(addr, size_of_val(mem) as u64, access).unwrap();
        (nic, addr, rkey)
    }

    #[test]
    fn checks_come_in_rxe_order() {
        let mut mem = vec![0u64; 4];
        let (nic, addr, rkey) = nic_over(&mut mem, Access::REMOTE_READ | Access::LOCAL_WRITE);
        // On a queue pair open to every remote operation.
        let execute = |request: &Request| nic.execute(request, Access::ALL_REMOTE);
        let write = Request::Write {
            addr,
            rkey,
            data: vec![1; 8],
            imm: None,
        };
        // QP flags first: invalid request even with a bad rkey.
        let bad_key = Request::Write {
            addr,
            rkey: rkey ^ 1,
            data: vec![1],
            imm: None,
        };
        assert_eq!(
            nic.execute(&bad_key, Access::REMOTE_READ),
            Err(WcError::RemoteInvalidRequest)
        );
        assert_eq!(execute(&bad_key), Err(WcError::RemoteAccess));
        // Registration without REMOTE_WRITE.
        assert_eq!(execute(&write), Err(WcError::RemoteAccess));
        let read = Request::Read {
            addr: addr + 24,
            rkey,
            len: 16,
        };
        assert_eq!(execute(&read), Err(WcError::RemoteAccess), "out of bounds");
        let read = Request::Read {
            addr: addr + 24,
            rkey,
            len: 8,
        };
        assert_eq!(execute(&read), Ok(Done::Data(vec![0; 8])));
        nic.deregister(rkey);
        assert_eq!(execute(&read), Err(WcError::RemoteAccess));
        drop(mem);
    }

    #[test]
    fn atomics_and_rotation() {
        let mut mem = vec![5u64; 2];
        let (nic, addr, rkey) = nic_over(&mut mem, Access::REMOTE_ATOMIC | Access::LOCAL_WRITE);
        // On a queue pair open to every remote operation.
        let execute = |request: &Request| nic.execute(request, Access::ALL_REMOTE);
        let cas = |rkey, expected, new| Request::CompareSwap {
            addr,
            rkey,
            expected,
            new,
        };
        assert_eq!(execute(&cas(rkey, 5, 9)), Ok(Done::Word(5)));
        assert_eq!(execute(&cas(rkey, 5, 7)), Ok(Done::Word(9)));
        let fadd = Request::FetchAdd {
            addr: addr + 8,
            rkey,
            add: 3,
        };
        assert_eq!(execute(&fadd), Ok(Done::Word(5)));
        let unaligned = Request::FetchAdd {
            addr: addr + 4,
            rkey,
            add: 1,
        };
        assert_eq!(execute(&unaligned), Err(WcError::RemoteInvalidRequest));
        let new = nic.rotate(rkey).unwrap();
        assert_ne!(new, rkey);
        assert_eq!(execute(&cas(rkey, 9, 1)), Err(WcError::RemoteAccess));
        assert_eq!(execute(&cas(new, 9, 1)), Ok(Done::Word(9)));
        assert_eq!(mem, vec![1, 8]);
    }

    #[test]
    fn a_seeded_nic_hands_out_the_same_rkeys() {
        let mut mem = vec![0u8; 64];
        let addr = mem.as_mut_ptr() as u64;
        let keys = |seed| {
            let nic = SoftNic::new(DeviceLimits::default(), Arc::new(Entropy::seeded(seed)));
            let first = nic.register(addr, 64, Access::REMOTE_WRITE).unwrap();
            let rotated = nic.rotate(first).unwrap();
            (first, rotated)
        };
        assert_eq!(keys(3), keys(3));
        assert_ne!(keys(3), keys(4));
        drop(mem);
    }

    #[test]
    fn limits_are_enforced() {
        let nic = SoftNic::new(
            DeviceLimits {
                max_registered_bytes: 100,
                max_regions: 2,
                max_connections: 1,
                ..DeviceLimits::default()
            },
            Arc::new(Entropy::os()),
        );
        let mut mem = vec![0u8; 200];
        let addr = mem.as_mut_ptr() as u64;
        assert!(matches!(
            nic.register(addr, 101, Access::REMOTE_READ),
            Err(TransportError::Limit { .. })
        ));
        nic.register(addr, 50, Access::REMOTE_READ).unwrap();
        nic.register(addr, 50, Access::REMOTE_READ).unwrap();
        assert!(matches!(
            nic.register(addr, 1, Access::REMOTE_READ),
            Err(TransportError::Limit { .. })
        ));
        assert!(nic.register(addr, 0, Access::REMOTE_READ).is_err());
        drop(mem);
    }
}
