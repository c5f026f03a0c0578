//! A run directory (`run.json`, `history.jsonl`, `final/`), loaded and
//! checked: what `ringraft-jepsen check <dir>` does.
//!
//! This module owns finding a run's files and listing the nodes without a
//! final log; it reads files but must never write them (reports are the
//! Jepsen crate's), and it holds no rule of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::CheckError;
use crate::history::{self, Event, FinalLogs, MissingNode, RunInfo};
use crate::rules::check_history;
use crate::verdict::Verdict;

/// Everything a run directory holds, loaded.
#[derive(Debug, Clone)]
pub struct Run {
    /// The directory.
    pub dir: PathBuf,
    /// `run.json`.
    pub info: RunInfo,
    /// `history.jsonl`.
    pub events: Vec<Event>,
    /// `final/<id>.jsonl`, by node id.
    pub finals: FinalLogs,
    /// Nodes without a final log: `final/missing.json`, plus nodes of
    /// `run.json` that have neither a file nor an entry there.
    pub missing: Vec<MissingNode>,
}

/// Loads a run directory (see `notes/jepsen-format.md`).
///
/// # Errors
///
/// A [`CheckError`] when a file is missing or does not parse, or when no
/// node has a final log.
pub fn load_run(dir: &Path) -> Result<Run, CheckError> {
    let info = history::read_run_info(&dir.join("run.json"))?;
    let events = history::read_history(&dir.join("history.jsonl"))?;
    let final_dir = dir.join("final");
    let io = |source| CheckError::Io {
        path: final_dir.clone(),
        source,
    };
    let mut finals = BTreeMap::new();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&final_dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == "missing.json" {
            missing = history::read_missing(&entry.path())?;
        } else if let Some(id) = name
            .strip_suffix(".jsonl")
            .and_then(|s| s.parse::<u64>().ok())
        {
            finals.insert(id, history::read_final_log(&entry.path())?);
        }
    }
    if finals.is_empty() {
        return Err(CheckError::NoFinalLogs { dir: final_dir });
    }
    for &node in &info.nodes {
        if !finals.contains_key(&node) && !missing.iter().any(|m| m.node == node) {
            missing.push(MissingNode {
                node,
                reason: "no final log, and not listed in final/missing.json".into(),
            });
        }
    }
    missing.sort_by_key(|m| m.node);
    Ok(Run {
        dir: dir.to_path_buf(),
        info,
        events,
        finals,
        missing,
    })
}

/// Loads and checks a run directory.
///
/// # Errors
///
/// As [`load_run`] and [`check_history`].
pub fn check(run_dir: &Path) -> Result<Verdict, CheckError> {
    let run = load_run(run_dir)?;
    check_run(&run)
}

/// Checks a loaded run.
///
/// # Errors
///
/// As [`check_history`].
pub fn check_run(run: &Run) -> Result<Verdict, CheckError> {
    let mut verdict = check_history(&run.events, &run.finals)?;
    verdict.unchecked_nodes = run.missing.clone();
    Ok(verdict)
}
