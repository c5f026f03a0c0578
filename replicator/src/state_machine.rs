//! The user's state machine behind openraft's `RaftStateMachine`, with
//! client sessions (exactly-once appends) and durable snapshots.
//!
//! The application implements [`StateMachine`]: apply a batch of committed
//! commands, write a snapshot, restore from one. This module keeps, next to
//! it, what a replicated log needs: the last applied log id, the membership,
//! the session table, and the current snapshot, written atomically to
//! `<data dir>/snapshot` so that a restarted node recovers from snapshot +
//! ring.
//!
//! Sessions: a command tagged `(client_id, seq)` is applied only as its
//! session's next seq (seqs are consecutive from [`FIRST_SEQ`]), so one
//! client's commands are applied in the order it numbered them even when
//! several are in flight at once or a retry reaches the log through another
//! leader after a later seq (Kafka's idempotent producer keeps a producer's
//! order the same way). A seq already applied is answered from the table
//! with the original index and response instead of being applied again; a
//! seq that comes early (its predecessor not applied yet) is not applied
//! and is answered "out of order", which the proposer retries once the
//! earlier seqs are acknowledged (the entry stays in the log, applied as
//! nothing, like a blank entry). The table keeps the last
//! [`SESSION_WINDOW`] answers of each client and at most [`MAX_SESSIONS`]
//! clients (least recently active evicted first: a forgotten session's
//! next seq is out of order, so its client must start a new session); it
//! is part of every snapshot, so every replica decides alike.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::watch;

use crate::types::{
    Command, Control, Entry, FIRST_SEQ, LogId, Response, Session, SnapshotMeta, StoredMembership,
    TypeConfig,
};

/// Answers remembered per client.
pub const SESSION_WINDOW: usize = 1024;
/// Clients remembered.
pub const MAX_SESSIONS: usize = 100_000;
/// Largest snapshot accepted from the network or a file.
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;
/// Name of the snapshot file in a data directory.
pub const SNAPSHOT_FILE: &str = "snapshot";

/// One committed command handed to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied<'a> {
    /// Its log index.
    pub index: u64,
    /// The term of its entry.
    pub term: u64,
    /// The command's bytes.
    pub data: &'a [u8],
}

/// The application's state machine.
pub trait StateMachine: Send + 'static {
    /// Applies committed commands, in log order, and returns one answer per
    /// command, in the same order.
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>>;
    /// A serialized copy of the whole state.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the whole state with a snapshot's.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ClientSession {
    /// seq -> (index, answer) of the last seqs applied (consecutive, at most
    /// [`SESSION_WINDOW`]).
    answers: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Lowest seq that may still be answered (older ones were evicted).
    floor: u64,
    /// Index of the last command of this client, for eviction order.
    last_index: u64,
}

impl ClientSession {
    /// The highest seq applied: every seq up to it was applied, in order.
    fn last_seq(&self) -> u64 {
        self.answers
            .keys()
            .next_back()
            .copied()
            .unwrap_or(self.floor.saturating_sub(1))
    }
}

/// What the session table makes of a command `(client_id, seq)`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum SeqCheck {
    /// The session's next seq: apply it.
    Next,
    /// Applied before: the remembered answer (index 0 and no data once it
    /// fell out of the window).
    Duplicate(Response),
    /// An earlier seq of the session is not applied yet: `expected` is the
    /// one it waits for.
    Early {
        /// The session's next seq.
        expected: u64,
    },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Sessions {
    /// By client id, ordered: a snapshot's bytes and the eviction's choice
    /// between equals do not depend on a hasher's random keys (the
    /// encoding is a map either way: snapshots of a `HashMap` still read).
    clients: BTreeMap<u64, ClientSession>,
}

impl Sessions {
    /// What to do with `(client_id, seq)`.
    fn check(&self, client_id: u64, seq: u64) -> SeqCheck {
        let Some(c) = self.clients.get(&client_id) else {
            return if seq == FIRST_SEQ {
                SeqCheck::Next
            } else {
                SeqCheck::Early {
                    expected: FIRST_SEQ,
                }
            };
        };
        let last = c.last_seq();
        if seq > last {
            // `seq > last`, so `last + 1` does not overflow.
            let expected = last + 1;
            return if seq == expected {
                SeqCheck::Next
            } else {
                SeqCheck::Early { expected }
            };
        }
        // Applied before. Below the window (or, in a table written before
        // sessions were ordered, a seq skipped then): its answer is gone.
        let (index, data) = c.answers.get(&seq).cloned().unwrap_or_default();
        SeqCheck::Duplicate(Response {
            index,
            data,
            duplicate: true,
            out_of_order: None,
        })
    }

    /// Records that `(client_id, seq)`, the session's next seq, was applied
    /// at `index` (its answer is set by [`Sessions::answer`]).
    fn record(&mut self, client_id: u64, seq: u64, index: u64) {
        debug_assert_eq!(self.check(client_id, seq), SeqCheck::Next);
        let c = self.clients.entry(client_id).or_default();
        c.answers.insert(seq, (index, Vec::new()));
        c.last_index = index;
        while c.answers.len() > SESSION_WINDOW {
            let (oldest, _) = c.answers.pop_first().expect("non-empty");
            c.floor = oldest + 1;
        }
        if self.clients.len() > MAX_SESSIONS {
            // Evict the least recently active client.
            if let Some((&victim, _)) = self.clients.iter().min_by_key(|(_, c)| c.last_index) {
                self.clients.remove(&victim);
            }
        }
    }

    /// Sets the answer of a recorded seq (if still remembered).
    fn answer(&mut self, client_id: u64, seq: u64, data: &[u8]) {
        if let Some((_, answer)) = self
            .clients
            .get_mut(&client_id)
            .and_then(|c| c.answers.get_mut(&seq))
        {
            *answer = data.to_vec();
        }
    }
}

/// Which of the log's entries are records the application applied: the
/// log is the data (a replicated log serves reads from it), so the state
/// machine only remembers what the log alone does not say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Retention {
    /// The first index kept: entries below it were trimmed, on every node
    /// at the same log index ([`Control::Trim`]).
    pub(crate) first: u64,
    /// Indexes at or above `first` of application commands that were not
    /// applied (a session's duplicate or early seq): a read skips them.
    pub(crate) skipped: BTreeSet<u64>,
}

impl Retention {
    /// Applies a trim carried by the entry at `index`: never back, never
    /// past the trim itself.
    fn trim(&mut self, before: u64, index: u64) {
        let first = before.min(index).max(self.first);
        self.first = first;
        self.skipped = self.skipped.split_off(&first);
    }
}

/// What a snapshot file and a snapshot transfer hold.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    meta: SnapshotMeta,
    sessions: Sessions,
    retention: Retention,
    #[serde(with = "serde_bytes")]
    state: Vec<u8>,
}

struct Inner {
    user: Box<dyn StateMachine>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    sessions: Sessions,
    retention: Retention,
    /// The current snapshot: its metadata and its encoded body.
    current: Option<(SnapshotMeta, Vec<u8>)>,
    dir: Option<PathBuf>,
    watches: Arc<Watches>,
}

/// What readers of the log wait on.
struct Watches {
    /// The last applied index (0 before any).
    applied: watch::Sender<u64>,
    /// The first index kept ([`Retention::first`]).
    first: watch::Sender<u64>,
}

impl Inner {
    /// Tells the watchers where applying and retention stand.
    fn publish(&self) {
        let applied = self.last_applied.map_or(0, |l| l.index);
        self.watches.applied.send_if_modified(|v| {
            let changed = *v != applied;
            *v = applied;
            changed
        });
        let first = self.retention.first;
        self.watches.first.send_if_modified(|v| {
            let changed = *v != first;
            *v = first;
            changed
        });
    }
}

/// openraft's view of the state machine; clones share it.
#[derive(Clone)]
pub struct SmStore {
    inner: Arc<Mutex<Inner>>,
    watches: Arc<Watches>,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn decode_body(bytes: &[u8]) -> io::Result<SnapshotBody> {
    // Bounded by what the bytes can hold, not only by the 4 GiB limit: a
    // short body claiming a huge string must not allocate it.
    let (body, used): (SnapshotBody, usize) =
        ringraft_transport::bounded::decode(bytes, MAX_SNAPSHOT_BYTES as usize).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad snapshot: {e}"))
        })?;
    if used != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "trailing bytes in a snapshot",
        ));
    }
    Ok(body)
}

impl SmStore {
    /// Wraps `user`, restoring the snapshot of `dir` (when given and
    /// present).
    pub fn open(mut user: Box<dyn StateMachine>, dir: Option<&Path>) -> io::Result<SmStore> {
        let watches = Arc::new(Watches {
            applied: watch::channel(0).0,
            first: watch::channel(0).0,
        });
        let mut inner = Inner {
            user: Box::new(Unset),
            last_applied: None,
            membership: StoredMembership::default(),
            sessions: Sessions::default(),
            retention: Retention::default(),
            current: None,
            dir: dir.map(Path::to_path_buf),
            watches: watches.clone(),
        };
        if let Some(dir) = dir {
            let path = dir.join(SNAPSHOT_FILE);
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let body = decode_body(&bytes)
                        .map_err(|e| io_err(format!("{}: {e}", path.display())))?;
                    user.restore(&body.state)
                        .map_err(|e| io_err(format!("{}: {e}", path.display())))?;
                    inner.last_applied = body.meta.last_log_id;
                    inner.membership = body.meta.last_membership.clone();
                    inner.sessions = body.sessions;
                    inner.retention = body.retention;
                    inner.current = Some((body.meta, bytes));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(format!("{}: {e}", path.display()))),
            }
        }
        inner.user = user;
        inner.publish();
        Ok(SmStore {
            inner: Arc::new(Mutex::new(inner)),
            watches,
        })
    }

    /// A watch of the last applied index.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.watches.applied.subscribe()
    }

    /// A watch of the first index kept: records below it were trimmed.
    pub fn watch_first(&self) -> watch::Receiver<u64> {
        self.watches.first.subscribe()
    }

    /// The first index kept, the last applied index, and which indexes in
    /// `from..=to` hold application commands that were not applied.
    pub(crate) async fn read_view(&self, from: u64, to: u64) -> (u64, u64, BTreeSet<u64>) {
        let inner = self.inner.lock().await;
        let skipped = if from <= to {
            inner.retention.skipped.range(from..=to).copied().collect()
        } else {
            BTreeSet::new()
        };
        (
            inner.retention.first,
            inner.last_applied.map_or(0, |l| l.index),
            skipped,
        )
    }

    /// Runs `f` on the application's state machine (for reads).
    pub async fn read<T>(&self, f: impl FnOnce(&dyn StateMachine) -> T) -> T {
        let inner = self.inner.lock().await;
        f(inner.user.as_ref())
    }

    /// The last applied log id.
    pub async fn last_applied(&self) -> Option<LogId> {
        self.inner.lock().await.last_applied
    }
}

/// Placeholder while the real state machine is being restored.
struct Unset;
impl StateMachine for Unset {
    fn apply(&mut self, _: &[Applied<'_>]) -> Vec<Vec<u8>> {
        unreachable!("placeholder state machine")
    }
    fn snapshot(&self) -> Vec<u8> {
        unreachable!("placeholder state machine")
    }
    fn restore(&mut self, _: &[u8]) -> Result<(), String> {
        unreachable!("placeholder state machine")
    }
}

fn store_file(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// A batch sorted by [`Inner::apply_entries`]: the answers known so far
/// (by position), the commands for the application (position, index, term,
/// command), the sessions' seqs applied in this batch (to their position in
/// `fresh`) and retries of those (position, position in `fresh`).
struct Sorted<'a> {
    answers: Vec<Option<Response>>,
    fresh: Vec<(usize, u64, u64, &'a Command)>,
    in_batch: HashMap<Session, usize>,
    retries: Vec<(usize, usize)>,
}

impl Inner {
    /// Applies committed entries, in log order, and returns one answer per
    /// entry. Every new command goes to the application in one call; a
    /// session's seq that was applied before is answered from the table, and
    /// one that comes before its predecessor is answered out of order and
    /// not applied (module docs).
    fn apply_entries(&mut self, batch: &[Entry]) -> io::Result<Vec<Response>> {
        let mut sorted = Sorted {
            answers: Vec::with_capacity(batch.len()),
            fresh: Vec::new(),
            in_batch: HashMap::new(),
            retries: Vec::new(),
        };
        for (k, entry) in batch.iter().enumerate() {
            let answer = self.sort_entry(k, entry, &mut sorted);
            sorted.answers.push(answer);
        }
        let Sorted {
            mut answers,
            fresh,
            retries,
            ..
        } = sorted;
        self.apply_fresh(&fresh, &mut answers)?;
        for (k, f) in retries {
            let original = answers[fresh[f].0].clone().expect("answered above");
            answers[k] = Some(Response {
                duplicate: true,
                ..original
            });
        }
        if let Some(entry) = batch.last() {
            self.last_applied = Some(entry.log_id);
        }
        self.publish();
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every entry answered"))
            .collect())
    }

    /// The answer to entry `k` of a batch when it needs no application
    /// call (a trim, a membership, a blank entry, a session's duplicate or
    /// early seq); `None` for a command that goes to the application
    /// (queued in `sorted.fresh`) or a retry of one in this batch.
    fn sort_entry<'a>(
        &mut self,
        k: usize,
        entry: &'a Entry,
        sorted: &mut Sorted<'a>,
    ) -> Option<Response> {
        let index = entry.log_id.index;
        match &entry.payload {
            EntryPayload::Normal(Command {
                control: Some(Control::Trim { before }),
                ..
            }) => {
                self.retention.trim(*before, index);
                Some(Response {
                    index,
                    data: self.retention.first.to_le_bytes().to_vec(),
                    ..Response::default()
                })
            }
            EntryPayload::Normal(cmd) => match cmd.session {
                None => {
                    let term = crate::types::term_of(&entry.log_id);
                    sorted.fresh.push((k, index, term, cmd));
                    None
                }
                Some(s) => match sorted.in_batch.get(&s) {
                    Some(&f) => {
                        self.retention.skipped.insert(index);
                        sorted.retries.push((k, f));
                        None
                    }
                    None => match self.sessions.check(s.client_id, s.seq) {
                        SeqCheck::Next => {
                            self.sessions.record(s.client_id, s.seq, index);
                            sorted.in_batch.insert(s, sorted.fresh.len());
                            let term = crate::types::term_of(&entry.log_id);
                            sorted.fresh.push((k, index, term, cmd));
                            None
                        }
                        SeqCheck::Duplicate(answer) => {
                            self.retention.skipped.insert(index);
                            Some(answer)
                        }
                        SeqCheck::Early { expected } => {
                            self.retention.skipped.insert(index);
                            Some(Response {
                                index,
                                out_of_order: Some(expected),
                                ..Response::default()
                            })
                        }
                    },
                },
            },
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                Some(Response {
                    index,
                    ..Response::default()
                })
            }
            EntryPayload::Blank => Some(Response {
                index,
                ..Response::default()
            }),
        }
    }

    /// Gives the batch's new commands to the application in one call and
    /// fills in their answers (recorded in their sessions).
    fn apply_fresh(
        &mut self,
        fresh: &[(usize, u64, u64, &Command)],
        answers: &mut [Option<Response>],
    ) -> io::Result<()> {
        let applied: Vec<Applied<'_>> = fresh
            .iter()
            .map(|&(_, index, term, cmd)| Applied {
                index,
                term,
                data: &cmd.data,
            })
            .collect();
        let results = if applied.is_empty() {
            Vec::new()
        } else {
            self.user.apply(&applied)
        };
        if results.len() != applied.len() {
            return Err(io_err(format!(
                "the state machine answered {} of {} commands",
                results.len(),
                applied.len()
            )));
        }
        for (&(k, index, _, cmd), data) in fresh.iter().zip(results) {
            if let Some(s) = cmd.session {
                self.sessions.answer(s.client_id, s.seq, &data);
            }
            answers[k] = Some(Response {
                index,
                data,
                ..Response::default()
            });
        }
        Ok(())
    }

    fn build(&mut self) -> io::Result<(SnapshotMeta, Vec<u8>)> {
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        let body = SnapshotBody {
            meta: meta.clone(),
            sessions: self.sessions.clone(),
            retention: self.retention.clone(),
            state: self.user.snapshot(),
        };
        let bytes =
            bincode::serde::encode_to_vec(&body, bincode::config::standard()).map_err(io_err)?;
        if let Some(dir) = &self.dir {
            store_file(dir, &bytes)?;
        }
        self.current = Some((meta.clone(), bytes.clone()));
        Ok((meta, bytes))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SmStore {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let mut inner = self.inner.lock().await;
        let (meta, snapshot) = inner.build()?;
        Ok(openraft::Snapshot { meta, snapshot })
    }
}

impl RaftStateMachine<TypeConfig> for SmStore {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = SmStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let inner = self.inner.lock().await;
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut inner = self.inner.lock().await;
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            batch.push(entry);
            responders.push(responder);
        }
        let answers = inner.apply_entries(&batch)?;
        drop(inner);
        for (responder, answer) in responders.into_iter().zip(answers) {
            if let Some(responder) = responder {
                responder.send(answer);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let body = decode_body(&snapshot)?;
        let mut inner = self.inner.lock().await;
        inner.user.restore(&body.state).map_err(io_err)?;
        inner.sessions = body.sessions;
        inner.retention = body.retention;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.publish();
        if let Some(dir) = &inner.dir {
            store_file(dir, &snapshot)?;
        }
        inner.current = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        let inner = self.inner.lock().await;
        Ok(inner
            .current
            .clone()
            .map(|(meta, snapshot)| openraft::Snapshot { meta, snapshot }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(index: u64, data: &[u8]) -> SeqCheck {
        SeqCheck::Duplicate(Response {
            index,
            data: data.to_vec(),
            duplicate: true,
            out_of_order: None,
        })
    }

    fn record(s: &mut Sessions, client_id: u64, seq: u64, index: u64, data: &[u8]) {
        s.record(client_id, seq, index);
        s.answer(client_id, seq, data);
    }

    #[test]
    fn sessions_answer_retries_and_forget_old_ones() {
        let mut s = Sessions::default();
        assert_eq!(s.check(1, 1), SeqCheck::Next);
        record(&mut s, 1, 1, 10, b"a");
        record(&mut s, 1, 2, 11, b"b");
        assert_eq!(s.check(1, 1), dup(10, b"a"));
        assert_eq!(s.check(1, 3), SeqCheck::Next);
        assert_eq!(s.check(2, 1), SeqCheck::Next);
        for seq in 3..(3 + SESSION_WINDOW as u64) {
            record(&mut s, 1, seq, 100 + seq, b"x");
        }
        // seq 1 and 2 fell out of the window: still known as applied.
        assert_eq!(s.check(1, 1), dup(0, b""));
        assert_eq!(s.check(1, 2), dup(0, b""));
        assert_eq!(
            s.check(1, 2 + SESSION_WINDOW as u64),
            dup(102 + SESSION_WINDOW as u64, b"x")
        );
    }

    /// Issue 10, item 3: one client's commands used to be applied in
    /// whatever order they reached the log (this test asserted that seq 4
    /// still applied after seq 5). A seq is now applied only right after its
    /// predecessor; an early one is refused with the seq the session waits
    /// for, and applies once its turn comes.
    #[test]
    fn a_sessions_seq_that_comes_early_waits_for_its_predecessor() {
        let mut s = Sessions::default();
        assert_eq!(s.check(7, 2), SeqCheck::Early { expected: 1 });
        assert_eq!(s.check(7, 0), SeqCheck::Early { expected: 1 });
        record(&mut s, 7, 1, 20, b"one");
        assert_eq!(s.check(7, 3), SeqCheck::Early { expected: 2 });
        assert_eq!(s.check(7, 2), SeqCheck::Next);
        record(&mut s, 7, 2, 22, b"two");
        assert_eq!(s.check(7, 3), SeqCheck::Next);
        assert_eq!(s.check(7, 1), dup(20, b"one"));
    }

    fn trim(index: u64, before: u64) -> Entry {
        Entry {
            log_id: crate::types::log_id(1, index),
            payload: EntryPayload::Normal(Command {
                session: None,
                data: Vec::new(),
                control: Some(Control::Trim { before }),
            }),
        }
    }

    /// Issue 11, items 4 and 5: the log is the data, so the state machine
    /// remembers only which entries a read must skip (a session's
    /// duplicates and early seqs) and where the log starts. A trim is
    /// applied like any entry: never back, never past itself, the same on
    /// every replica; the application never sees it; a snapshot carries it.
    #[test]
    fn trims_and_skipped_entries_are_state_the_snapshot_carries() {
        let log = Log::default();
        let applied = log.0.clone();
        let dir = tempfile::tempdir().unwrap();
        let sm = SmStore::open(Box::new(log), Some(dir.path())).unwrap();
        let mut first = sm.watch_first();
        {
            let mut inner = sm.inner.try_lock().unwrap();
            // seq 2 early (skipped), seq 1, seq 1 again (a duplicate, skipped).
            inner
                .apply_entries(&[entry(1, 5, 2), entry(2, 5, 1), entry(3, 5, 1)])
                .unwrap();
            assert_eq!(inner.retention.skipped, BTreeSet::from([1, 3]));
            let answers = inner
                .apply_entries(&[entry(4, 5, 2), trim(5, 3), trim(6, 100), trim(7, 2)])
                .unwrap();
            // Cut to the trim's own index; never back.
            let firsts: Vec<u64> = answers[1..]
                .iter()
                .map(|r| u64::from_le_bytes(r.data.as_slice().try_into().unwrap()))
                .collect();
            assert_eq!(firsts, vec![3, 6, 6]);
            assert_eq!(inner.retention.first, 6);
            assert!(
                inner.retention.skipped.is_empty(),
                "skips below the first index go"
            );
            inner.apply_entries(&[entry(8, 5, 2)]).unwrap();
            assert_eq!(inner.retention.skipped, BTreeSet::from([8]));
            inner.build().unwrap();
        }
        assert!(first.has_changed().unwrap());
        assert_eq!(*first.borrow_and_update(), 6);
        assert_eq!(*sm.watch_applied().borrow(), 8);
        // The application saw seq 1 and 2 once each, and no trim.
        assert_eq!(
            *applied.lock().unwrap(),
            vec![(2, b"seq 1".to_vec()), (4, b"seq 2".to_vec())]
        );
        // A node restarted from the snapshot file knows the same.
        let again = SmStore::open(Box::new(Log::default()), Some(dir.path())).unwrap();
        let inner = again.inner.try_lock().unwrap();
        assert_eq!(inner.retention.first, 6);
        assert_eq!(inner.retention.skipped, BTreeSet::from([8]));
        assert_eq!(*again.watch_first().borrow(), 6);
        assert_eq!(*again.watch_applied().borrow(), 8);
    }

    /// (index, command) in apply order.
    type AppliedCommands = Arc<std::sync::Mutex<Vec<(u64, Vec<u8>)>>>;

    /// A state machine that records what it applied.
    #[derive(Default)]
    struct Log(AppliedCommands);
    impl StateMachine for Log {
        fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
            let mut log = self.0.lock().unwrap();
            batch
                .iter()
                .map(|a| {
                    log.push((a.index, a.data.to_vec()));
                    format!("applied {}", a.index).into_bytes()
                })
                .collect()
        }
        fn snapshot(&self) -> Vec<u8> {
            Vec::new()
        }
        fn restore(&mut self, _: &[u8]) -> Result<(), String> {
            Ok(())
        }
    }

    fn entry(index: u64, client_id: u64, seq: u64) -> Entry {
        Entry {
            log_id: crate::types::log_id(1, index),
            payload: EntryPayload::Normal(Command {
                session: Some(Session { client_id, seq }),
                data: format!("seq {seq}").into_bytes(),
                control: None,
            }),
        }
    }

    /// Issue 10, item 3: the log holds seq 2 before seq 1 (two leaders, or a
    /// retry through another node), then seq 1, then seq 3 early again, the
    /// retry of seq 2, seq 3, and retries of seq 1 and 2: the application
    /// sees seq 1, 2, 3 in that order, once each.
    #[test]
    fn entries_apply_in_seq_order_whatever_order_they_reach_the_log() {
        let log = Log::default();
        let applied = log.0.clone();
        let sm = SmStore::open(Box::new(log), None).unwrap();
        let mut inner = sm.inner.try_lock().unwrap();
        let first = inner
            .apply_entries(&[entry(1, 9, 2), entry(2, 9, 1)])
            .unwrap();
        assert_eq!(first[0].out_of_order, Some(1), "{}", first[0]);
        assert_eq!(first[0].index, 1);
        assert_eq!(
            (first[1].index, first[1].out_of_order, first[1].duplicate),
            (2, None, false)
        );
        let second = inner
            .apply_entries(&[
                entry(3, 9, 3),
                entry(4, 9, 2),
                entry(5, 9, 3),
                entry(6, 9, 1),
                entry(7, 9, 2),
            ])
            .unwrap();
        let outcome: Vec<(u64, Option<u64>, bool, Vec<u8>)> = second
            .into_iter()
            .map(|r| (r.index, r.out_of_order, r.duplicate, r.data))
            .collect();
        assert_eq!(
            outcome,
            vec![
                (3, Some(2), false, vec![]),
                (4, None, false, b"applied 4".to_vec()),
                (5, None, false, b"applied 5".to_vec()),
                (2, None, true, b"applied 2".to_vec()),
                (4, None, true, b"applied 4".to_vec()),
            ]
        );
        assert_eq!(
            *applied.lock().unwrap(),
            vec![
                (2, b"seq 1".to_vec()),
                (4, b"seq 2".to_vec()),
                (5, b"seq 3".to_vec())
            ]
        );
        // A retry in the same batch as its original gets the original's answer.
        let third = inner
            .apply_entries(&[entry(8, 9, 4), entry(9, 9, 4)])
            .unwrap();
        assert_eq!((third[0].index, third[0].duplicate), (8, false));
        assert_eq!((third[1].index, third[1].duplicate), (8, true));
        assert_eq!(third[1].data, b"applied 8");
        assert_eq!(applied.lock().unwrap().len(), 4);
        assert_eq!(inner.last_applied, Some(crate::types::log_id(1, 9)));
    }
}
