//! The control plane's messages: what travels two-sided (SEND/RECV) between
//! nodes, next to the records a leader WRITEs one-sided into rings.
//!
//! Every connection has an initiator (a leader replicating, a candidate
//! asking for votes) and an acceptor. The initiator sends [`Request`]s; the
//! acceptor handles them in order and answers each with one [`Reply`] on the
//! same connection. Messages are bincode, at most
//! [`MAX_MESSAGE_BYTES`]; larger payloads (two-sided entry batches,
//! snapshots) are split into parts.
//!
//! What the acceptor reveals in the handshake, once the initiator proved the
//! cluster secret, is a [`Hello`]: its ids and the descriptors of its fence
//! and head words (never the data area: its rkey goes only to the fence
//! holder, in [`Reply::Granted`]).

use openraft::raft::{
    SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use ringraft_transport::RemoteRegion;
use ringraft_wal::Epoch;
use serde::{Deserialize, Serialize};

use crate::types::{LogId, SnapshotMeta, TypeConfig, Vote};

/// Largest control message, in bytes.
pub const MAX_MESSAGE_BYTES: u32 = 1 << 20;
/// Largest part of a split payload, in bytes (room left for the envelope).
pub const MAX_PART_BYTES: usize = (MAX_MESSAGE_BYTES as usize) - 4096;

/// What an acceptor reveals to an authenticated initiator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The cluster it belongs to.
    pub cluster_id: u64,
    /// Its node id.
    pub node_id: u64,
    /// Its fence word (remote READ and ATOMIC).
    pub fence: RemoteRegion,
    /// Its head word (remote READ).
    pub head: RemoteRegion,
    /// Its ring's data area capacity.
    pub capacity: u64,
    /// Its ring's incarnation (bumped at every open).
    pub incarnation: u64,
}

/// What an initiator reveals to an acceptor (after both proved the secret):
/// which cluster it belongs to. An acceptor refuses initiators of another
/// cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// The initiator's cluster.
    pub cluster_id: u64,
}

impl Join {
    /// The encoded application data of an initiator of `cluster_id`.
    pub fn bytes(cluster_id: u64) -> Vec<u8> {
        encode(&Join { cluster_id }).expect("a join encodes")
    }
}

/// The state of a follower's adopted log: where a leader writes next and the
/// chain the next record continues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tail {
    /// Logical offset of the next record.
    pub next_lsn: u64,
    /// Index the next entry must carry.
    pub next_index: u64,
    /// Term of the last entry.
    pub last_term: u64,
    /// Epoch of the last record.
    pub epoch: Epoch,
    /// The log is empty and was never purged.
    pub unanchored: bool,
    /// The follower's head (oldest byte still needed).
    pub head_lsn: u64,
}

impl Tail {
    /// The last log id this tail follows (`None` for an empty, unanchored
    /// log).
    pub fn last_log_id(&self) -> Option<LogId> {
        if self.unanchored {
            return None;
        }
        let index = self.next_index.checked_sub(1)?;
        Some(crate::types::log_id(self.last_term, index))
    }

    /// The chain state records written at this tail must continue.
    pub fn chain_tip(&self) -> ringraft_wal::ChainTip {
        ringraft_wal::ChainTip {
            next_index: self.next_index,
            last_term: self.last_term,
            epoch: self.epoch,
            unanchored: self.unanchored,
        }
    }
}

/// What an initiator asks.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum Request {
    /// "I hold your fence now (I CASed it to `epoch`): give me write access."
    Grant {
        /// The epoch the initiator wrote into the fence.
        epoch: Epoch,
    },
    /// AppendEntries, split into its metadata and how the entries travel.
    Append {
        /// The leader's vote.
        vote: Vote,
        /// The log id before the entries.
        prev_log_id: Option<LogId>,
        /// The leader's commit.
        leader_commit: Option<LogId>,
        /// The epoch the leader holds.
        epoch: Epoch,
        /// The entries.
        body: AppendBody,
    },
    /// A vote request.
    Vote(VoteRequest<TypeConfig>),
    /// A pre-vote request.
    PreVote(VoteRequest<TypeConfig>),
    /// A part of a snapshot.
    Snapshot {
        /// The leader's vote.
        vote: Vote,
        /// The snapshot's metadata.
        meta: SnapshotMeta,
        /// Offset of this part.
        offset: u64,
        /// Total size.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Leader transfer.
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// Commands a follower forwards to the leader (at most
    /// [`MAX_FORWARDED_COMMANDS`]).
    Propose(Vec<crate::types::Command>),
    /// The leader's read index, after it confirmed its leadership with a
    /// quorum (or, with `lease`, under its lease).
    ReadIndex {
        /// Use the leader's lease instead of a quorum round trip.
        lease: bool,
    },
}

/// Commands in one forwarded proposal.
pub const MAX_FORWARDED_COMMANDS: usize = 1024;

/// How the entries of an AppendEntries travel.
#[derive(Debug, Serialize, Deserialize)]
pub enum AppendBody {
    /// No entries (a heartbeat, or a probe).
    Empty,
    /// One-sided: already written into the acceptor's ring at
    /// `from_lsn..to_lsn`.
    Written {
        /// First byte.
        from_lsn: u64,
        /// One past the last byte.
        to_lsn: u64,
        /// Entries.
        count: u64,
        /// Last entry's log id.
        last: LogId,
    },
    /// Two-sided: part `part` of `parts` of the bincode of the entries.
    Inline {
        /// This part's number (from 0).
        part: u32,
        /// Parts in all.
        parts: u32,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
}

/// What an acceptor answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum Reply {
    /// Write access granted to the fence holder.
    Granted {
        /// The data area, with its new rkey.
        data: RemoteRegion,
        /// The adopted tail.
        tail: Tail,
    },
    /// Not granted or not appended: the fence is not the initiator's.
    NotFenced {
        /// The fence found.
        fence: Epoch,
    },
    /// A part of a split request was stored; send the next.
    PartStored,
    /// openraft's answer to an AppendEntries, and the tail after it.
    Appended {
        /// openraft's answer.
        response: openraft::raft::AppendEntriesResponse<TypeConfig>,
        /// The adopted tail.
        tail: Tail,
    },
    /// One-sided records were refused at adoption (nothing appended).
    Rejected {
        /// Why.
        reason: String,
        /// The adopted tail.
        tail: Tail,
    },
    /// openraft's answer to a (pre-)vote.
    Voted(VoteResponse<TypeConfig>),
    /// openraft's answer to a snapshot.
    Installed(SnapshotResponse<TypeConfig>),
    /// openraft's answer to a leader transfer.
    Transferred(TransferLeaderResponse<TypeConfig>),
    /// The answers to forwarded commands, one per command.
    Proposed(Vec<Result<crate::types::Response, String>>),
    /// The leader's read index.
    ReadIndex(u64),
    /// This node is not the leader (the one it knows, if any).
    NotLeader(Option<u64>),
    /// The request could not be handled.
    Error(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_MESSAGE_BYTES as usize }>()
}

/// Encodes a message.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(message, config()).map_err(|e| e.to_string())
}

/// Largest two-sided entry batch accepted, in bytes.
pub const MAX_INLINE_BATCH_BYTES: u64 = 256 << 20;

/// Encodes entries for a two-sided AppendEntries (the parts of
/// [`AppendBody::Inline`] put together).
pub fn encode_entries(entries: &[crate::types::Entry]) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(entries, bincode::config::standard()).map_err(|e| e.to_string())
}

/// Decodes the entries of a two-sided AppendEntries; bytes from the
/// network, so any error is reported.
pub fn decode_entries(bytes: &[u8]) -> Result<Vec<crate::types::Entry>, String> {
    let (entries, used): (Vec<crate::types::Entry>, usize) =
        ringraft_transport::bounded::decode(bytes, MAX_INLINE_BATCH_BYTES as usize)
            .map_err(|e| format!("malformed entries: {e}"))?;
    if used != bytes.len() {
        return Err("trailing bytes after the entries".into());
    }
    Ok(entries)
}

/// Decodes a message; bytes from the network, so any error is reported.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    let (message, used) = ringraft_transport::bounded::decode(bytes, MAX_MESSAGE_BYTES as usize)
        .map_err(|e| format!("malformed message: {e}"))?;
    if used != bytes.len() {
        return Err("trailing bytes after a message".into());
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let epoch = Epoch::new(5, 1).unwrap();
        let req = Request::Grant { epoch };
        let bytes = encode(&req).unwrap();
        let back: Request = decode(&bytes).unwrap();
        assert!(matches!(back, Request::Grant { epoch: e } if e == epoch));
        // The typed epoch travels as the integer it always was (the fence
        // word's value): the wire format did not change.
        let word =
            bincode::serde::encode_to_vec((0u32, epoch.0), bincode::config::standard()).unwrap();
        assert_eq!(bytes, word);
        assert!(decode::<Request>(&[0xff; 9]).is_err());
        assert!(decode::<Reply>(&[]).is_err());
        let tail = Tail {
            next_lsn: 640,
            next_index: 10,
            last_term: 3,
            epoch: Epoch::new(3, 2).unwrap(),
            unanchored: false,
            head_lsn: 0,
        };
        assert_eq!(tail.last_log_id(), Some(crate::types::log_id(3, 9)));
        let empty = Tail {
            unanchored: true,
            next_index: 0,
            last_term: 0,
            ..tail
        };
        assert_eq!(empty.last_log_id(), None);
    }
}
