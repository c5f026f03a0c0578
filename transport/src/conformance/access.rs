//! Checks of access and fencing: out-of-bounds and wrong-rkey requests fail
//! and change nothing, missing permissions fail, a rotated rkey revokes the
//! old one, and dropping REMOTE_WRITE from a queue pair refuses WRITEs.
//!
//! Owns these checks' bodies only. Never: keep state between checks or
//! depend on the order they run in (each connects afresh).

use super::*;

pub(super) async fn out_of_bounds<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let beyond = crate::types::RemoteAddr {
        addr: r.addr + 4096 - 4,
        ..r.start()
    };
    let result = conn.write(beyond, &[0xEE; 8]).await;
    expect_remote_access("WRITE across the end", result)?;
    c.still_zero("mem", 0, 4096, "a refused WRITE changed memory")
        .await?;
    let conn = c.connect(suite_config()).await?;
    let before = crate::types::RemoteAddr {
        addr: r.addr - 8,
        ..r.start()
    };
    expect_remote_access("READ before the start", conn.read(before, 16).await)?;
    let conn = c.connect(suite_config()).await?;
    let cas = crate::types::RemoteAddr {
        addr: r.addr + 4096,
        ..r.start()
    };
    expect_remote_access("CAS past the end", conn.compare_swap(cas, 0, 1).await)
}

pub(super) async fn wrong_rkey<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let bad = crate::types::RemoteAddr {
        rkey: r.rkey ^ 0x5a5a_0000,
        ..r.start()
    };
    expect_remote_access(
        "WRITE with a wrong rkey",
        conn.write(bad, &[0xEE; 64]).await,
    )?;
    c.still_zero("mem", 0, 64, "a refused WRITE changed memory")
        .await?;
    ensure(
        conn.error().is_some() || conn.post_send(b"x").is_err(),
        "connection not in error after a remote access error",
    )
}

pub(super) async fn missing_permission<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let rs = c
        .peer
        .setup(&[
            spec("ro", 64, Access::LOCAL_WRITE | Access::REMOTE_READ),
            spec("wo", 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        ])
        .await?;
    let (ro, wo) = (rs[0], rs[1]);
    let conn = c.connect(suite_config()).await?;
    expect_remote_access(
        "WRITE to a read-only region",
        conn.write(ro.start(), &[1; 8]).await,
    )?;
    let conn = c.connect(suite_config()).await?;
    expect_remote_access(
        "READ of a write-only region",
        conn.read(wo.start(), 8).await,
    )?;
    let conn = c.connect(suite_config()).await?;
    expect_remote_access(
        "CAS on a region without REMOTE_ATOMIC",
        conn.compare_swap(wo.start(), 0, 1).await,
    )?;
    c.still_zero("ro", 0, 64, "refused access changed memory")
        .await
}

pub(super) async fn rotation<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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
    expect_remote_access(
        "WRITE with the revoked rkey",
        conn.write(old.at(64, 5).ok_or("address")?, b"stale").await,
    )?;
    c.still_zero("mem", 64, 5, "a revoked rkey wrote").await?;
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

pub(super) async fn dropped_write<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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
    c.still_zero("mem", 100, 6, "a refused WRITE landed").await
}

pub(super) async fn refused_write_in_a_chain<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let bad = crate::types::RemoteAddr {
        rkey: r.rkey ^ 0x5a5a_0000,
        ..r.at(512, 8).ok_or("address")?
    };
    let posted = conn
        .post_chain(&[
            crate::api::Chained::Write {
                remote: r.at(0, 6).ok_or("address")?,
                data: b"landed",
            },
            crate::api::Chained::Write {
                remote: bad,
                data: &[0xEE; 8],
            },
            crate::api::Chained::Send { data: b"never" },
        ])
        .map_err(|e| e.to_string())?;
    let [first, refused, send] = <[_; 3]>::try_from(posted).map_err(|_| "three completions")?;
    first
        .await
        .map_err(|e| format!("the WRITE before the refused one: {e}"))?;
    // The refused WRITE reports its own error, though its chain's last
    // request is the one that asks for a completion.
    expect_remote_access("the refused WRITE of a chain", refused.await)?;
    ensure(
        send.await.is_err(),
        "the SEND after a refused WRITE completed",
    )?;
    ensure(
        c.peer.read_local("mem", 0, 6).await? == *b"landed",
        "the WRITE before the refused one did not land",
    )?;
    c.still_zero("mem", 512, 8, "a refused WRITE changed memory")
        .await
}

pub(super) async fn chain_over_the_limit<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let config = ConnConfig {
        max_outstanding: 4,
        ..suite_config()
    };
    let conn = c.connect(config).await?;
    let data = [0xAB; 8];
    let writes = (0..5u64)
        .map(|k| {
            Ok(crate::api::Chained::Write {
                remote: r.at(k * 8, 8).ok_or("address")?,
                data: &data,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    match conn.post_chain(&writes) {
        Err(TransportError::Limit { .. }) => {}
        Err(other) => return Err(format!("a chain of 5 with 4 allowed: {other}")),
        Ok(_) => return Err("a chain of 5 with 4 allowed was posted".into()),
    }
    // The connection still works, and a WRITE after the refused chain
    // completes only after anything posted before it landed.
    for p in conn
        .post_chain(&writes[..4])
        .map_err(|e| format!("a chain of 4: {e}"))?
    {
        p.await.map_err(|e| e.to_string())?;
    }
    ensure(
        c.peer.read_local("mem", 0, 32).await? == [0xAB; 32],
        "the chain of 4 did not land",
    )?;
    c.still_zero("mem", 32, 8, "a request of the refused chain landed")
        .await
}
