//! openraft's storage traits ([`RaftLogReader`], [`RaftLogStorage`]) on
//! [`LogStore`]: thin glue onto the store's own methods.
//!
//! Owns the mapping of openraft's calls onto the store; it must never hold
//! a lock across I/O nor bypass the store's fencing and durability paths.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;

use openraft::OptionalSend;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};

use super::*;

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            std::ops::Bound::Included(i) => *i,
            std::ops::Bound::Excluded(i) => i + 1,
            std::ops::Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            std::ops::Bound::Included(i) => i.saturating_add(1),
            std::ops::Bound::Excluded(i) => *i,
            std::ops::Bound::Unbounded => u64::MAX,
        };
        self.read_entries(start, end)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.wal().meta().vote.map(|v| {
            let leader = v.voted_for.unwrap_or_default();
            if v.committed {
                Vote::new_committed(v.term, leader)
            } else {
                Vote::new(v.term, leader)
            }
        }))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let wal = self.wal();
        Ok(LogState {
            last_purged_log_id: wal.last_purged().map(to_log_id),
            last_log_id: wal.ring().last_log().or(wal.last_purged()).map(to_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let record = VoteRecord {
            term: vote.leader_id.term,
            voted_for: Some(vote.leader_id.voted_for),
            committed: vote.committed,
        };
        let previous_term = self.wal().meta().vote.map(|v| v.term);
        let term_advances = previous_term.is_none_or(|t| record.term > t);
        if term_advances {
            // Fencing: no remote writer keeps access across a term change.
            self.inner.guard.revoke()?;
        }
        self.save_meta(move |wal| Some(wal.vote_meta(record)))
            .await?;
        if term_advances {
            // Again once the vote is saved: a grant that checked the old
            // vote while it was being saved rotated after the first
            // revocation (grants refuse epochs below the vote's term).
            self.inner.guard.revoke()?;
        }
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // A hint in the ring's control block, not fsynced: on restart it is
        // only believed as far as the log reaches.
        self.wal()
            .ring()
            .set_commit_hint(committed.map(|c| c.index));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        let wal = self.wal();
        let ring = wal.ring();
        let Some(hint) = ring.commit_hint() else {
            return Ok(None);
        };
        let index = hint.min(ring.next_index().saturating_sub(1));
        Ok(wal.term_of(index).map(|term| log_id(term, index)))
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
        let entries: Vec<Entry> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.log_id.index) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let encoded = match self.append_entries(&entries).await {
            Ok(encoded) => encoded,
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        self.remember(entries, encoded);
        match self.inner.durability {
            // In shared memory: survives a killed process. The flusher
            // writes it to the segments later, unflushed.
            Durability::Memory => {
                self.wal().ring().mark_acked(last);
                self.changed(None);
                callback.io_completed(Ok(()));
            }
            // PLANTED BUG `ack-before-flush` (test-only): acknowledged
            // at once, the flush left to the flusher.
            #[cfg(feature = "planted-bugs")]
            Durability::Fsync if crate::planted::is_on(crate::planted::ACK_BEFORE_FLUSH) => {
                self.changed(None);
                callback.io_completed(Ok(()));
            }
            // Acknowledged once the flusher's flush covers it.
            Durability::Fsync => self.changed(Some(Waiter::Io(callback))),
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        // Whatever was prepared at the old tail no longer continues the
        // log: it will not be committed in place (`append_entries` writes
        // such entries locally).
        for pending in self.adoptions().pending.values_mut() {
            pending.clobbered = true;
        }
        // openraft's writes complete in order: the appends before this
        // truncation complete first.
        self.flushed().await?;
        let done = {
            let mut wal = self.wal();
            // The window first: whatever the wal does, it holds no entry
            // the log may have lost.
            self.recent().truncate_after(last_log_id.map(|l| l.index));
            wal.truncate_after(last_log_id.map(|l| pos(&l)))
                .map_err(io_err)?;
            self.queue_op(SegmentOp::TruncateAfter(last_log_id.map(|l| l.index)))
        };
        done.await.map_err(|_| io_err("the flusher stopped"))?
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        // The purge point is stored durably first (the metadata file), so
        // that the log never looks longer than it is after a crash.
        let upto = pos(&log_id);
        let purged = self.save_meta(move |wal| wal.purge_meta(upto)).await?;
        if purged {
            let mut wal = self.wal();
            wal.purge_ring(upto);
            self.recent().purge(log_id.index);
            // Whole segments below go when the flusher gets to it; reads
            // below the purge point are refused from now on.
            drop(self.queue_op(SegmentOp::RemoveBefore(log_id.index + 1)));
        }
        Ok(())
    }
}
