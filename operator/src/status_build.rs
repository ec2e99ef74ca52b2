//! Builds an InferencePool's status from one tick's plan (pure, no I/O).
//!
//! Invariants: measured figures are rounded so that status patches do not churn; at most
//! MAX_RECENT_DECISIONS decisions are kept, newest first; lastTransitionTime of a condition
//! moves only when its status changes.

use tidegate_api::status::{
    AdmissionStatus, ForecastStatus, InferencePoolStatus, MAX_RECENT_DECISIONS, Measured,
    PodModelStatus, ScalingDecision,
};

use tidegate_api::conditions::{reasons, status as cstatus, types};

use crate::plan::{ConditionPlan, ForecastPlan, Millis, Plan, Standing, merge_conditions, to_time};
use crate::ports::WorkloadState;

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The status after this tick.
pub fn build(
    previous: Option<&InferencePoolStatus>,
    plan: &Plan,
    workload: &WorkloadState,
    generation: Option<i64>,
    now: Millis,
    last_scale_time: Option<Millis>,
) -> InferencePoolStatus {
    let prev = previous.cloned().unwrap_or_default();
    let measured = match &plan.measured {
        Some(m) => Some(Measured {
            decode_tokens_per_second: round(m.decode_tokens_per_second, 1),
            per_replica_capacity: round(m.pod.capacity_tokens_per_second, 1),
            demand_tokens_per_second: round(m.demand_tokens_per_second, 1),
            utilization: round(m.utilization, 2),
            queue_wait_p99: m.queue_wait_p99.to_string(),
            kv_utilization: round(m.kv_utilization, 2),
            evictions_per_second: round(m.evictions_per_second, 2),
            observed_at: Some(to_time(m.observed_at)),
        }),
        // Keep the last measurements on display while metrics are missing; the
        // MetricsAvailable condition says they are old.
        None => prev.measured.clone(),
    };
    let pod_model = match &plan.measured {
        Some(m) => Some(PodModelStatus {
            // Microsecond resolution: finer churns status, coarser loses a small B.
            itl_base_seconds: round(m.pod.line.base_seconds, 6),
            itl_per_sequence_seconds: round(m.pod.line.per_sequence_seconds, 7),
            sessions_at_slo: round(m.pod.sessions, 1),
            samples: plan.pod_samples,
        }),
        None => prev.pod_model.clone(),
    };
    let forecast = match &plan.forecast {
        Some(f) => Some(forecast_status(f)),
        None => prev.forecast.clone(),
    };
    let admission = AdmissionStatus {
        state: plan.admission.state,
        since: plan.admission.since.map(to_time),
        reason: plan.admission.reason.clone(),
        paused_tiers: plan.admission.paused_tiers.clone(),
    };
    let mut recent = prev.recent_decisions.clone();
    if let Some(d) = &plan.decision {
        recent.insert(
            0,
            ScalingDecision {
                time: to_time(now),
                from: d.from,
                to: d.to,
                basis: Some(d.basis.name().to_string()),
                reason: d.reason.clone(),
                applied: d.applied,
            },
        );
        recent.truncate(MAX_RECENT_DECISIONS);
    }
    InferencePoolStatus {
        observed_generation: generation,
        replicas: workload.replicas.unwrap_or(0),
        ready_replicas: workload.ready_replicas,
        desired_replicas: plan.desired_replicas,
        selector: Some(workload.selector.clone()).filter(|s| !s.is_empty()),
        measured,
        pod_model,
        forecast,
        admission: Some(admission),
        last_scale_time: last_scale_time.map(to_time).or(prev.last_scale_time),
        recent_decisions: recent,
        conditions: merge_conditions(
            &prev.conditions,
            &with_model_problem(&plan.conditions, workload),
            now,
            generation,
        ),
    }
}

/// The planned conditions, with Ready=False naming the cause when the pool is not ready
/// because its model cannot be fetched (the fetch step's own words: URI and cause), so the
/// status says why instead of only "0/1 replicas ready".
fn with_model_problem(planned: &[ConditionPlan], workload: &WorkloadState) -> Vec<ConditionPlan> {
    let mut out = planned.to_vec();
    let Some(problem) = &workload.model_problem else {
        return out;
    };
    for c in out.iter_mut() {
        if c.type_ == types::READY && c.status == cstatus::FALSE {
            c.reason = reasons::MODEL_FETCH_FAILED;
            c.message = format!("{}; {problem}", c.message);
        }
    }
    out
}

/// The forecast in status units: the error to two decimals (finer churns status).
fn forecast_status(f: &ForecastPlan) -> ForecastStatus {
    let lead = tidegate_api::Duration::from_millis(f.lead_time_ms.div_ceil(1000) * 1000);
    ForecastStatus {
        in_use: f.standing == Standing::InUse,
        reason: match (f.standing, f.trend) {
            (Standing::Off, _) => format!("{} (with Auto: {})", f.standing, f.with_auto),
            // No figures here: a reason that changed every tick would rewrite the status.
            (_, Some(_)) => format!(
                "{}; the demand is rising: ordering one lead time ahead of its trend",
                f.standing
            ),
            _ => f.standing.to_string(),
        },
        next_hour_peak_replicas: f.next_hour_peak_replicas,
        lead_time: lead.to_string(),
        lead_time_measured: f.lead_time_measured,
        recent_error: f.recent_error.map(|e| round(e, 2)),
        rising_trend_replicas: f.trend_replicas,
        history: f.history.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: &'static str) -> ConditionPlan {
        ConditionPlan {
            type_: types::READY,
            status,
            reason: reasons::REPLICAS_NOT_READY,
            message: "0/1 replicas ready".into(),
        }
    }

    #[test]
    fn a_failing_model_fetch_is_the_reason_a_pool_is_not_ready() {
        let workload = WorkloadState {
            model_problem: Some("pod p-0: model fetch failed: s3://m/x: not found".into()),
            ..WorkloadState::default()
        };
        let out = with_model_problem(&[ready(cstatus::FALSE)], &workload);
        assert_eq!(out[0].reason, reasons::MODEL_FETCH_FAILED);
        assert_eq!(
            out[0].message,
            "0/1 replicas ready; pod p-0: model fetch failed: s3://m/x: not found"
        );
        let fine = with_model_problem(&[ready(cstatus::TRUE)], &workload);
        assert_eq!(
            fine[0].reason,
            reasons::REPLICAS_NOT_READY,
            "a ready pool is ready"
        );
        let none = with_model_problem(&[ready(cstatus::FALSE)], &WorkloadState::default());
        assert_eq!(none[0].reason, reasons::REPLICAS_NOT_READY);
    }
}
