//! An authenticated peer that goes past a limit of the software RNIC
//! (issue 15, item 2): a WRITE or READ above `max_transfer_bytes`, a frame
//! above `max_frame_bytes`, more request bytes waiting than
//! `max_backlog_bytes`. Each time the connection is closed with the reason
//! (logged, and the connection's error), and the node keeps accepting
//! members.

use std::time::{Duration, Instant};

use ringraft_transport::conformance::{suite_config, suite_secret};
use ringraft_transport::{
    Backend, ConnConfig, Connection, Device, DeviceConfig, DeviceLimits, Listener, RemoteAddr,
    WcError, handshake, reveal_to_all,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SAFETY_NET: Duration = Duration::from_secs(60);

fn device(id: u64) -> Device {
    Device::tcp(DeviceConfig {
        node_id: id,
        secret: suite_secret(),
        limits: DeviceLimits::default(),
    })
}

/// The node's side: transfers and messages of at most 4 KiB.
fn small() -> ConnConfig {
    ConnConfig {
        max_transfer_bytes: 4096,
        max_message_bytes: 4096,
        max_backlog_bytes: 16 << 10,
        ..suite_config()
    }
}

async fn listening(b: &Device, config: ConnConfig) -> Listener {
    b.listen("127.0.0.1:0", config, reveal_to_all(b"rkeys".to_vec()))
        .await
        .unwrap()
}

/// A peer with limits far above the node's, connected and accepted.
async fn big_peer(listener: &mut Listener, peer: ConnConfig) -> (Connection, Connection) {
    let a = device(1);
    let conn = a
        .connect(&listener.local_addr(), peer, vec![])
        .await
        .unwrap();
    let server_side = tokio::time::timeout(SAFETY_NET, listener.accept())
        .await
        .unwrap()
        .unwrap();
    (conn, server_side)
}

/// Waits for `conn`'s error state; its cause.
async fn closed(conn: &Connection) -> String {
    let deadline = Instant::now() + SAFETY_NET;
    loop {
        if let Some(cause) = conn.error() {
            return cause.to_string();
        }
        assert!(Instant::now() < deadline, "the connection stays open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn member_still_connects(listener: &mut Listener) {
    let (conn, _server_side) = big_peer(listener, suite_config()).await;
    assert_eq!(conn.peer().reveal.app_data, b"rkeys");
}

fn nowhere() -> RemoteAddr {
    // No registration: the size is checked before the key.
    RemoteAddr { addr: 0, rkey: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_above_max_transfer_bytes_is_refused_and_closes_the_connection() {
    let b = device(2);
    let mut listener = listening(&b, small()).await;
    let (conn, server_side) = big_peer(&mut listener, suite_config()).await;
    // Above the limit, within the frame's room for headers: the NIC's
    // answer (a larger WRITE is a frame above the limit, below).
    let err = conn.write(nowhere(), &[7u8; 6000]).await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RemoteInvalidRequest), "{err}");
    let cause = closed(&server_side).await;
    assert!(
        cause.contains("WRITE of 6000 bytes is above max_transfer_bytes 4096"),
        "{cause}"
    );
    member_still_connects(&mut listener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_above_max_transfer_bytes_is_refused_and_closes_the_connection() {
    let b = device(2);
    let mut listener = listening(&b, small()).await;
    let (conn, server_side) = big_peer(&mut listener, suite_config()).await;
    let err = conn.read(nowhere(), 8192).await.unwrap_err();
    assert_eq!(err.wc(), Some(WcError::RemoteInvalidRequest), "{err}");
    let cause = closed(&server_side).await;
    assert!(
        cause.contains("READ of 8192 bytes is above max_transfer_bytes 4096"),
        "{cause}"
    );
    member_still_connects(&mut listener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_above_max_frame_bytes_closes_the_connection_before_its_body() {
    let b = device(2);
    let mut listener = listening(&b, small()).await;
    let addr = listener.local_addr();
    // A member authenticates by hand on a raw socket...
    let mut raw = TcpStream::connect(&addr).await.unwrap();
    let secret = suite_secret();
    handshake::client(
        &mut raw,
        &addr,
        handshake::Local {
            secret: &secret,
            backend: Backend::Tcp,
            node_id: 7,
            nonce: handshake::fresh_nonce(),
        },
        SAFETY_NET,
        || {
            Ok(handshake::Reveal {
                // bincode of the soft endpoint {rnr_retry 3, delay 10 us}
                endpoint: vec![3u8, 10],
                app_data: vec![],
            })
        },
    )
    .await
    .unwrap();
    let server_side = listener.accept().await.unwrap();
    // ...then declares a frame one byte above the limit, and sends none of
    // it: the length alone closes the connection.
    let declared = small().max_frame_bytes() as u32 + 1;
    raw.write_all(&declared.to_le_bytes()).await.unwrap();
    let cause = closed(&server_side).await;
    assert!(cause.contains("above the limit"), "{cause}");
    member_still_connects(&mut listener).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_past_max_backlog_bytes_close_the_connection() {
    let b = device(2);
    // No receive is ever posted on the node's side: every SEND waits for
    // one, and what comes behind it waits too.
    let node = ConnConfig {
        recv_depth: 0,
        auto_repost: false,
        ..small()
    };
    let mut listener = listening(&b, node).await;
    // The peer lets its SENDs wait long for a receive (receiver-not-ready
    // retries of 10 s): they stay in the node's backlog.
    let patient = ConnConfig {
        rnr_retry: 6,
        rnr_delay: Duration::from_secs(10),
        ..suite_config()
    };
    let (conn, server_side) = big_peer(&mut listener, patient).await;
    // 5 x 4 KiB = 20 KiB waiting, above the 16 KiB allowed.
    let sends: Vec<_> = (0..5)
        .map(|_| conn.post_send(&[1u8; 4096]).unwrap())
        .collect();
    let cause = closed(&server_side).await;
    assert!(cause.contains("bytes wait for the responder"), "{cause}");
    for send in sends {
        assert!(
            send.await.is_err(),
            "a SEND of a closed connection completed"
        );
    }
    member_still_connects(&mut listener).await;
}
