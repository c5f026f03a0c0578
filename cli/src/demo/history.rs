//! What the demo records of its run for the Jepsen checker, and the
//! checker's verdict on it: each appended record an operation acknowledged
//! at its index (or of unknown outcome when the append failed), each
//! linearizable read, the kill -9 of the leader as a `kill` fault; then the
//! nodes' final logs, the verdict line, and the run files (`history.jsonl`,
//! `final/<id>.jsonl`, `run.json`) that `ringraft-jepsen check` reads.
//!
//! This module owns the recording and the files; it never talks to a node
//! and never judges a history itself (the checker does).

use std::path::Path;
use std::time::Instant;

use ringraft_checker::history::{self, Consistency, FinalRecord, ReadRecord, RunInfo};
use ringraft_checker::{FinalLogs, OpHandle, ReadHandle, Recorder};
use ringraft_client::proto::Record;

/// The history's text of a record (the demo's records are ASCII).
pub(super) fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// A node's records as the checker's final log.
pub(super) fn final_log(records: &[Record]) -> Vec<FinalRecord> {
    records
        .iter()
        .map(|r| FinalRecord::new(r.index, r.term, text(&r.data)))
        .collect()
}

/// The history of one run of the demo.
pub(super) struct DemoHistory {
    recorder: Recorder,
    /// The run's tag, written as the seed of `run.json`.
    run: u32,
    started: Instant,
    /// Wall-clock start, RFC 3339.
    started_at: String,
}

impl DemoHistory {
    /// An empty history of run `run`, starting now.
    pub(super) fn new(run: u32) -> DemoHistory {
        DemoHistory {
            recorder: Recorder::new(),
            run,
            started: Instant::now(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        }
    }

    /// Invokes an append of each record of `batch`, sent to node `via`.
    pub(super) fn invoke_appends(&self, batch: &[Vec<u8>], via: u64) -> Vec<OpHandle> {
        batch
            .iter()
            .map(|data| {
                let process = self.recorder.fresh_process();
                self.recorder.invoke_append_via(process, via, text(data))
            })
            .collect()
    }

    /// Completes `ops` with the indexes the append answered, one per
    /// record; with no answer, or not one index per record, every outcome
    /// is unknown.
    pub(super) fn appended(&self, ops: Vec<OpHandle>, indexes: Option<&[u64]>) {
        match indexes {
            Some(indexes) if indexes.len() == ops.len() => {
                for (op, index) in ops.into_iter().zip(indexes) {
                    self.recorder.ok(op, *index);
                }
            }
            _ => {
                for op in ops {
                    self.recorder
                        .info(op, "no answer, or not one index per record");
                }
            }
        }
    }

    /// Invokes a linearizable read of the whole log.
    pub(super) fn invoke_read(&self) -> ReadHandle {
        let process = self.recorder.fresh_process();
        self.recorder
            .invoke_read(process, 1, None, Consistency::Linearizable)
    }

    /// Completes the read with the records it returned (`None`: it failed).
    pub(super) fn read(&self, op: ReadHandle, records: Option<&[Record]>) {
        let Some(records) = records else {
            self.recorder.info(op, "the read failed");
            return;
        };
        let seen = records
            .iter()
            .map(|r| ReadRecord {
                index: r.index,
                data: text(&r.data),
            })
            .collect();
        self.recorder.read_ok(op, seen);
    }

    /// Node `node` is killed.
    pub(super) fn kill_started(&self, node: u64) {
        self.recorder
            .nemesis_start("kill", serde_json::json!({"node": node}));
    }

    /// Node `node` is started again.
    pub(super) fn kill_ended(&self, node: u64) {
        self.recorder
            .nemesis_stop("kill", serde_json::json!({"node": node}));
    }

    /// Events recorded so far.
    pub(super) fn len(&self) -> usize {
        self.recorder.events().len()
    }

    /// The checker's verdict against `finals`: the line the demo prints
    /// when it is valid, else the failure with the verdict's report.
    pub(super) fn judge(&self, finals: &FinalLogs) -> Result<String, String> {
        let verdict = self.recorder.check(finals);
        if !verdict.valid {
            return Err(format!("the checker rejects the history: {verdict}"));
        }
        Ok(format!(
            "checker: valid, {} appends acknowledged, {} reads, {} anomalies",
            verdict.summary.acked_appends,
            verdict.summary.reads_checked,
            verdict.anomalies.len()
        ))
    }

    /// `history.jsonl`, `final/<id>.jsonl` and `run.json` in `base`: a run
    /// directory of the Jepsen checker.
    pub(super) fn write_run_files(&self, base: &Path, finals: &FinalLogs) -> Result<(), String> {
        let final_dir = base.join("final");
        std::fs::create_dir_all(&final_dir).map_err(|e| format!("{}: {e}", final_dir.display()))?;
        let path = base.join("history.jsonl");
        history::write_history(&path, &self.recorder.events()).map_err(|e| e.to_string())?;
        for (id, records) in finals {
            let path = final_dir.join(format!("{id}.jsonl"));
            history::write_final_log(&path, records).map_err(|e| e.to_string())?;
        }
        let info = RunInfo {
            seed: u64::from(self.run),
            substrate: "demo".into(),
            nodes: finals.keys().copied().collect(),
            nemeses: vec!["kill".into()],
            duration_s: self.started.elapsed().as_secs_f64(),
            clients: 1,
            planted_bug: None,
            started_at: self.started_at.clone(),
        };
        let path = base.join("run.json");
        let json = serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?;
        std::fs::write(&path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(index: u64, term: u64, data: &str) -> Record {
        Record {
            index,
            term,
            data: data.as_bytes().to_vec(),
        }
    }

    /// The demo's history shape: two acknowledged appends, a read, a kill.
    fn demo_history() -> DemoHistory {
        let history = DemoHistory::new(7);
        let ops = history.invoke_appends(&[b"a".to_vec(), b"b".to_vec()], 1);
        history.appended(ops, Some(&[1, 2]));
        let read = history.invoke_read();
        history.read(read, Some(&[rec(1, 1, "a"), rec(2, 1, "b")]));
        history.kill_started(1);
        history.kill_ended(1);
        history
    }

    #[test]
    fn the_checker_passes_a_good_run_and_fails_a_lost_record() {
        let good = final_log(&[rec(1, 1, "a"), rec(2, 1, "b")]);
        let finals: FinalLogs = (1..=3).map(|id| (id, good.clone())).collect();
        let line = demo_history().judge(&finals).unwrap();
        assert_eq!(
            line,
            "checker: valid, 2 appends acknowledged, 1 reads, 0 anomalies"
        );
        // One node lost the acknowledged "b".
        let mut finals = finals;
        finals.insert(2, final_log(&[rec(1, 1, "a")]));
        let failure = demo_history().judge(&finals).unwrap_err();
        assert!(failure.contains("INVALID"), "{failure}");
        // Every node lost it.
        let lost: FinalLogs = (1..=3)
            .map(|id| (id, final_log(&[rec(1, 1, "a")])))
            .collect();
        assert!(demo_history().judge(&lost).is_err());
    }

    #[test]
    fn the_run_files_are_a_run_the_checker_reads() {
        let dir = tempfile::tempdir().unwrap();
        let good = final_log(&[rec(1, 1, "a"), rec(2, 1, "b")]);
        let finals: FinalLogs = (1..=3).map(|id| (id, good.clone())).collect();
        demo_history().write_run_files(dir.path(), &finals).unwrap();
        let verdict = ringraft_checker::check(dir.path()).unwrap();
        assert!(verdict.valid, "{verdict}");
        assert_eq!(verdict.summary.acked_appends, 2);
    }
}
