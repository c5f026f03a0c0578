//! `history.edn`: the history in Jepsen's EDN format, one map per line.
//!
//! This module owns the EDN encoding of events (strings, keywords, JSON
//! values as EDN); it must never change what an event says, only its
//! spelling.

use std::fmt::Write as _;

use serde_json::Value;

use crate::history::{Event, Op, Process};

/// `history.edn`: one EDN map per line, in history order, as Jepsen writes
/// it: `{:index 0, :type :invoke, :f :append, :value {:data "x"}, :process 0, :time 12}`.
pub fn render_edn(events: &[Event]) -> String {
    let mut out = String::new();
    for (i, ev) in events.iter().enumerate() {
        out.push_str(&edn_event(i, ev));
        out.push('\n');
    }
    out
}

/// One event as an EDN map; `index` is its position in the history.
pub fn edn_event(index: usize, ev: &Event) -> String {
    let mut s = format!("{{:index {index}, :type :{}, :f ", ev.kind.as_str());
    match &ev.op {
        Op::Nemesis { fault, .. } => s.push_str(&edn_keyword_or_string(fault)),
        other => {
            s.push(':');
            s.push_str(other.f());
        }
    }
    s.push_str(", :value ");
    match &ev.op {
        Op::Append(v) => {
            let _ = write!(s, "{{:data {}", edn_string(&v.data));
            if let Some(index) = v.index {
                let _ = write!(s, ", :index {index}");
            }
            if let (Some(client), Some(seq)) = (v.client, v.seq) {
                let _ = write!(s, ", :client {client}, :seq {seq}");
            }
            s.push('}');
        }
        Op::Read(v) => {
            let _ = write!(
                s,
                "{{:from {}, :to {}, :consistency :{}",
                v.from,
                v.to.map_or("nil".to_string(), |t| t.to_string()),
                v.consistency.as_str()
            );
            if let Some(records) = &v.records {
                s.push_str(", :records [");
                for (i, rec) in records.iter().enumerate() {
                    if i > 0 {
                        s.push(' ');
                    }
                    let _ = write!(
                        s,
                        "{{:index {}, :data {}}}",
                        rec.index,
                        edn_string(&rec.data)
                    );
                }
                s.push(']');
            }
            s.push('}');
        }
        Op::Nemesis { value, .. } => s.push_str(&edn_value(value)),
    }
    match ev.process {
        Process::Client(p) => {
            let _ = write!(s, ", :process {p}");
        }
        Process::Nemesis => s.push_str(", :process :nemesis"),
    }
    let _ = write!(s, ", :time {}", ev.time);
    if let Op::Nemesis {
        phase: Some(phase), ..
    } = &ev.op
    {
        let _ = write!(s, ", :phase :{}", phase.as_str());
    }
    if let Some(node) = ev.node {
        let _ = write!(s, ", :node {node}");
    }
    if let Some(error) = &ev.error {
        let _ = write!(s, ", :error {}", edn_string(error));
    }
    s.push('}');
    s
}

/// An EDN string literal.
pub fn edn_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Whether `name` can be written as the EDN keyword `:name`.
fn is_keyword_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || "*+!-_?".contains(first))
        && chars.all(|c| c.is_ascii_alphanumeric() || "*+!-_?<>=.".contains(c))
}

fn edn_keyword_or_string(name: &str) -> String {
    if is_keyword_name(name) {
        format!(":{name}")
    } else {
        edn_string(name)
    }
}

/// A JSON value as EDN: objects become maps (keys as keywords where they can
/// be), arrays vectors, null nil.
pub fn edn_value(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => edn_string(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(edn_value).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{} {}", edn_keyword_or_string(k), edn_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::history::{Consistency, EventType, Phase, ReadRecord};

    #[test]
    fn edn_escapes_strings() {
        assert_eq!(
            edn_string("a\"b\\c\nd\te\u{1}é"),
            "\"a\\\"b\\\\c\\nd\\te\\u0001é\""
        );
    }

    #[test]
    fn edn_events_look_like_jepsen() {
        let ok = Event::append_completion(12345, 0, EventType::Ok, "x", Some(3));
        assert_eq!(
            edn_event(7, &ok),
            r#"{:index 7, :type :ok, :f :append, :value {:data "x", :index 3}, :process 0, :time 12345}"#
        );
        let read = Event::read_completion(
            9,
            2,
            EventType::Ok,
            1,
            None,
            Consistency::Lease,
            Some(vec![
                ReadRecord {
                    index: 1,
                    data: "a".into(),
                },
                ReadRecord {
                    index: 3,
                    data: "b".into(),
                },
            ]),
        )
        .with_node(3)
        .with_error("e\"");
        assert_eq!(
            edn_event(0, &read),
            r#"{:index 0, :type :ok, :f :read, :value {:from 1, :to nil, :consistency :lease, :records [{:index 1, :data "a"} {:index 3, :data "b"}]}, :process 2, :time 9, :node 3, :error "e\""}"#
        );
        let nem = Event::nemesis(
            5,
            "partition",
            json!({"groups": [[1], [2, 3]], "2x": null}),
            Some(Phase::Start),
        );
        assert_eq!(
            edn_event(1, &nem),
            r#"{:index 1, :type :info, :f :partition, :value {"2x" nil, :groups [[1] [2 3]]}, :process :nemesis, :time 5, :phase :start}"#
        );
    }
}
