//! The simulator finds the planted bug `ack-before-flush` (an `fsync`
//! append acknowledged before the flusher's flush): a power loss of every
//! machine while a flush is in flight loses entries the clients were told
//! are committed, and the checker names them.

#![cfg(feature = "planted-bugs")]

use std::process::Command;

#[test]
fn the_simulator_finds_ack_before_flush() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringraft-sim"))
        .args([
            "--planted",
            "ack-before-flush",
            "--seeds",
            "0..200",
            "--until-failure",
        ])
        .output()
        .expect("run ringraft-sim");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit {:?}: the bug was not found in seeds 0..200\n{stdout}",
        output.status
    );
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("seed ") && line.contains("FAILED"))
        .collect();
    assert_eq!(failed.len(), 1, "one failing seed, then a stop:\n{stdout}");
    let line = failed[0];
    assert!(
        line.contains("lost-append") && line.contains("acknowledged append"),
        "the failure names the lost acknowledged entries: {line}"
    );
    assert!(
        stdout.contains("seeds run, 1 failed"),
        "the summary counts it:\n{stdout}"
    );
}
