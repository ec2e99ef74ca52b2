//! Conditions of an InferencePool, from one tick's plan, and their merge into status.
//!
//! Invariant: a condition's lastTransitionTime changes only when its status changes; its
//! reason and message may change on any tick.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tidegate_api::conditions::{reasons, status, types};
use tidegate_api::engine_launch::{ENGINE_GPUS_PER_POD, idle_gpus_per_pod};
use tidegate_api::{AdmissionState, InferencePoolSpec, ScalingMode};

use super::{
    AdmissionPlan, Constraint, MeasuredPlan, MetricsProblem, Millis, Observation, PoolMetrics,
};

/// A condition as planned, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionPlan {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

pub(super) struct Inputs<'a> {
    pub spec: &'a InferencePoolSpec,
    pub obs: &'a Observation,
    pub metrics: &'a Result<PoolMetrics, MetricsProblem>,
    pub measured: Option<&'a MeasuredPlan>,
    pub desired: i32,
    pub current: i32,
    pub advisory: bool,
    pub constraint: Constraint,
    pub exhausted_since: Option<Millis>,
    pub ceiling_words: String,
    pub admission: &'a AdmissionPlan,
}

pub(super) fn build(i: &Inputs<'_>) -> Vec<ConditionPlan> {
    vec![
        ready(i),
        metrics_available(i),
        scaling(i),
        capacity_exhausted(i),
        resources_used(i.spec),
    ]
}

fn ready(i: &Inputs<'_>) -> ConditionPlan {
    let ready = i.obs.ready_replicas;
    let want = i.current.max(i.spec.replicas.min);
    let (st, reason, message) = if want == 0 {
        (
            status::TRUE,
            reasons::NO_REPLICAS,
            "scaled to zero; the first request waits for a replica".to_string(),
        )
    } else if ready >= want {
        (
            status::TRUE,
            reasons::ALL_REPLICAS_READY,
            format!("{ready}/{want} replicas ready"),
        )
    } else {
        (
            status::FALSE,
            reasons::REPLICAS_NOT_READY,
            format!("{ready}/{want} replicas ready"),
        )
    };
    ConditionPlan {
        type_: types::READY,
        status: st,
        reason,
        message,
    }
}

fn metrics_available(i: &Inputs<'_>) -> ConditionPlan {
    let (st, reason, message) = match i.metrics {
        Ok(m) => (
            status::TRUE,
            reasons::METRICS_FRESH,
            format!("{} pod(s) reporting", m.pods_reporting),
        ),
        Err(MetricsProblem::Unreachable(why)) => (
            status::FALSE,
            reasons::METRICS_UNREACHABLE,
            format!(
                "metrics source unreachable ({why}); holding the last decision, no scale-down, no pause"
            ),
        ),
        Err(MetricsProblem::NoData(why)) if why.contains("old") => (
            status::FALSE,
            reasons::METRICS_STALE,
            format!("{why}; holding the last decision, no scale-down, no pause"),
        ),
        Err(MetricsProblem::NoData(why)) => (
            status::FALSE,
            reasons::NO_DATA,
            format!("{why}; holding the last decision, no scale-down, no pause"),
        ),
    };
    ConditionPlan {
        type_: types::METRICS_AVAILABLE,
        status: st,
        reason,
        message,
    }
}

fn scaling(i: &Inputs<'_>) -> ConditionPlan {
    let (cur, des) = (i.current, i.desired);
    let (st, reason, message) = if i.spec.scaling.mode == ScalingMode::Manual {
        (
            status::FALSE,
            reasons::MANUAL,
            format!("manual mode: holding {des} replicas"),
        )
    } else if i.advisory {
        let msg = if des == cur {
            format!("advisory mode: {cur} replicas is right")
        } else {
            format!("advisory mode: would scale {cur} → {des}")
        };
        (status::FALSE, reasons::ADVISORY, msg)
    } else if i.measured.is_none() {
        (
            status::FALSE,
            reasons::HOLDING_LAST_DECISION,
            format!("metrics unavailable: holding {des} replicas"),
        )
    } else if des > cur {
        (
            status::TRUE,
            reasons::SCALING_UP,
            format!("scaling up {cur} → {des}"),
        )
    } else if des < cur {
        (
            status::TRUE,
            reasons::SCALING_DOWN,
            format!("scaling down {cur} → {des}"),
        )
    } else if i.obs.ready_replicas < cur {
        (
            status::TRUE,
            reasons::SCALING_UP,
            format!("waiting for {}/{cur} replicas", i.obs.ready_replicas),
        )
    } else {
        (
            status::FALSE,
            reasons::STABLE,
            format!("{cur} replicas match demand"),
        )
    };
    ConditionPlan {
        type_: types::SCALING,
        status: st,
        reason,
        message,
    }
}

fn capacity_exhausted(i: &Inputs<'_>) -> ConditionPlan {
    let (st, reason, message) = match (i.exhausted_since, i.measured) {
        (Some(since), Some(m)) => {
            let (reason, place) = match i.constraint {
                Constraint::Arriving => (
                    reasons::SCALING_UP_OVER_SLO,
                    format!(
                        "short of ready replicas ({} of {} ready, the rest starting)",
                        i.obs.ready_replicas, i.desired
                    ),
                ),
                _ => (
                    reasons::AT_CEILING_OVER_SLO,
                    format!("at {}", i.ceiling_words),
                ),
            };
            let paused = match i.admission.state {
                AdmissionState::PausedNewTenants => format!(
                    "; new tenants of tier(s) {} are paused",
                    i.admission.paused_tiers.join(", ")
                ),
                AdmissionState::Open => "; admission still open".to_string(),
            };
            (
                status::TRUE,
                reason,
                format!(
                    "{place} since {}: utilization {:.2}, queue p99 {} (target {}){paused}",
                    rfc3339(since),
                    m.utilization,
                    m.queue_wait_p99,
                    i.spec.slo.queue_wait_p99
                ),
            )
        }
        _ if i.constraint == Constraint::Ceiling => (
            status::FALSE,
            reasons::AT_CEILING_WITHIN_SLO,
            format!("at {} and within the SLO", i.ceiling_words),
        ),
        _ => (
            status::FALSE,
            reasons::HAS_HEADROOM,
            format!("below {}", i.ceiling_words),
        ),
    };
    ConditionPlan {
        type_: types::CAPACITY_EXHAUSTED,
        status: st,
        reason,
        message,
    }
}

/// ResourcesUsed: False when a pod requests GPUs its engine does not serve on, so a pool
/// that asks for 4 per pod says it wastes 3 instead of wasting them silently.
fn resources_used(spec: &InferencePoolSpec) -> ConditionPlan {
    let gpus = spec.engine.resources.gpus;
    let idle = idle_gpus_per_pod(gpus);
    let (st, reason, message) = if idle > 0 {
        let pool = idle * spec.replicas.max;
        (
            status::FALSE,
            reasons::GPUS_IDLE,
            format!(
                "engine.resources.gpus is {gpus}, but the engine serves on {ENGINE_GPUS_PER_POD} GPU per pod (no tensor parallelism): {idle} GPU(s) of every pod are requested and idle, up to {pool} at replicas.max {}; set engine.resources.gpus to {ENGINE_GPUS_PER_POD}",
                spec.replicas.max
            ),
        )
    } else if gpus == 0 {
        (
            status::TRUE,
            reasons::ALL_RESOURCES_USED,
            "no GPUs requested: the engine serves on the CPU".to_string(),
        )
    } else {
        (
            status::TRUE,
            reasons::ALL_RESOURCES_USED,
            format!("the engine serves on the pod's {gpus} GPU"),
        )
    };
    ConditionPlan {
        type_: types::RESOURCES_USED,
        status: st,
        reason,
        message,
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(ms: Millis) -> String {
    to_time(ms).0.to_string()
}

/// Milliseconds since the epoch as a Kubernetes Time.
pub fn to_time(ms: Millis) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Time(ts)
}

/// Merges planned conditions into the previous ones, keeping lastTransitionTime when a
/// condition's status did not change. Conditions the planner does not own are kept.
pub fn merge_conditions(
    previous: &[Condition],
    planned: &[ConditionPlan],
    now: Millis,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| !planned.iter().any(|p| p.type_ == c.type_))
        .cloned()
        .collect();
    for p in planned {
        let prev = previous.iter().find(|c| c.type_ == p.type_);
        let last_transition_time = match prev {
            Some(c) if c.status == p.status => c.last_transition_time.clone(),
            _ => to_time(now),
        };
        out.push(Condition {
            type_: p.type_.to_string(),
            status: p.status.to_string(),
            reason: p.reason.to_string(),
            message: p.message.clone(),
            last_transition_time,
            observed_generation: generation,
        });
    }
    out
}
