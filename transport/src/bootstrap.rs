//! The TCP side of setting up a connection, shared by the `tcp` backend
//! and the `rdma` backend's bootstrap stream: binding a listener, the
//! accept loop, and dialling with a deadline; and the [`Listener`] every
//! backend hands out (the `inproc` fabric feeds one without a socket).
//!
//! The accept loop never waits for a peer: it asks the device's
//! [`Gate`] before spending anything on a new connection (past its caps
//! the connection is closed at once), gives the peer
//! [`ConnConfig::auth_timeout`] from accept to prove the cluster secret,
//! and only then hands the stream to the backend, which finishes the
//! connection within [`ConnConfig::handshake_timeout`]. Failures are
//! counted and logged, a flood of them as one line per period, and never
//! end the loop.
//!
//! Owns the sockets until a backend's handshake takes the stream. Never:
//! read or write the stream's bytes (the handshake and the backends do),
//! or let one failed attempt end the listener.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::api::AcceptPolicy;
use crate::error::{Result, TransportError};
use crate::gate::Gate;
use crate::handshake::{self, Accepted};
use crate::throttle::Throttle;
use crate::types::ConnConfig;

/// Authenticated connections waiting for `accept`.
pub(crate) const ACCEPT_QUEUE: usize = 64;
/// Pause after a failed `accept` (EMFILE and friends) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one line per this period about connections that failed before
/// proving the secret (each is counted in `rejected` all the same).
const UNPROVEN_LOG_PERIOD: Duration = Duration::from_secs(10);

/// A listener of any backend: the queue of connections whose handshake
/// succeeded, the address clients connect to, the device's count of
/// rejected attempts, and the task that feeds the queue (the [`accept_loop`]
/// for TCP; aborted when the listener is dropped).
pub struct Listener<C> {
    incoming: mpsc::Receiver<C>,
    local_addr: String,
    rejected: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl<C> Listener<C> {
    /// A listener over `incoming`, fed by `task`; attempts that fail count
    /// in `rejected`.
    pub(crate) fn new(
        incoming: mpsc::Receiver<C>,
        local_addr: String,
        rejected: Arc<AtomicU64>,
        task: tokio::task::JoinHandle<()>,
    ) -> Listener<C> {
        Listener {
            incoming,
            local_addr,
            rejected,
            task,
        }
    }

    /// The next authenticated connection; `None` once the listener stopped.
    pub async fn accept(&mut self) -> Option<C> {
        self.incoming.recv().await
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> String {
        self.local_addr.clone()
    }

    /// Connection attempts that failed (bad secret, garbage, timeout, a
    /// limit, the policy's refusal, connection setup) so far, on any
    /// listener of the device.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

impl<C> std::fmt::Debug for Listener<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl<C> Drop for Listener<C> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A device that accepts connections over TCP bootstrap streams: the
/// backend's half of [`listen`].
pub(crate) trait Accept: Send + Sync + 'static {
    /// What a successful handshake yields.
    type Connection: Send + 'static;
    /// How a failed attempt is logged.
    const REJECTED_WHAT: &'static str;

    /// The device's count of failed attempts, shared by its listeners.
    fn rejected(&self) -> &Arc<AtomicU64>;

    /// The device's gate: its caps on unproven connections and its member
    /// sources, shared by its listeners and its dials.
    fn gate(&self) -> &Arc<Gate>;

    /// This device's side of a handshake, with a fresh nonce.
    fn local(&self) -> handshake::Local<'_>;

    /// The server side of one attempt once `peer` has proven the cluster
    /// secret (`accepted`): the backend's checks and setup over `stream`
    /// (Nagle already off), then its answer.
    fn accept_one(
        &self,
        stream: TcpStream,
        peer: &str,
        accepted: Accepted,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> impl Future<Output = Result<Self::Connection>> + Send;
}

/// Binds `addr` and spawns the [`accept_loop`] that hands each accepted
/// stream to `device`'s [`Accept::accept_one`].
pub(crate) async fn listen<D: Accept>(
    device: Arc<D>,
    addr: &str,
    config: ConnConfig,
    policy: AcceptPolicy,
) -> Result<Listener<D::Connection>> {
    let (listener, local_addr) = bind(addr).await?;
    let (tx, incoming) = mpsc::channel(ACCEPT_QUEUE);
    let rejected = device.rejected().clone();
    let task = tokio::spawn(accept_loop(listener, tx, device, config, policy));
    Ok(Listener::new(incoming, local_addr, rejected, task))
}

/// A bound listener and the address clients connect to.
async fn bind(addr: &str) -> Result<(TcpListener, String)> {
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

/// [`crate::Device::probe`] over TCP: connects to `addr` and closes at once.
pub(crate) async fn probe(addr: &str, timeout: Duration) -> crate::Probe {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(_stream)) => crate::Probe::Listening,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => crate::Probe::Refused,
        Ok(Err(e)) => crate::Probe::Unknown(format!("connect to {addr}: {e}")),
        Err(_) => crate::Probe::Unknown(format!(
            "connect to {addr}: no answer within {} ms",
            timeout.as_millis()
        )),
    }
}

/// `Some(n)` when a line about the `n` failures since the last is due.
fn due(throttle: &std::sync::Mutex<Throttle>) -> Option<u64> {
    throttle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .note(tokio::time::Instant::now())
}

/// Waits for `stream`'s first byte: `Ok(false)` when the peer closed it
/// before sending one (a [`probe`], not a connection attempt: the client
/// speaks first in every handshake).
async fn first_byte(stream: &TcpStream, peer: &str) -> Result<bool> {
    let mut byte = [0u8; 1];
    stream
        .peek(&mut byte)
        .await
        .map(|n| n > 0)
        .map_err(TransportError::io(format!("read from {peer}")))
}

/// Accepts TCP connections for ever. Each one the device's gate lets in
/// gets a task: the peer proves the cluster secret within
/// `config.auth_timeout` of being accepted, then `device`'s
/// [`Accept::accept_one`] finishes it. Connections it yields go to `tx`;
/// failures count in the device's `rejected` and are logged as its
/// `REJECTED_WHAT` ("connection attempt rejected"): those before the proof
/// at most once per [`UNPROVEN_LOG_PERIOD`] with a count of the rest.
async fn accept_loop<D: Accept>(
    listener: TcpListener,
    tx: mpsc::Sender<D::Connection>,
    device: Arc<D>,
    config: ConnConfig,
    policy: AcceptPolicy,
) {
    let quiet = Arc::new(std::sync::Mutex::new(Throttle::new(UNPROVEN_LOG_PERIOD)));
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let unproven = match device.gate().enter(peer.ip()) {
            Ok(unproven) => unproven,
            Err(refusal) => {
                // Closed at once: the loop never waits on a stranger.
                drop(stream);
                device.rejected().fetch_add(1, Ordering::Relaxed);
                if let Some(failures) = due(&quiet) {
                    tracing::warn!(%peer, %refusal, failures, "{}: closed at once", D::REJECTED_WHAT);
                }
                continue;
            }
        };
        let peer = peer.to_string();
        let (tx, device, quiet) = (tx.clone(), device.clone(), quiet.clone());
        let (config, policy) = (config.clone(), policy.clone());
        tokio::spawn(async move {
            let proof = tokio::time::timeout(config.auth_timeout, async {
                if !first_byte(&stream, &peer).await? {
                    return Ok(None);
                }
                no_delay(&stream)?;
                handshake::server(&mut stream, &peer, device.local(), config.auth_timeout)
                    .await
                    .map(Some)
            });
            let proven = proof.await.unwrap_or_else(|_| {
                Err(TransportError::Timeout {
                    what: format!("{peer} proving the cluster secret"),
                    after_ms: config.auth_timeout.as_millis() as u64,
                })
            });
            let accepted = match proven {
                Ok(Some(accepted)) => accepted,
                Ok(None) => {
                    tracing::debug!(%peer, "probed (closed before its first byte)");
                    return;
                }
                Err(error) => {
                    device.rejected().fetch_add(1, Ordering::Relaxed);
                    if let Some(failures) = due(&quiet) {
                        tracing::warn!(%peer, %error, failures, "{}", D::REJECTED_WHAT);
                    }
                    return;
                }
            };
            // A member: its place among the unproven is given back, and its
            // source is let in past the total cap from now on.
            unproven.proven();
            match device
                .accept_one(stream, &peer, accepted, &config, &policy)
                .await
            {
                Ok(conn) => {
                    let _ = tx.send(conn).await;
                }
                Err(error) => {
                    device.rejected().fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, %error, "{}", D::REJECTED_WHAT);
                }
            }
        });
    }
}
