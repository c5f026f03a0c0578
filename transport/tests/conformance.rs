//! The conformance suite against the software backends. The same suite runs
//! against the `rdma` backend inside the Soft-RoCE lab
//! (`deploy/softroce-vm/run-tests.sh`).

use ringraft_transport::conformance::{self, LocalPeer, RemotePeer, suite_secret, wrong_secret};
use ringraft_transport::inproc::Fabric;
use ringraft_transport::{Device, DeviceConfig, DeviceLimits, Secret};

fn config(node_id: u64, secret: Secret) -> DeviceConfig {
    DeviceConfig {
        node_id,
        secret,
        limits: DeviceLimits::default(),
    }
}

fn report(backend: &str, results: Vec<(&'static str, conformance::CheckResult)>) {
    let mut failed = Vec::new();
    for (name, outcome) in &results {
        match outcome {
            Ok(()) => eprintln!("{backend}: {name} ... ok"),
            Err(e) => {
                eprintln!("{backend}: {name} ... FAILED: {e}");
                failed.push(*name);
            }
        }
    }
    assert_eq!(results.len(), conformance::CHECKS.len(), "every check ran");
    assert!(failed.is_empty(), "{backend}: failed checks {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inproc_passes_the_suite() {
    let fabric = Fabric::new(7);
    let a = fabric.device("a", config(1, suite_secret()));
    let outsider = fabric.device("x", config(9, wrong_secret()));
    let mut b = LocalPeer::new(fabric.device("b", config(2, suite_secret())), "b:data");
    report("inproc", conformance::run(&a, &outsider, &mut b, "").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_passes_the_suite() {
    let a = Device::tcp(config(1, suite_secret()));
    let outsider = Device::tcp(config(9, wrong_secret()));
    let mut b = LocalPeer::new(Device::tcp(config(2, suite_secret())), "127.0.0.1:0");
    report("tcp", conformance::run(&a, &outsider, &mut b, "").await);
}

/// The remote-peer mode (what runs across two Soft-RoCE guests), on tcp over
/// loopback: side B is driven through the control protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_passes_the_suite_against_a_remote_peer() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let control_addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let b = Device::tcp(config(2, suite_secret()));
    let addr = control_addr.clone();
    let server =
        tokio::spawn(
            async move { conformance::serve(b, &addr, "0.0.0.0:0", Some("127.0.0.1")).await },
        );
    let a = Device::tcp(config(1, suite_secret()));
    let outsider = Device::tcp(config(9, wrong_secret()));
    // Until the server task listens (a safety net, not a budget).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut peer = loop {
        match RemotePeer::connect(&a, &control_addr).await {
            Ok(p) => break p,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "control connection: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
        }
    };
    let results = conformance::run(&a, &outsider, &mut peer, "").await;
    let finished = peer.finish().await;
    let served = server.await.unwrap();
    report("tcp-remote", results);
    served.unwrap();
    finished.unwrap();
}
