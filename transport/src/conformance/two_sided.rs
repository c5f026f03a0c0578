//! Checks of the two-sided operations and RC ordering: SEND/RECV in order,
//! a WRITE landing before the SEND posted after it, WRITE with immediate,
//! and receiver-not-ready when no receive is posted.
//!
//! Owns these checks' bodies only. Never: keep state between checks or
//! depend on the order they run in (each connects afresh).

use super::*;

pub(super) async fn send_recv_in_order<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn write_before_send<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn write_with_immediate<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn rnr<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn chain_lands_before_its_send<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
    let r = c.peer.setup(&[spec("mem", 64 << 10, RW)]).await?[0];
    let conn = c.connect(suite_config()).await?;
    for round in 0..8u8 {
        // Small WRITEs (inline where the backend has it) around a large
        // one, then the SEND; the bytes change every round.
        let pieces = [
            (0u64, pattern(48, round)),
            (4096, pattern(40 << 10, round ^ 0x55)),
            (60 << 10, pattern(200, round ^ 0xAA)),
        ];
        let mut chain = Vec::new();
        for (offset, data) in &pieces {
            chain.push(crate::api::Chained::Write {
                remote: r.at(*offset, data.len() as u64).ok_or("address")?,
                data,
            });
        }
        let message = [round];
        chain.push(crate::api::Chained::Send { data: &message });
        let posted = conn.post_chain(&chain).map_err(|e| e.to_string())?;
        ensure(posted.len() == chain.len(), "one completion per request")?;
        match c.peer.recv().await? {
            Received::Message(m) if m == message => {}
            other => return Err(format!("round {round}: got {other:?}")),
        }
        for (offset, data) in &pieces {
            let local = c
                .peer
                .read_local("mem", *offset as u32, data.len() as u32)
                .await?;
            ensure(
                local == *data,
                format!("round {round}: the SEND arrived before the WRITE at {offset}"),
            )?;
        }
        for (k, p) in posted.into_iter().enumerate() {
            p.await
                .map_err(|e| format!("round {round}, request {k}: {e}"))?;
        }
    }
    Ok(())
}
