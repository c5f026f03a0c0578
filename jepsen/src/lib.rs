//! # ringraft_jepsen
//!
//! Jepsen-style fault testing of ringraft clusters.
//!
//! - [`history`]: the operation history (JSON lines, and Jepsen's EDN);
//! - [`checker`]: the checker, which reads a history and the nodes' final
//!   logs and knows nothing of ringraft's code;
//! - [`report`]: the summary report (text) and the plot (SVG).
//!
//! The runner (workload, nemeses, substrates) drives real `ringraft serve`
//! processes and writes what the clients saw.

pub mod checker;
pub mod history;
pub mod report;
