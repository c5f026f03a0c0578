//! The files a run leaves behind, as typed values: the operation history
//! (`history.jsonl`), each node's final committed log (`final/<id>.jsonl`,
//! `final/missing.json`) and the run parameters (`run.json`).
//!
//! The format is the contract in `notes/jepsen-format.md` (summarised in
//! `jepsen/CHECKER.md`). This module owns parsing and writing those files and
//! the structural validation of single lines; it must never know anything of
//! ringraft's code, and it never panics on bad input: every malformed line is
//! an error naming the file and the line.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest history line the reader accepts, in bytes: a read of a long range
/// carries many records, but a line beyond this is garbage, not a history.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Who issued an event: a client process, or the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Process {
    /// A client process. A process has at most one outstanding operation,
    /// and never invokes again after an `info` completion.
    Client(u64),
    /// The fault injector.
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Client(p) => write!(f, "{p}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(p) => s.serialize_u64(*p),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Number(n) => n.as_u64().map(Process::Client).ok_or_else(|| {
                serde::de::Error::custom(format!("process {n} is not an unsigned integer"))
            }),
            Value::String(s) if s == "nemesis" => Ok(Process::Nemesis),
            other => Err(serde::de::Error::custom(format!(
                "process must be an unsigned integer or \"nemesis\", got {other}"
            ))),
        }
    }
}

/// The type of an event: an invocation or one of the three completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// The operation was sent.
    Invoke,
    /// The operation took effect.
    Ok,
    /// The operation definitely did not take effect.
    Fail,
    /// The outcome is unknown (timeout, connection lost after sending).
    Info,
}

impl EventType {
    /// The name used in the JSON and EDN histories.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Invoke => "invoke",
            EventType::Ok => "ok",
            EventType::Fail => "fail",
            EventType::Info => "info",
        }
    }
}

/// Consistency level a read asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    /// Confirmed with a quorum (read index): must see every acknowledged write.
    Linearizable,
    /// Served under a leader lease: linearizable while clocks behave.
    Lease,
    /// The node's own committed log: may lag, must not diverge.
    Stale,
}

impl Consistency {
    /// The name used in the JSON and EDN histories.
    pub fn as_str(self) -> &'static str {
        match self {
            Consistency::Linearizable => "linearizable",
            Consistency::Lease => "lease",
            Consistency::Stale => "stale",
        }
    }
}

/// Value of an append: the unique data, on `ok` the index it was
/// acknowledged at, and optionally which client sent it and where in that
/// client's send order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendValue {
    /// The appended data, unique in the run.
    pub data: String,
    /// The log index the append was acknowledged at (`ok` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// The client (session) that sent it. A client may have several appends
    /// in flight, from several processes (e.g. the records of one request):
    /// its appends must land in its send order. With `seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<u64>,
    /// Its position in its client's send order (unique per client). With
    /// `client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// One record returned by a read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRecord {
    /// Log index of the record.
    pub index: u64,
    /// The record's data.
    pub data: String,
}

/// Value of a read: the range asked for, and on `ok` the records returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadValue {
    /// First index of the range.
    pub from: u64,
    /// Last index of the range; `None` reads up to the confirmed commit index.
    pub to: Option<u64>,
    /// Consistency level asked for.
    pub consistency: Consistency,
    /// Records returned (`ok` only), increasing indexes within the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<ReadRecord>>,
}

/// Phase of a nemesis fault window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The fault begins.
    Start,
    /// The fault ends.
    Stop,
}

impl Phase {
    /// The name used in the JSON and EDN histories.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::Stop => "stop",
        }
    }
}

/// The operation an event is about, with its typed value.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `f = "append"`.
    Append(AppendValue),
    /// `f = "read"`.
    Read(ReadValue),
    /// An event of the nemesis: `f` names the fault, `value` its targets.
    Nemesis {
        /// The fault (`partition`, `kill`, ...). Unknown names are kept: the
        /// checker uses nemesis events only to shade the plot.
        fault: String,
        /// Free-form description of the targets.
        value: Value,
        /// `start`/`stop` of the window; `None` for an instantaneous event.
        phase: Option<Phase>,
    },
}

impl Op {
    /// The operation name (`f`).
    pub fn f(&self) -> &str {
        match self {
            Op::Append(_) => "append",
            Op::Read(_) => "read",
            Op::Nemesis { fault, .. } => fault,
        }
    }
}

/// One line of `history.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawEvent", into = "RawEvent")]
pub struct Event {
    /// Nanoseconds since the run started (monotonic clock).
    pub time: u64,
    /// Who issued it.
    pub process: Process,
    /// Invocation or completion.
    pub kind: EventType,
    /// What operation, with its value.
    pub op: Op,
    /// The node the client talked to last.
    pub node: Option<u64>,
    /// Error text of a failed or unknown completion.
    pub error: Option<String>,
}

impl Event {
    /// Invocation of an append of `data` by client `process`.
    pub fn append_invoke(time: u64, process: u64, data: impl Into<String>) -> Event {
        Event::client(
            time,
            process,
            EventType::Invoke,
            Op::Append(AppendValue {
                data: data.into(),
                index: None,
                client: None,
                seq: None,
            }),
        )
    }

    /// Completion of an append: `Some(index)` for `ok`, `None` for `fail`/`info`.
    pub fn append_completion(
        time: u64,
        process: u64,
        kind: EventType,
        data: impl Into<String>,
        index: Option<u64>,
    ) -> Event {
        Event::client(
            time,
            process,
            kind,
            Op::Append(AppendValue {
                data: data.into(),
                index,
                client: None,
                seq: None,
            }),
        )
    }

    /// Invocation of a read of `[from, to]` (`to = None`: the tail).
    pub fn read_invoke(
        time: u64,
        process: u64,
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
    ) -> Event {
        Event::client(
            time,
            process,
            EventType::Invoke,
            Op::Read(ReadValue {
                from,
                to,
                consistency,
                records: None,
            }),
        )
    }

    /// Completion of a read: `Some(records)` for `ok`, `None` for `fail`/`info`.
    pub fn read_completion(
        time: u64,
        process: u64,
        kind: EventType,
        from: u64,
        to: Option<u64>,
        consistency: Consistency,
        records: Option<Vec<ReadRecord>>,
    ) -> Event {
        Event::client(
            time,
            process,
            kind,
            Op::Read(ReadValue {
                from,
                to,
                consistency,
                records,
            }),
        )
    }

    /// A nemesis event (`type` is always `info`).
    pub fn nemesis(
        time: u64,
        fault: impl Into<String>,
        value: Value,
        phase: Option<Phase>,
    ) -> Event {
        Event {
            time,
            process: Process::Nemesis,
            kind: EventType::Info,
            op: Op::Nemesis {
                fault: fault.into(),
                value,
                phase,
            },
            node: None,
            error: None,
        }
    }

    fn client(time: u64, process: u64, kind: EventType, op: Op) -> Event {
        Event {
            time,
            process: Process::Client(process),
            kind,
            op,
            node: None,
            error: None,
        }
    }

    /// Sets the client (session) an append was sent by and its place in
    /// that client's send order; other events are returned unchanged.
    pub fn in_client(mut self, client: u64, seq: u64) -> Event {
        if let Op::Append(v) = &mut self.op {
            v.client = Some(client);
            v.seq = Some(seq);
        }
        self
    }

    /// Sets the node the client talked to.
    pub fn with_node(mut self, node: u64) -> Event {
        self.node = Some(node);
        self
    }

    /// Sets the error text.
    pub fn with_error(mut self, error: impl Into<String>) -> Event {
        self.error = Some(error.into());
        self
    }

    /// The value as the JSON history holds it.
    pub fn value_json(&self) -> Value {
        let encoded = match &self.op {
            Op::Append(v) => serde_json::to_value(v),
            Op::Read(v) => serde_json::to_value(v),
            Op::Nemesis { value, .. } => Ok(value.clone()),
        };
        // Serializing plain structs of strings and integers cannot fail.
        encoded.expect("history values always serialize")
    }
}

/// The wire shape of an event, before typing.
#[derive(Serialize, Deserialize)]
struct RawEvent {
    time: u64,
    process: Process,
    #[serde(rename = "type")]
    kind: EventType,
    f: String,
    #[serde(default)]
    value: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
}

impl TryFrom<RawEvent> for Event {
    type Error = String;

    fn try_from(raw: RawEvent) -> Result<Event, String> {
        let op = match raw.process {
            Process::Nemesis => {
                if raw.kind != EventType::Info {
                    return Err(format!(
                        "nemesis events have type \"info\", not {:?}",
                        raw.kind.as_str()
                    ));
                }
                Op::Nemesis {
                    fault: raw.f,
                    value: raw.value,
                    phase: raw.phase,
                }
            }
            Process::Client(_) => {
                if raw.phase.is_some() {
                    return Err("\"phase\" belongs to nemesis events only".into());
                }
                match raw.f.as_str() {
                    "append" => {
                        let v: AppendValue = serde_json::from_value(raw.value)
                            .map_err(|e| format!("append value: {e}"))?;
                        if v.client.is_some() != v.seq.is_some() {
                            return Err("an append's value.client and value.seq go together".into());
                        }
                        match (raw.kind, v.index) {
                            (EventType::Ok, None) => {
                                return Err("an ok append must carry value.index".into());
                            }
                            (EventType::Invoke | EventType::Fail | EventType::Info, Some(_)) => {
                                return Err(format!(
                                    "only an ok append carries value.index, not {:?}",
                                    raw.kind.as_str()
                                ));
                            }
                            _ => {}
                        }
                        Op::Append(v)
                    }
                    "read" => {
                        let v: ReadValue = serde_json::from_value(raw.value)
                            .map_err(|e| format!("read value: {e}"))?;
                        match (raw.kind, &v.records) {
                            (EventType::Ok, None) => {
                                return Err("an ok read must carry value.records".into());
                            }
                            (EventType::Invoke | EventType::Fail | EventType::Info, Some(_)) => {
                                return Err(format!(
                                    "only an ok read carries value.records, not {:?}",
                                    raw.kind.as_str()
                                ));
                            }
                            _ => {}
                        }
                        Op::Read(v)
                    }
                    other => {
                        return Err(format!(
                            "unknown client operation f={other:?} (expected \"append\" or \"read\")"
                        ));
                    }
                }
            }
        };
        Ok(Event {
            time: raw.time,
            process: raw.process,
            kind: raw.kind,
            op,
            node: raw.node,
            error: raw.error,
        })
    }
}

impl From<Event> for RawEvent {
    fn from(ev: Event) -> RawEvent {
        let value = ev.value_json();
        let (f, phase) = match ev.op {
            Op::Append(_) => ("append".to_string(), None),
            Op::Read(_) => ("read".to_string(), None),
            Op::Nemesis { fault, phase, .. } => (fault, phase),
        };
        RawEvent {
            time: ev.time,
            process: ev.process,
            kind: ev.kind,
            f,
            value,
            node: ev.node,
            error: ev.error,
            phase,
        }
    }
}

/// One line of `final/<node-id>.jsonl`: a committed record a node holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalRecord {
    /// Log index.
    pub index: u64,
    /// Term of the entry.
    pub term: u64,
    /// The record's data.
    pub data: String,
}

/// A node whose final log could not be read (`final/missing.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingNode {
    /// The node id.
    pub node: u64,
    /// Why it could not be read.
    pub reason: String,
}

/// `run.json`: the run's parameters. Unknown keys are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Seed of the schedule.
    pub seed: u64,
    /// `netns` or `softroce`.
    pub substrate: String,
    /// The node ids of the cluster.
    pub nodes: Vec<u64>,
    /// Nemeses enabled.
    pub nemeses: Vec<String>,
    /// Length of the workload phase, in seconds.
    pub duration_s: f64,
    /// Number of concurrent clients.
    pub clients: u64,
    /// Name of a planted bug switched on for this run, if any.
    #[serde(default)]
    pub planted_bug: Option<String>,
    /// Wall-clock start of the run, RFC 3339.
    pub started_at: String,
}

/// A run file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not what the contract says.
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number (0 for a whole-file document such as run.json).
        line: usize,
        /// What is wrong.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a JSON-lines file into `T`s; blank lines are skipped.
fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>, HistoryError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut reader = BufReader::new(file);
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        number += 1;
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LINE_BYTES {
            return Err(HistoryError::Parse {
                path: path.to_path_buf(),
                line: number,
                message: format!("line longer than {MAX_LINE_BYTES} bytes"),
            });
        }
        let text = std::str::from_utf8(&line).map_err(|e| HistoryError::Parse {
            path: path.to_path_buf(),
            line: number,
            message: format!("not UTF-8: {e}"),
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let item = serde_json::from_str(text).map_err(|e| HistoryError::Parse {
            path: path.to_path_buf(),
            line: number,
            message: e.to_string(),
        })?;
        out.push(item);
    }
    Ok(out)
}

/// Reads `history.jsonl`. Each line is checked on its own (shape, types,
/// `index`/`records` only on `ok`); cross-line rules (one outstanding
/// operation per process, ...) are the checker's.
pub fn read_history(path: &Path) -> Result<Vec<Event>, HistoryError> {
    read_jsonl(path)
}

/// Reads one node's `final/<id>.jsonl`.
pub fn read_final_log(path: &Path) -> Result<Vec<FinalRecord>, HistoryError> {
    read_jsonl(path)
}

/// Reads `final/missing.json`: either `[{"node": id, "reason": ".."}, ...]`
/// or an object `{"<id>": "<reason>", ...}`.
pub fn read_missing(path: &Path) -> Result<Vec<MissingNode>, HistoryError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let parse_err = |message: String| HistoryError::Parse {
        path: path.to_path_buf(),
        line: 0,
        message,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?;
    match value {
        Value::Array(_) => serde_json::from_value(value).map_err(|e| parse_err(e.to_string())),
        Value::Object(map) => map
            .into_iter()
            .map(|(node, reason)| {
                let node = node
                    .parse::<u64>()
                    .map_err(|_| parse_err(format!("key {node:?} is not a node id")))?;
                let reason = match reason {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                Ok(MissingNode { node, reason })
            })
            .collect(),
        other => Err(parse_err(format!(
            "expected an array or an object, got {other}"
        ))),
    }
}

/// Reads `run.json`.
pub fn read_run_info(path: &Path) -> Result<RunInfo, HistoryError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| HistoryError::Parse {
        path: path.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    })
}

/// Appends events to `history.jsonl`, one JSON line each, flushed per line so
/// that a run killed half-way leaves a readable prefix. Shareable between
/// tasks (`&self`); [`HistoryWriter::record`] stamps the time under the lock,
/// so the file order is the time order.
pub struct HistoryWriter {
    started: Instant,
    out: Mutex<BufWriter<File>>,
}

impl HistoryWriter {
    /// Creates (truncates) `path`; times are measured from `started`.
    pub fn create(path: &Path, started: Instant) -> Result<HistoryWriter, HistoryError> {
        let file = File::create(path).map_err(io_err(path))?;
        Ok(HistoryWriter {
            started,
            out: Mutex::new(BufWriter::new(file)),
        })
    }

    /// Nanoseconds since `started`.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Writes `event` with its time set to now; returns that time.
    pub fn record(&self, mut event: Event) -> std::io::Result<u64> {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        event.time = self.now_ns();
        write_line(&mut out, &event)?;
        Ok(event.time)
    }

    /// Writes `event` with the time it carries.
    pub fn write(&self, event: &Event) -> std::io::Result<()> {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        write_line(&mut out, event)
    }
}

fn write_line(out: &mut BufWriter<File>, event: &Event) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Writes a whole history to `path` (tests and tools).
pub fn write_history(path: &Path, events: &[Event]) -> Result<(), HistoryError> {
    let file = File::create(path).map_err(io_err(path))?;
    let mut out = BufWriter::new(file);
    for ev in events {
        write_line(&mut out, ev).map_err(io_err(path))?;
    }
    Ok(())
}

/// Writes one node's final log to `path` (the runner and tests).
pub fn write_final_log(path: &Path, records: &[FinalRecord]) -> Result<(), HistoryError> {
    let file = File::create(path).map_err(io_err(path))?;
    let mut out = BufWriter::new(file);
    let mut write = || -> std::io::Result<()> {
        for rec in records {
            serde_json::to_writer(&mut out, rec)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    };
    write().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn events_round_trip_through_json() {
        let events = vec![
            Event::append_invoke(1, 0, "a\"\n").with_node(2),
            Event::append_completion(5, 0, EventType::Ok, "a\"\n", Some(3)).with_node(2),
            Event::append_invoke(5, 4, "b").in_client(7, 2),
            Event::append_completion(6, 4, EventType::Ok, "b", Some(4)).in_client(7, 2),
            Event::read_invoke(6, 1, 1, None, Consistency::Linearizable),
            Event::read_completion(
                9,
                1,
                EventType::Ok,
                1,
                None,
                Consistency::Linearizable,
                Some(vec![ReadRecord {
                    index: 3,
                    data: "a\"\n".into(),
                }]),
            ),
            Event::read_completion(9, 2, EventType::Info, 1, Some(4), Consistency::Stale, None)
                .with_error("timeout"),
            Event::nemesis(
                10,
                "partition",
                serde_json::json!({"groups": [[1], [2, 3]]}),
                Some(Phase::Start),
            ),
        ];
        for ev in events {
            let line = serde_json::to_string(&ev).unwrap();
            assert_eq!(parse(&line).unwrap(), ev, "{line}");
        }
    }

    #[test]
    fn contract_examples_parse() {
        let ev = parse(r#"{"time":7,"process":3,"type":"ok","f":"append","value":{"data":"x","index":4},"node":1}"#)
            .unwrap();
        assert_eq!(
            ev.op,
            Op::Append(AppendValue {
                data: "x".into(),
                index: Some(4),
                client: None,
                seq: None,
            })
        );
        let ev = parse(r#"{"time":7,"process":3,"type":"invoke","f":"append","value":{"data":"x","client":9,"seq":1}}"#)
            .unwrap();
        assert_eq!(ev, Event::append_invoke(7, 3, "x").in_client(9, 1));
        let ev = parse(r#"{"time":7,"process":"nemesis","type":"info","f":"kill","value":[2],"phase":"start"}"#)
            .unwrap();
        assert_eq!(ev.process, Process::Nemesis);
        let ev = parse(
            r#"{"time":8,"process":1,"type":"ok","f":"read","value":{"from":1,"to":null,"consistency":"lease","records":[]}}"#,
        )
        .unwrap();
        assert!(matches!(ev.op, Op::Read(ReadValue { to: None, .. })));
    }

    #[test]
    fn malformed_events_are_rejected() {
        for bad in [
            r#"{"time":1,"process":0,"type":"ok","f":"append","value":{"data":"x"}}"#,
            r#"{"time":1,"process":0,"type":"invoke","f":"append","value":{"data":"x","index":1}}"#,
            r#"{"time":1,"process":0,"type":"ok","f":"read","value":{"from":1,"to":null,"consistency":"stale"}}"#,
            r#"{"time":1,"process":0,"type":"invoke","f":"cas","value":{}}"#,
            r#"{"time":1,"process":-1,"type":"invoke","f":"append","value":{"data":"x"}}"#,
            r#"{"time":1,"process":"bob","type":"invoke","f":"append","value":{"data":"x"}}"#,
            r#"{"time":1,"process":"nemesis","type":"ok","f":"kill","value":null}"#,
            r#"{"time":1,"process":0,"type":"maybe","f":"append","value":{"data":"x"}}"#,
            r#"{"time":1,"process":0,"type":"invoke","f":"read","value":{"from":1,"to":2,"consistency":"eventual"}}"#,
            r#"{"time":1,"process":0,"type":"invoke","f":"append","value":{"data":"x","client":1}}"#,
            r#"{"time":1,"process":0,"type":"invoke","f":"append","value":{"data":"x","seq":1}}"#,
        ] {
            assert!(parse(bad).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn reader_names_the_bad_line() {
        let dir =
            std::env::temp_dir().join(format!("ringraft-jepsen-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        std::fs::write(
            &path,
            "{\"time\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"append\",\"value\":{\"data\":\"x\"}}\n\n{\"time\":2,\n",
        )
        .unwrap();
        let err = read_history(&path).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, HistoryError::Parse { line: 3, .. }), "{text}");
        assert!(text.contains("history.jsonl:3"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writer_appends_flushed_lines_in_time_order() {
        let dir =
            std::env::temp_dir().join(format!("ringraft-jepsen-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let writer = HistoryWriter::create(&path, Instant::now()).unwrap();
        let t1 = writer.record(Event::append_invoke(0, 0, "a")).unwrap();
        // Flushed per line: readable while the writer is still open.
        assert_eq!(read_history(&path).unwrap().len(), 1);
        let t2 = writer
            .record(Event::append_completion(0, 0, EventType::Ok, "a", Some(1)))
            .unwrap();
        assert!(t2 >= t1);
        let events = read_history(&path).unwrap();
        assert_eq!(
            events.iter().map(|e| e.time).collect::<Vec<_>>(),
            vec![t1, t2]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_json_accepts_both_shapes() {
        let dir =
            std::env::temp_dir().join(format!("ringraft-jepsen-missing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("missing.json");
        std::fs::write(&path, r#"[{"node":3,"reason":"timeout"}]"#).unwrap();
        assert_eq!(
            read_missing(&path).unwrap(),
            vec![MissingNode {
                node: 3,
                reason: "timeout".into()
            }]
        );
        std::fs::write(&path, r#"{"4":"refused"}"#).unwrap();
        assert_eq!(
            read_missing(&path).unwrap(),
            vec![MissingNode {
                node: 4,
                reason: "refused".into()
            }]
        );
        std::fs::write(&path, r#"{"x":"refused"}"#).unwrap();
        assert!(read_missing(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
