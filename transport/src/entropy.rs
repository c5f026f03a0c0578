//! Where a software device's unpredictable values come from: the rkeys its
//! NIC hands out and the nonces of its handshakes.
//!
//! A real deployment draws them from the operating system's entropy
//! ([`Entropy::os`]). They are security-relevant there: an rkey guessed by
//! someone who can reach a queue pair is write access to a ring, and a
//! predictable nonce lets an old proof be replayed. Only a device seeded
//! explicitly draws them from a seeded generator ([`Entropy::seeded`]):
//! the in-process fabric's devices, each seeded by its fabric
//! ([`crate::inproc::Fabric::new`]), so that a test or a simulated run is a
//! function of one seed. Anyone who knows that seed can predict every rkey
//! and nonce such a device produces: never seed a device that guards
//! anything.
//!
//! Owns the choice between the two sources; it must never fall back from a
//! seeded source to the OS (a run would stop replaying) nor the other way.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A device's source of rkeys and nonces.
pub(crate) enum Entropy {
    /// The operating system's entropy (through `rand`'s thread rng).
    Os,
    /// A generator seeded by whoever made the device: reproducible, and
    /// predictable to anyone who knows the seed.
    Seeded(Box<Mutex<StdRng>>),
}

impl Entropy {
    /// Unpredictable values: what every real device uses.
    pub(crate) fn os() -> Entropy {
        Entropy::Os
    }

    /// Values that follow `seed` (tests and simulations only).
    pub(crate) fn seeded(seed: u64) -> Entropy {
        Entropy::Seeded(Box::new(Mutex::new(StdRng::seed_from_u64(seed))))
    }

    /// A fresh 32-byte handshake nonce.
    pub(crate) fn nonce(&self) -> [u8; 32] {
        match self {
            Entropy::Os => rand::random(),
            Entropy::Seeded(rng) => rng.lock().expect("device rng lock").random(),
        }
    }

    /// A random 32-bit word (an rkey candidate).
    pub(crate) fn word(&self) -> u32 {
        match self {
            Entropy::Os => rand::random(),
            Entropy::Seeded(rng) => rng.lock().expect("device rng lock").random(),
        }
    }
}

impl std::fmt::Debug for Entropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Entropy::Os => "Entropy::Os",
            Entropy::Seeded(_) => "Entropy::Seeded",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_source_replays_and_the_os_does_not() {
        let draw = |e: &Entropy| (e.nonce(), e.word(), e.word());
        assert_eq!(
            draw(&Entropy::seeded(5)),
            draw(&Entropy::seeded(5)),
            "same seed, same values"
        );
        assert_ne!(draw(&Entropy::seeded(5)), draw(&Entropy::seeded(6)));
        assert_ne!(draw(&Entropy::os()), draw(&Entropy::os()));
    }
}
