//! The software RNIC shared by the `tcp` and `inproc` backends: a device
//! (registration table), queue pairs over ordered frame channels, and the
//! authenticated connection setup. The backends only differ in how frames
//! travel: a TCP stream, or an in-process link with injected faults.

pub(crate) mod conn;
pub(crate) mod nic;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use crate::api::{AcceptPolicy, DeviceConfig};
use crate::entropy::Entropy;
use crate::error::{Result, WcError};
use crate::handshake::{self, PeerInfo, Reveal};
use crate::limits::ConnSlot;
use crate::types::{Access, AtomicCapability, Backend, ConnConfig, Received};
use crate::work::{Done, Request};
use conn::{SoftConn, SoftEndpoint, Wire};
use nic::SoftNic;

/// How a software device moves frames.
#[derive(Clone)]
pub(crate) enum Flavor {
    Tcp,
    Inproc {
        fabric: crate::inproc::Fabric,
        node: String,
    },
}

/// A software device.
pub(crate) struct SoftDevice {
    pub(crate) nic: Arc<SoftNic>,
    pub(crate) config: DeviceConfig,
    pub(crate) flavor: Flavor,
    pub(crate) atomic: AtomicCapability,
    pub(crate) live_connections: Arc<AtomicU32>,
    pub(crate) rejected: Arc<AtomicU64>,
    /// Its listeners' caps on unproven connections, and its member sources
    /// (the `tcp` flavour's; the in-process fabric has no sockets).
    pub(crate) gate: Arc<crate::gate::Gate>,
    /// Where its rkeys and handshake nonces come from (see
    /// [`crate::entropy`]).
    pub(crate) entropy: Arc<Entropy>,
}

impl SoftDevice {
    /// A device of the tcp backend: a real deployment's, so its rkeys and
    /// nonces come from the OS.
    pub(crate) fn tcp(config: DeviceConfig) -> SoftDevice {
        SoftDevice::new(
            config,
            Flavor::Tcp,
            AtomicCapability::Global,
            Entropy::os(),
            None,
        )
    }

    pub(crate) fn new(
        config: DeviceConfig,
        flavor: Flavor,
        atomic: AtomicCapability,
        entropy: Entropy,
        landings: Option<crate::inproc::LandingSink>,
    ) -> SoftDevice {
        let entropy = Arc::new(entropy);
        let mut nic = SoftNic::new(config.limits.clone(), entropy.clone());
        if let Some(sink) = landings {
            nic.observe(sink);
        }
        SoftDevice {
            nic: Arc::new(nic),
            gate: crate::gate::Gate::new(&config.limits),
            config,
            flavor,
            atomic,
            live_connections: Arc::new(AtomicU32::new(0)),
            rejected: Arc::new(AtomicU64::new(0)),
            entropy,
        }
    }

    /// This device's side of a handshake, with a fresh nonce.
    pub(crate) fn handshake_side(&self) -> handshake::Local<'_> {
        handshake::Local {
            secret: &self.config.secret,
            backend: self.backend(),
            node_id: self.config.node_id,
            nonce: self.entropy.nonce(),
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        match self.flavor {
            Flavor::Tcp => Backend::Tcp,
            Flavor::Inproc { .. } => Backend::Inproc,
        }
    }

    pub(crate) fn atomic_capability(&self) -> AtomicCapability {
        self.atomic
    }

    pub(crate) fn counters(&self) -> Vec<(String, u64)> {
        vec![
            (
                "live_connections".into(),
                self.live_connections.load(Ordering::Relaxed) as u64,
            ),
            (
                "rejected_handshakes".into(),
                self.rejected.load(Ordering::Relaxed),
            ),
            (
                "refused_requests".into(),
                self.nic.refused.load(Ordering::Relaxed),
            ),
        ]
    }

    pub(crate) fn register(&self, addr: *mut u8, len: usize, access: Access) -> Result<SoftRegion> {
        let rkey = self.nic.register(addr as u64, len as u64, access)?;
        Ok(SoftRegion {
            nic: self.nic.clone(),
            rkey,
        })
    }

    pub(crate) async fn listen(
        self: Arc<Self>,
        addr: &str,
        config: ConnConfig,
        policy: AcceptPolicy,
    ) -> Result<SoftListener> {
        match self.flavor.clone() {
            Flavor::Tcp => crate::bootstrap::listen(self, addr, config, policy).await,
            Flavor::Inproc { fabric, .. } => fabric.listen(self, addr, config, policy),
        }
    }

    pub(crate) async fn connect(
        self: Arc<Self>,
        addr: &str,
        config: ConnConfig,
        app_data: Vec<u8>,
    ) -> Result<SoftConnection> {
        match self.flavor.clone() {
            Flavor::Tcp => crate::tcp::connect(self, addr, config, app_data).await,
            Flavor::Inproc { fabric, .. } => fabric.connect(self, addr, config, app_data).await,
        }
    }

    /// [`crate::Device::probe`].
    pub(crate) async fn probe(&self, addr: &str, timeout: std::time::Duration) -> crate::Probe {
        match &self.flavor {
            Flavor::Tcp => crate::bootstrap::probe(addr, timeout).await,
            Flavor::Inproc { fabric, node } => fabric.probe(node, addr, timeout).await,
        }
    }

    /// Reserves a connection slot, or fails at the device's limit.
    pub(crate) fn reserve_connection(&self) -> Result<ConnSlot> {
        ConnSlot::reserve(&self.live_connections, self.config.limits.max_connections)
    }

    /// Client side of the handshake over `stream`.
    pub(crate) async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        addr: &str,
        config: &ConnConfig,
        app_data: Vec<u8>,
    ) -> Result<(PeerInfo, SoftEndpoint)> {
        let peer = handshake::client(
            stream,
            addr,
            self.handshake_side(),
            config.handshake_timeout,
            || {
                Ok(Reveal {
                    endpoint: SoftEndpoint::of(config).encode(),
                    app_data,
                })
            },
        )
        .await?;
        let endpoint = SoftEndpoint::decode(&peer.reveal.endpoint, addr)?;
        Ok((peer, endpoint))
    }

    /// Server side of the handshake over `stream`, with the policy's answer.
    pub(crate) async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        addr: &str,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> Result<(PeerInfo, SoftEndpoint, ConnSlot)> {
        let accepted = handshake::server(
            stream,
            addr,
            self.handshake_side(),
            config.handshake_timeout,
        )
        .await?;
        self.admit_and_answer(stream, addr, accepted, config, policy)
            .await
    }

    /// The server side once the client has proven the secret: the checks
    /// of [`handshake::Accepted::admit`], then this device's answer.
    pub(crate) async fn admit_and_answer<S: AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        addr: &str,
        accepted: handshake::Accepted,
        config: &ConnConfig,
        policy: &AcceptPolicy,
    ) -> Result<(PeerInfo, SoftEndpoint, ConnSlot)> {
        let (endpoint, slot, app_data) = accepted
            .admit(
                stream,
                addr,
                SoftEndpoint::decode,
                || self.reserve_connection(),
                policy,
            )
            .await?;
        accepted
            .answer(
                stream,
                addr,
                Reveal {
                    endpoint: SoftEndpoint::of(config).encode(),
                    app_data,
                },
            )
            .await?;
        Ok((accepted.peer, endpoint, slot))
    }

    /// Starts a queue pair over an established wire.
    pub(crate) fn start(
        &self,
        addr: String,
        config: ConnConfig,
        peer: PeerInfo,
        endpoint: SoftEndpoint,
        wire: Wire,
        slot: ConnSlot,
    ) -> SoftConnection {
        let conn = SoftConn::start(self.nic.clone(), addr.clone(), config, endpoint, wire);
        SoftConnection {
            inner: Arc::new(ConnInner {
                conn,
                peer,
                addr,
                _slot: slot,
            }),
        }
    }
}

/// A software memory registration.
pub(crate) struct SoftRegion {
    nic: Arc<SoftNic>,
    rkey: u32,
}

impl SoftRegion {
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    pub(crate) fn rotate(&mut self) -> Result<()> {
        self.rkey = self.nic.rotate(self.rkey)?;
        Ok(())
    }
}

impl Drop for SoftRegion {
    fn drop(&mut self) {
        self.nic.deregister(self.rkey);
    }
}

struct ConnInner {
    conn: SoftConn,
    peer: PeerInfo,
    addr: String,
    _slot: ConnSlot,
}

impl Drop for ConnInner {
    fn drop(&mut self) {
        self.conn.close("connection dropped");
    }
}

/// A software connection as the API sees it.
#[derive(Clone)]
pub(crate) struct SoftConnection {
    inner: Arc<ConnInner>,
}

impl SoftConnection {
    pub(crate) fn peer_info(&self) -> &PeerInfo {
        &self.inner.peer
    }

    pub(crate) fn peer_addr(&self) -> &str {
        &self.inner.addr
    }

    pub(crate) fn config(&self) -> &ConnConfig {
        self.inner.conn.config()
    }

    pub(crate) fn post(
        &self,
        request: Request,
    ) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        self.inner.conn.post(request)
    }

    pub(crate) fn post_chain(
        &self,
        requests: Vec<Request>,
    ) -> Result<Vec<oneshot::Receiver<Result<Done, WcError>>>> {
        self.inner.conn.post_chain(requests)
    }

    pub(crate) fn post_recv(&self, count: u32) -> Result<()> {
        self.inner.conn.post_recv(count)
    }

    pub(crate) async fn recv(&self) -> Result<Received> {
        self.inner.conn.recv().await
    }

    pub(crate) fn set_remote_access(&self, access: Access) -> Result<()> {
        self.inner.conn.set_remote_access(access)
    }

    pub(crate) fn error(&self) -> Option<String> {
        self.inner.conn.broken()
    }

    pub(crate) fn close(&self, reason: &str) {
        self.inner.conn.close(reason)
    }
}

/// Authenticated software connections, as the accept task (tcp) or the
/// fabric (inproc) produces them.
pub(crate) type SoftListener = crate::bootstrap::Listener<SoftConnection>;
