//! A frozen node: its application stops, its NIC goes on serving (a
//! SIGSTOPped process on an RDMA NIC). What the fabric does with a frame
//! while one end of its direction is frozen:
//!
//! - from the frozen node: its NIC's answers (READ data, WRITE and CAS
//!   completions) leave; what its application posts (SENDs, its own
//!   one-sided operations, a close) is held, in order, until the thaw;
//! - to the frozen node: one-sided requests (WRITE, READ, CAS, fetch-add)
//!   are executed by its NIC, against its memory, without its code; a SEND
//!   finds no receive posted (receiver not ready) and waits, and with it
//!   every later request of that queue pair (in order); answers to the
//!   node's own earlier requests wait for the application to run again.
//!
//! Held frames go on at the thaw: answers first, then requests, then a
//! close, each stream in its order (a queue pair's requester and responder
//! streams are independent; a close comes last).

use std::collections::VecDeque;

use crate::soft::conn::Frame;
use crate::work::Request;

/// Where a frame goes while an end is frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// Delivered now.
    Pass,
    /// Held until the thaw, in the answers' stream.
    HoldAnswer,
    /// Held until the thaw, in the requests' stream.
    HoldRequest,
    /// Held until the thaw, after everything else.
    HoldClose,
}

/// Frames held while an end of a direction is frozen.
#[derive(Default)]
pub(super) struct Held {
    answers: VecDeque<Frame>,
    requests: VecDeque<Frame>,
    close: Option<Frame>,
    /// While SENDs are held: a WRITE went through since they were (the
    /// SEND held is the one that names it, not a message before it).
    wrote: bool,
}

impl Held {
    pub(super) fn is_empty(&self) -> bool {
        self.answers.is_empty() && self.requests.is_empty() && self.close.is_none()
    }

    pub(super) fn hold(&mut self, rule: Rule, frame: Frame) {
        match rule {
            Rule::Pass => unreachable!("a frame that passes is not held"),
            Rule::HoldAnswer => self.answers.push_back(frame),
            Rule::HoldRequest => self.requests.push_back(frame),
            Rule::HoldClose => self.close = Some(frame),
        }
    }

    /// `frame` went through while `ends` held the direction.
    pub(super) fn passed(&mut self, ends: Ends, frame: &Frame) {
        if !ends.sends_held {
            self.wrote = false;
        } else if let Frame::Req {
            req: Request::Write { .. },
            ..
        } = frame
        {
            self.wrote = true;
        }
    }

    /// The held frames in the order they go on at the thaw.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Frame> + use<> {
        self.wrote = false;
        let answers = std::mem::take(&mut self.answers);
        let requests = std::mem::take(&mut self.requests);
        answers.into_iter().chain(requests).chain(self.close.take())
    }

    /// The rule for `frame` in a direction whose sender (`from_frozen`) or
    /// receiver (`to_frozen`) is frozen, or whose SENDs are held
    /// (`sends_held`: from the first SEND after a WRITE on, the direction's
    /// requests wait, in order; the WRITEs before it have landed, messages
    /// before them went on); `Pass` when none is.
    pub(super) fn rule(&self, ends: Ends, frame: &Frame) -> Rule {
        let Ends {
            from_frozen,
            to_frozen,
            sends_held,
        } = ends;
        // Once something is held behind a close, everything is.
        if self.close.is_some() {
            return Rule::HoldClose;
        }
        let rule = match frame {
            Frame::Close { .. } if from_frozen || to_frozen || sends_held => Rule::HoldClose,
            Frame::Close { .. } => Rule::Pass,
            // The frozen node's NIC answers; answers to it wait.
            Frame::Resp { .. } | Frame::Ack { .. } if to_frozen => Rule::HoldAnswer,
            Frame::Resp { .. } | Frame::Ack { .. } => Rule::Pass,
            // The frozen node's application posts nothing.
            Frame::Req { .. } if from_frozen => Rule::HoldRequest,
            Frame::Req { req, .. } if to_frozen && !one_sided(req) => Rule::HoldRequest,
            Frame::Req { req, .. } if sends_held && self.wrote && !one_sided(req) => {
                Rule::HoldRequest
            }
            Frame::Req { .. } => Rule::Pass,
        };
        // Each held stream keeps its order.
        match rule {
            Rule::Pass if frame.is_answer() && !self.answers.is_empty() => Rule::HoldAnswer,
            Rule::Pass if matches!(frame, Frame::Req { .. }) && !self.requests.is_empty() => {
                Rule::HoldRequest
            }
            Rule::Pass if matches!(frame, Frame::Close { .. }) && !self.is_empty() => {
                Rule::HoldClose
            }
            rule => rule,
        }
    }
}

/// What holds a direction's frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Ends {
    /// Its sender is frozen.
    pub(super) from_frozen: bool,
    /// Its receiver is frozen.
    pub(super) to_frozen: bool,
    /// Its SENDs (and the requests behind them) are held.
    pub(super) sends_held: bool,
}

impl Ends {
    /// Nothing holds the direction's frames.
    pub(super) fn open(self) -> bool {
        self == Ends::default()
    }
}

/// Executed by the target's NIC alone.
fn one_sided(req: &Request) -> bool {
    !matches!(req, Request::Send { .. })
}

#[cfg(test)]
mod tests {
    use super::{Ends, Held, Rule};

    fn ends(from_frozen: bool, to_frozen: bool) -> Ends {
        Ends {
            from_frozen,
            to_frozen,
            sends_held: false,
        }
    }
    use crate::soft::conn::Frame;
    use crate::work::{Done, Request};

    fn write() -> Frame {
        Frame::Req {
            seq: 1,
            req: Request::Write {
                addr: 0,
                rkey: 1,
                data: vec![1],
                imm: None,
            },
        }
    }

    fn send() -> Frame {
        Frame::Req {
            seq: 2,
            req: Request::Send { data: vec![2] },
        }
    }

    fn answer() -> Frame {
        Frame::Resp {
            seq: 3,
            result: Ok(Done::Ok),
        }
    }

    #[test]
    fn a_frozen_receiver_executes_one_sided_requests_until_a_send() {
        let mut held = Held::default();
        assert_eq!(held.rule(ends(false, true), &write()), Rule::Pass);
        assert_eq!(held.rule(ends(false, true), &answer()), Rule::HoldAnswer);
        assert_eq!(held.rule(ends(false, true), &send()), Rule::HoldRequest);
        held.hold(Rule::HoldRequest, send());
        // Behind the held SEND, a WRITE waits too (in order).
        assert_eq!(held.rule(ends(false, true), &write()), Rule::HoldRequest);
    }

    #[test]
    fn a_frozen_sender_answers_but_posts_nothing() {
        let mut held = Held::default();
        assert_eq!(held.rule(ends(true, false), &answer()), Rule::Pass);
        assert_eq!(held.rule(ends(true, false), &write()), Rule::HoldRequest);
        held.hold(Rule::HoldRequest, write());
        assert_eq!(held.rule(ends(true, false), &answer()), Rule::Pass);
        let close = Frame::Close { reason: "x".into() };
        assert_eq!(held.rule(ends(true, false), &close), Rule::HoldClose);
        held.hold(Rule::HoldClose, close);
        assert_eq!(held.rule(ends(true, false), &answer()), Rule::HoldClose);
        let order: Vec<bool> = held
            .drain()
            .map(|f| matches!(f, Frame::Close { .. }))
            .collect();
        assert_eq!(order, [false, true]);
        assert!(held.is_empty());
    }

    #[test]
    fn held_sends_let_the_writes_before_them_land() {
        let mut held = Held::default();
        let sends = Ends {
            sends_held: true,
            ..Ends::default()
        };
        // A message before any WRITE goes on.
        assert_eq!(held.rule(sends, &send()), Rule::Pass);
        assert_eq!(held.rule(sends, &write()), Rule::Pass);
        held.passed(sends, &write());
        assert_eq!(held.rule(sends, &answer()), Rule::Pass);
        assert_eq!(held.rule(sends, &send()), Rule::HoldRequest);
        held.hold(Rule::HoldRequest, send());
        assert_eq!(held.rule(sends, &write()), Rule::HoldRequest);
        assert_eq!(held.rule(sends, &answer()), Rule::Pass);
    }

    #[test]
    fn nothing_frozen_passes_everything() {
        let held = Held::default();
        for frame in [write(), send(), answer()] {
            assert_eq!(held.rule(ends(false, false), &frame), Rule::Pass);
        }
    }
}
