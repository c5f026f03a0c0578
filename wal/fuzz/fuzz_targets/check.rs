//! `ringraft wal check` over a crafted data directory: `check()` must return
//! a report or an error for any ring and metadata file, never panic or
//! hang, and a report must hold together.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_wal::check;
use ringraft_wal_fuzz::{DirInput, scratch_dir};

fuzz_target!(|input: &[u8]| {
    let dir = scratch_dir();
    DirInput::parse(input).write_to(dir);
    if let Ok(report) = check(dir) {
        assert!(report.to_string().contains("verdict"));
        let window = report.end_lsn.checked_sub(report.start_lsn);
        assert!(
            window.is_some_and(|w| w <= report.header.capacity),
            "{report:?}"
        );
        if report.entries > 0 {
            let last = report.last.expect("entries have a last log id");
            assert_eq!(
                last.index - report.first_index + 1,
                report.entries,
                "the valid range's indexes follow each other: {report:?}"
            );
        }
    }
});
