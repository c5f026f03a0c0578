//! The initiator side of the network: openraft's `RaftNetworkV2` over the
//! fabric, with AppendEntries split into one-sided WRITEs of ring records
//! and a small two-sided control message.
//!
//! For each target, openraft gets a [`PeerNet`], the glue of one sans-IO
//! [`Link`](crate::replication::Link) (which holds every decision: the
//! fence, the view of the follower's ring, how a batch travels, flow
//! control, pipelining, matching replies): see `crate::replication::link`.
//! Here: openraft's calls ([`PeerNet`]'s `RaftNetworkV2`), `stream_append`'s
//! pipeline (`pipeline`), a follower's link for calls it forwards to its
//! leader ([`Forwarder`], `forward`), the connections (`pool`), how errors reach
//! openraft (`error`) and the planted bugs of the Jepsen harness
//! (`planted`).

mod error;
mod forward;
mod peer;
mod pipeline;
#[cfg(feature = "planted-bugs")]
mod planted;
mod pool;

use std::collections::VecDeque;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::OptionalSend;
use openraft::error::{RPCError, ReplicationClosed, StreamingError};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use std::sync::Arc;

use crate::protocol::{MAX_PART_BYTES, Reply, Request};
use crate::types::{NodeInfo, TypeConfig, Vote};
pub use error::ReplicationError;
use error::{rpc_error, streaming_error};
pub use forward::{FORWARD_DEPTH, Forwarder};
pub use peer::{PIPELINE_DEPTH, PeerNet, RING_FULL_WAIT};
use pipeline::Pipeline;
pub use pool::NetCtx;

/// Creates a client per target (openraft's factory).
#[derive(Clone)]
pub struct NetworkFactory {
    ctx: Arc<NetCtx>,
}

impl NetworkFactory {
    /// A factory over `ctx`.
    pub fn new(ctx: Arc<NetCtx>) -> NetworkFactory {
        #[cfg(feature = "planted-bugs")]
        crate::planted::announce(ctx.node_id);
        NetworkFactory { ctx }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNet;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerNet {
        PeerNet::new(self.ctx.clone(), target, node.addr.clone())
    }
}

impl RaftNetworkV2<TypeConfig> for PeerNet {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        #[cfg(feature = "planted-bugs")]
        if planted::ack_before_replication() {
            return Ok(self.planted_ack_before_replication(rpc, option).await);
        }
        self.append(rpc, option.hard_ttl()).await.map_err(rpc_error)
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        #[cfg(feature = "planted-bugs")]
        if planted::ack_before_replication() {
            // One request at a time, through the planted `append_entries`.
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            self.begin();
            let state = Pipeline {
                net: self,
                input,
                pending: VecDeque::new(),
                input_done: false,
                stopped: false,
                ttl: option.hard_ttl(),
            };
            let stream = futures::stream::unfold(state, |mut state| async move {
                let item = state.next().await?;
                Some((item, state))
            });
            Ok(stream.boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let answer = self.call(Request::Vote(rpc), option.hard_ttl()).await;
        self.answer_of(answer, "a vote", |reply| match reply {
            Reply::Voted(resp) => Ok(resp),
            other => Err(other),
        })
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let answer = self.call(Request::PreVote(rpc), option.hard_ttl()).await;
        self.answer_of(answer, "a pre-vote", |reply| match reply {
            Reply::Voted(resp) => Ok(resp),
            other => Err(other),
        })
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let ttl = option.hard_ttl();
        let total = snapshot.snapshot.len() as u64;
        let send = async {
            let mut offset = 0u64;
            let chunks: Vec<&[u8]> = if snapshot.snapshot.is_empty() {
                vec![&[][..]]
            } else {
                snapshot.snapshot.chunks(MAX_PART_BYTES).collect()
            };
            for chunk in chunks {
                let request = Request::Snapshot {
                    vote,
                    meta: snapshot.meta.clone(),
                    offset,
                    total,
                    data: chunk.to_vec(),
                };
                offset += chunk.len() as u64;
                match self.call(request, ttl).await? {
                    Reply::PartStored if offset < total => {}
                    Reply::Installed(resp) if offset == total => return Ok(resp),
                    other => {
                        return Err(ReplicationError::Protocol {
                            node: self.target,
                            what: format!("an answer to a snapshot part: {other:?}"),
                        });
                    }
                }
            }
            Err(ReplicationError::Protocol {
                node: self.target,
                what: "no answer to a snapshot's last part".into(),
            })
        };
        // Biased: when both are ready the replication is closed either
        // way, and an unbiased select draws its order from the runtime's
        // unseeded generator.
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => result.map_err(streaming_error),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let answer = self
            .call(Request::TransferLeader(req), option.hard_ttl())
            .await;
        self.answer_of(answer, "a transfer", |reply| match reply {
            Reply::Transferred(resp) => Ok(resp),
            other => Err(other),
        })
    }
}

impl PeerNet {
    /// openraft's answer from the `answer` to one exchange about `what`:
    /// `take` accepts the reply of the right kind, or gives it back.
    fn answer_of<T>(
        &self,
        answer: Result<Reply, ReplicationError>,
        what: &str,
        take: impl FnOnce(Reply) -> Result<T, Reply>,
    ) -> Result<T, RPCError<TypeConfig>> {
        take(answer.map_err(rpc_error)?).map_err(|other| {
            rpc_error(ReplicationError::Protocol {
                node: self.target,
                what: format!("an answer to {what}: {other:?}"),
            })
        })
    }
}
