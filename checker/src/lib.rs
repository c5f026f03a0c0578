//! # ringraft_checker
//!
//! The checker of a replicated, linearizable, append-only log: it reads a
//! history of what clients saw (invocations, completions, nemesis events)
//! and what each node holds at the end (its final committed log), and
//! returns a [`Verdict`]. It depends on no ringraft crate and trusts nothing
//! but the history: the Jepsen harness, the cluster tests and the
//! deterministic simulator all use it.
//!
//! - [`history`]: the event types, and the run files (`history.jsonl`,
//!   `final/<id>.jsonl`, `run.json`) read and written;
//! - [`Recorder`]: records a history from a test, then checks it;
//! - [`pair_operations`]: invocations paired with completions, and the
//!   history's structural rules;
//! - [`check_history`]: every rule (`CHECKER.md`), pure: no I/O, no clock;
//! - [`check`]/[`load_run`]: the same over a run directory;
//! - [`Verdict`], [`Anomaly`], [`AnomalyKind`]: the answer.
//!
//! This crate must never depend on ringraft's code, and only
//! [`history`]'s file functions and [`load_run`] touch the file system.

mod error;
pub mod history;
mod pairing;
mod recorder;
mod rules;
mod run;
mod verdict;

pub use error::CheckError;
pub use history::FinalLogs;
pub use pairing::{Operation, Outcome, pair_operations, pair_operations_best_effort};
pub use recorder::{OpHandle, Outstanding, ReadHandle, Recorder};
pub use rules::{IsolationWindow, check_history, isolation_windows};
pub use run::{Run, check, check_run, load_run};
pub use verdict::{Anomaly, AnomalyKind, OpRef, Summary, Verdict};

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
