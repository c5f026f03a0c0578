//! The conformance suite: one set of checks that every backend must pass,
//! unchanged.
//!
//! A check runs on side A (this process) against side B, reached through a
//! [`Peer`]: B registers memory, accepts A's connections, and does what only
//! the owner of the memory can do (rotate an rkey, drop REMOTE_WRITE from
//! its queue pair, post receives, read its own memory back). [`LocalPeer`]
//! is B in the same process (the in-process fabric, TCP over loopback, or
//! one rxe device looping to itself); [`RemotePeer`] drives a B in another
//! process or guest that runs [`serve`], over a control connection of the
//! same backend.
//!
//! Layout: this module holds the [`Peer`] trait, the suite's parameters and
//! the runner; the checks live by what they test (`one_sided`, `two_sided`,
//! `access` for access and fencing, `lifecycle`); `local` and `remote` are
//! the two kinds of side B.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::{Buffer, Connection, Device, Listener, reveal_to_all};
use crate::error::{TransportError, WcError};
use crate::handshake::Secret;
use crate::types::{Access, ConnConfig, Received, RemoteRegion};

mod access;
mod lifecycle;
mod local;
mod one_sided;
mod remote;
mod two_sided;

use access::{
    chain_over_the_limit, dropped_write, missing_permission, out_of_bounds,
    refused_write_in_a_chain, rotation, wrong_rkey,
};
use lifecycle::{local_close, peer_close, reconnect, unauthenticated};
pub use local::LocalPeer;
use one_sided::{compare_swap, fetch_and_add, write_then_read_back};
pub use remote::{RemotePeer, serve};
use two_sided::{
    chain_lands_before_its_send, rnr, send_recv_in_order, write_before_send, write_with_immediate,
};

/// Outcome of one check.
pub type CheckResult = std::result::Result<(), String>;

/// A region B must register.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RegionSpec {
    /// Name the checks use.
    pub name: String,
    /// Bytes.
    pub len: u32,
    /// Access flags.
    pub access: Access,
}

/// What side A needs side B to do.
#[allow(async_fn_in_trait)]
pub trait Peer {
    /// Registers fresh zeroed regions (replacing any of the same name).
    async fn setup(&mut self, specs: &[RegionSpec]) -> Result<Vec<RemoteRegion>, String>;
    /// Makes B accept the next connection with `config` and returns where
    /// A connects.
    async fn listen(&mut self, config: ConnConfig) -> Result<String, String>;
    /// Waits until B accepted the connection A just made.
    async fn accepted(&mut self) -> Result<(), String>;
    /// Rotates a region's rkey.
    async fn rotate(&mut self, name: &str) -> Result<RemoteRegion, String>;
    /// Changes the access flags of B's side of the current connection.
    async fn set_remote_access(&mut self, access: Access) -> Result<(), String>;
    /// Posts receives on B's side of the current connection.
    async fn post_recv(&mut self, count: u32) -> Result<(), String>;
    /// Takes one message from B's receive queue (bounded wait).
    async fn recv(&mut self) -> Result<Received, String>;
    /// Reads B's memory locally.
    async fn read_local(&mut self, name: &str, offset: u32, len: u32) -> Result<Vec<u8>, String>;
    /// Closes B's side of the current connection.
    async fn close(&mut self) -> Result<(), String>;
    /// How many handshakes B's listeners rejected so far.
    async fn rejected(&mut self) -> Result<u64, String>;
}

/// The secret both sides share in the suite.
pub fn suite_secret() -> Secret {
    Secret::new(b"ringraft conformance suite secret".to_vec()).expect("long enough")
}

/// The secret of an outsider.
pub fn wrong_secret() -> Secret {
    Secret::new(b"not the cluster secret at all....".to_vec()).expect("long enough")
}

/// Connection parameters of the suite: short timeouts so that failures
/// surface fast (retry_count 3, ack timeout exponent 12 ≈ 16.8 ms per try).
pub fn suite_config() -> ConnConfig {
    ConnConfig {
        retry_count: 3,
        ack_timeout_exp: 12,
        rnr_retry: 3,
        rnr_delay: Duration::from_millis(5),
        recv_depth: 16,
        handshake_timeout: Duration::from_secs(10),
        ..ConnConfig::default()
    }
}

fn spec(name: &str, len: u32, access: Access) -> RegionSpec {
    RegionSpec {
        name: name.into(),
        len,
        access,
    }
}

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

struct Ctx<'a, P: Peer> {
    device: &'a Device,
    peer: &'a mut P,
}

impl<P: Peer> Ctx<'_, P> {
    async fn connect(&mut self, config: ConnConfig) -> Result<Connection, String> {
        let addr = self.peer.listen(config.clone()).await?;
        let conn = self
            .device
            .connect(&addr, config, b"side A".to_vec())
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        self.peer.accepted().await?;
        Ok(conn)
    }

    /// Checks that the `len` bytes at `offset` of B's region `name` are
    /// all still zero (nothing refused landed); `what` when they are not.
    async fn still_zero(&mut self, name: &str, offset: u32, len: u32, what: &str) -> CheckResult {
        let bytes = self.peer.read_local(name, offset, len).await?;
        ensure(bytes == vec![0; len as usize], what)
    }
}

fn expect_wc<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, TransportError>,
    ok: impl Fn(WcError) -> bool,
) -> CheckResult {
    match result {
        Err(e) if e.wc().is_some_and(&ok) => Ok(()),
        other => Err(format!(
            "{what}: expected a completion error, got {other:?}"
        )),
    }
}

/// [`expect_wc`] for the error of a bad rkey, bounds or permission.
fn expect_remote_access<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, TransportError>,
) -> CheckResult {
    expect_wc(what, result, |e| e == WcError::RemoteAccess)
}

fn ensure(cond: bool, what: impl Into<String>) -> CheckResult {
    if cond { Ok(()) } else { Err(what.into()) }
}

/// The checks, by name, in the order they run.
pub const CHECKS: &[&str] = &[
    "write_then_read_back",
    "compare_swap_returns_old_value",
    "fetch_and_add",
    "send_recv_in_order",
    "write_lands_before_the_send_after_it",
    "write_with_immediate",
    "chained_writes_land_before_the_send_that_ends_them",
    "rnr_without_posted_receive",
    "out_of_bounds_fails_and_changes_nothing",
    "wrong_rkey_fails_and_changes_nothing",
    "missing_permission_fails",
    "a_refused_write_in_a_chain_reports_its_own_error",
    "a_chain_over_the_outstanding_limit_posts_nothing",
    "rotated_rkey_revokes_the_old_one",
    "dropped_remote_write_refuses_writes",
    "local_close_flushes_posted_requests",
    "peer_close_breaks_the_connection",
    "unauthenticated_peer_gets_nothing",
    "reconnect_after_error",
];

/// Runs every check whose name contains `filter` (all when empty); returns
/// each check's name and outcome. `device` is side A's device.
pub async fn run<P: Peer>(
    device: &Device,
    outsider: &Device,
    peer: &mut P,
    filter: &str,
) -> Vec<(&'static str, CheckResult)> {
    let mut results = Vec::new();
    for name in CHECKS.iter().copied().filter(|n| n.contains(filter)) {
        let mut ctx = Ctx { device, peer };
        let started = std::time::Instant::now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(60), run_one(name, &mut ctx, outsider))
                .await
                .unwrap_or_else(|_| Err("timed out after 60 s".to_string()));
        // Leave no connection of this check behind on B.
        let _ = peer.close().await;
        tracing::info!(
            check = name,
            ok = outcome.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "conformance"
        );
        results.push((name, outcome));
    }
    results
}

async fn run_one<P: Peer>(name: &str, c: &mut Ctx<'_, P>, outsider: &Device) -> CheckResult {
    match name {
        "write_then_read_back" => write_then_read_back(c).await,
        "compare_swap_returns_old_value" => compare_swap(c).await,
        "fetch_and_add" => fetch_and_add(c).await,
        "send_recv_in_order" => send_recv_in_order(c).await,
        "write_lands_before_the_send_after_it" => write_before_send(c).await,
        "write_with_immediate" => write_with_immediate(c).await,
        "chained_writes_land_before_the_send_that_ends_them" => {
            chain_lands_before_its_send(c).await
        }
        "rnr_without_posted_receive" => rnr(c).await,
        "out_of_bounds_fails_and_changes_nothing" => out_of_bounds(c).await,
        "wrong_rkey_fails_and_changes_nothing" => wrong_rkey(c).await,
        "missing_permission_fails" => missing_permission(c).await,
        "a_refused_write_in_a_chain_reports_its_own_error" => refused_write_in_a_chain(c).await,
        "a_chain_over_the_outstanding_limit_posts_nothing" => chain_over_the_limit(c).await,
        "rotated_rkey_revokes_the_old_one" => rotation(c).await,
        "dropped_remote_write_refuses_writes" => dropped_write(c).await,
        "local_close_flushes_posted_requests" => local_close(c).await,
        "peer_close_breaks_the_connection" => peer_close(c).await,
        "unauthenticated_peer_gets_nothing" => unauthenticated(c, outsider).await,
        "reconnect_after_error" => reconnect(c).await,
        other => Err(format!("unknown check {other}")),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
