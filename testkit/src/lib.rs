//! The test kit of ringraft: what every harness that drives a cluster
//! needs, written once. Free loopback ports ([`ports`]), the arguments of
//! `ringraft serve` ([`serve`]), a cluster of `ringraft serve` child
//! processes ([`process`]: the Jepsen runner's, the demo's and the CLI's
//! end-to-end tests'), waiting for an agreed leader over one small
//! trait ([`leader`]), Ctrl-C/SIGTERM ([`signals`]) and, with the `inproc`
//! feature, the in-process cluster of the integration tests ([`inproc`]).
//!
//! It never depends on the daemon or the client crates (a harness brings
//! its own way of asking a node for its status) and never decides what a
//! test checks: it starts, stops, observes and damages, the tests judge.

pub mod leader;
pub mod ports;
pub mod process;
pub mod serve;
pub mod signals;

#[cfg(feature = "inproc")]
pub mod inproc;
