//! Reads: of the state machine at a chosen consistency, of the applied
//! index, and of the log's records themselves ([`Node::read_log`]).
//!
//! Owns the read paths; it must never write to the log or the state
//! machine (a follower's read only waits for what the leader committed).

use std::time::Duration;

use openraft::ReadPolicy;
use openraft::error::RaftError;

use super::error::raft_error;
use super::propose::Forwarded;
use super::{Node, NodeError, ReadConsistency};
use crate::state_machine::StateMachine;
use crate::types::Command;

/// An application record, read back from the log ([`Node::read_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its log index.
    pub index: u64,
    /// The term of its entry.
    pub term: u64,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// A piece of the log ([`Node::read_log`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRead {
    /// The records applied in the range read, in index order (entries that
    /// carry none, such as blank, membership and trim entries or a
    /// session's duplicates, leave gaps).
    pub records: Vec<LogRecord>,
    /// Where the next read continues.
    pub next: u64,
    /// The last applied index when the read was made.
    pub applied: u64,
}

impl Node {
    /// linearizable or lease read asks the leader for its read index (the
    /// leader confirms its leadership first), waits until this node applied
    /// that far, then reads locally.
    pub async fn read<T>(
        &self,
        consistency: ReadConsistency,
        f: impl FnOnce(&dyn StateMachine) -> T,
    ) -> Result<T, NodeError> {
        let policy = match consistency {
            ReadConsistency::Stale => None,
            ReadConsistency::Linearizable => Some(ReadPolicy::ReadIndex),
            ReadConsistency::Lease => Some(ReadPolicy::LeaseRead),
        };
        if let Some(policy) = policy {
            self.confirm_read(policy).await?;
        }
        Ok(self.inner.sm.read(f).await)
    }

    /// Makes a read at `policy` safe here: on the leader, openraft confirms
    /// its leadership (or its lease; concurrent ReadIndex reads share its
    /// rounds); on a follower, the leader does and gives its read index, and
    /// this waits until it applied that far. A follower's concurrent reads
    /// share those calls ([`super::coalesce`]): a read that arrives while
    /// one is in flight joins the next, so the leader answers two calls
    /// for any number of reads, not one each.
    async fn confirm_read(&self, policy: ReadPolicy) -> Result<(), NodeError> {
        if self.confirm_here(policy.clone()).await?.is_none() {
            return Ok(());
        }
        let lease = policy == ReadPolicy::LeaseRead;
        let rounds = &self.inner.read_rounds[usize::from(lease)];
        match rounds.run(|| self.read_index(policy)).await? {
            None => Ok(()),
            Some(index) => {
                let timeout = Duration::from_millis(self.inner.config.election_timeout_ms.1 * 10);
                self.wait_applied(index, timeout).await
            }
        }
    }

    /// openraft's check of a read at `policy` here: `None` once it is safe
    /// (this node leads), else whom it names as the leader.
    async fn confirm_here(&self, policy: ReadPolicy) -> Result<Option<Option<u64>>, NodeError> {
        match self.inner.raft.ensure_linearizable(policy).await {
            Ok(_) => Ok(None),
            Err(RaftError::APIError(openraft::error::LinearizableReadError::ForwardToLeader(
                fwd,
            ))) => Ok(Some(fwd.leader_id)),
            Err(other) => Err(raft_error(other)),
        }
    }

    /// A read index at `policy` from the leader (`None`: this node leads
    /// now and confirmed the read itself). A leader that cannot be reached
    /// is waited out ([`Node::leader_other_than`]) a few times.
    async fn read_index(&self, policy: ReadPolicy) -> Result<Option<u64>, NodeError> {
        const ATTEMPTS: usize = 3;
        let lease = policy == ReadPolicy::LeaseRead;
        let mut unreachable = None;
        for _ in 0..ATTEMPTS {
            let Some(leader) = self.confirm_here(policy.clone()).await? else {
                return Ok(None);
            };
            let leader = leader
                .filter(|l| *l != self.id())
                .ok_or(NodeError::NotLeader {
                    leader_id: leader,
                    leader_addr: None,
                })?;
            let request = crate::protocol::Request::ReadIndex { lease };
            let reply = match self.leader_call(leader, request).await? {
                Forwarded::Reply(reply) => reply,
                Forwarded::Unsent => {
                    unreachable = Some(leader);
                    self.leader_other_than(leader).await;
                    continue;
                }
                // A read index asks for nothing to be written: ask again.
                Forwarded::Lost(why) => {
                    tracing::debug!(leader, %why, "a read index's answer was lost; asking again");
                    unreachable = Some(leader);
                    continue;
                }
            };
            return match reply {
                crate::protocol::Reply::ReadIndex(index) => Ok(Some(index)),
                crate::protocol::Reply::NotLeader(l) => Err(NodeError::NotLeader {
                    leader_id: l,
                    leader_addr: None,
                }),
                other => Err(NodeError::Raft(format!("unexpected answer {other:?}"))),
            };
        }
        Err(NodeError::NotLeader {
            leader_id: unreachable,
            leader_addr: None,
        })
    }

    /// Waits until this node applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), NodeError> {
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .map(|_| ())
            .map_err(|e| NodeError::Timeout(e.to_string()))
    }

    /// Reads the application records in `from..=to` (cut to what this node
    /// applied), stopping once `max_bytes` of records were read (at least
    /// one entry is read when the range is not empty). The records come
    /// from the log itself (ring and segments): the state machine keeps
    /// none. A read at a consistency above stale first calls
    /// [`Node::read`].
    ///
    /// # Errors
    /// [`NodeError::Trimmed`] when `from` is below the first index this
    /// node holds; [`NodeError::Storage`] when the log cannot be read.
    pub async fn read_log(&self, from: u64, to: u64, max_bytes: u64) -> Result<LogRead, NodeError> {
        let (first, applied, _) = self.inner.sm.read_view(1, 0).await;
        let to = to.min(applied);
        let held = first.max(self.inner.store.first_index());
        if from < held {
            return Err(NodeError::Trimmed {
                index: from,
                first: held,
            });
        }
        if from > to {
            return Ok(LogRead {
                records: Vec::new(),
                next: from,
                applied,
            });
        }
        let entries = match self
            .inner
            .store
            .read_entries_within(from, to + 1, max_bytes)
        {
            Ok(entries) if entries.first().is_some_and(|e| e.log_id.index == from) => entries,
            // Purged since the check above.
            Ok(_) => {
                return Err(NodeError::Trimmed {
                    index: from,
                    first: self.inner.store.first_index(),
                });
            }
            Err(e) => {
                let first = self.inner.store.first_index();
                if from < first {
                    return Err(NodeError::Trimmed { index: from, first });
                }
                return Err(NodeError::Storage(format!("read {from}..={to}: {e}")));
            }
        };
        let last = entries.last().expect("non-empty").log_id.index;
        let (first, _, skipped) = self.inner.sm.read_view(from, last).await;
        if from < first {
            return Err(NodeError::Trimmed { index: from, first });
        }
        let records = entries
            .into_iter()
            .filter_map(|e| match e.payload {
                openraft::EntryPayload::Normal(Command {
                    data,
                    control: None,
                    ..
                }) if !skipped.contains(&e.log_id.index) => Some(LogRecord {
                    index: e.log_id.index,
                    term: crate::types::term_of(&e.log_id),
                    data,
                }),
                _ => None,
            })
            .collect();
        Ok(LogRead {
            records,
            next: last + 1,
            applied,
        })
    }

    /// A watch of the last applied index.
    pub fn watch_applied(&self) -> crate::watch::Receiver<u64> {
        self.inner.sm.watch_applied()
    }

    /// A watch of the first index kept (0 while nothing was trimmed).
    pub fn watch_first_index(&self) -> crate::watch::Receiver<u64> {
        self.inner.sm.watch_first()
    }
}
