//! Fault injection of the in-process fabric: delay, partitions (both ways
//! and one way), pauses, dropped connections, failed queue pairs, and
//! determinism by seed. Time is paused: tokio advances it when every task
//! waits, so these tests take milliseconds of real time.

use std::time::Duration;

use ringraft_transport::conformance::suite_secret;
use ringraft_transport::inproc::Fabric;
use ringraft_transport::{
    Access, Buffer, ConnConfig, Connection, Device, DeviceConfig, DeviceLimits, Probe,
    TransportError, WcError, reveal_to_all,
};
use tokio::time::Instant;

fn device(fabric: &Fabric, node: &str, id: u64) -> Device {
    fabric.device(
        node,
        DeviceConfig {
            node_id: id,
            secret: suite_secret(),
            limits: DeviceLimits::default(),
        },
    )
}

fn config() -> ConnConfig {
    ConnConfig {
        retry_count: 3,
        ack_timeout_exp: 14, // ≈ 67 ms per try: a 268 ms window
        ..ConnConfig::default()
    }
}

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// a connects to b; returns (a's connection, b's connection, b's buffer).
async fn pair(fabric: &Fabric) -> (Device, Device, Connection, Connection, Buffer) {
    let a = device(fabric, "a", 1);
    let b = device(fabric, "b", 2);
    let mut listener = b
        .listen("b:0", config(), reveal_to_all(vec![]))
        .await
        .unwrap();
    let ab = a.connect("b:0", config(), vec![]).await.unwrap();
    let ba = listener.accept().await.unwrap();
    let buffer = b.register_buffer(4096, RW).unwrap();
    (a, b, ab, ba, buffer)
}

#[tokio::test(start_paused = true)]
async fn delay_slows_but_keeps_order() {
    let fabric = Fabric::new(1);
    let (_a, _b, ab, ba, buf) = pair(&fabric).await;
    fabric.set_delay(Duration::from_millis(5), Duration::from_millis(20));
    let start = Instant::now();
    let w = ab.post_write(buf.remote().start(), b"first").unwrap();
    let s = ab.post_send(b"after").unwrap();
    w.await.unwrap();
    s.await.unwrap();
    let rtt = start.elapsed();
    assert!(
        rtt >= Duration::from_millis(10),
        "two one-way delays at least: {rtt:?}"
    );
    let got = ba.recv().await.unwrap();
    assert_eq!(
        got,
        ringraft_transport::Received::Message(b"after".to_vec())
    );
    assert_eq!(buf.read(0, 5).unwrap(), b"first");
}

#[tokio::test(start_paused = true)]
async fn a_short_partition_heals_and_a_long_one_exceeds_retries() {
    let fabric = Fabric::new(2);
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    let window = config().op_deadline();

    fabric.partition(&["a"], &["b"]);
    let pending = ab.post_write(buf.remote().start(), b"held").unwrap();
    tokio::time::sleep(window / 4).await;
    fabric.heal();
    pending
        .await
        .expect("a write held across a short cut completes");
    assert_eq!(buf.read(0, 4).unwrap(), b"held");

    fabric.partition(&["a"], &["b"]);
    let start = Instant::now();
    let err = ab.write(buf.remote().start(), b"lost").await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RetryExceeded), "{err}");
    assert!(
        start.elapsed() >= window,
        "failed before the retry window: {:?}",
        start.elapsed()
    );
    assert!(ab.error().is_some(), "the queue pair is in the error state");
    assert!(matches!(
        ab.post_write(buf.remote().start(), b"x"),
        Err(TransportError::Broken { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn one_way_cut_loses_the_answers() {
    let fabric = Fabric::new(3);
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    fabric.cut_one_way("b", "a");
    // The WRITE lands (a -> b is open) but its acknowledgement never comes.
    let err = ab.write(buf.remote().start(), b"landed").await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RetryExceeded));
    assert_eq!(buf.read(0, 6).unwrap(), b"landed");
}

#[tokio::test(start_paused = true)]
async fn a_paused_node_keeps_its_writes_in_flight_until_it_resumes() {
    let fabric = Fabric::new(4);
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    fabric.pause("a");
    let pending = ab.post_write(buf.remote().start(), b"stale").unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        buf.read(0, 5).unwrap(),
        [0; 5],
        "nothing leaves a paused node"
    );
    // b revokes the rkey while a is frozen (what a follower does when its
    // term advances); the in-flight write then fails at the "NIC".
    let mut buf = buf;
    buf.region_mut().rotate().unwrap();
    fabric.resume("a");
    let err = pending.await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RemoteAccess), "{err}");
    assert_eq!(
        buf.read(0, 5).unwrap(),
        [0; 5],
        "the stale write did not land"
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_connections_fail_both_sides_at_once() {
    let fabric = Fabric::new(5);
    let (_a, _b, ab, ba, buf) = pair(&fabric).await;
    assert_eq!(fabric.drop_connections("a", "b"), 1);
    tokio::task::yield_now().await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(ab.error().is_some() && ba.error().is_some());
    assert!(ab.post_write(buf.remote().start(), b"x").is_err());
    assert!(ba.recv().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_failed_queue_pair_is_noticed_by_the_peer_only_by_timeout() {
    let fabric = Fabric::new(6);
    let (_a, b, ab, ba, _buf) = pair(&fabric).await;
    let a_buf = _a.register_buffer(64, RW).unwrap();
    assert_eq!(fabric.fail_qp("a", "b"), 1);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(ab.error().is_some(), "a's side failed");
    assert!(ba.error().is_none(), "b has not heard of it");
    let err = ba.write(a_buf.remote().start(), b"x").await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RetryExceeded));
    drop(b);
}

/// The same seed gives the same delays: the order in which messages from
/// two senders interleave at a receiver is a function of the seed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn runs_are_a_function_of_the_seed() {
    async fn interleaving(seed: u64) -> Vec<u8> {
        let fabric = Fabric::new(seed);
        fabric.set_delay(Duration::from_micros(10), Duration::from_millis(10));
        let hub = device(&fabric, "hub", 1);
        let mut listener = hub
            .listen("hub:0", config(), reveal_to_all(vec![]))
            .await
            .unwrap();
        let inbox = hub.register_buffer(64, RW).unwrap();
        let mut senders = Vec::new();
        for (k, node) in ["x", "y"].iter().enumerate() {
            let d = device(&fabric, node, 10 + k as u64);
            let c = d.connect("hub:0", config(), vec![]).await.unwrap();
            let _server_side = listener.accept().await.unwrap();
            senders.push((d, c, _server_side, k as u64));
        }
        let mut order = Vec::new();
        let mut posted = Vec::new();
        for round in 0..16u64 {
            for (_, c, _, k) in &senders {
                posted.push(
                    c.post_fetch_add(inbox.remote().start(), 1 << (k * 32))
                        .unwrap(),
                );
                let _ = round;
            }
        }
        for p in posted {
            let before = p.await.unwrap();
            order.push((before & 0xff) as u8);
            order.push((before >> 32 & 0xff) as u8);
        }
        order
    }
    let one = interleaving(42).await;
    assert_eq!(one, interleaving(42).await, "same seed, same run");
    let mut differs = false;
    for seed in [7, 8, 9, 10] {
        differs |= interleaving(seed).await != one;
    }
    assert!(differs, "other seeds give other interleavings");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_node_s_nic_serves_one_sided_requests_while_its_application_waits() {
    let fabric = Fabric::new(8);
    let (a, _b, ab, ba, buf) = pair(&fabric).await;
    let a_buf = a.register_buffer(4096, RW).unwrap();
    fabric.freeze("b");
    // Executed by b's NIC alone, against b's memory: lands and completes.
    ab.post_write(buf.remote().start(), b"first")
        .unwrap()
        .await
        .unwrap();
    assert_eq!(buf.read(0, 5).unwrap(), b"first");
    // What b posts waits; a SEND to b finds no receive posted, and the
    // WRITE behind it on the same queue pair waits for it.
    let from_b = ba.post_write(a_buf.remote().start(), b"fromb").unwrap();
    let send = ab.post_send(b"hello").unwrap();
    let behind = ab
        .post_write(buf.remote().at(8, 5).unwrap(), b"later")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(a_buf.read(0, 5).unwrap(), [0; 5], "b posted while frozen");
    assert_eq!(
        buf.read(8, 5).unwrap(),
        [0; 5],
        "a WRITE overtook a held SEND"
    );
    fabric.thaw("b");
    send.await.unwrap();
    behind.await.unwrap();
    from_b.await.unwrap();
    assert_eq!(
        ba.recv().await.unwrap(),
        ringraft_transport::Received::Message(b"hello".to_vec())
    );
    assert_eq!(buf.read(8, 5).unwrap(), b"later");
    assert_eq!(a_buf.read(0, 5).unwrap(), b"fromb");
}

#[tokio::test(start_paused = true)]
async fn the_landing_observer_sees_every_write_that_lands_and_no_other() {
    use std::sync::{Arc, Mutex};
    let fabric = Fabric::new(4);
    // Installed after the devices were made: they see it all the same.
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    /// What the observer was shown: the node, the address, the bytes.
    type Seen = Vec<(String, u64, Vec<u8>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    fabric
        .observe_landings(move |landing| {
            record.lock().unwrap().push((
                landing.node.to_string(),
                landing.addr,
                landing.bytes.to_vec(),
            ))
        })
        .unwrap();
    assert!(
        fabric.observe_landings(|_| {}).is_err(),
        "one observer per fabric"
    );
    let region = buf.remote();
    ab.post_write(region.start(), b"lands")
        .unwrap()
        .await
        .unwrap();
    ab.post_read(region.start(), 5).unwrap().await.unwrap();
    let word = region.at(8, 8).unwrap();
    ab.post_compare_swap(word, 0, 1).unwrap().await.unwrap();
    // A WRITE under a wrong rkey is refused by the NIC: it never lands.
    let mut forged = region.start();
    forged.rkey ^= 1;
    if let Ok(pending) = ab.post_write(forged, b"refused") {
        assert!(pending.await.is_err(), "a WRITE under a wrong rkey");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one WRITE landed: {seen:?}");
    assert_eq!(seen[0].0, "b");
    assert_eq!(seen[0].1, region.addr);
    assert_eq!(seen[0].2, b"lands");
    assert_eq!(buf.read(0, 5).unwrap(), b"lands");
}

/// Waits (simulated time) until `fabric` holds `n` parked WRITEs from a to b.
async fn until_parked(fabric: &Fabric, n: usize) {
    for _ in 0..1000 {
        if fabric.parked("a", "b") == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{} WRITEs parked, not {n}", fabric.parked("a", "b"));
}

#[tokio::test(start_paused = true)]
async fn a_parked_write_admitted_before_a_rotation_lands_after_it() {
    use ringraft_transport::inproc::Moment;
    use std::sync::{Arc, Mutex};
    let fabric = Fabric::new(4);
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    let moments: Arc<Mutex<Vec<Moment>>> = Arc::default();
    let record = moments.clone();
    fabric
        .observe_landings(move |landing| record.lock().unwrap().push(landing.moment))
        .unwrap();
    fabric.park_writes("a", "b");
    let region = buf.remote();
    let write = ab.post_write(region.start(), b"late!").unwrap();
    let read = ab.post_read(region.start(), 5).unwrap();
    until_parked(&fabric, 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(buf.read(0, 5).unwrap(), [0; 5], "admitted, not copied");
    assert_eq!(*moments.lock().unwrap(), [Moment::Admitted]);
    // The rkey is rotated while the copy is under way: the copy goes on.
    let mut buf = buf;
    buf.region_mut().rotate().unwrap();
    fabric.land_parked("a", "b");
    write.await.unwrap();
    assert_eq!(buf.read(0, 5).unwrap(), b"late!");
    // The READ behind it waited for it (RC order), and its rkey was
    // checked only then: after the rotation.
    assert_eq!(read.await.unwrap_err().wc(), Some(WcError::RemoteAccess));
    assert_eq!(
        *moments.lock().unwrap(),
        [Moment::Admitted, Moment::LandedLate]
    );
    assert_eq!(fabric.parked("a", "b"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_parked_write_into_memory_deregistered_meanwhile_is_not_copied() {
    let fabric = Fabric::new(4);
    let (_a, b, ab, _ba, buf) = pair(&fabric).await;
    fabric.park_writes("a", "b");
    let write = ab.post_write(buf.remote().start(), b"gone").unwrap();
    until_parked(&fabric, 1).await;
    drop(buf);
    fabric.land_parked("a", "b");
    let err = write.await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RemoteAccess), "{err}");
    // A remote access error puts the queue pair in the error state.
    let other = b.register_buffer(64, RW).unwrap();
    match ab.post_write(other.remote().start(), b"next") {
        Ok(pending) => assert!(pending.await.is_err()),
        Err(e) => assert!(matches!(e, TransportError::Broken { .. }), "{e}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_discarded_parked_write_fails_at_the_nic_and_copies_nothing() {
    let fabric = Fabric::new(4);
    let (_a, _b, ab, _ba, buf) = pair(&fabric).await;
    fabric.park_writes("a", "b");
    let write = ab.post_write(buf.remote().start(), b"never").unwrap();
    until_parked(&fabric, 1).await;
    fabric.discard_parked("a", "b");
    let err = write.await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RemoteAccess), "{err}");
    assert_eq!(buf.read(0, 5).unwrap(), [0; 5]);
    assert_eq!(fabric.parked("a", "b"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_probe_is_refused_only_where_no_listener_is_open_and_the_path_passes() {
    let fabric = Fabric::new(6);
    let a = device(&fabric, "a", 1);
    let b = device(&fabric, "b", 2);
    let listener = b
        .listen("b:0", config(), reveal_to_all(vec![]))
        .await
        .unwrap();
    let t = Duration::from_secs(1);
    assert_eq!(a.probe("b:0", t).await, Probe::Listening);
    assert_eq!(a.probe("c:0", t).await, Probe::Refused, "nothing there");
    fabric.partition(&["a"], &["b"]);
    assert!(
        matches!(a.probe("b:0", t).await, Probe::Unknown(_)),
        "a partition answers nothing"
    );
    drop(listener);
    assert!(
        matches!(a.probe("b:0", t).await, Probe::Unknown(_)),
        "nor does it for a closed listener behind it"
    );
    fabric.heal();
    assert_eq!(a.probe("b:0", t).await, Probe::Refused);
}
