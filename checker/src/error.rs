//! Why a history cannot be checked at all: files missing or garbled, or a
//! history that breaks the contract's structure.
//!
//! This module owns [`CheckError`]; it must never carry a cluster's
//! anomalies (those are a [`crate::Verdict`], not an error).

use std::path::PathBuf;

use crate::history::HistoryError;

/// The run cannot be checked: missing or garbled files, or a history that
/// breaks the contract's structure (a runner bug, not a cluster bug).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file is missing or does not parse.
    #[error(transparent)]
    File(#[from] HistoryError),
    /// The `final/` directory could not be listed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// No node's final log could be read, so nothing can be checked.
    #[error("{}: no final log of any node (final/<id>.jsonl); nothing to check against", dir.display())]
    NoFinalLogs {
        /// The `final/` directory.
        dir: PathBuf,
    },
    /// The history breaks the structural rules of the contract.
    #[error("history is structurally invalid ({} problem(s)):\n  {}", problems.len(), problems.join("\n  "))]
    Structure {
        /// One line per problem (at most 20, `MAX_STRUCTURE_PROBLEMS`).
        problems: Vec<String>,
    },
}
