//! The files a run leaves behind: `history.jsonl` (one event a line),
//! `final/<id>.jsonl`, `final/missing.json` and `run.json`.
//!
//! This module owns reading and writing those files, line by line, with
//! errors that name the file and the line; it is the only I/O of the
//! history types. It must never judge a history (that is the rules'), and it
//! never panics on a file's contents.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::Deserialize;
use serde_json::Value;

use super::{Event, FinalRecord, MissingNode, RunInfo};

/// Longest history line the reader accepts, in bytes: a read of a long range
/// carries many records, but a line beyond this is garbage, not a history.
pub const MAX_LINE_BYTES: usize = 64 << 20;

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
    use crate::history::EventType;

    /// A fresh directory for the test `name`, under the system's temporary
    /// directory and named after this process; the test removes it.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ringraft-jepsen-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reader_names_the_bad_line() {
        let dir = scratch_dir("history");
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
        let dir = scratch_dir("writer");
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
        let dir = scratch_dir("missing");
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
