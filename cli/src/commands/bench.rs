//! `ringraft bench`: closed-loop append and read load against a running
//! cluster.
//!
//! `clients` concurrent client sessions each append `batch` records of
//! `size` bytes, wait for the answer (the records' indexes, sent once they
//! are committed and applied), and append again, for `duration`. Only
//! acknowledged records count. With `--workload read` each client appends
//! one record first (acknowledged, its latency not measured), then reads it back at `--consistency`
//! again and again; with `--workload mixed` it appends a record, then reads
//! it back, in turn. Appends and reads have latency histograms of their own. A live progress line goes to stderr about
//! once a second; the summary (throughput, commit latency percentiles,
//! errors, retries) goes to stdout, as text or JSON.
//!
//! Every record starts with `bench-<run>-<client>-<seq>-` (cut to `size`),
//! so that the records of one run can be found in the log afterwards. This
//! module never changes the cluster beyond appending records.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ringraft_client::proto::Consistency;
use ringraft_client::{Client, ClientError, ClientTls};

use super::fail;
use crate::args::BenchArgs;

/// Concurrent clients, at most.
pub const MAX_CLIENTS: usize = 4096;
/// Record size, at most (the client API's message limit is 64 MiB).
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// Records per append, at most (the server's limit).
pub const MAX_BATCH_RECORDS: usize = 4096;
/// Bench duration, at most.
pub const MAX_DURATION_SECS: u64 = 24 * 3600;
/// Bytes of records in one append, at most (under the client API's 64 MiB
/// message limit).
pub const MAX_APPEND_BYTES: usize = 48 << 20;
/// Highest latency the histogram holds, microseconds.
const MAX_LATENCY_US: u64 = 120_000_000;

/// What each client does in a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Append, wait for the indexes, append again.
    Append,
    /// Read back one record (appended once, first) again and again.
    Read,
    /// Append a record, then read it back.
    Mixed,
}

impl Workload {
    /// Parses `--workload`.
    pub fn parse(s: &str) -> Result<Workload, String> {
        match s {
            "append" => Ok(Workload::Append),
            "read" => Ok(Workload::Read),
            "mixed" => Ok(Workload::Mixed),
            other => Err(format!(
                "--workload {other}: expected append, read or mixed"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Append => "append",
            Workload::Read => "read",
            Workload::Mixed => "mixed",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// What each client does.
    pub workload: Workload,
    /// The reads' consistency.
    pub consistency: Consistency,
    /// Client API addresses.
    pub endpoints: Vec<String>,
    /// Time allowed per endpoint per attempt.
    pub per_endpoint: Duration,
    /// Concurrent client sessions.
    pub clients: usize,
    /// Bytes per record.
    pub size: usize,
    /// Records per append.
    pub batch: usize,
    /// How long to keep appending.
    pub duration: Duration,
    /// How long one append may keep retrying before it counts as an error.
    pub append_deadline: Duration,
    /// TLS of the clients (`None`: plaintext).
    pub tls: Option<ClientTls>,
}

impl BenchConfig {
    /// A client of `endpoints`, over TLS when the bench uses it.
    fn client(&self, endpoints: Vec<String>, per_endpoint: Duration) -> Client {
        let client = Client::new(endpoints, per_endpoint);
        match &self.tls {
            Some(tls) => client.with_tls(tls.clone()),
            None => client,
        }
    }

    /// Checks the bounds.
    pub fn check(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("--endpoints: none given".into());
        }
        count_in_bounds("--clients", self.clients, MAX_CLIENTS)?;
        count_in_bounds("--size", self.size, MAX_RECORD_BYTES)?;
        count_in_bounds("--batch", self.batch, MAX_BATCH_RECORDS)?;
        if self.size.saturating_mul(self.batch) > MAX_APPEND_BYTES {
            return Err(format!(
                "--size {} x --batch {} exceeds {} bytes per append",
                self.size, self.batch, MAX_APPEND_BYTES
            ));
        }
        if self.duration.is_zero() || self.duration.as_secs() > MAX_DURATION_SECS {
            return Err(format!(
                "--duration must be in (0, {MAX_DURATION_SECS}] seconds"
            ));
        }
        Ok(())
    }
}

/// Checks that `flag`'s `value` is in `1..=max`.
fn count_in_bounds(flag: &str, value: usize, max: usize) -> Result<(), String> {
    if !(1..=max).contains(&value) {
        return Err(format!("{flag} {value} is not in 1..={max}"));
    }
    Ok(())
}

/// What a run measured.
#[derive(Debug)]
pub struct BenchReport {
    /// The configuration.
    pub config: BenchConfig,
    /// Tag of this run's records (`bench-<run>-`).
    pub run: u32,
    /// From the first append to the last answer.
    pub elapsed: Duration,
    /// Records acknowledged with an index.
    pub acknowledged: u64,
    /// Appends that failed for good (their records may or may not be in
    /// the log).
    pub errors: u64,
    /// Attempts retried inside the clients (timeouts, unreachable nodes, no
    /// leader).
    pub retries: u64,
    /// Commit latency of one append, microseconds.
    pub latency_us: Histogram<u64>,
    /// Reads answered with the record asked for.
    pub reads: u64,
    /// Latency of one read, microseconds.
    pub read_latency_us: Histogram<u64>,
    /// Stale reads answered before the node applied the record (not
    /// errors: a stale read promises no more).
    pub stale_misses: u64,
    /// Lowest and highest index acknowledged.
    pub index_range: Option<(u64, u64)>,
    /// The first error, if any.
    pub first_error: Option<String>,
}

impl BenchReport {
    /// Acknowledged records per second.
    pub fn records_per_sec(&self) -> f64 {
        self.acknowledged as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Acknowledged payload, MB (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.records_per_sec() * self.config.size as f64 / 1e6
    }

    /// Reads answered per second.
    pub fn reads_per_sec(&self) -> f64 {
        self.reads as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The summary as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "workload": self.config.workload.name(),
            "consistency": self.config.consistency.as_str_name().to_lowercase(),
            "reads": self.reads,
            "stale_misses": self.stale_misses,
            "reads_per_s": self.reads_per_sec(),
            "read_latency_ms": latency_json(&self.read_latency_us),
            "clients": self.config.clients,
            "size_bytes": self.config.size,
            "batch": self.config.batch,
            "duration_s": self.config.duration.as_secs_f64(),
            "elapsed_s": self.elapsed.as_secs_f64(),
            "run": format!("{:08x}", self.run),
            "acknowledged": self.acknowledged,
            "records_per_s": self.records_per_sec(),
            "mb_per_s": self.mb_per_sec(),
            "latency_ms": latency_json(&self.latency_us),
            "errors": self.errors,
            "retries": self.retries,
            "first_index": self.index_range.map(|r| r.0),
            "last_index": self.index_range.map(|r| r.1),
            "first_error": self.first_error,
        })
    }

    /// The summary as text.
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "bench: {} client{}, {}-byte records, {} per append, {:.1} s ({} endpoint{})\n",
            c.clients,
            if c.clients == 1 { "" } else { "s" },
            c.size,
            c.batch,
            c.duration.as_secs_f64(),
            c.endpoints.len(),
            if c.endpoints.len() == 1 { "" } else { "s" },
        );
        s += &format!(
            "acknowledged    {} records in {:.2} s{}\n",
            self.acknowledged,
            self.elapsed.as_secs_f64(),
            match self.index_range {
                Some((a, b)) => format!(" (indexes {a}..={b})"),
                None => String::new(),
            }
        );
        s += &format!(
            "throughput      {:.1} records/s, {:.3} MB/s\n",
            self.records_per_sec(),
            self.mb_per_sec()
        );
        s += &format!(
            "commit latency  {} ({} appends)\n",
            latency_text(&self.latency_us),
            self.latency_us.len()
        );
        if self.config.workload != Workload::Append {
            s += &format!(
                "reads           {} ({:.1}/s, {}; {} stale misses)\n",
                self.reads,
                self.reads_per_sec(),
                self.config.consistency.as_str_name().to_lowercase(),
                self.stale_misses
            );
            s += &format!("read latency    {}\n", latency_text(&self.read_latency_us));
        }
        s += &format!("errors          {}, retries {}", self.errors, self.retries);
        if let Some(e) = &self.first_error {
            s += &format!("\nfirst error     {e}");
        }
        s
    }
}

fn percentile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(q) as f64 / 1000.0
}

/// A latency histogram (microseconds) in the JSON summary, in ms.
fn latency_json(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "p50": percentile_ms(h, 0.5),
        "p99": percentile_ms(h, 0.99),
        "p999": percentile_ms(h, 0.999),
        "max": h.max() as f64 / 1000.0,
        "mean": h.mean() / 1000.0,
        "samples": h.len(),
    })
}

/// A latency histogram (microseconds) in the text summary.
fn latency_text(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:.3} ms, p99 {:.3} ms, p999 {:.3} ms, max {:.3} ms",
        percentile_ms(h, 0.5),
        percentile_ms(h, 0.99),
        percentile_ms(h, 0.999),
        h.max() as f64 / 1000.0
    )
}

/// The bytes of record `seq` of client `client` in run `run`.
pub fn record(run: u32, client: usize, seq: u64, size: usize) -> Vec<u8> {
    let mut r = format!("bench-{run:08x}-{client}-{seq}-").into_bytes();
    r.resize(size, b'x');
    r
}

struct Shared {
    acknowledged: AtomicU64,
    reads: AtomicU64,
    stop: AtomicBool,
}

struct WorkerResult {
    latency_us: Histogram<u64>,
    read_latency_us: Histogram<u64>,
    reads: u64,
    stale_misses: u64,
    acknowledged: u64,
    errors: u64,
    retries: u64,
    index_range: Option<(u64, u64)>,
    first_error: Option<String>,
    /// The cluster refused the request: retrying cannot help.
    refused: bool,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

impl WorkerResult {
    /// Nothing measured yet.
    fn empty() -> WorkerResult {
        WorkerResult {
            latency_us: new_histogram(),
            read_latency_us: new_histogram(),
            reads: 0,
            stale_misses: 0,
            acknowledged: 0,
            errors: 0,
            retries: 0,
            index_range: None,
            first_error: None,
            refused: false,
        }
    }
}

/// The smallest index range holding both `a` and `b`.
fn widen(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some((lo_a, hi_a)), Some((lo_b, hi_b))) => Some((lo_a.min(lo_b), hi_a.max(hi_b))),
        (x, None) | (None, x) => x,
    }
}

async fn worker(
    config: Arc<BenchConfig>,
    run: u32,
    client_no: usize,
    shared: Arc<Shared>,
) -> WorkerResult {
    let mut client = config
        .client(config.endpoints.clone(), config.per_endpoint)
        .with_deadline(config.append_deadline);
    let mut result = WorkerResult::empty();
    let mut seq = 0u64;
    // The record a read-only client reads back (appended once, unmeasured).
    let mut mine: Option<u64> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let index = match (config.workload, mine) {
            (Workload::Read, Some(index)) => index,
            _ => {
                let records: Vec<Vec<u8>> = (0..config.batch)
                    .map(|k| record(run, client_no, seq + k as u64, config.size))
                    .collect();
                seq += config.batch as u64;
                let measured = config.workload != Workload::Read;
                let Some(index) = append_once(
                    &config,
                    &mut client,
                    records,
                    measured,
                    &shared,
                    &mut result,
                )
                .await
                else {
                    if result.refused {
                        break;
                    }
                    continue;
                };
                if config.workload == Workload::Read {
                    mine = Some(index);
                }
                index
            }
        };
        if config.workload == Workload::Append {
            continue;
        }
        read_once(&config, &mut client, index, &shared, &mut result).await;
        if result.refused {
            break;
        }
    }
    result.retries = client.retries();
    result
}

/// Appends `records`; returns the last one's index, or `None` after an
/// error (counted; `result.refused` when retrying cannot help). They count
/// as acknowledged; their latency only when `measured`.
async fn append_once(
    config: &BenchConfig,
    client: &mut Client,
    records: Vec<Vec<u8>>,
    measured: bool,
    shared: &Shared,
    result: &mut WorkerResult,
) -> Option<u64> {
    let started = Instant::now();
    match client.append(records).await {
        Ok(indexes) if indexes.len() != config.batch => {
            // The server's answer is input like any other.
            result.errors += 1;
            result.first_error.get_or_insert_with(|| {
                format!(
                    "an append of {} records was answered with {} indexes",
                    config.batch,
                    indexes.len()
                )
            });
            None
        }
        Ok(indexes) => {
            if measured {
                result.latency_us.saturating_record(micros(started));
            }
            result.acknowledged += indexes.len() as u64;
            shared
                .acknowledged
                .fetch_add(indexes.len() as u64, Ordering::Relaxed);
            let answered = indexes.iter().min().zip(indexes.iter().max());
            result.index_range = widen(result.index_range, answered.map(|(lo, hi)| (*lo, *hi)));
            indexes.last().copied()
        }
        Err(e) => {
            failed(e, shared, result).await;
            None
        }
    }
}

/// Reads record `index` back; counts it when the answer is that record.
async fn read_once(
    config: &BenchConfig,
    client: &mut Client,
    index: u64,
    shared: &Shared,
    result: &mut WorkerResult,
) {
    let started = Instant::now();
    match client.read(index, index, config.consistency).await {
        Ok(records) if records.len() == 1 && records[0].index == index => {
            result.read_latency_us.saturating_record(micros(started));
            result.reads += 1;
            shared.reads.fetch_add(1, Ordering::Relaxed);
        }
        // A stale read may come before this node applied the record: not
        // an error, a miss (counted apart, its latency not measured).
        Ok(records) if records.is_empty() && config.consistency == Consistency::Stale => {
            result.stale_misses += 1;
        }
        Ok(records) => {
            result.errors += 1;
            result.first_error.get_or_insert_with(|| {
                format!(
                    "a read of index {index} was answered with {} records",
                    records.len()
                )
            });
        }
        Err(e) => failed(e, shared, result).await,
    }
}

/// Counts a failed request; stops the run when retrying cannot help, else
/// pauses before the next.
async fn failed(e: ClientError, shared: &Shared, result: &mut WorkerResult) {
    result.errors += 1;
    let refused = matches!(
        e,
        ClientError::Refused(_)
            | ClientError::Endpoint(..)
            | ClientError::TooLarge { .. }
            | ClientError::Tls(_)
    );
    if result.first_error.is_none() {
        result.first_error = Some(e.to_string());
    }
    if refused {
        result.refused = true;
        shared.stop.store(true, Ordering::Relaxed);
    } else {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Microseconds since `started`, within the histograms' bounds.
fn micros(started: Instant) -> u64 {
    started
        .elapsed()
        .as_micros()
        .clamp(1, MAX_LATENCY_US as u128) as u64
}

/// The endpoints with the leader's first, when the nodes say which one it
/// is (followers forward appends, which would add a hop to every
/// measurement); else as given.
pub async fn leader_first(config: &BenchConfig) -> Vec<String> {
    let (endpoints, per_endpoint) = (config.endpoints.clone(), config.per_endpoint);
    let mut ids = Vec::new();
    let mut leader = 0;
    for e in &endpoints {
        let mut c = config
            .client(vec![e.clone()], per_endpoint)
            .with_deadline(per_endpoint);
        match c.status().await {
            Ok(s) => {
                if s.leader_id != 0 {
                    leader = s.leader_id;
                }
                ids.push(Some(s.id));
            }
            Err(_) => ids.push(None),
        }
    }
    match ids.iter().position(|id| leader != 0 && *id == Some(leader)) {
        Some(k) => {
            let mut out = endpoints;
            out.rotate_left(k);
            out
        }
        None => endpoints,
    }
}

/// `ringraft bench`: checks the flags, runs the bench and prints its
/// summary; exit 1 when no append was acknowledged.
pub(crate) async fn command(args: BenchArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    let BenchArgs {
        endpoints,
        clients,
        size,
        duration,
        batch,
        workload,
        consistency,
        append_deadline_ms,
        json,
        quiet,
    } = args;
    let workload = match Workload::parse(&workload) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let consistency = match super::read::parse_consistency(&consistency) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if !(duration.is_finite() && duration > 0.0 && duration <= MAX_DURATION_SECS as f64) {
        return fail(format!(
            "--duration {duration}: expected seconds in (0, {MAX_DURATION_SECS}]"
        ));
    }
    let tls = match endpoints.tls() {
        Ok(tls) => tls,
        Err(e) => return fail(e),
    };
    let config = BenchConfig {
        workload,
        consistency,
        endpoints: endpoints.endpoints.clone(),
        per_endpoint: Duration::from_millis(endpoints.timeout_ms),
        clients,
        size,
        batch,
        duration: Duration::from_secs_f64(duration),
        append_deadline: Duration::from_millis(append_deadline_ms.max(1)),
        tls,
    };
    match run(config, !quiet).await {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                println!("{}", report.to_text());
            }
            if report.acknowledged == 0 && report.reads == 0 {
                eprintln!("ringraft: bench: no append was acknowledged and no read answered");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("bench: {e}")),
    }
}

/// Runs the bench; `progress` gets the live line.
pub async fn run(mut config: BenchConfig, progress: bool) -> Result<BenchReport, String> {
    config.check()?;
    config.endpoints = leader_first(&config).await;
    let config = Arc::new(config);
    let run = rand::random::<u32>();
    let shared = Arc::new(Shared {
        acknowledged: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let started = Instant::now();
    let workers: Vec<_> = (0..config.clients)
        .map(|k| tokio::spawn(worker(config.clone(), run, k, shared.clone())))
        .collect();

    show_progress(&config, &shared, started, progress).await;
    let merged = merge(workers).await?;
    let elapsed = started.elapsed();
    if merged.refused {
        return Err(format!(
            "the cluster refused a request: {}",
            merged.first_error.unwrap_or_default()
        ));
    }
    let config = Arc::try_unwrap(config).unwrap_or_else(|c| (*c).clone());
    Ok(BenchReport {
        config,
        run,
        elapsed,
        acknowledged: merged.acknowledged,
        errors: merged.errors,
        retries: merged.retries,
        latency_us: merged.latency_us,
        reads: merged.reads,
        read_latency_us: merged.read_latency_us,
        stale_misses: merged.stale_misses,
        index_range: merged.index_range,
        first_error: merged.first_error,
    })
}

/// The progress line, about once a second (when `progress`), until the
/// duration is over or a worker stopped the run; then tells the workers to
/// stop.
async fn show_progress(config: &BenchConfig, shared: &Shared, started: Instant, progress: bool) {
    let tty = std::io::stderr().is_terminal();
    let end = started + config.duration;
    let mut last = (started, 0u64);
    while Instant::now() < end && !shared.stop.load(Ordering::Relaxed) {
        let wake = (Instant::now() + Duration::from_secs(1)).min(end);
        tokio::time::sleep_until(wake.into()).await;
        if !progress {
            continue;
        }
        let now = Instant::now();
        let acked = shared.acknowledged.load(Ordering::Relaxed);
        let total_rate = acked as f64 / (now - started).as_secs_f64().max(1e-9);
        let recent_rate = (acked - last.1) as f64 / (now - last.0).as_secs_f64().max(1e-9);
        last = (now, acked);
        let line = format!(
            "[{:>5.1}/{:.0} s] {} acknowledged, {:.0} records/s ({:.0} in the last second), {:.3} MB/s, {} reads",
            (now - started).as_secs_f64(),
            config.duration.as_secs_f64(),
            acked,
            total_rate,
            recent_rate,
            total_rate * config.size as f64 / 1e6,
            shared.reads.load(Ordering::Relaxed),
        );
        let mut err = std::io::stderr().lock();
        let _ = if tty {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }
    shared.stop.store(true, Ordering::Relaxed);
    if progress && tty {
        eprintln!();
    }
}

/// Waits for every worker (appends in flight finish, or fail after their
/// deadline, and count) and sums their results.
async fn merge(
    workers: Vec<tokio::task::JoinHandle<WorkerResult>>,
) -> Result<WorkerResult, String> {
    let mut total = WorkerResult::empty();
    for w in workers {
        let r = w.await.map_err(|e| format!("a bench client failed: {e}"))?;
        total
            .latency_us
            .add(&r.latency_us)
            .expect("histograms of equal bounds merge");
        total
            .read_latency_us
            .add(&r.read_latency_us)
            .expect("histograms of equal bounds merge");
        total.reads += r.reads;
        total.stale_misses += r.stale_misses;
        total.acknowledged += r.acknowledged;
        total.errors += r.errors;
        total.retries += r.retries;
        total.refused |= r.refused;
        total.index_range = widen(total.index_range, r.index_range);
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BenchConfig {
        BenchConfig {
            workload: Workload::Append,
            consistency: Consistency::Linearizable,
            endpoints: vec!["127.0.0.1:1".into()],
            per_endpoint: Duration::from_millis(100),
            clients: 4,
            size: 128,
            batch: 1,
            duration: Duration::from_secs(1),
            append_deadline: Duration::from_millis(300),
            tls: None,
        }
    }

    #[test]
    fn records_are_tagged_and_sized() {
        let r = record(0xab, 3, 17, 64);
        assert_eq!(r.len(), 64);
        assert!(r.starts_with(b"bench-000000ab-3-17-x"));
        assert_eq!(record(1, 2, 3, 5), b"bench");
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(config().check().is_ok());
        for bad in [
            BenchConfig {
                clients: 0,
                ..config()
            },
            BenchConfig {
                size: 0,
                ..config()
            },
            BenchConfig {
                batch: MAX_BATCH_RECORDS + 1,
                ..config()
            },
            BenchConfig {
                size: 1 << 20,
                batch: 1024,
                ..config()
            },
            BenchConfig {
                duration: Duration::ZERO,
                ..config()
            },
            BenchConfig {
                endpoints: vec![],
                ..config()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_summary_reports_what_was_recorded() {
        let mut latency_us = new_histogram();
        for us in [1000, 2000, 3000] {
            latency_us.record(us).unwrap();
        }
        let report = BenchReport {
            config: config(),
            run: 1,
            elapsed: Duration::from_secs(2),
            acknowledged: 3,
            errors: 1,
            retries: 2,
            latency_us,
            reads: 0,
            read_latency_us: new_histogram(),
            stale_misses: 0,
            index_range: Some((5, 7)),
            first_error: Some("boom".into()),
        };
        let j = report.to_json();
        assert_eq!(j["acknowledged"], 3);
        assert_eq!(j["records_per_s"], 1.5);
        assert_eq!(j["errors"], 1);
        assert_eq!(j["retries"], 2);
        assert_eq!(j["first_index"], 5);
        assert!((j["latency_ms"]["p50"].as_f64().unwrap() - 2.0).abs() < 0.01);
        let text = report.to_text();
        assert!(text.contains("1.5 records/s"), "{text}");
        assert!(text.contains("errors          1, retries 2"), "{text}");
    }

    #[tokio::test]
    async fn an_unreachable_cluster_counts_errors_not_records() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let report = run(
            BenchConfig {
                endpoints: vec![format!("127.0.0.1:{port}")],
                clients: 2,
                ..config()
            },
            false,
        )
        .await
        .unwrap();
        assert_eq!(report.acknowledged, 0);
        assert!(report.errors >= 2, "{report:?}");
        assert!(report.retries >= report.errors, "{report:?}");
    }
}
