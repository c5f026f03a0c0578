//! The accept loop of the daemon's client-facing ports (the client API and
//! the metrics endpoint): one loop per port, the same code for both.
//!
//! For each TCP connection it:
//! 1. counts it against the port's caps, per source (an IPv4 address, or
//!    an IPv6 address's /64) and in total, for as long as it stays open;
//!    one beyond either cap is closed at once (never queued, never waited
//!    for), counted in [`PortStats`] and logged at most once per
//!    [`REFUSAL_LOG_PERIOD`];
//! 2. sets `TCP_NODELAY` (without it, Nagle's algorithm held the last small
//!    write of an answer for a delayed ACK, up to 40 ms: issue 11, item 7);
//! 3. with TLS, runs the handshake off the loop, in a task of its own,
//!    within [`PRE_AUTH_TIMEOUT`]: a peer that is slow, idle, sends
//!    plaintext or presents no acceptable certificate is dropped (a
//!    plaintext one first gets an answer that says the port wants TLS);
//! 4. hands the connection to the server ([`Incoming`]: a stream for
//!    tonic's `serve_with_incoming_shutdown`, a [`axum::serve::Listener`]
//!    for the metrics endpoint).
//!
//! Accepting never waits for a peer: the loop itself only accepts, counts
//! and spawns. It never reads a request (that is the servers') and never
//! decides what a client may do once connected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ringraft_transport::{Source, Throttle};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

/// How long a connection may take from its accept to the end of its TLS
/// handshake (including the check of its client certificate).
pub const PRE_AUTH_TIMEOUT: Duration = Duration::from_secs(2);
/// Default cap on the open connections of one source, per port.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: u32 = 256;
/// Default cap on the open connections of a port.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;
/// Largest `--max-connections` (the queue of accepted connections is
/// sized by it).
pub const MAX_MAX_CONNECTIONS: u32 = 1 << 20;
/// At most one log line per this period for each kind of refusal.
pub const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Pause of the loop after an accept error that is about the process (out
/// of file descriptors or memory), so that it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Bytes a refused peer may still send (read and dropped) after its last
/// answer (that the port wants TLS, or rustls's alert), so that closing
/// does not reset the connection before the peer read the answer.
const CLOSE_DRAIN_BYTES: usize = 64 << 10;
/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

const _: () = assert!(DEFAULT_MAX_CONNECTIONS_PER_IP <= DEFAULT_MAX_CONNECTIONS);
const _: () = assert!(DEFAULT_MAX_CONNECTIONS <= MAX_MAX_CONNECTIONS);

/// The connection caps of one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Open connections of one source (an IPv4 address, an IPv6 /64).
    pub per_source: u32,
    /// Open connections in all.
    pub total: u32,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            per_source: DEFAULT_MAX_CONNECTIONS_PER_IP,
            total: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// What a port serves: decides what a plaintext peer of a TLS port is
/// told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC (HTTP/2): the client API.
    Grpc,
    /// HTTP/1.1 or HTTP/2: the metrics endpoint.
    Http,
}

/// One port's settings.
#[derive(Clone, Debug)]
pub struct Port {
    /// Its name in logs and metrics (`client`, `metrics`).
    pub name: &'static str,
    /// What it serves.
    pub protocol: Protocol,
    /// `None`: plaintext.
    pub tls: Option<Arc<ServerConfig>>,
    /// Its caps.
    pub caps: Caps,
    /// The deadline of a connection's TLS handshake ([`PRE_AUTH_TIMEOUT`]).
    pub pre_auth_timeout: Duration,
}

/// The counters of one port (read by the metrics endpoint).
#[derive(Debug, Default)]
pub struct PortStats {
    /// Connections handed to the server.
    pub served: AtomicU64,
    /// Connections open now (handshaking or served).
    pub open: AtomicU64,
    /// Closed at once: their source had `per_source` open.
    pub refused_per_source: AtomicU64,
    /// Closed at once: the port had `total` open.
    pub refused_total: AtomicU64,
    /// Dropped: the TLS handshake did not end within the deadline.
    pub pre_auth_timeouts: AtomicU64,
    /// Dropped: the TLS handshake failed (a client certificate missing or
    /// refused, no common protocol, garbage).
    pub pre_auth_failures: AtomicU64,
    /// Dropped after an answer that the port wants TLS.
    pub plaintext_refused: AtomicU64,
}

/// Why a connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source had [`Caps::per_source`] connections open.
    PerSource,
    /// The port had [`Caps::total`] connections open.
    Total,
}

/// The open connections of a port, by source: admits a connection within
/// the caps, and forgets it when its [`Permit`] is dropped.
#[derive(Debug)]
pub struct Gate {
    caps: Caps,
    stats: Arc<PortStats>,
    open: Mutex<OpenCount>,
}

#[derive(Debug, Default)]
struct OpenCount {
    total: u32,
    /// Sources with at least one connection open (none with 0).
    by_source: HashMap<Source, u32>,
}

/// One open connection, counted until dropped.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    source: Source,
}

impl Gate {
    /// A gate with `caps`, counting into `stats`.
    pub fn new(caps: Caps, stats: Arc<PortStats>) -> Arc<Gate> {
        Arc::new(Gate {
            caps,
            stats,
            open: Mutex::new(OpenCount::default()),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, OpenCount> {
        // Counting cannot panic half-way; a poisoned lock still counts.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `source`, or says which cap refuses it
    /// (and counts the refusal).
    pub fn admit(self: &Arc<Self>, source: Source) -> Result<Permit, Refusal> {
        let mut open = self.open();
        let refusal = if open.total >= self.caps.total {
            Some((Refusal::Total, &self.stats.refused_total))
        } else if open.by_source.get(&source).copied().unwrap_or(0) >= self.caps.per_source {
            Some((Refusal::PerSource, &self.stats.refused_per_source))
        } else {
            None
        };
        if let Some((refusal, counter)) = refusal {
            counter.fetch_add(1, Ordering::Relaxed);
            return Err(refusal);
        }
        open.total += 1;
        *open.by_source.entry(source).or_insert(0) += 1;
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            gate: Arc::clone(self),
            source,
        })
    }

    /// Connections open now: in all, and from `source`.
    #[cfg(test)]
    pub fn open_now(&self, source: Source) -> (u32, u32) {
        let open = self.open();
        (
            open.total,
            open.by_source.get(&source).copied().unwrap_or(0),
        )
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.gate.open();
        // Pairs with `admit`: the permit was counted there.
        assert!(open.total > 0, "a permit of a gate that counts none");
        open.total -= 1;
        match open.by_source.get_mut(&self.source) {
            Some(1) => {
                open.by_source.remove(&self.source);
            }
            Some(n) => *n -= 1,
            None => unreachable!("a permit of a source the gate does not count"),
        }
        self.gate.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a port's loop and its handshake tasks share.
struct Shared {
    port: Port,
    gate: Arc<Gate>,
    stats: Arc<PortStats>,
    refusals: Mutex<Throttle>,
    pre_auth: Mutex<Throttle>,
    accept_errors: Mutex<Throttle>,
}

impl Shared {
    /// `Some(n)` when a line about `throttle`'s event is due now.
    fn due(throttle: &Mutex<Throttle>) -> Option<u64> {
        throttle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(Instant::now())
    }
}

/// A connection handed to a server: plaintext or TLS, counted against the
/// caps until dropped.
pub struct Conn {
    io: ConnIo,
    info: tonic::transport::server::TcpConnectInfo,
    _permit: Permit,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<Prefixed<TcpStream>>>),
}

impl Conn {
    /// The peer's address.
    pub fn remote(&self) -> Option<SocketAddr> {
        self.info.remote_addr
    }
}

macro_rules! conn_io {
    ($self:ident, $io:ident => $call:expr) => {
        match &mut $self.get_mut().io {
            ConnIo::Plain($io) => {
                let $io = Pin::new($io);
                $call
            }
            ConnIo::Tls($io) => {
                let $io = Pin::new($io.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        conn_io!(self, io => io.poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        conn_io!(self, io => io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        conn_io!(self, io => io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            ConnIo::Plain(io) => io.is_write_vectored(),
            ConnIo::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        conn_io!(self, io => io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        conn_io!(self, io => io.poll_shutdown(cx))
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

/// A stream that yields one byte it was given before its own: the first
/// byte, read to tell TLS from plaintext, goes back in front for rustls.
pub struct Prefixed<IO> {
    first: Option<u8>,
    io: IO,
}

impl<IO> Prefixed<IO> {
    fn new(first: u8, io: IO) -> Prefixed<IO> {
        Prefixed {
            first: Some(first),
            io,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0
            && let Some(first) = this.first.take()
        {
            buf.put_slice(&[first]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Why a connection did not get through its TLS handshake.
#[derive(Debug)]
pub enum PreAuthFailure {
    /// Not within the deadline.
    Timeout,
    /// It sent plaintext (and was told that the port wants TLS).
    Plaintext,
    /// The handshake failed (a client certificate missing or refused, no
    /// common protocol version or cipher, garbage), or the peer left.
    Tls(std::io::Error),
}

impl std::fmt::Display for PreAuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreAuthFailure::Timeout => write!(
                f,
                "no TLS handshake within {} ms",
                PRE_AUTH_TIMEOUT.as_millis()
            ),
            PreAuthFailure::Plaintext => write!(f, "plaintext on a TLS port (told so)"),
            PreAuthFailure::Tls(e) => write!(f, "TLS handshake failed: {e}"),
        }
    }
}

/// The TLS handshake of `io` with `tls`, within `timeout`; a peer that
/// starts with anything but a TLS record gets the `protocol`'s answer that
/// the port wants TLS. `failed` hears of a failure as soon as it is known,
/// before the connection is closed (which waits, within `timeout`, for the
/// peer to read the answer or the alert).
pub async fn pre_auth<IO>(
    io: IO,
    tls: Arc<ServerConfig>,
    protocol: Protocol,
    timeout: Duration,
    failed: impl FnOnce(&PreAuthFailure),
) -> Result<TlsStream<Prefixed<IO>>, PreAuthFailure>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut failed = Some(failed);
    let mut fail = |failure: PreAuthFailure| {
        if let Some(failed) = failed.take() {
            failed(&failure);
        }
        failure
    };
    let handshake = async {
        let mut io = io;
        let mut first = [0u8; 1];
        match io.read(&mut first).await {
            Ok(0) => {
                return Err(fail(PreAuthFailure::Tls(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                ))));
            }
            Ok(_) => {}
            Err(e) => return Err(fail(PreAuthFailure::Tls(e))),
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            let failure = fail(PreAuthFailure::Plaintext);
            refuse_plaintext(io, protocol).await;
            return Err(failure);
        }
        match tokio_rustls::TlsAcceptor::from(tls)
            .accept(Prefixed::new(first[0], io))
            .into_fallible()
            .await
        {
            Ok(stream) => Ok(stream),
            Err((e, io)) => {
                let failure = fail(PreAuthFailure::Tls(e));
                // rustls wrote its alert (e.g. "certificate required"); the
                // peer must get to read it.
                close_after_answer(io).await;
                Err(failure)
            }
        }
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(result) => result,
        Err(_) => Err(fail(PreAuthFailure::Timeout)),
    }
}

/// Tells a plaintext peer that the port wants TLS, in its own protocol,
/// then closes (the caller's deadline bounds this).
async fn refuse_plaintext<IO>(mut io: IO, protocol: Protocol)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    if io.write_all(&plaintext_refusal(protocol)).await.is_err() {
        return;
    }
    close_after_answer(io).await;
}

/// Closes a connection after a last answer (a refusal, a TLS alert) so that
/// the peer reads it: ends the sending side, then reads what the peer still
/// sends until it closes. Closing with unread bytes would reset the
/// connection, and a reset can discard the answer before the peer reads
/// it (the caller's deadline bounds the wait).
async fn close_after_answer<IO>(mut io: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let _ = io.shutdown().await;
    let mut sink = vec![0u8; 4096];
    let mut drained = 0;
    while drained < CLOSE_DRAIN_BYTES {
        match io.read(&mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

/// The debug text of the gRPC port's refusal.
const TLS_ONLY: &str = "this port serves TLS only: dial https with the CA (ringraft --ca)";

/// What a plaintext peer of a TLS port is told. gRPC: the server's HTTP/2
/// preface (an empty SETTINGS frame), then a GOAWAY with the error
/// `INADEQUATE_SECURITY` (RFC 9113, 7) and [`TLS_ONLY`] as its debug data,
/// which the Rust client turns into "give --ca". HTTP: a 400 answer.
pub fn plaintext_refusal(protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::Grpc => {
            // A frame: length (24 bits), type, flags, stream id (31 bits).
            let frame = |kind: u8, payload: &[u8]| {
                let len = (payload.len() as u32).to_be_bytes();
                let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 0];
                f.extend_from_slice(payload);
                f
            };
            const SETTINGS: u8 = 0x4;
            const GOAWAY: u8 = 0x7;
            const INADEQUATE_SECURITY: u32 = 0xc;
            let mut goaway = 0u32.to_be_bytes().to_vec(); // last stream id
            goaway.extend_from_slice(&INADEQUATE_SECURITY.to_be_bytes());
            goaway.extend_from_slice(TLS_ONLY.as_bytes());
            let mut out = frame(SETTINGS, &[]);
            out.extend(frame(GOAWAY, &goaway));
            out
        }
        Protocol::Http => {
            let body = "this port serves HTTPS only: use https:// and the CA that signed the node's certificate\n";
            format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
    }
}

/// The connections of one port, as its server takes them: a stream for
/// tonic, an [`axum::serve::Listener`] for axum. Dropping it stops the
/// port's loop (and closes its listening socket).
pub struct Incoming {
    connections: mpsc::Receiver<Conn>,
    local: SocketAddr,
    stats: Arc<PortStats>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Incoming {
    /// The port's counters.
    pub fn stats(&self) -> Arc<PortStats> {
        Arc::clone(&self.stats)
    }

    /// The address the port listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl futures::Stream for Incoming {
    type Item = Result<Conn, std::convert::Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().connections.poll_recv(cx).map(|c| c.map(Ok))
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.connections.recv().await {
            Some(conn) => {
                let remote = conn.remote().unwrap_or(self.local);
                (conn, remote)
            }
            // The loop ended (it ends only with this receiver): no more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Starts `port`'s loop on `listener`.
///
/// # Errors
/// When the listener has no local address.
pub fn spawn(listener: TcpListener, port: Port) -> std::io::Result<Incoming> {
    let local = listener.local_addr()?;
    let stats = Arc::new(PortStats::default());
    let (handed, connections) = mpsc::channel(port.caps.total.max(1) as usize);
    let shared = Arc::new(Shared {
        gate: Gate::new(port.caps, Arc::clone(&stats)),
        port,
        stats: Arc::clone(&stats),
        refusals: Mutex::new(Throttle::new(REFUSAL_LOG_PERIOD)),
        pre_auth: Mutex::new(Throttle::new(REFUSAL_LOG_PERIOD)),
        accept_errors: Mutex::new(Throttle::new(REFUSAL_LOG_PERIOD)),
    });
    let accepting = tokio::spawn(accept_loop(listener, shared, handed));
    Ok(Incoming {
        connections,
        local,
        stats,
        accepting,
    })
}

/// Accepts until the server drops its [`Incoming`].
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, handed: mpsc::Sender<Conn>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = handed.closed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if let Some(n) = Shared::due(&shared.accept_errors) {
                    tracing::warn!(port = shared.port.name, error = %e, errors = n, "accept failed");
                }
                if out_of_resources(&e) {
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
                continue;
            }
        };
        let source = Source::of(remote.ip());
        let permit = match shared.gate.admit(source) {
            Ok(permit) => permit,
            Err(refusal) => {
                if let Some(n) = Shared::due(&shared.refusals) {
                    let caps = shared.port.caps;
                    tracing::warn!(
                        port = shared.port.name,
                        %source,
                        refused = n,
                        per_source_cap = caps.per_source,
                        total_cap = caps.total,
                        "connections refused since the last such line ({:?} cap reached by the last); \
                         raise --max-connections-per-ip / --max-connections if these are real clients",
                        refusal
                    );
                }
                // Closed at once: the peer reads the end of the stream.
                drop(stream);
                continue;
            }
        };
        // Issue 11, item 7: tonic sets TCP_NODELAY only on listeners it
        // binds itself.
        let _ = stream.set_nodelay(true);
        let info = tonic::transport::server::TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: Some(remote),
        };
        match shared.port.tls.clone() {
            None => {
                let conn = Conn {
                    io: ConnIo::Plain(stream),
                    info,
                    _permit: permit,
                };
                if hand_over(&shared, &handed, conn).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let shared = Arc::clone(&shared);
                let handed = handed.clone();
                tokio::spawn(async move {
                    let port = &shared.port;
                    let failed = |failure: &PreAuthFailure| {
                        let counter = match failure {
                            PreAuthFailure::Timeout => &shared.stats.pre_auth_timeouts,
                            PreAuthFailure::Plaintext => &shared.stats.plaintext_refused,
                            PreAuthFailure::Tls(_) => &shared.stats.pre_auth_failures,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        if let Some(n) = Shared::due(&shared.pre_auth) {
                            tracing::info!(
                                port = port.name,
                                peer = %remote,
                                dropped = n,
                                "connections dropped before authentication since the last such line; the last: {failure}"
                            );
                        }
                    };
                    let handshake =
                        pre_auth(stream, tls, port.protocol, port.pre_auth_timeout, failed);
                    if let Ok(tls_stream) = handshake.await {
                        let conn = Conn {
                            io: ConnIo::Tls(Box::new(tls_stream)),
                            info,
                            _permit: permit,
                        };
                        let _ = hand_over(&shared, &handed, conn).await;
                    }
                });
            }
        }
    }
}

/// Hands `conn` to the server (never waits: the queue holds as many as
/// the caps let be open).
async fn hand_over(
    shared: &Shared,
    handed: &mpsc::Sender<Conn>,
    conn: Conn,
) -> Result<(), mpsc::error::SendError<Conn>> {
    handed.send(conn).await?;
    shared.stats.served.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Whether an accept error is about the process (file descriptors,
/// memory) rather than the one connection.
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether a port at `addr` without TLS deserves a warning: it is reachable
/// beyond this host (not a loopback address), so anyone on the network
/// can use it and read what it says.
pub fn plaintext_exposed(addr: SocketAddr, tls: bool) -> bool {
    !tls && !addr.ip().to_canonical().is_loopback()
}

/// Raises the soft limit on open files to the hard limit (idle client
/// connections must not starve the node of descriptors); the limit before
/// and after.
///
/// # Errors
/// When the limit cannot be read or set.
pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    // An unlimited hard limit still stops at the kernel's `nr_open`, above
    // which setrlimit fails.
    let target = match limit.rlim_max {
        libc::RLIM_INFINITY => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse::<libc::rlim_t>().ok())
            .unwrap_or(1 << 20),
        hard => hard,
    };
    if limit.rlim_cur < target {
        limit.rlim_cur = target;
        // SAFETY: setrlimit reads one rlimit from the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((before, limit.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn caps(per_source: u32, total: u32) -> Caps {
        Caps { per_source, total }
    }

    #[test]
    fn the_gate_counts_per_source_and_in_total_and_forgets_dropped_permits() {
        let stats = Arc::new(PortStats::default());
        let gate = Gate::new(caps(2, 3), Arc::clone(&stats));
        let a = Source::of("10.0.0.1".parse().unwrap());
        let b = Source::of("10.0.0.2".parse().unwrap());
        let a1 = gate.admit(a).unwrap();
        let a2 = gate.admit(a).unwrap();
        assert_eq!(gate.admit(a).unwrap_err(), Refusal::PerSource);
        let b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(b).unwrap_err(), Refusal::Total, "3 open in all");
        assert_eq!(gate.open_now(a), (3, 2));
        drop(a1);
        assert_eq!(gate.open_now(a), (2, 1));
        let a3 = gate.admit(a).unwrap();
        drop((a2, a3, b1));
        assert_eq!(gate.open_now(a), (0, 0));
        assert!(gate.open().by_source.is_empty(), "no source kept at 0");
        assert_eq!(stats.refused_per_source.load(Ordering::Relaxed), 1);
        assert_eq!(stats.refused_total.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn non_loopback_plaintext_is_warned_about() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(!plaintext_exposed(addr("127.0.0.1:7101"), false));
        assert!(!plaintext_exposed(addr("127.3.2.1:7101"), false));
        assert!(!plaintext_exposed(addr("[::1]:7101"), false));
        assert!(!plaintext_exposed(addr("[::ffff:127.0.0.1]:7101"), false));
        assert!(plaintext_exposed(addr("0.0.0.0:7101"), false));
        assert!(plaintext_exposed(addr("[::]:7101"), false));
        assert!(plaintext_exposed(addr("10.0.0.1:7101"), false));
        assert!(!plaintext_exposed(addr("10.0.0.1:7101"), true));
        assert!(!plaintext_exposed(addr("0.0.0.0:7101"), true));
    }

    /// The loop of a plaintext port with `caps` on a loopback port.
    async fn plain_port(caps: Caps) -> Incoming {
        port_with(caps, None).await
    }

    /// The loop of a port with `caps` and `tls` on a loopback port. Its
    /// handshake deadline is an hour: these tests run on the real clock,
    /// and must not depend on how fast the machine is.
    async fn port_with(caps: Caps, tls: Option<Arc<ServerConfig>>) -> Incoming {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        spawn(
            listener,
            Port {
                name: "test",
                protocol: Protocol::Grpc,
                tls,
                caps,
                pre_auth_timeout: Duration::from_secs(3600),
            },
        )
        .unwrap()
    }

    /// A connection to `to` from the loopback address `from`.
    async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// Whether the server closed `client` without a word (a refused
    /// connection): its read ends. (The timeout only keeps a broken loop
    /// from hanging the test.)
    async fn closed_at_once(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(60), client.read(&mut byte))
            .await
            .expect("the connection is closed, not left open");
        matches!(read, Ok(0) | Err(_))
    }

    /// Issue 15, item 1: connections beyond the per-source cap are closed
    /// at once, others' are still taken, and a closed connection makes
    /// room. Every step waits on the loop's own output (a connection handed
    /// over, or closed), never on time.
    #[tokio::test]
    async fn connections_beyond_the_per_source_cap_are_closed_at_once() {
        let mut incoming = plain_port(caps(2, 100)).await;
        let addr = incoming.local_addr();
        let _c1 = connect_from("127.0.0.1", addr).await;
        let s1 = incoming.next().await.unwrap().unwrap();
        let _c2 = connect_from("127.0.0.1", addr).await;
        let s2 = incoming.next().await.unwrap().unwrap();
        let mut c3 = connect_from("127.0.0.1", addr).await;
        assert!(closed_at_once(&mut c3).await, "the third from one source");
        // Another source is not held back.
        let _d1 = connect_from("127.0.0.2", addr).await;
        let d1 = incoming.next().await.unwrap().unwrap();
        assert_eq!(d1.remote().unwrap().ip().to_string(), "127.0.0.2");
        let stats = incoming.stats();
        assert_eq!(stats.refused_per_source.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 3);
        // One of the first source's closes: the next one is taken.
        drop(s1);
        let _c4 = connect_from("127.0.0.1", addr).await;
        let s4 = incoming.next().await.unwrap().unwrap();
        assert_eq!(s4.remote().unwrap().ip().to_string(), "127.0.0.1");
        drop((s2, s4, d1));
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn connections_beyond_the_total_cap_are_closed_at_once() {
        let mut incoming = plain_port(caps(10, 2)).await;
        let addr = incoming.local_addr();
        let _c1 = connect_from("127.0.0.1", addr).await;
        let s1 = incoming.next().await.unwrap().unwrap();
        let _c2 = connect_from("127.0.0.2", addr).await;
        let _s2 = incoming.next().await.unwrap().unwrap();
        let mut c3 = connect_from("127.0.0.3", addr).await;
        assert!(closed_at_once(&mut c3).await, "a third in all");
        assert_eq!(incoming.stats().refused_total.load(Ordering::Relaxed), 1);
        drop(s1);
        let _c4 = connect_from("127.0.0.3", addr).await;
        let s4 = incoming.next().await.unwrap().unwrap();
        assert_eq!(s4.remote().unwrap().ip().to_string(), "127.0.0.3");
    }

    /// Connections still in their TLS handshake count against the caps
    /// (they are the ones a flood of unauthenticated peers holds open).
    #[tokio::test]
    async fn handshaking_connections_count_against_the_caps() {
        let tls = tls_setup(false);
        let mut incoming = port_with(caps(1, 10), Some(tls.server)).await;
        let addr = incoming.local_addr();
        let idle = connect_from("127.0.0.1", addr).await;
        let mut second = connect_from("127.0.0.1", addr).await;
        assert!(
            closed_at_once(&mut second).await,
            "the idle one holds the cap"
        );
        assert_eq!(
            incoming.stats().refused_per_source.load(Ordering::Relaxed),
            1
        );
        // The idle one leaves: a client that does its handshake gets in,
        // once the idle one's handshake task has seen it go (until then a
        // new connection is refused: try again).
        drop(idle);
        let client = tokio::spawn(async move {
            loop {
                let tcp = connect_from("127.0.0.1", addr).await;
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                if let Ok(stream) = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client))
                    .connect(name, tcp)
                    .await
                {
                    return stream;
                }
            }
        });
        let served = incoming.next().await.unwrap().unwrap();
        assert!(matches!(served.io, ConnIo::Tls(_)));
        let _client = client.await.unwrap();
    }

    /// Issue 11, item 7: every connection handed over has `TCP_NODELAY`
    /// (without it, about 1 % of 4 KiB appends waited 40 ms for a delayed
    /// ACK), plaintext or TLS.
    #[tokio::test]
    async fn connections_have_nodelay() {
        let mut incoming = plain_port(Caps::default()).await;
        let _client = connect_from("127.0.0.1", incoming.local_addr()).await;
        let conn = incoming.next().await.unwrap().unwrap();
        let ConnIo::Plain(stream) = &conn.io else {
            panic!("plaintext")
        };
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY is set");
        let tls = tls_setup(false);
        let mut incoming = port_with(Caps::default(), Some(tls.server)).await;
        let addr = incoming.local_addr();
        let client = tokio::spawn(async move {
            let tcp = connect_from("127.0.0.1", addr).await;
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            tokio_rustls::TlsConnector::from(tls.client)
                .connect(name, tcp)
                .await
        });
        let conn = incoming.next().await.unwrap().unwrap();
        let _client = client.await.unwrap().unwrap();
        let ConnIo::Tls(stream) = &conn.io else {
            panic!("TLS")
        };
        assert!(
            stream.get_ref().0.io.nodelay().unwrap(),
            "TCP_NODELAY is set"
        );
    }

    /// A plaintext gRPC client of a TLS port is told, in HTTP/2, that the
    /// port wants TLS, and the Rust client says so instead of retrying
    /// until its deadline.
    #[tokio::test]
    async fn a_plaintext_grpc_client_is_told_to_use_tls() {
        let tls = tls_setup(false);
        let incoming = port_with(Caps::default(), Some(tls.server)).await;
        let endpoint = incoming.local_addr().to_string();
        let mut client = ringraft_client::Client::new(vec![endpoint], Duration::from_secs(60))
            .with_deadline(Duration::from_secs(3600));
        let err = client.status().await.unwrap_err();
        assert!(
            matches!(&err, ringraft_client::ClientError::Tls(why) if why.contains("--ca")),
            "{err}"
        );
        drop(incoming);
    }

    /// A server of a throwaway CA's certificate and clients that trust
    /// that CA: with a certificate of the same CA, with none, and with one
    /// of another CA.
    struct Tls {
        server: Arc<ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        anonymous: Arc<rustls::ClientConfig>,
        stranger: Arc<rustls::ClientConfig>,
    }

    /// [`Tls`]; the server requires client certificates when
    /// `require_client_cert`.
    fn tls_setup(require_client_cert: bool) -> Tls {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let ca = crate::demo::certs::Ca::new("test ca").unwrap();
        let other_ca = crate::demo::certs::Ca::new("another ca").unwrap();
        let node = ca.leaf("node").unwrap();
        let chain = |pem: &str| vec![CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()];
        let key = |pem: &str| PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(chain(&ca.pem).remove(0)).unwrap();
        let roots = Arc::new(roots);
        let provider = ringraft_client::tls::crypto_provider();
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let server = if require_client_cert {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::clone(&roots),
                provider.clone(),
            )
            .build()
            .unwrap();
            server.with_client_cert_verifier(verifier)
        } else {
            server.with_no_client_auth()
        };
        let server = server
            .with_single_cert(chain(&node.cert_pem), key(&node.key_pem))
            .unwrap();
        let client_builder = || {
            rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(Arc::clone(&roots))
        };
        let with_cert = |leaf: crate::demo::certs::Leaf| {
            Arc::new(
                client_builder()
                    .with_client_auth_cert(chain(&leaf.cert_pem), key(&leaf.key_pem))
                    .unwrap(),
            )
        };
        Tls {
            server: Arc::new(server),
            client: with_cert(ca.leaf("client").unwrap()),
            anonymous: Arc::new(client_builder().with_no_client_auth()),
            stranger: with_cert(other_ca.leaf("stranger").unwrap()),
        }
    }

    /// `client`'s handshake with a server of `server` over an in-memory
    /// pipe: what the server's side came to. The client's side stays open
    /// until the server's ends.
    async fn handshake(
        server: Arc<ServerConfig>,
        client: Arc<rustls::ClientConfig>,
    ) -> Result<TlsStream<Prefixed<tokio::io::DuplexStream>>, PreAuthFailure> {
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(pre_auth(
            server_io,
            server,
            Protocol::Grpc,
            PRE_AUTH_TIMEOUT,
            |_| {},
        ));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let client = tokio::spawn(async move {
            let Ok(mut stream) = tokio_rustls::TlsConnector::from(client)
                .connect(name, client_io)
                .await
            else {
                return;
            };
            let mut byte = [0u8; 1];
            let _ = stream.read(&mut byte).await;
        });
        let result = server.await.unwrap();
        if result.is_err() {
            client.await.unwrap();
        }
        result
    }

    /// A handshake that completes in time yields the TLS stream, and the
    /// bytes flow (over an in-memory pipe, on paused time: the deadline
    /// cannot pass while either end can make progress).
    #[tokio::test(start_paused = true)]
    async fn a_handshake_in_time_gets_through() {
        for require_client_cert in [false, true] {
            let tls = tls_setup(require_client_cert);
            let (client_io, server_io) = tokio::io::duplex(64 << 10);
            let server = tokio::spawn(pre_auth(
                server_io,
                tls.server,
                Protocol::Grpc,
                PRE_AUTH_TIMEOUT,
                |_| {},
            ));
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut client = tokio_rustls::TlsConnector::from(tls.client)
                .connect(name, client_io)
                .await
                .unwrap();
            client.write_all(b"ping").await.unwrap();
            client.flush().await.unwrap();
            let mut server = server.await.unwrap().expect("the handshake gets through");
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
        }
    }

    /// Where client certificates are required, a client without one, or
    /// with one of another CA, is refused in the handshake.
    #[tokio::test(start_paused = true)]
    async fn a_client_without_an_acceptable_certificate_is_refused() {
        let tls = tls_setup(true);
        for (what, client) in [
            ("no certificate", tls.anonymous),
            ("another CA's", tls.stranger),
        ] {
            let failure = handshake(Arc::clone(&tls.server), client)
                .await
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted"));
            assert!(
                matches!(failure, PreAuthFailure::Tls(_)),
                "{what}: {failure}"
            );
        }
        let tls = tls_setup(false);
        assert!(
            handshake(tls.server, tls.anonymous).await.is_ok(),
            "no certificate needed where none is required"
        );
    }

    /// `handshake`, failing the test if it outlives ten deadlines of
    /// (paused) time: without a deadline it would wait forever.
    async fn guarded<T>(handshake: impl Future<Output = T>) -> T {
        tokio::time::timeout(PRE_AUTH_TIMEOUT * 10, handshake)
            .await
            .expect("the handshake's deadline dropped the peer")
    }

    /// Issue 15, item 1: a peer that connects and says nothing is dropped
    /// at the deadline (paused time: the clock jumps to it once nothing
    /// else can happen).
    #[tokio::test(start_paused = true)]
    async fn an_idle_peer_is_dropped_at_the_deadline() {
        let server_tls = tls_setup(false).server;
        let (_client_io, server_io) = tokio::io::duplex(64 << 10);
        let started = Instant::now();
        let failure = guarded(pre_auth(
            server_io,
            server_tls,
            Protocol::Grpc,
            PRE_AUTH_TIMEOUT,
            |_| {},
        ))
        .await
        .err()
        .expect("no handshake");
        assert!(matches!(failure, PreAuthFailure::Timeout), "{failure}");
        assert_eq!(started.elapsed(), PRE_AUTH_TIMEOUT, "exactly the deadline");
    }

    /// A peer that starts a handshake and stalls half-way is dropped at
    /// the deadline too.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_handshake_is_dropped_at_the_deadline() {
        let server_tls = tls_setup(false).server;
        let (mut client_io, server_io) = tokio::io::duplex(64 << 10);
        // The first bytes of a ClientHello record, and no more.
        client_io
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
            .await
            .unwrap();
        let failure = guarded(pre_auth(
            server_io,
            server_tls,
            Protocol::Grpc,
            PRE_AUTH_TIMEOUT,
            |_| {},
        ))
        .await
        .err()
        .expect("no handshake");
        assert!(matches!(failure, PreAuthFailure::Timeout), "{failure}");
    }

    /// A plaintext HTTP/1 request on a TLS metrics port is answered with a
    /// 400 that says HTTPS, then closed.
    #[tokio::test(start_paused = true)]
    async fn a_plaintext_request_on_a_tls_port_is_told_so() {
        let server_tls = tls_setup(false).server;
        let (mut client_io, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(pre_auth(
            server_io,
            server_tls,
            Protocol::Http,
            PRE_AUTH_TIMEOUT,
            |_| {},
        ));
        client_io
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client_io.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(answer.contains("HTTPS only"), "{answer}");
        drop(client_io);
        let failure = server.await.unwrap().err().expect("no handshake");
        assert!(matches!(failure, PreAuthFailure::Plaintext), "{failure}");
    }

    /// The soft limit ends at the hard one (raising it is harmless to the
    /// other tests of this process; lowering it would not be).
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let (before, after) = raise_open_files_limit().unwrap();
        assert!(after >= before);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, after, "in force");
        assert!(limit.rlim_max == libc::RLIM_INFINITY || after == limit.rlim_max);
        assert_eq!(
            raise_open_files_limit().unwrap(),
            (after, after),
            "once is enough"
        );
    }

    #[test]
    fn the_grpc_refusal_is_a_settings_then_a_goaway_frame() {
        let bytes = plaintext_refusal(Protocol::Grpc);
        assert_eq!(&bytes[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0], "empty SETTINGS");
        let goaway = &bytes[9..];
        let len = u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize;
        assert_eq!(goaway[3], 7, "GOAWAY");
        assert_eq!(goaway.len(), 9 + len);
        assert_eq!(&goaway[9..13], &[0, 0, 0, 0], "last stream 0");
        assert_eq!(&goaway[13..17], &[0, 0, 0, 0xc], "INADEQUATE_SECURITY");
        assert_eq!(&goaway[17..], TLS_ONLY.as_bytes());
    }
}
