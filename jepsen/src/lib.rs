//! # ringraft_jepsen
//!
//! Jepsen-style fault testing of ringraft clusters.
//!
//! - [`history`]: the operation history (JSON lines, and Jepsen's EDN);
//! - [`checker`]: the checker, which reads a history and the nodes' final
//!   logs and knows nothing of ringraft's code;
//! - [`report`]: the summary report (text) and the plot (SVG).
//!
//! The runner drives real `ringraft serve` processes and writes what the
//! clients saw:
//! - [`runner`]: one run, start to teardown;
//! - [`workload`]: the clients;
//! - [`nemesis`]: the faults, on a seeded schedule;
//! - [`substrate`]: where the nodes live (`local`, `netns`, `softroce`);
//! - [`tail`]: damage to a stopped node's ring tail;
//! - [`rng`]: the seeded generator.

pub mod checker;
pub mod history;
pub mod nemesis;
pub mod report;
pub mod rng;
pub mod runner;
pub mod substrate;
pub mod tail;
pub mod workload;
