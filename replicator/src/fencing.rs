//! Fencing: who may write into this node's ring, and this node's own fence.
//!
//! DESIGN.md's argument, as this module carries it out:
//! - the ring's three parts are registered separately (least privilege):
//!   the data area for remote WRITE only, the fence word for remote READ
//!   and ATOMIC, the head word for remote READ;
//! - whenever this node's term advances ([`RingGuard::revoke`], called by
//!   the log store before it saves the vote) the data area's rkey is rotated:
//!   every remote writer loses access until a leader of the new term fences
//!   in;
//! - a leader CASes a follower's fence to its epoch, then asks for a grant;
//!   the follower checks that its fence holds that leader's epoch, rotates
//!   the rkey again (revoking everybody else) and sends the new one to that
//!   leader only ([`FencedRing::grant`]);
//! - a node raises its own fence through a loopback connection (a CAS by the
//!   device, atomic against the device's other atomics), unless the device
//!   reports global atomics, where a CPU CAS is equivalent.

use std::io;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use ringraft_transport::{
    Access, AtomicCapability, ConnConfig, Connection, Device, MemoryRegion, RemoteRegion,
};
use ringraft_wal::{Epoch, FenceWord, RingRegions};

use crate::log_store::{LogStore, RingGuard};
use crate::protocol::{Hello, decode};

/// The ring's registrations with the fabric.
pub struct FencedRing {
    data: Mutex<Option<MemoryRegion>>,
    fence: Mutex<Option<MemoryRegion>>,
    head: Mutex<Option<MemoryRegion>>,
    fence_remote: RemoteRegion,
    head_remote: RemoteRegion,
    /// Keeps the ring's mapping alive as long as it is registered.
    store: Mutex<Option<LogStore>>,
    rotations: std::sync::atomic::AtomicU64,
}

impl FencedRing {
    /// Registers the ring's parts with `device`.
    ///
    /// # Safety
    /// `regions` must stay valid (the ring open) until [`FencedRing::release`]
    /// or the drop of the returned value: hand the store that owns the ring
    /// to [`FencedRing::keep_alive`]. The ring code never holds references
    /// across remote writes (see `ringraft_wal::ring`).
    pub unsafe fn register(
        device: &Device,
        regions: RingRegions,
    ) -> ringraft_transport::Result<FencedRing> {
        // SAFETY: forwarded contract; each region lies inside the ring's
        // mapping.
        let (data, fence, head) = unsafe {
            (
                device.register(
                    regions.data.addr,
                    regions.data.len,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )?,
                device.register(
                    regions.fence.addr,
                    regions.fence.len,
                    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
                )?,
                device.register(regions.head.addr, regions.head.len, Access::REMOTE_READ)?,
            )
        };
        Ok(FencedRing {
            fence_remote: fence.remote(),
            head_remote: head.remote(),
            data: Mutex::new(Some(data)),
            fence: Mutex::new(Some(fence)),
            head: Mutex::new(Some(head)),
            store: Mutex::new(None),
            rotations: Default::default(),
        })
    }

    /// Keeps `store` (and so the ring's mapping) alive while registered.
    pub fn keep_alive(&self, store: LogStore) {
        *self.store.lock().expect("store lock") = Some(store);
    }

    /// Deregisters everything (every rkey stops working), then lets the
    /// store go.
    pub fn release(&self) {
        self.data.lock().expect("lock").take();
        self.fence.lock().expect("lock").take();
        self.head.lock().expect("lock").take();
        self.store.lock().expect("lock").take();
    }

    /// The fence word's descriptor.
    pub fn fence(&self) -> RemoteRegion {
        self.fence_remote
    }

    /// The head word's descriptor.
    pub fn head(&self) -> RemoteRegion {
        self.head_remote
    }

    /// Revokes every remote write access to the data area.
    pub fn revoke(&self) -> ringraft_transport::Result<RemoteRegion> {
        let mut data = self.data.lock().expect("data region lock");
        let region = data
            .as_mut()
            .ok_or_else(|| {
                ringraft_transport::TransportError::Invalid("the ring is released".into())
            })?
            .rotate()?;
        self.rotations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(region)
    }

    /// Grants write access to the holder of `epoch`, which must be the
    /// ring's fence: rotates the rkey (nobody else keeps access) and returns
    /// the new descriptor. Refused, with the fence found (or the epoch of
    /// this node's vote where that is higher), when `epoch` is not the
    /// fence, or when it cannot be the epoch of a current leader:
    /// - its term is below this node's vote term. The fence may still hold
    ///   a deposed leader's epoch after the term advanced (the rkey was
    ///   rotated then, and no leader of the new term has fenced in yet);
    ///   that leader must not get write access back (DESIGN.md, fencing);
    /// - this node's vote is committed (it knows the leader of that term)
    ///   for another leader of the same term.
    ///
    /// Call it through [`LogStore::exclusively`], so that the tail the
    /// grantee learns stays exact.
    pub fn grant(&self, store: &LogStore, epoch: Epoch) -> Result<RemoteRegion, Epoch> {
        refuse_grant(store, epoch)?;
        let region = match self.revoke() {
            Ok(region) => region,
            Err(error) => {
                tracing::error!(%error, "rkey rotation failed; refusing the grant");
                return Err(store.fence());
            }
        };
        // The fence (a remote CAS, this node's own) or the vote may have
        // moved between the check and the rotation: checked again, so that
        // either the change's own rotation comes after this one, or the
        // grant is refused (and the new rkey revoked).
        if let Err(found) = refuse_grant(store, epoch) {
            if let Err(error) = self.revoke() {
                tracing::error!(%error, "rkey rotation failed after a refused grant");
            }
            return Err(found);
        }
        Ok(region)
    }

    /// How many times the data area's rkey was rotated.
    pub fn rotations(&self) -> u64 {
        self.rotations.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for FencedRing {
    fn drop(&mut self) {
        self.release();
    }
}

/// Why `epoch` may not be granted write access now (see
/// [`crate::replication::acceptor::refuse_grant`]), logged.
fn refuse_grant(store: &LogStore, epoch: Epoch) -> Result<(), Epoch> {
    let fence = store.fence();
    let vote = store.vote();
    let refused = crate::replication::acceptor::refuse_grant(fence, vote, epoch);
    if let (Err(_), Some(vote)) = (refused, vote)
        && fence == epoch
    {
        tracing::info!(
            %epoch,
            vote_term = vote.term,
            voted_for = ?vote.voted_for,
            "grant refused: the epoch is of a superseded leader"
        );
    }
    refused
}

/// The [`RingGuard`] of a node on a fabric. Clones share it.
#[derive(Clone)]
pub struct NodeGuard {
    inner: Arc<GuardInner>,
}

struct GuardInner {
    /// Weak: the ring keeps the store alive, the store keeps this guard.
    ring: std::sync::Weak<FencedRing>,
    device: Device,
    node_id: u64,
    cluster_id: u64,
    /// Where this node's own listener is, for the loopback connection.
    self_addr: String,
    /// Weak: the store keeps this guard.
    store: Mutex<crate::log_store::WeakLogStore>,
    loopback: tokio::sync::Mutex<Option<(Connection, Hello)>>,
    cpu_fences: std::sync::atomic::AtomicU64,
    loopback_fences: std::sync::atomic::AtomicU64,
    hooks: Option<crate::hooks::Hooks>,
}

impl NodeGuard {
    /// A guard over `ring`.
    pub fn new(
        ring: Arc<FencedRing>,
        device: Device,
        node_id: u64,
        cluster_id: u64,
        self_addr: String,
        hooks: Option<crate::hooks::Hooks>,
    ) -> NodeGuard {
        NodeGuard {
            inner: Arc::new(GuardInner {
                ring: Arc::downgrade(&ring),
                device,
                node_id,
                cluster_id,
                self_addr,
                store: Mutex::default(),
                loopback: tokio::sync::Mutex::new(None),
                cpu_fences: Default::default(),
                loopback_fences: Default::default(),
                hooks,
            }),
        }
    }

    /// Binds the guard to its store (for CPU CAS on devices with global
    /// atomics), weakly: the store holds the guard.
    pub fn bind(&self, store: &LogStore) {
        *self.inner.store.lock().expect("store lock") = store.downgrade();
    }

    /// Self-fences done so far: (with a CPU CAS, through the loopback).
    pub fn self_fences(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.inner.cpu_fences.load(Relaxed),
            self.inner.loopback_fences.load(Relaxed),
        )
    }
}

impl GuardInner {
    /// Raises the fence to `epoch` through the loopback connection; true if
    /// this call changed it.
    async fn cas_through_loopback(&self, epoch: Epoch) -> io::Result<bool> {
        let mut guard = self.loopback.lock().await;
        for _attempt in 0..3 {
            if guard.as_ref().is_none_or(|(c, _)| c.error().is_some()) {
                let conn = self
                    .device
                    .connect(
                        &self.self_addr,
                        ConnConfig::default(),
                        crate::protocol::Join::bytes(self.cluster_id),
                    )
                    .await
                    .map_err(io::Error::other)?;
                let hello: Hello =
                    decode(&conn.peer().reveal.app_data).map_err(io::Error::other)?;
                if hello.node_id != self.node_id || hello.cluster_id != self.cluster_id {
                    return Err(io::Error::other(format!(
                        "loopback to {} reached node {} of cluster {:#x}",
                        self.self_addr, hello.node_id, hello.cluster_id
                    )));
                }
                *guard = Some((conn, hello));
            }
            let (conn, hello) = guard.as_ref().expect("just connected");
            let result: ringraft_transport::Result<bool> = async {
                loop {
                    let bytes = conn.read(hello.fence.start(), 8).await?;
                    // The transport checks READ lengths; still no panic here.
                    let current = FenceWord::from_bytes(&bytes).map_err(|e| {
                        ringraft_transport::TransportError::Invalid(format!(
                            "a READ of this node's fence word returned {} bytes, not 8",
                            e.found
                        ))
                    })?;
                    if current.epoch() >= epoch {
                        return Ok(false);
                    }
                    let new = FenceWord::new(epoch).to_word();
                    if conn
                        .compare_swap(hello.fence.start(), current.to_word(), new)
                        .await?
                        == current.to_word()
                    {
                        return Ok(true);
                    }
                }
            }
            .await;
            match result {
                Ok(changed) => return Ok(changed),
                Err(e) => {
                    tracing::warn!(error = %e, "self-fence through loopback failed; reconnecting");
                    *guard = None;
                }
            }
        }
        Err(io::Error::other("could not raise this node's own fence"))
    }
}

impl RingGuard for NodeGuard {
    fn revoke(&self) -> io::Result<()> {
        // Keeping a writer's access across a term change would break
        // fencing: a failure here fails the vote, and openraft stops.
        let Some(ring) = self.inner.ring.upgrade() else {
            // Released: nothing is registered, nothing to revoke.
            return Ok(());
        };
        ring.revoke().map(|_| ()).map_err(|e| {
            io::Error::other(format!(
                "cannot revoke remote write access to the ring: {e}"
            ))
        })
    }

    fn fence_self(&self, epoch: Epoch) -> BoxFuture<'static, io::Result<()>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            use std::sync::atomic::Ordering::Relaxed;
            crate::hooks::pass(inner.hooks.as_ref(), crate::hooks::HookPoint::SelfFence).await;
            let changed = if inner.device.atomic_capability() == AtomicCapability::Global {
                let store = inner.store.lock().expect("store lock").upgrade();
                let changed = store
                    .ok_or_else(|| io::Error::other("guard not bound to a live store"))?
                    .cas_fence_locally(epoch)?;
                inner.cpu_fences.fetch_add(1, Relaxed);
                changed
            } else {
                let changed = inner.cas_through_loopback(epoch).await?;
                inner.loopback_fences.fetch_add(1, Relaxed);
                changed
            };
            // Like every fence change: whoever was granted write access
            // under the old fence loses it (DESIGN.md, fencing). After the
            // CAS, so that no grant to the old epoch can follow (a grant
            // checks the fence again after its own rotation); a WRITE of
            // the old holder that landed before this rotation lies beyond
            // the tail, where this node's own append overwrites it.
            if changed && let Some(ring) = inner.ring.upgrade() {
                ring.revoke().map_err(|e| {
                    io::Error::other(format!(
                        "cannot revoke remote write access to the ring: {e}"
                    ))
                })?;
            }
            Ok(())
        })
    }
}
