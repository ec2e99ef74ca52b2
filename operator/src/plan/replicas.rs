//! The scaling rule and its stabilization windows.
//!
//! required = ceil(demand ÷ (capacity × target utilization)), held at the current count
//! while demand is within ±10% of what it serves at the target, raised by at least one
//! replica while p99 queue wait exceeds its target and no replica is on its way (a replica
//! still starting is the raise of an earlier tick), bounded by [min, ceiling]. The
//! invariant: while p99 queue wait exceeds its target the requirement is never below the
//! current count, whether replicas are starting, all ready, or at the ceiling (only a
//! ceiling lowered below the current count, which `plan` enforces, goes lower). The
//! stabilized value scales up to the lowest recommendation within the scale-up window
//! (0s: at once) and down only to the highest recommendation within the scale-down window,
//! so a steady load never flaps; each move is limited by the max step.

use std::collections::VecDeque;

use tidegate_api::InferencePoolSpec;

use super::{MeasuredPlan, Millis};

/// Relative demand change, against what the current replicas serve at the target
/// utilization, that the rule ignores (the same default as the Kubernetes HPA).
pub const TOLERANCE: f64 = 0.1;

/// Recommendations kept for the stabilization windows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recommendations {
    entries: VecDeque<(Millis, i32)>,
}

impl Recommendations {
    /// Records this tick's raw recommendation and forgets what no window can need.
    pub fn record(&mut self, now: Millis, replicas: i32) {
        self.entries.push_back((now, replicas));
        // Keep at most a day, and at most 10,000 entries.
        while self.entries.len() > 10_000
            || self
                .entries
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > 86_400_000)
        {
            self.entries.pop_front();
        }
    }

    fn within(&self, now: Millis, window_ms: u64) -> impl Iterator<Item = i32> + '_ {
        self.entries
            .iter()
            .filter(move |(t, _)| now.saturating_sub(*t) <= window_ms)
            .map(|(_, r)| *r)
    }
}

/// The raw replica requirement from demand and queue wait, with the reason in words.
pub fn required(
    spec: &InferencePoolSpec,
    m: &MeasuredPlan,
    current: i32,
    ready: i32,
    ceiling: i32,
) -> (i32, String) {
    let per_replica = m.per_replica_capacity * spec.slo.target_utilization;
    let by_demand = if per_replica > 0.0 {
        (m.demand_tokens_per_second / per_replica).ceil() as i32
    } else {
        current
    };
    let mut why = format!(
        "demand {:.0} tok/s ÷ ({:.0} tok/s × {:.2}) = {by_demand}",
        m.demand_tokens_per_second, m.per_replica_capacity, spec.slo.target_utilization
    );
    let mut wanted = by_demand;
    // Tolerance: while demand is within ±TOLERANCE of what the current replicas serve at
    // the target utilization, hold them; the noise of a steady load would otherwise scale
    // up on every upward blip (the up window is short) and down again a window later.
    if current > 0 && per_replica > 0.0 && wanted != current {
        let ratio = m.demand_tokens_per_second / (f64::from(current) * per_replica);
        if (ratio - 1.0).abs() <= TOLERANCE {
            wanted = current;
            why = format!(
                "{why}: within {:.0}% of the current {current}, held",
                TOLERANCE * 100.0
            );
        }
    }
    let over = m.queue_wait_p99.as_secs_f64() > spec.slo.queue_wait_p99.as_secs_f64();
    if over {
        (wanted, why) = over_target(spec, m, current, ready, ceiling, wanted, why);
    }
    (wanted.max(0), why)
}

/// The requirement while p99 queue wait is over its target: never below the current count
/// (the queue says the pool is short, whatever the demand estimate says), and raised by one
/// when every replica is ready and the ceiling allows it.
fn over_target(
    spec: &InferencePoolSpec,
    m: &MeasuredPlan,
    current: i32,
    ready: i32,
    ceiling: i32,
    wanted: i32,
    why: String,
) -> (i32, String) {
    let words = format!(
        "queue p99 {} over target {}",
        m.queue_wait_p99, spec.slo.queue_wait_p99
    );
    if ready < current {
        // While replicas are starting, the queue they will drain is no new evidence: raising
        // again on every tick until they are ready would add one replica per interval for
        // the whole start-up.
        let why = format!(
            "{why}; {words}, not raised: {} replicas still starting",
            current - ready
        );
        return (wanted.max(current), why);
    }
    let raised = current + 1;
    if current < ceiling && raised > wanted {
        return (raised, format!("{words}: raised to {raised}"));
    }
    if wanted < current {
        // At the ceiling, or demand says fewer: hold, never lower while the queue is long.
        return (current, format!("{why}; {words}: held at {current}"));
    }
    (wanted, why)
}

/// Applies the stabilization windows and step limits to a raw recommendation.
pub fn stabilize(
    spec: &InferencePoolSpec,
    recs: &Recommendations,
    now: Millis,
    current: i32,
    raw: i32,
) -> i32 {
    let s = &spec.scaling;
    let up_ms = s.scale_up_stabilization.as_std().as_millis() as u64;
    let down_ms = s.scale_down_stabilization.as_std().as_millis() as u64;
    let target = if raw > current {
        // Scale up only as far as every recommendation in the window agrees.
        recs.within(now, up_ms).min().unwrap_or(raw).max(current)
    } else if raw < current {
        // Scale down only as far as every recommendation in the window allows.
        recs.within(now, down_ms).max().unwrap_or(raw).min(current)
    } else {
        current
    };
    target.clamp(
        current - s.max_scale_down_step,
        current + s.max_scale_up_step,
    )
}
