//! The simulator finds each planted bug within seeds 0..200 (a build with
//! the `planted-bugs` feature). Each search runs the binary, so that each
//! bug is the only one on in its process:
//! - `regrant-stale-term` (a follower grants write access to the epoch in
//!   its fence although the epoch's term is below its vote's): the
//!   `Regrant` fault lets a deposed leader ask for a grant after the
//!   follower voted in a later term, and the landing check sees its
//!   records land;
//! - `ack-before-flush` (an `fsync` append acknowledged before the
//!   flusher's flush): a power loss of every machine while a flush is in
//!   flight loses entries the clients were told are committed, and the
//!   checker names them;
//! - `skip-epoch-check` (adoption takes records of any epoch, not only the
//!   fence's): the `LateLanding` fault lets a deposed leader's WRITE,
//!   admitted before the follower's rkey rotation, land over the new
//!   leader's identical records just before the message naming them, and
//!   the adoption check sees the follower take the old epoch's record.

#![cfg(feature = "planted-bugs")]

use std::process::Command;

/// Runs `--planted bug --seeds 0..200 --until-failure`; the failing seed's
/// line (the run must stop at one).
fn first_failure(bug: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_ringraft-sim"))
        .args(["--planted", bug, "--seeds", "0..200", "--until-failure"])
        .output()
        .expect("ringraft-sim runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{bug}: exit 1 (a seed failed) expected; stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("seed ") && line.contains("FAILED"))
        .collect();
    assert_eq!(failed.len(), 1, "one failing seed, then a stop:\n{stdout}");
    assert!(
        stdout.contains("seeds run, 1 failed"),
        "the summary counts it:\n{stdout}"
    );
    failed[0].to_string()
}

#[test]
fn regrant_stale_term_is_found_by_the_landing_check() {
    let line = first_failure("regrant-stale-term");
    assert!(
        line.contains("FAILED: landing check:") && line.contains("vote is of term"),
        "the landing check names the bug: {line}"
    );
}

#[test]
fn ack_before_flush_is_found_as_lost_acknowledged_appends() {
    let line = first_failure("ack-before-flush");
    assert!(
        line.contains("lost-append") && line.contains("acknowledged append"),
        "the failure names the lost acknowledged entries: {line}"
    );
}

#[test]
fn skip_epoch_check_is_found_by_the_adoption_check() {
    let line = first_failure("skip-epoch-check");
    assert!(
        line.contains("FAILED: adoption check:") && line.contains("after its fence had moved"),
        "the adoption check names the bug: {line}"
    );
}
