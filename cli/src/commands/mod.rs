//! The client commands and `serve`'s start-up, one module per command:
//! each takes its parsed flags and returns the process's exit code. They
//! talk to a cluster only through `ringraft_client` (or, for `wal`, a
//! stopped node's files through `ringraft_wal`) and never reach into the
//! daemon's internals. Errors go to stderr as one `ringraft: ...` line.

use std::process::ExitCode;

use ringraft_client::ClientError;

pub(crate) mod append;
pub(crate) mod bench;
pub(crate) mod members;
pub(crate) mod read;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod transfer;
pub(crate) mod trim;
pub(crate) mod wal;

/// Prints `e` as the command's error; exit code 2.
pub(crate) fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("ringraft: {e}");
    ExitCode::from(2)
}

/// A client error as the command's error.
pub(crate) fn client_error(e: ClientError) -> ExitCode {
    fail(e)
}
