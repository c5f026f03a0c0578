//! Power loss in whole runs: a seed with power losses (an `fsync` run)
//! replays exactly, and its trace shows what the machines lost.

use ringraft_sim::{Options, run_seed};

/// An `fsync` seed whose first three faults include a power loss of every
/// machine that loses bytes (picked by running seeds 0..30 with
/// `--faults 3 --trace`; another mix of faults moves it).
const SEED: u64 = 15;

#[test]
fn a_seed_with_power_losses_replays_exactly() {
    let options = Options {
        trace: true,
        faults: 3,
        ..Options::default()
    };
    let first = run_seed(SEED, &options);
    assert!(first.failure.is_none(), "{}", first.line());
    let losses: Vec<&String> = first
        .trace
        .iter()
        .filter(|line| line.contains("lost power"))
        .collect();
    assert!(
        losses.len() >= 3,
        "seed {SEED} has no whole-cluster power loss:\n{}",
        first.trace.join("\n")
    );
    assert!(
        losses
            .iter()
            .any(|line| !line.contains(": 0 bytes of 0 files lost")),
        "no power loss lost a byte:\n{}",
        losses
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let again = run_seed(SEED, &options);
    assert_eq!(
        first.trace, again.trace,
        "seed {SEED} ran twice differently"
    );
}
