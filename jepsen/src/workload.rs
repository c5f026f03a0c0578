//! The clients: concurrent tasks that append unique values and read ranges
//! and the tail through the Rust client (`ringraft_client::Client`), and
//! record every invocation and completion in the history. A client process
//! has one operation outstanding; after an `info` (outcome unknown) it
//! retires and the task goes on as a fresh process with a fresh client
//! session. Appends that fail are recorded as `info` (the client library
//! retries internally with one session, so a refusal after a timed-out
//! attempt does not prove the record absent); reads that fail are `fail`
//! (a read has no effect).
//!
//! An append request carries [`RECORDS_PER_APPEND`] records. Each record is
//! an operation of its own, by one of the task's processes (one per record
//! of a request), all invoked together and completed together, tagged with
//! the client session that sent it and its place in that session's send
//! order (`value.client`, `value.seq`): the checker's `client-order` rule
//! then sees whether a client's records kept its order (issue 10, item 3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ringraft_client::{Client, Consistency as ApiConsistency};

use crate::history::{Consistency, Event, EventType, HistoryWriter, ReadRecord};
use crate::rng::SplitMix64;

/// Longest range a range read asks for, records.
pub const MAX_READ_SPAN: u64 = 32;
/// How far below the highest acknowledged index a tail read starts.
pub const TAIL_READ_BACK: u64 = 32;
/// Records in one append request.
pub const RECORDS_PER_APPEND: usize = 3;

/// What the clients do.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Concurrent clients.
    pub clients: u64,
    /// Every node's client address.
    pub endpoints: Vec<String>,
    /// Time per endpoint per attempt.
    pub per_endpoint: Duration,
    /// Time one operation may take in all (retries included).
    pub op_deadline: Duration,
    /// Pause between a client's operations.
    pub think: Duration,
    /// Seed of the operation mix.
    pub seed: u64,
}

/// Counts of what the clients saw.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct WorkloadStats {
    /// Appends acknowledged.
    pub append_ok: u64,
    /// Appends with unknown outcome.
    pub append_info: u64,
    /// Reads answered.
    pub read_ok: u64,
    /// Reads that failed.
    pub read_fail: u64,
    /// Client processes used.
    pub processes: u64,
}

struct Shared {
    history: Arc<HistoryWriter>,
    stop: Arc<AtomicBool>,
    next_process: AtomicU64,
    next_session: AtomicU64,
    max_acked_index: AtomicU64,
}

impl Shared {
    /// Fresh processes, one per record of an append request.
    fn new_processes(&self) -> Vec<u64> {
        (0..RECORDS_PER_APPEND)
            .map(|_| self.next_process.fetch_add(1, Ordering::SeqCst))
            .collect()
    }
}

/// Runs the clients until `stop` is set; returns what they saw.
pub async fn run(
    config: WorkloadConfig,
    history: Arc<HistoryWriter>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<WorkloadStats> {
    let shared = Arc::new(Shared {
        history,
        stop,
        next_process: AtomicU64::new(0),
        next_session: AtomicU64::new(1),
        max_acked_index: AtomicU64::new(0),
    });
    let mut tasks = Vec::new();
    for k in 0..config.clients {
        let (shared, config) = (shared.clone(), config.clone());
        tasks.push(tokio::spawn(
            async move { client_loop(k, config, shared).await },
        ));
    }
    let mut total = WorkloadStats::default();
    for task in tasks {
        let stats = task
            .await
            .map_err(|e| std::io::Error::other(format!("client task: {e}")))??;
        total.append_ok += stats.append_ok;
        total.append_info += stats.append_info;
        total.read_ok += stats.read_ok;
        total.read_fail += stats.read_fail;
    }
    total.processes = shared.next_process.load(Ordering::SeqCst);
    Ok(total)
}

fn new_client(k: u64, config: &WorkloadConfig) -> Client {
    // Each client starts with a different node.
    let mut endpoints = config.endpoints.clone();
    if !endpoints.is_empty() {
        let shift = (k as usize) % endpoints.len();
        endpoints.rotate_left(shift);
    }
    Client::new(endpoints, config.per_endpoint).with_deadline(config.op_deadline)
}

/// One client's current session: its processes (one per record of a
/// request; reads go through the first), the session's number, its
/// connection, and the send order of its last record.
struct Session {
    processes: Vec<u64>,
    id: u64,
    client: Client,
    seq: u64,
}

impl Session {
    fn new(k: u64, config: &WorkloadConfig, shared: &Shared) -> Session {
        Session {
            processes: shared.new_processes(),
            id: shared.next_session.fetch_add(1, Ordering::SeqCst),
            client: new_client(k, config),
            seq: 0,
        }
    }
}

async fn client_loop(
    k: u64,
    config: WorkloadConfig,
    shared: Arc<Shared>,
) -> std::io::Result<WorkloadStats> {
    let mut rng = SplitMix64::new(config.seed ^ (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut stats = WorkloadStats::default();
    let mut session = Session::new(k, &config, &shared);
    // Slack over the client's own deadline before the harness gives up.
    let hard_limit = config.op_deadline + Duration::from_secs(2);
    while !shared.stop.load(Ordering::SeqCst) {
        let roll = rng.below(10);
        if roll < 6 {
            append_once(k, &config, &shared, &mut session, hard_limit, &mut stats).await?;
        } else {
            let max = shared.max_acked_index.load(Ordering::SeqCst);
            let (from, to) = if roll < 8 {
                let from = 1 + rng.below(max.max(1));
                (from, Some(from + rng.below(MAX_READ_SPAN)))
            } else {
                (max.saturating_sub(TAIL_READ_BACK).max(1), None)
            };
            read_once(&shared, &mut session, (from, to), hard_limit, &mut stats).await?;
        }
        if !config.think.is_zero() {
            tokio::time::sleep(config.think).await;
        }
    }
    Ok(stats)
}

/// One append request of a record per process of `session`, each
/// invocation and completion recorded. When the outcome is unknown, the
/// processes are done (Jepsen's rule) and a new session takes over.
async fn append_once(
    k: u64,
    config: &WorkloadConfig,
    shared: &Shared,
    session: &mut Session,
    hard_limit: Duration,
    stats: &mut WorkloadStats,
) -> std::io::Result<()> {
    // (process, seq, data) of each record, in send order.
    let seq = &mut session.seq;
    let records: Vec<(u64, u64, String)> = session
        .processes
        .iter()
        .map(|&process| {
            *seq += 1;
            (process, *seq, format!("c{k}-p{process}-{seq}"))
        })
        .collect();
    let id = session.id;
    for (process, seq, data) in &records {
        shared
            .history
            .record(Event::append_invoke(0, *process, data.clone()).in_client(id, *seq))?;
    }
    let payload = records
        .iter()
        .map(|(_, _, data)| data.clone().into_bytes())
        .collect();
    let result = tokio::time::timeout(hard_limit, session.client.append(payload)).await;
    match result {
        Ok(Ok(indexes)) if indexes.len() == records.len() => {
            for ((process, seq, data), index) in records.into_iter().zip(indexes) {
                shared.max_acked_index.fetch_max(index, Ordering::SeqCst);
                shared.history.record(
                    Event::append_completion(0, process, EventType::Ok, data, Some(index))
                        .in_client(id, seq),
                )?;
                stats.append_ok += 1;
            }
        }
        other => {
            let error = match other {
                Ok(Ok(indexes)) => format!(
                    "{} records appended, {} indexes answered",
                    records.len(),
                    indexes.len()
                ),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {hard_limit:?}"),
            };
            for (process, seq, data) in records {
                shared.history.record(
                    Event::append_completion(0, process, EventType::Info, data, None)
                        .in_client(id, seq)
                        .with_error(error.clone()),
                )?;
                stats.append_info += 1;
            }
            // These processes are done (Jepsen's rule); new ones,
            // with a new session, take over.
            *session = Session::new(k, config, shared);
        }
    }
    Ok(())
}

/// One linearizable read of `from..to` (`to` `None`: to the tail) through
/// the first process of `session`, its invocation and completion recorded.
async fn read_once(
    shared: &Shared,
    session: &mut Session,
    (from, to): (u64, Option<u64>),
    hard_limit: Duration,
    stats: &mut WorkloadStats,
) -> std::io::Result<()> {
    let process = session.processes[0];
    shared.history.record(Event::read_invoke(
        0,
        process,
        from,
        to,
        Consistency::Linearizable,
    ))?;
    let result = tokio::time::timeout(
        hard_limit,
        session
            .client
            .read(from, to.unwrap_or(0), ApiConsistency::Linearizable),
    )
    .await;
    match result {
        Ok(Ok(records)) => {
            let records = records
                .into_iter()
                .map(|r| ReadRecord {
                    index: r.index,
                    data: String::from_utf8_lossy(&r.data).into_owned(),
                })
                .collect();
            shared.history.record(Event::read_completion(
                0,
                process,
                EventType::Ok,
                from,
                to,
                Consistency::Linearizable,
                Some(records),
            ))?;
            stats.read_ok += 1;
        }
        other => {
            let error = match other {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {hard_limit:?}"),
            };
            shared.history.record(
                Event::read_completion(
                    0,
                    process,
                    EventType::Fail,
                    from,
                    to,
                    Consistency::Linearizable,
                    None,
                )
                .with_error(error),
            )?;
            stats.read_fail += 1;
        }
    }
    Ok(())
}
