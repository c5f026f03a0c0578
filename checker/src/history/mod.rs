//! The history of a run as typed values: client operations (appends and
//! reads, invocations and completions), nemesis events, each node's final
//! committed log, and the run's parameters.
//!
//! The format is the contract in `notes/jepsen-format.md` (summarised in
//! `checker/CHECKER.md`). This module owns the types and the structural
//! validation of single events; `files` owns reading and writing them as
//! files. It must never know anything of ringraft's code, and it never
//! panics on bad input: a malformed event is an error naming what is wrong.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod files;

pub use files::{
    HistoryError, HistoryWriter, MAX_LINE_BYTES, read_final_log, read_history, read_missing,
    read_run_info, write_final_log, write_history,
};

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

/// `f` of the nemesis events that bound a stale-leader window: phase
/// `start` is "node N was isolated from a majority while leader of term T",
/// phase `stop` is "healed, after another node was elected"; the value is
/// `{"node": N, "term": T}`. The stale-leader rules judge what was sent to
/// N inside such a window.
pub const ISOLATED_LEADER: &str = "isolated-leader";

impl Event {
    /// Node `node`, leader of `term`, is cut off from a majority (a
    /// partition, a frozen fabric, a paused process).
    pub fn leader_isolated(time: u64, node: u64, term: u64) -> Event {
        Event::nemesis(
            time,
            ISOLATED_LEADER,
            serde_json::json!({"node": node, "term": term}),
            Some(Phase::Start),
        )
    }

    /// The isolation of `node` (leader of `term`) is healed; by now another
    /// node leads a later term.
    pub fn leader_healed(time: u64, node: u64, term: u64) -> Event {
        Event::nemesis(
            time,
            ISOLATED_LEADER,
            serde_json::json!({"node": node, "term": term}),
            Some(Phase::Stop),
        )
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

/// Checks that a client operation `op` (`"append"`, `"read"`) of type
/// `kind` carries its result, `value.{field}`, exactly when it is an ok
/// completion: an ok one must, an invocation or a fail or info completion
/// must not.
fn result_only_when_ok(
    kind: EventType,
    has_result: bool,
    op: &str,
    field: &str,
) -> Result<(), String> {
    match (kind, has_result) {
        (EventType::Ok, false) => Err(format!("an ok {op} must carry value.{field}")),
        (EventType::Invoke | EventType::Fail | EventType::Info, true) => Err(format!(
            "only an ok {op} carries value.{field}, not {:?}",
            kind.as_str()
        )),
        _ => Ok(()),
    }
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
                        result_only_when_ok(raw.kind, v.index.is_some(), "append", "index")?;
                        Op::Append(v)
                    }
                    "read" => {
                        let v: ReadValue = serde_json::from_value(raw.value)
                            .map_err(|e| format!("read value: {e}"))?;
                        result_only_when_ok(raw.kind, v.records.is_some(), "read", "records")?;
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

impl FinalRecord {
    /// A record of `data` at `index`, written in `term`.
    pub fn new(index: u64, term: u64, data: impl Into<String>) -> FinalRecord {
        FinalRecord {
            index,
            term,
            data: data.into(),
        }
    }
}

/// Every node's final log: node id -> its committed records, in index order.
pub type FinalLogs = BTreeMap<u64, Vec<FinalRecord>>;

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

    /// An operation's result (an append's index, a read's records) comes
    /// with its ok completion and with nothing else.
    #[test]
    fn only_an_ok_completion_carries_the_result() {
        for (line, message) in [
            (
                r#"{"time":1,"process":0,"type":"ok","f":"append","value":{"data":"x"}}"#,
                "an ok append must carry value.index",
            ),
            (
                r#"{"time":1,"process":0,"type":"fail","f":"append","value":{"data":"x","index":1}}"#,
                r#"only an ok append carries value.index, not "fail""#,
            ),
            (
                r#"{"time":1,"process":0,"type":"ok","f":"read","value":{"from":1,"to":null,"consistency":"stale"}}"#,
                "an ok read must carry value.records",
            ),
            (
                r#"{"time":1,"process":0,"type":"info","f":"read","value":{"from":1,"to":null,"consistency":"stale","records":[]}}"#,
                r#"only an ok read carries value.records, not "info""#,
            ),
        ] {
            let err = parse(line).unwrap_err().to_string();
            assert!(err.contains(message), "{line}: {err}");
        }
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
}
