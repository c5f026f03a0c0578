//! Test hooks: named points in a node's own code where a test can hold the
//! node's application while its NIC side (the fabric's one-sided
//! operations) keeps serving, then release it.
//!
//! Tests use them to make an interleaving happen on purpose instead of
//! hoping a sleep produces it: arm a point, drive the node until the point
//! is reached (`Gate::reached`), do what must happen in that window (another
//! connection's request, a fence CAS by a peer), then `Gate::release`.
//!
//! A point is armed once: the first pass through it after [`Hooks::arm`]
//! waits, later passes do not. Unarmed points cost one uncontended lock.
//! Nodes built without hooks skip them entirely.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

/// A place in the node's code where a test can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// The acceptor checked records a leader wrote into this ring (the
    /// adoption is prepared) and is about to hand them to openraft.
    AdoptionPrepared,
    /// The node is about to raise its own fence (it leads a new term).
    SelfFence,
}

/// One armed point: the node signals when it gets there and waits for the
/// test's release.
#[derive(Debug)]
pub struct Gate {
    reached: Semaphore,
    release: Semaphore,
}

impl Gate {
    /// Waits until the node has reached the point (and is held there).
    pub async fn reached(&self) {
        self.reached
            .acquire()
            .await
            .expect("the gate's semaphore is never closed")
            .forget();
    }

    /// Lets the held node go on.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

/// The hooks of one node. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    armed: Arc<Mutex<HashMap<HookPoint, Arc<Gate>>>>,
}

impl Hooks {
    /// New hooks, nothing armed.
    pub fn new() -> Hooks {
        Hooks::default()
    }

    /// Arms `point`: the next pass through it waits for the returned
    /// gate's release.
    pub fn arm(&self, point: HookPoint) -> Arc<Gate> {
        let gate = Arc::new(Gate {
            reached: Semaphore::new(0),
            release: Semaphore::new(0),
        });
        self.armed
            .lock()
            .expect("hooks lock")
            .insert(point, gate.clone());
        gate
    }

    /// Passes `point`: holds there if a test armed it.
    pub async fn pass(&self, point: HookPoint) {
        let gate = self.armed.lock().expect("hooks lock").remove(&point);
        if let Some(gate) = gate {
            tracing::debug!(?point, "held at a test hook");
            gate.reached.add_permits(1);
            gate.release
                .acquire()
                .await
                .expect("the gate's semaphore is never closed")
                .forget();
        }
    }
}

/// Passes `point` of optional hooks.
pub(crate) async fn pass(hooks: Option<&Hooks>, point: HookPoint) {
    if let Some(hooks) = hooks {
        hooks.pass(point).await;
    }
}
