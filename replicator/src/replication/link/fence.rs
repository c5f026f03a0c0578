//! Taking a follower's fence: READ the fence word, CAS it from the value
//! read to this leader's epoch (again while it moves below it), step down
//! when it holds a higher term, then ask for the grant, whose answer is
//! the view of the follower's ring.

use std::time::Instant;

use openraft::raft::AppendEntriesResponse;
use ringraft_transport::TransportError;
use ringraft_wal::{Epoch, FenceWord};

use super::{Answer, Expect, Fencing, Link, LinkEvent, Op, OpId, View};
use crate::protocol::{Reply, Request};
use crate::replication::ReplicationError;
use crate::replication::checks::check_data_area;
use crate::replication::checks::check_tail;
use crate::types::Vote;

impl Link {
    pub(super) fn read_fence(&mut self, epoch: Epoch) {
        let at = self.hello().expect("connected").fence.start();
        let op = self.new_op();
        self.ops.push_back(Op::Read { op, at });
        self.fencing = Fencing::Reading { epoch, op };
    }

    pub(super) fn on_read(
        &mut self,
        now: Instant,
        op: OpId,
        result: Result<Vec<u8>, TransportError>,
    ) {
        match self.fencing {
            Fencing::Reading { epoch, op: reading } if reading == op => {
                self.fencing = Fencing::Idle;
                match result {
                    Ok(bytes) => self.on_fence(epoch, &bytes),
                    Err(e) => self.fail(e.into()),
                }
                return;
            }
            _ => {}
        }
        if self.staged.as_ref().is_some_and(|s| s.reading == Some(op)) {
            match result {
                Ok(bytes) => self.on_head(now, &bytes),
                Err(e) => self.fail(e.into()),
            }
            return;
        }
        // A READ for a batch or a fence nobody waits for any more
        // (abandoned): only its failure matters, the connection's.
        if let Err(e) = result {
            self.fail(e.into());
        }
    }

    pub(super) fn on_fence(&mut self, epoch: Epoch, bytes: &[u8]) {
        let current = match FenceWord::from_bytes(bytes) {
            Ok(word) => word.epoch(),
            Err(e) => return self.fail(e.into()),
        };
        if current == epoch {
            self.post_grant(epoch);
        } else if current > epoch {
            // A leader of a higher term (or this term's real leader) holds
            // the fence: this one must step down.
            self.step_down(Vote::new(current.term(), current.leader_id()));
        } else {
            let at = self.hello().expect("connected").fence.start();
            let op = self.new_op();
            self.ops.push_back(Op::Cas {
                op,
                at,
                expect: FenceWord::new(current).to_word(),
                new: FenceWord::new(epoch).to_word(),
            });
            self.fencing = Fencing::Swapping {
                epoch,
                expect: current,
                op,
            };
        }
    }

    pub(super) fn on_cas(&mut self, op: OpId, result: Result<u64, TransportError>) {
        let Fencing::Swapping {
            epoch,
            expect,
            op: swapping,
        } = self.fencing
        else {
            unreachable!("a CAS is posted only while swapping, and waited for");
        };
        assert_eq!(swapping, op, "one CAS in flight at a time");
        self.fencing = Fencing::Idle;
        match result {
            Ok(found) if found == FenceWord::new(expect).to_word() => {
                self.events.push_back(LinkEvent::FenceTaken(epoch));
                self.post_grant(epoch);
            }
            // The fence moved between the READ and the CAS: read it again.
            Ok(_) => self.read_fence(epoch),
            Err(e) => self.fail(e.into()),
        }
    }

    /// Asks for the grant, with the deadline of the batch that waits for
    /// it (none: nobody waits any more, and nothing is asked).
    pub(super) fn post_grant(&mut self, epoch: Epoch) {
        let Some(deadline) = self.queue.front().map(|q| q.deadline) else {
            return;
        };
        self.fencing = Fencing::Granting { epoch };
        self.post(
            None,
            Request::Grant { epoch },
            Expect::Grant { epoch },
            deadline,
        );
    }

    /// A higher vote was found while the front batch was being fenced:
    /// it is answered with it (this leader steps down); the connection
    /// stays.
    pub(super) fn step_down(&mut self, higher: Vote) {
        self.fencing = Fencing::Idle;
        self.reset_view();
        if let Some(queued) = self.queue.pop_front() {
            self.answers.push_back((
                queued.ticket,
                Answer::Append(Ok(AppendEntriesResponse::HigherVote(higher))),
            ));
        }
    }

    pub(super) fn on_grant(&mut self, epoch: Epoch, reply: Reply) {
        assert!(
            matches!(self.fencing, Fencing::Granting { epoch: asked } if asked == epoch),
            "a grant's answer while asking for it"
        );
        self.fencing = Fencing::Idle;
        let capacity = self.hello().expect("connected").capacity;
        match reply {
            Reply::Granted { data, tail } => {
                if let Err(e) =
                    check_data_area(&data, capacity).and_then(|()| check_tail(&tail, capacity))
                {
                    return self.fail(self.protocol(format!("a bad grant: {e}")));
                }
                self.view = Some(View {
                    epoch,
                    data,
                    tail,
                    capacity,
                    awaiting_tail: false,
                });
            }
            Reply::NotFenced { fence } if fence > epoch => {
                self.step_down(Vote::new(fence.term(), fence.leader_id()));
            }
            Reply::NotFenced { fence } => self.fail(ReplicationError::Fenced {
                node: self.config.target,
                by: fence,
            }),
            other => self.fail(self.protocol(format!("an answer to a grant: {other:?}"))),
        }
    }
}
