//! PLANTED BUG `skip-epoch-check` — test-only: with the `planted-bugs`
//! feature, `skip_epoch_check` makes adoption take records of any epoch
//! instead of only the fence's (`validate.rs`, [`crate::validate::Check`]).
//! It exists so that the simulator (`sim/`) can show that it finds the
//! bug. Without the feature, the check can never be skipped.

#[cfg(feature = "planted-bugs")]
static SKIP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Switches the planted bug on or off for this process.
#[cfg(feature = "planted-bugs")]
pub fn skip_epoch_check(on: bool) {
    SKIP.store(on, std::sync::atomic::Ordering::SeqCst);
}

/// Whether adoption skips its epoch check (never, without the feature).
#[inline]
pub(crate) fn skipping_epoch_check() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        SKIP.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}
