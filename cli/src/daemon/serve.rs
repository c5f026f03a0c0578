//! `ringraft serve`: one node of a replicated log, its client API, and its
//! metrics endpoint, until SIGTERM or SIGINT (then: stop accepting, flush,
//! close), or until its Raft core stops on its own (the same, then exit
//! with an error). It wires the parts together; it never handles a client request
//! itself (that is `service`) and never parses flags (that is `config`).

use std::time::Duration;

use super::proto::log_server::LogServer;
use ringraft::{Fabric, NodeBuilder, NodeConfig};
use tonic::transport::server::TcpIncoming;

use super::config::{Config, FabricChoice};
use super::service::LogService;
use super::state_machine::Records;

/// Largest client API message, bytes (records above --max-record are refused
/// individually before this).
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 64 << 20;

fn fabric(config: &Config) -> Fabric {
    match config.fabric {
        FabricChoice::Tcp => Fabric::Tcp,
        FabricChoice::Rdma => Fabric::Rdma {
            device: config.rdma_device.clone(),
        },
        FabricChoice::Auto => Fabric::Auto {
            rdma_device: config.rdma_device.clone(),
        },
    }
}

/// The library's node configuration from the daemon's.
fn node_config(config: &Config) -> NodeConfig {
    let mut node_config = NodeConfig::new(config.id, &config.data_dir, config.listen.clone());
    node_config.ring_dir = config.ring_dir.clone();
    node_config.cluster_id = config.cluster_id;
    node_config.peers = config.peers.clone();
    node_config.durability = config.durability;
    node_config.ring_capacity = config.ring_capacity;
    // A record travels as a command in a ring record: leave room for the
    // envelope (session, encoding).
    node_config.max_record_bytes = config.max_record + 256;
    node_config.election_timeout_ms = config.election_timeout_ms;
    node_config.heartbeat_ms = config.heartbeat_ms;
    node_config.fast_failover = config.fast_failover;
    node_config.conn.retry_count = config.rdma_retry.retry_count;
    node_config.conn.rnr_retry = config.rdma_retry.retry_count;
    node_config.conn.ack_timeout_exp = config.rdma_retry.ack_timeout_exp;
    // The log is the data: openraft purges it only below a trim (explicit,
    // or by retention), never merely because a snapshot covers it.
    node_config.keep_after_snapshot = u64::MAX;
    node_config.retain_bytes = config.retain_bytes;
    node_config.retain_age = config.retain_age;
    node_config
}

/// Starts the node (and bootstraps the cluster when told to); also returns
/// the fabric backend's name.
async fn start_node(config: &Config) -> Result<(ringraft::Node, String), String> {
    let node = NodeBuilder::new(node_config(config))
        .fabric(fabric(config))
        .secret(config.secret.clone())
        .state_machine(Records)
        .start()
        .await
        .map_err(|e| format!("node {}: {e}", config.id))?;
    let backend = node.device().backend().to_string();
    tracing::info!(
        id = config.id,
        listen = %config.listen,
        client = %config.client,
        fabric = %backend,
        durability = ?config.durability,
        data_dir = %config.data_dir.display(),
        ring_dir = %config.ring_dir.display(),
        "ringraft node up"
    );
    if config.bootstrap {
        node.initialize()
            .await
            .map_err(|e| format!("bootstrap: {e}"))?;
    }

    Ok((node, backend))
}

/// Runs the daemon until a termination signal.
pub async fn run(config: Config) -> Result<(), String> {
    let (node, backend) = start_node(&config).await?;
    let client_addr: std::net::SocketAddr = tokio::net::lookup_host(&config.client)
        .await
        .map_err(|e| format!("--client {}: {e}", config.client))?
        .next()
        .ok_or_else(|| format!("--client {} resolves to nothing", config.client))?;
    let listener = tokio::net::TcpListener::bind(client_addr)
        .await
        .map_err(|e| format!("--client {client_addr}: {e}"))?;
    let service = LogService::new(
        node.clone(),
        config.max_record as usize,
        backend,
        format!("{:?}", config.durability).to_lowercase(),
    );
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut grpc_shutdown = shutdown_rx.clone();
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .timeout(Duration::from_secs(120))
            .add_service(
                LogServer::new(service)
                    .max_decoding_message_size(MAX_CLIENT_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_CLIENT_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(client_connections(listener), async move {
                let _ = grpc_shutdown.wait_for(|stop| *stop).await;
            }),
    );
    let metrics = match &config.metrics {
        Some(addr) => Some(super::metrics::serve(addr, node.clone(), shutdown_rx.clone()).await?),
        None => None,
    };

    let core_stopped = until_stopped(&node, wait_for_signal()).await;
    match &core_stopped {
        None => tracing::info!("stopping: no new requests, flushing, closing"),
        Some(why) => tracing::error!(
            %why,
            "the Raft core stopped: this node can no longer take part; stopping"
        ),
    }
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), grpc).await;
    if let Some(m) = metrics {
        let _ = tokio::time::timeout(Duration::from_secs(2), m).await;
    }
    node.shutdown().await;
    tracing::info!("stopped");
    match core_stopped {
        None => Ok(()),
        Some(why) => Err(format!("the Raft core stopped: {why}")),
    }
}

/// Waits for `signal` (a clean stop: `None`) or for the node's Raft core to
/// stop on its own (`Some(why)`): a node whose core stopped must not go on
/// serving, answering a stale "leader" forever.
async fn until_stopped(node: &ringraft::Node, signal: impl Future<Output = ()>) -> Option<String> {
    tokio::select! {
        () = signal => None,
        why = node.core_stopped() => Some(why),
    }
}

/// The client API's incoming connections, each with `TCP_NODELAY` set.
///
/// tonic applies `Server::tcp_nodelay` only to listeners it binds itself,
/// never to a stream handed to `serve_with_incoming*`. Without it, Nagle's
/// algorithm holds the last small write of an answer until the client ACKs
/// the previous one, which Linux delays by up to 40 ms: `scripts/compare.sh`
/// measured about 1 % of 4 KiB appends at 40-48 ms (issue 11, item 7).
fn client_connections(listener: tokio::net::TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the daemon still runs; it just cannot stop
        // gracefully.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// Issue 11, item 7: the client API's connections have `TCP_NODELAY`
    /// (without it, about 1 % of 4 KiB appends waited 40 ms for a delayed
    /// ACK).
    #[tokio::test]
    async fn client_connections_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = client_connections(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(60), incoming.next())
            .await
            .expect("the connection is accepted")
            .expect("the stream goes on")
            .unwrap();
        assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is set");
    }

    /// The daemon stops when its node's Raft core stops on its own; before
    /// this, it went on serving with a dead core (the Jepsen runs' stale
    /// "leader term 7" after openraft's core panicked).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_daemon_stops_when_the_core_stops() {
        use ringraft::Durability;
        use ringraft_testkit::inproc::{Cluster, Kind};
        let c = Cluster::start(Kind::Inproc, 1, Durability::Memory, 1).await;
        let node = c.node(1).clone();
        let waiting = tokio::spawn({
            let node = node.clone();
            async move { until_stopped(&node, std::future::pending()).await }
        });
        // The core stops under the daemon (here: openraft's own shutdown).
        node.raft().shutdown().await.unwrap();
        let why = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .expect("the daemon notices")
            .unwrap();
        assert!(why.is_some_and(|w| w.contains("stopped")), "a reason");
    }

    #[tokio::test]
    async fn a_signal_stops_the_daemon_cleanly() {
        use ringraft::Durability;
        use ringraft_testkit::inproc::{Cluster, Kind};
        let c = Cluster::start(Kind::Inproc, 1, Durability::Memory, 2).await;
        assert_eq!(until_stopped(c.node(1), async {}).await, None);
    }
}
