//! Free TCP ports on the loopback interface. Owns nothing: a port is bound
//! and released at once. Never keeps a listener open and never picks an
//! address other than 127.0.0.1.
//!
//! A port the kernel hands out itself (`bind` to port 0) comes from its
//! ephemeral range, the same range it draws from for every outgoing
//! connection and every other `bind(0)`: between our release and the
//! daemon's bind, any of those may take it (seen: a node's `--metrics`
//! refused with "Address already in use" under a parallel test). So ports
//! come from below the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), which the kernel never hands
//! out, through one cursor per process: no port is given twice by one
//! process, and processes start their cursors at different places (by pid).
//! A port someone listens on is skipped.

use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOW: u32 = 10_000;
/// Below this many ports between [`LOW`] and the ephemeral range, the
/// kernel's own choice is used instead.
const MIN_SPAN: u32 = 1_000;

/// Ports tried by this process so far (offset from its starting place).
static CURSOR: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (32768 when unreadable).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Whether 127.0.0.1:`port` can be bound now.
fn bindable(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free TCP port on 127.0.0.1, from below the kernel's ephemeral range
/// (see the module docs).
///
/// # Errors
/// When no port of the range can be bound (or, where the range leaves no
/// room, no socket can be bound on 127.0.0.1).
pub fn free_port() -> std::io::Result<u16> {
    let high = ephemeral_low().min(u32::from(u16::MAX) + 1);
    if high < LOW + MIN_SPAN {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port());
    }
    let span = high - LOW;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let k = CURSOR.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + k) % span;
        let port = u16::try_from(port).expect("below the ephemeral range, which ends at 65535");
        if bindable(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("every port of 127.0.0.1:{LOW}..{high} is taken"),
    ))
}

/// `127.0.0.1:<a free port>`.
///
/// # Errors
/// As [`free_port`].
pub fn loopback_addr() -> std::io::Result<String> {
    free_port().map(|port| format!("127.0.0.1:{port}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn a_free_port_can_be_bound() {
        let addr = super::loopback_addr().unwrap();
        assert!(addr.starts_with("127.0.0.1:"));
        std::net::TcpListener::bind(&addr).unwrap();
    }

    #[test]
    fn ports_are_never_given_twice_and_never_ephemeral() {
        let low = super::ephemeral_low();
        let ports: Vec<u16> = (0..200).map(|_| super::free_port().unwrap()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port given twice: {ports:?}");
        if low >= super::LOW + super::MIN_SPAN {
            assert!(
                ports
                    .iter()
                    .all(|p| u32::from(*p) >= super::LOW && u32::from(*p) < low),
                "{ports:?} outside {}..{low}",
                super::LOW
            );
        }
    }

    #[test]
    fn a_port_someone_listens_on_is_skipped() {
        let low = super::ephemeral_low();
        if low < super::LOW + super::MIN_SPAN {
            return; // the kernel's choice: nothing of ours to test
        }
        // Listen on the port the cursor reaches next, then ask until the
        // cursor has passed it: it must never be given.
        let span = low.min(u32::from(u16::MAX) + 1) - super::LOW;
        let start = std::process::id().wrapping_mul(7_919) % span;
        let slot = super::CURSOR.load(std::sync::atomic::Ordering::Relaxed);
        let taken = u16::try_from(super::LOW + (start + slot) % span).unwrap();
        let Ok(_listener) = std::net::TcpListener::bind(("127.0.0.1", taken)) else {
            return; // someone else holds it: it is skipped anyway
        };
        while super::CURSOR.load(std::sync::atomic::Ordering::Relaxed) <= slot {
            assert_ne!(super::free_port().unwrap(), taken);
        }
        assert_ne!(super::free_port().unwrap(), taken);
    }
}
