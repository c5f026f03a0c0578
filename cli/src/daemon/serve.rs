//! `ringraft serve`: one node of a replicated log, its client API, and its
//! metrics endpoint, until SIGTERM or SIGINT (then: stop accepting, flush,
//! close), or until its Raft core stops on its own (the same, then exit
//! with an error). It wires the parts together; it never handles a client request
//! itself (that is `service`) and never parses flags (that is `config`).

use std::sync::Arc;
use std::time::Duration;

use super::proto::log_server::LogServer;
use ringraft::{Fabric, NodeBuilder, NodeConfig};

use super::accept::{self, Incoming, PRE_AUTH_TIMEOUT, Port, PortStats, Protocol};
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

/// File descriptors the node needs besides its client-facing connections
/// (peers, ring, segments, snapshots), roughly.
const NODE_FDS: u64 = 1024;

/// Raises the open files limit to its hard limit and logs it; warns when
/// it stays below what the connection caps allow.
fn raise_open_files_limit(config: &Config) {
    let allowed = 2 * u64::from(config.caps.total) + NODE_FDS;
    match accept::raise_open_files_limit() {
        Ok((before, after)) => {
            tracing::info!(before, after, "open files limit (RLIMIT_NOFILE)");
            if after < allowed {
                tracing::warn!(
                    limit = after,
                    needed = allowed,
                    "the open files limit is below what the connection caps allow \
                     (2 ports x --max-connections, and the node's own): raise the hard limit \
                     (systemd: LimitNOFILE) or lower --max-connections"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit (RLIMIT_NOFILE)"),
    }
}

/// Binds `addr` (the flag `flag`'s value) and starts its accept loop.
async fn listen(addr: &str, flag: &str, port: Port) -> Result<Incoming, String> {
    let socket_addr: std::net::SocketAddr = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("{flag} {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{flag} {addr} resolves to nothing"))?;
    let listener = tokio::net::TcpListener::bind(socket_addr)
        .await
        .map_err(|e| format!("{flag} {socket_addr}: {e}"))?;
    let tls = port.tls.is_some();
    let what = match port.protocol {
        Protocol::Grpc => "the client API (append, read, trim, membership, transfer)",
        Protocol::Http => "the metrics endpoint",
    };
    let incoming = accept::spawn(listener, port).map_err(|e| format!("{flag} {addr}: {e}"))?;
    if accept::plaintext_exposed(incoming.local_addr(), tls) {
        tracing::warn!(
            "{flag} {} is not a loopback address and has no TLS: anyone who can reach it can use \
             {what} and read what it sends; give --tls-cert and --tls-key (and --tls-client-ca \
             to admit only clients with a certificate)",
            incoming.local_addr()
        );
    }
    Ok(incoming)
}

/// The settings of a client-facing port.
fn port(config: &Config, name: &'static str, protocol: Protocol) -> Port {
    Port {
        name,
        protocol,
        tls: config.tls.as_ref().map(|tls| match protocol {
            Protocol::Grpc => Arc::clone(&tls.grpc),
            Protocol::Http => Arc::clone(&tls.http),
        }),
        caps: config.caps,
        pre_auth_timeout: PRE_AUTH_TIMEOUT,
    }
}

/// Runs the daemon until a termination signal.
pub async fn run(config: Config) -> Result<(), String> {
    raise_open_files_limit(&config);
    let (node, backend) = start_node(&config).await?;
    let client_port = listen(
        &config.client,
        "--client",
        port(&config, "client", Protocol::Grpc),
    )
    .await?;
    let metrics_port = match &config.metrics {
        Some(addr) => {
            Some(listen(addr, "--metrics", port(&config, "metrics", Protocol::Http)).await?)
        }
        None => None,
    };
    let mut port_stats: Vec<(&'static str, Arc<PortStats>)> = vec![("client", client_port.stats())];
    if let Some(metrics) = &metrics_port {
        port_stats.push(("metrics", metrics.stats()));
    }
    tracing::info!(
        tls = config.tls.is_some(),
        client_certificates = config.tls.as_ref().is_some_and(|t| t.client_auth()),
        max_connections_per_ip = config.caps.per_source,
        max_connections = config.caps.total,
        "client API on {}{}",
        client_port.local_addr(),
        metrics_port
            .as_ref()
            .map(|m| format!(", metrics on {}", m.local_addr()))
            .unwrap_or_default()
    );
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
            .serve_with_incoming_shutdown(client_port, async move {
                let _ = grpc_shutdown.wait_for(|stop| *stop).await;
            }),
    );
    let metrics = metrics_port.map(|incoming| {
        super::metrics::serve(incoming, node.clone(), port_stats, shutdown_rx.clone())
    });

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
