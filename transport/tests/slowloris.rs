//! Strangers who connect and never prove the cluster secret (idle, or
//! dripping a byte at a time) against a tcp listener: past the gate's caps
//! they are closed at once, each is closed once its `auth_timeout` runs
//! out, and none of it keeps a member out (issue 15, item 1).
//!
//! Strangers connect from other loopback addresses (127.0.0.2 and up) than
//! the member (127.0.0.1): per-source caps tell them apart as they would
//! tell hosts apart.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ringraft_transport::conformance::{suite_config, suite_secret};
use ringraft_transport::{ConnConfig, Device, DeviceConfig, DeviceLimits, Listener, reveal_to_all};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A safety net against a hang, far above anything a member's handshake
/// on loopback takes; what the tests show does not depend on it.
const SAFETY_NET: Duration = Duration::from_secs(30);

fn device(id: u64, limits: DeviceLimits) -> Device {
    Device::tcp(DeviceConfig {
        node_id: id,
        secret: suite_secret(),
        limits,
    })
}

/// A connection to `addr` from the loopback address 127.0.0.`source`.
async fn from(source: u8, addr: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, source), 0)))
        .unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// Waits until the server closed `stream` (end of stream or a reset),
/// draining whatever it sent first.
async fn closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 256];
    tokio::time::timeout(SAFETY_NET, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closes the connection");
}

/// A member connecting as node `id` and accepted by `listener`.
async fn member_connects(listener: &mut Listener, addr: &str, config: &ConnConfig) {
    let member = device(7, DeviceLimits::default());
    let conn = member
        .connect(addr, config.clone(), vec![])
        .await
        .expect("a member connects");
    let accepted = tokio::time::timeout(SAFETY_NET, listener.accept())
        .await
        .expect("accepted")
        .expect("listener alive");
    assert_eq!(conn.peer().reveal.app_data, b"rkeys");
    drop(accepted);
}

/// Node 2 with `limits`, listening on loopback with `config`: the device,
/// its listener and the address.
async fn listening(limits: DeviceLimits, config: &ConnConfig) -> (Device, Listener, String) {
    let server = device(2, limits);
    let listener = server
        .listen(
            "127.0.0.1:0",
            config.clone(),
            reveal_to_all(b"rkeys".to_vec()),
        )
        .await
        .unwrap();
    let addr = listener.local_addr();
    (server, listener, addr)
}

async fn wait_for_rejected(listener: &Listener, count: u64) {
    tokio::time::timeout(SAFETY_NET, async {
        while listener.rejected() < count {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} rejected, not {count}", listener.rejected()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_holding_every_unproven_place_never_keep_a_member_out() {
    let limits = DeviceLimits {
        max_unauthenticated: 64,
        max_unauthenticated_per_source: 8,
        ..DeviceLimits::default()
    };
    // Strangers are never timed out during the test: they hold their
    // places for as long as they like.
    let config = ConnConfig {
        auth_timeout: Duration::from_secs(600),
        handshake_timeout: SAFETY_NET,
        ..suite_config()
    };
    let (_server, mut listener, addr) = listening(limits, &config).await;
    // The member has proven the secret once: its source is known.
    member_connects(&mut listener, &addr, &config).await;

    // 12 sources x 10 strangers, one after the other: half idle, half
    // dripping the first bytes of a frame. Sources 2..=9 fill the total of
    // 64 (their 9th and 10th are over the cap of 8 per source: 16); the 40
    // of sources 10..=13 find the total taken. 56 are closed at once.
    let mut strangers = Vec::new();
    for source in 2..14u8 {
        for i in 0..10 {
            let mut stream = from(source, &addr).await;
            if i % 2 == 1 {
                stream.write_all(&[0x10]).await.unwrap();
            }
            strangers.push(stream);
        }
    }
    wait_for_rejected(&listener, 56).await;

    // Every place is taken: one more stranger is closed at once...
    let mut late = from(99, &addr).await;
    closed_by_server(&mut late).await;
    wait_for_rejected(&listener, 57).await;
    // ... and the member still gets in, as often as it reconnects.
    for _ in 0..3 {
        member_connects(&mut listener, &addr, &config).await;
    }
    // The strangers let in are still held (none was closed to make room).
    assert_eq!(listener.rejected(), 57);
    drop(strangers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_dripping_bytes_is_closed_when_its_time_to_prove_runs_out() {
    let config = ConnConfig {
        auth_timeout: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(600),
        ..suite_config()
    };
    let (_server, mut listener, addr) = listening(DeviceLimits::default(), &config).await;
    let mut drip = from(2, &addr).await;
    // A frame length of 60,000 bytes, then its body one byte at a time:
    // every read the server makes gets something, and the frame would take
    // twenty minutes to end.
    drip.write_all(&60_000u32.to_le_bytes()).await.unwrap();
    let (mut read_half, mut write_half) = drip.into_split();
    let dripping = tokio::spawn(async move {
        loop {
            if write_half.write_all(&[0]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut idle = from(3, &addr).await;
    tokio::time::timeout(SAFETY_NET, async {
        let mut buf = [0u8; 64];
        while !matches!(read_half.read(&mut buf).await, Ok(0) | Err(_)) {}
    })
    .await
    .expect("the dripping stranger is closed");
    closed_by_server(&mut idle).await;
    dripping.abort();
    wait_for_rejected(&listener, 2).await;
    // A member with a handshake to make is not held to the strangers'.
    member_connects(&mut listener, &addr, &config).await;
}
