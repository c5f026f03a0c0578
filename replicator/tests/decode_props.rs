//! Property tests of the replicator's decoders of outside input, on stable
//! (`fuzz/` runs the same decoders under libFuzzer): the control plane's
//! messages (`protocol::decode`), inline entry batches (`decode_entries`),
//! ring record payloads (`log_store::decode_entry`) and snapshot bodies
//! (installed through openraft's `install_snapshot`). Arbitrary bytes and
//! mutated valid encodings never panic; valid encodings round-trip; what
//! decodes encodes to canonical bytes that decode to the same.
//!
//! Also the regression tests of what fuzzing found here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use proptest::prelude::*;
use ringraft::log_store::decode_entry;
use ringraft::protocol::{
    AppendBody, Hello, Join, Reply, Request, Tail, decode, decode_entries, encode, encode_entries,
};
use ringraft::types::{
    Command, Control, Entry, LogId, Response, Session, SnapshotMeta, StoredMembership, Vote, log_id,
};
use ringraft::{Applied, SmStore, StateMachine};
use ringraft_transport::RemoteRegion;
use ringraft_wal::Epoch;
use serde::Serialize;
use serde::de::DeserializeOwned;

// ---- the largest single allocation of this thread --------------------

/// The system allocator, noting the largest allocation each thread asks
/// for (the regression test of a decoder that allocates what a short input
/// claims).
struct Largest;

thread_local! {
    static LARGEST_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    let _ = LARGEST_BYTES.try_with(|largest| largest.set(largest.get().max(bytes)));
}

// SAFETY: every call goes to the system allocator unchanged; noting the
// size allocates nothing.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// The largest allocation `f` made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_BYTES.with(|largest| largest.set(0));
    let value = f();
    (value, LARGEST_BYTES.with(Cell::get))
}

// ---- helpers ------------------------------------------------------------

/// Decodes `bytes` as a `T`; if it decodes, checks that it encodes to
/// canonical bytes that decode and encode to the same bytes.
fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<Vec<u8>> {
    let message: T = decode(bytes).ok()?;
    let canonical = encode(&message).expect("what decoded within the limit encodes");
    let again: T = decode(&canonical).expect("canonical bytes decode");
    assert_eq!(encode(&again).unwrap(), canonical, "not a fixed point");
    Some(canonical)
}

/// `bytes` with byte `at` (mod its length) xored with `flip` and cut to
/// `keep` bytes (mod its length + 1): a mutated encoding.
fn mutate(bytes: &[u8], at: usize, flip: u8, keep: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if !out.is_empty() {
        let at = at % out.len();
        out[at] ^= flip;
    }
    out.truncate(keep % (bytes.len() + 1));
    out
}

fn session() -> impl Strategy<Value = Option<Session>> {
    proptest::option::of(
        (any::<u64>(), any::<u64>()).prop_map(|(client_id, seq)| Session { client_id, seq }),
    )
}

fn command() -> impl Strategy<Value = Command> {
    (
        session(),
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(session, data, trim)| Command {
            session,
            data,
            control: trim.map(|before| Control::Trim { before }),
        })
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec((any::<u64>(), proptest::option::of(command())), 0..8).prop_map(
        |items| {
            items
                .into_iter()
                .enumerate()
                .map(|(k, (term, command))| Entry {
                    log_id: log_id(term, 100 + k as u64),
                    payload: command.map_or(EntryPayload::Blank, EntryPayload::Normal),
                })
                .collect()
        },
    )
}

fn epoch(term: u64, leader: u64) -> Epoch {
    Epoch::new(term % (1 << 40), leader % (1 << 16)).expect("a small epoch")
}

fn region(addr: u64, len: u64, rkey: u32) -> RemoteRegion {
    RemoteRegion { addr, len, rkey }
}

fn tail(next_lsn: u64, next_index: u64, last_term: u64) -> Tail {
    Tail {
        next_lsn,
        next_index,
        last_term,
        epoch: epoch(last_term, 1),
        unanchored: next_index == 0,
        head_lsn: next_lsn / 2,
    }
}

/// A state machine whose state is the bytes of its last snapshot.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl StateMachine for Bytes {
    fn apply(&mut self, batch: &[Applied<'_>]) -> Vec<Vec<u8>> {
        batch
            .iter()
            .map(|a| a.index.to_le_bytes().to_vec())
            .collect()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.0 = snapshot.to_vec();
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Installs `body` (as received from a leader) on a fresh state machine,
/// applies `commands` after `last`, and builds a snapshot: `None` when
/// the body is refused.
fn install_and_rebuild(body: &[u8], last: LogId, commands: &[Command]) -> Option<Vec<u8>> {
    runtime().block_on(async {
        let mut store = SmStore::open(Box::new(Bytes::default()), None).unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(last),
            last_membership: StoredMembership::default(),
        };
        store.install_snapshot(&meta, body.to_vec()).await.ok()?;
        let entries: Vec<_> = commands
            .iter()
            .enumerate()
            .map(|(k, command)| {
                Ok((
                    Entry {
                        log_id: log_id(last.leader_id.term, last.index + 1 + k as u64),
                        payload: EntryPayload::Normal(command.clone()),
                    },
                    None,
                ))
            })
            .collect();
        store
            .apply(futures::stream::iter(entries))
            .await
            .expect("commands after an accepted snapshot apply");
        Some(store.build_snapshot().await.unwrap().snapshot)
    })
}

/// A snapshot body made by the real state machine after `commands`.
fn real_snapshot(commands: &[Command]) -> Vec<u8> {
    let empty = runtime().block_on(async {
        let mut store = SmStore::open(Box::new(Bytes(b"state".to_vec())), None).unwrap();
        store.build_snapshot().await.unwrap().snapshot
    });
    install_and_rebuild(&empty, log_id(2, 10), commands).expect("a built snapshot installs")
}

// ---- properties ---------------------------------------------------------

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_a_message_decoder(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        round_trip::<Request>(&bytes);
        round_trip::<Reply>(&bytes);
        round_trip::<Hello>(&bytes);
        round_trip::<Join>(&bytes);
    }

    #[test]
    fn valid_messages_round_trip_and_mutations_never_panic(
        term in any::<u64>(),
        index in any::<u64>(),
        leader in any::<u64>(),
        inline in proptest::collection::vec(any::<u8>(), 0..128),
        commands in proptest::collection::vec(command(), 0..4),
        reason in ".{0,40}",
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let vote = Vote::new(term, leader);
        let requests = [
            Request::Grant { epoch: epoch(term, leader) },
            Request::Append {
                vote,
                prev_log_id: Some(log_id(term, index)),
                leader_commit: None,
                epoch: epoch(term, leader),
                body: AppendBody::Inline { part: 0, parts: 1, bytes: inline.clone() },
            },
            Request::Append {
                vote,
                prev_log_id: None,
                leader_commit: Some(log_id(term, index)),
                epoch: epoch(term, leader),
                body: AppendBody::Written {
                    from_lsn: index,
                    to_lsn: index.saturating_add(64),
                    count: 1,
                    last: log_id(term, index),
                },
            },
            Request::Propose(commands.clone()),
            Request::ReadIndex { lease: term % 2 == 0 },
        ];
        let replies = [
            Reply::Granted { data: region(index, term, leader as u32), tail: tail(index, term, leader) },
            Reply::Rejected { reason: reason.clone(), tail: tail(term, index, leader) },
            Reply::Proposed(
                commands
                    .iter()
                    .map(|c| Ok(Response { index, data: c.data.clone(), ..Response::default() }))
                    .chain([Err(reason.clone())])
                    .collect(),
            ),
            Reply::NotLeader(Some(leader)),
        ];
        let hello = Hello {
            cluster_id: term,
            node_id: leader,
            fence: region(index, 8, 1),
            head: region(index.wrapping_add(64), 8, 1),
            capacity: 1 << 20,
            incarnation: index,
        };
        let mut encodings: Vec<(u8, Vec<u8>)> = Vec::new();
        encodings.extend(requests.iter().map(|r| (0, encode(r).unwrap())));
        encodings.extend(replies.iter().map(|r| (1, encode(r).unwrap())));
        encodings.push((2, encode(&hello).unwrap()));
        encodings.push((3, encode(&Join { cluster_id: term }).unwrap()));
        for (kind, bytes) in encodings {
            let canonical = match kind {
                0 => round_trip::<Request>(&bytes),
                1 => round_trip::<Reply>(&bytes),
                2 => round_trip::<Hello>(&bytes),
                _ => round_trip::<Join>(&bytes),
            };
            prop_assert_eq!(canonical.as_ref(), Some(&bytes), "a valid message re-encodes as sent");
            let mutated = mutate(&bytes, at, flip, keep);
            match kind {
                0 => { round_trip::<Request>(&mutated); }
                1 => { round_trip::<Reply>(&mutated); }
                2 => { round_trip::<Hello>(&mutated); }
                _ => { round_trip::<Join>(&mutated); }
            }
        }
        let back: Hello = decode(&encode(&hello).unwrap()).unwrap();
        prop_assert_eq!(back, hello);
    }

    #[test]
    fn entry_batches_round_trip_and_garbage_is_an_error(
        batch in entries(),
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let encoded = encode_entries(&batch).unwrap();
        let decoded = decode_entries(&encoded).unwrap();
        prop_assert_eq!(&decoded, &batch);
        for input in [bytes, mutate(&encoded, at, flip, keep)] {
            if let Ok(entries) = decode_entries(&input) {
                let canonical = encode_entries(&entries).unwrap();
                prop_assert_eq!(decode_entries(&canonical).unwrap(), entries);
            }
        }
        let mut trailing = encoded.clone();
        trailing.push(0);
        prop_assert!(decode_entries(&trailing).is_err(), "trailing bytes are refused");
    }

    #[test]
    fn ring_payloads_round_trip_and_garbage_is_an_error(
        term in any::<u64>(),
        index in any::<u64>(),
        command in proptest::option::of(command()),
        bytes in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let payload = command.map_or(EntryPayload::Blank, EntryPayload::Normal);
        let encoded = bincode::serde::encode_to_vec(&payload, bincode::config::standard()).unwrap();
        let entry = decode_entry(term, index, &encoded).unwrap();
        prop_assert_eq!(entry.log_id, log_id(term, index));
        prop_assert_eq!(&entry.payload, &payload);
        let mut trailing = encoded.clone();
        trailing.push(7);
        prop_assert!(decode_entry(term, index, &trailing).is_err());
        if let Ok(entry) = decode_entry(term, index, &bytes) {
            let canonical =
                bincode::serde::encode_to_vec(&entry.payload, bincode::config::standard()).unwrap();
            prop_assert_eq!(decode_entry(term, index, &canonical).unwrap(), entry);
        }
    }
}

proptest! {
    // Each case builds state machines on a runtime of its own.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn snapshot_bodies_reinstall_as_built_and_garbage_never_panics(
        commands in proptest::collection::vec(command(), 0..6),
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
        client_id in any::<u64>(),
    ) {
        let body = real_snapshot(&commands);
        let again = install_and_rebuild(&body, log_id(2, 10 + commands.len() as u64), &[])
            .expect("a built snapshot installs");
        prop_assert_eq!(&again, &body, "a built snapshot reinstalls and rebuilds the same");
        let after = [Command::new(Some(Session { client_id, seq: 1 }), b"x".to_vec())];
        for input in [bytes, mutate(&body, at, flip, keep)] {
            if let Some(rebuilt) = install_and_rebuild(&input, log_id(2, 50), &after) {
                let again = install_and_rebuild(&rebuilt, log_id(2, 51), &[])
                    .expect("a built snapshot installs");
                prop_assert_eq!(again, rebuilt);
            }
        }
    }
}

// ---- what fuzzing found -----------------------------------------------

/// fuzz target `entry` (2026-12-06, within seconds): a ring record's
/// payload that claims a command of 2^64 - 1 bytes makes `decode_entry`
/// (log_store/codec.rs, bincode with no limit) allocate what it claims
/// before it finds the input short: "capacity overflow" here; a claim
/// just below isize::MAX aborts the process (allocation failure). The
/// payload: variant 1 (Normal), no session, a byte string of u64::MAX
/// bytes (varint marker 253 + 8 bytes).
#[test]
fn a_ring_payload_that_claims_a_huge_command_is_an_error() {
    let mut payload = vec![1, 0, 253];
    payload.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(decode_entry(3, 7, &payload).is_err());
}

/// fuzz target `snapshot` (2026-12-06, within a second): a snapshot body
/// of a few bytes that claims a 4 GiB state makes `decode_body`
/// (state_machine.rs, bincode limited to MAX_SNAPSHOT_BYTES) allocate the
/// 4 GiB before it finds the input short (libFuzzer: "out-of-memory
/// (malloc(4282318863))"; a node whose memory cannot back that much
/// aborts). A body must cost no more memory than it holds, give or take.
#[test]
fn a_short_snapshot_body_allocates_no_more_than_it_holds() {
    let real = real_snapshot(&[]);
    // A body whose first byte string (the snapshot id, a member's address,
    // a session's answer or the state) claims 3.75 GiB, within the 4 GiB
    // limit: every prefix of the real body, then the claim, then nothing.
    let mut worst = 0usize;
    for cut in 0..real.len() {
        let mut body = real[..cut].to_vec();
        body.push(252);
        body.extend_from_slice(&0xF000_0000u32.to_le_bytes());
        let (_, largest) = largest_allocation(|| install_and_rebuild(&body, log_id(2, 10), &[]));
        worst = worst.max(largest);
    }
    assert!(
        worst <= 16 << 20,
        "a body of at most {} bytes made the node allocate {worst} bytes at once",
        real.len() + 5
    );
}
