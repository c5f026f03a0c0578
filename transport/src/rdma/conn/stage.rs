//! Send staging: where a request's local bytes live while the device owns
//! them (a piece of the staging ring, or a registration of its own for a
//! request that does not fit), and reading a completed request's result
//! out of it.
//!
//! Owns the staging bookkeeping of `SendState`. Never: release a ring
//! piece out of completion order, or let the CPU touch staging between the
//! post and the completion.

use super::*;

/// Bytes of requests that did not fit the ring (each registered for
/// itself) in flight per connection, at most.
pub(super) const MAX_OVERFLOW_BYTES_IN_FLIGHT: u64 = 256 << 20;

/// Where a request's local bytes are.
pub(super) enum Staging {
    None,
    Ring(Piece),
    Own(DeviceBuffer),
}

impl Shared {
    /// Staging for `len` local bytes.
    pub(super) fn stage(&self, send: &mut SendState, len: usize) -> Result<Staging> {
        if len == 0 {
            return Ok(Staging::None);
        }
        if let Some(piece) = send.ring.allocate(len) {
            return Ok(Staging::Ring(piece));
        }
        if send.overflow_bytes.saturating_add(len as u64) > MAX_OVERFLOW_BYTES_IN_FLIGHT {
            return Err(TransportError::Limit {
                what: "staged bytes in flight beyond the connection's staging ring",
                limit: MAX_OVERFLOW_BYTES_IN_FLIGHT,
            });
        }
        let buffer = DeviceBuffer::new(&self.pd, len).map_err(TransportError::io(format!(
            "staging registration of {len} bytes"
        )))?;
        send.overflow_bytes += len as u64;
        Ok(Staging::Own(buffer))
    }

    /// Gives back the staging of a request that was never posted.
    pub(super) fn unstage(&self, send: &mut SendState, staging: Staging) {
        match staging {
            Staging::None => {}
            Staging::Ring(piece) => {
                let ok = send.ring.unallocate(piece);
                debug_assert!(ok, "the newest piece is taken back under the send lock");
            }
            Staging::Own(buffer) => {
                send.overflow_bytes = send.overflow_bytes.saturating_sub(buffer.len() as u64)
            }
        }
    }

    /// Gives back the staging of a request the device is done with.
    pub(super) fn release(&self, send: &mut SendState, staging: Staging) {
        match staging {
            Staging::None => {}
            Staging::Ring(piece) => {
                if !send.ring.release(piece) {
                    debug_assert!(false, "staging released out of order");
                    tracing::error!(peer = %self.peer_addr, "staging released out of order");
                }
            }
            Staging::Own(buffer) => {
                send.overflow_bytes = send.overflow_bytes.saturating_sub(buffer.len() as u64)
            }
        }
    }

    pub(super) fn slice(
        &self,
        staging: &Staging,
        len: usize,
    ) -> Option<crate::rdma::qp::LocalSlice> {
        match staging {
            Staging::None => None,
            Staging::Ring(piece) => self.send_staging.slice(piece.offset, len),
            Staging::Own(buffer) => buffer.slice(0, len),
        }
    }

    pub(super) fn write_staging(&self, staging: &Staging, data: &[u8]) -> Option<()> {
        match staging {
            Staging::None => data.is_empty().then_some(()),
            Staging::Ring(piece) => self.send_staging.write(piece.offset, data),
            Staging::Own(buffer) => buffer.write(0, data),
        }
    }

    /// What a successfully completed request returns.
    pub(super) fn result_of(&self, kind: OpKind, staging: &Staging) -> Option<Done> {
        let (buffer, offset) = match staging {
            Staging::None => (None, 0),
            Staging::Ring(piece) => (Some(&self.send_staging), piece.offset),
            Staging::Own(buffer) => (Some(buffer), 0),
        };
        Some(match kind {
            OpKind::Read { len } => match buffer {
                Some(b) => Done::Data(b.read(offset, len as usize)?),
                None => Done::Data(Vec::new()),
            },
            // The original value, in host byte order as rxe leaves it.
            OpKind::CompareSwap | OpKind::FetchAdd => Done::Word(buffer?.read_u64(offset)?),
            OpKind::Write | OpKind::WriteImm | OpKind::Send => Done::Ok,
        })
    }
}
