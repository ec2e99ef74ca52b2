//! Tenants and tiers: the pushed policy, compiled for lookups, and the mapping of a request
//! to `(tenant, tier)`.
//!
//! Invariants: the policy is replaced whole (readers see the old or the new one, never a mix);
//! API keys are compared only as SHA-256 hex digests; a request is mapped, in order, from
//! trusted gateway headers (only when the policy enables them), then from its Bearer key,
//! else to tenant `anonymous` of the default tier. A Bearer key that the policy does not
//! know is refused (401) when the policy lists keys — a wrong key is an error, not anonymity.

pub mod gate;
pub mod rate_limit;
pub mod registry;

pub use gate::new_tenant_gate;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use tidegate_api::engine_admin::{AdmissionState, EnginePolicy};
use tidegate_api::router;
use tidegate_api::{Tier, TierPolicySpec};

/// Tenant of requests that carry no identity.
pub const ANONYMOUS: &str = "anonymous";

/// The pushed policy, ready for per-request lookups.
#[derive(Debug)]
pub struct CompiledPolicy {
    pub spec: TierPolicySpec,
    keys: HashMap<String, (String, String)>,
    admitted: HashSet<String>,
    paused_tiers: HashSet<String>,
    pub retry_after: Duration,
    pub pause_reason: String,
}

/// Who sent a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    pub tenant: String,
    pub tier: Tier,
}

/// Why a request could not be mapped to a tenant.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("invalid API key")]
    UnknownKey,
    #[error("malformed Authorization header")]
    MalformedAuthorization,
}

impl IdentityError {
    pub fn metric_label(&self) -> &'static str {
        "unauthorized"
    }
}

/// Why a pushed policy was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("defaultTier {0:?} names no tier")]
    UnknownDefaultTier(String),
    #[error("API key entry for tenant {tenant:?} names unknown tier {tier:?}")]
    UnknownKeyTier { tenant: String, tier: String },
    #[error("keySha256 of tenant {0:?} is not 64 hex digits")]
    BadDigest(String),
    #[error("tier policy has no tiers")]
    NoTiers,
}

impl PolicyError {
    pub fn metric_label(&self) -> &'static str {
        "bad_request"
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl CompiledPolicy {
    pub fn compile(policy: &EnginePolicy) -> Result<Self, PolicyError> {
        let spec = policy
            .tier_policy
            .clone()
            .unwrap_or_else(TierPolicySpec::single_default);
        if spec.tiers.is_empty() {
            return Err(PolicyError::NoTiers);
        }
        if spec.tier(&spec.default_tier).is_none() {
            return Err(PolicyError::UnknownDefaultTier(spec.default_tier.clone()));
        }
        let mut keys = HashMap::new();
        for entry in &policy.api_keys {
            let digest = entry.key_sha256.to_ascii_lowercase();
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(PolicyError::BadDigest(entry.tenant.clone()));
            }
            if spec.tier(&entry.tier).is_none() {
                return Err(PolicyError::UnknownKeyTier {
                    tenant: entry.tenant.clone(),
                    tier: entry.tier.clone(),
                });
            }
            keys.insert(digest, (entry.tenant.clone(), entry.tier.clone()));
        }
        let paused_tiers = match policy.admission.state {
            AdmissionState::Open => HashSet::new(),
            AdmissionState::PausedNewTenants => {
                policy.admission.paused_tiers.iter().cloned().collect()
            }
        };
        Ok(CompiledPolicy {
            spec,
            keys,
            admitted: policy.admitted_tenants.iter().cloned().collect(),
            paused_tiers,
            retry_after: Duration::from_secs(policy.admission.retry_after_seconds.max(1)),
            pause_reason: policy.admission.reason.clone(),
        })
    }

    fn default_tier(&self) -> Tier {
        self.spec
            .tier(&self.spec.default_tier)
            .or_else(|| self.spec.tiers.first())
            .cloned()
            .unwrap_or_else(|| TierPolicySpec::single_default().tiers.remove(0))
    }

    fn tier_or_default(&self, name: Option<&str>) -> Tier {
        name.and_then(|n| self.spec.tier(n))
            .cloned()
            .unwrap_or_else(|| self.default_tier())
    }

    /// Maps a request's headers to a tenant and tier.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Identity, IdentityError> {
        if let Some(gw) = &self.spec.tenancy.gateway_headers
            && let Some(tenant) = header_str(headers, &gw.tenant_header)
            && !tenant.is_empty()
        {
            let tier = self.tier_or_default(header_str(headers, &gw.tier_header));
            return Ok(Identity {
                tenant: tenant.to_string(),
                tier,
            });
        }
        if let Some(auth) = headers.get(axum::http::header::AUTHORIZATION) {
            let auth = auth
                .to_str()
                .map_err(|_| IdentityError::MalformedAuthorization)?;
            let key = auth
                .strip_prefix("Bearer ")
                .or_else(|| auth.strip_prefix("bearer "))
                .ok_or(IdentityError::MalformedAuthorization)?
                .trim();
            if let Some((tenant, tier)) = self.keys.get(&sha256_hex(key.as_bytes())) {
                return Ok(Identity {
                    tenant: tenant.clone(),
                    tier: self.tier_or_default(Some(tier)),
                });
            }
            if !self.keys.is_empty() {
                return Err(IdentityError::UnknownKey);
            }
        }
        Ok(Identity {
            tenant: ANONYMOUS.to_string(),
            tier: self.default_tier(),
        })
    }

    /// As [`CompiledPolicy::identify`], but a request that proves it comes from the pool's
    /// router (its router-token header equals `router_token`) is the router's tenant and
    /// tier: the router resolved the identity once, from the client's key or gateway headers.
    pub fn identify_routed(
        &self,
        headers: &HeaderMap,
        router_token: Option<&str>,
    ) -> Result<Identity, IdentityError> {
        if from_router(headers, router_token)
            && let Some(tenant) = header_str(headers, router::header::TENANT)
            && !tenant.is_empty()
        {
            return Ok(Identity {
                tenant: tenant.to_string(),
                tier: self.tier_or_default(header_str(headers, router::header::TIER)),
            });
        }
        self.identify(headers)
    }

    /// True when the new-tenant gate refuses this identity: its tier is paused, pausable,
    /// and the tenant is not in the pushed registry.
    pub fn refuses_new_tenant(&self, id: &Identity) -> bool {
        id.tier.admission.pausable
            && self.paused_tiers.contains(&id.tier.name)
            && !self.admitted.contains(&id.tenant)
    }

    /// Whether new tenants of this tier are currently refused (the admission_paused gauge).
    pub fn tier_paused(&self, tier: &Tier) -> bool {
        tier.admission.pausable && self.paused_tiers.contains(&tier.name)
    }
}

/// Whether a request proves it comes from the pool's router (its router-token header equals
/// `router_token`). Such a request already passed the pool's new-tenant gate at the router,
/// which may have accepted it into its queue before a pause reached this engine: the engine
/// does not gate it again.
pub fn from_router(headers: &HeaderMap, router_token: Option<&str>) -> bool {
    router_token.is_some_and(|token| {
        header_str(headers, router::header::ROUTER_TOKEN)
            .is_some_and(|t| same_secret(t.as_bytes(), token.as_bytes()))
    })
}

/// Compares two secrets without stopping at the first differing byte.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The current policy, replaced whole on every push. Read-mostly.
#[derive(Debug)]
pub struct PolicyStore {
    current: RwLock<Arc<CompiledPolicy>>,
}

impl PolicyStore {
    pub fn new(initial: CompiledPolicy) -> Self {
        PolicyStore {
            current: RwLock::new(Arc::new(initial)),
        }
    }

    pub fn get(&self) -> Arc<CompiledPolicy> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set(&self, policy: CompiledPolicy) {
        let policy = Arc::new(policy);
        match self.current.write() {
            Ok(mut g) => *g = policy,
            Err(poisoned) => *poisoned.into_inner() = policy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidegate_api::engine_admin::{AdmissionPush, ApiKeyEntry};

    fn policy() -> EnginePolicy {
        let yaml = r#"{
            "tiers": [
              {"name": "enterprise", "priority": 100, "admission": {"pausable": false}},
              {"name": "free", "priority": 1}
            ],
            "defaultTier": "free",
            "tenancy": {"gatewayHeaders": {}}
        }"#;
        EnginePolicy {
            tier_policy: Some(serde_json::from_str(yaml).unwrap()),
            api_keys: vec![ApiKeyEntry {
                key_sha256: sha256_hex(b"sk-acme"),
                tenant: "acme".into(),
                tier: "enterprise".into(),
            }],
            admission: AdmissionPush {
                state: AdmissionState::PausedNewTenants,
                paused_tiers: vec!["free".into(), "enterprise".into()],
                retry_after_seconds: 30,
                reason: "pool at ceiling".into(),
            },
            admitted_tenants: vec!["old".into()],
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn maps_keys_headers_and_anonymous() {
        let p = CompiledPolicy::compile(&policy()).unwrap();
        let id = p
            .identify(&headers(&[("authorization", "Bearer sk-acme")]))
            .unwrap();
        assert_eq!(
            (id.tenant.as_str(), id.tier.name.as_str()),
            ("acme", "enterprise")
        );
        assert_eq!(
            p.identify(&headers(&[("authorization", "Bearer nope")])),
            Err(IdentityError::UnknownKey)
        );
        let id = p
            .identify(&headers(&[
                ("x-tidegate-tenant", "gw"),
                ("x-tidegate-tier", "zzz"),
            ]))
            .unwrap();
        assert_eq!((id.tenant.as_str(), id.tier.name.as_str()), ("gw", "free"));
        let id = p.identify(&HeaderMap::new()).unwrap();
        assert_eq!(
            (id.tenant.as_str(), id.tier.name.as_str()),
            (ANONYMOUS, "free")
        );
    }

    #[test]
    fn router_headers_count_only_with_the_router_token() {
        let p = CompiledPolicy::compile(&policy()).unwrap();
        let routed = headers(&[
            (router::header::TENANT, "acme"),
            (router::header::TIER, "enterprise"),
            (router::header::ROUTER_TOKEN, "s3cret"),
        ]);
        let id = p.identify_routed(&routed, Some("s3cret")).unwrap();
        assert_eq!(
            (id.tenant.as_str(), id.tier.name.as_str()),
            ("acme", "enterprise")
        );
        let id = p.identify_routed(&routed, Some("other")).unwrap();
        assert_eq!(id.tenant, ANONYMOUS, "a wrong token is ignored");
        let id = p.identify_routed(&routed, None).unwrap();
        assert_eq!(id.tenant, ANONYMOUS, "no router configured");
        assert!(from_router(&routed, Some("s3cret")));
        assert!(!from_router(&routed, Some("other")) && !from_router(&routed, None));
    }

    #[test]
    fn new_tenant_gate() {
        let p = CompiledPolicy::compile(&policy()).unwrap();
        let free = p.spec.tier("free").unwrap().clone();
        let ent = p.spec.tier("enterprise").unwrap().clone();
        let id = |t: &str, tier: &Tier| Identity {
            tenant: t.into(),
            tier: tier.clone(),
        };
        assert!(p.refuses_new_tenant(&id("new", &free)));
        assert!(!p.refuses_new_tenant(&id("old", &free)));
        assert!(!p.refuses_new_tenant(&id("new", &ent)), "not pausable");
    }

    #[test]
    fn refuses_bad_policies() {
        let mut bad = policy();
        bad.api_keys[0].tier = "gold".into();
        assert!(CompiledPolicy::compile(&bad).is_err());
        let mut bad = policy();
        bad.api_keys[0].key_sha256 = "xyz".into();
        assert!(CompiledPolicy::compile(&bad).is_err());
        assert!(CompiledPolicy::compile(&EnginePolicy::default()).is_ok());
    }
}
