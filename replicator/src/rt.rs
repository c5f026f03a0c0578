//! The async runtime openraft runs on in a ringraft node ([`Runtime`]), and
//! the seeds of its random choices ([`Seeds`]).
//!
//! [`Runtime`] is tokio ([`Tokio`]) under openraft's
//! [`DeterministicRng`]: every random draw openraft makes (its election
//! timeouts, the tick's jitter) comes from a generator seeded through a
//! task-local seed instead of the thread's OS-seeded one. A task spawned
//! through openraft derives its seed from its parent's, so that all of a
//! node's openraft tasks follow one seed, entered with a scope
//! ([`scoped`]). Outside a scope, openraft's `spawn` and `thread_rng`
//! panic: whatever may reach them runs in one. [`crate::NodeBuilder::start`]
//! starts Raft in one; the node's own tasks are spawned in one each
//! ([`spawn`]); [`crate::Node::scoped`] gives one to an embedder that calls
//! openraft's API directly (the parts that spawn: `on_leader_change`,
//! `stream_append`).
//!
//! A node's seed is [`crate::NodeConfig::seed`], or drawn from the OS at
//! start when it is `None` (production: election timeouts differ between
//! nodes and runs, as before). With the same seed, a node makes the same
//! draws in the same order: with [`crate::IoMode::Inline`], on a
//! single-threaded runtime with paused time and the in-process fabric, a
//! run is a function of its seeds.
//!
//! [`Tokio`] is openraft's tokio runtime with one change, the watch
//! channel: [`crate::watch`] wakes waiters in the order they waited, where
//! tokio's wakes them in an order drawn from the runtime's own generator
//! (seedable only with `--cfg tokio_unstable`).
//!
//! Owns the runtime type and the seeds; it must never let a node draw from
//! an OS-seeded source when a seed was given.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::OptionalSend;
use openraft::rt::AsyncRuntime;
use openraft::rt::deterministic_rng::DeterministicRng;
use openraft_rt_tokio::TokioRuntime;

/// openraft's runtime in a ringraft node: [`Tokio`] with seeded
/// randomness.
pub type Runtime = DeterministicRng<Tokio>;

/// openraft's tokio runtime, with [`crate::watch`]'s channel as its watch.
pub struct Tokio {
    inner: TokioRuntime,
}

impl std::fmt::Debug for Tokio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokio").finish_non_exhaustive()
    }
}

impl AsyncRuntime for Tokio {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <TokioRuntime as AsyncRuntime>::ThreadLocalRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        TokioRuntime::thread_rng()
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = crate::watch::OrderedWatch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        Tokio {
            inner: TokioRuntime::new(threads),
        }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.inner.block_on(future)
    }
}

/// Runs `future` with openraft's random draws, and the seeds of the
/// openraft tasks it spawns, following `seed`.
pub fn scoped<F: Future>(seed: u64, future: F) -> impl Future<Output = F::Output> {
    Runtime::scope(seed, future)
}

/// Spawns `future` on tokio in a scope of its own, seeded with the next of
/// `seeds`.
pub fn spawn<F>(seeds: &Seeds, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(scoped(seeds.next(), future))
}

/// A node's stream of scope seeds (SplitMix64 from the node's seed):
/// each scope it enters takes the next, in the order they are entered.
#[derive(Debug)]
pub struct Seeds {
    state: AtomicU64,
}

/// SplitMix64's increment (the golden ratio's fractional bits).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl Seeds {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Seeds {
        Seeds {
            state: AtomicU64::new(seed),
        }
    }

    /// A stream seeded from the OS: what a node without a configured seed
    /// uses.
    pub fn from_entropy() -> Seeds {
        Seeds::new(rand::random())
    }

    /// The next seed.
    pub fn next(&self) -> u64 {
        let z = self
            .state
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use super::*;

    /// What openraft would draw for election timeouts, in a scope of `seed`.
    async fn draws(seed: u64) -> Vec<u64> {
        scoped(seed, async {
            let mut rng = Runtime::thread_rng();
            let mut first: Vec<u64> = (0..4).map(|_| rng.random_range(150..300)).collect();
            // A spawned task draws from a seed derived from its parent's.
            let child = Runtime::spawn(async {
                let mut rng = Runtime::thread_rng();
                rng.random_range(150..300u64)
            });
            first.push(child.await.unwrap());
            first
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn openraft_draws_follow_the_scope_seed() {
        assert_eq!(draws(7).await, draws(7).await);
        assert_ne!(draws(7).await, draws(8).await);
    }

    #[test]
    fn seeds_replay_and_differ_by_seed() {
        let take = |s: Seeds| (0..3).map(|_| s.next()).collect::<Vec<_>>();
        assert_eq!(take(Seeds::new(1)), take(Seeds::new(1)));
        assert_ne!(take(Seeds::new(1)), take(Seeds::new(2)));
    }
}
