//! Writes: proposals on this node's Raft ([`propose_here`]), forwarded to
//! the leader when this node does not lead, and the session checks of
//! their answers.
//!
//! Owns the one path by which client commands enter the log; it must never
//! bypass admission (backpressure) or reorder the commands of a batch.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, Fatal, ForwardReason};

use super::{Node, NodeError};
use crate::types::{Command, Raft, Response, Session, TypeConfig};

/// Attempts of a proposal through leader changes.
const FORWARD_ATTEMPTS: usize = 20;
/// How soon a proposal refused by a leader without a quorum's ack yet
/// (`LeaseExpired`) is tried again.
const LEASE_POLL: Duration = Duration::from_millis(1);

/// Proposes `commands` on this node's Raft as one batch and waits for each
/// answer. The batch reaches the Raft core as one message
/// (`Raft::client_write_many`), so a leader gives the commands consecutive
/// log entries in this order; proposing them one by one, concurrently, let
/// them land in any order (issue 10, item 3). The one place where client
/// commands enter the log: the local write path comes here, and the
/// leader's side of forwarded proposals (`server`, many in flight on one
/// connection) and pipelined appends ([`Node::submit_batch`]) through its
/// two halves, [`submit_here`] and [`Submitted::wait`].
///
/// # Errors
/// Admission's refusals (nothing was proposed), and [`Submitted::wait`]'s.
pub(crate) async fn propose_here(
    raft: &Raft,
    admission: &crate::admission::Admission,
    commands: Vec<Command>,
) -> Result<CoreResults, NodeError> {
    submit_here(raft, admission, commands).await?.wait().await
}

/// What openraft answers each command of a batch.
type CoreResults = Vec<Result<Response, ClientWriteError<TypeConfig>>>;
/// The answers of a batch in openraft's core, pending.
type CoreWrite = Pin<Box<dyn Future<Output = Result<CoreResults, Fatal<TypeConfig>>> + Send>>;

/// A batch handed to this node's Raft core ([`submit_here`]), its answers
/// pending.
pub(crate) struct Submitted {
    raft: Raft,
    count: usize,
    answers: SubmittedAnswers,
}

enum SubmittedAnswers {
    /// Still coming, with the ring room held until they came.
    Pending(crate::admission::During<CoreWrite>),
    /// The core answered while the batch was handed over (it stopped).
    Done(Result<CoreResults, Fatal<TypeConfig>>),
}

/// The first half of [`propose_here`]: waits for room (admission) and
/// hands `commands` to the Raft core as one batch, returning once the core
/// holds it, so that a batch handed over next lands behind it in the log
/// (when this node leads throughout). [`Submitted::wait`] waits for the
/// answers; the room stays held until they came, even if the
/// [`Submitted`] is dropped (see [`Admitted::during`](crate::admission::Admitted::during)).
///
/// # Errors
/// As [`propose_here`]: admission's refusals (nothing was proposed).
pub(crate) async fn submit_here(
    raft: &Raft,
    admission: &crate::admission::Admission,
    commands: Vec<Command>,
) -> Result<Submitted, NodeError> {
    use futures::TryStreamExt;
    let count = commands.len();
    let admitted = admission.admit(&commands).await?;
    let core = raft.clone();
    let (handed_over, held) = tokio::sync::oneshot::channel::<()>();
    let write: CoreWrite = Box::pin(async move {
        let mut answers = core.client_write_many(commands).await?;
        let _ = handed_over.send(());
        let mut results = Vec::with_capacity(count);
        while let Some(result) = answers.try_next().await? {
            results.push(result.map(|written| written.response));
        }
        Ok(results)
    });
    let mut write = admitted.during(write);
    // Polled here until the core holds the batch. The write first: when it
    // ends at once (the core stopped), it must not be polled again.
    let answers = tokio::select! {
        biased;
        done = &mut write => SubmittedAnswers::Done(done),
        _ = held => SubmittedAnswers::Pending(write),
    };
    Ok(Submitted {
        raft: raft.clone(),
        count,
        answers,
    })
}

impl Submitted {
    /// The core's answer to each command of the batch, in order.
    ///
    /// # Errors
    /// [`NodeError::Stopped`] when Raft stopped. On a node that does not
    /// lead, every answer is `ForwardToLeader`.
    ///
    /// A leader refuses writes until a quorum acked it in its term
    /// (openraft's `LeaseExpired`): a moment after its election, or while
    /// it is cut off. openraft counts a quorum's ack from heartbeats only,
    /// and a new leader's first comes a heartbeat interval after its
    /// election: on such a refusal this asks for a heartbeat round at once,
    /// so that the caller's next try (a moment later, [`LEASE_POLL`]) finds
    /// the leader writable.
    pub(crate) async fn wait(self) -> Result<CoreResults, NodeError> {
        let results = match self.answers {
            SubmittedAnswers::Pending(write) => write.await,
            SubmittedAnswers::Done(done) => done,
        }
        .map_err(|fatal| NodeError::Stopped(fatal.to_string()))?;
        assert_eq!(
            results.len(),
            self.count,
            "openraft answers every command of a batch"
        );
        if let Some(Err(ClientWriteError::ForwardToLeader(f))) = results.first()
            && f.reason == ForwardReason::LeaseExpired
        {
            let _ = self.raft.trigger().heartbeat().await;
        }
        Ok(results)
    }
}

/// The commands of a batch of `records`, record `k` with seq
/// `session.seq + k`.
fn commands_of(session: Option<Session>, records: Vec<Vec<u8>>) -> Result<Vec<Command>, NodeError> {
    if let Some(s) = session
        && (s.seq < crate::types::FIRST_SEQ || s.seq.checked_add(records.len() as u64).is_none())
    {
        return Err(NodeError::Config(format!(
            "session seqs run from {} to u64::MAX; {} records from seq {} do not fit",
            crate::types::FIRST_SEQ,
            records.len(),
            s.seq
        )));
    }
    Ok(records
        .into_iter()
        .zip(0u64..)
        .map(|(data, k)| Command {
            session: session.map(|s| Session {
                client_id: s.client_id,
                seq: s.seq + k,
            }),
            data,
            control: None,
        })
        .collect())
}

/// A batch submitted by [`Node::submit_batch`], its answers pending.
#[must_use = "the batch may be in the log; its answers say where"]
pub struct InFlight {
    node: Node,
    commands: Vec<Command>,
    /// The first attempt, here: `None` for an empty batch.
    first: Option<FirstAttempt>,
    started: Instant,
}

/// A batch handed to this node's core, with the watch of the core's
/// metrics taken before it was (a change while it is answered is seen).
pub(super) struct FirstAttempt {
    submitted: Submitted,
    metrics: openraft::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>>,
}

impl InFlight {
    /// Waits until every record of the batch is committed and applied and
    /// returns one answer per record, in order, as
    /// [`Node::propose_batch`] does. A batch this node could not propose
    /// itself (it did not lead, or no longer does) is proposed now the way
    /// [`Node::propose_batch`] proposes: here if it leads by now, else
    /// forwarded to the leader.
    ///
    /// # Errors
    /// As [`Node::propose_batch`].
    pub async fn answers(self) -> Result<Vec<Response>, NodeError> {
        let metrics = self.node.inner.metrics.clone();
        let _in_flight = metrics.proposals_in_flight.track();
        self.finish().await
    }

    /// [`InFlight::answers`] without the in-flight gauge (its caller keeps
    /// it).
    async fn finish(self) -> Result<Vec<Response>, NodeError> {
        let InFlight {
            node,
            commands,
            first,
            started,
        } = self;
        if first.is_none() {
            return Ok(Vec::new());
        }
        let count = commands.len() as u64;
        let responses = node.write_anywhere(commands, first).await?;
        node.inner.metrics.commit_latency.observe(started.elapsed());
        node.inner.metrics.proposals.inc_by(count);
        Ok(responses)
    }
}

/// How a call forwarded to the leader ended ([`Node::leader_call`]).
pub(super) enum Forwarded {
    /// The leader's answer.
    Reply(crate::protocol::Reply),
    /// The leader could not be reached (no connection): nothing was sent.
    /// The caller may wait for another leader ([`Node::leader_other_than`])
    /// and send again.
    Unsent,
    /// Sent, but the connection failed before the answer: the outcome is
    /// unknown.
    Lost(String),
}

/// session's tag and two varints, the data's length).
const FORWARDED_COMMAND_OVERHEAD_BYTES: usize = 32;

/// The longest prefix of `commands` (at least one) that one forwarded
/// proposal carries: at most [`MAX_FORWARDED_COMMANDS`](crate::protocol::MAX_FORWARDED_COMMANDS)
/// commands, within one control message.
fn forward_piece(commands: &[Command]) -> &[Command] {
    let mut bytes = 0usize;
    let mut count = 0;
    for command in commands
        .iter()
        .take(crate::protocol::MAX_FORWARDED_COMMANDS)
    {
        bytes = bytes.saturating_add(command.data.len() + FORWARDED_COMMAND_OVERHEAD_BYTES);
        if count > 0 && bytes > crate::protocol::MAX_PART_BYTES {
            break;
        }
        count += 1;
    }
    &commands[..count]
}

/// The answers to `commands`, or the first error: an unknown outcome, or a
/// session's seq refused as out of order.
fn settled(
    commands: &[Command],
    results: impl IntoIterator<Item = Result<Response, NodeError>>,
) -> Result<Vec<Response>, NodeError> {
    commands
        .iter()
        .zip(results)
        .map(|(command, result)| {
            let response = result?;
            match (response.out_of_order, command.session) {
                (None, _) => Ok(response),
                (Some(expected), Some(s)) => Err(NodeError::OutOfOrder {
                    client_id: s.client_id,
                    seq: s.seq,
                    expected,
                }),
                (Some(_), None) => Err(NodeError::Unknown(format!(
                    "an out-of-order answer to a command without a session: {response}"
                ))),
            }
        })
        .collect()
}

impl Node {
    /// Appends `data`, waits until it is committed and applied, and returns
    /// its index and the state machine's answer. Concurrent proposals are
    /// batched by openraft. On a follower the proposal is forwarded to the
    /// leader; [`NodeError::NotLeader`] only when no leader can be reached.
    /// A full ring makes it wait for room ([`crate::admission`]); after
    /// [`NodeConfig::admission_wait_ms`](crate::NodeConfig::admission_wait_ms)
    /// it fails with [`NodeError::Busy`] (nothing was proposed: retry).
    pub async fn propose(&self, data: Vec<u8>) -> Result<(u64, Vec<u8>), NodeError> {
        let r = self.propose_batch(None, vec![data]).await?;
        let r = r.into_iter().next().expect("one answer per record");
        Ok((r.index, r.data))
    }

    /// Appends `data` in a client session: a retry with the same session is
    /// answered with the original result instead of being applied again, and
    /// a seq whose predecessor is not applied yet is refused with
    /// [`NodeError::OutOfOrder`] (see [`Session`]).
    pub async fn propose_in_session(
        &self,
        session: Session,
        data: Vec<u8>,
    ) -> Result<Response, NodeError> {
        let r = self.propose_batch(Some(session), vec![data]).await?;
        Ok(r.into_iter().next().expect("one answer per record"))
    }

    /// Appends `records` as one batch, waits until all are committed and
    /// applied, and returns one answer per record, in order. The batch
    /// reaches the Raft core as one message, so the records get consecutive
    /// log indexes in this order (a batch forwarded by a follower travels in
    /// pieces of at most [`MAX_FORWARDED_COMMANDS`](crate::protocol::MAX_FORWARDED_COMMANDS)
    /// records and about one control message of bytes, each committed
    /// before the next is sent: indexes then increase from piece to piece).
    /// With `session`, record `k` carries seq `session.seq + k`: retries are
    /// answered from the session table, and the records are applied only
    /// in seq order after the session's earlier seqs.
    ///
    /// # Errors
    /// [`NodeError::OutOfOrder`] when the session's earlier seqs were not
    /// applied yet (records before the refused one may have been applied:
    /// retry the whole batch with the same seqs); [`NodeError::Unknown`] when
    /// the outcome is unknown (retry with the same session);
    /// [`NodeError::NotLeader`] when no leader can be reached;
    /// [`NodeError::Config`] for a seq below [`FIRST_SEQ`](crate::types::FIRST_SEQ)
    /// or one that overflows.
    pub async fn propose_batch(
        &self,
        session: Option<Session>,
        records: Vec<Vec<u8>>,
    ) -> Result<Vec<Response>, NodeError> {
        let _in_flight = self.inner.metrics.proposals_in_flight.track();
        self.submit_batch(session, records).await?.finish().await
    }

    /// The first half of a pipelined [`Node::propose_batch`]: waits for
    /// room (admission) and, on a leader, hands the batch to the Raft core,
    /// returning once the core holds it; [`InFlight::answers`] waits for the
    /// answers. Batches submitted one after the other (each submitted
    /// before the next is) get log indexes in that order as long as this
    /// node leads throughout, without waiting for each other's commits:
    /// what a client that pipelines needs. A batch that this node finds it
    /// cannot propose (it does not lead) goes the way of
    /// [`Node::propose_batch`] (forwarded to the leader) when its answers
    /// are asked for: so ask in submission order. A session keeps the
    /// order through leader changes (a later batch that overtook an
    /// earlier one is refused as out of order, and retried).
    ///
    /// # Errors
    /// As [`Node::propose_batch`]; admission's refusals here (nothing was
    /// proposed), the others from [`InFlight::answers`].
    pub async fn submit_batch(
        &self,
        session: Option<Session>,
        records: Vec<Vec<u8>>,
    ) -> Result<InFlight, NodeError> {
        let commands = commands_of(session, records)?;
        let started = Instant::now();
        let first = if commands.is_empty() {
            None
        } else {
            let metrics = self.inner.raft.metrics();
            let submitted =
                submit_here(&self.inner.raft, &self.inner.admission, commands.clone()).await?;
            Some(FirstAttempt { submitted, metrics })
        };
        Ok(InFlight {
            node: self.clone(),
            commands,
            first,
            started,
        })
    }

    /// Proposes `commands` here when this node leads, else forwards them to
    /// the leader over the control plane (following leader changes a few
    /// times); answers in the commands' order. `first`: the first attempt
    /// here, already handed to the core ([`Node::submit_batch`]).
    pub(super) async fn write_anywhere(
        &self,
        commands: Vec<Command>,
        mut first: Option<FirstAttempt>,
    ) -> Result<Vec<Response>, NodeError> {
        let mut answered: Vec<Response> = Vec::with_capacity(commands.len());
        let mut last_error = None;
        let started = tokio::time::Instant::now();
        let patience = self.inner.config.lease_patience();
        let mut attempts = 0;
        while attempts < FORWARD_ATTEMPTS {
            attempts += 1;
            let rest = &commands[answered.len()..];
            let (results, mut metrics) = match first.take() {
                Some(first) => (first.submitted.wait().await?, first.metrics),
                None => {
                    // Before the proposal: a change while it is answered
                    // is seen.
                    let metrics = self.inner.raft.metrics();
                    let submitted =
                        propose_here(&self.inner.raft, &self.inner.admission, rest.to_vec());
                    (submitted.await?, metrics)
                }
            };
            let forward = match results.first() {
                Some(Err(ClientWriteError::ForwardToLeader(f))) => f.clone(),
                _ => {
                    let results = results
                        .into_iter()
                        .map(|r| r.map_err(|e| NodeError::Unknown(e.to_string())));
                    answered.extend(settled(rest, results)?);
                    return Ok(answered);
                }
            };
            let Some(leader) = forward.leader_id.filter(|l| *l != self.id()) else {
                // No leader yet (or one just elected here): wait until the
                // core's state moves on (an election ends, say), at most a
                // heartbeat interval. (Its metrics may still name the old
                // leader for a moment: they are no condition to wait for.)
                last_error = Some(NodeError::NotLeader {
                    leader_id: forward.leader_id,
                    leader_addr: forward.leader_node.as_ref().map(|n| n.addr.clone()),
                });
                if forward.reason == ForwardReason::LeaseExpired && started.elapsed() < patience {
                    // This node leads and waits for a quorum's ack (asked
                    // for): again in a moment, not counted as an attempt.
                    attempts -= 1;
                    tokio::time::sleep(LEASE_POLL).await;
                    continue;
                }
                let within = Duration::from_millis(self.inner.config.heartbeat_ms);
                let _ = tokio::time::timeout(within, metrics.changed()).await;
                continue;
            };
            // Forward the rest in pieces that fit a control message, one
            // after the other: each is applied before the next is sent, so
            // the order holds.
            while answered.len() < commands.len() {
                let piece = forward_piece(&commands[answered.len()..]);
                let request = crate::protocol::Request::Propose(piece.to_vec());
                let reply = match self.leader_call(leader, request).await? {
                    Forwarded::Reply(reply) => reply,
                    Forwarded::Unsent => {
                        last_error = Some(NodeError::NotLeader {
                            leader_id: Some(leader),
                            leader_addr: None,
                        });
                        self.leader_other_than(leader).await;
                        break;
                    }
                    // Sent, and the connection failed before the answer:
                    // a piece whose every command has a session is sent
                    // again (the session table answers what was applied;
                    // the client would retry it the same way), to the
                    // same leader or, when it is gone, the next one.
                    Forwarded::Lost(why) if piece.iter().all(|c| c.session.is_some()) => {
                        tracing::debug!(leader, %why, "a forwarded proposal's answer was lost; sending it again");
                        last_error = Some(NodeError::Unknown(why));
                        break;
                    }
                    Forwarded::Lost(why) => return Err(NodeError::Unknown(why)),
                };
                match reply {
                    crate::protocol::Reply::Proposed(answers) if answers.len() == piece.len() => {
                        let results = answers.into_iter().map(|a| a.map_err(NodeError::Unknown));
                        answered.extend(settled(piece, results)?);
                    }
                    // The leader knows no leader: it waits for a quorum's
                    // ack (elected a moment ago) or stands for election.
                    // Again in a moment, within the patience.
                    crate::protocol::Reply::NotLeader(None) if started.elapsed() < patience => {
                        last_error = Some(NodeError::NotLeader {
                            leader_id: Some(leader),
                            leader_addr: None,
                        });
                        attempts -= 1;
                        tokio::time::sleep(LEASE_POLL).await;
                        break;
                    }
                    crate::protocol::Reply::NotLeader(_) => {
                        last_error = Some(NodeError::NotLeader {
                            leader_id: Some(leader),
                            leader_addr: None,
                        });
                        self.leader_other_than(leader).await;
                        break;
                    }
                    other => {
                        return Err(NodeError::Unknown(format!("unexpected answer {other:?}")));
                    }
                }
            }
            if answered.len() == commands.len() {
                return Ok(answered);
            }
        }
        Err(last_error.unwrap_or(NodeError::NotLeader {
            leader_id: None,
            leader_addr: None,
        }))
    }

    /// One request to the leader `leader` over the control plane, on the
    /// least busy of the links to it, in flight beside the other calls there
    /// ([`super::links`], [`crate::network::Forwarder`]).
    pub(super) async fn leader_call(
        &self,
        leader: u64,
        request: crate::protocol::Request,
    ) -> Result<Forwarded, NodeError> {
        let addr = self
            .status()
            .members
            .get(&leader)
            .cloned()
            .ok_or(NodeError::NotLeader {
                leader_id: Some(leader),
                leader_addr: None,
            })?;
        let (_, link) = self.inner.leader_links.take(
            |(id, _)| *id == leader,
            |(_, link)| link.waiting(),
            || {
                let link = crate::network::Forwarder::spawn(
                    self.inner.net_ctx.clone(),
                    leader,
                    addr,
                    &self.inner.seeds,
                );
                (leader, link)
            },
        );
        let ttl = Duration::from_millis(self.inner.config.election_timeout_ms.1 * 10);
        Ok(match link.call(request, ttl).await {
            Ok(reply) => Forwarded::Reply(reply),
            Err(crate::network::ReplicationError::Unreachable { why, .. }) => {
                tracing::debug!(leader, %why, "the leader is unreachable");
                Forwarded::Unsent
            }
            Err(f) => Forwarded::Lost(format!("forwarding to the leader {leader}: {f}")),
        })
    }

    /// Waits until this node knows a leader other than `gone`, for at most
    /// three of the largest election timeouts (a lease and an election
    /// fit); returns at once when it already does. A forwarded call to a
    /// leader that cannot be reached (or that no longer leads) waits here
    /// instead of failing or sleeping a fixed time: the client's retry
    /// would only find the same leader again, and a fast failover
    /// ([`super::failover`]) takes milliseconds.
    pub(super) async fn leader_other_than(&self, gone: u64) {
        let wait = self.inner.config.lease_patience();
        let _ = self
            .inner
            .raft
            .wait(Some(wait))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != gone),
                "a leader other than the unreachable one",
            )
            .await;
    }
}
