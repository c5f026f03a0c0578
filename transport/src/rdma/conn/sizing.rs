//! How big a connection's queues and buffers are: [`Sizing`], from its
//! configuration and the device's limits, with the limits that bound it.
//!
//! Owns the arithmetic only. Never: allocate, register or talk to the
//! device (setup does, with these numbers); a configuration that does not
//! fit is a `Config` error, never a panic.

use super::*;

/// Receive buffers a connection has room for, at least.
pub(crate) const MIN_RECV_SLOTS: u32 = ConnConfig::MIN_RECV_SLOTS;
/// Receive buffer memory per connection, at most.
pub(super) const MAX_RECV_MEMORY_BYTES: u64 = 256 << 20;
/// Send staging ring bytes per allowed outstanding request...
pub(super) const STAGING_BYTES_PER_OUTSTANDING: u64 = 8 << 10;
/// ...but at least this...
pub(super) const MIN_STAGING_RING_BYTES: u64 = 64 << 10;
/// ...and at most this.
pub(super) const MAX_STAGING_RING_BYTES: u64 = 2 << 20;
/// READs/atomics in flight per queue pair and direction, at most.
pub(super) const MAX_RD_ATOMIC: u32 = 16;

/// Sizes of a connection's queues and buffers, from its configuration and
/// the device's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizing {
    pub recv_slots: u32,
    pub recv_slot_bytes: u32,
    pub ring_bytes: usize,
    pub cq_entries: u32,
    pub initiator_depth: u8,
    pub responder_depth: u8,
    /// Largest WRITE/READ: `max_transfer_bytes`, capped by the port.
    pub max_transfer_bytes: u32,
    /// Largest SEND: `max_message_bytes`, capped by the port.
    pub max_message_bytes: u32,
}

impl Sizing {
    pub(crate) fn of(
        config: &ConnConfig,
        max_qp_wr: u32,
        max_cqe: u32,
        max_qp_init_rd_atom: u32,
        max_qp_rd_atom: u32,
        max_msg_sz: u32,
    ) -> Result<Sizing> {
        let recv_slots = config.recv_depth.max(MIN_RECV_SLOTS);
        let recv_memory = config.rdma_receive_bytes();
        if recv_memory > MAX_RECV_MEMORY_BYTES {
            return Err(TransportError::Config(format!(
                "max(recv_depth {}, {MIN_RECV_SLOTS}) receive buffers of max_message_bytes {} is {recv_memory} bytes \
                 per connection, above {MAX_RECV_MEMORY_BYTES}",
                config.recv_depth, config.max_message_bytes
            )));
        }
        if config.max_outstanding > max_qp_wr || recv_slots > max_qp_wr {
            return Err(TransportError::Config(format!(
                "max_outstanding {} / {recv_slots} receive buffers: the device queues at most {max_qp_wr} work requests",
                config.max_outstanding
            )));
        }
        let cq_entries = config.max_outstanding.saturating_add(recv_slots);
        if cq_entries > max_cqe {
            return Err(TransportError::Config(format!(
                "{cq_entries} completion queue entries needed, the device allows {max_cqe}"
            )));
        }
        let port_cap = if max_msg_sz == 0 {
            u32::MAX
        } else {
            max_msg_sz
        };
        let depth = |v: u32| v.clamp(1, MAX_RD_ATOMIC) as u8;
        Ok(Sizing {
            recv_slots,
            recv_slot_bytes: config.max_message_bytes,
            ring_bytes: (u64::from(config.max_outstanding) * STAGING_BYTES_PER_OUTSTANDING)
                .clamp(MIN_STAGING_RING_BYTES, MAX_STAGING_RING_BYTES)
                as usize,
            cq_entries,
            initiator_depth: depth(max_qp_init_rd_atom),
            responder_depth: depth(max_qp_rd_atom),
            max_transfer_bytes: config.max_transfer_bytes.min(port_cap),
            max_message_bytes: config.max_message_bytes.min(port_cap),
        })
    }
}
