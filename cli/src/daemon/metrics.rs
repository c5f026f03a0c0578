//! Prometheus metrics at `/metrics` and a health check at `/health`.
//!
//! Values are read at scrape time from the node (openraft's metrics and the
//! data plane's counters), the ring, the fabric device (on rdma, the
//! port's `hw_counters`) and the client-facing ports' accept loops
//! (connections open, refused by a cap, dropped before their TLS handshake
//! ended), into a fresh registry. Scraping only reads: it
//! never changes the node, and a failed encoding is an answer, not a panic.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ringraft::Node;
use ringraft::metrics::LATENCY_BUCKETS_US;

use super::accept::{Incoming, PortStats};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FollowerLabel {
    follower: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabel {
    counter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabel {
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortReasonLabel {
    port: String,
    reason: String,
}

/// The client-facing ports' counters, by port name.
pub type Ports = [(&'static str, Arc<PortStats>)];

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

/// The exposition text.
pub fn render(node: &Node, ports: &Ports) -> String {
    let mut registry = Registry::with_prefix("ringraft");
    raft_gauges(&mut registry, node);
    data_plane_gauges(&mut registry, node);
    families(&mut registry, node);
    port_families(&mut registry, ports);
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        return "# encoding failed\n".into();
    }
    let hist = commit_latency(node);
    match text.rfind("# EOF") {
        Some(at) => text.insert_str(at, &hist),
        None => text.push_str(&hist),
    }
    text
}

/// The node's Raft position and its log's bounds.
fn raft_gauges(registry: &mut Registry, node: &Node) {
    let status = node.status();
    let m = node.metrics();
    gauge(registry, "term", "Current Raft term", status.term as i64);
    gauge(
        registry,
        "is_leader",
        "1 when this node leads",
        (status.leader_id == Some(status.id)) as i64,
    );
    gauge(
        registry,
        "commit_index",
        "Highest committed index",
        status.commit_index.unwrap_or(0) as i64,
    );
    gauge(
        registry,
        "applied_index",
        "Highest applied index",
        status.applied_index.unwrap_or(0) as i64,
    );
    gauge(
        registry,
        "last_log_index",
        "Last log index",
        status.last_log_index.unwrap_or(0) as i64,
    );
    gauge(
        registry,
        "proposals_in_flight",
        "Proposals made through this node (appends and trims) not yet answered",
        m.proposals_in_flight.get(),
    );
    gauge(
        registry,
        "first_index",
        "First index this node holds (0: nothing trimmed)",
        (*node.watch_first_index().borrow()).max(node.log_store().first_index()) as i64,
    );
    gauge(
        registry,
        "segment_bytes",
        "Bytes of the log's segment files on disk",
        node.log_store().segments().disk_bytes() as i64,
    );
}

/// The data plane's counters and the ring's use.
fn data_plane_gauges(registry: &mut Registry, node: &Node) {
    let m = node.metrics();
    gauge(
        registry,
        "proposals",
        "Proposals committed through this node",
        m.proposals.get() as i64,
    );
    gauge(
        registry,
        "fence_changes",
        "Times this node took a follower's fence",
        m.fence_changes.get() as i64,
    );
    gauge(
        registry,
        "rejected_records",
        "Written records refused at adoption",
        m.rejected_records.get() as i64,
    );
    gauge(
        registry,
        "dead_leaders",
        "Leaders found gone through the fabric (connection ended, address refused)",
        m.dead_leaders.get() as i64,
    );
    gauge(
        registry,
        "fast_elections",
        "Elections started at once on finding the leader gone",
        m.fast_elections.get() as i64,
    );
    gauge(
        registry,
        "fenced_writes",
        "WRITEs refused because this leader was fenced out",
        m.fenced_writes.get() as i64,
    );
    gauge(
        registry,
        "bytes_written",
        "Bytes written one-sided into followers' rings",
        m.bytes_written.get() as i64,
    );
    gauge(
        registry,
        "entries_encoded_for_followers",
        "Entries encoded again for a follower's ring (the log store's encoding not at hand)",
        m.entries_encoded_for_followers.get() as i64,
    );
    let fence = node.log_store().fence();
    gauge(
        registry,
        "fence_term",
        "Term of the leader that holds this node's ring (its fence word)",
        fence.term() as i64,
    );
    gauge(
        registry,
        "fence_leader",
        "Node id of the leader that holds this node's ring (0: nobody yet)",
        fence.leader_id() as i64,
    );
    gauge(
        registry,
        "rkey_rotations",
        "Rotations of the ring's data rkey",
        node.rkey_rotations() as i64,
    );
    gauge(
        registry,
        "votes_blocked",
        "1 while the log is corrupt inside and the node refuses votes",
        node.log_store().votes_blocked() as i64,
    );
    let (used, capacity) = node.log_store().with_wal(|w| {
        let r = w.ring();
        (r.tail_lsn() - r.head_lsn(), r.geometry().capacity)
    });
    gauge(
        registry,
        "ring_used_bytes",
        "Bytes of the ring in use",
        used as i64,
    );
    gauge(
        registry,
        "ring_capacity_bytes",
        "Ring data area capacity",
        capacity as i64,
    );
}

/// The labelled families: replication lag per follower and the fabric
/// device's counters.
fn families(registry: &mut Registry, node: &Node) {
    // Replication lag per follower (leader only): entries behind the last log.
    let lag = Family::<FollowerLabel, Gauge>::default();
    for (id, behind) in node.replication_lag() {
        lag.get_or_create(&FollowerLabel {
            follower: id.to_string(),
        })
        .set(behind as i64);
    }
    registry.register(
        "replication_lag_entries",
        "Entries a follower is behind (leader only)",
        lag,
    );

    // The fabric device's counters (rdma: the port's hw_counters; the
    // software fabrics: connection and refusal counts).
    let nic = Family::<CounterLabel, Gauge>::default();
    for (name, value) in node.device().counters() {
        nic.get_or_create(&CounterLabel { counter: name })
            .set(value as i64);
    }
    registry.register("nic_counter", "Fabric device counters", nic);
}

/// The client-facing ports' connections: open, served, refused by a cap,
/// dropped before their TLS handshake ended.
fn port_families(registry: &mut Registry, ports: &Ports) {
    let open = Family::<PortLabel, Gauge>::default();
    let served = Family::<PortLabel, Counter>::default();
    let refused = Family::<PortReasonLabel, Counter>::default();
    let dropped = Family::<PortReasonLabel, Counter>::default();
    let label = |name: &str| PortLabel { port: name.into() };
    let reason = |name: &str, reason: &str| PortReasonLabel {
        port: name.into(),
        reason: reason.into(),
    };
    let read = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
    for (name, stats) in ports {
        open.get_or_create(&label(name))
            .set(read(&stats.open) as i64);
        served
            .get_or_create(&label(name))
            .inc_by(read(&stats.served));
        refused
            .get_or_create(&reason(name, "per_ip_cap"))
            .inc_by(read(&stats.refused_per_source));
        refused
            .get_or_create(&reason(name, "total_cap"))
            .inc_by(read(&stats.refused_total));
        for (why, value) in [
            ("timeout", &stats.pre_auth_timeouts),
            ("tls_failed", &stats.pre_auth_failures),
            ("plaintext", &stats.plaintext_refused),
        ] {
            dropped
                .get_or_create(&reason(name, why))
                .inc_by(read(value));
        }
    }
    registry.register(
        "connections_open",
        "Open connections of a client-facing port (handshaking or served)",
        open,
    );
    registry.register(
        "connections_served",
        "Connections of a client-facing port handed to its server",
        served,
    );
    registry.register(
        "connections_refused",
        "Connections closed at once: their IP address (per_ip_cap) or the port (total_cap) had as many open as allowed",
        refused,
    );
    registry.register(
        "connections_dropped_before_auth",
        "Connections dropped before their TLS handshake ended: not within the deadline (timeout), failed (tls_failed: e.g. no or a refused client certificate), plaintext on a TLS port",
        dropped,
    );
}

/// The commit latency histogram's exposition text, from the node's fixed
/// buckets (inserted before `# EOF`).
fn commit_latency(node: &Node) -> String {
    let m = node.metrics();
    let (buckets, sum_us, count) = m.commit_latency.snapshot();
    let mut hist = String::new();
    let _ = writeln!(
        hist,
        "# HELP ringraft_commit_latency_seconds Proposal to committed-and-applied answer."
    );
    let _ = writeln!(hist, "# TYPE ringraft_commit_latency_seconds histogram");
    let mut cumulative = 0;
    for (k, upper) in LATENCY_BUCKETS_US.iter().enumerate() {
        cumulative += buckets[k];
        let le = if *upper == u64::MAX {
            "+Inf".to_string()
        } else {
            format!("{}", *upper as f64 / 1e6)
        };
        let _ = writeln!(
            hist,
            "ringraft_commit_latency_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        hist,
        "ringraft_commit_latency_seconds_sum {}",
        sum_us as f64 / 1e6
    );
    let _ = writeln!(hist, "ringraft_commit_latency_seconds_count {count}");
    hist
}

/// Serves `/metrics` and `/health` on the connections of `incoming` until
/// `shutdown` turns true; `/metrics` includes the counters of `ports`.
pub fn serve(
    incoming: Incoming,
    node: Node,
    ports: Vec<(&'static str, Arc<PortStats>)>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let ports: Arc<Ports> = ports.into();
    let metrics_node = node.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let node = metrics_node.clone();
                let ports = Arc::clone(&ports);
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        render(&node, &ports),
                    )
                }
            }),
        )
        .route(
            "/health",
            get(move || {
                let node = node.clone();
                async move {
                    let s = node.status();
                    let healthy = s.leader_id.is_some();
                    let body = serde_json::json!({
                        "id": s.id,
                        "state": s.state,
                        "leader_id": s.leader_id,
                        "term": s.term,
                        "healthy": healthy,
                    });
                    let code = if healthy {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (code, body.to_string())
                }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(incoming, app)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            })
            .await;
    })
}
