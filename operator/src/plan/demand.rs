//! Demand in the unit that does not move when the pool scales: slot-steps per second.
//!
//! Why: the sessions a pool holds depend on its size. With fewer replicas each runs a larger
//! batch, every step takes longer (ITL(k) = A + B·k), sessions last longer and more of them
//! are open at once; add replicas and the same traffic shows fewer sessions. Planning on the
//! session count read now scales up, sees fewer sessions, scales down, and flaps. What stays
//! put is the work arriving: each running session takes one step per ITL, so the pool's
//! sessions S at occupancy k_now need λ = S ÷ ITL(k_now) steps per second. At n replicas the
//! load settles where k = (λ/n) × ITL(k), so n = λ × ITL(k) ÷ k replicas hold it at
//! occupancy k: the equilibrium this module computes.
//!
//! S counts what the pool serves and what it does not: running requests, the queue (the
//! backlog), and unmet demand: arrivals per second the pool refused for overload or left to
//! pile up in its queues, each holding a slot as long as a served request does (Little's
//! law: running ÷ finished per second). The backlog is kept apart: it is a one-off amount
//! that replicas already on their way will drain, not a rate that needs more of them.
//!
//! Invariants: every figure is finite and non-negative; with nothing running and nothing
//! waiting the demand is zero; `replicas_for` is non-increasing in the occupancy it allows.

use super::PoolMetrics;
use super::pod_model::Line;

/// What the pool's load is, in sessions and in steps per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    /// Requests running, pool-wide (averaged over the window).
    pub running: f64,
    /// Requests waiting in engine queues (the backlog).
    pub waiting: f64,
    /// Sessions the pool would also hold had it served what it refused or queued up.
    pub unmet: f64,
    /// Mean occupancy of a serving replica now.
    pub occupancy: f64,
    /// Step time at that occupancy, by the pod model, seconds.
    pub itl_seconds: f64,
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x.max(0.0) } else { 0.0 }
}

impl Demand {
    pub fn of(m: &PoolMetrics, line: Line, serving: i32) -> Demand {
        let running = finite(m.running);
        let serving = f64::from(serving.max(1));
        let occupancy = running / serving;
        // How long a request holds its slot, by Little's law; without finished requests in
        // the window (the first minutes, or requests longer than it) unmet demand cannot be
        // sized and counts as nothing rather than as a guess.
        let finished = finite(m.requests_finished_per_second);
        let holding_s = if finished > 0.0 {
            running / finished
        } else {
            0.0
        };
        let unmet_rate =
            finite(m.overload_refusals_per_second) + finite(m.waiting_growth_per_second);
        Demand {
            running,
            waiting: finite(m.waiting),
            unmet: finite(unmet_rate * holding_s),
            occupancy,
            itl_seconds: line.itl(occupancy).max(1e-9),
        }
    }

    /// Sessions the pool holds now, the backlog included or not.
    pub fn sessions(&self, with_backlog: bool) -> f64 {
        self.running + self.unmet + if with_backlog { self.waiting } else { 0.0 }
    }

    /// λ: slot-steps per second those sessions need.
    pub fn steps_per_second(&self, with_backlog: bool) -> f64 {
        self.sessions(with_backlog) / self.itl_seconds
    }

    /// Replicas (fractional) that hold the load at `occupancy` sessions each once it settles:
    /// λ × ITL(k) ÷ k.
    pub fn replicas_for(&self, line: Line, occupancy: f64, with_backlog: bool) -> f64 {
        let k = occupancy.max(1e-6);
        finite(self.steps_per_second(with_backlog) * line.itl(k) / k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Occupancy per replica once the load settles on `replicas`: the k solving
    /// k = (λ/n) × (A + B·k); at or past the point where one replica's steps cannot keep up
    /// (λ/n × B ≥ 1), infinite.
    fn occupancy_at(d: &Demand, line: Line, replicas: i32, with_backlog: bool) -> f64 {
        let per = d.steps_per_second(with_backlog) / f64::from(replicas.max(1));
        let denom = 1.0 - per * line.per_sequence_seconds;
        if denom <= 0.0 {
            f64::INFINITY
        } else {
            per * line.base_seconds / denom
        }
    }

    const LINE: Line = Line {
        base_seconds: 0.02,
        per_sequence_seconds: 0.001_875,
    };

    fn metrics(running: f64, waiting: f64) -> PoolMetrics {
        PoolMetrics {
            running,
            waiting,
            requests_finished_per_second: running / 30.0,
            ..PoolMetrics::default()
        }
    }

    #[test]
    fn the_requirement_does_not_move_with_the_pool_size_it_was_read_at() {
        // The same traffic read at 10 replicas (occupancy 12) and at 15: the sessions seen
        // differ (a larger batch is slower, so sessions last longer), the requirement not.
        let steps = 10.0 * 12.0 / LINE.itl(12.0);
        let at10 = Demand::of(&metrics(120.0, 0.0), LINE, 10);
        let k15 = occupancy_at(&at10, LINE, 15, true);
        let at15 = Demand::of(&metrics(15.0 * k15, 0.0), LINE, 15);
        assert!((at10.steps_per_second(true) - steps).abs() < 1e-6);
        let (a, b) = (
            at10.replicas_for(LINE, 11.2, true),
            at15.replicas_for(LINE, 11.2, true),
        );
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        // And predicting the occupancy back gives the occupancy it was read at.
        assert!((occupancy_at(&at10, LINE, 10, true) - 12.0).abs() < 1e-6);
    }

    #[test]
    fn refusals_and_a_growing_queue_count_as_sessions_the_backlog_separately() {
        let mut m = metrics(160.0, 40.0);
        m.requests_finished_per_second = 4.0; // 40 s a request
        m.overload_refusals_per_second = 1.0;
        m.waiting_growth_per_second = 0.5;
        let d = Demand::of(&m, LINE, 10);
        assert!((d.unmet - 60.0).abs() < 1e-9);
        assert_eq!(d.sessions(false), 220.0);
        assert_eq!(d.sessions(true), 260.0);
    }

    #[test]
    fn nothing_running_is_no_demand_and_garbage_is_zero() {
        let d = Demand::of(&PoolMetrics::default(), LINE, 3);
        assert_eq!(d.replicas_for(LINE, 10.0, true), 0.0);
        let mut m = metrics(f64::NAN, f64::INFINITY);
        m.waiting_growth_per_second = -5.0;
        let d = Demand::of(&m, LINE, 0);
        assert_eq!(d.sessions(true), 0.0);
    }

    #[test]
    fn more_allowed_occupancy_never_needs_more_replicas() {
        let d = Demand::of(&metrics(200.0, 10.0), LINE, 12);
        let mut last = f64::INFINITY;
        for k in 1..=16 {
            let n = d.replicas_for(LINE, f64::from(k), true);
            assert!(n <= last + 1e-9);
            last = n;
        }
    }
}
