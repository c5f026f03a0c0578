//! The public API: devices, memory registrations, listeners, connections and
//! completions, the same for every backend.
//!
//! Shaped like RC verbs: `post_*` puts a work request on the connection's
//! send queue *now* (so posting order is wire order, RC ordering) and
//! returns a [`Completion`] that resolves when the peer acknowledges it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::{Result, TransportError, WcError};
use crate::handshake::{PeerInfo, Secret};
use crate::soft::{SoftConnection, SoftDevice, SoftListener};
use crate::types::{
    Access, AtomicCapability, Backend, ConnConfig, DeviceLimits, Received, RemoteAddr, RemoteRegion,
};
use crate::work::{Done, Request};

/// What every device needs to know about its node.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// This node's id, proven in handshakes.
    pub node_id: u64,
    /// The cluster secret.
    pub secret: Secret,
    /// Limits on registrations and connections.
    pub limits: DeviceLimits,
}

/// Decides what an authenticated client gets: application data to reveal
/// to it, or a refusal with a reason.
pub type AcceptPolicy =
    Arc<dyn Fn(&PeerInfo) -> std::result::Result<Vec<u8>, String> + Send + Sync>;

/// An accept policy that reveals `app_data` to every authenticated peer.
pub fn reveal_to_all(app_data: Vec<u8>) -> AcceptPolicy {
    Arc::new(move |_| Ok(app_data.clone()))
}

#[derive(Clone)]
pub(crate) enum DeviceKind {
    Soft(Arc<SoftDevice>),
    #[cfg(feature = "rdma")]
    Rdma(Arc<crate::rdma::RdmaDevice>),
}

/// What [`Device::probe`] found at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Something accepted the connection.
    Listening,
    /// The host answered that nothing listens there.
    Refused,
    /// No answer in time, or another failure: nothing is known.
    Unknown(String),
}

/// An open device: the software RNIC of this process (`tcp`), a node of an
/// in-process fabric (`inproc`), or a real RDMA device (`rdma`).
#[derive(Clone)]
pub struct Device {
    pub(crate) kind: DeviceKind,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("backend", &self.backend())
            .finish()
    }
}

impl Device {
    /// The software RNIC over TCP.
    pub fn tcp(config: DeviceConfig) -> Device {
        Device {
            kind: DeviceKind::Soft(Arc::new(SoftDevice::tcp(config))),
        }
    }

    /// A real RDMA device: `name` (e.g. `rxe0`), or the first active one.
    #[cfg(feature = "rdma")]
    pub fn rdma(name: Option<&str>, config: DeviceConfig) -> Result<Device> {
        Ok(Device {
            kind: DeviceKind::Rdma(Arc::new(crate::rdma::RdmaDevice::open(name, config)?)),
        })
    }

    /// Opens a device of `backend` (`rdma_device` names the RDMA device;
    /// the first active one when `None`). The in-process fabric has no
    /// global devices: use [`crate::inproc::Fabric::device`].
    pub fn open(
        backend: Backend,
        rdma_device: Option<&str>,
        config: DeviceConfig,
    ) -> Result<Device> {
        match backend {
            Backend::Tcp => Ok(Device::tcp(config)),
            Backend::Inproc => Err(TransportError::Config(
                "the inproc backend's devices come from an inproc::Fabric".into(),
            )),
            #[cfg(feature = "rdma")]
            Backend::Rdma => Device::rdma(rdma_device, config),
            #[cfg(not(feature = "rdma"))]
            Backend::Rdma => {
                let _ = rdma_device;
                Err(TransportError::Config(
                    "this build has no rdma backend (cargo feature `rdma`)".into(),
                ))
            }
        }
    }

    /// `rdma` when this build has it and an active device exists, else
    /// `tcp`; says which in the log.
    pub fn auto(rdma_device: Option<&str>, config: DeviceConfig) -> Device {
        #[cfg(feature = "rdma")]
        match Device::rdma(rdma_device, config.clone()) {
            Ok(device) => {
                tracing::info!("fabric: rdma");
                return device;
            }
            Err(error) => tracing::info!(%error, "fabric: tcp (no usable RDMA device)"),
        }
        #[cfg(not(feature = "rdma"))]
        {
            let _ = rdma_device;
            tracing::info!("fabric: tcp (built without the rdma backend)");
        }
        Device::tcp(config)
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match &self.kind {
            DeviceKind::Soft(d) => d.backend(),
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(_) => Backend::Rdma,
        }
    }

    /// How remote atomics relate to CPU atomics on this device. DESIGN.md:
    /// unless this is [`AtomicCapability::Global`], a node changes its own
    /// fence word through a loopback connection.
    pub fn atomic_capability(&self) -> AtomicCapability {
        match &self.kind {
            DeviceKind::Soft(d) => d.atomic_capability(),
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(d) => d.atomic_capability(),
        }
    }

    /// The device's counters (the port's `hw_counters` on rdma), by name.
    pub fn counters(&self) -> Vec<(String, u64)> {
        match &self.kind {
            DeviceKind::Soft(d) => d.counters(),
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(d) => d.counters(),
        }
    }

    /// Registers `len` bytes at `addr` for the device and for remote peers
    /// with the given access.
    ///
    /// # Safety
    /// The memory must stay valid (mapped, not freed) until the returned
    /// region is dropped, and the caller accepts that the device writes it
    /// at any moment allowed by `access` (remote WRITEs and atomics from any
    /// peer holding the rkey): it must not hold Rust references to those
    /// bytes across such writes.
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        let kind = match &self.kind {
            DeviceKind::Soft(d) => RegionKind::Soft(d.register(addr, len, access)?),
            #[cfg(feature = "rdma")]
            // SAFETY: forwarded contract.
            DeviceKind::Rdma(d) => RegionKind::Rdma(unsafe { d.register(addr, len, access)? }),
        };
        Ok(MemoryRegion {
            kind,
            addr: addr as u64,
            len: len as u64,
            access,
        })
    }

    /// Registers a fresh zeroed buffer of `len` bytes that the region owns.
    pub fn register_buffer(&self, len: usize, access: Access) -> Result<Buffer> {
        let mut memory = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let ptr = memory.as_mut_ptr() as *mut u8;
        // SAFETY: the buffer lives inside the returned `Buffer`, next to its
        // registration, which is dropped first (field order).
        let region = unsafe { self.register(ptr, len, access)? };
        Ok(Buffer {
            region,
            memory,
            len,
        })
    }

    /// Listens on `addr` (`host:port` for tcp and rdma, any name for
    /// inproc); authenticated clients get what `policy` reveals.
    pub async fn listen(
        &self,
        addr: &str,
        config: ConnConfig,
        policy: AcceptPolicy,
    ) -> Result<Listener> {
        config.validate().map_err(TransportError::Config)?;
        match &self.kind {
            DeviceKind::Soft(d) => Ok(Listener {
                kind: ListenerKind::Soft(d.clone().listen(addr, config, policy).await?),
            }),
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(d) => Ok(Listener {
                kind: ListenerKind::Rdma(d.clone().listen(addr, config, policy).await?),
            }),
        }
    }

    /// Takes `sources` as members' addresses: connections from them are
    /// let in past the cap on connections from strangers that have not
    /// proven the cluster secret ([`DeviceLimits::max_unauthenticated`]).
    /// The device also learns a source by itself once a peer there proves
    /// the secret, accepted or dialled; this seeds it (a node names its
    /// peers' hosts at start, so that their reconnects get through a flood
    /// of strangers even before they proved anything to this process).
    /// The `inproc` fabric has no sources: a no-op there.
    pub fn member_sources(&self, sources: impl IntoIterator<Item = std::net::IpAddr>) {
        let gate = match &self.kind {
            DeviceKind::Soft(d) => &d.gate,
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(d) => &d.gate,
        };
        for source in sources {
            gate.learn(source);
        }
    }

    /// Asks whether anything listens at `addr`, without a handshake: a TCP
    /// connect (the `rdma` backend's bootstrap port on `rdma`), closed at
    /// once. [`Probe::Refused`] is the peer host's kernel saying that no
    /// socket listens there: the listener's process is gone (or never
    /// started). A timeout or any other failure says nothing
    /// ([`Probe::Unknown`]). The listener's side takes a connection that
    /// closes before its first byte as a probe: not a rejected attempt.
    pub async fn probe(&self, addr: &str, timeout: std::time::Duration) -> Probe {
        match &self.kind {
            DeviceKind::Soft(d) => d.probe(addr, timeout).await,
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(_) => crate::bootstrap::probe(addr, timeout).await,
        }
    }

    /// Connects to the listener at `addr`, revealing `app_data` once the
    /// peer has proven the cluster secret.
    pub async fn connect(
        &self,
        addr: &str,
        config: ConnConfig,
        app_data: Vec<u8>,
    ) -> Result<Connection> {
        config.validate().map_err(TransportError::Config)?;
        match &self.kind {
            DeviceKind::Soft(d) => Ok(Connection {
                kind: ConnKind::Soft(d.clone().connect(addr, config, app_data).await?),
            }),
            #[cfg(feature = "rdma")]
            DeviceKind::Rdma(d) => Ok(Connection {
                kind: ConnKind::Rdma(d.clone().connect(addr, config, app_data).await?),
            }),
        }
    }
}

pub(crate) enum RegionKind {
    Soft(crate::soft::SoftRegion),
    #[cfg(feature = "rdma")]
    Rdma(crate::rdma::RdmaRegion),
}

/// A memory registration. Dropping it deregisters the memory: its rkey stops
/// working.
pub struct MemoryRegion {
    kind: RegionKind,
    addr: u64,
    len: u64,
    access: Access,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("remote", &self.remote())
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    /// How a peer addresses this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey(),
        }
    }

    /// The current rkey.
    pub fn rkey(&self) -> u32 {
        match &self.kind {
            RegionKind::Soft(r) => r.rkey(),
            #[cfg(feature = "rdma")]
            RegionKind::Rdma(r) => r.rkey(),
        }
    }

    /// The access the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Gives the region a new rkey (re-registration): the old rkey stops
    /// working before this returns; peers must be told the new one.
    pub fn rotate(&mut self) -> Result<RemoteRegion> {
        match &mut self.kind {
            RegionKind::Soft(r) => r.rotate()?,
            #[cfg(feature = "rdma")]
            RegionKind::Rdma(r) => r.rotate()?,
        }
        Ok(self.remote())
    }
}

/// A registered buffer that owns its memory (8-byte aligned). Its bytes are
/// read and written by copies, never borrowed, since the device may write
/// them at any moment.
pub struct Buffer {
    region: MemoryRegion,
    memory: Box<[u64]>,
    len: usize,
}

impl Buffer {
    /// The registration.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    /// The registration, to rotate its rkey.
    pub fn region_mut(&mut self) -> &mut MemoryRegion {
        &mut self.region
    }

    /// How a peer addresses this buffer.
    pub fn remote(&self) -> RemoteRegion {
        self.region.remote()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<*mut u8> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(TransportError::Invalid(format!(
                "{offset}+{len} is outside a buffer of {} bytes",
                self.len
            )));
        }
        // SAFETY: in bounds (checked).
        Ok(unsafe { (self.memory.as_ptr() as *mut u8).add(offset) })
    }

    /// Copies `len` bytes out of the buffer.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let src = self.check(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: in bounds; a copy, no reference to device-written memory.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// Copies `data` into the buffer.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.check(offset, data.len())?;
        // SAFETY: in bounds; the buffer's memory is ours to write.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// The 8-byte word at `offset` (8-aligned), read atomically.
    pub fn word(&self, offset: usize) -> Result<&std::sync::atomic::AtomicU64> {
        if !offset.is_multiple_of(8) {
            return Err(TransportError::Invalid(format!(
                "word offset {offset} is not 8-aligned"
            )));
        }
        let ptr = self.check(offset, 8)?;
        // SAFETY: in bounds, 8-aligned (the memory is a [u64]), and lives as
        // long as `self`; device atomics act on the same word.
        Ok(unsafe { std::sync::atomic::AtomicU64::from_ptr(ptr as *mut u64) })
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("region", &self.region)
            .finish()
    }
}

pub(crate) enum ListenerKind {
    Soft(SoftListener),
    #[cfg(feature = "rdma")]
    Rdma(crate::rdma::RdmaListener),
}

/// Accepts authenticated connections. Unauthenticated or malformed attempts
/// are logged and dropped; they never end the listener.
pub struct Listener {
    kind: ListenerKind,
}

impl Listener {
    /// The next authenticated connection; `None` once the listener stopped.
    pub async fn accept(&mut self) -> Option<Connection> {
        match &mut self.kind {
            ListenerKind::Soft(l) => l.accept().await.map(|c| Connection {
                kind: ConnKind::Soft(c),
            }),
            #[cfg(feature = "rdma")]
            ListenerKind::Rdma(l) => l.accept().await.map(|c| Connection {
                kind: ConnKind::Rdma(c),
            }),
        }
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> String {
        match &self.kind {
            ListenerKind::Soft(l) => l.local_addr(),
            #[cfg(feature = "rdma")]
            ListenerKind::Rdma(l) => l.local_addr(),
        }
    }

    /// Handshakes that failed (bad secret, garbage, timeout) so far.
    pub fn rejected(&self) -> u64 {
        match &self.kind {
            ListenerKind::Soft(l) => l.rejected(),
            #[cfg(feature = "rdma")]
            ListenerKind::Rdma(l) => l.rejected(),
        }
    }
}

#[derive(Clone)]
pub(crate) enum ConnKind {
    Soft(SoftConnection),
    #[cfg(feature = "rdma")]
    Rdma(crate::rdma::RdmaConnection),
}

/// One request of a chain: see [`Connection::post_chain`].
#[derive(Clone, Copy, Debug)]
pub enum Chained<'a> {
    /// A one-sided WRITE of `data` to `remote`.
    Write {
        /// Where the bytes go.
        remote: RemoteAddr,
        /// The bytes.
        data: &'a [u8],
    },
    /// A two-sided SEND of `data`; the peer must have a receive posted.
    Send {
        /// The message.
        data: &'a [u8],
    },
}

impl Chained<'_> {
    fn request(&self) -> Request {
        match *self {
            Chained::Write { remote, data } => Request::Write {
                addr: remote.addr,
                rkey: remote.rkey,
                data: data.to_vec(),
                imm: None,
            },
            Chained::Send { data } => Request::Send {
                data: data.to_vec(),
            },
        }
    }

    fn op(&self) -> &'static str {
        match self {
            Chained::Write { .. } => "WRITE",
            Chained::Send { .. } => "SEND",
        }
    }
}

/// A reliable-connected queue pair to one peer. Cloning shares it.
#[derive(Clone)]
pub struct Connection {
    kind: ConnKind,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer_addr())
            .field("peer_node", &self.peer().node_id)
            .finish()
    }
}

macro_rules! dispatch {
    ($self:expr, $c:ident => $body:expr) => {
        match &$self.kind {
            ConnKind::Soft($c) => $body,
            #[cfg(feature = "rdma")]
            ConnKind::Rdma($c) => $body,
        }
    };
}

impl Connection {
    /// What the peer revealed in the handshake.
    pub fn peer(&self) -> &PeerInfo {
        dispatch!(self, c => c.peer_info())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> &str {
        dispatch!(self, c => c.peer_addr())
    }

    /// The largest WRITE or SEND posted inline (copied into the work
    /// queue at the post, without staging): the queue pair's on `rdma`, 0
    /// on the software RNIC, which has no such path.
    pub fn max_inline_bytes(&self) -> u32 {
        match &self.kind {
            ConnKind::Soft(_) => 0,
            #[cfg(feature = "rdma")]
            ConnKind::Rdma(c) => c.max_inline_bytes(),
        }
    }

    fn post(&self, request: Request) -> Result<oneshot::Receiver<Result<Done, WcError>>> {
        self.check(&request)?;
        dispatch!(self, c => c.post(request))
    }

    fn check(&self, request: &Request) -> Result<()> {
        let config = dispatch!(self, c => c.config());
        crate::limits::check_request(request, config.max_transfer_bytes, config.max_message_bytes)
    }

    /// Posts `chain` in order as one batch: all of it or, on an error, none
    /// (a request over a limit, or too many outstanding), with one
    /// completion per request, in order. On `rdma` it is one chained
    /// `ibv_post_send`; every request but the last is unsignaled (the
    /// device reports it only if it fails, and the last one's completion
    /// completes it), and small ones go inline. On the software RNIC the
    /// frames leave together. Each completion means what it means for a
    /// single post: a WRITE refused by the peer still completes with its
    /// own remote access error, and the requests after it are flushed.
    pub fn post_chain(&self, chain: &[Chained<'_>]) -> Result<Vec<Completion<()>>> {
        let requests: Vec<Request> = chain.iter().map(Chained::request).collect();
        for request in &requests {
            self.check(request)?;
        }
        let ops: Vec<&'static str> = chain.iter().map(Chained::op).collect();
        let receivers = dispatch!(self, c => c.post_chain(requests))?;
        Ok(receivers
            .into_iter()
            .zip(ops)
            .map(|(rx, op)| self.completion(op, rx, unit))
            .collect())
    }

    fn completion<T>(
        &self,
        op: &'static str,
        rx: oneshot::Receiver<Result<Done, WcError>>,
        map: fn(Done) -> Option<T>,
    ) -> Completion<T> {
        Completion {
            rx,
            op,
            peer: self.peer_addr().to_string(),
            read_len: None,
            map,
        }
    }

    /// Posts a one-sided WRITE of `data` to `remote`.
    pub fn post_write(&self, remote: RemoteAddr, data: &[u8]) -> Result<Completion<()>> {
        let rx = self.post(Request::Write {
            addr: remote.addr,
            rkey: remote.rkey,
            data: data.to_vec(),
            imm: None,
        })?;
        Ok(self.completion("WRITE", rx, unit))
    }

    /// Posts a WRITE with immediate: the data lands at `remote`, and the
    /// peer's receive queue gets `imm` (it consumes a posted receive).
    pub fn post_write_imm(
        &self,
        remote: RemoteAddr,
        data: &[u8],
        imm: u32,
    ) -> Result<Completion<()>> {
        let rx = self.post(Request::Write {
            addr: remote.addr,
            rkey: remote.rkey,
            data: data.to_vec(),
            imm: Some(imm),
        })?;
        Ok(self.completion("WRITE_WITH_IMM", rx, unit))
    }

    /// Posts a one-sided READ of `len` bytes at `remote`. Its completion
    /// holds exactly `len` bytes: a result of another length (a faulty or
    /// hostile peer NIC) completes with [`TransportError::Protocol`].
    pub fn post_read(&self, remote: RemoteAddr, len: u32) -> Result<Completion<Vec<u8>>> {
        let rx = self.post(Request::Read {
            addr: remote.addr,
            rkey: remote.rkey,
            len,
        })?;
        let mut completion = self.completion("READ", rx, |d| match d {
            Done::Data(v) => Some(v),
            _ => None,
        });
        completion.read_len = Some(len as usize);
        Ok(completion)
    }

    /// Posts a compare-and-swap of the 8-byte word at `remote`; completes
    /// with the value found (the swap happened iff it equals `expected`).
    pub fn post_compare_swap(
        &self,
        remote: RemoteAddr,
        expected: u64,
        new: u64,
    ) -> Result<Completion<u64>> {
        let rx = self.post(Request::CompareSwap {
            addr: remote.addr,
            rkey: remote.rkey,
            expected,
            new,
        })?;
        Ok(self.completion("CMP_AND_SWP", rx, word))
    }

    /// Posts a fetch-and-add on the 8-byte word at `remote`; completes with
    /// the value before the add.
    pub fn post_fetch_add(&self, remote: RemoteAddr, add: u64) -> Result<Completion<u64>> {
        let rx = self.post(Request::FetchAdd {
            addr: remote.addr,
            rkey: remote.rkey,
            add,
        })?;
        Ok(self.completion("FETCH_AND_ADD", rx, word))
    }

    /// Posts a two-sided SEND; the peer must have a receive posted.
    pub fn post_send(&self, data: &[u8]) -> Result<Completion<()>> {
        let rx = self.post(Request::Send {
            data: data.to_vec(),
        })?;
        Ok(self.completion("SEND", rx, unit))
    }

    /// WRITE and wait for its completion.
    pub async fn write(&self, remote: RemoteAddr, data: &[u8]) -> Result<()> {
        self.post_write(remote, data)?.await
    }

    /// READ and wait.
    pub async fn read(&self, remote: RemoteAddr, len: u32) -> Result<Vec<u8>> {
        self.post_read(remote, len)?.await
    }

    /// Compare-and-swap and wait; returns the value found.
    pub async fn compare_swap(&self, remote: RemoteAddr, expected: u64, new: u64) -> Result<u64> {
        self.post_compare_swap(remote, expected, new)?.await
    }

    /// Fetch-and-add and wait; returns the value before.
    pub async fn fetch_add(&self, remote: RemoteAddr, add: u64) -> Result<u64> {
        self.post_fetch_add(remote, add)?.await
    }

    /// SEND and wait.
    pub async fn send(&self, data: &[u8]) -> Result<()> {
        self.post_send(data)?.await
    }

    /// Posts `count` more receive buffers.
    pub fn post_recv(&self, count: u32) -> Result<()> {
        dispatch!(self, c => c.post_recv(count))
    }

    /// The next message from the receive queue.
    pub async fn recv(&self) -> Result<Received> {
        dispatch!(self, c => c.recv().await)
    }

    /// Changes what the peer may do to this node's memory through this
    /// connection (`ibv_modify_qp` of the access flags): dropping
    /// `REMOTE_WRITE` makes the peer's WRITEs fail, whatever rkey it holds.
    pub fn set_remote_access(&self, access: Access) -> Result<()> {
        dispatch!(self, c => c.set_remote_access(access))
    }

    /// The cause, once the connection is in the error state.
    pub fn error(&self) -> Option<String> {
        dispatch!(self, c => c.error())
    }

    /// Moves the connection to the error state (flushing posted requests)
    /// and tells the peer.
    pub fn close(&self) {
        dispatch!(self, c => c.close("closed locally"))
    }
}

fn unit(d: Done) -> Option<()> {
    matches!(d, Done::Ok).then_some(())
}

fn word(d: Done) -> Option<u64> {
    match d {
        Done::Word(w) => Some(w),
        _ => None,
    }
}

/// A posted work request; resolves when it completes.
pub struct Completion<T> {
    rx: oneshot::Receiver<Result<Done, WcError>>,
    op: &'static str,
    peer: String,
    /// For a READ, the bytes it asked for: its result must hold exactly as
    /// many (the bytes come from the peer's NIC, which is not trusted).
    read_len: Option<usize>,
    map: fn(Done) -> Option<T>,
}

impl<T> Future for Completion<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        let error = |error| TransportError::Completion {
            op: self.op,
            peer: self.peer.clone(),
            error,
        };
        Poll::Ready(match result {
            Ok(Ok(Done::Data(data))) if self.read_len.is_some_and(|len| data.len() != len) => {
                Err(TransportError::Protocol {
                    peer: self.peer.clone(),
                    reason: format!(
                        "{} of {} bytes completed with {} bytes",
                        self.op,
                        self.read_len.unwrap_or_default(),
                        data.len()
                    ),
                })
            }
            Ok(Ok(done)) => (self.map)(done).ok_or_else(|| TransportError::Protocol {
                peer: self.peer.clone(),
                reason: format!("{} completed with the wrong kind of result", self.op),
            }),
            Ok(Err(e)) => Err(error(e)),
            Err(_) => Err(error(WcError::Flushed)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::Fabric;

    fn device(fabric: &Fabric, node: &str, id: u64) -> Device {
        fabric.device(
            node,
            DeviceConfig {
                node_id: id,
                secret: crate::conformance::suite_secret(),
                limits: Default::default(),
            },
        )
    }

    /// Issue 10, item 5 ("Input from the peer's NIC is trusted"): a READ
    /// whose answer holds fewer bytes than asked (a faulty or hostile peer
    /// NIC) completes with an error, never with the short data that callers
    /// then `expect` to be a word.
    #[tokio::test(start_paused = true)]
    async fn a_read_answered_with_the_wrong_length_is_an_error() {
        let fabric = Fabric::new(1);
        let (a, b) = (device(&fabric, "a", 1), device(&fabric, "b", 2));
        let mut listener = b
            .listen("b:0", ConnConfig::default(), reveal_to_all(vec![]))
            .await
            .unwrap();
        let ab = a
            .connect("b:0", ConnConfig::default(), vec![])
            .await
            .unwrap();
        let _ba = listener.accept().await.unwrap();
        let word = b.register_buffer(8, Access::REMOTE_READ).unwrap();
        word.write(0, &7u64.to_le_bytes()).unwrap();
        let at = word.remote().start();
        assert_eq!(ab.read(at, 8).await.unwrap(), 7u64.to_le_bytes());

        fabric.shorten_reads("b", 4);
        match ab.read(at, 8).await {
            Err(TransportError::Protocol { reason, .. }) => {
                assert!(reason.contains("8 bytes completed with 4"), "{reason}")
            }
            other => panic!("a short READ answer was taken: {other:?}"),
        }
    }
}
