//! Status of InferencePool and TierPolicy, written only by the operator (status subresource).
//!
//! Conditions use the standard metav1 Condition shape. Measured figures are rounded when
//! written so that `kubectl get` stays readable and status patches do not churn.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::engine_admin::AdmissionState;

/// Largest number of recent scaling decisions kept in status.
pub const MAX_RECENT_DECISIONS: usize = 10;

/// Observed state of an InferencePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Engine pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Engine pods ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replicas the operator decided on (in Advisory mode: would decide on).
    #[serde(default)]
    pub desired_replicas: i32,
    /// Label selector of the engine pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// What the operator measured at its last decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
    /// The learned pod model: step time against batch occupancy, and what it implies at the
    /// SLO. Restored by a restarted operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_model: Option<PodModelStatus>,
    /// The demand forecast: whether the planner uses it, and what it sees coming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<ForecastStatus>,
    /// Admission of new tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionStatus>,
    /// When the replica count last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// The most recent scaling decisions, newest first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub recent_decisions: Vec<ScalingDecision>,
    /// Ready, MetricsAvailable, Scaling, CapacityExhausted, ResourcesUsed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Measurements behind the last decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// Decode tokens per second produced by the whole pool.
    pub decode_tokens_per_second: f64,
    /// Demand one replica serves at the SLO, tokens per second: podModel.sessionsAtSLO ×
    /// slo.tokensPerSecondPerSession.
    pub per_replica_capacity: f64,
    /// Demand in decode tokens per second: sessions (running, queued, and refused or piling
    /// up in the queues) × slo.tokensPerSecondPerSession.
    pub demand_tokens_per_second: f64,
    /// Demand ÷ (ready replicas × per-replica capacity).
    pub utilization: f64,
    /// p99 queue wait, e.g. `350ms`.
    pub queue_wait_p99: String,
    /// Fraction of KV blocks in use, across the pool.
    pub kv_utilization: f64,
    /// KV evictions per second, across the pool.
    pub evictions_per_second: f64,
    /// When the measurements were taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,
}

/// The learned pod model: ITL(k) = itlBaseSeconds + itlPerSequenceSeconds × k.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodModelStatus {
    /// A: the step time of an empty batch, seconds.
    pub itl_base_seconds: f64,
    /// B: what each running sequence adds to the step time, seconds.
    pub itl_per_sequence_seconds: f64,
    /// k*: sessions a replica holds while each still gets slo.tokensPerSecondPerSession
    /// (capped by engine.maxBatchSize).
    #[serde(rename = "sessionsAtSLO")]
    pub sessions_at_slo: f64,
    /// Points (one per engine per read) learned from since the operator started.
    #[serde(default)]
    pub samples: u64,
}

/// The demand forecast (see `scaling.forecast`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForecastStatus {
    /// Whether the planner scales ahead of it now.
    pub in_use: bool,
    /// Why it is or is not in use, in words.
    #[serde(default)]
    pub reason: String,
    /// Replicas the forecast's peak over the next hour needs at the target occupancy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hour_peak_replicas: Option<i32>,
    /// How far ahead it orders: the slowest recent start-up of this pool's replicas, bounded
    /// by engine.startupGracePeriod (half of it before any start-up was measured).
    pub lead_time: String,
    /// Whether the lead time was measured on this pool.
    #[serde(default)]
    pub lead_time_measured: bool,
    /// Recent relative error of its predictions one lead time ahead (0.1 = 10%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_error: Option<f64>,
    /// Replicas the demand's rising trend over the last minutes needs one lead time ahead,
    /// while it rises (in Auto, when the profile is not in use: its first day, or a day that
    /// does not repeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rising_trend_replicas: Option<i32>,
    /// The learned daily profile, the planner's memory across restarts: format, bucket
    /// width, then one value (slot-steps per second) per bucket of the UTC day, empty where
    /// no day has been seen.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub history: String,
}

/// Admission of new tenants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionStatus {
    /// Open, or PausedNewTenants.
    pub state: AdmissionState,
    /// When the state last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
    /// Tiers whose new tenants are refused, lowest priority first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paused_tiers: Vec<String>,
}

/// One scaling decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingDecision {
    /// When it was decided.
    pub time: Time,
    /// Replicas before.
    pub from: i32,
    /// Replicas after (or recommended, in Advisory mode).
    pub to: i32,
    /// What the new count rests on: Demand, Forecast, ForecastHold, Trend, Manual,
    /// NoMetrics, ScaleFromZero, Floor or Ceiling (absent in decisions an older operator
    /// wrote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub basis: Option<String>,
    /// Why, in words.
    pub reason: String,
    /// Whether it was applied (false in Advisory mode).
    #[serde(default)]
    pub applied: bool,
}

/// Observed state of a TierPolicy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierPolicyStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of tiers.
    #[serde(default)]
    pub tier_count: i32,
    /// InferencePools that reference this policy.
    #[serde(default)]
    pub pools: i32,
    /// Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
