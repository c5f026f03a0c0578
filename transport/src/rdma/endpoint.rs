//! The endpoint description a queue pair reveals in the bootstrap handshake
//! (only once the peer has proven the cluster secret), and its wire format.
//! Plain data, no verbs.
//!
//! # Wire format (version 1, 33 bytes, integers little-endian)
//!
//! ```text
//! offset  size  field
//!      0     1  version = 1
//!      1     4  qpn                 queue pair number, < 2^24
//!      5     4  psn                 first send PSN, < 2^24
//!      9    16  gid                 GID as the device reports it (network order)
//!     25     2  lid                 local identifier (0 on RoCE)
//!     27     1  mtu                 ibv_mtu code of the port: 1..=5 (256..4096 bytes)
//!     28     4  recv_buffer_bytes   size of each posted receive buffer, 1..=16 MiB
//!     32     1  max_dest_rd_atomic  READs/atomics it serves at once, >= 1
//! ```

use crate::error::{Result, TransportError};

/// Format version.
pub(crate) const ENDPOINT_VERSION: u8 = 1;
/// Encoded length.
pub(crate) const ENDPOINT_BYTES: usize = 33;
/// Largest queue pair number or PSN (24 bits).
pub(crate) const MAX_24_BIT: u32 = 0xFF_FFFF;
/// Largest receive buffer a peer may announce.
pub(crate) const MAX_RECV_BUFFER_BYTES: u32 = 16 << 20;

/// One side of an RC connection, as the other side needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpEndpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First send PSN.
    pub psn: u32,
    /// The GID its traffic comes from.
    pub gid: [u8; 16],
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// `ibv_mtu` code of its port.
    pub mtu: u8,
    /// Bytes of each posted receive buffer: a larger SEND fails.
    pub recv_buffer_bytes: u32,
    /// READs/atomics it serves at once (responder resources).
    pub max_dest_rd_atomic: u8,
}

impl QpEndpoint {
    /// The bytes described in the module documentation.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENDPOINT_BYTES);
        out.push(ENDPOINT_VERSION);
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.push(self.mtu);
        out.extend_from_slice(&self.recv_buffer_bytes.to_le_bytes());
        out.push(self.max_dest_rd_atomic);
        debug_assert_eq!(out.len(), ENDPOINT_BYTES);
        out
    }

    /// Decodes and checks what a peer sent.
    pub(crate) fn decode(bytes: &[u8], peer: &str) -> Result<QpEndpoint> {
        let bad = |reason: String| TransportError::Protocol {
            peer: peer.to_string(),
            reason: format!("bad rdma endpoint description: {reason}"),
        };
        if bytes.len() != ENDPOINT_BYTES {
            return Err(bad(format!(
                "{} bytes, expected {ENDPOINT_BYTES}",
                bytes.len()
            )));
        }
        if bytes[0] != ENDPOINT_VERSION {
            return Err(bad(format!(
                "version {}, expected {ENDPOINT_VERSION}",
                bytes[0]
            )));
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[9..25]);
        let endpoint = QpEndpoint {
            qpn: u32_at(1),
            psn: u32_at(5),
            gid,
            lid: u16::from_le_bytes([bytes[25], bytes[26]]),
            mtu: bytes[27],
            recv_buffer_bytes: u32_at(28),
            max_dest_rd_atomic: bytes[32],
        };
        if endpoint.qpn > MAX_24_BIT || endpoint.qpn == 0 {
            return Err(bad(format!("queue pair number {:#x}", endpoint.qpn)));
        }
        if endpoint.psn > MAX_24_BIT {
            return Err(bad(format!("PSN {:#x} above 24 bits", endpoint.psn)));
        }
        if !(1..=5).contains(&endpoint.mtu) {
            return Err(bad(format!("MTU code {}", endpoint.mtu)));
        }
        if endpoint.recv_buffer_bytes == 0 || endpoint.recv_buffer_bytes > MAX_RECV_BUFFER_BYTES {
            return Err(bad(format!(
                "receive buffers of {} bytes",
                endpoint.recv_buffer_bytes
            )));
        }
        if endpoint.max_dest_rd_atomic == 0 {
            return Err(bad("serves no READ or atomic".to_string()));
        }
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QpEndpoint {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 77, 0, 11]);
        QpEndpoint {
            qpn: 0x11,
            psn: 0xABCDEF,
            gid,
            lid: 0,
            mtu: 3,
            recv_buffer_bytes: 65536,
            max_dest_rd_atomic: 16,
        }
    }

    #[test]
    fn round_trip_byte_by_byte() {
        let e = sample();
        let bytes = e.encode();
        assert_eq!(bytes.len(), ENDPOINT_BYTES);
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..5], &[0x11, 0, 0, 0]);
        assert_eq!(&bytes[5..9], &[0xEF, 0xCD, 0xAB, 0]);
        assert_eq!(&bytes[9..25], &e.gid);
        assert_eq!(&bytes[25..27], &[0, 0]);
        assert_eq!(bytes[27], 3);
        assert_eq!(&bytes[28..32], &[0, 0, 1, 0]);
        assert_eq!(bytes[32], 16);
        assert_eq!(QpEndpoint::decode(&bytes, "p").unwrap(), e);
    }

    #[test]
    fn garbage_is_refused() {
        let good = sample().encode();
        assert!(QpEndpoint::decode(&good[..32], "p").is_err());
        assert!(QpEndpoint::decode(&[good.clone(), vec![0]].concat(), "p").is_err());
        let mutate = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            QpEndpoint::decode(&b, "p")
        };
        assert!(mutate(0, 2).is_err(), "version");
        assert!(mutate(4, 1).is_err(), "qpn above 24 bits");
        assert!(mutate(8, 1).is_err(), "psn above 24 bits");
        assert!(mutate(27, 0).is_err(), "mtu");
        assert!(mutate(27, 6).is_err(), "mtu");
        assert!(mutate(31, 2).is_err(), "receive buffers above 16 MiB");
        assert!(mutate(32, 0).is_err(), "no responder resources");
        let mut zero_qpn = sample();
        zero_qpn.qpn = 0;
        assert!(QpEndpoint::decode(&zero_qpn.encode(), "p").is_err());
    }
}
