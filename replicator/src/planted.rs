//! PLANTED BUGS — test-only, compiled only with the `planted-bugs` feature.
//! They exist so that the Jepsen-style harness (`jepsen/`) and the
//! simulator (`sim/`) can show that their checks catch real safety
//! violations. Never enable them elsewhere.
//!
//! At most one is on per process: the one the environment variable
//! [`ENV`] names (the Jepsen harness's daemons), or the one [`choose`]
//! picked before anything asked (the simulator's `--planted NAME`).
//!
//! - [`ACK_BEFORE_REPLICATION`]: the leader's network answers every
//!   AppendEntries as succeeded at once (`network/planted.rs`);
//! - [`REGRANT_STALE_TERM`]: a follower grants write access to the epoch
//!   in its fence even when the epoch's term is below its vote's term
//!   (the grant check, `replication/acceptor.rs`): a deposed leader gets
//!   its rkey back after the follower's term advanced;
//! - [`SKIP_EPOCH_CHECK`]: adoption takes records of any epoch, not only of
//!   the fence's (the wal's adoption check);
//! - [`ACK_BEFORE_FLUSH`]: in `fsync` durability the log store tells
//!   openraft that appended entries are durable before the flusher synced
//!   them.

use std::sync::OnceLock;

/// The environment variable naming the bug to switch on.
pub const ENV: &str = "RINGRAFT_PLANTED_BUG";
/// See the module docs.
pub const ACK_BEFORE_REPLICATION: &str = "ack-before-replication";
/// See the module docs.
pub const REGRANT_STALE_TERM: &str = "regrant-stale-term";
/// See the module docs.
pub const SKIP_EPOCH_CHECK: &str = "skip-epoch-check";
/// See the module docs.
pub const ACK_BEFORE_FLUSH: &str = "ack-before-flush";
/// Every planted bug's name.
pub const KNOWN: &[&str] = &[
    ACK_BEFORE_REPLICATION,
    REGRANT_STALE_TERM,
    SKIP_EPOCH_CHECK,
    ACK_BEFORE_FLUSH,
];

static CHOSEN: OnceLock<Option<String>> = OnceLock::new();

fn chosen() -> Option<&'static str> {
    CHOSEN
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Switches planted bug `name` on for this process (before anything asked
/// which one is on).
///
/// # Errors
/// `name` is no planted bug, or the choice was made already (by [`ENV`],
/// an earlier call, or a first question) and is another.
pub fn choose(name: &str) -> Result<(), String> {
    if !KNOWN.contains(&name) {
        return Err(format!(
            "{name:?} names no planted bug (known: {})",
            KNOWN.join(", ")
        ));
    }
    let _ = CHOSEN.set(Some(name.to_string()));
    match chosen() {
        Some(on) if on == name => {
            apply_to_wal(on);
            Ok(())
        }
        other => Err(format!(
            "cannot switch {name:?} on: the process already chose {other:?}"
        )),
    }
}

/// Whether planted bug `name` is on.
pub fn is_on(name: &str) -> bool {
    chosen() == Some(name)
}

/// The bugs that live in the wal have a switch of their own there.
fn apply_to_wal(name: &str) {
    if name == SKIP_EPOCH_CHECK {
        ringraft_wal::planted::skip_epoch_check(true);
    }
}

/// Says loudly, at a node's start, that a planted bug is on (or that the
/// name is unknown).
pub fn announce(node_id: u64) {
    let msg = match chosen() {
        None => return,
        Some(on) if KNOWN.contains(&on) => {
            apply_to_wal(on);
            format!("!!! PLANTED BUG {on} IS ON in node {node_id}: this node is UNSAFE !!!")
        }
        Some(other) => format!(
            "!!! {ENV}={other:?} names no planted bug (known: {}); none is on !!!",
            KNOWN.join(", ")
        ),
    };
    eprintln!("{msg}");
    tracing::error!("{msg}");
}

#[cfg(test)]
mod tests {
    use super::{KNOWN, choose};

    #[test]
    fn an_unknown_name_is_refused() {
        let e = choose("no-such-bug").unwrap_err();
        for name in KNOWN {
            assert!(e.contains(name), "{e}");
        }
    }
}
