//! The scaling rule and its stabilization windows.
//!
//! required = the fewest replicas whose predicted occupancy, once the load settles on them,
//! stays at or under the target: targetUtilization × k* sessions (see `demand` for the
//! equilibrium and `pod_model` for k*). So the rule plans for where the pool will be, not for
//! the reading now, which moves with the pool's own size.
//! - Capacity already ordered counts: while replicas are starting, the queue piling up for
//!   them (the backlog) is counted at full occupancy (k*), once, not with the target's
//!   headroom, and sustained demand (running, refused, or arriving faster than served) at the
//!   target; the count already ordered is held while it covers both, so no tick adds again
//!   what an earlier raise is bringing.
//! - Down only to a count whose predicted occupancy stays under (1 − TOLERANCE) × the
//!   target, so a scale-down lands with room below the target and the noise of a steady load
//!   does not scale it back up.
//! - While p99 queue wait exceeds its target: never below the current count (whether
//!   replicas are starting, all ready, or at the ceiling; only a ceiling lowered below the
//!   current count, which `plan` enforces, goes lower), and raised by at least one when every
//!   replica is ready.
//!
//! The stabilized value scales up to the lowest recommendation within the scale-up window
//! (0s: at once) and down only to the highest recommendation within the scale-down window, a
//! safety net rather than what keeps a steady load still; each move is limited by the max
//! step. While the demand falls clearly (the trend, with the forecast enabled) the window is
//! at most `FALLING_SCALE_DOWN_WINDOW_MS`: the window waits out noise, and a fall that steady is
//! not noise; holding the plateau's count for the whole window is what a descent wastes.

use std::collections::VecDeque;

use tidegate_api::InferencePoolSpec;

use super::{MeasuredPlan, Millis};

/// Margin under the target occupancy that a scale-down must leave.
pub const TOLERANCE: f64 = 0.1;

/// The scale-down window while the demand falls clearly (at most; a shorter configured
/// window stays).
pub const FALLING_SCALE_DOWN_WINDOW_MS: u64 = 120_000;

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
    let (line, k_star) = (m.pod.line, m.pod.sessions);
    let target = spec.slo.target_utilization * k_star;
    let need = |k: f64, backlog: bool| m.demand.replicas_for(line, k, backlog).ceil() as i32;
    let by_demand = need(target, true);
    let mut why = format!(
        "{:.0} sessions ({:.0} running, {:.0} queued, {:.0} unmet) need {by_demand} replicas at {:.1} each (target {:.2} × k* {:.1}; ITL {:.2} ms + {:.3} ms × k)",
        m.demand.sessions(true),
        m.demand.running,
        m.demand.waiting,
        m.demand.unmet,
        target,
        spec.slo.target_utilization,
        k_star,
        line.base_seconds * 1e3,
        line.per_sequence_seconds * 1e3,
    );
    let mut wanted = by_demand;
    let starting = current - ready;
    if wanted > current && starting > 0 {
        // The queue needs slots once, when the replicas on their way are ready: counted at
        // full occupancy (k*), without the target's headroom, which sustained demand gets.
        let sustained = need(target, false).max(need(k_star, true));
        wanted = sustained.max(current);
        why = if sustained > current {
            format!("{why}; {starting} starting, raised to {sustained} (queue at k*)")
        } else {
            format!("{why}; held: {starting} replicas on their way cover it")
        };
    } else if wanted < current {
        let down_to = need(target * (1.0 - TOLERANCE), true);
        wanted = down_to.min(current);
        if down_to >= current {
            why = format!(
                "{why}; held: {} replicas would run over {:.0}% of the target",
                current - 1,
                (1.0 - TOLERANCE) * 100.0
            );
        } else {
            why = format!(
                "{why}; down to {down_to}, {:.0}% under the target",
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

/// The scale-down window in force: the pool's, or at most `FALLING_SCALE_DOWN_WINDOW_MS`
/// while the demand falls clearly.
pub fn scale_down_window_ms(spec: &InferencePoolSpec, falling: bool) -> u64 {
    let configured = spec.scaling.scale_down_stabilization.as_std().as_millis() as u64;
    if falling {
        configured.min(FALLING_SCALE_DOWN_WINDOW_MS)
    } else {
        configured
    }
}

/// Applies the stabilization windows and step limits to a raw recommendation, with the
/// scale-down window in force (`scale_down_window_ms`).
pub fn stabilize(
    spec: &InferencePoolSpec,
    recs: &Recommendations,
    now: Millis,
    current: i32,
    raw: i32,
    down_ms: u64,
) -> i32 {
    let s = &spec.scaling;
    let up_ms = s.scale_up_stabilization.as_std().as_millis() as u64;
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
