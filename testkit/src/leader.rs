//! Waiting for a leader that the cluster agrees on, over one small trait
//! ([`Observe`]) that every kind of cluster implements (in-process nodes,
//! `ringraft serve` processes asked over gRPC, ...). Owns the agreement
//! rule and the polling loop; never starts, stops or contacts a node
//! itself, and never panics: a harness decides what a missing leader means.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// What one node says about leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node.
    pub id: u64,
    /// Its current term.
    pub term: u64,
    /// The leader it knows, if any.
    pub leader: Option<u64>,
    /// Whether it is itself in the Leader state.
    pub is_leader: bool,
}

/// A cluster that can be asked who leads.
pub trait Observe {
    /// The nodes that must agree (the ones meant to be up).
    fn running(&self) -> Vec<u64>;
    /// What node `id` says; `None` when it does not answer.
    fn view(&self, id: u64) -> impl Future<Output = Option<NodeView>> + Send;
    /// A reason to stop waiting at once (e.g. a node exited); asked every
    /// round. `None` by default.
    fn failed(&self) -> Option<String> {
        None
    }
}

/// Which leader is wanted.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Only these nodes must agree and the leader must be one of them
    /// (`None`: every running node).
    pub among: Option<Vec<u64>>,
    /// The leader's term must be above this.
    pub above_term: Option<u64>,
    /// This node must not be the leader (nor is its view asked).
    pub excluding: Option<u64>,
    /// Pause between two rounds.
    pub poll: Duration,
}

impl Wanted {
    /// Any leader every running node agrees on, polled every `poll`.
    pub fn any(poll: Duration) -> Wanted {
        Wanted {
            among: None,
            above_term: None,
            excluding: None,
            poll,
        }
    }
}

/// Why no leader was found.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoLeader {
    /// The time ran out; the last round's views (node, leader it named).
    #[error("no agreed leader within {timeout:?}: {last:?}")]
    Timeout {
        /// The bound.
        timeout: Duration,
        /// Each asked node and the leader it named (`None`: no answer or
        /// no leader).
        last: Vec<(u64, Option<u64>)>,
    },
    /// [`Observe::failed`] said so.
    #[error("{0}")]
    Failed(String),
}

/// Polls `cluster` until the nodes agree on a leader as `wanted` says, and
/// returns the leader's own view. Agreement: every asked node answers and
/// names the same leader, which is one of them and in the Leader state.
/// `timeout` of [`Duration::MAX`]: no bound.
///
/// # Errors
/// [`NoLeader::Timeout`] at the deadline, [`NoLeader::Failed`] when
/// [`Observe::failed`] gives a reason.
pub async fn wait_for_leader(
    cluster: &impl Observe,
    wanted: &Wanted,
    timeout: Duration,
) -> Result<NodeView, NoLeader> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        if let Some(reason) = cluster.failed() {
            return Err(NoLeader::Failed(reason));
        }
        let asked: Vec<u64> = cluster
            .running()
            .into_iter()
            .filter(|id| wanted.among.as_ref().is_none_or(|a| a.contains(id)))
            .filter(|id| Some(*id) != wanted.excluding)
            .collect();
        let mut views = Vec::with_capacity(asked.len());
        for &id in &asked {
            views.push((id, cluster.view(id).await));
        }
        if let Some(leader) = agreed(&views, wanted) {
            return Ok(leader);
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(NoLeader::Timeout {
                timeout,
                last: views
                    .iter()
                    .map(|(id, v)| (*id, v.as_ref().and_then(|v| v.leader)))
                    .collect(),
            });
        }
        tokio::time::sleep(wanted.poll).await;
    }
}

/// The agreed leader's view, if the round agrees.
fn agreed(views: &[(u64, Option<NodeView>)], wanted: &Wanted) -> Option<NodeView> {
    let leader = views.first()?.1.as_ref()?.leader?;
    if !views
        .iter()
        .all(|(_, v)| v.as_ref().is_some_and(|v| v.leader == Some(leader)))
    {
        return None;
    }
    let own = views.iter().find(|(id, _)| *id == leader)?.1.clone()?;
    (own.is_leader && wanted.above_term.is_none_or(|t| own.term > t)).then_some(own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Fixed(BTreeMap<u64, NodeView>);

    impl Observe for Fixed {
        fn running(&self) -> Vec<u64> {
            self.0.keys().copied().collect()
        }
        async fn view(&self, id: u64) -> Option<NodeView> {
            self.0.get(&id).cloned()
        }
    }

    fn view(id: u64, term: u64, leader: u64) -> NodeView {
        NodeView {
            id,
            term,
            leader: Some(leader),
            is_leader: id == leader,
        }
    }

    #[tokio::test]
    async fn agreement_term_and_exclusion() {
        let c = Fixed((1..=3).map(|id| (id, view(id, 4, 2))).collect());
        let poll = Duration::from_millis(1);
        let short = Duration::from_millis(20);
        let found = wait_for_leader(&c, &Wanted::any(poll), short).await;
        assert_eq!(found.unwrap().id, 2);
        let above = Wanted {
            above_term: Some(4),
            ..Wanted::any(poll)
        };
        assert!(matches!(
            wait_for_leader(&c, &above, short).await,
            Err(NoLeader::Timeout { .. })
        ));
        let excluding = Wanted {
            excluding: Some(2),
            ..Wanted::any(poll)
        };
        assert!(wait_for_leader(&c, &excluding, short).await.is_err());
        let mut split = c.0.clone();
        split.insert(3, view(3, 5, 3));
        let split = Fixed(split);
        assert!(
            wait_for_leader(&split, &Wanted::any(poll), short)
                .await
                .is_err()
        );
        let among = Wanted {
            among: Some(vec![3]),
            ..Wanted::any(poll)
        };
        assert_eq!(wait_for_leader(&split, &among, short).await.unwrap().id, 3);
    }
}
