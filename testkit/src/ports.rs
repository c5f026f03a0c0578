//! Free TCP ports on the loopback interface. Owns nothing: a port is bound
//! and released at once, so another process could take it in between (a
//! test then reports a failed start). Never keeps a listener open and never
//! picks an address other than 127.0.0.1.

/// A free TCP port on 127.0.0.1.
///
/// # Errors
/// When no socket can be bound on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
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
    #[test]
    fn a_free_port_can_be_bound() {
        let addr = super::loopback_addr().unwrap();
        assert!(addr.starts_with("127.0.0.1:"));
        std::net::TcpListener::bind(&addr).unwrap();
    }
}
