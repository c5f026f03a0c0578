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

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::{Buffer, Connection, Device, Listener, reveal_to_all};
use crate::error::{TransportError, WcError};
use crate::handshake::Secret;
use crate::types::{Access, ConnConfig, Received, RemoteRegion};

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
    "rnr_without_posted_receive",
    "out_of_bounds_fails_and_changes_nothing",
    "wrong_rkey_fails_and_changes_nothing",
    "missing_permission_fails",
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
        "rnr_without_posted_receive" => rnr(c).await,
        "out_of_bounds_fails_and_changes_nothing" => out_of_bounds(c).await,
        "wrong_rkey_fails_and_changes_nothing" => wrong_rkey(c).await,
        "missing_permission_fails" => missing_permission(c).await,
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

async fn write_then_read_back<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 64 << 10, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    for (offset, len, seed) in [
        (0u64, 8usize, 1u8),
        (100, 64, 2),
        (4096, 4096, 3),
        (0, 65536, 4),
    ] {
        let data = pattern(len, seed);
        let at = r.at(offset, len as u64).ok_or("address")?;
        conn.write(at, &data).await.map_err(|e| e.to_string())?;
        let back = conn.read(at, len as u32).await.map_err(|e| e.to_string())?;
        ensure(
            back == data,
            format!("READ of {len} B at {offset} differs from the WRITE"),
        )?;
        let local = c.peer.read_local("mem", offset as u32, len as u32).await?;
        ensure(
            local == data,
            format!("B's memory at {offset} differs from the WRITE"),
        )?;
    }
    // Pipelined: many WRITEs posted before any completes, then one READ.
    let mut posted = Vec::new();
    for k in 0..64u64 {
        posted.push(
            conn.post_write(r.at(k * 8, 8).ok_or("address")?, &k.to_le_bytes())
                .map_err(|e| e.to_string())?,
        );
    }
    for p in posted {
        p.await.map_err(|e| e.to_string())?;
    }
    let back = conn.read(r.start(), 512).await.map_err(|e| e.to_string())?;
    for k in 0..64usize {
        ensure(
            back[k * 8..k * 8 + 8] == (k as u64).to_le_bytes(),
            format!("pipelined WRITE {k} lost"),
        )?;
    }
    Ok(())
}

async fn compare_swap<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("word", 64, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let w = r.at(8, 8).ok_or("address")?;
    let found = conn
        .compare_swap(w, 0, 42)
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        found == 0,
        format!("successful CAS returned {found}, expected the old value 0"),
    )?;
    let found = conn
        .compare_swap(w, 7, 99)
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        found == 42,
        format!("failed CAS returned {found}, expected the current value 42"),
    )?;
    let local = c.peer.read_local("word", 8, 8).await?;
    ensure(
        local == 42u64.to_le_bytes(),
        "a failed CAS changed the word",
    )?;
    let found = conn
        .compare_swap(w, 42, u64::MAX)
        .await
        .map_err(|e| e.to_string())?;
    ensure(found == 42, "second CAS")?;
    let local = c.peer.read_local("word", 8, 8).await?;
    ensure(
        local == u64::MAX.to_le_bytes(),
        "successful CAS did not store the new value",
    )
}

async fn fetch_and_add<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("counter", 64, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let w = r.at(16, 8).ok_or("address")?;
    let mut expected = 0u64;
    let mut posted = Vec::new();
    for k in 1..=20u64 {
        posted.push((
            expected,
            conn.post_fetch_add(w, k).map_err(|e| e.to_string())?,
        ));
        expected += k;
    }
    for (before, p) in posted {
        let got = p.await.map_err(|e| e.to_string())?;
        ensure(
            got == before,
            format!("fetch-and-add returned {got}, expected {before}"),
        )?;
    }
    let local = c.peer.read_local("counter", 16, 8).await?;
    ensure(local == expected.to_le_bytes(), "final counter value")
}

async fn send_recv_in_order<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    c.peer.setup(&[]).await?;
    let conn = c.connect(suite_config()).await?;
    let messages: Vec<Vec<u8>> = (0..12u8).map(|k| pattern(1 + k as usize * 97, k)).collect();
    let mut posted = Vec::new();
    for m in &messages {
        posted.push(conn.post_send(m).map_err(|e| e.to_string())?);
    }
    for p in posted {
        p.await.map_err(|e| e.to_string())?;
    }
    for (k, m) in messages.iter().enumerate() {
        match c.peer.recv().await? {
            Received::Message(got) => {
                ensure(&got == m, format!("message {k} out of order or changed"))?
            }
            other => return Err(format!("expected message {k}, got {other:?}")),
        }
    }
    Ok(())
}

async fn write_before_send<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 64 << 10, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    for round in 0..8u8 {
        let data = pattern(60 << 10, round);
        // Post both without waiting: RC order alone must make the data
        // visible by the time the message is received.
        let w = conn
            .post_write(r.start(), &data)
            .map_err(|e| e.to_string())?;
        let s = conn.post_send(&[round]).map_err(|e| e.to_string())?;
        match c.peer.recv().await? {
            Received::Message(m) if m == [round] => {}
            other => return Err(format!("round {round}: got {other:?}")),
        }
        let local = c.peer.read_local("mem", 0, data.len() as u32).await?;
        ensure(
            local == data,
            format!("round {round}: the SEND arrived before the WRITE's data"),
        )?;
        w.await.map_err(|e| e.to_string())?;
        s.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn write_with_immediate<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let data = pattern(256, 9);
    conn.post_write_imm(r.at(64, 256).ok_or("address")?, &data, 0xABCD_0123)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    match c.peer.recv().await? {
        Received::WriteImmediate(0xABCD_0123) => {}
        other => return Err(format!("expected the immediate, got {other:?}")),
    }
    ensure(
        c.peer.read_local("mem", 64, 256).await? == data,
        "WRITE_WITH_IMM data",
    )
}

async fn rnr<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    c.peer.setup(&[]).await?;
    let config = ConnConfig {
        recv_depth: 0,
        auto_repost: false,
        ..suite_config()
    };
    let conn = c.connect(config).await?;
    let started = std::time::Instant::now();
    let result = conn.send(b"nobody listens").await;
    expect_wc("SEND with no receive posted", result, |e| {
        e == WcError::RnrRetryExceeded
    })?;
    ensure(
        started.elapsed() < suite_config().op_deadline() + Duration::from_secs(5),
        format!("RNR took {:?}", started.elapsed()),
    )?;
    // A connection in error flushes: the next post fails.
    let next = conn.post_send(b"again").map(|_| ());
    ensure(
        next.is_err() || conn.error().is_some(),
        "connection still usable after an RNR error",
    )
}

async fn out_of_bounds<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let beyond = crate::types::RemoteAddr {
        addr: r.addr + 4096 - 4,
        rkey: r.rkey,
    };
    let result = conn.write(beyond, &[0xEE; 8]).await;
    expect_wc("WRITE across the end", result, |e| {
        e == WcError::RemoteAccess
    })?;
    ensure(
        c.peer
            .read_local("mem", 0, 4096)
            .await?
            .iter()
            .all(|b| *b == 0),
        "a refused WRITE changed memory",
    )?;
    let conn = c.connect(suite_config()).await?;
    let before = crate::types::RemoteAddr {
        addr: r.addr - 8,
        rkey: r.rkey,
    };
    expect_wc("READ before the start", conn.read(before, 16).await, |e| {
        e == WcError::RemoteAccess
    })?;
    let conn = c.connect(suite_config()).await?;
    let cas = crate::types::RemoteAddr {
        addr: r.addr + 4096,
        rkey: r.rkey,
    };
    expect_wc(
        "CAS past the end",
        conn.compare_swap(cas, 0, 1).await,
        |e| e == WcError::RemoteAccess,
    )
}

async fn wrong_rkey<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let bad = crate::types::RemoteAddr {
        addr: r.addr,
        rkey: r.rkey ^ 0x5a5a_0000,
    };
    expect_wc(
        "WRITE with a wrong rkey",
        conn.write(bad, &[0xEE; 64]).await,
        |e| e == WcError::RemoteAccess,
    )?;
    ensure(
        c.peer
            .read_local("mem", 0, 64)
            .await?
            .iter()
            .all(|b| *b == 0),
        "a refused WRITE changed memory",
    )?;
    ensure(
        conn.error().is_some() || conn.post_send(b"x").is_err(),
        "connection not in error after a remote access error",
    )
}

async fn missing_permission<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let rs = c
        .peer
        .setup(&[
            spec("ro", 64, Access::LOCAL_WRITE | Access::REMOTE_READ),
            spec("wo", 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        ])
        .await?;
    let (ro, wo) = (rs[0], rs[1]);
    let conn = c.connect(suite_config()).await?;
    expect_wc(
        "WRITE to a read-only region",
        conn.write(ro.start(), &[1; 8]).await,
        |e| e == WcError::RemoteAccess,
    )?;
    let conn = c.connect(suite_config()).await?;
    expect_wc(
        "READ of a write-only region",
        conn.read(wo.start(), 8).await,
        |e| e == WcError::RemoteAccess,
    )?;
    let conn = c.connect(suite_config()).await?;
    expect_wc(
        "CAS on a region without REMOTE_ATOMIC",
        conn.compare_swap(wo.start(), 0, 1).await,
        |e| e == WcError::RemoteAccess,
    )?;
    ensure(
        c.peer
            .read_local("ro", 0, 64)
            .await?
            .iter()
            .all(|b| *b == 0),
        "refused access changed memory",
    )
}

async fn rotation<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let old = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    conn.write(old.start(), b"before")
        .await
        .map_err(|e| e.to_string())?;
    let new = c.peer.rotate("mem").await?;
    ensure(new.rkey != old.rkey, "rotation kept the rkey")?;
    ensure(
        new.addr == old.addr && new.len == old.len,
        "rotation moved the region",
    )?;
    expect_wc(
        "WRITE with the revoked rkey",
        conn.write(old.at(64, 5).ok_or("address")?, b"stale").await,
        |e| e == WcError::RemoteAccess,
    )?;
    ensure(
        c.peer.read_local("mem", 64, 5).await? == [0; 5],
        "a revoked rkey wrote",
    )?;
    let conn = c.connect(suite_config()).await?;
    conn.write(new.at(64, 5).ok_or("address")?, b"fresh")
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        c.peer.read_local("mem", 0, 69).await?[..6] == *b"before",
        "rotation lost the data",
    )?;
    ensure(
        c.peer.read_local("mem", 64, 5).await? == *b"fresh",
        "the new rkey did not write",
    )
}

async fn dropped_write<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    conn.write(r.start(), b"allowed")
        .await
        .map_err(|e| e.to_string())?;
    c.peer
        .set_remote_access(Access::REMOTE_READ | Access::REMOTE_ATOMIC)
        .await?;
    // READ still allowed on the same queue pair.
    let back = conn.read(r.start(), 7).await.map_err(|e| e.to_string())?;
    ensure(back == b"allowed", "READ after dropping REMOTE_WRITE")?;
    let result = conn.write(r.at(100, 6).ok_or("address")?, b"denied").await;
    expect_wc("WRITE after REMOTE_WRITE was dropped", result, |e| {
        e.is_access_denied()
    })?;
    ensure(
        c.peer.read_local("mem", 100, 6).await? == [0; 6],
        "a refused WRITE landed",
    )
}

async fn local_close<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 1 << 20, RW)]).await?[0];
    // B posts no receive and asks for long receiver-not-ready waits: a SEND
    // stays outstanding, and RC order keeps every WRITE posted after it
    // outstanding too, on every backend.
    let config = ConnConfig {
        recv_depth: 0,
        auto_repost: false,
        rnr_delay: Duration::from_millis(160),
        ..suite_config()
    };
    let conn = c.connect(config).await?;
    let mut posted = vec![conn.post_send(b"held").map_err(|e| e.to_string())?];
    let data = vec![7u8; 16 << 10];
    for k in 0..16u64 {
        posted.push(
            conn.post_write(r.at(k * (16 << 10), 16 << 10).ok_or("address")?, &data)
                .map_err(|e| e.to_string())?,
        );
    }
    conn.close();
    for (k, p) in posted.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(5), p).await {
            Err(_) => return Err(format!("posted request {k} never completed after close")),
            Ok(Err(e)) if e.wc() == Some(WcError::Flushed) => {}
            Ok(other) => {
                return Err(format!(
                    "posted request {k}: expected Flushed, got {other:?}"
                ));
            }
        }
    }
    match conn.post_write(r.start(), b"x") {
        Err(TransportError::Broken { .. }) => Ok(()),
        other => Err(format!("post after close: {:?}", other.map(|_| ()))),
    }
}

async fn peer_close<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    conn.write(r.start(), b"ok")
        .await
        .map_err(|e| e.to_string())?;
    c.peer.close().await?;
    let deadline =
        std::time::Instant::now() + suite_config().op_deadline() + Duration::from_secs(5);
    loop {
        match conn.post_write(r.start(), b"after") {
            Err(TransportError::Broken { .. }) => return Ok(()),
            Err(e) => return Err(format!("post: {e}")),
            Ok(p) => match p.await {
                Err(e) if e.wc().is_some() => return Ok(()),
                Err(e) => return Err(format!("unexpected error {e}")),
                Ok(()) if std::time::Instant::now() > deadline => {
                    return Err("WRITEs still succeed long after the peer closed".into());
                }
                Ok(()) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
}

async fn unauthenticated<P: Peer>(c: &mut Ctx<'_, P>, outsider: &Device) -> CheckResult {
    c.peer.setup(&[spec("mem", 64, RW)]).await?;
    let before = c.peer.rejected().await?;
    let addr = c.peer.listen(suite_config()).await?;
    let result = outsider
        .connect(&addr, suite_config(), b"let me in".to_vec())
        .await;
    match result {
        Err(TransportError::Auth { .. }) => {}
        Err(e) => return Err(format!("expected an authentication error, got {e}")),
        Ok(conn) => {
            return Err(format!(
                "an outsider connected and learnt {:?}",
                conn.peer().reveal.app_data
            ));
        }
    }
    // B counts the rejection (it may count it a moment later: wait for the
    // count, with the check's own timeout as the safety net).
    loop {
        if c.peer.rejected().await? > before {
            // The listener still serves members afterwards.
            let conn = c
                .device
                .connect(&addr, suite_config(), vec![])
                .await
                .map_err(|e| e.to_string())?;
            c.peer.accepted().await?;
            ensure(
                !conn.peer().reveal.app_data.is_empty(),
                "members get the application data",
            )?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn reconnect<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let bad = crate::types::RemoteAddr {
        addr: r.addr,
        rkey: r.rkey ^ 1,
    };
    let _ = conn.write(bad, b"x").await;
    ensure(
        conn.post_write(r.start(), b"x").is_err() || conn.error().is_some(),
        "error state",
    )?;
    let conn = c.connect(suite_config()).await?;
    conn.write(r.start(), b"again")
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        c.peer.read_local("mem", 0, 5).await? == *b"again",
        "new connection works",
    )
}

/// Side B in the same process.
pub struct LocalPeer {
    device: Device,
    regions: HashMap<String, Buffer>,
    listener: Option<Listener>,
    current: Option<Connection>,
    app_data: Vec<u8>,
    listen_addr: String,
    advertised_host: Option<String>,
}

impl LocalPeer {
    /// B on `device`, listening at `listen_addr` (`127.0.0.1:0` for tcp,
    /// a name for inproc).
    pub fn new(device: Device, listen_addr: &str) -> LocalPeer {
        LocalPeer {
            device,
            regions: HashMap::new(),
            listener: None,
            current: None,
            app_data: b"side B".to_vec(),
            listen_addr: listen_addr.to_string(),
            advertised_host: None,
        }
    }

    /// Tells clients to connect to `host` (with the bound port) when the
    /// listener binds a wildcard address.
    pub fn advertise(mut self, host: &str) -> LocalPeer {
        self.advertised_host = Some(host.to_string());
        self
    }

    fn region(&self, name: &str) -> Result<&Buffer, String> {
        self.regions
            .get(name)
            .ok_or_else(|| format!("no region {name}"))
    }

    fn conn(&self) -> Result<&Connection, String> {
        self.current
            .as_ref()
            .ok_or_else(|| "no current connection".to_string())
    }
}

impl Peer for LocalPeer {
    async fn setup(&mut self, specs: &[RegionSpec]) -> Result<Vec<RemoteRegion>, String> {
        let mut out = Vec::new();
        for s in specs {
            let buffer = self
                .device
                .register_buffer(s.len as usize, s.access)
                .map_err(|e| e.to_string())?;
            out.push(buffer.remote());
            self.regions.insert(s.name.clone(), buffer);
        }
        Ok(out)
    }

    async fn listen(&mut self, config: ConnConfig) -> Result<String, String> {
        self.listener = None;
        let listener = self
            .device
            .listen(
                &self.listen_addr,
                config,
                reveal_to_all(self.app_data.clone()),
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut addr = listener.local_addr();
        if let (Some(host), Some((_, port))) = (&self.advertised_host, addr.rsplit_once(':')) {
            addr = format!("{host}:{port}");
        }
        self.listener = Some(listener);
        Ok(addr)
    }

    async fn accepted(&mut self) -> Result<(), String> {
        let listener = self.listener.as_mut().ok_or("not listening")?;
        let conn = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .map_err(|_| "accept timed out".to_string())?
            .ok_or("listener closed")?;
        self.current = Some(conn);
        Ok(())
    }

    async fn rotate(&mut self, name: &str) -> Result<RemoteRegion, String> {
        let buffer = self
            .regions
            .get_mut(name)
            .ok_or_else(|| format!("no region {name}"))?;
        buffer.region_mut().rotate().map_err(|e| e.to_string())
    }

    async fn set_remote_access(&mut self, access: Access) -> Result<(), String> {
        self.conn()?
            .set_remote_access(access)
            .map_err(|e| e.to_string())
    }

    async fn post_recv(&mut self, count: u32) -> Result<(), String> {
        self.conn()?.post_recv(count).map_err(|e| e.to_string())
    }

    async fn recv(&mut self) -> Result<Received, String> {
        let conn = self.conn()?.clone();
        tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .map_err(|_| "recv timed out".to_string())?
            .map_err(|e| e.to_string())
    }

    async fn read_local(&mut self, name: &str, offset: u32, len: u32) -> Result<Vec<u8>, String> {
        self.region(name)?
            .read(offset as usize, len as usize)
            .map_err(|e| e.to_string())
    }

    async fn close(&mut self) -> Result<(), String> {
        if let Some(conn) = self.current.take() {
            conn.close();
        }
        Ok(())
    }

    async fn rejected(&mut self) -> Result<u64, String> {
        Ok(self.listener.as_ref().map_or(0, |l| l.rejected()))
    }
}

/// A command of the control protocol between [`RemotePeer`] and [`serve`].
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Command {
    Setup(Vec<RegionSpec>),
    Listen(WireConfig),
    Accepted,
    Rotate(String),
    SetAccess(Access),
    PostRecv(u32),
    Recv,
    ReadLocal(String, u32, u32),
    Close,
    Rejected,
    Done,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Reply {
    Regions(Vec<RemoteRegion>),
    Addr(String),
    Region(RemoteRegion),
    Received(Option<Vec<u8>>, Option<u32>),
    Bytes(Vec<u8>),
    Count(u64),
    Ok,
    Err(String),
}

/// The parts of [`ConnConfig`] the control protocol carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireConfig {
    retry_count: u8,
    ack_timeout_exp: u8,
    rnr_retry: u8,
    rnr_delay_us: u64,
    recv_depth: u32,
    auto_repost: bool,
}

impl From<&ConnConfig> for WireConfig {
    fn from(c: &ConnConfig) -> Self {
        WireConfig {
            retry_count: c.retry_count,
            ack_timeout_exp: c.ack_timeout_exp,
            rnr_retry: c.rnr_retry,
            rnr_delay_us: c.rnr_delay.as_micros() as u64,
            recv_depth: c.recv_depth,
            auto_repost: c.auto_repost,
        }
    }
}

impl From<WireConfig> for ConnConfig {
    fn from(w: WireConfig) -> Self {
        ConnConfig {
            retry_count: w.retry_count,
            ack_timeout_exp: w.ack_timeout_exp,
            rnr_retry: w.rnr_retry,
            rnr_delay: Duration::from_micros(w.rnr_delay_us),
            recv_depth: w.recv_depth,
            auto_repost: w.auto_repost,
            ..suite_config()
        }
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, bincode::config::standard()).expect("control messages encode")
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(|e| format!("bad control message: {e}"))
}

/// The control connection's parameters: messages large enough for a
/// 64 KiB region read back with its framing.
fn control_config() -> ConnConfig {
    ConnConfig {
        max_message_bytes: 1 << 20,
        ..ConnConfig::default()
    }
}

/// Side B in another process, driven over a control connection.
pub struct RemotePeer {
    control: Connection,
}

impl RemotePeer {
    /// Connects to a [`serve`] at `addr` from `device`.
    pub async fn connect(device: &Device, addr: &str) -> Result<RemotePeer, String> {
        let control = device
            .connect(addr, control_config(), b"control".to_vec())
            .await
            .map_err(|e| format!("control connection to {addr}: {e}"))?;
        Ok(RemotePeer { control })
    }

    async fn call(&mut self, command: Command) -> Result<Reply, String> {
        self.control
            .send(&encode(&command))
            .await
            .map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(Duration::from_secs(30), self.control.recv())
            .await
            .map_err(|_| "control reply timed out".to_string())?
            .map_err(|e| e.to_string())?;
        match reply {
            Received::Message(bytes) => match decode::<Reply>(&bytes)? {
                Reply::Err(e) => Err(format!("peer: {e}")),
                other => Ok(other),
            },
            other => Err(format!("unexpected control message {other:?}")),
        }
    }

    /// Tells the server this run is over.
    pub async fn finish(mut self) -> Result<(), String> {
        self.call(Command::Done).await.map(|_| ())
    }
}

fn bad(reply: Reply) -> String {
    format!("unexpected reply {reply:?}")
}

impl Peer for RemotePeer {
    async fn setup(&mut self, specs: &[RegionSpec]) -> Result<Vec<RemoteRegion>, String> {
        match self.call(Command::Setup(specs.to_vec())).await? {
            Reply::Regions(r) => Ok(r),
            other => Err(bad(other)),
        }
    }
    async fn listen(&mut self, config: ConnConfig) -> Result<String, String> {
        match self.call(Command::Listen((&config).into())).await? {
            Reply::Addr(a) => Ok(a),
            other => Err(bad(other)),
        }
    }
    async fn accepted(&mut self) -> Result<(), String> {
        self.call(Command::Accepted).await.map(|_| ())
    }
    async fn rotate(&mut self, name: &str) -> Result<RemoteRegion, String> {
        match self.call(Command::Rotate(name.to_string())).await? {
            Reply::Region(r) => Ok(r),
            other => Err(bad(other)),
        }
    }
    async fn set_remote_access(&mut self, access: Access) -> Result<(), String> {
        self.call(Command::SetAccess(access)).await.map(|_| ())
    }
    async fn post_recv(&mut self, count: u32) -> Result<(), String> {
        self.call(Command::PostRecv(count)).await.map(|_| ())
    }
    async fn recv(&mut self) -> Result<Received, String> {
        match self.call(Command::Recv).await? {
            Reply::Received(Some(m), None) => Ok(Received::Message(m)),
            Reply::Received(None, Some(imm)) => Ok(Received::WriteImmediate(imm)),
            other => Err(bad(other)),
        }
    }
    async fn read_local(&mut self, name: &str, offset: u32, len: u32) -> Result<Vec<u8>, String> {
        match self
            .call(Command::ReadLocal(name.to_string(), offset, len))
            .await?
        {
            Reply::Bytes(b) => Ok(b),
            other => Err(bad(other)),
        }
    }
    async fn close(&mut self) -> Result<(), String> {
        self.call(Command::Close).await.map(|_| ())
    }
    async fn rejected(&mut self) -> Result<u64, String> {
        match self.call(Command::Rejected).await? {
            Reply::Count(n) => Ok(n),
            other => Err(bad(other)),
        }
    }
}

/// Serves side B: accepts one control connection at `control_addr` and
/// carries out its commands with a [`LocalPeer`] whose data listeners bind
/// `data_addr` (port 0 picks one) and are advertised as `advertised_host`
/// (when given). Returns when the client says it is done.
pub async fn serve(
    device: Device,
    control_addr: &str,
    data_addr: &str,
    advertised_host: Option<&str>,
) -> Result<(), String> {
    let mut control_listener = device
        .listen(
            control_addr,
            control_config(),
            reveal_to_all(b"control".to_vec()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let control = control_listener
        .accept()
        .await
        .ok_or("control listener closed")?;
    let mut local = LocalPeer::new(device, data_addr);
    if let Some(host) = advertised_host {
        local = local.advertise(host);
    }
    loop {
        let message = control
            .recv()
            .await
            .map_err(|e| format!("control recv: {e}"))?;
        let Received::Message(bytes) = message else {
            return Err("unexpected immediate on the control connection".into());
        };
        let command: Command = decode(&bytes)?;
        let done = matches!(command, Command::Done);
        let reply = match command {
            Command::Setup(specs) => local.setup(&specs).await.map(Reply::Regions),
            Command::Listen(config) => local.listen(config.into()).await.map(Reply::Addr),
            Command::Accepted => local.accepted().await.map(|_| Reply::Ok),
            Command::Rotate(name) => local.rotate(&name).await.map(Reply::Region),
            Command::SetAccess(access) => local.set_remote_access(access).await.map(|_| Reply::Ok),
            Command::PostRecv(n) => local.post_recv(n).await.map(|_| Reply::Ok),
            Command::Recv => local.recv().await.map(|r| match r {
                Received::Message(m) => Reply::Received(Some(m), None),
                Received::WriteImmediate(i) => Reply::Received(None, Some(i)),
            }),
            Command::ReadLocal(name, offset, len) => {
                local.read_local(&name, offset, len).await.map(Reply::Bytes)
            }
            Command::Close => local.close().await.map(|_| Reply::Ok),
            Command::Rejected => local.rejected().await.map(Reply::Count),
            Command::Done => Ok(Reply::Ok),
        };
        let reply = reply.unwrap_or_else(Reply::Err);
        control
            .send(&encode(&reply))
            .await
            .map_err(|e| format!("control reply to {done}: {e}"))?;
        if done {
            return Ok(());
        }
    }
}
