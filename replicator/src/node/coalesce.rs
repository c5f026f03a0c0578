//! Rounds shared by concurrent callers: a caller that arrives while a round
//! is in flight does not start its own; it joins the next one, which
//! starts once the one in flight ends and answers everyone who waited for
//! it. A follower's forwarded read indexes go through this
//! ([`super::Node::read`]): 16 concurrent reads cost the leader two calls,
//! not 16.
//!
//! Why joining the *next* round, not the one in flight, is what a read
//! needs: a round's answer (a read index) is only good for callers that
//! arrived before the round started. Every caller a round answers was
//! queued before its runner took the queue.
//!
//! Owns the turn-taking only; it must never look at what a round does or
//! returns (the caller's closure does the work, in the caller's own task:
//! no task of its own, no hop for a lone caller).
//!
//! Cancellation: a runner dropped mid-round hands its turn, and its
//! batch, to the next live waiter; a waiter dropped after it was handed
//! the turn passes it on. The turn is never lost, so no caller waits
//! forever on a round that no one runs.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Concurrent callers of [`Coalesce::run`] share rounds.
pub(super) struct Coalesce<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    /// A caller holds the turn: it runs a round or is about to.
    running: bool,
    /// Callers waiting for the next round, in arrival order.
    queued: VecDeque<oneshot::Sender<Turn<T>>>,
}

/// What a waiting caller is told.
enum Turn<T> {
    /// The round it waited for ended with this.
    Done(T),
    /// It holds the turn now: it runs the next round, for everyone queued.
    Run,
}

impl<T: Clone> Coalesce<T> {
    pub(super) fn new() -> Coalesce<T> {
        Coalesce {
            state: Mutex::new(State {
                running: false,
                queued: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The lock is never held across an await or user code; a panic
        // inside it is a bug of this module, and the state stays whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The outcome of a round that started after this call: `round` run
    /// here if no round is in flight, else another caller's.
    pub(super) async fn run<F: Future<Output = T>>(&self, round: impl FnOnce() -> F) -> T {
        loop {
            let rx = {
                let mut state = self.lock();
                if state.running {
                    let (tx, rx) = oneshot::channel();
                    state.queued.push_back(tx);
                    rx
                } else {
                    state.running = true;
                    break;
                }
            };
            let mut waiting = Waiting {
                owner: self,
                rx: Some(rx),
            };
            let rx = waiting.rx.as_mut().expect("set above");
            let turn = rx.await;
            waiting.rx = None;
            match turn {
                Ok(Turn::Done(t)) => return t,
                Ok(Turn::Run) => break,
                // A sender is dropped unsent only when its receiver is
                // gone; not this one. Queue again rather than trust that.
                Err(_) => continue,
            }
        }
        let mut runner = Runner {
            owner: self,
            batch: std::mem::take(&mut self.lock().queued),
        };
        let t = round().await;
        for tx in std::mem::take(&mut runner.batch) {
            let _ = tx.send(Turn::Done(t.clone()));
        }
        t
    }
}

impl<T> State<T> {
    /// Hands the turn to the first live waiter, or frees it.
    fn hand_on(&mut self) {
        while let Some(tx) = self.queued.pop_front() {
            if tx.send(Turn::Run).is_ok() {
                return;
            }
        }
        self.running = false;
    }
}

/// The runner of a round: its batch is everyone queued when it started.
/// On drop (the round ended, or its caller went away mid-round) the turn
/// passes on; a batch still unanswered goes back to the head of the queue
/// for the next round.
struct Runner<'a, T> {
    owner: &'a Coalesce<T>,
    batch: VecDeque<oneshot::Sender<Turn<T>>>,
}

impl<T> Drop for Runner<'_, T> {
    fn drop(&mut self) {
        let mut state = self.owner.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut unanswered = std::mem::take(&mut self.batch);
        unanswered.append(&mut state.queued);
        state.queued = unanswered;
        state.hand_on();
    }
}

/// A caller waiting in the queue. Dropped before its answer, it checks
/// whether the turn reached it meanwhile and, if so, passes it on.
struct Waiting<'a, T> {
    owner: &'a Coalesce<T>,
    rx: Option<oneshot::Receiver<Turn<T>>>,
}

impl<T> Drop for Waiting<'_, T> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        // After close() a send fails; one made before is still received.
        rx.close();
        if let Ok(Turn::Run) = rx.try_recv() {
            let mut state = self.owner.state.lock().unwrap_or_else(|e| e.into_inner());
            state.hand_on();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::sync::Notify;

    use super::*;

    /// Rounds that wait for `gate` (one permit per round) and return their
    /// number; `started` counts them.
    struct Rounds {
        started: AtomicU64,
        gate: tokio::sync::Semaphore,
        entered: Notify,
    }

    impl Rounds {
        fn new() -> Arc<Rounds> {
            Arc::new(Rounds {
                started: AtomicU64::new(0),
                gate: tokio::sync::Semaphore::new(0),
                entered: Notify::new(),
            })
        }

        async fn round(&self) -> u64 {
            let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            self.entered.notify_one();
            self.gate.acquire().await.expect("open").forget();
            n
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Lets every spawned task run until it waits.
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    /// A caller of `c`, on a task of its own.
    fn caller(c: &Arc<Coalesce<u64>>, rounds: &Arc<Rounds>) -> tokio::task::JoinHandle<u64> {
        let (c, r) = (c.clone(), rounds.clone());
        tokio::spawn(async move { c.run(|| r.round()).await })
    }

    /// A coalescer whose round 1 is in flight, and its runner.
    async fn round_one_in_flight() -> (
        Arc<Coalesce<u64>>,
        Arc<Rounds>,
        tokio::task::JoinHandle<u64>,
    ) {
        let c = Arc::new(Coalesce::new());
        let rounds = Rounds::new();
        let first = caller(&c, &rounds);
        rounds.entered.notified().await;
        (c, rounds, first)
    }

    #[test]
    fn a_lone_caller_runs_its_own_round() {
        rt().block_on(async {
            let c = Coalesce::new();
            let rounds = Rounds::new();
            rounds.gate.add_permits(2);
            assert_eq!(c.run(|| rounds.round()).await, 1);
            assert_eq!(c.run(|| rounds.round()).await, 2);
        });
    }

    #[test]
    fn callers_during_a_round_share_the_next_one() {
        rt().block_on(async {
            let (c, rounds, first) = round_one_in_flight().await;
            // Round 1 is in flight: these arrive after it started.
            let later: Vec<_> = (0..10).map(|_| caller(&c, &rounds)).collect();
            settle().await;
            assert_eq!(rounds.started.load(Ordering::SeqCst), 1, "they wait");
            rounds.gate.add_permits(1);
            assert_eq!(first.await.unwrap(), 1);
            settle().await;
            assert_eq!(
                rounds.started.load(Ordering::SeqCst),
                2,
                "one round for all ten"
            );
            rounds.gate.add_permits(1);
            for t in later {
                assert_eq!(
                    t.await.unwrap(),
                    2,
                    "answered by a round that started after them"
                );
            }
            // Idle again: the next caller runs at once.
            rounds.gate.add_permits(1);
            assert_eq!(c.run(|| rounds.round()).await, 3);
        });
    }

    #[test]
    fn a_runner_dropped_mid_round_hands_the_turn_on() {
        rt().block_on(async {
            let (c, rounds, first) = round_one_in_flight().await;
            let second = caller(&c, &rounds);
            settle().await;
            // The runner of round 2 goes away mid-round, its batch (the
            // third caller) unanswered.
            rounds.gate.add_permits(1);
            assert_eq!(first.await.unwrap(), 1);
            settle().await;
            let third = caller(&c, &rounds);
            settle().await;
            assert_eq!(rounds.started.load(Ordering::SeqCst), 2);
            second.abort();
            assert!(second.await.unwrap_err().is_cancelled());
            settle().await;
            assert_eq!(rounds.started.load(Ordering::SeqCst), 3, "the third runs");
            rounds.gate.add_permits(1);
            assert_eq!(third.await.unwrap(), 3);
        });
    }

    #[test]
    fn a_waiter_dropped_with_the_turn_passes_it_on() {
        rt().block_on(async {
            let (c, rounds, first) = round_one_in_flight().await;
            let (second, third) = (caller(&c, &rounds), caller(&c, &rounds));
            settle().await;
            // Round 1 ends and hands the turn to the second caller; it is
            // dropped before it can take it (abort before it runs again).
            rounds.gate.add_permits(1);
            let one = tokio::spawn(async move { first.await.unwrap() });
            second.abort();
            assert_eq!(one.await.unwrap(), 1);
            settle().await;
            assert_eq!(rounds.started.load(Ordering::SeqCst), 2, "the third runs");
            rounds.gate.add_permits(1);
            assert_eq!(third.await.unwrap(), 2);
        });
    }

    #[test]
    fn a_waiter_dropped_in_the_queue_is_skipped() {
        rt().block_on(async {
            let (c, rounds, first) = round_one_in_flight().await;
            let gone = caller(&c, &rounds);
            settle().await;
            gone.abort();
            let _ = gone.await;
            rounds.gate.add_permits(1);
            assert_eq!(first.await.unwrap(), 1);
            // Nobody holds the turn: a new caller runs at once.
            rounds.gate.add_permits(1);
            assert_eq!(c.run(|| rounds.round()).await, 2);
        });
    }
}
