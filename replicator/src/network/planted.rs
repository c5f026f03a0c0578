//! PLANTED BUG `ack-before-replication` (test-only, `planted-bugs`
//! feature; [`crate::planted`] says when it is on): the leader's network
//! answers every AppendEntries as succeeded at once and sends it for real
//! only [`REPLICATION_DELAY`] later (answers ignored, failures dropped), so
//! the leader commits and acknowledges entries that only it holds.

use std::time::Duration;

use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

use super::peer::PeerNet;
use crate::types::TypeConfig;

/// How long the real replication lags the false acknowledgement.
pub const REPLICATION_DELAY: Duration = Duration::from_millis(2000);
/// Requests held back per follower at most (older ones are dropped).
pub const MAX_BACKLOG_REQUESTS: usize = 10_000;

/// Whether `ack-before-replication` is on.
pub fn ack_before_replication() -> bool {
    crate::planted::is_on(crate::planted::ACK_BEFORE_REPLICATION)
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
