//! # ringraft_jepsen
//!
//! Jepsen-style fault testing of ringraft clusters.
//!
//! - [`history`] and [`checker`]: the history format and the checker's
//!   rules, re-exported from the `ringraft-checker` crate (`checker/`),
//!   which knows nothing of ringraft's code;
//! - [`report`]: the summary report (text, JSON), the plot (SVG) and the
//!   history in Jepsen's EDN.
//!
//! The runner drives real `ringraft serve` processes and writes what the
//! clients saw:
//! - [`runner`]: one run, start to teardown;
//! - [`workload`]: the clients;
//! - [`nemesis`]: the faults, on a seeded schedule;
//! - [`substrate`]: where the nodes live (`local`, `netns`, `softroce`);
//! - [`tail`]: damage to a stopped node's ring tail;
//! - [`rng`]: the seeded generator.

pub use ringraft_checker as checker;
pub use ringraft_checker::history;
pub mod nemesis;
pub mod report;
pub mod rng;
pub mod runner;
pub mod substrate;
pub mod tail;
pub mod workload;
