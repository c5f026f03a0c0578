//! Checks of the one-sided operations: WRITE then READ back, compare-and-swap
//! and fetch-and-add, which run none of side B's code.
//!
//! Owns these checks' bodies only. Never: keep state between checks or
//! depend on the order they run in (each connects afresh).

use super::*;

pub(super) async fn write_then_read_back<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn compare_swap<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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

pub(super) async fn fetch_and_add<P: Peer>(c: &mut Ctx<'_, P>) -> CheckResult {
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
