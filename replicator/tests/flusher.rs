//! Group commit beside the Raft core (issue 11, item 3), stepped by hand:
//! the log store's `append` returns at once, one flusher round writes every
//! record appended since the last one with one write and one flush, and only
//! then completes the appends' callbacks, in order. No thread runs the
//! flusher here: each test calls `Flusher::step` where it wants the round,
//! so the interleavings are the test's, not the machine's.

use std::sync::{Arc, Mutex};

use openraft::EntryPayload;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use ringraft::flusher::SegmentSink;
use ringraft::types::{Entry, TypeConfig, log_id};
use ringraft::{Durability, IoMode, LocalGuard, LogStore};
use ringraft_wal::{RingConfig, Wal, WalError};

/// What the flusher did to its sink.
#[derive(Default, Debug)]
struct Calls {
    /// Bytes of each append.
    appends: Vec<usize>,
    syncs: usize,
    truncations: Vec<Option<u64>>,
}

/// A sink that records the calls (the real segment log has tests of its own).
#[derive(Clone, Default)]
struct Counting(Arc<Mutex<Calls>>);

impl SegmentSink for Counting {
    fn append(&mut self, records: &[u8]) -> Result<(), WalError> {
        self.0.lock().unwrap().appends.push(records.len());
        Ok(())
    }
    fn sync(&mut self) -> Result<(), WalError> {
        self.0.lock().unwrap().syncs += 1;
        Ok(())
    }
    fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<(), WalError> {
        self.0.lock().unwrap().truncations.push(last_kept);
        Ok(())
    }
    fn remove_before(&mut self, _first_kept: u64) -> Result<(), WalError> {
        Ok(())
    }
}

fn store(durability: Durability) -> (tempfile::TempDir, LogStore) {
    store_with(durability, IoMode::Threads)
}

fn store_with(durability: Durability, io: IoMode) -> (tempfile::TempDir, LogStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = RingConfig {
        capacity: 1 << 20,
        max_record_bytes: 64 << 10,
        cluster_id: 1,
        node_id: 1,
        lock_memory: false,
    };
    let wal = Wal::open(&dir.path().join("data"), &dir.path().join("shm"), &config).unwrap();
    let guard = Arc::new(LocalGuard::default());
    let store = LogStore::with_io(wal, 1, durability, io, guard.clone());
    guard.bind(&store);
    (dir, store)
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

type Done = openraft::alias::OneshotReceiverOf<TypeConfig, Result<(), std::io::Error>>;

/// Appends `entries` the way openraft does, with a callback to watch.
async fn append(store: &mut LogStore, entries: Vec<Entry>) -> Done {
    let (tx, rx) = TypeConfig::oneshot();
    let callback: IOFlushed<TypeConfig> = IOFlushed::signal(tx);
    store.append(entries, callback).await.unwrap();
    rx
}

/// True once the callback completed (successfully: an error fails).
fn done(rx: &mut Done) -> bool {
    use futures::FutureExt;
    match (&mut *rx).now_or_never() {
        Some(Ok(result)) => {
            result.unwrap();
            true
        }
        Some(Err(e)) => panic!("callback dropped: {e}"),
        None => false,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn fsync_appends_complete_only_after_the_rounds_one_flush() {
    let (_dir, mut store) = store(Durability::Fsync);
    let sink = Counting::default();
    let mut flusher = store.flusher(sink.clone());
    // The leader's first entries: openraft's own fence comes first.
    let mut first = append(&mut store, vec![entry(1, 0), entry(1, 1)]).await;
    let mut second = append(&mut store, vec![entry(1, 2)]).await;
    assert!(
        !done(&mut first) && !done(&mut second),
        "nothing is durable before a round"
    );
    // One round: both appends, one write, one flush.
    let round = flusher.step().unwrap();
    assert_eq!((round.entries, round.synced), (3, true));
    assert!(done(&mut first) && done(&mut second));
    {
        let calls = sink.0.lock().unwrap();
        assert_eq!((calls.appends.len(), calls.syncs), (1, 1), "{calls:?}");
    }
    // Nothing new: a round writes and flushes nothing.
    assert!(!flusher.has_work());
    let mut third = append(&mut store, vec![entry(1, 3)]).await;
    assert!(!done(&mut third));
    flusher.step().unwrap();
    assert!(done(&mut third));
    assert_eq!(sink.0.lock().unwrap().syncs, 2, "one flush per round");
}

#[tokio::test(flavor = "current_thread")]
async fn memory_appends_complete_at_once_and_are_written_unflushed() {
    let (_dir, mut store) = store(Durability::Memory);
    let sink = Counting::default();
    let mut flusher = store.flusher(sink.clone());
    let mut first = append(&mut store, vec![entry(1, 0), entry(1, 1)]).await;
    assert!(done(&mut first), "the ring is the promise of `memory`");
    let round = flusher.step().unwrap();
    assert_eq!((round.entries, round.synced), (2, false));
    let calls = sink.0.lock().unwrap();
    assert_eq!((calls.appends.len(), calls.syncs), (1, 0), "{calls:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_truncation_waits_for_the_appends_before_it_and_reaches_the_segments_in_order() {
    let (_dir, mut store) = store(Durability::Fsync);
    let sink = Counting::default();
    let mut flusher = store.flusher(sink.clone());
    let mut old = append(&mut store, vec![entry(1, 0), entry(1, 1), entry(1, 2)]).await;
    // openraft truncates after index 0 (a conflict): the truncation waits
    // until the append before it is durable, then until the segments are
    // truncated too.
    let mut truncating = store.clone();
    let truncation = tokio::spawn(async move {
        truncating.truncate_after(Some(log_id(1, 0))).await.unwrap();
    });
    tokio::task::yield_now().await;
    assert!(
        !truncation.is_finished(),
        "the earlier append is not durable yet"
    );
    flusher.step().unwrap();
    assert!(done(&mut old), "the append completes before the truncation");
    // The truncation runs now (on this one thread, when this task yields)
    // and queues its segment operation, which waits for a round.
    let mut yields = 0;
    while !flusher.has_work() {
        tokio::task::yield_now().await;
        yields += 1;
        assert!(yields < 10_000, "the truncation never queued its operation");
    }
    assert!(
        !truncation.is_finished(),
        "the segments are not truncated yet"
    );
    flusher.step().unwrap();
    truncation.await.unwrap();
    {
        let calls = sink.0.lock().unwrap();
        assert_eq!(calls.truncations, vec![Some(0)], "{calls:?}");
        assert_eq!(
            calls.appends.len(),
            1,
            "the first round wrote the old entries"
        );
    }
    // The new entries after the truncation go to the segments after it.
    let mut new = append(&mut store, vec![entry(2, 1)]).await;
    flusher.step().unwrap();
    assert!(done(&mut new));
    let entries = store.try_get_log_entries(0..2).await.unwrap();
    assert_eq!(
        entries.iter().map(|e| e.log_id).collect::<Vec<_>>(),
        vec![log_id(1, 0), log_id(2, 1)]
    );
}

/// A sink on a disk that can be full: appends fail as the segment log's do
/// then (nothing of the batch written).
#[derive(Clone, Default)]
struct Fillable {
    calls: Counting,
    full: Arc<std::sync::atomic::AtomicBool>,
}

impl SegmentSink for Fillable {
    fn append(&mut self, records: &[u8]) -> Result<(), WalError> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(WalError::DiskFull {
                path: "log/00000000000000000003.seg".into(),
                needed: records.len() as u64,
            });
        }
        self.calls.append(records)
    }
    fn sync(&mut self) -> Result<(), WalError> {
        self.calls.sync()
    }
    fn truncate_after(&mut self, last_kept: Option<u64>) -> Result<(), WalError> {
        self.calls.truncate_after(last_kept)
    }
    fn remove_before(&mut self, first_kept: u64) -> Result<(), WalError> {
        self.calls.remove_before(first_kept)
    }
}

/// Issue 11, item 5: a full disk used to stop the node's log for good (the
/// first failed round failed every waiter, and every later one). Now the
/// round is retried: appends wait, proposals are refused with a clear
/// "disk full" while it lasts, and once space is freed one round writes
/// everything in order and completes the waiters.
#[tokio::test(flavor = "current_thread")]
async fn a_full_disk_refuses_proposals_and_the_log_resumes_once_space_is_freed() {
    let (_dir, mut store) = store(Durability::Fsync);
    let sink = Fillable::default();
    let mut flusher = store.flusher(sink.clone());
    let admission = ringraft::admission::Admission::new(
        Arc::new(store.clone()),
        1 << 20,
        64 << 10,
        std::time::Duration::from_millis(10),
    )
    .unwrap();
    let command = || vec![ringraft::Command::new(None, b"x".to_vec())];
    drop(admission.admit(&command()).await.expect("room before"));

    let mut first = append(&mut store, vec![entry(1, 0), entry(1, 1), entry(1, 2)]).await;
    sink.full.store(true, std::sync::atomic::Ordering::SeqCst);
    flusher.step().unwrap();
    assert!(!done(&mut first), "nothing was written: nothing is durable");
    let why = store.disk_full().expect("the store says the disk is full");
    assert!(why.contains("disk full"), "{why}");
    match admission.admit(&command()).await {
        Err(ringraft::admission::AdmissionError::DiskFull { why }) => {
            assert!(why.contains("space is freed"), "{why}")
        }
        other => panic!("a proposal on a full disk: {:?}", other.map(|a| a.bytes())),
    }
    // A trim is what frees the disk: it is let through.
    let trim = ringraft::Command {
        control: Some(ringraft::Control::Trim { before: 2 }),
        ..ringraft::Command::default()
    };
    drop(
        admission
            .admit(&[trim])
            .await
            .expect("a trim on a full disk"),
    );
    let mut second = append(&mut store, vec![entry(1, 3), entry(1, 4)]).await;
    assert!(flusher.has_work());
    flusher.step().unwrap();
    assert!(!done(&mut first) && !done(&mut second));
    assert!(sink.calls.0.lock().unwrap().appends.is_empty());

    sink.full.store(false, std::sync::atomic::Ordering::SeqCst);
    let round = flusher.step().unwrap();
    assert_eq!((round.entries, round.synced), (5, true), "{round:?}");
    assert!(done(&mut first) && done(&mut second));
    assert_eq!(store.disk_full(), None);
    drop(admission.admit(&command()).await.expect("room again"));
    let calls = sink.calls.0.lock().unwrap();
    assert_eq!((calls.appends.len(), calls.syncs), (1, 1), "{calls:?}");
    drop(calls);
    // The segments would hold entries 0..=4, in order, once.
    let entries = store.read_entries(0, 5).unwrap();
    assert_eq!(
        entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
}

/// `IoMode::Inline`: the flusher is a task of the (one-threaded, paused)
/// runtime, woken by each append instead of a condvar, and the vote is
/// saved inline: nothing needs a thread of its own.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_inline_flusher_is_a_task_woken_by_the_appends() {
    let (_dir, mut store) = store_with(Durability::Fsync, IoMode::Inline);
    let sink = Counting::default();
    let flusher = tokio::spawn(store.flusher(sink.clone()).run_async());
    let started = tokio::time::Instant::now();
    for round in 0..3u64 {
        let entries = if round == 0 {
            vec![entry(1, 0), entry(1, 1)]
        } else {
            vec![entry(1, round + 1)]
        };
        let callback = append(&mut store, entries).await;
        callback.await.expect("completed").expect("flushed");
    }
    assert_eq!(
        started.elapsed(),
        std::time::Duration::ZERO,
        "woken at once, not by a timer"
    );
    assert_eq!(sink.0.lock().unwrap().syncs, 3, "one round per append");
    let vote = ringraft::types::Vote::new(2, 1);
    store.save_vote(&vote).await.unwrap();
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    // (It would end with the store, but the store and its bound guard keep
    // each other alive.)
    flusher.abort();
}

/// A simulated flush latency (`Flusher::simulate_flush_latency`): the
/// inline flusher writes at once and flushes that much later in the
/// runtime's time; the `fsync` append completes only after the flush.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_simulated_flush_latency_delays_the_flush_not_the_write() {
    let latency = std::time::Duration::from_millis(4);
    let (_dir, mut store) = store_with(Durability::Fsync, IoMode::Inline);
    let sink = Counting::default();
    let mut flusher = store.flusher(sink.clone());
    flusher.simulate_flush_latency(latency);
    let flusher = tokio::spawn(flusher.run_async());
    let started = tokio::time::Instant::now();
    let mut callback = append(&mut store, vec![entry(1, 0), entry(1, 1)]).await;
    // The round has written, not flushed, and the append waits.
    tokio::time::sleep(latency / 2).await;
    {
        let calls = sink.0.lock().unwrap();
        assert_eq!((calls.appends.len(), calls.syncs), (1, 0), "{calls:?}");
    }
    assert!(!done(&mut callback), "acknowledged before the flush");
    callback.await.expect("completed").expect("flushed");
    assert_eq!(
        started.elapsed(),
        latency,
        "completed when the flush was done"
    );
    assert_eq!(sink.0.lock().unwrap().syncs, 1);
    flusher.abort();
}
