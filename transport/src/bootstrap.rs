//! The TCP side of setting up a connection, shared by the `tcp` backend
//! and the `rdma` backend's bootstrap stream: binding a listener, the
//! accept loop (a bounded number of handshakes at once, failures counted
//! and logged, never ending the loop), and dialling with a deadline.
//!
//! Owns the sockets until a backend's handshake takes the stream. Never:
//! read or write the stream's bytes (the handshake and the backends do),
//! or let one failed attempt end the listener.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

use crate::error::{Result, TransportError};

/// Handshakes running at once on one listener; more wait.
pub(crate) const MAX_CONCURRENT_HANDSHAKES: usize = 64;
/// Authenticated connections waiting for `accept`.
pub(crate) const ACCEPT_QUEUE: usize = 64;
/// Pause after a failed `accept` (EMFILE and friends) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A listener that accepts: its authenticated connections' queue, the
/// address clients connect to, and the accept task (the backend's listener
/// aborts it when dropped).
pub(crate) struct Accepting<C> {
    /// Connections whose handshake succeeded, for `accept`.
    pub(crate) incoming: mpsc::Receiver<C>,
    /// The bound address.
    pub(crate) local_addr: String,
    /// The [`accept_loop`].
    pub(crate) task: tokio::task::JoinHandle<()>,
}

/// Binds `addr` and spawns the [`accept_loop`] that hands each accepted
/// stream to `accept_one` (the backend's handshake), failures counted in
/// `rejected` and logged as `rejected_what`.
pub(crate) async fn listen<C, F, Fut>(
    addr: &str,
    rejected: Arc<AtomicU64>,
    rejected_what: &'static str,
    accept_one: F,
) -> Result<Accepting<C>>
where
    C: Send + 'static,
    F: Fn(TcpStream, String) -> Fut + Send + 'static,
    Fut: Future<Output = Result<C>> + Send + 'static,
{
    let (listener, local_addr) = bind(addr).await?;
    let (tx, incoming) = mpsc::channel(ACCEPT_QUEUE);
    let task = tokio::spawn(accept_loop(
        listener,
        tx,
        rejected,
        rejected_what,
        accept_one,
    ));
    Ok(Accepting {
        incoming,
        local_addr,
        task,
    })
}

/// A bound listener and the address clients connect to.
pub(crate) async fn bind(addr: &str) -> Result<(TcpListener, String)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(TransportError::io(format!("listen on {addr}")))?;
    let local_addr = listener
        .local_addr()
        .map_err(TransportError::io("local address"))?
        .to_string();
    Ok((listener, local_addr))
}

/// Turns Nagle off: every frame and handshake message is latency-bound.
pub(crate) fn no_delay(stream: &TcpStream) -> Result<()> {
    stream
        .set_nodelay(true)
        .map_err(TransportError::io("TCP_NODELAY"))
}

/// Connects to `addr` within `timeout`, Nagle off.
pub(crate) async fn dial(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| TransportError::Timeout {
            what: format!("TCP connect to {addr}"),
            after_ms: timeout.as_millis() as u64,
        })?
        .map_err(TransportError::io(format!("connect to {addr}")))?;
    no_delay(&stream)?;
    Ok(stream)
}

/// Accepts TCP connections for ever, running `accept_one` (the backend's
/// handshake) on each, at most [`MAX_CONCURRENT_HANDSHAKES`] at once.
/// Connections it yields go to `tx`; failures count in `rejected` and are
/// logged as `rejected_what` ("connection attempt rejected").
pub(crate) async fn accept_loop<C, F, Fut>(
    listener: TcpListener,
    tx: mpsc::Sender<C>,
    rejected: Arc<AtomicU64>,
    rejected_what: &'static str,
    accept_one: F,
) where
    C: Send + 'static,
    F: Fn(TcpStream, String) -> Fut,
    Fut: Future<Output = Result<C>> + Send + 'static,
{
    let handshakes = Arc::new(Semaphore::new(MAX_CONCURRENT_HANDSHAKES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let peer = peer.to_string();
        let attempt = accept_one(stream, peer.clone());
        let (tx, rejected) = (tx.clone(), rejected.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match attempt.await {
                Ok(conn) => {
                    let _ = tx.send(conn).await;
                }
                Err(error) => {
                    rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, %error, "{rejected_what}");
                }
            }
        });
    }
}
