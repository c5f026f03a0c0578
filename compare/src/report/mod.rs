//! The results file and the side-by-side table: pure functions over what
//! the runs measured, no clock, no I/O.
//!
//! Every `load` run and every `floor` measurement appends one JSON line
//! ([`ResultLine`]) to the results file; `table` reads them all back,
//! merges the rounds of each (system, durability, clients, record size)
//! and renders one markdown document: the side-by-side table with
//! ringraft ÷ etcd ratios, the physical floor, and every round on its own.
//!
//! Merging rounds: latency percentiles come from the union of the rounds'
//! histograms (every operation weighs the same); throughput is all
//! operations over all measured seconds. The per-round table shows the
//! spread.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency a histogram holds, nanoseconds (60 s).
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;
/// Significant decimal digits the histograms keep.
const HISTOGRAM_DIGITS: u8 = 3;

/// What went wrong reading or merging results.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A line of the results file is not a result.
    #[error("results line {line}: {source}")]
    Json {
        /// 1-based line number.
        line: usize,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// A histogram bucket cannot be recorded (a value above
    /// [`MAX_LATENCY_NS`] or a count that overflows).
    #[error("results line {line}: bad histogram bucket [{value}, {count}]")]
    Bucket {
        /// 1-based line number (0: not from a file).
        line: usize,
        /// The bucket's value, nanoseconds.
        value: u64,
        /// Its count.
        count: u64,
    },
    /// The results hold no run at all.
    #[error("the results hold no run")]
    Empty,
}

/// The system under load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(clap::ValueEnum)]
pub enum System {
    /// `ringraft serve`, Append of one record.
    Ringraft,
    /// etcd 3.4, KV.Put of a fresh key.
    Etcd,
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            System::Ringraft => "ringraft",
            System::Etcd => "etcd",
        })
    }
}

/// Which durability the row compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(clap::ValueEnum)]
pub enum Durability {
    /// ringraft `--durability fsync` against etcd's default (fsync).
    Fsync,
    /// ringraft `--durability memory` against etcd `--unsafe-no-fsync`.
    Memory,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Fsync => "fsync",
            Durability::Memory => "memory",
        })
    }
}

/// A latency histogram as stored in the results file: `[value_ns, count]`
/// per non-empty bucket, in increasing value.
pub type Buckets = Vec<[u64; 2]>;

/// An empty latency histogram, nanoseconds, 1 ns to [`MAX_LATENCY_NS`].
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, HISTOGRAM_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// The non-empty buckets of `histogram`.
pub fn to_buckets(histogram: &Histogram<u64>) -> Buckets {
    histogram
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect()
}

/// Adds `buckets` to `histogram`.
///
/// # Errors
/// [`ReportError::Bucket`] when a value is out of range.
pub fn add_buckets(
    histogram: &mut Histogram<u64>,
    buckets: &[[u64; 2]],
    line: usize,
) -> Result<(), ReportError> {
    for &[value, count] in buckets {
        histogram
            .record_n(value, count)
            .map_err(|_| ReportError::Bucket { line, value, count })?;
    }
    Ok(())
}

/// One `load` run: one system, one cluster, one workload, one round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The system.
    pub system: System,
    /// The durability compared.
    pub durability: Durability,
    /// 1-based round.
    pub round: u32,
    /// Concurrent closed-loop clients.
    pub clients: usize,
    /// Bytes per record (ringraft) or per value (etcd).
    pub size_bytes: usize,
    /// gRPC connections the clients shared.
    pub connections: usize,
    /// Seconds from the end of the warm-up to the last answer counted.
    pub measured_s: f64,
    /// Operations acknowledged in the measured window.
    pub ops: u64,
    /// Operations that failed or timed out in the measured window.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// Latency of each acknowledged operation.
    pub latency_ns: Buckets,
}

/// One `floor` measurement: what the machine itself costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloorResult {
    /// 1-based round.
    pub round: u32,
    /// The directory the file was written in (where the data dirs are).
    pub dir: String,
    /// One 4 KiB pwrite + fdatasync into a preallocated file.
    pub fdatasync_ns: Buckets,
    /// One 4 KiB pwrite + fdatasync appended at the end of a growing file
    /// (the file size changes, so the inode is flushed too).
    pub fdatasync_append_ns: Buckets,
    /// One 64-byte ping-pong over loopback TCP.
    pub rtt_ns: Buckets,
}

/// A line of the results file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ResultLine {
    /// A load run.
    Run(RunResult),
    /// A floor measurement.
    Floor(FloorResult),
}

/// Parses a results file (one JSON object a line; blank lines skipped).
///
/// # Errors
/// [`ReportError::Json`] naming the first line that is not a result.
pub fn parse_results(text: &str) -> Result<Vec<ResultLine>, ReportError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(k, l)| {
            serde_json::from_str(l).map_err(|source| ReportError::Json {
                line: k + 1,
                source,
            })
        })
        .collect()
}

/// Latency percentiles and throughput of one or more runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// 99.9th percentile, milliseconds.
    pub p999_ms: f64,
    /// Acknowledged operations per second.
    pub ops_per_s: f64,
    /// Operations that failed.
    pub errors: u64,
    /// Latency samples (acknowledged operations).
    pub samples: u64,
    /// Runs merged.
    pub runs: usize,
}

fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(q) as f64 / 1e6
}

/// Merges runs into one summary (see the module docs).
///
/// # Errors
/// [`ReportError::Bucket`] for a bad histogram; [`ReportError::Empty`]
/// when `runs` is empty.
pub fn summarize(runs: &[&RunResult]) -> Result<Summary, ReportError> {
    if runs.is_empty() {
        return Err(ReportError::Empty);
    }
    let mut h = new_histogram();
    for r in runs {
        add_buckets(&mut h, &r.latency_ns, 0)?;
    }
    let ops: u64 = runs.iter().map(|r| r.ops).sum();
    let secs: f64 = runs.iter().map(|r| r.measured_s).sum();
    Ok(Summary {
        p50_ms: quantile_ms(&h, 0.5),
        p99_ms: quantile_ms(&h, 0.99),
        p999_ms: quantile_ms(&h, 0.999),
        ops_per_s: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
        errors: runs.iter().map(|r| r.errors).sum(),
        samples: h.len(),
        runs: runs.len(),
    })
}

/// `ours ÷ theirs`, or `None` when it means nothing (either side zero,
/// negative or not finite).
pub fn ratio(ours: f64, theirs: f64) -> Option<f64> {
    if ours.is_finite() && theirs.is_finite() && ours > 0.0 && theirs > 0.0 {
        Some(ours / theirs)
    } else {
        None
    }
}

/// What a row compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RowKey {
    /// Durability (fsync rows first).
    pub durability: Durability,
    /// Clients.
    pub clients: usize,
    /// Record size, bytes.
    pub size_bytes: usize,
}

/// ringraft ÷ etcd for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratios {
    /// p50 latency ratio (below 1: ringraft is faster).
    pub p50: Option<f64>,
    /// p99 latency ratio.
    pub p99: Option<f64>,
    /// p999 latency ratio.
    pub p999: Option<f64>,
    /// Throughput ratio (above 1: ringraft is faster).
    pub throughput: Option<f64>,
}

/// One row of the side-by-side table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What it compares.
    pub key: RowKey,
    /// ringraft's rounds merged, if it ran.
    pub ringraft: Option<Summary>,
    /// etcd's rounds merged, if it ran.
    pub etcd: Option<Summary>,
}

impl Row {
    /// ringraft ÷ etcd (all `None` when a side is missing).
    pub fn ratios(&self) -> Ratios {
        let pick = |f: fn(&Summary) -> f64| match (&self.ringraft, &self.etcd) {
            (Some(r), Some(e)) => ratio(f(r), f(e)),
            _ => None,
        };
        Ratios {
            p50: pick(|s| s.p50_ms),
            p99: pick(|s| s.p99_ms),
            p999: pick(|s| s.p999_ms),
            throughput: pick(|s| s.ops_per_s),
        }
    }
}

/// The floor, all rounds merged.
#[derive(Clone, Debug, PartialEq)]
pub struct FloorSummary {
    /// Directories measured (one per distinct `dir`).
    pub dirs: Vec<String>,
    /// pwrite + fdatasync into a preallocated file: p50, p99 (ms), samples.
    pub fdatasync: (f64, f64, u64),
    /// The same, appending: p50, p99 (ms), samples.
    pub fdatasync_append: (f64, f64, u64),
    /// Loopback round trip: p50, p99 (ms), samples.
    pub rtt: (f64, f64, u64),
    /// Rounds merged.
    pub rounds: usize,
}

/// Everything the markdown shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Side-by-side rows, fsync first, then by clients and size.
    pub rows: Vec<Row>,
    /// The floor, if measured.
    pub floor: Option<FloorSummary>,
    /// Every run, in (durability, clients, size, system, round) order.
    pub runs: Vec<(RunResult, Summary)>,
}

/// Groups and merges the results.
///
/// # Errors
/// [`ReportError::Empty`] without any run; [`ReportError::Bucket`] for a
/// bad histogram.
pub fn build_table(lines: &[ResultLine]) -> Result<Table, ReportError> {
    let mut by_row: BTreeMap<RowKey, BTreeMap<System, Vec<&RunResult>>> = BTreeMap::new();
    let mut floors = Vec::new();
    for line in lines {
        match line {
            ResultLine::Run(r) => by_row
                .entry(RowKey {
                    durability: r.durability,
                    clients: r.clients,
                    size_bytes: r.size_bytes,
                })
                .or_default()
                .entry(r.system)
                .or_default()
                .push(r),
            ResultLine::Floor(f) => floors.push(f),
        }
    }
    if by_row.is_empty() {
        return Err(ReportError::Empty);
    }
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for (key, systems) in &by_row {
        let side = |s: System| systems.get(&s).map(|v| summarize(v)).transpose();
        rows.push(Row {
            key: *key,
            ringraft: side(System::Ringraft)?,
            etcd: side(System::Etcd)?,
        });
        for v in systems.values() {
            let mut v = v.clone();
            v.sort_by_key(|r| r.round);
            for r in v {
                runs.push((r.clone(), summarize(&[r])?));
            }
        }
    }
    let floor = if floors.is_empty() {
        None
    } else {
        let merged = |pick: fn(&FloorResult) -> &Buckets| -> Result<(f64, f64, u64), ReportError> {
            let mut h = new_histogram();
            for f in &floors {
                add_buckets(&mut h, pick(f), 0)?;
            }
            Ok((quantile_ms(&h, 0.5), quantile_ms(&h, 0.99), h.len()))
        };
        let mut dirs: Vec<String> = floors.iter().map(|f| f.dir.clone()).collect();
        dirs.sort();
        dirs.dedup();
        Some(FloorSummary {
            dirs,
            fdatasync: merged(|f| &f.fdatasync_ns)?,
            fdatasync_append: merged(|f| &f.fdatasync_append_ns)?,
            rtt: merged(|f| &f.rtt_ns)?,
            rounds: floors.len(),
        })
    };
    Ok(Table { rows, floor, runs })
}

mod markdown;

pub use markdown::{Meta, fmt_ms, fmt_rate, fmt_ratio, fmt_size, render_markdown};

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: System, round: u32, latencies_us: &[u64], ops: u64, secs: f64) -> RunResult {
        let mut h = new_histogram();
        for us in latencies_us {
            h.record(us * 1000).unwrap();
        }
        RunResult {
            system,
            durability: Durability::Fsync,
            round,
            clients: 1,
            size_bytes: 64,
            connections: 1,
            measured_s: secs,
            ops,
            errors: 0,
            first_error: None,
            latency_ns: to_buckets(&h),
        }
    }

    #[test]
    fn ratios_are_ringraft_over_etcd_and_undefined_against_zero() {
        assert_eq!(ratio(1.0, 2.0), Some(0.5));
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(0.0, 1.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
    }

    /// Rounds merge by operation (histograms united) and by time
    /// (throughput = all ops ÷ all seconds), not by averaging averages.
    #[test]
    fn rounds_merge_by_operation_and_by_time() {
        let a = run(System::Ringraft, 1, &[1000; 10], 10, 1.0);
        let b = run(System::Ringraft, 2, &[3000; 30], 30, 3.0);
        let s = summarize(&[&a, &b]).unwrap();
        assert_eq!(s.samples, 40);
        assert_eq!(s.runs, 2);
        assert!((s.ops_per_s - 10.0).abs() < 1e-9, "{}", s.ops_per_s);
        assert!((s.p50_ms - 3.0).abs() < 0.01, "{}", s.p50_ms);
        assert!(matches!(summarize(&[]), Err(ReportError::Empty)));
    }

    #[test]
    fn a_row_compares_the_two_systems_and_lacks_ratios_without_one() {
        let r = run(System::Ringraft, 1, &[500; 100], 200, 1.0);
        let e = run(System::Etcd, 1, &[1000; 100], 100, 1.0);
        let table = build_table(&[ResultLine::Run(r.clone()), ResultLine::Run(e)]).unwrap();
        assert_eq!(table.rows.len(), 1);
        let ratios = table.rows[0].ratios();
        assert!((ratios.p50.unwrap() - 0.5).abs() < 0.01, "{ratios:?}");
        assert!(
            (ratios.throughput.unwrap() - 2.0).abs() < 1e-9,
            "{ratios:?}"
        );
        assert_eq!(table.runs.len(), 2);

        let alone = build_table(&[ResultLine::Run(r)]).unwrap();
        assert_eq!(alone.rows[0].etcd, None);
        assert_eq!(alone.rows[0].ratios().p50, None);
        assert!(matches!(build_table(&[]), Err(ReportError::Empty)));
    }

    #[test]
    fn rows_are_ordered_fsync_first_then_by_clients_and_size() {
        let mut lines = Vec::new();
        for (d, c, s) in [
            (Durability::Memory, 1, 64),
            (Durability::Fsync, 64, 64),
            (Durability::Fsync, 1, 4096),
            (Durability::Fsync, 1, 64),
        ] {
            let mut r = run(System::Etcd, 1, &[100], 1, 1.0);
            r.durability = d;
            r.clients = c;
            r.size_bytes = s;
            lines.push(ResultLine::Run(r));
        }
        let keys: Vec<(Durability, usize, usize)> = build_table(&lines)
            .unwrap()
            .rows
            .iter()
            .map(|r| (r.key.durability, r.key.clients, r.key.size_bytes))
            .collect();
        assert_eq!(
            keys,
            vec![
                (Durability::Fsync, 1, 64),
                (Durability::Fsync, 1, 4096),
                (Durability::Fsync, 64, 64),
                (Durability::Memory, 1, 64),
            ]
        );
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(fmt_ms(0.9254), "0.925");
        assert_eq!(fmt_ms(1.234), "1.23");
        assert_eq!(fmt_ms(17.84), "17.8");
        assert_eq!(fmt_ms(142.4), "142");
        assert_eq!(fmt_ms(0.0), "–");
        assert_eq!(fmt_rate(17812.6), "17813");
        assert_eq!(fmt_rate(12.34), "12.3");
        assert_eq!(fmt_ratio(Some(0.7449)), "0.74");
        assert_eq!(fmt_ratio(Some(0.0449)), "0.045");
        assert_eq!(fmt_ratio(None), "–");
        assert_eq!(fmt_size(64), "64 B");
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
    }

    /// The results file round-trips, and a bad line is named.
    #[test]
    fn results_lines_round_trip_and_bad_lines_are_named() {
        let r = ResultLine::Run(run(System::Etcd, 2, &[250, 260], 2, 0.5));
        let f = ResultLine::Floor(FloorResult {
            round: 1,
            dir: "/tmp/x".into(),
            fdatasync_ns: vec![[100_000, 3]],
            fdatasync_append_ns: vec![[200_000, 3]],
            rtt_ns: vec![[30_000, 5]],
        });
        let text = format!(
            "{}\n\n{}\n",
            serde_json::to_string(&r).unwrap(),
            serde_json::to_string(&f).unwrap()
        );
        assert!(text.contains("\"kind\":\"run\""), "{text}");
        assert_eq!(parse_results(&text).unwrap(), vec![r, f]);
        let err = parse_results(&format!("{text}{{\"kind\":\"nope\"}}\n")).unwrap_err();
        assert!(matches!(err, ReportError::Json { line: 4, .. }), "{err}");
        let mut bad = run(System::Etcd, 1, &[], 0, 1.0);
        bad.latency_ns = vec![[MAX_LATENCY_NS * 10, 1]];
        assert!(matches!(
            summarize(&[&bad]),
            Err(ReportError::Bucket { .. })
        ));
    }

    /// The markdown says which way the ratios go, shows both sides, the
    /// floor and its ratio, every round, and flags failed operations.
    #[test]
    fn the_markdown_has_the_table_the_floor_and_the_rounds() {
        let r = run(System::Ringraft, 1, &[400; 10], 10, 1.0);
        let mut e = run(System::Etcd, 1, &[800; 10], 5, 1.0);
        e.errors = 2;
        let f = FloorResult {
            round: 1,
            dir: "/tmp/x".into(),
            fdatasync_ns: vec![[200_000, 10]],
            fdatasync_append_ns: vec![[300_000, 10]],
            rtt_ns: vec![[40_000, 10]],
        };
        let table =
            build_table(&[ResultLine::Run(r), ResultLine::Run(e), ResultLine::Floor(f)]).unwrap();
        let md = render_markdown(
            &table,
            &Meta {
                command: Some("scripts/compare.sh --quick".into()),
                date: Some("2026-12-01".into()),
                machine: Some("2 cores".into()),
                systems: None,
            },
        );
        assert!(md.contains("ringraft ÷ etcd"), "{md}");
        assert!(md.contains("below 1"), "{md}");
        assert!(md.contains("scripts/compare.sh --quick"), "{md}");
        assert!(md.contains("Measured 2026-12-01."), "{md}");
        let row = md
            .lines()
            .find(|l| l.starts_with("| fsync") && l.contains("0.400"))
            .unwrap_or_else(|| panic!("no fsync row:\n{md}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | durability | clients | record | r p50 p99 p999 ops | e p50 p99 p999 ops | ratios |
        assert_eq!(&cells[1..4], &["fsync", "1", "64 B"], "{row}");
        assert_eq!(cells[4], "0.400", "{row}");
        assert_eq!(cells[7], "10.0", "{row}");
        assert_eq!(cells[8], "0.800", "{row}");
        assert_eq!(cells[11], "5.0", "{row}");
        assert_eq!(&cells[12..16], &["0.50", "0.50", "0.50", "2.00"], "{row}");
        assert!(
            md.contains("4 KiB pwrite + fdatasync, preallocated file"),
            "{md}"
        );
        assert!(md.contains("64 B ringraft 2.00, etcd 4.00"), "{md}");
        assert!(md.contains("etcd fsync 1 clients 64 B: 2 errors"), "{md}");
        assert_eq!(
            md.lines().filter(|l| l.starts_with("| fsync")).count(),
            3,
            "one side-by-side row and two rounds:\n{md}"
        );
        // Every line of a table has the same number of cells.
        for block in md.split("\n\n") {
            let widths: Vec<usize> = block
                .lines()
                .filter(|l| l.starts_with('|'))
                .map(|l| l.matches('|').count())
                .collect();
            assert!(widths.windows(2).all(|w| w[0] == w[1]), "{block}");
        }
    }
}
