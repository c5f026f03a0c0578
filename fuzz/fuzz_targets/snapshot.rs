//! A snapshot body (`state_machine.rs`'s `decode_body`), received from a
//! leader in parts and installed: openraft's `install_snapshot` on a fresh
//! `SmStore`, then two commands of a session the input names
//! (`input[0..16]`: client id and seq, u64 LE; the rest is the body), then
//! a snapshot of the result.
//!
//! Must hold: no panic; an accepted body is installed, the commands after
//! it apply, and the snapshot built then installs again and builds the
//! same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft::types::{Command, Session, log_id};
use ringraft_fuzz::{install_and_rebuild, runtime, tail, u64_at};

fuzz_target!(|input: &[u8]| {
    let session = Session {
        client_id: u64_at(input, 0),
        seq: u64_at(input, 8),
    };
    let body = tail(input, 16);
    let last = log_id(3, 10);
    let commands = [
        Command::new(Some(session), b"after the snapshot".to_vec()),
        Command::new(
            Some(Session {
                seq: session.seq.wrapping_add(1),
                ..session
            }),
            Vec::new(),
        ),
    ];
    runtime().block_on(async {
        let Some(first) = install_and_rebuild(body, last, &commands)
            .await
            .expect("an accepted body installs and builds")
        else {
            return;
        };
        assert_eq!(first.applied_index, last.index + commands.len() as u64);
        let second = install_and_rebuild(&first.rebuilt, log_id(3, 12), &[])
            .await
            .expect("a built snapshot installs")
            .expect("a built snapshot is accepted");
        assert_eq!(second.rebuilt, first.rebuilt, "not a fixed point");
    });
});
