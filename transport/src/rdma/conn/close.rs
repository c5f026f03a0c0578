//! Closing: the bootstrap stream as the connection's close channel (our
//! notice out, the peer's notice or end in), and the handle whose drop puts
//! the connection in the error state.
//!
//! Owns the bootstrap stream after the handshake. Never: carry anything on
//! it but a close notice (at most [`MAX_NOTICE_BYTES`] of UTF-8, then FIN),
//! or destroy the queue pair while the driver may still poll it.

use super::*;

/// Largest close notice.
pub(crate) const MAX_NOTICE_BYTES: usize = 256;
/// Time allowed to write a close notice.
pub(super) const NOTICE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Watches the bootstrap stream: sends our close notice, or fails the
/// connection when the peer's notice or end arrives.
pub(super) async fn watch_bootstrap(
    stream: TcpStream,
    shared: Weak<Shared>,
    notice: oneshot::Receiver<String>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = [0u8; MAX_NOTICE_BYTES];
    tokio::select! {
        reason = notice => {
            if let Ok(reason) = reason {
                let _ = tokio::time::timeout(NOTICE_WRITE_TIMEOUT, writer.write_all(truncate_utf8(&reason, MAX_NOTICE_BYTES))).await;
            }
            let _ = tokio::time::timeout(NOTICE_WRITE_TIMEOUT, writer.shutdown()).await;
        }
        read = reader.read(&mut buf) => {
            let cause = match read {
                Ok(0) => "the peer closed the connection (bootstrap stream ended)".to_string(),
                Ok(n) => format!("closed by the peer: {}", String::from_utf8_lossy(&buf[..n])),
                Err(e) => format!("bootstrap stream to the peer failed: {e}"),
            };
            if let Some(shared) = shared.upgrade() {
                *lock(&shared.peer_closed) = Some(cause);
                shared.driver_wake.notify_one();
            }
        }
    }
}

pub(super) fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

pub(super) struct ConnHandle {
    pub(super) shared: Arc<Shared>,
    pub(super) peer: PeerInfo,
    pub(super) driver: tokio::task::AbortHandle,
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.shared.fail("connection dropped".to_string());
        // The driver holds the last strong reference but one: once it is
        // gone, the queue pair is destroyed, then its memory freed.
        self.driver.abort();
    }
}
