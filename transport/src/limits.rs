//! The one set of checks a work request passes before any backend posts
//! it: its size against the connection's limits, and the alignment of
//! remote atomics. The same rules on the responder side (a SEND above the
//! receiver's limit, an unaligned atomic arriving from a peer) use the
//! predicates here too, so the rule is written once. And the device's
//! connection limit: the [`ConnSlot`] each connection of every backend
//! holds.
//!
//! Owns the rules and their error messages. Never: touch memory, know a
//! backend, or panic on what a peer sent (a peer's request is input).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Result, TransportError};
use crate::work::Request;

/// Bytes of the word a remote atomic acts on; its address must be aligned
/// to it.
pub(crate) const ATOMIC_WORD_BYTES: u64 = 8;

/// Whether a remote atomic may act on `addr` (8-byte aligned).
pub(crate) fn atomic_aligned(addr: u64) -> bool {
    addr.is_multiple_of(ATOMIC_WORD_BYTES)
}

/// Whether a SEND of `len` bytes fits a limit of `max_message_bytes`.
pub(crate) fn message_fits(len: usize, max_message_bytes: u32) -> bool {
    len <= max_message_bytes as usize
}

/// Checks `request` before it is posted: a SEND holds at most
/// `max_message_bytes`, a WRITE or READ moves at most
/// `max_transfer_bytes`, an atomic names an 8-byte aligned address.
///
/// # Errors
/// [`TransportError::Limit`] for a size above its limit,
/// [`TransportError::Invalid`] for an unaligned atomic.
pub(crate) fn check_request(
    request: &Request,
    max_transfer_bytes: u32,
    max_message_bytes: u32,
) -> Result<()> {
    let len = match request {
        Request::Write { data, .. } => data.len(),
        Request::Read { len, .. } => *len as usize,
        Request::Send { data } => {
            if !message_fits(data.len(), max_message_bytes) {
                return Err(TransportError::Limit {
                    what: "message bytes",
                    limit: u64::from(max_message_bytes),
                });
            }
            0
        }
        Request::CompareSwap { addr, .. } | Request::FetchAdd { addr, .. } => {
            if !atomic_aligned(*addr) {
                return Err(TransportError::Invalid(format!(
                    "atomic on {addr:#x}: remote atomics need an 8-byte aligned address"
                )));
            }
            0
        }
    };
    if len > max_transfer_bytes as usize {
        return Err(TransportError::Limit {
            what: "transfer bytes",
            limit: u64::from(max_transfer_bytes),
        });
    }
    Ok(())
}

/// A held slot of a device's connection limit; released when dropped,
/// with the connection (or the half-built connection) that holds it.
pub(crate) struct ConnSlot {
    live_connections: Arc<AtomicU32>,
}

impl ConnSlot {
    /// Takes one of `max_connections` slots counted in `live_connections`.
    ///
    /// # Errors
    /// [`TransportError::Limit`] when `max_connections` are already live.
    pub(crate) fn reserve(
        live_connections: &Arc<AtomicU32>,
        max_connections: u32,
    ) -> Result<ConnSlot> {
        live_connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < max_connections).then_some(live + 1)
            })
            .map_err(|_| TransportError::Limit {
                what: "connections per device",
                limit: u64::from(max_connections),
            })?;
        Ok(ConnSlot {
            live_connections: live_connections.clone(),
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.live_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_alignment_are_checked() {
        let write = |len| Request::Write {
            addr: 0,
            rkey: 1,
            data: vec![0; len],
            imm: None,
        };
        assert!(check_request(&write(16), 16, 4).is_ok());
        assert!(matches!(
            check_request(&write(17), 16, 4),
            Err(TransportError::Limit {
                what: "transfer bytes",
                limit: 16
            })
        ));
        let read = Request::Read {
            addr: 0,
            rkey: 1,
            len: 17,
        };
        assert!(matches!(
            check_request(&read, 16, 4),
            Err(TransportError::Limit {
                what: "transfer bytes",
                ..
            })
        ));
        let send = Request::Send { data: vec![0; 5] };
        assert!(matches!(
            check_request(&send, 16, 4),
            Err(TransportError::Limit {
                what: "message bytes",
                limit: 4
            })
        ));
        let cas = |addr| Request::CompareSwap {
            addr,
            rkey: 1,
            expected: 0,
            new: 1,
        };
        assert!(check_request(&cas(8), 16, 4).is_ok());
        match check_request(&cas(12), 16, 4) {
            Err(TransportError::Invalid(reason)) => {
                assert!(reason.contains("8-byte aligned"), "{reason}")
            }
            other => panic!("an unaligned atomic was accepted: {other:?}"),
        }
        let fadd = Request::FetchAdd {
            addr: 4,
            rkey: 1,
            add: 1,
        };
        assert!(matches!(
            check_request(&fadd, 16, 4),
            Err(TransportError::Invalid(_))
        ));
    }
}
