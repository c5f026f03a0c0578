//! The simulator on a fixed range of seeds: every run must pass its checks.
//! (A longer soak: `cargo run -p ringraft-sim --release -- --seeds 0..1000`.)

use ringraft_sim::{Options, run_seed};

/// The seeds CI runs.
const SEEDS: std::ops::Range<u64> = 0..8;

#[test]
fn a_fixed_range_of_seeds_passes() {
    let options = Options::default();
    let failures: Vec<String> = SEEDS
        .map(|seed| run_seed(seed, &options))
        .filter(|outcome| outcome.failure.is_some())
        .map(|outcome| outcome.line())
        .collect();
    assert!(
        failures.is_empty(),
        "failing seeds:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_seed_replays_exactly_and_another_seed_differs() {
    let options = Options {
        trace: true,
        faults: 3,
        ..Options::default()
    };
    let first = run_seed(5, &options);
    let again = run_seed(5, &options);
    assert!(
        first.trace.len() > 100,
        "a trace of {} lines",
        first.trace.len()
    );
    assert_eq!(first.trace, again.trace, "seed 5 ran twice differently");
    let other = run_seed(6, &options);
    assert_ne!(first.trace, other.trace, "seeds 5 and 6 ran the same");
}
