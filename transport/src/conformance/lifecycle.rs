//! Checks of a connection's life: a local close flushes posted requests, a
//! peer's close breaks the connection, an unauthenticated peer gets
//! nothing, and a new connection works after an error.
//!
//! Owns these checks' bodies only. Never: keep state between checks or
//! depend on the order they run in (each connects afresh).

use super::*;

pub(super) async fn local_close<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn peer_close<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn unauthenticated<P: Peer>(c: &mut Ctx<'_, P>, outsider: &Device) -> CheckResult {
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

pub(super) async fn reconnect<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 4096, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    let bad = crate::types::RemoteAddr {
        rkey: r.rkey ^ 1,
        ..r.start()
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
