//! The planted bug `regrant-stale-term` (a follower grants write access to
//! the epoch in its fence although the epoch's term is below its vote's)
//! must be found by the simulator within seeds 0..200: the `Regrant` fault
//! lets a deposed leader ask for a grant after the follower voted in a
//! later term, and the landing check sees its records land.

#![cfg(feature = "planted-bugs")]

use std::process::Command;

#[test]
fn regrant_stale_term_is_found_by_the_landing_check() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringraft-sim"))
        .args([
            "--planted",
            "regrant-stale-term",
            "--seeds",
            "0..200",
            "--until-failure",
        ])
        .output()
        .expect("ringraft-sim runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit 1 (a seed failed) expected; stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let failed: Vec<&str> = stdout.lines().filter(|l| l.contains("FAILED")).collect();
    assert_eq!(
        failed.len(),
        1,
        "one failing seed (--until-failure):\n{stdout}"
    );
    assert!(
        failed[0].contains("FAILED: landing check:") && failed[0].contains("vote is of term"),
        "the landing check names the bug: {}",
        failed[0]
    );
}
