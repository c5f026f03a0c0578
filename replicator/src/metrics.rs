//! Counters and histograms a node keeps about its own data plane (openraft's
//! metrics cover the protocol). Plain atomics: the daemon exports them to
//! Prometheus.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (things in flight).
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one until the returned guard is dropped.
    pub fn track(&self) -> GaugeGuard<'_> {
        self.0.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self)
    }
    /// The value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Takes back the one its [`Gauge::track`] added, on drop (also when the
/// future holding it is cancelled).
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a Gauge);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Upper bounds of the latency buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    50,
    100,
    200,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    5_000_000,
    u64::MAX,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; 16],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let k = LATENCY_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(15);
        self.buckets[k].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    /// Per bucket counts (not cumulative), total sum in µs, count.
    pub fn snapshot(&self) -> ([u64; 16], u64, u64) {
        let mut b = [0; 16];
        for (k, v) in self.buckets.iter().enumerate() {
            b[k] = v.load(Ordering::Relaxed);
        }
        (
            b,
            self.sum_us.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// A node's data-plane metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Proposal commit latency (propose to applied answer).
    pub commit_latency: Histogram,
    /// Proposals committed.
    pub proposals: Counter,
    /// Calls of [`Node::propose_batch`](crate::Node::propose_batch) (and
    /// the calls built on it) that have not returned yet: the fault
    /// harness's `freeze` nemesis stops a leader once a batch is in.
    pub proposals_in_flight: Gauge,
    /// Times this node took a follower's fence.
    pub fence_changes: Counter,
    /// Written records a follower refused (or this node refused).
    pub rejected_records: Counter,
    /// One-sided WRITEs a follower's NIC refused because this leader was
    /// fenced out (revoked rkey or REMOTE_WRITE dropped).
    pub fenced_writes: Counter,
    /// Bytes WRITTEN one-sided into followers' rings.
    pub bytes_written: Counter,
    /// Entries whose payloads a leader encoded again for a follower's
    /// ring, its log store's encoding not at hand (a new leader's first
    /// batches, entries older than the store's window of recent ones);
    /// the others were encoded once, when appended.
    pub entries_encoded_for_followers: Counter,
    /// Leaders this node found gone through the fabric: their connection
    /// ended and their address refused a probe ([`crate::Node`]'s fast
    /// failover).
    pub dead_leaders: Counter,
    /// Elections this node started at once on such a finding.
    pub fast_elections: Counter,
    /// Control-plane requests this node's server took from its peers
    /// (appends and heartbeats, votes, grants, forwarded calls).
    pub requests_served: Counter,
}
