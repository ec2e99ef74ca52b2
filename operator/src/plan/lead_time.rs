//! The pool's measured start-up lead time: how long replicas the planner orders take to be
//! ready, scheduling, image pull and weight load included. The forecast looks this far ahead.
//!
//! Each scale-up the planner applies opens an order (when, and the count it raised to); the
//! order is met when that many replicas are ready, and the time it took is a sample. The
//! estimate is the slowest of the recent samples (a batch of pods is only all there when its
//! slowest one is), bounded by `engine.startupGracePeriod`; before any sample, half the grace
//! period.
//!
//! Invariants: pure; at most `MAX_OPEN` orders and `KEEP` samples; an order the pool no longer
//! wants (scaled back below it) or that outlives the grace period (a pod that never came) is
//! dropped without a sample; the estimate never exceeds the grace period.

use std::collections::VecDeque;

use super::Millis;

/// Samples the estimate is taken over.
const KEEP: usize = 32;
/// Orders awaiting their replicas, at most.
const MAX_OPEN: usize = 64;

/// Start-up lead time, as measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeadTime {
    /// (ordered at, replicas ordered), oldest first.
    open: VecDeque<(Millis, i32)>,
    /// The most recent samples, ms.
    samples: VecDeque<u64>,
}

impl LeadTime {
    /// Restores an estimate an earlier operator measured, as one sample.
    pub fn restored(ms: u64) -> LeadTime {
        LeadTime {
            open: VecDeque::new(),
            samples: VecDeque::from([ms]),
        }
    }

    /// One tick: replicas `current` run, `ready` are ready; `ordered` is the count this tick
    /// raised the pool to, if it scaled up.
    pub fn observe(
        &mut self,
        now: Millis,
        current: i32,
        ready: i32,
        ordered: Option<i32>,
        grace_ms: u64,
    ) {
        // Orders the pool no longer wants, or whose pods never came, teach nothing.
        self.open
            .retain(|&(at, n)| n <= current && now.saturating_sub(at) <= grace_ms);
        while let Some(&(at, n)) = self.open.front() {
            if ready < n {
                break;
            }
            self.open.pop_front();
            if self.samples.len() >= KEEP {
                self.samples.pop_front();
            }
            self.samples.push_back(now.saturating_sub(at));
        }
        if let Some(n) = ordered
            && n > ready
        {
            if self.open.len() >= MAX_OPEN {
                self.open.pop_front();
            }
            self.open.push_back((now, n));
        }
    }

    /// The lead time to plan with, ms.
    pub fn estimate_ms(&self, grace_ms: u64) -> u64 {
        self.samples
            .iter()
            .copied()
            .max()
            .unwrap_or(grace_ms / 2)
            .min(grace_ms)
    }

    /// Whether any start-up has been measured (or restored).
    pub fn measured(&self) -> bool {
        !self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: u64 = 15 * 60_000;

    #[test]
    fn an_order_is_met_when_its_replicas_are_ready() {
        let mut l = LeadTime::default();
        assert_eq!(l.estimate_ms(GRACE), GRACE / 2, "before any sample");
        l.observe(0, 2, 2, Some(4), GRACE);
        l.observe(60_000, 4, 3, None, GRACE);
        assert!(!l.measured());
        l.observe(180_000, 4, 4, None, GRACE);
        assert_eq!(l.estimate_ms(GRACE), 180_000);
        // A faster start-up later: the slowest recent one still counts.
        l.observe(200_000, 6, 4, Some(6), GRACE);
        l.observe(260_000, 6, 6, None, GRACE);
        assert_eq!(l.estimate_ms(GRACE), 180_000);
    }

    #[test]
    fn cancelled_and_overdue_orders_teach_nothing() {
        let mut l = LeadTime::default();
        l.observe(0, 2, 2, Some(4), GRACE);
        l.observe(30_000, 2, 2, None, GRACE); // scaled back before the pods came
        l.observe(60_000, 4, 2, Some(4), GRACE);
        l.observe(60_000 + GRACE + 1, 4, 2, None, GRACE); // never came
        l.observe(60_000 + GRACE + 2, 4, 4, None, GRACE);
        assert!(!l.measured());
    }

    #[test]
    fn the_estimate_is_bounded_by_the_grace_period() {
        let l = LeadTime::restored(40 * 60_000);
        assert_eq!(l.estimate_ms(GRACE), GRACE);
    }
}
