//! The client API's server: the gRPC service of `proto/ringraft/v1/log.proto`
//! over a [`ringraft::Node`]; records are read from the node's log.
//!
//! Input from clients is never trusted: sizes are checked against the
//! configured limits before anything is proposed, and every error is a
//! gRPC status with a message a user can act on.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use ringraft::{Node, NodeError, ReadConsistency, Session};
use tonic::{Request, Response, Status, Streaming};

use super::proto::log_server::Log;
// Requests of one AppendStream in flight at most: submitted, not answered
// (the API's figure, which the client keeps to as well). Their records are
// also held by admission's room in the ring.
use ringraft_client::client::PIPELINE_DEPTH;
use ringraft_client::proto::{
    AddLearnerRequest, AppendRequest, AppendResponse, Consistency, FollowRequest, Member,
    MembersRequest, MembersResponse, PromoteRequest, ReadRequest, Record, RemoveRequest,
    StatusRequest, StatusResponse, TransferLeaderRequest, TransferLeaderResponse, TrimRequest,
    TrimResponse,
};

/// Records in one Append.
pub const MAX_RECORDS_PER_APPEND: usize = 4096;
/// Bytes of records read from the log per message burst of a Read or
/// Follow (at least one record).
const STREAM_CHUNK_BYTES: u64 = 1 << 20;

/// The service.
pub struct LogService {
    node: Node,
    /// Largest record accepted, bytes.
    max_record: usize,
    fabric: String,
    durability: String,
}

impl LogService {
    /// A service over `node`.
    pub fn new(node: Node, max_record: usize, fabric: String, durability: String) -> LogService {
        LogService {
            node,
            max_record,
            fabric,
            durability,
        }
    }
}

/// Maps the node's errors to gRPC statuses.
pub fn status(e: NodeError) -> Status {
    match e {
        NodeError::NotLeader { leader_id, .. } => Status::unavailable(format!(
            "no reachable leader (last known: {leader_id:?}); try another node"
        )),
        e @ NodeError::NotMember(_) => Status::unavailable(e.to_string()),
        NodeError::Unknown(m) => {
            Status::unavailable(format!("outcome unknown, retry with the same session: {m}"))
        }
        NodeError::Timeout(m) => Status::deadline_exceeded(m),
        NodeError::Stopped(m) => Status::unavailable(format!("node stopping: {m}")),
        NodeError::Config(m) => Status::invalid_argument(m),
        // Backpressure: nothing was proposed; the client retries.
        NodeError::Busy(m) => Status::unavailable(m),
        NodeError::TooLarge(m) => Status::invalid_argument(m),
        NodeError::Storage(m) | NodeError::Fabric(m) | NodeError::Raft(m) => Status::internal(m),
        // Retryable: the earlier seqs are on their way (or being retried).
        e @ NodeError::OutOfOrder { .. } => Status::aborted(e.to_string()),
        e @ NodeError::Trimmed { .. } => Status::out_of_range(e.to_string()),
        // Not retried by the client: a full disk needs an operator.
        NodeError::DiskFull(m) => Status::resource_exhausted(m),
    }
}

fn consistency(value: i32) -> Result<ReadConsistency, Status> {
    match Consistency::try_from(value) {
        Ok(Consistency::Linearizable) => Ok(ReadConsistency::Linearizable),
        Ok(Consistency::Lease) => Ok(ReadConsistency::Lease),
        Ok(Consistency::Stale) => Ok(ReadConsistency::Stale),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown consistency {value}"
        ))),
    }
}

/// The answer to a membership request: the members after it.
fn members_response(node: &Node) -> Response<MembersResponse> {
    Response::new(MembersResponse {
        members: members_of(node),
    })
}

/// The node's view if it leads. Membership requests are checked against
/// it here, not by Raft: Raft's refusal maps to a status that clients
/// retry until their deadline. Only the leader's membership is current (a
/// follower sends the client on to the leader).
fn leading(node: &Node) -> Option<ringraft::Status> {
    Some(node.status()).filter(|s| s.state == "Leader")
}

fn members_of(node: &Node) -> Vec<Member> {
    let s = node.status();
    s.members
        .iter()
        .map(|(id, addr)| Member {
            id: *id,
            addr: addr.clone(),
            voter: s.voters.contains(id),
        })
        .collect()
}

fn record(r: ringraft::LogRecord) -> Record {
    Record {
        index: r.index,
        term: r.term,
        data: r.data,
    }
}

type RecordStream = Pin<Box<dyn Stream<Item = Result<Record, Status>> + Send + 'static>>;
type AppendAnswers = Pin<Box<dyn Stream<Item = Result<AppendResponse, Status>> + Send + 'static>>;

/// The session of an Append request (none when `client_id` is 0), once its
/// records are checked against the limits.
fn checked_append(req: &AppendRequest, max_record: usize) -> Result<Option<Session>, Status> {
    if req.records.is_empty() {
        return Err(Status::invalid_argument("no records"));
    }
    if req.records.len() > MAX_RECORDS_PER_APPEND {
        return Err(Status::invalid_argument(format!(
            "{} records in one append (limit {MAX_RECORDS_PER_APPEND})",
            req.records.len()
        )));
    }
    if let Some((k, r)) = req
        .records
        .iter()
        .enumerate()
        .find(|(_, r)| r.len() > max_record)
    {
        return Err(Status::invalid_argument(format!(
            "record {k} is {} bytes, above --max-record {max_record}",
            r.len(),
        )));
    }
    if req.client_id == 0 {
        return Ok(None);
    }
    if req.first_seq < ringraft::types::FIRST_SEQ
        || req
            .first_seq
            .checked_add(req.records.len() as u64)
            .is_none()
    {
        return Err(Status::invalid_argument(format!(
            "first_seq {} with {} records: a session's sequence numbers run from {} without overflow",
            req.first_seq,
            req.records.len(),
            ringraft::types::FIRST_SEQ
        )));
    }
    Ok(Some(Session {
        client_id: req.client_id,
        seq: req.first_seq,
    }))
}

/// The answer to an Append from the node's answers to its records.
fn append_response(results: Vec<ringraft::Response>) -> Result<AppendResponse, Status> {
    let mut indexes = Vec::with_capacity(results.len());
    let mut duplicates = Vec::with_capacity(results.len());
    for r in results {
        if r.duplicate && r.index == 0 {
            return Err(Status::failed_precondition(
                "a retry older than the session's remembered window; its index is no longer known",
            ));
        }
        indexes.push(r.index);
        duplicates.push(r.duplicate);
    }
    Ok(AppendResponse {
        indexes,
        duplicates,
    })
}

/// Serves one AppendStream: each request is checked and submitted to the
/// node as it arrives ([`Node::submit_batch`], in arrival order, one at a
/// time), and the answers go out in the same order, each as soon as it and
/// those before it came. At most [`PIPELINE_DEPTH`] requests are in flight:
/// beyond that, the client's next request waits in the stream (its flow
/// control). A request that fails (its check, its submission or its
/// answer) ends the stream with its status after the answers before it;
/// requests submitted after it are left to commit or not (their room is
/// held until the node answered them), which the client learns on retry
/// from the session table. Ends when the client's stream ends and every
/// request was answered, or when the client goes away.
async fn pipeline(
    node: Node,
    max_record: usize,
    mut input: Streaming<AppendRequest>,
    answers: tokio::sync::mpsc::Sender<Result<AppendResponse, Status>>,
) {
    type Pending = Pin<Box<dyn Future<Output = Result<Vec<ringraft::Response>, NodeError>> + Send>>;
    type Submitting = Pin<Box<dyn Future<Output = Result<ringraft::InFlight, NodeError>> + Send>>;
    let mut in_flight: VecDeque<Pending> = VecDeque::new();
    let mut submitting: Option<Submitting> = None;
    // The session of the stream and the seq its next request must start at.
    let mut next: Option<(u64, u64)> = None;
    let mut reading = true;
    // A request that failed before it was submitted: reported once the
    // requests before it are answered.
    let mut refused: Option<Status> = None;
    loop {
        let can_read = reading
            && refused.is_none()
            && submitting.is_none()
            && in_flight.len() < PIPELINE_DEPTH;
        if in_flight.is_empty() && submitting.is_none() && !can_read {
            break;
        }
        tokio::select! {
            // The oldest request's answer first: it frees room, and a
            // client waits for it.
            biased;
            answer = async { in_flight.front_mut().expect("checked").as_mut().await }, if !in_flight.is_empty() => {
                in_flight.pop_front();
                let answer = answer.map_err(status).and_then(append_response);
                let failed = answer.is_err();
                if answers.send(answer).await.is_err() || failed {
                    return;
                }
            }
            submitted = async { submitting.as_mut().expect("checked").as_mut().await }, if submitting.is_some() => {
                submitting = None;
                match submitted {
                    Ok(batch) => in_flight.push_back(Box::pin(batch.answers())),
                    Err(e) => refused = Some(status(e)),
                }
            }
            request = input.message(), if can_read => match request {
                Ok(Some(req)) => match checked_stream_append(&req, max_record, &mut next) {
                    Ok(session) => {
                        let node = node.clone();
                        submitting = Some(Box::pin(async move {
                            node.submit_batch(Some(session), req.records).await
                        }));
                    }
                    Err(why) => refused = Some(why),
                },
                Ok(None) => reading = false,
                // The client's side broke: it is gone, or will retry.
                Err(why) => {
                    tracing::debug!(%why, "an append stream's requests ended in an error");
                    reading = false;
                }
            },
        }
    }
    if let Some(why) = refused {
        let _ = answers.send(Err(why)).await;
    }
}

/// [`checked_append`] for a request of an AppendStream: with a session,
/// the stream's one, and seqs that go on from `next`'s (then moved on).
fn checked_stream_append(
    req: &AppendRequest,
    max_record: usize,
    next: &mut Option<(u64, u64)>,
) -> Result<Session, Status> {
    let Some(session) = checked_append(req, max_record)? else {
        return Err(Status::invalid_argument(
            "an append stream's requests carry a session (client_id not 0)",
        ));
    };
    if let Some((client_id, seq)) = *next
        && (client_id, seq) != (session.client_id, session.seq)
    {
        return Err(Status::invalid_argument(format!(
            "an append stream carries one session with seqs without gaps: expected client {client_id} seq {seq}, got client {} seq {}",
            session.client_id, session.seq
        )));
    }
    *next = Some((session.client_id, session.seq + req.records.len() as u64));
    Ok(session)
}

#[tonic::async_trait]
impl Log for LogService {
    async fn append(
        &self,
        request: Request<AppendRequest>,
    ) -> Result<Response<AppendResponse>, Status> {
        let req = request.into_inner();
        let session = checked_append(&req, self.max_record)?;
        // One batch: the records get consecutive indexes in request order,
        // after the session's earlier appends.
        let results = self
            .node
            .propose_batch(session, req.records)
            .await
            .map_err(status)?;
        append_response(results).map(Response::new)
    }

    type AppendStreamStream = AppendAnswers;

    async fn append_stream(
        &self,
        request: Request<Streaming<AppendRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let (answers, out) = tokio::sync::mpsc::channel(PIPELINE_DEPTH);
        tokio::spawn(pipeline(
            self.node.clone(),
            self.max_record,
            request.into_inner(),
            answers,
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    type ReadStream = RecordStream;

    async fn read(
        &self,
        request: Request<ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let req = request.into_inner();
        let consistency = consistency(req.consistency)?;
        if req.to != 0 && req.to < req.from {
            return Err(Status::invalid_argument(format!(
                "range {}..={} is empty",
                req.from, req.to
            )));
        }
        // Linearizable: confirm with the leader, wait until applied that far.
        self.node.read(consistency, |_| ()).await.map_err(status)?;
        let applied = *self.node.watch_applied().borrow();
        let to = if req.to == 0 {
            applied
        } else {
            req.to.min(applied)
        };
        // Below the first index held: an error before any record.
        let first = self
            .node
            .read_log(req.from, to, STREAM_CHUNK_BYTES)
            .await
            .map_err(status)?;
        let node = self.node.clone();
        let stream = futures::stream::unfold(Some(first), move |piece| {
            let node = node.clone();
            async move {
                let piece = piece?;
                let next = piece.next;
                let items: Vec<Result<Record, Status>> =
                    piece.records.into_iter().map(|r| Ok(record(r))).collect();
                let more = if next > to {
                    None
                } else {
                    match node.read_log(next, to, STREAM_CHUNK_BYTES).await {
                        Ok(piece) => Some(piece),
                        Err(e) => {
                            return Some((
                                futures::stream::iter([items, vec![Err(status(e))]].concat()),
                                None,
                            ));
                        }
                    }
                };
                Some((futures::stream::iter(items), more))
            }
        })
        .flatten();
        Ok(Response::new(Box::pin(stream)))
    }

    type FollowStream = RecordStream;

    async fn follow(
        &self,
        request: Request<FollowRequest>,
    ) -> Result<Response<Self::FollowStream>, Status> {
        let from = request.into_inner().from;
        let node = self.node.clone();
        // Below the first index held: an error before any record.
        node.read_log(from, 0, 0).await.map_err(status)?;
        let applied = node.watch_applied();
        let stream = futures::stream::unfold(Some(from), move |next| {
            let node = node.clone();
            let mut applied = applied.clone();
            async move {
                let mut next = next?;
                loop {
                    match node.read_log(next, u64::MAX, STREAM_CHUNK_BYTES).await {
                        Ok(piece) if !piece.records.is_empty() => {
                            let items: Vec<Result<Record, Status>> =
                                piece.records.into_iter().map(|r| Ok(record(r))).collect();
                            return Some((futures::stream::iter(items), Some(piece.next)));
                        }
                        Ok(piece) if piece.next > next => next = piece.next,
                        Ok(_) => {
                            // Wait for more (and wake up now and then: a
                            // client that went away is noticed when the send
                            // fails).
                            let _ = tokio::time::timeout(Duration::from_secs(1), applied.changed())
                                .await;
                        }
                        Err(e) => return Some((futures::stream::iter(vec![Err(status(e))]), None)),
                    }
                }
            }
        })
        .flatten();
        Ok(Response::new(Box::pin(stream)))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let s = self.node.status();
        let fence = self.node.log_store().fence();
        Ok(Response::new(StatusResponse {
            id: s.id,
            state: s.state.clone(),
            leader_id: s.leader_id.unwrap_or(0),
            leader_addr: s
                .leader_id
                .and_then(|l| s.members.get(&l).cloned())
                .unwrap_or_default(),
            term: s.term,
            commit_index: s.commit_index.unwrap_or(0),
            applied_index: s.applied_index.unwrap_or(0),
            last_log_index: s.last_log_index.unwrap_or(0),
            members: members_of(&self.node),
            fabric: self.fabric.clone(),
            durability: self.durability.clone(),
            votes_blocked: self.node.log_store().votes_blocked(),
            first_index: *self.node.watch_first_index().borrow(),
            fence_term: fence.term(),
            fence_leader: fence.leader_id(),
        }))
    }

    async fn members(
        &self,
        _: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        Ok(members_response(&self.node))
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let req = request.into_inner();
        if req.id == 0 || req.id > ringraft_wal::layout::MAX_NODE_ID {
            return Err(Status::invalid_argument(format!(
                "node id {} is not in 1..=65535",
                req.id
            )));
        }
        if req.addr.is_empty() || req.addr.len() > 256 {
            return Err(Status::invalid_argument("bad address"));
        }
        self.node
            .add_learner(req.id, req.addr)
            .await
            .map_err(status)?;
        Ok(members_response(&self.node))
    }

    async fn promote(
        &self,
        request: Request<PromoteRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let ids: std::collections::BTreeSet<u64> = request.into_inner().ids.into_iter().collect();
        if let Some(s) = leading(&self.node)
            && let Some(id) = ids.iter().find(|id| !s.members.contains_key(id))
        {
            return Err(Status::invalid_argument(format!(
                "node {id} is not a member; add it as a learner first"
            )));
        }
        self.node.promote(ids).await.map_err(status)?;
        Ok(members_response(&self.node))
    }

    async fn remove(
        &self,
        request: Request<RemoveRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let ids: std::collections::BTreeSet<u64> = request.into_inner().ids.into_iter().collect();
        if leading(&self.node).is_some_and(|s| s.voters.is_subset(&ids)) {
            return Err(Status::invalid_argument(
                "removing every voter would leave the cluster without a voter",
            ));
        }
        self.node.remove(ids).await.map_err(status)?;
        Ok(members_response(&self.node))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let to = request.into_inner().to;
        if !self.node.status().voters.contains(&to) {
            return Err(Status::invalid_argument(format!(
                "node {to} is not a voter"
            )));
        }
        self.node.transfer_leader(to).await.map_err(status)?;
        Ok(Response::new(TransferLeaderResponse {}))
    }

    async fn trim(&self, request: Request<TrimRequest>) -> Result<Response<TrimResponse>, Status> {
        let before = request.into_inner().before;
        let first_index = self.node.trim(before).await.map_err(status)?;
        Ok(Response::new(TrimResponse { first_index }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 10, item 2: a full ring's "busy" reaches clients as a status
    /// they retry (nothing was appended); a record that can never fit does
    /// not.
    #[test]
    fn busy_is_retryable_and_too_large_is_not() {
        let busy = status(NodeError::Busy("busy: the ring had no room".into()));
        assert_eq!(busy.code(), tonic::Code::Unavailable);
        assert!(busy.message().starts_with("busy"), "{}", busy.message());
        let large = status(NodeError::TooLarge("a command of 9 bytes".into()));
        assert_eq!(large.code(), tonic::Code::InvalidArgument);
    }
}
