//! The tcp backend against hostile bytes: garbage on the listening port,
//! half-open handshakes, oversized frames. None of it takes the listener
//! down; members keep connecting.

use std::time::{Duration, Instant};

use ringraft_transport::conformance::{suite_config, suite_secret};
use ringraft_transport::{
    Access, Backend, ConnConfig, Device, DeviceConfig, DeviceLimits, Listener, Probe, handshake,
    reveal_to_all,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn device(id: u64, limits: DeviceLimits) -> Device {
    Device::tcp(DeviceConfig {
        node_id: id,
        secret: suite_secret(),
        limits,
    })
}

/// `b` listening on a free loopback port with the suite's configuration,
/// revealing `secret rkeys`.
async fn listening(b: &Device) -> Listener {
    b.listen(
        "127.0.0.1:0",
        suite_config(),
        reveal_to_all(b"secret rkeys".to_vec()),
    )
    .await
    .unwrap()
}

async fn member_still_connects(listener: &mut Listener, addr: &str) {
    let a = device(1, DeviceLimits::default());
    let conn = a
        .connect(addr, suite_config(), vec![])
        .await
        .expect("a member connects");
    let server = tokio::time::timeout(Duration::from_secs(60), listener.accept())
        .await
        .expect("accepted (safety net against a hang)")
        .expect("listener alive");
    assert_eq!(conn.peer().reveal.app_data, b"secret rkeys");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_port_never_takes_the_listener_down() {
    let b = device(2, DeviceLimits::default());
    // Short enough for the test to wait it out, long enough for a member's
    // handshake on a loaded machine (500 ms was not).
    let config = ConnConfig {
        handshake_timeout: Duration::from_secs(3),
        auth_timeout: Duration::from_secs(3),
        ..suite_config()
    };
    let mut listener = b
        .listen(
            "127.0.0.1:0",
            config,
            reveal_to_all(b"secret rkeys".to_vec()),
        )
        .await
        .unwrap();
    let addr = listener.local_addr();
    let attacks: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xff; 4096],
        u32::MAX.to_le_bytes().to_vec(),
        [&16u32.to_le_bytes()[..], &[0u8; 16]].concat(),
        vec![],
    ];
    for bytes in &attacks {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        if bytes.is_empty() {
            // Closed before a first byte: a probe, whatever the timeouts.
            continue;
        }
        let _ = s.write_all(bytes).await;
        let mut reply = Vec::new();
        // Whatever comes back holds no rkey.
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut reply)).await;
        assert!(
            !reply.windows(12).any(|w| w == b"secret rkeys"),
            "garbage was answered with application data"
        );
    }
    // A client that opens and says nothing, held open until the listener
    // gives up on it (its handshake timeout: waited for, not slept).
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), silent.read_to_end(&mut reply))
        .await
        .expect("the listener closes a silent connection");
    member_still_connects(&mut listener, &addr).await;
    // Every attack and the silent client are counted (a rejection is
    // counted just after its socket closes: wait for the count), except
    // the empty one: a connection closed before its first byte is a probe
    // (`Device::probe`). It closed seconds before the silent client was
    // even opened, so the count below would already hold it.
    let expected = attacks.iter().filter(|a| !a.is_empty()).count() as u64 + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while listener.rejected() < expected {
        assert!(
            Instant::now() < deadline,
            "rejections counted: {}, expected {expected}",
            listener.rejected()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(listener.rejected(), expected, "the probe was not rejected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_tells_a_listening_port_from_a_closed_one() {
    let b = device(2, DeviceLimits::default());
    let mut listener = listening(&b).await;
    let addr = listener.local_addr();
    let a = device(1, DeviceLimits::default());
    let t = Duration::from_secs(30);
    assert_eq!(a.probe(&addr, t).await, Probe::Listening);
    member_still_connects(&mut listener, &addr).await;
    drop(listener);
    // The listening socket closes once its accept task is aborted: wait
    // for that (a safety net, not a budget).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match a.probe(&addr, t).await {
            Probe::Refused => break,
            // Listening, or reset: a probe caught in the closing socket's
            // queue.
            other => {
                assert!(Instant::now() < deadline, "the port stayed open: {other:?}");
                tokio::task::yield_now().await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_after_the_handshake_breaks_only_that_connection() {
    let b = device(2, DeviceLimits::default());
    let mut listener = listening(&b).await;
    let addr = listener.local_addr();
    // A member authenticates by hand on a raw socket...
    let mut raw = TcpStream::connect(&addr).await.unwrap();
    let endpoint = vec![3u8, 10]; // bincode of the soft endpoint {rnr_retry 3, delay 10 us}
    let secret = suite_secret();
    let info = handshake::client(
        &mut raw,
        &addr,
        handshake::Local {
            secret: &secret,
            backend: Backend::Tcp,
            node_id: 7,
            nonce: handshake::fresh_nonce(),
        },
        Duration::from_secs(60),
        || {
            Ok(handshake::Reveal {
                endpoint,
                app_data: vec![],
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(info.reveal.app_data, b"secret rkeys");
    let server_side = listener.accept().await.unwrap();
    // ...then sends bytes that are no frame.
    raw.write_all(&8u32.to_le_bytes()).await.unwrap();
    raw.write_all(&[0xff; 8]).await.unwrap();
    // Waited for, not timed (the deadline is a safety net).
    let deadline = Instant::now() + Duration::from_secs(60);
    while server_side.error().is_none() {
        assert!(
            Instant::now() < deadline,
            "a malformed frame puts that connection in the error state"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    member_still_connects(&mut listener, &addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_send_is_refused_as_the_verbs_do() {
    let b = device(2, DeviceLimits::default());
    let small = ConnConfig {
        max_message_bytes: 1024,
        ..suite_config()
    };
    let mut listener = b
        .listen(
            "127.0.0.1:0",
            small,
            reveal_to_all(b"secret rkeys".to_vec()),
        )
        .await
        .unwrap();
    let addr = listener.local_addr();
    let a = device(1, DeviceLimits::default());
    let big = ConnConfig {
        max_message_bytes: 1 << 20,
        ..suite_config()
    };
    let conn = a.connect(&addr, big, vec![]).await.unwrap();
    let _server = listener.accept().await.unwrap();
    let err = conn.send(&vec![0u8; 4096]).await.unwrap_err();
    assert_eq!(
        err.wc(),
        Some(ringraft_transport::WcError::RemoteInvalidRequest),
        "{err}"
    );
    member_still_connects(&mut listener, &addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_connections_and_registrations() {
    let limits = DeviceLimits {
        max_registered_bytes: 1 << 20,
        max_regions: 4,
        max_connections: 1,
        ..DeviceLimits::default()
    };
    let b = device(2, limits.clone());
    let mut listener = b
        .listen("127.0.0.1:0", suite_config(), reveal_to_all(vec![]))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let a = device(1, DeviceLimits::default());
    let first = a.connect(&addr, suite_config(), vec![]).await.unwrap();
    let _first_server = listener.accept().await.unwrap();
    let second = a.connect(&addr, suite_config(), vec![]).await;
    assert!(
        second.is_err(),
        "the second connection is refused at the limit"
    );
    drop(first);
    assert!(b.register_buffer(2 << 20, Access::REMOTE_READ).is_err());
    let _held: Vec<_> = (0..4)
        .map(|_| b.register_buffer(64, Access::REMOTE_READ).unwrap())
        .collect();
    assert!(b.register_buffer(64, Access::REMOTE_READ).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_beyond_the_outstanding_limit_are_refused() {
    let b = device(2, DeviceLimits::default());
    // No receive posted and long RNR waits (4 × 2 s: no stall of a loaded
    // machine outlasts them): a SEND stays outstanding and holds everything
    // posted after it (RC order), so the count is exact.
    let held = ConnConfig {
        recv_depth: 0,
        auto_repost: false,
        rnr_delay: Duration::from_secs(2),
        ..suite_config()
    };
    let mut listener = b
        .listen("127.0.0.1:0", held.clone(), reveal_to_all(vec![]))
        .await
        .unwrap();
    let a = device(1, DeviceLimits::default());
    let tight = ConnConfig {
        max_outstanding: 4,
        ..held
    };
    let conn = a
        .connect(&listener.local_addr(), tight, vec![])
        .await
        .unwrap();
    let _server = listener.accept().await.unwrap();
    let buf = b
        .register_buffer(1 << 20, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    let _send = conn.post_send(b"held").unwrap();
    for _ in 0..3 {
        conn.post_write(buf.remote().start(), &[1u8; 64]).unwrap();
    }
    assert!(matches!(
        conn.post_write(buf.remote().start(), &[1u8; 64]),
        Err(ringraft_transport::TransportError::Limit { .. })
    ));
    let too_big = vec![0u8; (suite_config().max_transfer_bytes as usize) + 1];
    let fresh = a
        .connect(&listener.local_addr(), suite_config(), vec![])
        .await
        .unwrap();
    assert!(fresh.post_write(buf.remote().start(), &too_big).is_err());
    assert!(
        conn.post_compare_swap(
            ringraft_transport::RemoteAddr {
                addr: buf.remote().addr + 4,
                rkey: 1
            },
            0,
            1
        )
        .is_err()
    );
}
