//! The baseline of the commit benchmark: openraft with an in-memory log
//! and direct in-process calls between the nodes' `Raft` handles (no ring,
//! no fabric), configured like a ringraft node. It must stay the cheapest
//! honest openraft cluster: nothing here may add work ringraft does not do.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, RwLock};

use openraft::OptionalSend;
use openraft::SnapshotPolicy;
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use ringraft::types::{Entry, LogId, Raft, Vote};
use ringraft::{NodeConfig, NodeInfo, TypeConfig};

#[derive(Default)]
pub(crate) struct MemLogInner {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
}

/// A minimal in-memory log store; clones share it (the reader is a clone).
#[derive(Clone, Default)]
pub(crate) struct MemLog {
    inner: Arc<Mutex<MemLogInner>>,
}

impl MemLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemLogInner> {
        self.inner.lock().expect("log lock")
    }
}

impl RaftLogReader<TypeConfig> for MemLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.lock().vote)
    }
}

impl RaftLogStorage<TypeConfig> for MemLog {
    type LogReader = MemLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let inner = self.lock();
        let last = inner.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last.or(inner.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.lock().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut inner = self.lock();
            for entry in entries {
                inner.entries.insert(entry.log_id.index, entry);
            }
        }
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let mut inner = self.lock();
        let keep_up_to = last_log_id.map(|l| l.index);
        let from = keep_up_to.map_or(0, |i| i + 1);
        inner.entries.split_off(&from);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut inner = self.lock();
        let rest = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = rest;
        inner.purged = Some(log_id);
        Ok(())
    }
}

/// The baseline's nodes, by id: the network calls their handles directly.
pub(crate) type Registry = Arc<RwLock<HashMap<u64, Raft>>>;

#[derive(Clone)]
pub(crate) struct DirectNetwork {
    pub(crate) registry: Registry,
}

pub(crate) struct DirectPeer {
    registry: Registry,
    target: u64,
}

#[derive(Debug)]
pub(crate) struct Message(String);
impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Message {}

pub(crate) fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::new(&Message(e.to_string()))
}

/// A call the target's `Raft` refused: to the caller, the peer is
/// unreachable.
fn rpc_error(e: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Unreachable(unreachable(e))
}

impl DirectPeer {
    fn raft(&self) -> Result<Raft, Unreachable<TypeConfig>> {
        self.registry
            .read()
            .expect("registry lock")
            .get(&self.target)
            .cloned()
            .ok_or_else(|| unreachable(format!("node {} is not running", self.target)))
    }
}

impl RaftNetworkFactory<TypeConfig> for DirectNetwork {
    type Network = DirectPeer;

    async fn new_client(&mut self, target: u64, _node: &NodeInfo) -> DirectPeer {
        DirectPeer {
            registry: self.registry.clone(),
            target,
        }
    }
}

impl RaftNetworkV2<TypeConfig> for DirectPeer {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft()?.append_entries(rpc).await.map_err(rpc_error)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft()?.vote(rpc).await.map_err(rpc_error)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft()?.pre_vote(rpc).await.map_err(rpc_error)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let raft = self.raft()?;
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = raft.install_full_snapshot(vote, snapshot) => {
                result.map_err(|e| StreamingError::Unreachable(unreachable(e)))
            }
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.raft()?
            .handle_transfer_leader(req)
            .await
            .map_err(rpc_error)
    }
}

/// The openraft configuration of a ringraft node with `NodeConfig::new`'s
/// defaults (see `NodeBuilder::start`).
pub(crate) fn raft_config_like_ringraft(defaults: &NodeConfig) -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: format!("baseline-{:x}", defaults.cluster_id),
        election_timeout_min: defaults.election_timeout_ms.0,
        election_timeout_max: defaults.election_timeout_ms.1,
        heartbeat_interval: defaults.heartbeat_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(defaults.snapshot_every_entries),
        max_in_snapshot_log_to_keep: defaults.keep_after_snapshot,
        max_payload_entries: 256,
        allow_log_reversion: Some(true),
        ..Default::default()
    }
    .validate()
    .expect("valid openraft config");
    Arc::new(config)
}
