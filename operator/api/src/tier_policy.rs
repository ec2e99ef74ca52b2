//! `TierPolicy` (tidegate.dev/v1alpha1): service levels shared by pools, and how a request is
//! mapped to a tenant and a tier.
//!
//! The spec is plain data the engine also reads (the operator pushes it to every engine),
//! so it builds without the `kube` feature. Invariants the API server enforces: tier names
//! are unique DNS labels, and `defaultTier` names one of them.

// The kube derive takes one `printcolumn(...)`/`shortname` per column or name, which clippy
// mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;

/// Service tiers, and how requests are mapped to tenants and tiers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "tidegate.dev",
        version = "v1alpha1",
        kind = "TierPolicy",
        plural = "tierpolicies",
        singular = "tierpolicy",
        shortname = "tgtier",
        shortname = "tgtiers",
        category = "tidegate",
        namespaced,
        status = "crate::status::TierPolicyStatus",
        doc = "Service tiers (priority, queue-wait target, output and rate limits, KV retention, whether new tenants may be paused) and how requests map to tenants and tiers. Shared by InferencePools through tierPolicyRef.",
        printcolumn(
            name = "Tiers",
            type_ = "integer",
            json_path = ".status.tierCount",
            description = "Number of tiers"
        ),
        printcolumn(
            name = "Default",
            type_ = "string",
            json_path = ".spec.defaultTier",
            description = "Tier of unidentified requests"
        ),
        printcolumn(
            name = "Ready",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Ready\")].status"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "self.tiers.exists(t, t.name == self.defaultTier)", "message": "defaultTier must name one of the tiers" }
]))]
pub struct TierPolicySpec {
    /// The tiers, in any order; priority decides who goes first.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        { "rule": "self.all(t, self.exists_one(u, u.name == t.name))", "message": "tier names must be unique" }
    ]))]
    pub tiers: Vec<Tier>,
    /// Tier of a request whose tenant is not identified, or is identified without a tier.
    #[schemars(length(min = 1, max = 63))]
    pub default_tier: String,
    /// How a request is mapped to a tenant and a tier.
    #[serde(default)]
    pub tenancy: Tenancy,
}

/// One service tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tier {
    /// Tier name (a DNS label), e.g. `enterprise`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Scheduling priority: higher is served first and preempted last.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub priority: i32,
    /// Target for this tier's queue wait; a request that would wait longer is refused with 503.
    #[serde(default = "default_queue_wait_target")]
    #[schemars(schema_with = "crate::duration::positive_schema")]
    pub queue_wait_target: Duration,
    /// Output tokens a request of this tier may ask for; larger max_tokens are clamped.
    #[serde(default = "default_max_output_tokens")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_output_tokens: i32,
    /// Per-tenant rate limits; absent means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimits>,
    /// What happens to an idle session's KV cache.
    #[serde(default)]
    pub kv_retention: KvRetention,
    /// Whether new tenants of this tier may be paused.
    #[serde(default)]
    pub admission: TierAdmission,
}

fn default_queue_wait_target() -> Duration {
    Duration::from_secs(2)
}
fn default_max_output_tokens() -> i32 {
    4096
}

/// Per-tenant rate limits. A request over a limit gets 429 with Retry-After.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimits {
    /// Requests per minute per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000000))]
    pub requests_per_minute: Option<i64>,
    /// Prompt plus output tokens per minute per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000000000i64))]
    pub tokens_per_minute: Option<i64>,
}

/// KV retention of idle sessions of a tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvRetention {
    /// How long an idle session keeps its KV blocks before onPressure's action applies anyway.
    #[serde(default = "default_idle_ttl")]
    #[serde(rename = "idleTTL")]
    pub idle_ttl: Duration,
    /// What to do with this tier's idle KV when blocks run short or the TTL expires.
    #[serde(default)]
    pub on_pressure: PressureAction,
}

fn default_idle_ttl() -> Duration {
    Duration::from_secs(600)
}

impl Default for KvRetention {
    fn default() -> Self {
        KvRetention {
            idle_ttl: default_idle_ttl(),
            on_pressure: PressureAction::default(),
        }
    }
}

/// Action on an idle session's KV blocks under pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PressureAction {
    /// Keep the blocks on the accelerator as long as any other tier can be evicted instead.
    Retain,
    /// Move the blocks to host RAM, then to disk; restore them when the session returns.
    #[default]
    Offload,
    /// Free the blocks; recompute by prefill when the session returns.
    Drop,
}

/// Admission behaviour of a tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierAdmission {
    /// Whether new tenants of this tier are paused when the pool is at its ceiling. Existing
    /// tenants are never paused.
    #[serde(default = "default_pausable")]
    pub pausable: bool,
}

fn default_pausable() -> bool {
    true
}

impl Default for TierAdmission {
    fn default() -> Self {
        TierAdmission {
            pausable: default_pausable(),
        }
    }
}

/// How a request is mapped to a tenant and a tier.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tenancy {
    /// API keys (Authorization: Bearer) mapped to tenants and tiers, read from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<ApiKeySource>,
    /// Tenant and tier taken from headers set by a trusted gateway in front of the engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_headers: Option<GatewayHeaders>,
}

/// A Secret holding API keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeySource {
    /// Name of a Secret in the policy's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Key in the Secret whose value is a YAML list of `{tenant, tier, apiKey}` entries.
    #[serde(default = "default_secret_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_secret_key() -> String {
    "tenants.yaml".to_string()
}

/// Headers a trusted gateway sets. Only enable behind a gateway that strips them from clients.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayHeaders {
    /// Header carrying the tenant id.
    #[serde(default = "default_tenant_header")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    pub tenant_header: String,
    /// Header carrying the tier name; absent or unknown tiers fall back to defaultTier.
    #[serde(default = "default_tier_header")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    pub tier_header: String,
}

fn default_tenant_header() -> String {
    "x-tidegate-tenant".to_string()
}
fn default_tier_header() -> String {
    "x-tidegate-tier".to_string()
}

impl TierPolicySpec {
    /// The tier with this name.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    /// Tiers from lowest to highest priority: the order in which they are paused.
    pub fn pause_order(&self) -> Vec<&Tier> {
        let mut tiers: Vec<&Tier> = self.tiers.iter().collect();
        tiers.sort_by(|a, b| {
            a.priority
                .cmp(&b.priority)
                .then_with(|| a.name.cmp(&b.name))
        });
        tiers
    }

    /// The policy used when a pool has no tierPolicyRef: one tier, never paused.
    pub fn single_default() -> Self {
        TierPolicySpec {
            tiers: vec![Tier {
                name: "default".to_string(),
                priority: 0,
                queue_wait_target: default_queue_wait_target(),
                max_output_tokens: default_max_output_tokens(),
                rate_limits: None,
                kv_retention: KvRetention::default(),
                admission: TierAdmission { pausable: false },
            }],
            default_tier: "default".to_string(),
            tenancy: Tenancy::default(),
        }
    }
}
