//! Pure planning: (spec, tier policy, observed metrics, current replicas, history) →
//! desired replicas, admission state, conditions and events. No I/O, no clock of its own:
//! `now` comes in with the observation, so every scenario is deterministic and testable.
//!
//! Invariants:
//! - Missing or stale metrics never scale a pool down and never pause admission on their
//!   own: the last decision is held and MetricsAvailable=False says why (fail static).
//! - Advisory mode never changes replicas or admission; it reports what it would do.
//! - Manual mode holds `replicas.manual` (or the current count), bounded by min/max.
//! - Desired replicas always lie within [min, ceiling], where the ceiling is the lower of
//!   replicas.max and what the GPU budget allows.

mod admission;
mod ahead;
mod conditions;
mod demand;
mod forecast;
mod lead_time;
mod pod_model;
mod replicas;
#[cfg(test)]
mod tests;
mod trend;

use tidegate_api::conditions::{reasons, types};
use tidegate_api::{AdmissionState, Duration, InferencePoolSpec, ScalingMode, TierPolicySpec};

pub use admission::{AdmissionMachine, Constraint};
pub use ahead::ForecastPlan;
pub use conditions::{ConditionPlan, merge_conditions, rfc3339, to_time};
pub use demand::Demand;
pub use forecast::{Forecaster, Standing};
pub use lead_time::LeadTime;
pub use pod_model::{AtSlo, Line, PodModel, StepSample};
pub use replicas::Recommendations;

/// Milliseconds since the Unix epoch: the planner's only notion of time.
pub type Millis = u64;

/// What the metrics port measured for a pool, summed or taken across its ready pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolMetrics {
    /// Decode tokens per second produced by the whole pool.
    pub decode_tokens_per_second: f64,
    /// One point per engine that produced tokens during the window: its mean occupancy and
    /// mean inter-token latency, what the pod model learns its step-time line from.
    pub step_samples: Vec<StepSample>,
    /// Requests being decoded, summed over pods.
    pub running: f64,
    /// Requests waiting in engine queues, summed over pods.
    pub waiting: f64,
    /// p99 queue wait over the window, seconds; None when nothing was queued.
    pub queue_wait_p99_seconds: Option<f64>,
    /// Fraction of KV blocks in use across the pool.
    pub kv_utilization: f64,
    /// KV evictions per second across the pool.
    pub evictions_per_second: f64,
    /// Requests refused per second for overload (queue full, queue timeout), pool-wide:
    /// demand the pool did not serve, counted as unmet demand.
    pub overload_refusals_per_second: f64,
    /// Requests that finished per second (completed, cancelled or failed), pool-wide: with
    /// `running` it gives how long a request holds its slot (Little's law).
    pub requests_finished_per_second: f64,
    /// How fast the engines' queues grew over the window (requests/s, pool-wide; negative
    /// while they drain): arrivals the pool did not keep up with.
    pub waiting_growth_per_second: f64,
    /// Pods that reported metrics.
    pub pods_reporting: i32,
    /// When the newest sample was taken.
    pub sampled_at: Millis,
}

/// Why metrics are missing.
#[derive(Clone, Debug, PartialEq)]
pub enum MetricsProblem {
    /// The source could not be reached (Prometheus down, engines unreachable).
    Unreachable(String),
    /// The source answered without data for this pool.
    NoData(String),
}

/// One tick's input.
#[derive(Clone, Debug)]
pub struct Observation {
    pub now: Millis,
    /// Replicas the workload runtime currently runs (Deployment spec.replicas).
    pub current_replicas: i32,
    /// Replicas ready to serve.
    pub ready_replicas: i32,
    pub metrics: Result<PoolMetrics, MetricsProblem>,
    /// Requests the pool's routers hold because no engine is ready (scale from zero).
    pub held_requests: u64,
    /// Requests waiting at the pool's routers for an engine with room: backlog the engines'
    /// queue gauges do not show once every engine is full, counted with theirs.
    pub router_queued: u64,
}

/// Everything the planner remembers between ticks for one pool.
#[derive(Clone, Debug, Default)]
pub struct PlanState {
    pub pod_model: PodModel,
    pub recommendations: Recommendations,
    pub admission: AdmissionMachine,
    pub last_desired: Option<i32>,
    pub last_scale_time: Option<Millis>,
    /// Whether metrics were available at the previous tick (for transition events).
    pub metrics_were_available: Option<bool>,
    /// The demand forecast learned from this pool's history.
    pub forecast: Forecaster,
    /// How long this pool's replicas take to be ready once ordered.
    pub lead_time: LeadTime,
    /// The demand of the last minutes, for its trend.
    pub trend: trend::Trend,
}

/// Normal or Warning, as Kubernetes Events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

/// An event to emit.
#[derive(Clone, Debug, PartialEq)]
pub struct EventPlan {
    pub kind: EventKind,
    pub reason: &'static str,
    pub note: String,
}

/// What a replica count rests on; `Decision::reason` says it in prose with the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// The demand measured now (the reactive rule, with its queue-wait and starting-replica
    /// refinements).
    Demand,
    /// The forecast's peak over the lead time: ordered early.
    Forecast,
    /// A scale-down stopped where the forecast over the lead time needs the replicas.
    ForecastHold,
    /// The demand's rising trend over the last minutes, one lead time ahead: ordered early.
    Trend,
    /// `replicas.manual` in Manual mode.
    Manual,
    /// Metrics missing or not yet there: the last decision (or the current count) held.
    NoMetrics,
    /// Requests held at the router while the pool has no engine.
    ScaleFromZero,
    /// Lifted to `replicas.min`.
    Floor,
    /// Cut to the ceiling (`replicas.max` or the GPU budget).
    Ceiling,
}

impl Basis {
    pub const ALL: [Basis; 9] = [
        Basis::Demand,
        Basis::Forecast,
        Basis::ForecastHold,
        Basis::Trend,
        Basis::Manual,
        Basis::NoMetrics,
        Basis::ScaleFromZero,
        Basis::Floor,
        Basis::Ceiling,
    ];

    /// The name in `status.recentDecisions[].basis`: part of the API, never renamed.
    pub fn name(self) -> &'static str {
        match self {
            Basis::Demand => "Demand",
            Basis::Forecast => "Forecast",
            Basis::ForecastHold => "ForecastHold",
            Basis::Trend => "Trend",
            Basis::Manual => "Manual",
            Basis::NoMetrics => "NoMetrics",
            Basis::ScaleFromZero => "ScaleFromZero",
            Basis::Floor => "Floor",
            Basis::Ceiling => "Ceiling",
        }
    }
}

/// A replica change decided this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub from: i32,
    pub to: i32,
    /// What the new count rests on.
    pub basis: Basis,
    pub reason: String,
    /// False in Advisory mode: reported, not applied.
    pub applied: bool,
}

/// The admission state to push to engines and report in status.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionPlan {
    pub state: AdmissionState,
    pub since: Option<Millis>,
    pub reason: String,
    pub paused_tiers: Vec<String>,
}

/// Measurements as reported in status, in status units.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeasuredPlan {
    pub decode_tokens_per_second: f64,
    /// Sessions held now (unmet demand and the backlog included) × r, tokens/s.
    pub demand_tokens_per_second: f64,
    /// Sessions held now ÷ (serving replicas × k*).
    pub utilization: f64,
    pub queue_wait_p99: Duration,
    pub kv_utilization: f64,
    pub evictions_per_second: f64,
    pub observed_at: Millis,
    /// The pod model's figures at the SLO: its line, k*, and the demand one replica serves at
    /// the SLO (k* × r, tokens/s).
    pub pod: AtSlo,
    /// The load in sessions and steps per second.
    pub demand: Demand,
}

/// One tick's output.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Replicas the workload runtime should run (equals current in Advisory mode).
    pub replicas: i32,
    /// Replicas the planner wants (in Advisory mode: would want).
    pub desired_replicas: i32,
    pub admission: AdmissionPlan,
    /// Present when metrics were available.
    pub measured: Option<MeasuredPlan>,
    /// The forecast's standing and figures; present when metrics were available.
    pub forecast: Option<ForecastPlan>,
    /// Points the pod model has learned from.
    pub pod_samples: u64,
    pub decision: Option<Decision>,
    pub conditions: Vec<ConditionPlan>,
    pub events: Vec<EventPlan>,
    /// One line explaining the decision, for logs.
    pub explanation: String,
}

/// The replica ceiling: replicas.max, lowered by the GPU budget when it binds.
pub fn ceiling(spec: &InferencePoolSpec) -> i32 {
    let max = spec.replicas.max;
    match (spec.gpu_budget, spec.engine.resources.gpus) {
        (Some(budget), gpus) if gpus > 0 => max.min(budget / gpus),
        _ => max,
    }
}

/// Why the ceiling binds, in words.
fn ceiling_words(spec: &InferencePoolSpec) -> String {
    let c = ceiling(spec);
    if c < spec.replicas.max {
        format!(
            "GPU budget ({} GPUs = {c} replicas × {} GPUs)",
            spec.gpu_budget.unwrap_or_default(),
            spec.engine.resources.gpus
        )
    } else {
        format!("max replicas ({c})")
    }
}

/// Plans one tick for one pool and advances `state`, in named stages: measure → forecast →
/// replicas → admission → report.
pub fn plan(
    spec: &InferencePoolSpec,
    tiers: Option<&TierPolicySpec>,
    obs: &Observation,
    state: &mut PlanState,
) -> Plan {
    let mut events = Vec::new();
    // Measure: learn capacity, compute demand and utilization.
    let metrics = fresh_metrics(spec, obs);
    note_metrics_transition(&metrics, state, &mut events);
    let measured = metrics.as_ref().ok().map(|m| {
        state.pod_model.observe(spec, &m.step_samples);
        measure(spec, m, &state.pod_model, obs)
    });
    // Forecast: learn the day's profile, and what it needs one lead time ahead.
    let forecast = measured
        .as_ref()
        .map(|m| ahead::forecast(spec, m, state, obs.now));
    // Replicas: what the pool needs, stabilized and bounded, and the decision with its event.
    let counts = decide_replicas(spec, obs, measured.as_ref(), forecast.as_ref(), state);
    let decision = record_decision(spec, obs, &counts, state, &mut events);
    // Admission: at the ceiling, or while ordered capacity is still starting.
    let gate = decide_admission(
        spec,
        tiers,
        obs,
        &counts,
        measured.as_ref(),
        state,
        &mut events,
    );
    // Report: conditions and the one-line explanation.
    let conditions = conditions::build(&conditions::Inputs {
        spec,
        obs,
        metrics: &metrics,
        measured: measured.as_ref(),
        desired: counts.desired,
        current: obs.current_replicas,
        advisory: counts.advisory,
        constraint: gate.constraint,
        exhausted_since: state
            .admission
            .capacity
            .exhausted_since
            .filter(|_| gate.exhausted),
        ceiling_words: ceiling_words(spec),
        admission: &gate.admission,
    });
    let explanation = explain(
        spec,
        obs,
        measured.as_ref(),
        &metrics,
        obs.current_replicas,
        counts.desired,
        &counts.why,
        &gate.admission,
    );
    Plan {
        replicas: counts.replicas,
        desired_replicas: counts.desired,
        admission: gate.admission,
        measured,
        forecast,
        pod_samples: state.pod_model.samples,
        decision,
        conditions,
        events,
        explanation,
    }
}

/// A MetricsUnavailable warning when fresh metrics go missing (once, at the transition).
fn note_metrics_transition(
    metrics: &Result<PoolMetrics, MetricsProblem>,
    state: &mut PlanState,
    events: &mut Vec<EventPlan>,
) {
    if state.metrics_were_available == Some(true)
        && let Err(problem) = metrics
    {
        events.push(EventPlan {
            kind: EventKind::Warning,
            reason: "MetricsUnavailable",
            note: format!("holding the last decision: {}", problem_words(problem)),
        });
    }
    state.metrics_were_available = Some(metrics.is_ok());
}

/// The replica stage's answer.
struct Counts {
    /// What the planner wants, within [min, ceiling].
    desired: i32,
    /// What the workload should run (the current count in Advisory mode).
    replicas: i32,
    basis: Basis,
    why: String,
    advisory: bool,
}

/// The replica stage: the requirement (reactive, raised by the forecast), stabilized, lifted
/// for scale-from-zero, bounded by the floor and the ceiling.
fn decide_replicas(
    spec: &InferencePoolSpec,
    obs: &Observation,
    measured: Option<&MeasuredPlan>,
    forecast: Option<&ForecastPlan>,
    state: &mut PlanState,
) -> Counts {
    let (now, current) = (obs.now, obs.current_replicas);
    let min = spec.replicas.min;
    let ceil = ceiling(spec).max(min);
    let (wanted, basis, why) = match (measured, spec.scaling.mode) {
        (_, ScalingMode::Manual) => {
            let manual = spec.replicas.manual.unwrap_or(current).clamp(min, ceil);
            let why = format!("manual mode holds {manual} replicas");
            (manual, Basis::Manual, why)
        }
        (Some(m), _) => {
            let (raw, why) = replicas::required(spec, m, current, obs.ready_replicas, ceil);
            let (raw, basis, why) = match forecast {
                Some(f) => ahead::raise(f, raw, current, why),
                None => (raw, Basis::Demand, why),
            };
            state.recommendations.record(now, raw);
            let falling = forecast.and_then(|f| f.falling);
            let down_ms = replicas::scale_down_window_ms(spec, falling.is_some());
            let recs = &state.recommendations;
            let stabilized = replicas::stabilize(spec, recs, now, current, raw, down_ms);
            let shortened = down_ms < replicas::scale_down_window_ms(spec, false);
            let why = match falling {
                Some(f) if shortened && stabilized < current => format!(
                    "{why}; scale-down window {} (not {}): the demand falls {:.0} steps/s a minute",
                    tidegate_api::Duration::from_millis(down_ms),
                    spec.scaling.scale_down_stabilization,
                    -f.per_minute,
                ),
                _ => why,
            };
            (stabilized, basis, why)
        }
        (None, _) => {
            // Fail static: hold the last decision (or the current count), only lifting it
            // to the floor, never lowering it.
            let hold = state.last_desired.unwrap_or(current).max(current);
            // The held count is this tick's recommendation, so that the scale-down window
            // restarts when metrics return instead of acting on a single fresh sample.
            state.recommendations.record(now, hold.clamp(min, ceil));
            let why = if state.last_desired.is_some() {
                "metrics unavailable: holding the last decision"
            } else {
                "no metrics yet"
            };
            (hold, Basis::NoMetrics, why.to_string())
        }
    };
    // Scale from zero: held requests are demand no engine can measure, and the first
    // replica is what serves them.
    let (wanted, basis, why) = if obs.held_requests > 0 && current == 0 && wanted < 1 {
        let why = format!(
            "{} request(s) held at the router while the pool has no engine: scaling from zero",
            obs.held_requests
        );
        (1, Basis::ScaleFromZero, why)
    } else {
        (wanted, basis, why)
    };
    let desired = wanted.clamp(min, ceil);
    // A count lifted to the floor (or cut to the ceiling) says so, not what it was lifted from:
    // a new pool's first replicas are replicas.min, not a held decision.
    let (basis, why) = if desired > wanted {
        (
            Basis::Floor,
            format!("raised to replicas.min {min} ({why})"),
        )
    } else if desired < wanted {
        (
            Basis::Ceiling,
            format!("capped at the ceiling {ceil} ({why})"),
        )
    } else {
        (basis, why)
    };
    let advisory = spec.scaling.mode == ScalingMode::Advisory;
    state.last_desired = Some(desired);
    Counts {
        desired,
        // Advisory never acts; it only keeps the declared floor (a pool with no pods
        // measures nothing).
        replicas: if advisory { current.max(min) } else { desired },
        basis,
        why,
        advisory,
    }
}

/// The decision (if the count changes), its event, and what the lead time learns from it.
fn record_decision(
    spec: &InferencePoolSpec,
    obs: &Observation,
    counts: &Counts,
    state: &mut PlanState,
    events: &mut Vec<EventPlan>,
) -> Option<Decision> {
    let (now, current) = (obs.now, obs.current_replicas);
    let decision = (counts.desired != current).then(|| Decision {
        from: current,
        to: counts.desired,
        basis: counts.basis,
        reason: counts.why.clone(),
        applied: !counts.advisory,
    });
    let ordered = decision
        .as_ref()
        .filter(|d| d.applied && d.to > d.from)
        .map(|d| d.to);
    ahead::observe_lead_time(spec, state, now, current, obs.ready_replicas, ordered);
    let d = decision.as_ref()?;
    if d.applied {
        state.last_scale_time = Some(now);
        events.push(EventPlan {
            kind: EventKind::Normal,
            reason: if d.to > d.from {
                "ScaledUp"
            } else {
                "ScaledDown"
            },
            note: format!("{} → {} replicas: {}", d.from, d.to, d.reason),
        });
    } else {
        events.push(EventPlan {
            kind: EventKind::Normal,
            reason: "ScalingRecommended",
            note: format!(
                "advisory: would scale {} → {} replicas: {}",
                d.from, d.to, d.reason
            ),
        });
    }
    decision
}

/// The admission stage's answer.
struct Gate {
    admission: AdmissionPlan,
    constraint: Constraint,
    /// Constrained and over the pause threshold this tick.
    exhausted: bool,
}

/// The admission stage: whether capacity is constrained (the ceiling, or replicas still
/// arriving), whether the pool is over its pause threshold, and the admission machine's step.
fn decide_admission(
    spec: &InferencePoolSpec,
    tiers: Option<&TierPolicySpec>,
    obs: &Observation,
    counts: &Counts,
    measured: Option<&MeasuredPlan>,
    state: &mut PlanState,
    events: &mut Vec<EventPlan>,
) -> Gate {
    let now = obs.now;
    let ceil = ceiling(spec).max(spec.replicas.min);
    let watch = &mut state.admission.capacity;
    let constraint = if admission::at_ceiling(spec, obs, counts.desired, ceil, watch, events) {
        Constraint::Ceiling
    } else if admission::capacity_arriving(spec, obs, counts.desired, watch) {
        Constraint::Arriving
    } else {
        Constraint::None
    };
    let pressure = measured.map(|m| admission::Pressure::of(spec, m));
    let over = pressure.as_ref().is_some_and(|p| p.over_pause(spec));
    let exhausted = constraint != Constraint::None && over;
    if exhausted {
        state.admission.capacity.exhausted_since.get_or_insert(now);
    } else if measured.is_some() {
        state.admission.capacity.exhausted_since = None;
    }
    let may_act = !counts.advisory && spec.admission.enabled;
    let before = state.admission.state();
    let admission = state
        .admission
        .step(spec, tiers, now, constraint, pressure.as_ref(), may_act);
    if admission.state != before {
        events.push(admission::transition_event(&admission));
    } else if counts.advisory && exhausted {
        // Say what Auto mode would have done.
        events.push(EventPlan {
            kind: EventKind::Normal,
            reason: "PauseRecommended",
            note: format!(
                "advisory: over the SLO {}; Auto mode would pause new tenants",
                match constraint {
                    Constraint::Arriving => "while ordered replicas are starting",
                    _ => "at the ceiling",
                }
            ),
        });
    }
    Gate {
        admission,
        constraint,
        exhausted,
    }
}

/// Metrics that are present and fresh enough to act on.
fn fresh_metrics(
    spec: &InferencePoolSpec,
    obs: &Observation,
) -> Result<PoolMetrics, MetricsProblem> {
    let m = obs.metrics.clone()?;
    let stale_after = spec.scaling.metrics.stale_after.as_std().as_millis() as u64;
    if obs.now.saturating_sub(m.sampled_at) > stale_after {
        return Err(MetricsProblem::NoData(format!(
            "newest sample is {}s old (staleAfter {})",
            obs.now.saturating_sub(m.sampled_at) / 1000,
            spec.scaling.metrics.stale_after
        )));
    }
    if m.pods_reporting == 0 && obs.ready_replicas > 0 {
        return Err(MetricsProblem::NoData(
            "no ready engine pod reported metrics".to_string(),
        ));
    }
    Ok(m)
}

fn problem_words(p: &MetricsProblem) -> String {
    match p {
        MetricsProblem::Unreachable(why) => format!("metrics source unreachable: {why}"),
        MetricsProblem::NoData(why) => format!("no fresh data: {why}"),
    }
}

fn measure(
    spec: &InferencePoolSpec,
    m: &PoolMetrics,
    model: &PodModel,
    obs: &Observation,
) -> MeasuredPlan {
    let r = spec.slo.tokens_per_second_per_session;
    let at = model.at_slo(spec);
    let serving = obs.ready_replicas.max(m.pods_reporting).max(1);
    let mut demand = Demand::of(m, at.line, serving);
    demand.waiting += obs.router_queued as f64;
    let sessions = demand.sessions(true);
    MeasuredPlan {
        decode_tokens_per_second: m.decode_tokens_per_second,
        demand_tokens_per_second: sessions * r,
        utilization: sessions / (f64::from(serving) * at.sessions),
        queue_wait_p99: Duration::from_secs_f64(m.queue_wait_p99_seconds.unwrap_or(0.0)),
        kv_utilization: m.kv_utilization,
        evictions_per_second: m.evictions_per_second,
        observed_at: m.sampled_at,
        pod: at,
        demand,
    }
}

#[allow(clippy::too_many_arguments)]
fn explain(
    spec: &InferencePoolSpec,
    obs: &Observation,
    measured: Option<&MeasuredPlan>,
    metrics: &Result<PoolMetrics, MetricsProblem>,
    current: i32,
    desired: i32,
    why: &str,
    admission: &AdmissionPlan,
) -> String {
    let m = match (measured, metrics) {
        (Some(m), _) => format!(
            "demand {:.0} tok/s, capacity {:.0} tok/s/replica, util {:.2}, queue p99 {} (target {})",
            m.demand_tokens_per_second,
            m.pod.capacity_tokens_per_second,
            m.utilization,
            m.queue_wait_p99,
            spec.slo.queue_wait_p99
        ),
        (None, Err(p)) => problem_words(p),
        (None, Ok(_)) => String::new(),
    };
    format!(
        "replicas {current}→{desired} (ready {}): {why}; {m}; admission {}{}",
        obs.ready_replicas,
        admission.state.as_str(),
        if admission.paused_tiers.is_empty() {
            String::new()
        } else {
            format!(" (paused tiers: {})", admission.paused_tiers.join(","))
        }
    )
}

/// Condition types the planner owns, for callers that merge them into status.
pub const PLANNED_CONDITIONS: &[&str] = &[
    types::READY,
    types::METRICS_AVAILABLE,
    types::SCALING,
    types::CAPACITY_EXHAUSTED,
    types::RESOURCES_USED,
];

/// Reason used when the referenced TierPolicy does not exist.
pub const TIER_POLICY_MISSING: &str = reasons::TIER_POLICY_NOT_FOUND;
