//! The engine admin API contract, shared by the engine (server side) and the operator
//! (client side). Plain serde types, no Kubernetes dependency.
//!
//! Routes (all require `Authorization: Bearer <admin token>`; without it: 401):
//! - `PUT  /admin/v1/policy`            body [`EnginePolicy`] → 204
//! - `GET  /admin/v1/tenants?since=MS`  → [`AdmittedTenants`] (first admitted at or after MS;
//!   the pool's routers answer it too, with the tenants they accepted: `router.rs`)
//! - `POST /admin/v1/drain`             body [`DrainRequest`] → 202 [`DrainStatus`]
//! - `GET  /admin/v1/drain`             → [`DrainStatus`]
//!
//! Invariants: tenant ids never appear in metrics labels; API keys travel only as SHA-256
//! hex digests; the registry is pushed whole so every replica makes the same decision.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tier_policy::TierPolicySpec;

pub const POLICY_PATH: &str = "/admin/v1/policy";
pub const TENANTS_PATH: &str = "/admin/v1/tenants";
pub const DRAIN_PATH: &str = "/admin/v1/drain";

/// Admission of new tenants, pool-wide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AdmissionState {
    /// Every tenant is admitted (subject to rate limits and queue bounds).
    #[default]
    Open,
    /// New tenants of the paused tiers are refused with 503; existing tenants are served.
    PausedNewTenants,
}

impl AdmissionState {
    pub fn as_str(&self) -> &'static str {
        match self {
            AdmissionState::Open => "Open",
            AdmissionState::PausedNewTenants => "PausedNewTenants",
        }
    }
}

/// What the operator pushes to every engine: the tier policy, admission, and registry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnginePolicy {
    /// The pool's tier policy; None means a single never-paused default tier.
    #[serde(default)]
    pub tier_policy: Option<TierPolicySpec>,
    /// API keys mapped to tenants and tiers (digests only).
    #[serde(default)]
    pub api_keys: Vec<ApiKeyEntry>,
    /// Pool-wide admission state.
    #[serde(default)]
    pub admission: AdmissionPush,
    /// Tenants admitted by this pool within the memory window: they are existing tenants.
    #[serde(default)]
    pub admitted_tenants: Vec<String>,
}

/// One API key mapping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyEntry {
    /// Lower-case hex SHA-256 of the key.
    pub key_sha256: String,
    pub tenant: String,
    pub tier: String,
}

/// Admission as pushed to engines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPush {
    pub state: AdmissionState,
    /// Tiers whose new tenants are refused while paused.
    #[serde(default)]
    pub paused_tiers: Vec<String>,
    /// Retry-After (seconds) sent to paused new tenants.
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: u64,
    /// Why, in words (echoed in the refusal message).
    #[serde(default)]
    pub reason: String,
}

fn default_retry_after() -> u64 {
    30
}

/// Tenants an engine admitted (or a router accepted) for the first time since a point in time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedTenants {
    /// Engine clock (Unix milliseconds) when the answer was made; pass it as `since` next time.
    pub now_ms: u64,
    pub tenants: Vec<AdmittedTenant>,
}

/// One admitted tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedTenant {
    pub tenant: String,
    pub tier: String,
    /// Unix milliseconds of the first admission seen by this engine.
    pub first_admitted_ms: u64,
}

/// Ask an engine to drain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainRequest {
    /// Seconds in-flight requests get to finish; the engine's default when absent.
    #[serde(default)]
    pub grace_seconds: Option<u64>,
}

/// Drain progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Serving, Draining or Drained.
    pub state: DrainState,
    /// Requests still in flight.
    pub in_flight: u64,
}

/// Drain states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainState {
    Serving,
    Draining,
    Drained,
}
