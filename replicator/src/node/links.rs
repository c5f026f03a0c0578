//! The links a follower forwards calls to the leader over (proposals and
//! read indexes): a few connections, each with many calls in flight
//! ([`crate::network::Forwarder`]), taken in turn.
//!
//! Owns the choice of a link for a call; it must never open a connection
//! itself (the link's task does, lazily) nor retry.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ringraft_transport::{Backend, ConnConfig};

/// How many links a follower keeps to its leader, at most. One link keeps
/// many calls in flight, but one task on each side serves it: with 16
/// clients on a follower, one link forwarded lease reads about 15 % slower
/// than eight links that carried one call each (README, "Reads").
pub(super) const FORWARD_LINKS: usize = 4;
/// Receive memory a follower's forwarding links may hold up front,
/// together (and so may the leader's side of them, per follower).
pub(super) const FORWARD_RECEIVE_BUDGET: u64 = 64 << 20;

/// How many forwarding links a node keeps on `backend` with connections
/// configured as `conn`: [`FORWARD_LINKS`], but on `rdma`, where every
/// connection registers its receive buffers up front (64 MiB each with the
/// defaults), only as many as [`FORWARD_RECEIVE_BUDGET`] holds, at least
/// one. Eight of them there took a Soft-RoCE guest's 1 GiB: the kernel's
/// OOM killer ended a follower whose clients' forwarded calls hung on a
/// frozen leader (the lab's stale-leader scenario).
pub(super) fn forward_links(backend: Backend, conn: &ConnConfig) -> usize {
    match backend {
        Backend::Rdma => {
            let each = conn.rdma_receive_bytes().max(1);
            (FORWARD_RECEIVE_BUDGET / each).clamp(1, FORWARD_LINKS as u64) as usize
        }
        Backend::Tcp | Backend::Inproc => FORWARD_LINKS,
    }
}

/// Slots for up to `n` links, each opened when a call first takes it; calls
/// take them in turn.
pub(super) struct LinkPool<T> {
    slots: Vec<Mutex<Option<T>>>,
    next: AtomicUsize,
}

impl<T: Clone> LinkPool<T> {
    /// `n` empty slots (at least one).
    pub(super) fn new(n: usize) -> LinkPool<T> {
        LinkPool {
            slots: (0..n.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The next slot's link, replaced by `open()` when `keep` refuses the
    /// one it holds (or it holds none).
    pub(super) fn take(&self, keep: impl Fn(&T) -> bool, open: impl FnOnce() -> T) -> T {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[turn]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*slot {
            Some(link) if keep(link) => link.clone(),
            _ => {
                let link = open();
                *slot = Some(link.clone());
                link
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_rdma_the_forwarding_links_fit_the_receive_budget() {
        let node = crate::node::NodeConfig::new(1, "unused", "127.0.0.1:0").conn;
        assert_eq!(
            node.rdma_receive_bytes(),
            64 << 20,
            "the defaults this budget was set for"
        );
        assert_eq!(forward_links(Backend::Rdma, &node), 1);
        let small = ConnConfig {
            max_message_bytes: 64 << 10,
            ..node.clone()
        };
        assert_eq!(forward_links(Backend::Rdma, &small), FORWARD_LINKS);
        let half = ConnConfig {
            max_message_bytes: 512 << 10,
            recv_depth: 64,
            ..node.clone()
        };
        assert_eq!(forward_links(Backend::Rdma, &half), 2);
        for other in [Backend::Tcp, Backend::Inproc] {
            assert_eq!(forward_links(other, &node), FORWARD_LINKS);
        }
    }

    #[test]
    fn calls_take_the_links_in_turn_and_keep_them_open() {
        let pool = LinkPool::<u32>::new(3);
        let opened = std::cell::Cell::new(0);
        let open = || {
            opened.set(opened.get() + 1);
            opened.get()
        };
        let taken: Vec<u32> = (0..6).map(|_| pool.take(|_| true, open)).collect();
        assert_eq!(taken, vec![1, 2, 3, 1, 2, 3], "each slot opened once");
        // A link the caller no longer wants (another leader's) is replaced.
        assert_eq!(pool.take(|l| *l != 1, open), 4);
        assert_eq!(pool.take(|_| true, open), 2);
    }
}
