//! How a policy moved the pool, from its replica timeline: reversals and overshoot.
//!
//! - A reversal is a move of the replica count in the direction opposite to the move before,
//!   within `REVERSAL_WINDOW_S` of it: the flapping a steady load must not show. Counted per
//!   change of direction, as the local summary counts them, so the steps of one climb count
//!   once.
//! - Overshoot at time t is what the policy had ordered beyond what it still held a while
//!   later: current(t) − the most it ran in [t + 10 min, t + 20 min]. Replicas ordered and
//!   given back within that time were beyond the eventual requirement. A slow tide also
//!   shows a little (what demand itself lost in the meantime), a few replicas per hundred.
//!
//! Invariants: both are computed from ticks inside the trace only; an empty timeline has no
//! reversal and no overshoot.

use super::tenants::NTIERS;

/// A point of the replica/admission timeline (one per control tick).
#[derive(Clone, Copy, Debug)]
pub struct TimePoint {
    pub t_s: f64,
    pub current: i32,
    pub ready: i32,
    pub paused: [bool; NTIERS],
    /// Requests missed so far (late or refused for overload).
    pub missed: u64,
}

/// A scale move in the opposite direction within this many seconds is a reversal.
pub const REVERSAL_WINDOW_S: f64 = 600.0;
/// Overshoot compares with what was held this long after ...
const LATER_FROM_S: f64 = 600.0;
/// ... up to this long after.
const LATER_TO_S: f64 = 1200.0;

/// Direction changes of the replica count within `REVERSAL_WINDOW_S` of the move before.
pub fn reversals(timeline: &[TimePoint]) -> u64 {
    reversals_within(timeline, REVERSAL_WINDOW_S)
}

/// Moves whose direction is the opposite of the move before, within `window_s` of it. A
/// climb of several steps after one step down is one reversal, not one per step: the steps
/// of one move (a rate window filling, `maxScaleUpStep`) are not flapping.
pub fn reversals_within(timeline: &[TimePoint], window_s: f64) -> u64 {
    let mut last: Option<(bool, f64)> = None;
    let mut n = 0;
    for w in timeline.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.current == a.current {
            continue;
        }
        let up = b.current > a.current;
        n += u64::from(last.is_some_and(|(was_up, t)| was_up != up && b.t_s - t <= window_s));
        last = Some((up, b.t_s));
    }
    n
}

/// The largest overshoot over the run, in replicas (0 when there is none).
pub fn worst_overshoot(timeline: &[TimePoint]) -> i32 {
    let mut worst = 0;
    let mut from = 0;
    for (i, p) in timeline.iter().enumerate() {
        // The window [t + 10 min, t + 20 min] only moves forward: `from` chases its start.
        from = from.max(i);
        while from < timeline.len() && timeline[from].t_s < p.t_s + LATER_FROM_S {
            from += 1;
        }
        let later = timeline[from..]
            .iter()
            .take_while(|q| q.t_s <= p.t_s + LATER_TO_S)
            .map(|q| q.current)
            .max();
        if let Some(held) = later {
            worst = worst.max(p.current - held);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tenants::NTIERS;

    fn timeline(counts: &[(f64, i32)]) -> Vec<TimePoint> {
        counts
            .iter()
            .map(|&(t_s, current)| TimePoint {
                t_s,
                current,
                ready: current,
                paused: [false; NTIERS],
                missed: 0,
            })
            .collect()
    }

    #[test]
    fn an_up_then_down_within_ten_minutes_is_one_reversal() {
        let flap = timeline(&[(0.0, 5), (60.0, 6), (400.0, 5), (2000.0, 5)]);
        assert_eq!(reversals(&flap), 1);
        let slow = timeline(&[(0.0, 5), (60.0, 6), (900.0, 5)]);
        assert_eq!(reversals(&slow), 0);
        let monotone = timeline(&[(0.0, 5), (60.0, 6), (120.0, 8)]);
        assert_eq!(reversals(&monotone), 0);
        // One step down, then a burst met in four steps: one change of direction.
        let climb = timeline(&[(0.0, 6), (60.0, 5), (120.0, 6), (180.0, 7), (240.0, 9)]);
        assert_eq!(reversals(&climb), 1);
        let flapping = timeline(&[(0.0, 5), (60.0, 6), (120.0, 5), (180.0, 6), (240.0, 5)]);
        assert_eq!(reversals(&flapping), 3);
        assert_eq!(reversals(&[]), 0);
    }

    #[test]
    fn overshoot_is_what_was_given_back_ten_to_twenty_minutes_later() {
        let mut points = vec![(0.0, 10), (60.0, 30)];
        points.extend((1..=40).map(|i| (60.0 + 60.0 * f64::from(i), 22)));
        assert_eq!(worst_overshoot(&timeline(&points)), 8);
        let held: Vec<(f64, i32)> = (0..40).map(|i| (60.0 * f64::from(i), 12)).collect();
        assert_eq!(worst_overshoot(&timeline(&held)), 0);
    }
}
