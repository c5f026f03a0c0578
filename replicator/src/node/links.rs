//! The links a follower forwards calls to the leader over (proposals and
//! read indexes): a few connections, each with many calls in flight
//! ([`crate::network::Forwarder`]), the least busy taken first.
//!
//! Owns the choice of a link for a call; it must never open a connection
//! itself (the link's task does, lazily) nor retry.

use std::sync::Mutex;

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

/// Calls a link carries before another is opened beside it.
pub(super) const CALLS_PER_LINK: usize = 4;

/// Slots for up to `n` links. A call takes the link with the fewest callers
/// waiting (the lowest slot among equals, the one most likely open
/// already); another link is opened only when every open one has
/// [`CALLS_PER_LINK`] callers or more.
pub(super) struct LinkPool<T> {
    slots: Mutex<Vec<Option<T>>>,
}

impl<T: Clone> LinkPool<T> {
    /// `n` empty slots (at least one).
    pub(super) fn new(n: usize) -> LinkPool<T> {
        LinkPool {
            slots: Mutex::new(vec![None; n.max(1)]),
        }
    }

    /// A link for one call: links `keep` refuses (another leader's) are
    /// dropped first; `load` tells a link's callers; `open` makes a link.
    pub(super) fn take(
        &self,
        keep: impl Fn(&T) -> bool,
        load: impl Fn(&T) -> usize,
        open: impl FnOnce() -> T,
    ) -> T {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|link| !keep(link)) {
                *slot = None;
            }
        }
        let least = slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.as_ref().map(|link| (load(link), i)))
            .min();
        let free = slots.iter().position(Option::is_none);
        if let Some((load, i)) = least
            && (load < CALLS_PER_LINK || free.is_none())
        {
            return slots[i].clone().expect("an open slot");
        }
        let free = free.expect("no open slot, or one free beside busy ones");
        let link = open();
        slots[free] = Some(link.clone());
        link
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
    fn a_call_takes_the_least_busy_link_and_opens_another_only_when_all_are_busy() {
        use std::cell::Cell;
        use std::rc::Rc;
        // A link here: its id and how many callers wait on it.
        let pool = LinkPool::<(u32, Rc<Cell<usize>>)>::new(2);
        let opened = Cell::new(0);
        let open = || {
            opened.set(opened.get() + 1);
            (opened.get(), Rc::new(Cell::new(0)))
        };
        let take = || {
            let link = pool.take(|_| true, |(_, w)| w.get(), open);
            link.1.set(link.1.get() + 1);
            link
        };
        // One caller after the other: the first link, always.
        for _ in 0..3 {
            let link = take();
            assert_eq!(link.0, 1);
            link.1.set(link.1.get() - 1);
        }
        // CALLS_PER_LINK callers at once fill the first link; the next
        // opens the second; then the least busy is taken.
        let first: Vec<_> = (0..CALLS_PER_LINK).map(|_| take()).collect();
        assert!(first.iter().all(|l| l.0 == 1));
        assert_eq!(take().0, 2, "all busy: another link");
        for _ in 1..CALLS_PER_LINK {
            assert_eq!(take().0, 2, "the least busy");
        }
        assert_eq!(
            take().0,
            1,
            "no free slot: the least busy, the lowest first"
        );
        // Another leader's links are dropped.
        let other = pool.take(|(id, _)| *id > 2, |(_, w)| w.get(), open);
        assert_eq!(other.0, 3);
    }
}
