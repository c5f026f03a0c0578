//! What a connection's origin is counted by, for caps per source: an IPv4
//! address (also one mapped into IPv6), or the /64 prefix of an IPv6
//! address (one host usually has a whole /64, so counting its addresses
//! one by one would let it open 2^64 times the cap). Shared by the
//! fabric's gate (`gate.rs`) and the daemon's client-facing ports.

use std::net::{IpAddr, Ipv4Addr};

/// The source of a connection, as caps per source count it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Source {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// The upper 64 bits of an IPv6 address.
    V6Prefix(u64),
}

impl Source {
    /// The source of a peer at `ip`.
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(v4),
            IpAddr::V6(v6) => Source::V6Prefix((u128::from(v6) >> 64) as u64),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::V4(v4) => write!(f, "{v4}"),
            Source::V6Prefix(prefix) => {
                let net = std::net::Ipv6Addr::from(u128::from(*prefix) << 64);
                write!(f, "{net}/64")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_sources_are_their_64_prefix_and_mapped_ipv4_is_ipv4() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            Source::of(ip("::ffff:10.1.2.3")),
            Source::of(ip("10.1.2.3"))
        );
        assert_eq!(
            Source::of(ip("2001:db8:1:2::1")).to_string(),
            "2001:db8:1:2::/64"
        );
    }
}
