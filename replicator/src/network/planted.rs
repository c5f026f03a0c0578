//! PLANTED BUGS — test-only, compiled only with the `planted-bugs` feature
//! and active only when the environment variable `RINGRAFT_PLANTED_BUG`
//! names one. They exist so that the Jepsen-style harness (`jepsen/`) can
//! show that its checker catches real safety violations. Never enable them
//! elsewhere.

use std::sync::OnceLock;
use std::time::Duration;

use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

use super::peer::PeerNet;
use crate::types::TypeConfig;

/// The environment variable naming the bug to switch on.
pub const ENV: &str = "RINGRAFT_PLANTED_BUG";
/// `ack-before-replication`: the leader's network answers every
/// AppendEntries as succeeded at once and sends it for real only
/// [`REPLICATION_DELAY`] later (answers ignored, failures dropped), so the
/// leader commits and acknowledges entries that only it holds.
pub const ACK_BEFORE_REPLICATION: &str = "ack-before-replication";
/// How long the real replication lags the false acknowledgement.
pub const REPLICATION_DELAY: Duration = Duration::from_millis(2000);
/// Requests held back per follower at most (older ones are dropped).
pub const MAX_BACKLOG_REQUESTS: usize = 10_000;

fn chosen() -> Option<&'static str> {
    static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Whether `ack-before-replication` is on.
pub fn ack_before_replication() -> bool {
    chosen() == Some(ACK_BEFORE_REPLICATION)
}

/// Says loudly, at start, that a planted bug is on (or that the name is
/// unknown).
pub fn announce(node_id: u64) {
    match chosen() {
        None => {}
        Some(ACK_BEFORE_REPLICATION) => {
            let msg = format!(
                "!!! PLANTED BUG {ACK_BEFORE_REPLICATION} IS ON in node {node_id}: \
                 appends are acknowledged before replication; this node is UNSAFE !!!"
            );
            eprintln!("{msg}");
            tracing::error!("{msg}");
        }
        Some(other) => {
            let msg = format!(
                "!!! {ENV}={other:?} names no planted bug (known: {ACK_BEFORE_REPLICATION}); none is on !!!"
            );
            eprintln!("{msg}");
            tracing::error!("{msg}");
        }
    }
}

impl PeerNet {
    /// PLANTED BUG `ack-before-replication` (see the module docs).
    pub(super) async fn planted_ack_before_replication(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> AppendEntriesResponse<TypeConfig> {
        let ttl = option.hard_ttl();
        if self.planted_backlog.len() >= MAX_BACKLOG_REQUESTS {
            self.planted_backlog.pop_front();
        }
        self.planted_backlog
            .push_back((tokio::time::Instant::now(), rpc));
        while self
            .planted_backlog
            .front()
            .is_some_and(|(at, _)| at.elapsed() >= REPLICATION_DELAY)
        {
            let (_, req) = self.planted_backlog.pop_front().expect("just checked");
            // A failure closed the connection already (the link's).
            if let Ok(AppendEntriesResponse::HigherVote(v)) = self.append(req, ttl).await {
                self.planted_backlog.clear();
                return AppendEntriesResponse::HigherVote(v);
            }
        }
        AppendEntriesResponse::Success
    }
}
