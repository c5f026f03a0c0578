//! Regression tests of what fuzzing (`wal/fuzz`, run by `scripts/fuzz.sh`)
//! found in the wal's readers of files, each with its own crafted files,
//! not the fuzz input.

mod common;

use std::os::unix::fs::FileExt;

use common::*;
use ringraft_wal::check;
use ringraft_wal::layout::{HEAD_OFFSET, LINE_BYTES};

/// A data directory whose ring's head word is line-unaligned, and that
/// word.
fn a_ring_with_an_unaligned_head() -> (TestDir, u64) {
    let dir = tempdir();
    drop(open(dir.path()));
    let unaligned = 87 * LINE_BYTES as u64 + 63;
    ring_file(dir.path())
        .write_all_at(&unaligned.to_le_bytes(), HEAD_OFFSET as u64)
        .unwrap();
    (dir, unaligned)
}

/// fuzz target `check` (2026-12-06, within 3 s): a ring whose head word is
/// below `MAX_LSN` but not line aligned made `check()` (`ringraft wal
/// check`) panic: `check.rs` checks the head word against `MAX_LSN` only
/// and hands it to `recovery::scan` as the start, whose contract asserts
/// a log position ("scan from 5636095, which is no log position",
/// recovery.rs). A crafted file is an error in the report, never a panic.
#[test]
fn check_refuses_a_head_word_that_is_no_log_position() {
    let (dir, unaligned) = a_ring_with_an_unaligned_head();
    let result = std::panic::catch_unwind(|| check(dir.path()).map(|r| r.to_string()));
    match result {
        Ok(Err(_)) => {}
        Ok(Ok(report)) => panic!("an unaligned head word passed the check: {report}"),
        Err(_) => panic!("check() panicked on a head word of {unaligned}"),
    }
}

/// The same head word on opening the ring (found reading the `check` fix:
/// `Ring::open` checked it against `MAX_LSN` only too, and scans from it at
/// recovery): an error naming the head, never a panic.
#[test]
fn open_refuses_a_head_word_that_is_no_log_position() {
    let (dir, unaligned) = a_ring_with_an_unaligned_head();
    let result = std::panic::catch_unwind(|| open_with(dir.path(), &config(1)).map(|_| ()));
    match result {
        Ok(Err(e)) => assert!(e.to_string().contains("head"), "{e}"),
        Ok(Ok(())) => panic!("an unaligned head word opened"),
        Err(_) => panic!("open panicked on a head word of {unaligned}"),
    }
}
