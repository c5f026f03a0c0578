//! One log line per period for events that can come in floods (refused or
//! failed connection attempts): a flood of attempts must not become a
//! flood of lines. Shared by the fabric's accept loop and the daemon's
//! client-facing ports.

use std::time::Duration;

use tokio::time::Instant;

/// Lets one line through per period: the first event at once, then the
/// next one a period later, with the count of those held back meanwhile.
#[derive(Debug)]
pub struct Throttle {
    period: Duration,
    next_at: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// One line per `period`.
    pub fn new(period: Duration) -> Throttle {
        Throttle {
            period,
            next_at: None,
            held: 0,
        }
    }

    /// Notes an event at `now`: `Some(n)` when it is to be logged now, for
    /// `n` events (this one and those held back since the last line).
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.held += 1;
        match self.next_at {
            Some(next_at) if now < next_at => None,
            _ => {
                self.next_at = Some(now + self.period);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_lets_one_line_through_per_period_with_the_count() {
        let start = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(10));
        assert_eq!(t.note(start), Some(1), "the first at once");
        assert_eq!(t.note(start + Duration::from_secs(1)), None);
        assert_eq!(t.note(start + Duration::from_secs(9)), None);
        assert_eq!(
            t.note(start + Duration::from_secs(10)),
            Some(3),
            "a period later, with those held back"
        );
        assert_eq!(t.note(start + Duration::from_secs(11)), None);
    }
}
