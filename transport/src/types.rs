//! Plain types shared by every backend: access flags, remote addresses,
//! connection parameters and limits.

use std::time::Duration;

use serde::{Deserialize, Serialize};

bitflags::bitflags! {
    /// What a memory registration (or a connection) allows, as verbs'
    /// `ibv_access_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    pub struct Access: u32 {
        /// The local NIC may write the memory (needed by any remote write or
        /// atomic, and by receives).
        const LOCAL_WRITE = 1;
        /// Remote peers may WRITE into it.
        const REMOTE_WRITE = 2;
        /// Remote peers may READ it.
        const REMOTE_READ = 4;
        /// Remote peers may run atomics (CAS, fetch-and-add) on it.
        const REMOTE_ATOMIC = 8;
    }
}

impl Access {
    /// Everything a peer may do remotely.
    pub const ALL_REMOTE: Access = Access::REMOTE_WRITE
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);
}

/// Which implementation carries the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Backend {
    /// Real RDMA through libibverbs (RNICs, Soft-RoCE).
    Rdma,
    /// The software RNIC over TCP.
    Tcp,
    /// The in-process fabric.
    Inproc,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Rdma => "rdma",
            Backend::Tcp => "tcp",
            Backend::Inproc => "inproc",
        })
    }
}

/// How remote atomics relate to the CPU's atomics on the same memory
/// (`ibv_device_attr.atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AtomicCapability {
    /// No remote atomics.
    None,
    /// Atomic only against other atomics of the same device
    /// (`IBV_ATOMIC_HCA`, what rxe and most NICs report): a node must change
    /// its own fence word through a loopback connection.
    Hca,
    /// Atomic against the CPU too (`IBV_ATOMIC_GLOB`).
    Global,
}

/// A memory registration as a peer sees it: enough to address it remotely.
///
/// `addr` is the address in the owner's address space (verbs semantics:
/// remote operations name owner virtual addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// First byte, in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The key that authorizes access.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The address `offset` bytes into the region, or `None` when
    /// `offset + len` runs past its end.
    pub fn at(&self, offset: u64, len: u64) -> Option<RemoteAddr> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteAddr {
            addr: self.addr + offset,
            rkey: self.rkey,
        })
    }

    /// The first byte of the region.
    pub fn start(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr,
            rkey: self.rkey,
        }
    }
}

/// One remote address and the key to reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteAddr {
    /// Address in the owner's address space.
    pub addr: u64,
    /// The key of the registration it lies in.
    pub rkey: u32,
}

/// A message taken from the receive queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// A SEND.
    Message(Vec<u8>),
    /// A WRITE with immediate: the data went to memory, this is the
    /// immediate value.
    WriteImmediate(u32),
}

/// Reliable-connected queue pair parameters, and our own limits above them.
///
/// `retry_count` and `rnr_retry` are at most 6: rxe treats 7 as "retry
/// forever", so a partitioned connection would hang instead of failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnConfig {
    /// Transport retries before `RetryExceeded` (0..=6).
    pub retry_count: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^`ack_timeout_exp` per try.
    pub ack_timeout_exp: u8,
    /// Receiver-not-ready retries before `RnrRetryExceeded` (0..=6).
    pub rnr_retry: u8,
    /// Wait between receiver-not-ready retries.
    pub rnr_delay: Duration,
    /// Largest number of posted, uncompleted work requests.
    pub max_outstanding: u32,
    /// Receive buffers posted at connect time.
    pub recv_depth: u32,
    /// Post a new receive buffer each time a message is taken.
    pub auto_repost: bool,
    /// Largest SEND, in bytes.
    pub max_message_bytes: u32,
    /// Largest single WRITE or READ, in bytes. A peer's WRITE or READ
    /// above ours is refused (remote invalid request) and the connection
    /// closed; so is a frame above it plus headers (`tcp`).
    pub max_transfer_bytes: u32,
    /// Bytes of the peer's requests (WRITE and SEND data) that may wait
    /// for the software RNIC's responder at once (behind a SEND with no
    /// posted receive, say); a peer that sends more is flooding, and the
    /// connection is closed (`tcp`, `inproc`).
    pub max_backlog_bytes: u64,
    /// Busy-poll the completion queue instead of waiting on the completion
    /// channel (rdma backend; lower latency, one core spinning).
    pub busy_poll: bool,
    /// Time allowed for the bootstrap handshake.
    pub handshake_timeout: Duration,
    /// Time a peer that connected to one of our listeners has to prove the
    /// cluster secret, from the moment it was accepted (the rest of the
    /// handshake then has `handshake_timeout`). Short: a member proves it
    /// in two round trips, and an unproven connection holds a place in the
    /// device's [`DeviceLimits::max_unauthenticated`].
    pub auth_timeout: Duration,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            retry_count: 6,
            ack_timeout_exp: 14,
            rnr_retry: 6,
            rnr_delay: Duration::from_millis(10),
            max_outstanding: 256,
            recv_depth: 64,
            auto_repost: true,
            max_message_bytes: 64 << 10,
            max_transfer_bytes: 16 << 20,
            max_backlog_bytes: 256 << 20,
            busy_poll: false,
            handshake_timeout: Duration::from_secs(5),
            auth_timeout: Duration::from_secs(2),
        }
    }
}

impl ConnConfig {
    /// Largest value `retry_count` and `rnr_retry` may take.
    pub const MAX_RETRY: u8 = 6;
    /// Receive buffers an `rdma` connection holds, at least.
    pub const MIN_RECV_SLOTS: u32 = 16;

    /// The receive buffers an `rdma` connection allocates and registers
    /// up front: `max(recv_depth, 16)` of `max_message_bytes` each (64 MiB
    /// with the node's defaults), whether or not a message ever comes.
    /// The other backends allocate a message when it arrives.
    pub fn rdma_receive_bytes(&self) -> u64 {
        u64::from(self.recv_depth.max(Self::MIN_RECV_SLOTS)) * u64::from(self.max_message_bytes)
    }

    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_count > Self::MAX_RETRY || self.rnr_retry > Self::MAX_RETRY {
            return Err(format!(
                "retry_count {} and rnr_retry {} must be at most {} (7 means retry forever on rxe)",
                self.retry_count,
                self.rnr_retry,
                Self::MAX_RETRY
            ));
        }
        if self.ack_timeout_exp == 0 || self.ack_timeout_exp > 31 {
            return Err(format!(
                "ack_timeout_exp {} is not in 1..=31",
                self.ack_timeout_exp
            ));
        }
        if self.max_outstanding == 0 || self.max_outstanding > 16 * 1024 {
            return Err(format!(
                "max_outstanding {} is not in 1..=16384",
                self.max_outstanding
            ));
        }
        if self.recv_depth > 16 * 1024 {
            return Err(format!("recv_depth {} is above 16384", self.recv_depth));
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > 16 << 20 {
            return Err(format!(
                "max_message_bytes {} is not in 1..=16 MiB",
                self.max_message_bytes
            ));
        }
        if self.max_transfer_bytes == 0 || self.max_transfer_bytes > 1 << 30 {
            return Err(format!(
                "max_transfer_bytes {} is not in 1..=1 GiB",
                self.max_transfer_bytes
            ));
        }
        let largest_request = u64::from(self.max_transfer_bytes.max(self.max_message_bytes));
        if self.max_backlog_bytes < largest_request {
            return Err(format!(
                "max_backlog_bytes {} is below the largest request ({largest_request} bytes)",
                self.max_backlog_bytes
            ));
        }
        if self.auth_timeout.is_zero() || self.handshake_timeout.is_zero() {
            return Err(format!(
                "auth_timeout {:?} and handshake_timeout {:?} must be above zero",
                self.auth_timeout, self.handshake_timeout
            ));
        }
        Ok(())
    }

    /// The largest frame the software RNIC takes from a peer on this
    /// connection: the largest WRITE, READ answer or SEND, plus headers.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_transfer_bytes.max(self.max_message_bytes) as usize + FRAME_HEADER_BYTES
    }

    /// How long the transport retries before reporting `RetryExceeded`:
    /// 4.096 µs × 2^exp × (retries + 1).
    pub fn retry_window(&self) -> Duration {
        let per_try_ns = 4096u64 << self.ack_timeout_exp;
        Duration::from_nanos(per_try_ns / 1000 * 1000 * (self.retry_count as u64 + 1))
    }

    /// Our own deadline for any posted work request: the transport's retry
    /// window plus the receiver-not-ready budget, plus slack.
    pub fn op_deadline(&self) -> Duration {
        self.retry_window() + self.rnr_delay * (self.rnr_retry as u32 + 1) + Duration::from_secs(1)
    }
}

/// Room for a software RNIC frame's own fields next to its data.
const FRAME_HEADER_BYTES: usize = 4096;

/// Limits of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest total of registered bytes.
    pub max_registered_bytes: u64,
    /// Largest number of registrations.
    pub max_regions: u32,
    /// Largest number of live connections.
    pub max_connections: u32,
    /// Connections whose peer has not yet proven the cluster secret, at
    /// most, from sources that never proved it (members' sources are not
    /// counted here); more are closed at once.
    pub max_unauthenticated: u32,
    /// Connections whose peer has not yet proven the cluster secret, at
    /// most, from one source address (members' too); more are closed at
    /// once.
    pub max_unauthenticated_per_source: u32,
}

impl Default for DeviceLimits {
    fn default() -> Self {
        DeviceLimits {
            max_registered_bytes: 64 << 30,
            max_regions: 4096,
            max_connections: 1024,
            max_unauthenticated: 256,
            max_unauthenticated_per_source: 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_region_addresses_stay_inside() {
        let r = RemoteRegion {
            addr: 1000,
            len: 64,
            rkey: 7,
        };
        assert_eq!(
            r.at(0, 64),
            Some(RemoteAddr {
                addr: 1000,
                rkey: 7
            })
        );
        assert_eq!(
            r.at(8, 8),
            Some(RemoteAddr {
                addr: 1008,
                rkey: 7
            })
        );
        assert_eq!(r.at(60, 8), None);
        assert_eq!(r.at(u64::MAX, 2), None);
    }

    #[test]
    fn config_bounds() {
        assert!(ConnConfig::default().validate().is_ok());
        let seven = ConnConfig {
            retry_count: 7,
            ..ConnConfig::default()
        };
        assert!(seven.validate().unwrap_err().contains("retry forever"));
        let rnr7 = ConnConfig {
            rnr_retry: 7,
            ..ConnConfig::default()
        };
        assert!(rnr7.validate().is_err());
        // 4.096 µs × 2^14 ≈ 67 ms per try, 7 tries.
        let w = ConnConfig::default().retry_window();
        assert!(
            w > Duration::from_millis(450) && w < Duration::from_millis(480),
            "{w:?}"
        );
    }
}
