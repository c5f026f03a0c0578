//! The openraft type configuration and the values that travel through the
//! log: commands, responses, client sessions.

use serde::{Deserialize, Serialize};

/// A client session for exactly-once, ordered appends: a retry carries the
/// same `(client_id, seq)` and is answered with the original result instead
/// of being applied again (Ongaro's dissertation §6.3), and a session's
/// commands are applied in `seq` order, like the records of Kafka's
/// idempotent producer: seq `n + 1` is applied only right after seq `n`.
/// One that reaches the log before its predecessor was applied (several in
/// flight, a retry through another leader) is not applied: its proposer
/// gets [`NodeError::OutOfOrder`](crate::NodeError::OutOfOrder) and retries
/// it once the earlier ones are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Session {
    /// The client's id, chosen at random by the client.
    pub client_id: u64,
    /// The command's number within the session: consecutive, from
    /// [`FIRST_SEQ`].
    pub seq: u64,
}

/// The first sequence number of a session.
pub const FIRST_SEQ: u64 = 1;

/// What a proposal puts into the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The client session, for exactly-once semantics; `None` for plain
    /// proposals.
    pub session: Option<Session>,
    /// The application's bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// `Some` for a command of the log itself, which the library applies
    /// and the application never sees (its `session` and `data` are then
    /// empty).
    pub control: Option<Control>,
}

impl Command {
    /// An application command.
    pub fn new(session: Option<Session>, data: Vec<u8>) -> Command {
        Command {
            session,
            data,
            control: None,
        }
    }
}

/// A command of the log itself, applied by the library on every node at
/// the same index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Retention: records below `before` are gone from the log, exactly
    /// from this entry on, on every node (`before` is cut to the trim's
    /// own index; a trim never moves the first retained index back).
    Trim {
        /// The first index kept.
        before: u64,
    },
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(Control::Trim { before }) = self.control {
            return write!(f, "trim(before {before})");
        }
        match self.session {
            Some(s) => write!(
                f,
                "command({} B, session {}#{})",
                self.data.len(),
                s.client_id,
                s.seq
            ),
            None => write!(f, "command({} B)", self.data.len()),
        }
    }
}

/// What applying a command returned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The log index the command was applied at (for a duplicate: the index
    /// of the original).
    pub index: u64,
    /// The application's answer.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// True when this was a retry answered from the session table.
    pub duplicate: bool,
    /// `Some(expected)` when the command was NOT applied because it came
    /// before its session's seq `expected` was applied (see [`Session`]);
    /// `index` is then the log entry that carried it. The node's API turns
    /// this into [`NodeError::OutOfOrder`](crate::NodeError::OutOfOrder):
    /// callers of [`Node`](crate::Node) never see it set.
    pub out_of_order: Option<u64>,
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "response(index {}, {} B{})",
            self.index,
            self.data.len(),
            match (self.duplicate, self.out_of_order) {
                (_, Some(expected)) => format!(", out of order: seq {expected} first"),
                (true, None) => ", duplicate".to_string(),
                (false, None) => String::new(),
            }
        )
    }
}

/// A node's address, as membership records it.
pub type NodeInfo = openraft::impls::BasicNode;

openraft::declare_raft_types!(
    /// ringraft's openraft type configuration: standard leader ids (a log id
    /// is a term and an index, which is what a ring record carries), and
    /// tokio with seeded randomness ([`crate::rt::Runtime`]: openraft's
    /// spawns and random draws must run inside a seed scope).
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = NodeInfo,
        Term = u64,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
        AsyncRuntime = crate::rt::Runtime,
);

/// A log id.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// The membership stored in the log.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// The raft handle.
pub type Raft = openraft::Raft<TypeConfig, crate::state_machine::SmStore>;

/// The term of a log id.
pub fn term_of(log_id: &LogId) -> u64 {
    log_id.leader_id.term
}

/// A log id from a term and an index.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new_term_index(term, index)
}
