//! `ringraft wal check|remove`: offline tools for a stopped node's
//! write-ahead log, through `ringraft_wal`. They never talk to a cluster
//! and never repair a log: check only reads, remove only deletes.

use std::path::Path;
use std::process::ExitCode;

use super::fail;
use crate::args::WalAction;

/// Runs one offline action.
pub(crate) fn run(action: WalAction) -> ExitCode {
    match action {
        WalAction::Check { data_dir } => check(&data_dir),
        WalAction::Remove { data_dir } => remove(&data_dir),
    }
}

/// Prints the check's report; exit 1 when corruption lies inside what the
/// node acknowledged.
fn check(data_dir: &Path) -> ExitCode {
    match ringraft_wal::check(data_dir) {
        Ok(report) => {
            println!("{report}");
            if report.corrupt_in_acknowledged_range() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(format!("wal check {}: {e}", data_dir.display())),
    }
}

/// Deletes the data directory and its ring.
fn remove(data_dir: &Path) -> ExitCode {
    match ringraft_wal::remove(data_dir) {
        Ok(removed) => {
            match removed.ring {
                Some(ring) => println!(
                    "removed {} and its ring {}",
                    data_dir.display(),
                    ring.display()
                ),
                None => println!("removed {} (its ring was gone)", data_dir.display()),
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("wal remove {}: {e}", data_dir.display())),
    }
}
