//! The `inproc` backend: an in-process fabric of named nodes with seeded
//! fault injection.
//!
//! Every node gets a [`Device`] whose queue pairs are the software RNIC's,
//! linked by in-process channels instead of sockets. The fabric can delay
//! frames (a seeded random delay per frame, order kept), partition sets of
//! nodes (both ways or one way: frames are held, as a real network holds
//! retransmissions, so a short cut heals and a long one surfaces as
//! `RetryExceeded`), pause a node (nothing leaves or reaches it: its posted
//! WRITEs stay in flight until it resumes), freeze a node (its application
//! stops while its NIC goes on serving one-sided requests: `freeze.rs`),
//! drop connections (both sides go
//! to the error state at once, like a reset) and fail one side's queue pair
//! (the peer only learns by timing out).
//!
//! With a current-thread tokio runtime (and paused time in tests) a run is
//! a deterministic function of the seed. Everything random on this fabric
//! follows it: the frames' delays, and each device's rkeys and handshake
//! nonces (every device gets a seed of its own from the fabric's, in the
//! order the devices are made; see `crate::entropy`). That makes them
//! predictable: this fabric is for tests and simulations, never for
//! anything a secret guards. Waiting for a path to open wakes the waiters
//! in the order they began to wait ([`tokio::sync::Notify`]); a
//! `tokio::sync::watch` would wake them in an order drawn from the
//! runtime's unseeded random generator.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::api::{AcceptPolicy, Device, DeviceConfig, DeviceKind, Probe};
use crate::entropy::Entropy;
use crate::error::{Result, TransportError};
use crate::handshake::PeerInfo;
use crate::limits::ConnSlot;
use crate::soft::conn::SoftEndpoint;
use crate::soft::conn::{Frame, Wire, WireOut, WriteGate, wire};
use crate::soft::{Flavor, SoftConnection, SoftDevice, SoftListener};
use crate::types::{AtomicCapability, ConnConfig};
use crate::work::Done;

mod freeze;
/// A remote WRITE as it landed in a node's registered memory: what an
/// observer installed with [`Fabric::observe_landings`] is shown.
#[derive(Clone, Copy, Debug)]
pub struct Landing<'a> {
    /// The node whose memory was written (its fabric name).
    pub node: &'a str,
    /// Where the bytes land (an address inside one of its registrations).
    pub addr: u64,
    /// The bytes written.
    pub bytes: &'a [u8],
    /// Which moment of the WRITE this is.
    pub moment: Moment,
}

/// The moments of a WRITE an observer is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// Admitted (queue pair flags, rkey, bounds, access) and copied at
    /// once: the bytes are in memory.
    Landed,
    /// Admitted, its copy held back ([`Fabric::park_writes`]): the bytes
    /// are not in memory yet.
    Admitted,
    /// The copy of a WRITE admitted earlier: the bytes are in memory now,
    /// whatever happened to its rkey in between.
    LandedLate,
}

/// What [`Fabric::observe_landings`] installs.
type LandingObserver = Box<dyn Fn(&Landing<'_>) + Send + Sync>;

/// The fabric's landing observer as one device's NIC sees it: its node's
/// name and the fabric-wide slot (installed once, possibly after the
/// device was made).
pub(crate) struct LandingSink {
    node: String,
    observer: Arc<OnceLock<LandingObserver>>,
}

impl LandingSink {
    /// A WRITE of `bytes` landed at `addr`. The NIC calls it after the
    /// copy, outside its registration table's lock: an observer may read
    /// the node's state, but runs inside the NIC's execution, so it must
    /// not wait for the fabric.
    pub(crate) fn landed(&self, addr: u64, bytes: &[u8], moment: Moment) {
        if let Some(observer) = self.observer.get() {
            observer(&Landing {
                node: &self.node,
                addr,
                bytes,
                moment,
            });
        }
    }
}

#[derive(Clone)]
struct ListenerEntry {
    device: Weak<SoftDevice>,
    node: String,
    config: ConnConfig,
    policy: AcceptPolicy,
    tx: mpsc::Sender<SoftConnection>,
}

#[derive(Default)]
struct NetState {
    paused: HashSet<String>,
    /// Frozen nodes: their NIC serves, their application does not run.
    frozen: HashSet<String>,
    /// Directions whose SENDs are held (and every request behind them).
    held_sends: HashSet<(String, String)>,
    /// Directed cuts: frames from .0 to .1 are held.
    cuts: HashSet<(String, String)>,
    /// Directions whose WRITEs are admitted at arrival and copied later.
    parked_writes: HashSet<(String, String)>,
    /// WRITEs admitted and waiting for their copy, by direction.
    parked: HashMap<(String, String), usize>,
    /// Directions whose parked WRITEs were dropped, not copied.
    discarding: HashSet<(String, String)>,
    delay: (Duration, Duration),
    /// Nodes whose NIC answers READs with at most this many bytes.
    short_reads: HashMap<String, usize>,
}

impl NetState {
    /// What holds frames from `from` to `to`.
    fn ends(&self, from: &str, to: &str) -> freeze::Ends {
        freeze::Ends {
            from_frozen: self.frozen.contains(from),
            to_frozen: self.frozen.contains(to),
            sends_held: self
                .held_sends
                .contains(&(from.to_string(), to.to_string())),
        }
    }

    fn passes(&self, from: &str, to: &str) -> bool {
        !self.paused.contains(from)
            && !self.paused.contains(to)
            && !self.cuts.contains(&(from.to_string(), to.to_string()))
    }
}

/// One direction of a live link, for fault injection.
struct Direction {
    from: String,
    to: String,
    /// Frames are dropped from now on (a failed queue pair on `from`).
    dead: Arc<AtomicBool>,
    /// The receiving side's queue pair input, to break it.
    incoming: mpsc::UnboundedSender<Frame>,
}

struct Inner {
    /// The frames' delays.
    rng: Mutex<StdRng>,
    /// The seeds of the devices' own sources (rkeys, nonces): a stream of
    /// its own, so that how many delays were drawn does not change them.
    device_seeds: Mutex<StdRng>,
    listeners: Mutex<HashMap<String, ListenerEntry>>,
    state: Mutex<NetState>,
    /// Notified at every change of `state`.
    changed: Notify,
    links: Mutex<Vec<(Direction, Direction)>>,
    /// Shown every remote WRITE that lands (none until installed).
    landings: Arc<OnceLock<LandingObserver>>,
}

/// Mixes the fabric's seed into the seed of its device seeds (SplitMix64's
/// finalizer), so that the two streams differ.
fn device_seed_stream(seed: u64) -> u64 {
    let z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An in-process fabric. Cloning shares it.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric").finish_non_exhaustive()
    }
}

impl Fabric {
    /// A fabric whose random choices follow `seed`: the frames' delays and
    /// its devices' rkeys and handshake nonces (predictable from `seed`:
    /// see the module docs).
    pub fn new(seed: u64) -> Fabric {
        Fabric {
            inner: Arc::new(Inner {
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                device_seeds: Mutex::new(StdRng::seed_from_u64(device_seed_stream(seed))),
                listeners: Mutex::new(HashMap::new()),
                state: Mutex::new(NetState::default()),
                changed: Notify::new(),
                links: Mutex::new(Vec::new()),
                landings: Arc::new(OnceLock::new()),
            }),
        }
    }

    /// The device of node `node` (its atomics are CPU atomics: global).
    /// Its rkeys and handshake nonces follow a seed drawn from the
    /// fabric's: the same devices made in the same order get the same.
    pub fn device(&self, node: &str, config: DeviceConfig) -> Device {
        self.device_with_atomics(node, config, AtomicCapability::Global)
    }

    /// The device of `node`, reporting `atomic` as its atomic capability
    /// (tests use [`AtomicCapability::Hca`] to exercise the loopback path).
    pub fn device_with_atomics(
        &self,
        node: &str,
        config: DeviceConfig,
        atomic: AtomicCapability,
    ) -> Device {
        let flavor = Flavor::Inproc {
            fabric: self.clone(),
            node: node.to_string(),
        };
        let seed = self
            .inner
            .device_seeds
            .lock()
            .expect("fabric device seeds")
            .random();
        let entropy = Entropy::seeded(seed);
        let landings = LandingSink {
            node: node.to_string(),
            observer: self.inner.landings.clone(),
        };
        let device = SoftDevice::new(config, flavor, atomic, entropy, Some(landings));
        Device {
            kind: DeviceKind::Soft(Arc::new(device)),
        }
    }

    /// Installs `observer`, shown every remote WRITE that lands in the
    /// registered memory of any of this fabric's devices (made before or
    /// after), right after the bytes were copied: a simulator's check of
    /// what reaches a node's ring. It runs inside the executing NIC (on
    /// the responder's task, outside the NIC's locks): it must be quick
    /// and must not wait for the fabric. Without one a WRITE costs one
    /// atomic load more.
    ///
    /// # Errors
    /// An observer is installed already (one per fabric).
    pub fn observe_landings(
        &self,
        observer: impl Fn(&Landing<'_>) + Send + Sync + 'static,
    ) -> Result<()> {
        self.inner
            .landings
            .set(Box::new(observer))
            .map_err(|_| TransportError::Invalid("the fabric has a landing observer".into()))
    }

    fn update(&self, f: impl FnOnce(&mut NetState)) {
        f(&mut self.inner.state.lock().expect("fabric state"));
        self.inner.changed.notify_waiters();
    }

    /// Cuts every link between a node of `a` and a node of `b`, both ways.
    pub fn partition(&self, a: &[&str], b: &[&str]) {
        self.update(|s| {
            for x in a {
                for y in b {
                    s.cuts.insert((x.to_string(), y.to_string()));
                    s.cuts.insert((y.to_string(), x.to_string()));
                }
            }
        });
    }

    /// Cuts frames from `from` to `to` only.
    pub fn cut_one_way(&self, from: &str, to: &str) {
        self.update(|s| {
            s.cuts.insert((from.to_string(), to.to_string()));
        });
    }

    /// Removes every cut, releases every held SEND and drops the WRITEs
    /// still parked ([`Fabric::discard_parked`]).
    pub fn heal(&self) {
        self.update(|s| {
            s.cuts.clear();
            s.held_sends.clear();
            let parked = std::mem::take(&mut s.parked_writes);
            s.discarding.extend(parked);
        });
    }

    /// Freezes `node`'s traffic: nothing it sends leaves, nothing reaches it.
    pub fn pause(&self, node: &str) {
        self.update(|s| {
            s.paused.insert(node.to_string());
        });
    }

    /// Lets `node`'s held traffic go.
    pub fn resume(&self, node: &str) {
        self.update(|s| {
            s.paused.remove(node);
        });
    }

    /// Freezes `node`'s application while its NIC goes on serving: the
    /// one-sided requests of its peers execute against its memory, its
    /// NIC's answers leave; what it posts and the SENDs to it wait for
    /// [`Fabric::thaw`] (see `freeze.rs`). A SIGSTOPped process on an RDMA
    /// NIC.
    pub fn freeze(&self, node: &str) {
        self.update(|s| {
            s.frozen.insert(node.to_string());
        });
    }

    /// Lets `node`'s application run again: what was held goes on.
    pub fn thaw(&self, node: &str) {
        self.update(|s| {
            s.frozen.remove(node);
        });
    }

    /// From the first SEND from `from` to `to` that follows a WRITE on,
    /// holds that direction's requests (in order) until
    /// [`Fabric::release_sends`]: the WRITEs posted before the SEND land,
    /// the message naming them waits (a slow path after the WRITEs).
    /// Answers go on.
    pub fn hold_sends(&self, from: &str, to: &str) {
        self.update(|s| {
            s.held_sends.insert((from.to_string(), to.to_string()));
        });
    }

    /// Lets the SENDs held from `from` to `to` go on.
    pub fn release_sends(&self, from: &str, to: &str) {
        self.update(|s| {
            s.held_sends.remove(&(from.to_string(), to.to_string()));
        });
    }

    /// From now on, a WRITE from `from` arriving at `to` is admitted (its
    /// rkey checked) when it arrives, and copied into `to`'s memory only at
    /// [`Fabric::land_parked`]; the queue pair's later requests wait
    /// behind it (RC order), other queue pairs go on. A NIC whose DMA of an
    /// accepted WRITE is still under way when the rkey is rotated: DESIGN.md's
    /// "old in-flight WRITEs ... land as records the follower rejects".
    pub fn park_writes(&self, from: &str, to: &str) {
        let key = (from.to_string(), to.to_string());
        self.update(|s| {
            s.discarding.remove(&key);
            s.parked_writes.insert(key);
        });
    }

    /// Copies the WRITEs parked from `from` to `to` (each in the step that
    /// releases it) and parks no more.
    pub fn land_parked(&self, from: &str, to: &str) {
        self.update(|s| {
            s.parked_writes.remove(&(from.to_string(), to.to_string()));
        });
    }

    /// Fails the WRITEs parked from `from` to `to` at the NIC (remote
    /// access error), copying nothing, and parks no more: a DMA that never
    /// completed.
    pub fn discard_parked(&self, from: &str, to: &str) {
        let key = (from.to_string(), to.to_string());
        self.update(|s| {
            s.parked_writes.remove(&key);
            s.discarding.insert(key);
        });
    }

    /// How many WRITEs from `from` to `to` are admitted and not copied.
    pub fn parked(&self, from: &str, to: &str) -> usize {
        let key = (from.to_string(), to.to_string());
        let state = self.inner.state.lock().expect("fabric state");
        state.parked.get(&key).copied().unwrap_or(0)
    }

    /// The gate of the queue pair on `to` that receives from `from`.
    fn write_gate(&self, from: &str, to: &str) -> WriteGate {
        // Weak: the fabric holds the links, whose channels keep the queue
        // pairs' tasks (and so their gates) alive.
        let inner = Arc::downgrade(&self.inner);
        let key = (from.to_string(), to.to_string());
        Arc::new(move || {
            let fabric = Fabric {
                inner: inner.upgrade()?,
            };
            let mut state = fabric.inner.state.lock().expect("fabric state");
            if !state.parked_writes.contains(&key) {
                return None;
            }
            *state.parked.entry(key.clone()).or_default() += 1;
            drop(state);
            let key = key.clone();
            Some(Box::pin(async move {
                fabric.wait_until(|s| !s.parked_writes.contains(&key)).await;
                // The copy follows in the same poll of the responder: no
                // one sees the count drop before the bytes are there.
                let mut state = fabric.inner.state.lock().expect("fabric state");
                if let Some(n) = state.parked.get_mut(&key) {
                    *n -= 1;
                }
                !state.discarding.contains(&key)
            }))
        })
    }

    /// Delays every frame by a seeded random duration in `min..=max`.
    pub fn set_delay(&self, min: Duration, max: Duration) {
        assert!(min <= max, "delay range {min:?}..={max:?}");
        self.update(|s| s.delay = (min, max));
    }

    /// Breaks every live connection between `a` and `b`: both sides go to
    /// the error state now. Returns how many.
    pub fn drop_connections(&self, a: &str, b: &str) -> usize {
        let mut links = self.inner.links.lock().expect("fabric links");
        links.retain(|(x, _)| !x.incoming.is_closed());
        let mut n = 0;
        for (x, y) in links.iter() {
            if (x.from == a && x.to == b) || (x.from == b && x.to == a) {
                for d in [x, y] {
                    d.dead.store(true, Ordering::Release);
                    let _ = d.incoming.send(Frame::Close {
                        reason: "connection dropped by the fabric".into(),
                    });
                }
                n += 1;
            }
        }
        n
    }

    /// Fails `node`'s queue pairs towards `peer`: `node`'s side goes to the
    /// error state, and nothing more reaches `peer`, which learns by timing
    /// out. Returns how many.
    pub fn fail_qp(&self, node: &str, peer: &str) -> usize {
        let mut links = self.inner.links.lock().expect("fabric links");
        links.retain(|(x, _)| !x.incoming.is_closed());
        let mut n = 0;
        for (x, y) in links.iter() {
            for (out, back) in [(x, y), (y, x)] {
                if out.from == node && out.to == peer {
                    out.dead.store(true, Ordering::Release);
                    let _ = back.incoming.send(Frame::Close {
                        reason: "queue pair failed (injected)".into(),
                    });
                    n += 1;
                }
            }
        }
        n
    }

    fn delay(&self) -> Duration {
        let (min, max) = self.inner.state.lock().expect("fabric state").delay;
        if min == max {
            return min;
        }
        let nanos = self
            .inner
            .rng
            .lock()
            .expect("fabric rng")
            .random_range(min.as_nanos() as u64..=max.as_nanos() as u64);
        Duration::from_nanos(nanos)
    }

    async fn wait_passes(&self, from: &str, to: &str) {
        self.wait_until(|s| s.passes(from, to)).await;
    }

    /// Waits until `ready` holds of the fabric's state.
    async fn wait_until(&self, ready: impl Fn(&NetState) -> bool) {
        loop {
            // Registered before the check: a change between the check and
            // the wait is not missed.
            let changed = self.inner.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if ready(&self.inner.state.lock().expect("fabric state")) {
                return;
            }
            changed.await;
        }
    }

    pub(crate) fn listen(
        &self,
        device: Arc<SoftDevice>,
        addr: &str,
        config: ConnConfig,
        policy: AcceptPolicy,
    ) -> Result<SoftListener> {
        let Flavor::Inproc { node, .. } = &device.flavor else {
            unreachable!("inproc listen on another flavor");
        };
        let mut listeners = self.inner.listeners.lock().expect("fabric listeners");
        if listeners.get(addr).is_some_and(|l| !l.tx.is_closed()) {
            return Err(TransportError::Io {
                op: format!("listen on {addr}"),
                source: std::io::ErrorKind::AddrInUse.into(),
            });
        }
        let (tx, incoming) = mpsc::channel(64);
        listeners.insert(
            addr.to_string(),
            ListenerEntry {
                device: Arc::downgrade(&device),
                node: node.clone(),
                config,
                policy,
                tx,
            },
        );
        Ok(SoftListener::new(
            incoming,
            addr.to_string(),
            device.rejected.clone(),
            tokio::spawn(async {}),
        ))
    }

    pub(crate) async fn connect(
        &self,
        device: Arc<SoftDevice>,
        addr: &str,
        config: ConnConfig,
        app_data: Vec<u8>,
    ) -> Result<SoftConnection> {
        let Flavor::Inproc {
            node: client_node, ..
        } = &device.flavor
        else {
            unreachable!("inproc connect on another flavor");
        };
        let refused = || TransportError::Io {
            op: format!("connect to {addr}"),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        let (
            server,
            ListenerEntry {
                node: server_node,
                config: server_config,
                policy,
                tx: accept_tx,
                ..
            },
        ) = self.listener_at(addr).ok_or_else(refused)?;
        if accept_tx.is_closed() {
            return Err(refused());
        }
        let slot = device.reserve_connection()?;
        self.wait_reachable(client_node, &server_node, addr, &config)
            .await?;
        let (server_side, client_side) = handshake_pair(
            &device,
            &server,
            client_node,
            addr,
            (&config, &server_config),
            policy,
            app_data,
        )
        .await?;
        let (server_info, client_endpoint, server_slot) = server_side;
        let (client_info, server_endpoint) = client_side;

        let (client_wire, server_wire) = self.link(client_node, &server_node);
        let server_conn = server.start(
            format!("{client_node} (inproc)"),
            server_config,
            server_info,
            client_endpoint,
            server_wire,
            server_slot,
        );
        if accept_tx.send(server_conn).await.is_err() {
            return Err(refused());
        }
        Ok(device.start(
            addr.to_string(),
            config,
            client_info,
            server_endpoint,
            client_wire,
            slot,
        ))
    }

    /// The device listening at `addr` and its listener, if it still lives.
    /// [`crate::Device::probe`] from `client_node`: refused when no
    /// listener is open at `addr`, like a host's kernel answering; unknown
    /// when the fabric does not pass frames both ways to its node (a real
    /// network would not answer).
    pub(crate) async fn probe(&self, client_node: &str, addr: &str, _timeout: Duration) -> Probe {
        let Some((_, entry)) = self.listener_at(addr) else {
            return Probe::Refused;
        };
        let state = self.inner.state.lock().expect("fabric state");
        if !(state.passes(client_node, &entry.node) && state.passes(&entry.node, client_node)) {
            return Probe::Unknown(format!("{addr} is unreachable from {client_node}"));
        }
        if entry.tx.is_closed() {
            Probe::Refused
        } else {
            Probe::Listening
        }
    }

    fn listener_at(&self, addr: &str) -> Option<(Arc<SoftDevice>, ListenerEntry)> {
        let listeners = self.inner.listeners.lock().expect("fabric listeners");
        let entry = listeners.get(addr)?;
        let server = entry.device.upgrade()?;
        Some((server, entry.clone()))
    }

    /// Waits until the fabric passes frames both ways between
    /// `client_node` and `server_node` (the handshake crosses the fabric
    /// too), within the handshake timeout of `config`.
    async fn wait_reachable(
        &self,
        client_node: &str,
        server_node: &str,
        addr: &str,
        config: &ConnConfig,
    ) -> Result<()> {
        // The handshake crosses the fabric too: it waits for the path.
        let reachable = async {
            self.wait_passes(client_node, server_node).await;
            self.wait_passes(server_node, client_node).await;
        };
        tokio::time::timeout(config.handshake_timeout, reachable)
            .await
            .map_err(|_| TransportError::Timeout {
                what: format!("connect to {addr} (unreachable)"),
                after_ms: config.handshake_timeout.as_millis() as u64,
            })?;
        Ok(())
    }

    /// The wires of a new connection between `client_node` and
    /// `server_node` (client's, server's), with the fabric's pumps between
    /// them.
    fn link(&self, client_node: &str, server_node: &str) -> (Wire, Wire) {
        let (mut client_wire, client_out, client_in) = wire();
        let (mut server_wire, server_out, server_in) = wire();
        client_wire.gate = Some(self.write_gate(server_node, client_node));
        server_wire.gate = Some(self.write_gate(client_node, server_node));
        let c2s = self.pump(client_node, server_node, client_out, server_in.clone());
        let s2c = self.pump(server_node, client_node, server_out, client_in.clone());
        self.inner
            .links
            .lock()
            .expect("fabric links")
            .push((c2s, s2c));
        (client_wire, server_wire)
    }

    /// Starts moving frames from `from`'s queue pair to `to`'s, with the
    /// fabric's faults.
    fn pump(
        &self,
        from: &str,
        to: &str,
        out: WireOut,
        incoming: mpsc::UnboundedSender<Frame>,
    ) -> Direction {
        let dead = Arc::new(AtomicBool::new(false));
        let (stamped_tx, stamped_rx) = mpsc::unbounded_channel();
        tokio::spawn(stamp(self.clone(), out, stamped_tx, dead.clone()));
        tokio::spawn(deliver(
            self.clone(),
            from.to_string(),
            to.to_string(),
            stamped_rx,
            incoming.clone(),
            dead.clone(),
        ));
        Direction {
            from: from.to_string(),
            to: to.to_string(),
            dead,
            incoming,
        }
    }

    /// Makes `node`'s NIC answer every READ with at most `max_bytes` bytes:
    /// what a faulty NIC, or a peer running a tampered software RNIC, can
    /// send. For tests of what requesters do with such answers.
    pub fn shorten_reads(&self, node: &str, max_bytes: usize) {
        self.update(|s| {
            s.short_reads.insert(node.to_string(), max_bytes);
        });
    }

    /// `frame` as it leaves `from`'s NIC, with the injected answer faults.
    fn tamper(&self, from: &str, mut frame: Frame) -> Frame {
        if let Frame::Resp {
            result: Ok(Done::Data(data)),
            ..
        } = &mut frame
            && let Some(max) = self
                .inner
                .state
                .lock()
                .expect("fabric state")
                .short_reads
                .get(from)
        {
            data.truncate(*max);
        }
        frame
    }
}

/// The client's side of an inproc connection to `addr` and the server's,
/// handshaken over an in-memory duplex stream: the server's (its peer info,
/// endpoint and connection slot) and the client's (its peer info and
/// endpoint). A refused handshake counts as rejected by the server and
/// returns the client's error where it has one.
async fn handshake_pair(
    device: &Arc<SoftDevice>,
    server: &Arc<SoftDevice>,
    client_node: &str,
    addr: &str,
    (config, server_config): (&ConnConfig, &ConnConfig),
    policy: AcceptPolicy,
    app_data: Vec<u8>,
) -> Result<((PeerInfo, SoftEndpoint, ConnSlot), (PeerInfo, SoftEndpoint))> {
    let (mut client_end, mut server_end) = tokio::io::duplex(64 << 10);
    let client_name = format!("{client_node} (inproc)");
    let server_task = {
        let server = server.clone();
        let server_config = server_config.clone();
        tokio::spawn(async move {
            server
                .server_handshake(&mut server_end, &client_name, &server_config, &policy)
                .await
        })
    };
    let client_result = device
        .client_handshake(&mut client_end, addr, config, app_data)
        .await;
    // A client that gave up closes its end, so that the server stops
    // waiting for it.
    drop(client_end);
    let server_result = server_task
        .await
        .map_err(|e| TransportError::Device(e.to_string()))?;
    let server_side = match server_result {
        Ok(x) => x,
        Err(e) => {
            server.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(client_result.err().unwrap_or(e));
        }
    };
    Ok((server_side, client_result?))
}

/// Takes frames off a queue pair's outgoing channels and stamps each with
/// its delivery time (now + a seeded delay).
async fn stamp(
    fabric: Fabric,
    mut out: WireOut,
    stamped: mpsc::UnboundedSender<(Instant, Frame)>,
    dead: Arc<AtomicBool>,
) {
    loop {
        // Answers first: a Close queued after an answer must not overtake it.
        let frame = tokio::select! {
            biased;
            f = out.responses.recv() => f,
            f = out.requests.recv() => f,
        };
        let Some(frame) = frame else { return };
        if dead.load(Ordering::Acquire) {
            continue;
        }
        let at = Instant::now() + fabric.delay();
        let closing = matches!(frame, Frame::Close { .. });
        if stamped.send((at, frame)).is_err() || closing {
            return;
        }
    }
}

/// Delivers stamped frames in order, once their time has come and while
/// the path is open; while an end is frozen, holds what `freeze.rs` says
/// until the thaw.
async fn deliver(
    fabric: Fabric,
    from: String,
    to: String,
    mut stamped: mpsc::UnboundedReceiver<(Instant, Frame)>,
    incoming: mpsc::UnboundedSender<Frame>,
    dead: Arc<AtomicBool>,
) {
    let mut held = freeze::Held::default();
    loop {
        let next = if held.is_empty() {
            stamped.recv().await
        } else {
            // Registered before the check: a thaw between the check and
            // the wait is not missed.
            let changed = fabric.inner.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if fabric.ends(&from, &to).open() {
                for frame in held.drain() {
                    if !fabric.pass(&from, &to, frame, &incoming, &dead).await {
                        return;
                    }
                }
                continue;
            }
            tokio::select! {
                biased;
                _ = changed => continue,
                next = stamped.recv() => next,
            }
        };
        let Some((at, frame)) = next else {
            if held.is_empty() {
                return;
            }
            // Nothing more comes: what is held goes at the thaw.
            fabric.wait_thawed(&from, &to).await;
            for frame in held.drain() {
                if !fabric.pass(&from, &to, frame, &incoming, &dead).await {
                    return;
                }
            }
            return;
        };
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        let ends = fabric.ends(&from, &to);
        match held.rule(ends, &frame) {
            freeze::Rule::Pass => {
                held.passed(ends, &frame);
                if !fabric.pass(&from, &to, frame, &incoming, &dead).await {
                    return;
                }
            }
            rule => held.hold(rule, frame),
        }
    }
}

impl Fabric {
    /// What holds frames from `from` to `to`.
    fn ends(&self, from: &str, to: &str) -> freeze::Ends {
        self.inner
            .state
            .lock()
            .expect("fabric state")
            .ends(from, to)
    }

    /// Waits until nothing holds frames from `from` to `to`.
    async fn wait_thawed(&self, from: &str, to: &str) {
        self.wait_until(|s| s.ends(from, to).open()).await;
    }

    /// Delivers `frame` once the path is open; `false` when the direction
    /// ends (closed, or the receiver is gone).
    async fn pass(
        &self,
        from: &str,
        to: &str,
        frame: Frame,
        incoming: &mpsc::UnboundedSender<Frame>,
        dead: &AtomicBool,
    ) -> bool {
        self.wait_passes(from, to).await;
        if dead.load(Ordering::Acquire) {
            return true;
        }
        let frame = self.tamper(from, frame);
        let closing = matches!(frame, Frame::Close { .. });
        incoming.send(frame).is_ok() && !closing
    }
}
