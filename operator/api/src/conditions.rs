//! Condition types and reasons, as constants so that the planner, the Argo CD health check,
//! alerts and docs all spell them the same way.

/// Condition types of an InferencePool.
pub mod types {
    /// All desired replicas are ready and serving.
    pub const READY: &str = "Ready";
    /// Fresh measurements were available at the last decision.
    pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
    /// The pool is changing its replica count.
    pub const SCALING: &str = "Scaling";
    /// The pool is at its ceiling (max replicas or GPU budget) and still over its SLO.
    pub const CAPACITY_EXHAUSTED: &str = "CapacityExhausted";
    /// Every resource a pod requests is one its engine uses (no GPUs requested and idle).
    pub const RESOURCES_USED: &str = "ResourcesUsed";
}

/// Condition reasons (CamelCase, as Kubernetes expects).
pub mod reasons {
    // Ready
    pub const ALL_REPLICAS_READY: &str = "AllReplicasReady";
    pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
    pub const NO_REPLICAS: &str = "NoReplicas";
    pub const TIER_POLICY_NOT_FOUND: &str = "TierPolicyNotFound";
    /// The referenced TierPolicy exists but the operator cannot read it.
    pub const TIER_POLICY_INVALID: &str = "TierPolicyInvalid";
    /// The pool's own spec cannot be read by the operator (the message names the field).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The model is an OCI image (`oci://`) and this cluster cannot mount image volumes (the
    /// message names the version or the gate, and the fix); nothing is applied.
    pub const MODEL_VOLUME_UNSUPPORTED: &str = "ModelVolumeUnsupported";
    /// The fetch step (`tidegate-engine fetch-model`, the init container) failed for a
    /// fetched model (`s3://`, `hf://`): the message names the URI and the cause (a missing
    /// object, refused credentials, a checksum that does not match).
    pub const MODEL_FETCH_FAILED: &str = "ModelFetchFailed";
    // MetricsAvailable
    pub const METRICS_FRESH: &str = "MetricsFresh";
    pub const METRICS_UNREACHABLE: &str = "MetricsUnreachable";
    pub const METRICS_STALE: &str = "MetricsStale";
    pub const NO_DATA: &str = "NoData";
    // Scaling
    pub const SCALING_UP: &str = "ScalingUp";
    pub const SCALING_DOWN: &str = "ScalingDown";
    pub const STABLE: &str = "Stable";
    pub const ADVISORY: &str = "Advisory";
    pub const MANUAL: &str = "Manual";
    pub const HOLDING_LAST_DECISION: &str = "HoldingLastDecision";
    // CapacityExhausted
    pub const AT_CEILING_OVER_SLO: &str = "AtCeilingOverSLO";
    /// Over the SLO while replicas it ordered are still starting (admission.pauseWhileScaling).
    pub const SCALING_UP_OVER_SLO: &str = "ScalingUpOverSLO";
    pub const HAS_HEADROOM: &str = "HasHeadroom";
    pub const AT_CEILING_WITHIN_SLO: &str = "AtCeilingWithinSLO";
    // ResourcesUsed
    pub const ALL_RESOURCES_USED: &str = "AllResourcesUsed";
    /// A pod requests more GPUs than the engine serves on (the message says how many idle).
    pub const GPUS_IDLE: &str = "GPUsIdle";
    // TierPolicy Ready
    pub const ACCEPTED: &str = "Accepted";
    pub const INVALID: &str = "Invalid";
}

/// Condition status values.
pub mod status {
    pub const TRUE: &str = "True";
    pub const FALSE: &str = "False";
    pub const UNKNOWN: &str = "Unknown";
}
