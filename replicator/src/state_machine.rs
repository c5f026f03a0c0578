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
//! Sessions: a command tagged `(client_id, seq)` whose seq was already
//! applied is answered from the table with the original index and response
//! instead of being applied again. The table keeps the last
//! [`SESSION_WINDOW`] answers of each client and at most [`MAX_SESSIONS`]
//! clients (least recently active evicted first); it is part of every
//! snapshot, so every replica answers retries alike.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::types::{Command, LogId, Response, SnapshotMeta, StoredMembership, TypeConfig};

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
    /// seq -> (index, answer)
    answers: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Lowest seq that may still be answered (older ones were evicted).
    floor: u64,
    /// Index of the last command of this client, for eviction order.
    last_index: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Sessions {
    clients: HashMap<u64, ClientSession>,
}

impl Sessions {
    /// The remembered answer to a retry, or `None` for a new command.
    fn lookup(&self, client_id: u64, seq: u64) -> Option<Response> {
        let c = self.clients.get(&client_id)?;
        if let Some((index, data)) = c.answers.get(&seq) {
            return Some(Response {
                index: *index,
                data: data.clone(),
                duplicate: true,
            });
        }
        // Older than the window: it was applied (or abandoned by the client,
        // which only moves past a seq once it has an answer for it) but its
        // answer is gone. Seqs between remembered ones are NOT assumed
        // applied: one session's concurrent commands may commit out of order.
        (seq < c.floor).then(|| Response {
            index: 0,
            data: Vec::new(),
            duplicate: true,
        })
    }

    fn record(&mut self, client_id: u64, seq: u64, index: u64, data: &[u8]) {
        let c = self.clients.entry(client_id).or_default();
        c.answers.insert(seq, (index, data.to_vec()));
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
}

/// What a snapshot file and a snapshot transfer hold.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    meta: SnapshotMeta,
    sessions: Sessions,
    #[serde(with = "serde_bytes")]
    state: Vec<u8>,
}

struct Inner {
    user: Box<dyn StateMachine>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    sessions: Sessions,
    /// The current snapshot: its metadata and its encoded body.
    current: Option<(SnapshotMeta, Vec<u8>)>,
    dir: Option<PathBuf>,
}

/// openraft's view of the state machine; clones share it.
#[derive(Clone)]
pub struct SmStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn decode_body(bytes: &[u8]) -> io::Result<SnapshotBody> {
    let config = bincode::config::standard().with_limit::<{ MAX_SNAPSHOT_BYTES as usize }>();
    let (body, used): (SnapshotBody, usize) = bincode::serde::decode_from_slice(bytes, config)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad snapshot: {e}")))?;
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
        let mut inner = Inner {
            user: Box::new(Unset),
            last_applied: None,
            membership: StoredMembership::default(),
            sessions: Sessions::default(),
            current: None,
            dir: dir.map(Path::to_path_buf),
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
                    inner.current = Some((body.meta, bytes));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(format!("{}: {e}", path.display()))),
            }
        }
        inner.user = user;
        Ok(SmStore {
            inner: Arc::new(Mutex::new(inner)),
        })
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

impl Inner {
    fn build(&mut self) -> io::Result<(SnapshotMeta, Vec<u8>)> {
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        let body = SnapshotBody {
            meta: meta.clone(),
            sessions: self.sessions.clone(),
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
        // Gather the batch, then hand the application every new command at
        // once.
        let mut batch = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            batch.push((entry, responder));
        }
        let mut answers: Vec<Option<Response>> = Vec::with_capacity(batch.len());
        let mut fresh: Vec<(usize, (u64, u64), &Command)> = Vec::new();
        for (k, (entry, _)) in batch.iter().enumerate() {
            match &entry.payload {
                EntryPayload::Normal(cmd) => {
                    let dup = cmd
                        .session
                        .and_then(|s| inner.sessions.lookup(s.client_id, s.seq));
                    if dup.is_none() {
                        fresh.push((
                            k,
                            (entry.log_id.index, crate::types::term_of(&entry.log_id)),
                            cmd,
                        ));
                    }
                    answers.push(dup);
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    answers.push(Some(Response {
                        index: entry.log_id.index,
                        ..Response::default()
                    }));
                }
                EntryPayload::Blank => answers.push(Some(Response {
                    index: entry.log_id.index,
                    ..Response::default()
                })),
            }
        }
        // A retry may sit in the same batch as its original: apply only the
        // first of each (client, seq).
        let mut seen = std::collections::HashSet::new();
        let mut to_apply = Vec::new();
        for (k, index, cmd) in fresh {
            match cmd.session {
                Some(s) if !seen.insert((s.client_id, s.seq)) => {}
                _ => to_apply.push((k, index, cmd)),
            }
        }
        let applied: Vec<Applied<'_>> = to_apply
            .iter()
            .map(|(_, (index, term), cmd)| Applied {
                index: *index,
                term: *term,
                data: &cmd.data,
            })
            .collect();
        let results = if applied.is_empty() {
            Vec::new()
        } else {
            inner.user.apply(&applied)
        };
        if results.len() != applied.len() {
            return Err(io_err(format!(
                "the state machine answered {} of {} commands",
                results.len(),
                applied.len()
            )));
        }
        for ((k, (index, _), cmd), data) in to_apply.iter().zip(results) {
            if let Some(s) = cmd.session {
                inner.sessions.record(s.client_id, s.seq, *index, &data);
            }
            answers[*k] = Some(Response {
                index: *index,
                data,
                duplicate: false,
            });
        }
        for (k, (entry, _)) in batch.iter().enumerate() {
            if answers[k].is_none() {
                // The duplicate inside this batch: answer from the table now.
                if let EntryPayload::Normal(Command {
                    session: Some(s), ..
                }) = &entry.payload
                {
                    answers[k] = inner.sessions.lookup(s.client_id, s.seq);
                }
            }
        }
        if let Some((entry, _)) = batch.last() {
            inner.last_applied = Some(entry.log_id);
        }
        drop(inner);
        for ((_, responder), answer) in batch.into_iter().zip(answers) {
            if let Some(responder) = responder {
                responder.send(answer.unwrap_or_default());
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
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
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

    #[test]
    fn sessions_answer_retries_and_forget_old_ones() {
        let mut s = Sessions::default();
        assert!(s.lookup(1, 1).is_none());
        s.record(1, 1, 10, b"a");
        s.record(1, 2, 11, b"b");
        assert_eq!(
            s.lookup(1, 1).unwrap(),
            Response {
                index: 10,
                data: b"a".to_vec(),
                duplicate: true
            }
        );
        assert!(s.lookup(1, 3).is_none());
        assert!(s.lookup(2, 1).is_none());
        for seq in 3..(3 + SESSION_WINDOW as u64) {
            s.record(1, seq, 100 + seq, b"x");
        }
        // seq 1 and 2 fell out of the window: still known as applied.
        let old = s.lookup(1, 1).unwrap();
        assert!(old.duplicate && old.index == 0);
    }

    #[test]
    fn sessions_apply_one_clients_concurrent_commands_out_of_order() {
        let mut s = Sessions::default();
        // seq 5 committed before seq 4 (two proposals in flight at once):
        // seq 4 must still apply when it arrives.
        s.record(7, 5, 20, b"five");
        assert!(s.lookup(7, 4).is_none());
        s.record(7, 4, 21, b"four");
        assert_eq!(s.lookup(7, 4).unwrap().index, 21);
        assert_eq!(s.lookup(7, 5).unwrap().index, 20);
    }
}
