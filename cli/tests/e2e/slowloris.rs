//! Issue 15, item 1: hundreds of connections that never authenticate,
//! idle and dripping a byte at a time, held open against every fabric,
//! client and metrics port of a 3-node cluster (and reopened whenever a
//! node closes one) while the leader is killed. A new leader is elected,
//! commits, the killed node rejoins, and nothing acknowledged is lost.
//!
//! The strangers connect from 127.0.0.2 and up, the nodes from 127.0.0.1:
//! the nodes' caps per source address tell them apart as they would tell
//! hosts apart.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::harness::{Cluster, History, assert_ok};

/// Strangers per fabric port: more than the 64 handshakes the accept loop
/// once waited for, and than the 256 unproven connections a node now lets
/// in from non-members.
const PER_FABRIC_PORT: usize = 300;
/// Strangers per client and metrics port.
const PER_CLIENT_PORT: usize = 30;
/// Source addresses the strangers spread over (127.0.0.2 and up).
const SOURCES: usize = 30;
/// How often a dripping stranger sends its next byte.
const DRIP_EVERY: Duration = Duration::from_millis(250);
/// A stranger that was closed connects again after this pause.
const RECONNECT_AFTER: Duration = Duration::from_millis(100);

/// The strangers: a thread of their own, stopped when dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    /// Connections made so far (reconnections included).
    connected: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a dripping stranger sends: `opening` at once, then `drip` one byte
/// at a time, over and over: a request that is never whole.
#[derive(Clone, Copy)]
struct Script {
    opening: &'static [u8],
    drip: &'static [u8],
}

/// A fabric handshake frame of 60,000 bytes (within the limit), never
/// finished.
const FABRIC: Script = Script {
    opening: &60_000u32.to_le_bytes(),
    drip: &[0],
};
/// HTTP/2's connection preface, then nothing that completes a frame.
const GRPC: Script = Script {
    opening: b"",
    drip: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0",
};
/// An HTTP/1.1 request whose headers never end.
const METRICS: Script = Script {
    opening: b"GET /metrics HTTP/1.1\r\n",
    drip: b"X-Slow: yes\r\n",
};

impl Flood {
    /// `count` strangers against each of `ports`, half idle, half dripping
    /// their port's `Script`.
    fn start(ports: Vec<(String, usize, Script)>) -> Flood {
        raise_open_files_limit();
        let stop = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicU64::new(0));
        let (stop2, connected2) = (stop.clone(), connected.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                let mut k = 0usize;
                for (addr, count, script) in ports {
                    let addr: SocketAddr = addr.parse().unwrap();
                    for i in 0..count {
                        let source = Ipv4Addr::new(127, 0, 0, 2 + (k % SOURCES) as u8);
                        k += 1;
                        let script = (i % 2 == 1).then_some(script);
                        let (stop, connected) = (stop2.clone(), connected2.clone());
                        tasks.spawn(stranger(addr, source, script, stop, connected));
                    }
                }
                while tasks.join_next().await.is_some() {}
            });
        });
        Flood {
            stop,
            connected,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One stranger: connects from `source`, holds the connection (dripping
/// its `script` a byte every [`DRIP_EVERY`], if it has one) until the node
/// closes it, then connects again, until `stop`.
async fn stranger(
    addr: SocketAddr,
    source: Ipv4Addr,
    script: Option<Script>,
    stop: Arc<AtomicBool>,
    connected: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::SeqCst) {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        if let Ok(mut stream) = socket.connect(addr).await {
            connected.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 512];
            let mut drip = script.map(|s| s.drip.iter().cycle());
            let opening = script.map_or(&[][..], |s| s.opening);
            let mut open = stream.write_all(opening).await.is_ok();
            while open && !stop.load(Ordering::SeqCst) {
                // Wakes at least every DRIP_EVERY to look at `stop`.
                match tokio::time::timeout(DRIP_EVERY, stream.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => open = false,
                    Ok(Ok(_)) => {}
                    Err(_) => {
                        if let Some(byte) = drip.as_mut().and_then(|d| d.next()) {
                            open = stream.write_all(&[*byte]).await.is_ok();
                        }
                    }
                }
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// The strangers' sockets and the test's own need more than the usual
/// 1,024 descriptors: the soft limit goes up to the hard one.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to a rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[test]
fn strangers_on_every_port_do_not_stop_a_failover() {
    let c = Cluster::start(3, &[]);
    let history = History::default();
    let ids = c.ids();
    let mut ports = Vec::new();
    for id in &ids {
        ports.push((c.listen(*id), PER_FABRIC_PORT, FABRIC));
        ports.push((c.client(*id), PER_CLIENT_PORT, GRPC));
        ports.push((c.metrics(*id), PER_CLIENT_PORT, METRICS));
    }
    let slots = (PER_FABRIC_PORT + 2 * PER_CLIENT_PORT) as u64 * ids.len() as u64;
    let flood = Flood::start(ports);
    // Every stranger connected at least once (some were closed at once and
    // keep coming back).
    let deadline = Instant::now() + Duration::from_secs(120);
    while flood.connected.load(Ordering::SeqCst) < slots {
        assert!(
            Instant::now() < deadline,
            "the strangers made {} connections, not {slots}",
            flood.connected.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let before: Vec<String> = (0..50).map(|k| format!("before-{k}")).collect();
    let (out, _) = history.append_lines(&c.endpoints(), &before);
    assert_ok(&out);

    let leader = c.wait_leader(Duration::from_secs(60));
    history.fault_start("kill", leader);
    let killed_at = Instant::now();
    c.kill9(leader);
    let new = c.wait_leader(Duration::from_secs(60));
    eprintln!(
        "new leader {new} agreed {:?} after the kill, {} strangers' connections so far",
        killed_at.elapsed(),
        flood.connected.load(Ordering::SeqCst)
    );
    assert_ne!(new, leader);
    let after: Vec<String> = (0..50).map(|k| format!("after-{k}")).collect();
    let (out, _) = history.append_lines(&c.endpoints(), &after);
    assert_ok(&out);
    eprintln!(
        "the new leader committed 50 appends {:?} after the kill",
        killed_at.elapsed()
    );

    // The killed node comes back through the flood and catches up.
    let log = history.read_all(&c, &c.endpoints());
    let last = log.iter().map(|(i, _)| *i).max().unwrap();
    c.boot(leader);
    history.fault_stop("kill", leader);
    c.wait_applied(leader, last, Duration::from_secs(120));
    drop(flood);
    let verdict = history.assert_valid(&c.final_logs(&ids));
    assert_eq!(verdict.summary.acked_appends, 100);
}
